"""Differential fuzzing: random graphs of table ops, eager vs finite differences vs jit.

Programs come from :func:`nbgrad.testing.fuzz.programs` (see its docstring). In CI
the number of examples is bounded and the examples are derandomized (the same
programs on every run); ``NBGRAD_FUZZ_EXAMPLES=2000`` runs more of them, and
``NBGRAD_FUZZ_RANDOM=1`` draws new ones on every run (see docs/reliability.md).
Every failure the fuzzer found is kept below as an ``@example`` regression case.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings

import nbgrad as nb
from nbgrad.autograd import gradcheck, gradgradcheck
from nbgrad.testing.fuzz import FUZZ_OPS, Leaf, Program, Step, check_catalogue, programs

EXAMPLES = int(os.environ.get("NBGRAD_FUZZ_EXAMPLES", "50"))
RANDOM = os.environ.get("NBGRAD_FUZZ_RANDOM", "") not in ("", "0")


def fuzz_settings(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=not RANDOM,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# Regressions: programs the fuzzer found failing, kept as explicit cases.
# sum/mean/prod/amax/logsumexp/norm/var/std of a 0-d tensor with dim=0: backward raised
# "cannot broadcast a non-scalar to a scalar array" (sum_backward restored a dim a 0-d
# input does not have).
SUM_0D_DIM0 = Program(nodes=(Leaf(shape=(), domain="gt1"),
                             Step(op="sum", inputs=(0,), params=(0, False))), seed=0)


# nbgrad.jit ran gather/index_select/take with a constant integer index eagerly on the
# first call, then failed with "KeyError: <id>" on the second, compiled call: the tape
# executable never fed non-pooled (integer) constants to its eager steps
# (nbgrad/jit/lowering.py, TapeExecutable._run/_eager).
GATHER_CONST_INDEX = Program(nodes=(Leaf(shape=(1,), domain="gt1"),
                                    Step(op="gather", inputs=(0,), params=(0, [0]))), seed=0)

# norm(x, inf, dim=0) of a 0-d tensor raised "IndexError: tuple index out of range" (the
# zero-size check in the norm kernel read x.shape[0]).
NORM_INF_0D = Program(nodes=(Leaf(shape=(), domain="real"),
                             Step(op="norm", inputs=(0,), params=(0, False, "inf"))), seed=3)

# mode="compile" (generated, fused Numba code), found by test_jit_compile_mode_matches_eager:
# - take/gather/index_select with a constant index whose entries are all equal ([0, 0]):
#   the generated code passed the index to the op's objmode fallback as the scalar
#   np.int64(0), and the fallback's reshape to (2,) raised "ValueError: cannot reshape
#   array of size 1 into shape (2,)";
# - t[...] (or t[None]) of a 0-d tensor: the generated backward zero-filled a 0-d array
#   with ``.fill(0)``, and a numba TypingError reached the user.
GATHER_EQUAL_INDICES = Program(nodes=(Leaf(shape=(1,), domain="gt1"),
                                      Step(op="gather", inputs=(0,), params=(0, [0, 0]))),
                               seed=10196)
INDEX_0D = Program(nodes=(Leaf(shape=(), domain="gt1"),
                          Step(op="index", inputs=(0,), params=((Ellipsis,),))), seed=10196)
# - the same constant-as-scalar fault in a backward: cumsum's backward (a reverse scan)
#   received its all-ones coefficients [1., 1.] as the scalar 1.0.
CUMSUM_BACKWARD = Program(nodes=(Leaf(shape=(2,), domain="gt1"),
                                 Step(op="cumsum", inputs=(0,), params=(0,))), seed=1314667)
# - a multi-output op through the objmode fallback with an output nobody reads (the
#   second piece of a split) made Numba reject the generated code.
SPLIT_UNUSED_OUTPUT = Program(nodes=(Leaf(shape=(), domain="gt1"),
                                     Leaf(shape=(2,), domain="gt1"),
                                     Step(op="split", inputs=(1,), params=(1, 0, 0))),
                              seed=1736)


def _grads(program: Program, fn) -> tuple[np.ndarray, list[np.ndarray]]:
    leaves = program.leaves()
    loss = fn(*leaves)
    loss.backward()
    return loss.numpy(), [leaf.grad.numpy() for leaf in leaves]


# ------------------------------------------------------------------ eager
@fuzz_settings(EXAMPLES)
@given(programs())
@example(SUM_0D_DIM0)
@example(GATHER_CONST_INDEX)
@example(NORM_INF_0D)
def test_eager_gradients_match_finite_differences(program):
    leaves = program.leaves()
    out = program(*leaves)
    assert out.dtype == np.float64
    assert np.all(np.isfinite(out.numpy()))
    assert gradcheck(program, leaves)


@fuzz_settings(max(EXAMPLES // 4, 8))
@given(programs(max_steps=3))
@example(SUM_0D_DIM0)
def test_eager_second_derivatives_match_finite_differences(program):
    assert gradgradcheck(program.loss, program.leaves(), fast_mode=True)


@fuzz_settings(max(EXAMPLES // 2, 10))
@given(programs())
@example(SUM_0D_DIM0)
def test_float32_programs_stay_float32_and_agree_with_float64(program):
    out32 = program(*program.leaves(np.float32, requires_grad=False))
    out64 = program(*program.leaves(np.float64, requires_grad=False))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32.numpy(), out64.numpy(), rtol=2e-3, atol=2e-3)


# ------------------------------------------------------------------ jit
def _jit():
    """``nbgrad.jit``; the jit tests are skipped only where this build has none."""
    jit = getattr(nb, "jit", None)
    if jit is None:
        pytest.skip("this build of nbgrad has no nbgrad.jit")
    return jit


def _assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * max(1.0, float(np.max(
        np.abs(want), initial=0.0))), err_msg=what)


@fuzz_settings(EXAMPLES)
@given(programs())
@example(SUM_0D_DIM0)
@example(GATHER_CONST_INDEX)
@example(NORM_INF_0D)
def test_jit_values_and_gradients_match_eager(program):
    jitted = _jit()(program.loss)
    want_value, want_grads = _grads(program, program.loss)
    for call in range(2):  # the first call traces, the second runs the compiled graph
        value, grads = _grads(program, jitted)
        _assert_close(value, want_value, f"value, call {call}")
        for k, (g, w) in enumerate(zip(grads, want_grads, strict=True)):
            assert g.dtype == w.dtype
            _assert_close(g, w, f"gradient of leaf {k}, call {call}")


@fuzz_settings(max(EXAMPLES // 5, 6))
@given(programs())
@example(GATHER_EQUAL_INDICES)
@example(INDEX_0D)
@example(CUMSUM_BACKWARD)
@example(SPLIT_UNUSED_OUTPUT)
def test_jit_compile_mode_matches_eager(program):
    """Tier 2: each program compiles to generated, fused Numba code (about a second)."""
    jitted = _jit()(program.loss, mode="compile")
    want_value, want_grads = _grads(program, program.loss)
    for call in range(2):
        value, grads = _grads(program, jitted)
        _assert_close(value, want_value, f"value, call {call}")
        for k, (g, w) in enumerate(zip(grads, want_grads, strict=True)):
            _assert_close(g, w, f"gradient of leaf {k}, call {call}")


@fuzz_settings(max(EXAMPLES // 2, 10))
@given(programs())
@example(SUM_0D_DIM0)
@example(GATHER_CONST_INDEX)
def test_jit_value_and_grad_matches_eager(program):
    n = len(program.leaves())
    fused = _jit()(nb.value_and_grad(program.loss, argnums=tuple(range(n))))
    want_value, want_grads = _grads(program, program.loss)
    for call in range(2):
        value, grads = fused(*program.leaves(requires_grad=False))
        _assert_close(np.asarray(value), want_value, f"value, call {call}")
        for k, (g, w) in enumerate(zip(grads, want_grads, strict=True)):
            _assert_close(np.asarray(g), w, f"gradient of leaf {k}, call {call}")


# ------------------------------------------------------------------ the generator itself
def test_fuzz_catalogue_names_table_entries_with_records():
    assert check_catalogue() == []
    assert len({op.entry for op in FUZZ_OPS.values()} - {None}) >= 80


@fuzz_settings(20)
@given(programs())
def test_programs_rebuild_from_their_repr(program):
    rebuilt = eval(repr(program), {"Program": Program, "Leaf": Leaf, "Step": Step})
    assert rebuilt == program
    np.testing.assert_array_equal(rebuilt(*rebuilt.leaves()).numpy(),
                                  program(*program.leaves()).numpy())


def test_sum_of_0d_tensor_over_dim_0_backpropagates():
    x = nb.tensor(2.0, requires_grad=True)
    for reduce in (lambda t: nb.sum(t, 0), lambda t: nb.mean(t, -1), lambda t: nb.prod(t, 0),
                   lambda t: nb.amax(t, 0), lambda t: nb.logsumexp(t, 0),
                   lambda t: nb.norm(t, 2, 0), lambda t: nb.norm(t, float("inf"), 0),
                   lambda t: nb.norm(t, float("-inf"), -1)):
        x.grad = None
        reduce(x).backward()
        assert x.grad.shape == () and x.grad.item() == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["gather", "index_select", "take"])
def test_jit_runs_gather_index_select_and_take_with_constant_indices(name):
    jit = _jit()
    index = nb.tensor(np.array([1, 0, 1]))
    fn = {"gather": lambda x: nb.gather(x, 0, index),
          "index_select": lambda x: nb.index_select(x, 0, index),
          "take": lambda x: nb.take(x, index)}[name]
    x = nb.tensor(np.array([1.5, 2.5]), requires_grad=True)
    loss = jit(lambda t: (fn(t) * nb.tensor([1.0, 2.0, 3.0])).sum())
    for _ in range(2):  # trace, then run the compiled graph
        x.grad = None
        assert loss(x).item() == pytest.approx(2.5 + 2 * 1.5 + 3 * 2.5)
        loss(x).backward()
        np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])
