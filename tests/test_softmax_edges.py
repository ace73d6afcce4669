"""softmax, log_softmax and cross entropy on float32 edge inputs (huge logits, -inf masks,
rows of -inf or +inf): the kernel's one exponential per element gives exactly the value
of the two-pass formula (``exp(x - max) / sum``, in float64, rounded once), in eager
mode and in both jit tiers, and agrees with PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.nn.functional as F


def edge_logits() -> np.ndarray:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((9, 7)) * 30).astype(np.float32)
    x[0] = [3e38, -3e38, 3e38, 1e30, 0.0, -1e-45, 88.0]   # huge, both signs
    x[1] = [-np.inf, 2.0, -np.inf, 1.0, -np.inf, 0.5, -np.inf]  # a mask
    x[2] = -np.inf                                          # all masked: NaN (as torch)
    x[3, 4] = np.inf                                        # +inf: NaN there, 0 elsewhere
    x[4] = [104.0, -104.0, 0.0, 1e-30, -87.0, 87.0, 50.0]   # exp over/underflows in float32
    x[5] = [1e-40, -1e-40, 0.0, -0.0, 1e-38, 0.0, 0.0]      # subnormals
    return x


def two_pass(x: np.ndarray, log: bool) -> np.ndarray:
    """The formula written out with Python floats (libm ``exp``, as the kernel)."""
    out = np.empty(x.shape, np.float64)
    for i, row in enumerate(x.astype(np.float64)):
        m = -math.inf
        for v in row:
            if v > m or v != v:
                m = v
        if m == -math.inf or m != m:
            out[i] = math.nan
            continue
        if m == math.inf:
            out[i] = [math.nan if v == math.inf else (-math.inf if log else 0.0) for v in row]
            continue
        s = 0.0
        for v in row:
            s += math.exp(v - m)
        if log:
            out[i] = row - (m + math.log(s))
        else:
            out[i] = [math.exp(v - m) * (1.0 / s) for v in row]
    return out.astype(np.float32)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_is_the_two_pass_formula_exactly(log):
    x = edge_logits()
    fn = F.log_softmax if log else F.softmax
    want = two_pass(x, log)
    assert same(fn(nb.tensor(x), dim=1).numpy(), want)
    assert same(fn(nb.tensor(np.ascontiguousarray(x.T)), dim=0).numpy().T, want)  # strided
    for mode in ("interpret", "compile"):
        f = nb.jit(lambda t: fn(t, dim=1), mode=mode)
        for _ in range(2):  # the trace, then the tier's executable
            got = f(nb.tensor(x)).numpy()
            assert same(got, want), mode


def test_softmax_and_cross_entropy_agree_with_torch_on_edges():
    torch = pytest.importorskip("torch")
    x = edge_logits()
    # a row with +inf: NaN there and 0 elsewhere here, NaN everywhere in torch (left out)
    x = x[~(x == np.inf).any(axis=1)]
    ours = F.softmax(nb.tensor(x), dim=1).numpy()
    theirs = torch.softmax(torch.tensor(x), dim=1).numpy()
    # torch subtracts the max in float32: exp(-70) carries 70 ulp of the argument
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=0)
    rows = x[~(x == -np.inf).all(axis=1)]
    y = np.zeros(len(rows), np.int64) + 3
    y[1] = 1  # a class the mask keeps
    xt = nb.tensor(rows, requires_grad=True)
    loss = F.cross_entropy(xt, nb.tensor(y))
    (g,) = nb.autograd.grad(loss, [xt])
    tt = torch.tensor(rows, requires_grad=True)
    tl = torch.nn.functional.cross_entropy(tt, torch.tensor(y))
    (tg,) = torch.autograd.grad(tl, [tt])
    np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-5, atol=1e-12)


def test_device_softmax_matches_the_cpu_kernel_bit_for_bit():
    # CUDA device code compiles softmax_twopass (it cannot allocate a scratch row)
    from nbgrad.kernels import nn as nk

    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 7, 3)) * 30
    x[0, 2, 1], x[1, :, 0], x[2, 3, 2] = -np.inf, -np.inf, 1e300
    for log in (False, True):
        a, b = np.empty(x.size), np.empty(x.size)
        nk.softmax_arb(x.reshape(-1), 5, 7, 3, log, a)
        nk.softmax_twopass(x.reshape(-1), 5, 7, 3, log, b)
        np.testing.assert_array_equal(a, b)


def test_contiguous_rows_match_the_strided_loops():
    # the CPU natives' B == 1 path (vexp over blocks of rows) against the (A, R, B) loops
    # (libm exp): the same edge cases exactly, finite values within a few ulp
    from nbgrad.kernels import nn as nk

    rng = np.random.default_rng(4)
    x = edge_logits().astype(np.float64)
    x = np.concatenate([x, rng.standard_normal((600, 7)) * 30])  # blocks of 585 rows
    x[20, 3] = np.nan
    A, R = x.shape
    flat = x.reshape(-1)
    for log in (False, True):
        a, b = np.empty(flat.size), np.empty(flat.size)
        nk.softmax_arb(flat, A, R, 1, log, a)
        nk.softmax_rows(flat, A, R, log, b)
        fin = np.isfinite(a)
        assert np.array_equal(a[~fin], b[~fin], equal_nan=True)
        scale = np.abs(flat) + 1.0 if log else np.abs(a)  # log: x - lse cancels
        assert np.all(np.abs(a - b)[fin] <= 4e-16 * scale[fin])
        assert np.array_equal(nk.softmax_native(flat, A, R, 1, None, log), b, equal_nan=True)
    t = rng.integers(0, R, A)
    t[::7] = -100
    w = rng.random(R)
    for smoothing in (0.0, 0.2):
        l1, w1, l2, w2 = (np.empty(A) for _ in range(4))
        nk.cross_entropy_fwd(flat, t, w, A, R, 1, -100, smoothing, l1, w1)
        nk.cross_entropy_rows(flat, t, w, A, R, -100, smoothing, l2, w2)
        fin = np.isfinite(l1)
        assert np.array_equal(w1, w2) and np.array_equal(l1[~fin], l2[~fin], equal_nan=True)
        bound = 4e-16 * (np.abs(x).max(axis=1) + 1.0)
        assert np.all(np.abs(l1 - l2)[fin] <= bound[fin])
