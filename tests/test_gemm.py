"""``nbgrad.kernels.gemm.gemm``: products of 2-D float arrays of any layout with a unit
stride (C, F, transposed and sliced views read in place) through NumPy's BLAS, and the
same results through Numba's ``np.dot`` when NumPy's BLAS is not found."""

from __future__ import annotations

import numpy as np
import pytest

from nbgrad.kernels import gemm as G

SHAPES = [(13, 21, 9), (1, 5, 3), (4, 1, 6), (3, 7, 1), (1, 1, 1), (0, 3, 4), (3, 0, 4),
          (40, 33, 1), (1, 33, 40)]  # (the last two: gemv)


def layouts(x: np.ndarray):
    yield x
    yield np.asfortranarray(x)
    big = np.zeros((x.shape[0] + 3, x.shape[1] + 5), x.dtype)
    big[2:2 + x.shape[0], 1:1 + x.shape[1]] = x
    yield big[2:2 + x.shape[0], 1:1 + x.shape[1]]     # rows with a gap (lda > n)
    yield np.ascontiguousarray(big.T).T[2:2 + x.shape[0], 1:1 + x.shape[1]]  # and columns


@pytest.fixture(params=["numpy", "numba"])
def backend(request):
    saved = G.SLOTS[:]
    if request.param == "numba":
        G.install(False)
    elif G.LIBRARY is None:
        pytest.skip("NumPy's BLAS not found in this install")
    try:
        yield request.param
    finally:
        G.SLOTS[:] = saved


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_matches_a_float64_product_for_every_layout(backend, dtype):
    rng = np.random.default_rng(0)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for m, k, n in SHAPES:
        A = rng.standard_normal((m, k)).astype(dtype)
        B = rng.standard_normal((k, n)).astype(dtype)
        want = A.astype(np.float64) @ B.astype(np.float64)
        for a in layouts(A):
            for b in layouts(B):
                out = np.full((m, n), np.nan, dtype)
                G.gemm(a, b, out)
                np.testing.assert_allclose(out, want, rtol=tol, atol=tol * max(k, 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_product_with_one_row_or_column_calls_gemv(dtype):
    """``X.T @ u`` of a ``(k, 1)`` ``u`` (W4's hvp) and ``u.T @ X`` go to ``cblas_?gemv``
    (OpenBLAS's gemm took three times as long for them): a recording stand-in in the
    table, which compiled code reads when it runs, sees the calls and their arguments;
    strides BLAS cannot take (a reversed vector) go to gemm; the values are right."""
    import ctypes

    if G.LIBRARY is None:
        pytest.skip("NumPy's BLAS not found in this install")
    real_t = ctypes.c_float if dtype == np.float32 else ctypes.c_double
    i32, i64, ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p
    proto = ctypes.CFUNCTYPE(None, i32, i32, i64, i64, real_t, ptr, i64, ptr, i64, real_t,
                             ptr, i64)
    slot = 2 if dtype == np.float32 else 3
    saved = G.SLOTS[:]
    real = proto(saved[slot])
    calls = []

    def record(*args):
        calls.append(args[1:4] + args[6:7] + args[8:9] + args[11:12])
        real(*args)

    stand_in = proto(record)
    G.SLOTS[slot] = ctypes.cast(stand_in, ctypes.c_void_p).value
    try:
        rng = np.random.default_rng(1)
        X = rng.standard_normal((50, 20)).astype(dtype)
        u = rng.standard_normal((50, 1)).astype(dtype)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        cases = [(X.T, u, 1), (u.T, X, 1), (X, X[:1].T, 1), (X[:, :1].T, X, 1),
                 (X.T, u[::-1], 0), (X.T, np.ascontiguousarray(np.tile(u, 2))[:, :1], 1)]
        for a, b, gemv_calls in cases:
            calls.clear()
            out = np.full((a.shape[0], b.shape[1]), np.nan, dtype)
            G.gemm(a, b, out)
            np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=tol, atol=tol * 50)
            assert len(calls) == gemv_calls, (a.shape, b.shape, calls)
        calls.clear()
        G.gemm(X.T, u, np.empty((20, 1), dtype))
        assert calls == [(112, 50, 20, 20, 1, 1)]  # Trans of the row-major 50 x 20 X
    finally:
        G.SLOTS[:] = saved


def test_gemm_refuses_shapes_that_do_not_multiply():
    a, b = np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)
    with pytest.raises(ValueError, match="gemm"):
        G.gemm(a, b, np.empty((2, 5), np.float32))


def test_numpy_blas_is_found_in_numpy_wheels():
    """NumPy's wheels bundle scipy-openblas: the table is filled from it (an install
    whose NumPy links another BLAS runs Numba's ``np.dot``)."""
    import glob
    import os
    if not glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs",
                                  "*openblas64*")):
        pytest.skip("NumPy here has no bundled scipy-openblas")
    assert G.numpy_blas() is not None


def test_a_transposed_view_is_read_in_place_with_trans():
    """BLAS reads a transposed view as it is (cblas ``Trans``, the leading dimension of
    the array it views): no copy to a contiguous matrix."""
    x = np.zeros((7, 5), np.float32)
    assert G._operand(x.strides, 7, 5, 4) == (111, 5)
    assert G._operand(x.T.strides, 5, 7, 4) == (112, 5)


def test_an_mlp_step_passes_transposed_operands_to_gemm_as_views():
    """The tier-2 code of W2's SGD step (an MLP, smaller here; only generated, not
    compiled) calls the gemm native for its products, the backward's ``W.T``, ``h.T`` and
    ``X.T`` passed as transposed views: no copy, no ``np.dot``."""
    import re

    import nbgrad as nb
    import nbgrad.nn.functional as F
    from nbgrad.jit.tier2 import codegen
    from nbgrad.jit.trace.function_trace import expand

    def loss(W1, b1, W2, b2, X, y):
        return F.cross_entropy(F.relu(X @ W1 + b1) @ W2 + b2, y)

    vg = nb.value_and_grad(loss, argnums=(0, 1, 2, 3))

    def step(W1, b1, W2, b2, X, y):
        value, grads = vg(W1, b1, W2, b2, X, y)
        return value, tuple(q - 0.01 * g for q, g in zip((W1, b1, W2, b2), grads,
                                                           strict=True))

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in
              [(96, 64), (64,), (64, 48), (48,), (32, 96)]] + [rng.integers(0, 48, 32)]
    args = [nb.tensor(a) for a in arrays]
    f = nb.jit(step, mode="interpret")
    f(*args)
    source = codegen.generate(expand(f._entry(tuple(args), {}).graph)).source
    gemm_key = re.search(r"#   (_native_\d+) = nbgrad\.kernels\.gemm\.gemm ", source).group(1)
    body = source[source.index("def run_graph"):]
    calls = re.findall(rf"{gemm_key}\((\w+), (\w+), (\w+)\)", body)
    views = set(re.findall(r"(\w+) = \w+\.T\n", body))
    # forward X@W1, h@W2; backward d@W2.T, h.T@d, X.T@d: every product through BLAS
    assert len(calls) == 5, calls
    assert sum(a in views or b in views for a, b, _ in calls) == 3, (calls, views)
    assert "ascontiguousarray" not in body and "np.dot(" not in body
