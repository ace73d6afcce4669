"""The fuzzer's ``cuda`` executor (nbgrad.testing.fuzz.on_device): programs run eagerly
and jitted (fused CUDA kernels) on CUDA tensors, against eager on the CPU.

Without a GPU this runs under Numba's CUDA simulator (one Python thread per CUDA thread:
a few programs only); ``nbgrad fuzz --executors eager,cuda`` runs many on a real GPU.
"""

from __future__ import annotations

import nbgrad.cuda as nbcuda

nbcuda.use_simulator_if_no_gpu()

import pytest  # noqa: E402

import nbgrad as nb  # noqa: E402
from nbgrad.jit.cuda import fusion  # noqa: E402
from nbgrad.testing.fuzz import (  # noqa: E402
    FAMILIES,
    Leaf,
    Program,
    Step,
    check_programs,
    generate,
)

pytestmark = pytest.mark.cuda

#: seeds whose programs found the first bugs of this executor: an integer index's
#: backward on CUDA (a scalar of positions), fori_loop and scan traced on CUDA tensors
#: (12, 13, 18), the backward of a sum over a 0-d tensor's dim -1 (41), ``.at[i]`` in a
#: loop (a counter on the host; dynamic windows had no CUDA kernels) (42)
SEEDS = (12, 13, 18, 41, 42)
#: the families those seeds were drawn from (before ``unrolled``: the same programs)
SEED_FAMILIES = tuple(f for f in FAMILIES if f != "unrolled")

#: x * 1.5, then sin: one fused kernel with a literal
SMALL = Program(nodes=(Leaf(shape=(2, 3), domain="real"),
                       Step(op="mul", inputs=(0,), params=(1.5, "right")),
                       Step(op="sin", inputs=(1,), params=())), seed=5)


def test_programs_with_indexing_and_loops_agree_on_cuda():
    stats: dict = {}
    found = check_programs([generate(s, 4, SEED_FAMILIES) for s in SEEDS], ("cuda",),
                           stats=stats)
    assert not found, "\n\n".join(m.report() for m in found)
    assert stats["tried"]["cuda"] == len(SEEDS)
    assert stats["tried"].get("cuda on fused kernels", 0) >= 1


def test_a_wrong_fused_kernel_is_reported(monkeypatch):
    def wrong_literal(value, dtype):
        return repr(float(value) * 1.01)

    monkeypatch.setattr(fusion, "literal", wrong_literal)
    found = check_programs([SMALL], ("cuda",))
    assert found and {m.executor for m in found} == {"cuda-jit"}


def test_a_wrong_eager_kernel_is_reported(monkeypatch):
    op = nb.ops.registry.get("sin")
    right = op.kernels["cuda"]
    monkeypatch.setitem(op.kernels, "cuda", lambda x: right(right(x)))
    found = check_programs([SMALL], ("cuda",))
    assert found and {m.executor for m in found} == {"cuda-eager"}
    assert found[0].what == "result"
