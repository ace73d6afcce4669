"""Verified promotion: generated code's first result is checked against tier 1.

Each test that needs the check turns it on with the ``promotion_check`` fixture (the
suite runs with it off, so a tier-2 bug fails the test that meets it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.jit import program, verify
from nbgrad.jit.tier2 import codegen
from nbgrad.jit.tier2.codegen import CompiledGraph
from nbgrad.jit.verify import PromotionMismatchWarning, compare


def loss(x, w):
    return (nb.tanh(x @ w) * nb.exp(-x)).sum() + (w * w).sum()


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((5, 5)), rng.standard_normal((5, 5))


def _reference(x, w):
    """Values and gradients of ``loss`` from tier 1 (mode="interpret")."""
    f = nb.jit(loss, mode="interpret")
    out = None
    for _ in range(2):
        xt, wt = nb.tensor(x, requires_grad=True), nb.tensor(w, requires_grad=True)
        out = f(xt, wt)
        out.backward()
    return out.numpy(), xt.grad.numpy(), wt.grad.numpy()


class Perturbed:
    """Generated code that gets output ``k`` slightly wrong (or modifies an input)."""

    def __init__(self, inner, k=0, mutate=False):
        self.inner, self.graph, self.tier, self.k, self.mutate = inner, inner.graph, \
            inner.tier, k, mutate
        self.stats = getattr(inner, "stats", {})

    def run(self, arrays):
        outs = self.inner.run(arrays)
        if callable(self.mutate):
            self.mutate(arrays[0])
        elif self.mutate:
            arrays[0][...] += 1.0
        else:
            o = np.array(outs[self.k], copy=True)
            o.reshape(-1)[0] += 1e-6 * max(1.0, float(np.abs(o).max()))
            outs[self.k] = o
        return outs

    def source(self):
        return "# perturbed\n" + self.inner.source()


def _perturb(monkeypatch, which=(0,), **kw):
    """Make the n-th graph tier 2 compiles (counting from 0) wrong, for n in ``which``."""
    real = codegen.compile_graph
    count = []

    def compile_graph(graph, **kwargs):
        exe = real(graph, **kwargs)
        count.append(graph)
        return Perturbed(exe, **kw) if len(count) - 1 in which else exe

    monkeypatch.setattr(codegen, "compile_graph", compile_graph)
    return count


def _entry(f):
    (entry,) = f._cache.values()
    return entry


def _run(f, x, w, backward=True):
    xt, wt = nb.tensor(x, requires_grad=True), nb.tensor(w, requires_grad=True)
    out = f(xt, wt)
    if backward:
        out.backward()
    return out.numpy(), xt.grad.numpy() if backward else None, \
        wt.grad.numpy() if backward else None


def _promote(f, x, w, mode):
    """Call ``f`` until its generated code is about to run (the next call runs it)."""
    if mode == "auto":
        seconds, program.PROMOTE_SECONDS = program.PROMOTE_SECONDS, 0.0  # by calls alone
        try:
            for _ in range(program.PROMOTE_AFTER + 1):
                _run(f, x, w)
        finally:
            program.PROMOTE_SECONDS = seconds
        assert program.wait_for_promotions(timeout=240)
    else:
        _run(f, x, w, backward=False)  # the trace (its result is the eager one)


# ------------------------------------------------------------------ the mismatch
@pytest.mark.parametrize("mode", ["compile", "auto"])
@pytest.mark.parametrize("wrong", ["value", "gradient"])
def test_wrong_generated_code_warns_once_returns_tier1_and_stays_in_tier1(
        promotion_check, monkeypatch, tmp_path, mode, wrong):
    monkeypatch.setattr(verify, "reproducer_root", lambda: tmp_path / "promotion-mismatch")
    monkeypatch.setattr(program, "PROMOTE_AFTER", 3)
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    x, w = _inputs()
    want = _reference(x, w)
    f = nb.jit(loss, mode=mode)
    # graphs tier 2 compiles: the forward (with residuals), then the backward
    k = 0 if wrong == "value" else 1
    _perturb(monkeypatch, which=(0,) if wrong == "value" else (1,), k=k)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _promote(f, x, w, mode)
        got = _run(f, x, w)  # generated code runs for the first time: checked
        later = [_run(f, x, w) for _ in range(3)]
    mism = [c for c in caught if issubclass(c.category, PromotionMismatchWarning)]
    assert len(mism) == 1, [str(c.message) for c in caught]
    message = str(mism[0].message)
    assert "test_jit_verify.loss" in message and "different result" in message
    assert "output" in message and "max abs error" in message
    # the checked call returns tier 1's result where the generated code was wrong; a
    # wrong backward is rerun by tier 1 on the residuals of the (correct, checked)
    # generated forward, so its gradients equal tier 1's to rounding
    if wrong == "value":
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    else:
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    for result in later:  # then tier 1 only: exactly its values and gradients
        for a, b in zip(result, want, strict=True):
            np.testing.assert_array_equal(a, b)
    entry = _entry(f)
    assert entry.tier == verify.TIER1_MISMATCH
    assert all(exe.tier == "interpret" for exe in entry.program._exe.values())
    # the reproducer: graph, inputs and replay.py under the cache folder
    folder = Path(re.search(r"Reproducer: (\S+) \(python", message).group(1))
    assert folder.parent == tmp_path / "promotion-mismatch"
    assert {"graph.pkl", "graph.txt", "inputs.npz", "replay.py", "README.md"} <= \
        {p.name for p in folder.iterdir()}
    graph, inputs = verify.load_reproducer(folder)
    assert len(inputs) == len(graph.inputs)
    _perturb(monkeypatch, which=(0,), k=k)
    assert verify.replay(folder, verbose=False) is not None  # the wrong code, replayed
    monkeypatch.undo()  # the real tier 2 agrees with tier 1 on the same graph and inputs
    proc = subprocess.run([sys.executable, str(folder / "replay.py")], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "agrees" in proc.stdout


def test_without_the_check_the_wrong_result_passes_through(monkeypatch):
    """What the switch is for: the suite runs with it off, so tier-2 bugs fail tests."""
    assert not verify.enabled()
    x, w = _inputs()
    want = _reference(x, w)
    f = nb.jit(loss, mode="compile")
    _perturb(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromotionMismatchWarning)
        _promote(f, x, w, "compile")
        got = _run(f, x, w)
    assert got[0] != want[0]
    assert _entry(f).tier == "compile"


def test_generated_code_that_modifies_an_input_is_refused(promotion_check, monkeypatch,
                                                          tmp_path):
    monkeypatch.setattr(verify, "reproducer_root", lambda: tmp_path / "promotion-mismatch")
    x, w = _inputs()
    want = _reference(x, w)
    f = nb.jit(loss, mode="compile")
    _perturb(monkeypatch, mutate=True)
    _promote(f, x, w, "compile")
    xt, wt = nb.tensor(x.copy(), requires_grad=True), nb.tensor(w, requires_grad=True)
    with pytest.warns(PromotionMismatchWarning, match="modified input"):
        out = f(xt, wt)
    np.testing.assert_array_equal(out.numpy(), want[0])


def test_generated_code_that_flips_the_sign_of_a_zero_input_is_refused(
        promotion_check, monkeypatch, tmp_path):
    """A write of -0.0 over an input's 0.0 is a modification (equal as numbers, not as
    bits: 1/x tells them apart)."""
    monkeypatch.setattr(verify, "reproducer_root", lambda: tmp_path / "promotion-mismatch")
    x, w = _inputs()
    x.reshape(-1)[0] = 0.0
    f = nb.jit(loss, mode="compile")

    def flip(a):
        a.reshape(-1)[0] = -a.reshape(-1)[0]

    _perturb(monkeypatch, mutate=flip)
    _promote(f, x, w, "compile")
    xt, wt = nb.tensor(x.copy(), requires_grad=True), nb.tensor(w, requires_grad=True)
    with pytest.warns(PromotionMismatchWarning, match="modified input 0"):
        f(xt, wt)


@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128", "int64", "bool"])
def test_same_bits_sees_signed_zeros_and_nan_payloads(dtype):
    a = np.zeros((3, 4), dtype)[:, ::2]  # not contiguous
    assert verify.same_bits(a, a.copy())
    if dtype in ("float64", "float32", "complex128"):
        b = a.copy()
        b[0, 0] = -0.0
        assert not verify.same_bits(a, b)
        nan = np.full((2,), np.nan, dtype)
        other = nan.copy()
        other.view(f"u{np.dtype(dtype).itemsize // (2 if dtype == 'complex128' else 1)}")[
            0] ^= 1  # another NaN payload
        assert np.isnan(other[0]) and verify.same_bits(nan, nan.copy())
        assert not verify.same_bits(nan, other)
    b = a.copy()
    b[-1, -1] = 1
    assert not verify.same_bits(a, b)
    assert not verify.same_bits(a, a.astype("float16"))


def test_generated_code_that_raises_falls_back_to_tier1(promotion_check, monkeypatch,
                                                        tmp_path):
    monkeypatch.setattr(verify, "reproducer_root", lambda: tmp_path / "promotion-mismatch")
    x, w = _inputs()
    want = _reference(x, w)
    f = nb.jit(loss, mode="compile")

    class Broken(Perturbed):
        def run(self, arrays):
            raise IndexError("index 7 is out of bounds")

    real = codegen.compile_graph
    monkeypatch.setattr(codegen, "compile_graph", lambda g, **k: Broken(real(g, **k)))
    _promote(f, x, w, "compile")
    with pytest.warns(PromotionMismatchWarning, match="raised IndexError"):
        got = _run(f, x, w)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ the agreement
@pytest.mark.parametrize("mode", ["compile", "auto"])
def test_correct_generated_code_is_promoted_and_then_runs(promotion_check, monkeypatch,
                                                          mode):
    monkeypatch.setattr(program, "PROMOTE_AFTER", 3)
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    x, w = _inputs(1)
    want = _reference(x, w)
    f = nb.jit(loss, mode=mode)
    n = len(verify.TIMINGS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromotionMismatchWarning)
        _promote(f, x, w, mode)
        for _ in range(3):
            got = _run(f, x, w)
            for a, b in zip(got, want, strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    entry = _entry(f)
    assert entry.tier == "compile"
    # each executable (forward with residuals, backward; "main" in mode="compile") was
    # checked once, then its wrapper is gone: the generated code runs
    assert [t["ok"] for t in verify.TIMINGS[n:]] == [True] * len(entry.program._exe)
    assert {"fwd", "bwd"} <= set(entry.program._exe) and \
        all(isinstance(e, CompiledGraph) for e in entry.program._exe.values())


def _bias_before_centering(x, b, w):
    y = x + b
    return (nb.tanh(y - y.mean(1, keepdim=True)) * w).sum()  # d/db is 0: rounding noise


def _softmax_total(x):
    return nb.softmax(x, 0).sum()  # d/dx is 0: rounding noise


@pytest.mark.parametrize("fn, shapes", [(_bias_before_centering, [(64, 32), (1,), (32,)]),
                                        (_softmax_total, [(50,)])])
def test_gradients_that_are_rounding_noise_are_not_a_mismatch(promotion_check, fn, shapes):
    """Two correct programs round differently: a gradient that is zero in exact
    arithmetic is noise of about eps times the inputs, in both tiers."""
    rng = np.random.default_rng(0)
    ts = [nb.tensor(rng.standard_normal(s) * 3, requires_grad=True) for s in shapes]
    f = nb.jit(fn, mode="compile")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromotionMismatchWarning)
        for _ in range(3):
            for t in ts:
                t.grad = None
            f(*ts).backward()
    assert _entry(f).tier == "compile"


def test_random_ops_are_checked_without_drawing_twice(promotion_check):
    """dropout draws from nbgrad.random's generator: the check rewinds it, so the
    compiled run draws what tier 1 would, and the stream advances once per call."""
    x = nb.tensor(np.linspace(1.0, 2.0, 64))

    def f(x):
        return nb.dropout(x, 0.5) * 2.0

    results = {}
    for mode in ("interpret", "compile"):
        g = nb.jit(f, mode=mode)
        nb.random.seed(7)
        with warnings.catch_warnings():
            warnings.simplefilter("error", PromotionMismatchWarning)
            results[mode] = [g(x).numpy() for _ in range(4)]
    for a, b in zip(results["interpret"], results["compile"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert _entry(g).tier == "compile"


def test_python_op_graphs_are_exempt_and_run_the_user_code_once(promotion_check):
    calls = []

    class Square(nb.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            calls.append(1)
            ctx.save_for_backward(x)
            return nb.tensor(x.numpy() ** 2)  # not traceable: a PythonOp

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2.0 * x

    f = nb.jit(lambda x: Square.apply(x).sum(), mode="compile")
    x = nb.tensor(np.arange(3.0))
    f(x)  # the trace
    for _ in range(3):  # the generated code runs the Python forward once per call
        before = len(calls)
        assert f(x).item() == 5.0
        assert len(calls) == before + 1  # not twice for the check
    assert _entry(f).tier == "compile"


# ------------------------------------------------------------------ the comparison
@pytest.mark.parametrize("expected, got, ok", [
    (np.array([1.0, np.nan, np.inf]), np.array([1.0, np.nan, np.inf]), True),
    (np.array([1.0, np.nan]), np.array([np.nan, 1.0]), False),  # NaN moved
    (np.array([np.inf]), np.array([-np.inf]), False),  # sign of an infinity
    (np.array([np.inf]), np.array([1e308]), False),
    (np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-13]), True),  # within 1e-12
    (np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-10]), False),
    (np.array([1e3, 0.0]), np.array([1e3, 1e-11]), True),  # near 0: the output's scale
    (np.array([1e3, 0.0]), np.array([1e3, 1e-8]), False),
    (np.array([0.0]), np.array([0.0]), True),
    (np.array([-np.inf, 1.0]), np.array([-np.inf, 1.0 + 1e-13]), True),
    (np.array([np.inf, 1e3, 0.0]), np.array([np.inf, 1e3, 1e-11]), True),  # finite scale
    (np.array([1.0]), np.array([np.nan]), False),
    (np.array([np.nan]), np.array([1.0]), False),
    (np.array([1.0], np.float32), np.array([1.000001], np.float32), True),  # float32 rtol
    (np.array([1.0], np.float32), np.array([1.001], np.float32), False),
    (np.array([3, 4]), np.array([3, 5]), False),  # integers exactly
    (np.array([True]), np.array([False]), False),
    (np.zeros(3), np.zeros(4), False),  # shapes
    (np.zeros(3), np.zeros(3, np.float32), False),  # dtypes
])
def test_comparison(expected, got, ok):
    assert (compare([expected], [got]) is None) == ok


@pytest.mark.parametrize("where", [0, "block end", "last"])
@pytest.mark.parametrize("bad", [1e-9, np.nan])
def test_the_quick_test_sees_a_difference_in_any_block(where, bad, monkeypatch):
    """The quick test (blocks of WITHIN_BLOCK elements) finds a difference or a NaN in the
    first block, at a block's end and in the last, partial block, as the full test does."""
    monkeypatch.setattr(verify, "WITHIN_BLOCK", 64)  # (small, for several blocks)
    a = np.linspace(-1.0, 1.0, 64 * 5 + 7)
    k = {0: 0, "block end": 64 * 2 - 1, "last": a.size - 1}[where]
    assert verify._within(a, a * (1 + 1e-15), 0.0, 1e-12, 1e-300)
    b = a.copy()
    b[k] += bad
    assert not verify._within(a, b, 0.0, 1e-12, 1e-300)
    assert compare([a], [b]).index == (k,)


def test_inputs_set_the_scale_of_outputs_near_zero():
    noise_a, noise_b = np.array([1e-19, -3e-15]), np.array([-2e-19, 4e-15])
    assert compare([noise_a], [noise_b]) is not None  # alone: relative to themselves
    assert compare([noise_a], [noise_b], [np.array([3.0, np.inf]), np.arange(9)]) is None
    assert compare([noise_a], [noise_a + 1e-9], [np.array([3.0])]) is not None
    assert verify.input_scale([np.array([np.nan, -4.0, np.inf]), np.array([10**9])]) == 4.0


def _cancelling_terms(n: int) -> np.ndarray:
    """``n`` terms whose partial sums grow to ``n / 2`` and then cancel: the sum is about
    0.2, and its rounding depends much on the order."""
    rng = np.random.default_rng(0)
    h = rng.uniform(1, 2, n // 2)
    return np.concatenate([h, -h[::-1] + rng.standard_normal(n // 2) * 1e-3])


def test_a_long_sum_in_another_order_is_not_a_mismatch():
    """A GPU sums in a tree and tier 1 in a row: the tolerance of an output that sums R
    terms grows with sqrt(R), its floor too; a missing term is still found."""
    x = _cancelling_terms(10**6)
    in_a_row, pairwise = np.cumsum(x)[-1:].reshape(()), np.sum(x)
    assert abs(in_a_row - pairwise) > 1e-9  # different roundings, both correct
    assert compare([in_a_row], [pairwise], [x]) is not None  # without R: a mismatch
    assert compare([in_a_row], [pairwise], [x], [x.size]) is None
    assert compare([in_a_row], [in_a_row - x[7]], [x], [x.size]) is not None
    assert compare([in_a_row], [in_a_row + 1e-3], [x], [x.size]) is not None
    # the gradient beside it (R = 1) keeps the tight tolerance
    assert compare([np.ones(3), in_a_row], [np.ones(3) + 1e-9, pairwise], [x],
                   [1, x.size]).output == 0


def test_reduction_lengths_follow_each_output():
    f = nb.jit(nb.value_and_grad(lambda v, w: ((v @ w).tanh().sum(0) * 2).sum()))
    v, w = nb.tensor(np.ones((30, 40))), nb.tensor(np.ones((40, 5)))
    f(v, w)
    graph = _entry(f).graph
    lengths = verify.reduction_lengths(graph)
    assert lengths[0] == 30  # the value: the largest ratio on its way (sum(0): 150 -> 5)
    assert lengths[1:] != [1, 1]  # the gradients come through matrix products


@pytest.mark.parametrize("mode", ["compile", "auto"])
def test_generated_code_that_sums_in_another_order_is_promoted(promotion_check,
                                                               monkeypatch, mode):
    """Tier 2 returning a pairwise sum of 10^6 cancelling terms where tier 1 sums in a
    row (as CUDA's fused tree sum does) is still promoted, and runs."""
    monkeypatch.setattr(program, "PROMOTE_AFTER", 2)
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    real = codegen.compile_graph

    class Pairwise:
        def __init__(self, inner):
            self.inner, self.graph, self.tier = inner, inner.graph, inner.tier
            self.stats = getattr(inner, "stats", {})

        def run(self, arrays):
            outs = self.inner.run(arrays)
            return [np.asarray(np.sum(arrays[0])) if o.shape == () else o for o in outs]

    monkeypatch.setattr(codegen, "compile_graph", lambda g, **kw: Pairwise(real(g, **kw)))
    x = nb.tensor(_cancelling_terms(10**6))
    f = nb.jit(lambda v: v.sum(), mode=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromotionMismatchWarning)
        for _ in range(4):
            f(x)
        assert program.wait_for_promotions(timeout=240)
        got = [float(f(x)) for _ in range(2)]
    assert _entry(f).tier == "compile"
    assert got == [float(np.sum(x.numpy()))] * 2  # the generated code's own result


def test_comparison_reports_the_first_differing_output():
    bad = compare([np.zeros(2), np.ones((2, 2))], [np.zeros(2), np.array([[1, 1], [1, 3.]])])
    assert bad.output == 1 and bad.count == 2 and bad.index == (1, 1)
    assert bad.max_abs == 2.0 and "output 1 (of 2)" in bad.describe()


def test_switch_returns_the_previous_value():
    assert verify.enabled() is False  # tests/conftest.py turns it off for the suite
    assert nb.jit.set_promotion_check(True) is False
    assert verify.enabled() is True
    assert nb.jit.set_promotion_check(False) is True


def test_reproducers_go_to_the_cache_folder():
    from nbgrad.codegen import cache_dir
    assert verify.reproducer_root() == cache_dir() / "promotion-mismatch"


CUDA_SCRIPT = """
import json, sys, warnings
from pathlib import Path
import numpy as np
import nbgrad as nb
from nbgrad.backends import to_device
from nbgrad.jit.cuda import fusion
from nbgrad.jit import verify

verify.reproducer_root = lambda: Path(sys.argv[2])
if sys.argv[1] == "wrong":  # fused CUDA code that gets one element wrong
    real_run = fusion.CudaExecutable.run

    def run(self, arrays):
        outs = real_run(self, arrays)
        h = outs[0].copy_to_host()
        h.reshape(-1)[0] += 1e-3
        return [to_device(h, fusion.cuda_device()), *outs[1:]]

    fusion.CudaExecutable.run = run

x0 = np.linspace(0, 1, 8)
want = np.sin(x0) * 2.0 + x0
g = nb.jit(lambda x: nb.sin(x) * 2.0 + x)
x = nb.tensor(x0, device="cuda")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    outs = [g(x) for _ in range(4)]
(entry,) = g._cache.values()
print(json.dumps({
    "warnings": sum(issubclass(c.category, verify.PromotionMismatchWarning) for c in caught),
    "tier": entry.tier, "devices": sorted({o.device.type for o in outs}),
    "error": max(float(np.abs(o.numpy() - want).max()) for o in outs[1:])}))
"""


@pytest.mark.parametrize("code", ["right", "wrong"])
def test_fused_cuda_code_is_checked_too(code, tmp_path):
    """CUDA graphs run generated kernels: the first run is checked against tier 1 on
    host copies; on a mismatch tier 1 runs on the host and its outputs go back to the
    device (a fresh process: Numba's CUDA simulator when there is no GPU)."""
    import nbgrad.cuda as nbcuda
    env = {**os.environ, "NBGRAD_PROMOTION_CHECK": "1"}
    if not nbcuda.gpu_visible():
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run([sys.executable, "-c", CUDA_SCRIPT, code, str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["devices"] == ["cuda"] and got["error"] <= 1e-12
    if code == "right":
        assert (got["warnings"], got["tier"]) == (0, "cuda")
    else:
        assert (got["warnings"], got["tier"]) == (1, verify.TIER1_MISMATCH)
        (folder,) = tmp_path.iterdir()
        assert (folder / "tier.txt").read_text().strip() == "cuda"
