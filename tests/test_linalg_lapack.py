"""Triangular solves and Cholesky through BLAS/LAPACK (issue 15 item 6): every layout the
BLAS flags encode (left/right, lower/upper, unit diagonal, transposed views, one or many
right-hand sides, broadcast batches, float32) against SciPy, and the errors of a
singular triangular matrix and of a matrix that is not positive definite. The op records
(``nbgrad/testing/records/linalg.py``) cover gradients and both jit tiers."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
import scipy.linalg

import nbgrad as nb
from nbgrad.linalg import LinAlgError
from nbgrad.testing.records.linalg import _cholesky_backward_ref

RNG = np.random.default_rng(615)


def _reference(A, B, upper, left, unit):
    """SciPy's solve of each matrix pair (batches broadcast)."""
    batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    A = np.broadcast_to(A, batch + A.shape[-2:]).reshape((-1,) + A.shape[-2:])
    Bb = np.broadcast_to(B, batch + B.shape[-2:]).reshape((-1,) + B.shape[-2:])
    out = [scipy.linalg.solve_triangular(a, b, lower=not upper, unit_diagonal=unit) if left
           else scipy.linalg.solve_triangular(a, b.T, trans=1, lower=not upper,
                                              unit_diagonal=unit).T
           for a, b in zip(A, Bb, strict=True)]
    return np.array(out).reshape(batch + B.shape[-2:])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_solve_triangular_layouts_match_scipy(dtype):
    n = 5
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    for upper, left, unit, k in itertools.product((False, True), (True, False),
                                                  (False, True), (1, 3)):
        A = RNG.standard_normal((2, n, n)) + 4 * np.eye(n)  # garbage in the unread triangle
        B = RNG.standard_normal((3, 1) + ((n, k) if left else (k, n)))
        kw = dict(upper=upper, left=left, unitriangular=unit)
        want = _reference(A, B, upper, left, unit)
        got = nb.linalg.solve_triangular(nb.tensor(A.astype(dtype)), nb.tensor(B.astype(dtype)),
                                         **kw)
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, **tol, err_msg=str(kw))
        # the transpose as a strided view (the BLAS wrapper needs C order): the other
        # triangle of A.mT
        At = nb.tensor(np.swapaxes(A, -1, -2).copy().astype(dtype))
        got_t = nb.linalg.solve_triangular(nb.transpose(At, -2, -1), nb.tensor(B.astype(dtype)),
                                           **kw)
        np.testing.assert_allclose(got_t.numpy(), want, **tol, err_msg=f"mT {kw}")


def test_solve_triangular_vector_right_hand_side():
    n = 6
    A = RNG.standard_normal((n, n)) + 4 * np.eye(n)
    b = RNG.standard_normal(n)
    for upper, left in itertools.product((False, True), (True, False)):
        got = nb.linalg.solve_triangular(nb.tensor(A), nb.tensor(b), upper=upper, left=left)
        want = scipy.linalg.solve_triangular(A, b, lower=not upper, trans=0 if left else 1)
        assert got.shape == (n,)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, err_msg=f"{upper} {left}")


def test_solve_triangular_many_right_hand_sides_and_gradient():
    n, k = 40, 30
    L = np.tril(RNG.standard_normal((n, n))) + n * np.eye(n)
    B = RNG.standard_normal((n, k))
    np.testing.assert_allclose(
        nb.linalg.solve_triangular(nb.tensor(L), nb.tensor(B), upper=False).numpy(),
        scipy.linalg.solve_triangular(L, B, lower=True), rtol=1e-10)
    Lt, Bt = nb.tensor(L, requires_grad=True), nb.tensor(B, requires_grad=True)
    (nb.linalg.solve_triangular(Lt, Bt, upper=False) ** 2).sum().backward()
    X = scipy.linalg.solve_triangular(L, B, lower=True)
    gB = scipy.linalg.solve_triangular(L, 2 * X, lower=True, trans=1)   # L^-T dX
    np.testing.assert_allclose(Bt.grad.numpy(), gB, rtol=1e-9)
    np.testing.assert_allclose(Lt.grad.numpy(), np.tril(-gB @ X.T), rtol=1e-9, atol=1e-12)


def test_singular_triangular_matrix_raises_naming_the_op():
    A = np.tril(np.ones((3, 3)))
    A[1, 1] = 0.0
    for B, left in ((np.ones(3), True), (np.ones((2, 3)), False), (np.ones((2, 3, 1)), True)):
        with pytest.raises(LinAlgError, match=r"linalg.solve_triangular.*diagonal entry 1 "
                                              r"is zero.*\(3, 3\)"):
            nb.linalg.solve_triangular(nb.tensor(A), nb.tensor(B), lower=True, left=left)
    # a unit diagonal is not read; an empty right-hand side has nothing to solve
    x = nb.linalg.solve_triangular(nb.tensor(A), nb.tensor(np.ones(3)), lower=True,
                                   unitriangular=True)
    np.testing.assert_allclose(x.numpy(), [1.0, 0.0, 0.0])
    assert nb.linalg.solve_triangular(nb.tensor(A), nb.tensor(np.ones((3, 0))),
                                      lower=True).shape == (3, 0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cholesky_batched_matches_numpy_and_reads_the_lower_triangle(dtype):
    M = RNG.standard_normal((2, 3, 6, 6))
    A = M @ np.swapaxes(M, -1, -2) + 6 * np.eye(6)
    junk = A + np.triu(RNG.standard_normal((6, 6)), 1)          # the upper part is not read
    L = nb.linalg.cholesky(nb.tensor(junk.astype(dtype)))
    assert L.dtype == np.dtype(dtype)
    np.testing.assert_allclose(L.numpy(), np.linalg.cholesky(A),
                               rtol=1e-4 if dtype == "float32" else 1e-12, atol=1e-5)
    assert (np.triu(L.numpy(), 1) == 0).all()


def test_cholesky_not_positive_definite_names_op_and_shape():
    A = np.stack([np.eye(3), np.diag([1.0, -1.0, 1.0])])
    with pytest.raises(LinAlgError, match=r"linalg.cholesky: Matrix is not positive "
                                          r"definite.*\(2, 3, 3\)"):
        nb.linalg.cholesky(nb.tensor(A))
    # NaN in, NaN out (as NumPy: LAPACK's potrf does not test for NaN)
    assert np.isnan(np.diagonal(nb.linalg.cholesky(nb.tensor(np.full((2, 2), np.nan))).numpy())
                    ).all()


def test_blas_is_bound_at_the_first_solve_not_at_import():
    """``import nbgrad`` does not import scipy.linalg; the first triangular solve binds
    SciPy's BLAS from compiled code (a fresh process, so the table starts empty)."""
    code = ("import sys, numpy as np, nbgrad as nb\n"
            "assert 'scipy.linalg' not in sys.modules\n"
            "L = nb.tensor(np.array([[2.0, 0.0], [1.0, 4.0]]))\n"
            "x = nb.linalg.solve_triangular(L, nb.tensor(np.array([[2.0], [9.0]])), lower=True)\n"
            "assert np.allclose(x.numpy(), [[1.0], [2.0]]), x\n"
            "assert 'scipy.linalg.cython_blas' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_triangular_matmul_reads_one_triangle_in_every_layout(dtype):
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1e-12, atol=1e-12)
    A = RNG.standard_normal((2, 5, 5)).astype(dtype)
    B = RNG.standard_normal((5, 3)).astype(dtype)
    for upper, transpose in itertools.product((False, True), (False, True)):
        T = np.triu(A) if upper else np.tril(A)
        want = (np.swapaxes(T, -1, -2) if transpose else T) @ B
        junk = A + (np.tril(np.full((5, 5), np.inf), -1) if upper
                    else np.triu(np.full((5, 5), np.nan), 1)).astype(dtype)
        got = nb.triangular_matmul(nb.tensor(junk), nb.tensor(B), upper=upper,
                                   transpose=transpose)
        assert got.dtype == np.dtype(dtype) and got.shape == (2, 5, 3)
        np.testing.assert_allclose(got.numpy(), want, **tol)
    with pytest.raises(RuntimeError, match=r"triangular_matmul: A of shape \(5, 5\) and B "
                                           r"of shape \(4, 3\) do not fit"):
        nb.triangular_matmul(nb.tensor(A[0]), nb.tensor(B[:4]), upper=False)


def _cholesky_grad_symbolic(K, G):
    """d/dA sum(L * G) for symmetric A: L^-T Phi L^-1, Phi = sym(tril(L^T tril(G)))."""
    return _cholesky_backward_ref(G, np.linalg.cholesky(K))


def test_cholesky_backward_is_one_blocked_node():
    """Cholesky's backward is one ``cholesky_backward`` node (the blocked reverse of the
    factorisation, no triangular solves of the whole matrix), in eager mode and in the
    jitted gradient graph, whose tiers agree with eager and with the symbolic gradient."""
    M = RNG.standard_normal((6, 6))
    K = M @ M.T + 6 * np.eye(6)
    G = RNG.standard_normal((6, 6))

    def f(a):
        return (nb.linalg.cholesky(a) * nb.tensor(G)).sum()

    want = _cholesky_grad_symbolic(K, G)
    eager = nb.grad(f)(nb.tensor(K)).numpy()
    np.testing.assert_allclose(eager, want, rtol=1e-10, atol=1e-12)
    for mode in ("interpret", "compile"):
        got = nb.jit(nb.grad(f), mode=mode)(nb.tensor(K)).numpy()
        np.testing.assert_allclose(got, eager, rtol=1e-12, atol=1e-14)
    graph = nb.jit(nb.grad(f), mode="interpret").graph(nb.tensor(K))
    assert graph.count("cholesky_backward(") == 1 and "solve_triangular" not in graph


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(0, 0), (1, 1), (63, 63), (64, 64), (65, 65), (3, 150, 150),
                                   (2, 0, 5, 5)])
def test_cholesky_backward_matches_the_symbolic_form_across_blocks(shape, dtype):
    """The blocked reverse (blocks of 64 columns) equals the symbolic gradient at sizes
    below, at and past one block and over several blocks, batched and empty, reading only
    the lower triangles of ``L`` and ``gL``."""
    n = shape[-1]
    M = RNG.standard_normal(shape)
    K = M @ np.swapaxes(M, -1, -2) + n * np.eye(n)
    G = RNG.standard_normal(shape)
    L = np.linalg.cholesky(K)
    junk = np.triu(RNG.standard_normal(shape), 1)
    got = nb.ops.decomp.cholesky_backward(nb.tensor((G + 5 * junk).astype(dtype)),
                                          nb.tensor((L + junk).astype(dtype)))
    assert got.shape == shape and got.dtype == dtype
    tol = 1e-10 if dtype == np.float64 else 2e-4
    want = _cholesky_grad_symbolic(K, G)
    scale = max(1.0, float(np.abs(want).max())) if G.size else 1.0
    np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol * scale)
