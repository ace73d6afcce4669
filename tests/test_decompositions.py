"""Spectral decompositions (issue 14): ``linalg.eigh``, ``eigvalsh``, ``svd``, ``svdvals``,
``pinv``, the SVD matrix norms and ``det`` on singular matrices. The op records
(``nbgrad/testing/records/decompositions.py``) drive gradcheck/gradgradcheck and jit;
here: agreement with torch.linalg (where installed), the repeated-eigenvalue error,
singular determinants, bad shapes and both jit tiers."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import gradcheck, gradgradcheck
from nbgrad.linalg import LinAlgError

RNG = np.random.default_rng(14)


def _sym(n, *batch):
    a = RNG.standard_normal((*batch, n, n))
    return a + np.swapaxes(a, -1, -2)


def _with_eigenvalues(w):
    q, _ = np.linalg.qr(RNG.standard_normal((len(w), len(w))))
    return (q * np.asarray(w, float)) @ q.T


# ------------------------------------------------------------------ values
def test_eigh_reads_one_triangle_and_matches_numpy():
    A = RNG.standard_normal((2, 4, 4))
    for uplo in ("L", "U"):
        L, V = nb.linalg.eigh(nb.tensor(A), UPLO=uplo)
        wL, wV = np.linalg.eigh(A, UPLO=uplo)
        np.testing.assert_allclose(L.numpy(), wL, atol=1e-12)
        np.testing.assert_allclose(np.abs(V.numpy()), np.abs(wV), atol=1e-10)
        np.testing.assert_allclose(nb.linalg.eigvalsh(nb.tensor(A), uplo).numpy(), wL,
                                   atol=1e-12)
    res = nb.linalg.eigh(nb.tensor(_sym(3)))
    assert res.eigenvalues is res[0] and res.eigenvectors is res[1]


@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3), (0, 3), (2, 0, 0)])
@pytest.mark.parametrize("full", [True, False])
def test_svd_reconstructs_and_matches_numpy(shape, full):
    A = RNG.standard_normal(shape)
    U, S, Vh = nb.linalg.svd(nb.tensor(A), full_matrices=full)
    wU, wS, wVh = np.linalg.svd(A, full_matrices=full)
    assert U.shape == wU.shape and S.shape == wS.shape and Vh.shape == wVh.shape
    np.testing.assert_allclose(S.numpy(), wS, atol=1e-12)
    k = S.shape[-1]
    rebuilt = (U.numpy()[..., :k] * S.numpy()[..., None, :]) @ Vh.numpy()[..., :k, :]
    np.testing.assert_allclose(rebuilt, A, atol=1e-12)
    np.testing.assert_allclose(nb.linalg.svdvals(nb.tensor(A)).numpy(), wS, atol=1e-12)


def test_pinv_matches_numpy_and_tolerances():
    A = RNG.standard_normal((2, 3, 5))
    np.testing.assert_allclose(nb.linalg.pinv(nb.tensor(A)).numpy(), np.linalg.pinv(A),
                               atol=1e-12)
    low = RNG.standard_normal((4, 2)) @ RNG.standard_normal((2, 4))
    np.testing.assert_allclose(nb.linalg.pinv(nb.tensor(low), atol=1e-8).numpy(),
                               np.linalg.pinv(low, rcond=1e-8 / np.linalg.norm(low, 2)),
                               atol=1e-10)
    S = _sym(4)
    np.testing.assert_allclose(nb.linalg.pinv(nb.tensor(S), hermitian=True).numpy(),
                               np.linalg.pinv(S, hermitian=True), atol=1e-10)


def test_svd_matrix_norms():
    A = RNG.standard_normal((2, 3, 4))
    for o in ("nuc", 2, -2):
        np.testing.assert_allclose(nb.linalg.matrix_norm(nb.tensor(A), o).numpy(),
                                   np.linalg.norm(A, o, axis=(-2, -1)), atol=1e-12)
        np.testing.assert_allclose(nb.linalg.norm(nb.tensor(A[0]), o).numpy(),
                                   np.linalg.norm(A[0], o), atol=1e-12)
        got = nb.linalg.matrix_norm(nb.tensor(A), o, dim=(0, 2), keepdim=True)
        np.testing.assert_allclose(got.numpy(),
                                   np.linalg.norm(A, o, axis=(0, 2), keepdims=True), atol=1e-12)
        a = nb.tensor(A, requires_grad=True)
        assert gradcheck(lambda a, o=o: nb.linalg.matrix_norm(a, o), (a,))
        assert gradgradcheck(lambda a, o=o: nb.linalg.matrix_norm(a, o), (a,))


# ------------------------------------------------------------------ repeated spectra
def test_eigenvalue_gradients_hold_on_repeated_eigenvalues():
    A = nb.tensor(_with_eigenvalues([1.0, 1.0, 2.0]), requires_grad=True)
    L = nb.linalg.eigvalsh(A)
    L.sum().backward()                         # d trace(A) / dA = I
    np.testing.assert_allclose(A.grad.numpy(), np.eye(3), atol=1e-12)
    A.grad = None
    L, V = nb.linalg.eigh(A)                   # eigenvalues only: no gap involved
    (L * L).sum().backward()                   # d |A|_F^2 / dA = 2A
    np.testing.assert_allclose(A.grad.numpy(), 2 * A.numpy(), atol=1e-10)


def test_eigenvector_gradient_on_repeated_eigenvalues_raises_clearly():
    A = nb.tensor(_with_eigenvalues([1.0, 1.0, 2.0]), requires_grad=True)
    L, V = nb.linalg.eigh(A)
    with pytest.raises(LinAlgError, match=r"linalg\.eigh backward.*repeated"):
        V[:, 0].sum().backward()
    jitted = nb.jit(nb.grad(lambda a: nb.linalg.eigh(a)[1][:, 0].sum()), mode="compile")
    with pytest.raises(LinAlgError, match="repeated"):
        jitted(A.detach())


def test_singular_vector_gradients_raise_clearly():
    q1, _ = np.linalg.qr(RNG.standard_normal((3, 3)))
    q2, _ = np.linalg.qr(RNG.standard_normal((3, 3)))
    B = nb.tensor(q1 @ np.diag([2.0, 2.0, 1.0]) @ q2.T, requires_grad=True)
    U, S, Vh = nb.linalg.svd(B)
    with pytest.raises(LinAlgError, match=r"linalg\.svd backward"):
        U[0].sum().backward()
    tall = nb.tensor(RNG.standard_normal((4, 1)) @ RNG.standard_normal((1, 3)),
                     requires_grad=True)  # rank 1: two zero singular values
    U, S, Vh = nb.linalg.svd(tall, full_matrices=False)
    S.sum().backward()                         # singular values alone: fine (no NaN)
    assert np.all(np.isfinite(tall.grad.numpy()))
    U, S, Vh = nb.linalg.svd(tall, full_matrices=False)
    with pytest.raises(LinAlgError, match=r"linalg\.svd backward"):
        (U ** 3).sum().backward()


# ------------------------------------------------------------------ det on singular matrices
@pytest.mark.parametrize("rank", [2, 1, 0])
def test_det_gradient_is_the_adjugate_on_singular_matrices(rank):
    A = RNG.standard_normal((3, rank)) @ RNG.standard_normal((rank, 3))
    a = nb.tensor(A, requires_grad=True)
    nb.linalg.det(a).backward()
    cof = np.array([[(-1) ** (i + j) * np.linalg.det(np.delete(np.delete(A, i, 0), j, 1))
                     for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(a.grad.numpy(), cof, atol=1e-12)
    a2 = nb.tensor(A, requires_grad=True)
    assert gradcheck(nb.linalg.det, (a2,), eps=1e-4)


def test_det_second_order_on_singular_matrices():
    a = nb.tensor(RNG.standard_normal((3, 2)) @ RNG.standard_normal((2, 3)), requires_grad=True)
    assert gradgradcheck(nb.linalg.det, (a,), eps=1e-4, atol=1e-6)
    a2 = nb.tensor(RNG.standard_normal((4, 2)) @ RNG.standard_normal((2, 4)), requires_grad=True)
    g, = nb.autograd.grad(nb.linalg.det(a2), [a2], create_graph=True)
    with pytest.raises(LinAlgError, match="repeated"):  # rank n-2: a clear error, never NaN
        nb.autograd.grad(g.sum(), [a2])


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(("fn", "shape"), [
    (nb.linalg.eigh, (3, 4)), (nb.linalg.eigh, (3,)), (nb.linalg.eigvalsh, (2, 3)),
    (nb.linalg.svd, (3,)), (nb.linalg.svdvals, ()), (nb.linalg.pinv, (4,))])
def test_bad_shapes_name_the_op(fn, shape):
    with pytest.raises(RuntimeError, match=r"linalg\.\w+: .*shape"):
        fn(nb.tensor(np.ones(shape)))


def test_bad_arguments_and_nonfinite_inputs():
    with pytest.raises(RuntimeError, match="UPLO"):
        nb.linalg.eigh(nb.tensor(np.eye(2)), UPLO="X")
    with pytest.raises(LinAlgError, match=r"linalg\.svd: .*infs or NaNs.*\(input of shape"):
        nb.linalg.svd(nb.tensor(np.full((2, 2), np.nan)))
    with pytest.raises(LinAlgError, match=r"linalg\.eigh: .*infs or NaNs"):
        nb.linalg.eigh(nb.tensor(np.full((2, 2), np.inf)))


# ------------------------------------------------------------------ jit
def _spectral_loss(a):
    L, V = nb.linalg.eigh(a + a.mT)
    U, S, Vh = nb.linalg.svd(a, full_matrices=False)
    return (L.sum() + (V * V * L[..., None, :]).sum() + S.sum() + nb.linalg.pinv(a).sum()
            + nb.linalg.matrix_norm(a, "nuc") + nb.linalg.det(a) + (U @ Vh).sum())


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_jit_equals_eager(mode):
    a = nb.tensor(RNG.standard_normal((2, 3, 3)) + 3 * np.eye(3))
    want_v, want_g = nb.value_and_grad(lambda a: _spectral_loss(a).sum())(a)
    f = nb.jit(nb.value_and_grad(lambda a: _spectral_loss(a).sum()), mode=mode)
    for _ in range(2):
        v, g = f(a)
        np.testing.assert_allclose(v.numpy(), want_v.numpy(), rtol=1e-12)
        np.testing.assert_allclose(g.numpy(), want_g.numpy(), rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ torch
def test_agrees_with_torch_linalg():
    torch = pytest.importorskip("torch")
    A = RNG.standard_normal((2, 4, 3))
    S3 = _sym(3, 2)

    def losses(lib, A, S):
        la = lib.linalg
        L, V = la.eigh(S)
        U, s, Vh = la.svd(A, full_matrices=False)
        return [L.sum() + (V ** 4).sum(), (U ** 4).sum() + (Vh ** 4).sum() + s.sum(),
                la.pinv(A).sum(), la.svdvals(A).sum(), la.eigvalsh(S).sum(),
                la.matrix_norm(A, "nuc").sum(), la.matrix_norm(A, 2).sum(),
                la.det(S).sum()]

    for k in range(8):
        a, s = nb.tensor(A, requires_grad=True), nb.tensor(S3, requires_grad=True)
        ta = torch.tensor(A, requires_grad=True)
        ts = torch.tensor(S3, requires_grad=True)
        mine, theirs = losses(nb, a, s)[k], losses(torch, ta, ts)[k]
        np.testing.assert_allclose(mine.numpy(), theirs.detach().numpy(), rtol=1e-10)
        ga, gs = nb.autograd.grad(mine, [a, s], allow_unused=True)
        tga, tgs = torch.autograd.grad(theirs, [ta, ts], allow_unused=True)
        for g, t in ((ga, tga), (gs, tgs)):
            if t is not None:
                np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-8, atol=1e-10)


# ------------------------------------------------------------------ qr, matrix_exp, lu, lstsq
@pytest.mark.parametrize("shape", [(4, 3), (3, 5), (2, 3, 3)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_matches_numpy(shape, mode):
    A = RNG.standard_normal(shape)
    Q, R = nb.linalg.qr(nb.tensor(A), mode)
    if mode == "r":
        assert Q.shape == (0,)
        np.testing.assert_allclose(R.numpy(), np.linalg.qr(A, "r"), atol=1e-12)
        return
    wQ, wR = np.linalg.qr(A, mode)
    np.testing.assert_allclose(Q.numpy(), wQ, atol=1e-12)
    np.testing.assert_allclose(R.numpy(), wR, atol=1e-12)


def test_qr_backward_errors_as_pytorch():
    a = nb.tensor(RNG.standard_normal((4, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match="mode='r'"):
        nb.linalg.qr(a, "r").R.sum().backward()
    with pytest.raises(RuntimeError, match="mode='complete' and nrows > ncols"):
        nb.linalg.qr(a, "complete").Q.sum().backward()
    with pytest.raises(RuntimeError, match="linalg.qr: mode"):
        nb.linalg.qr(a, "full")


def test_matrix_exp_matches_scipy():
    scipy_linalg = pytest.importorskip("scipy.linalg")
    A = RNG.standard_normal((2, 4, 4)) * np.array([0.1, 8.0])[:, None, None]
    want = np.stack([scipy_linalg.expm(x) for x in A])
    np.testing.assert_allclose(nb.linalg.matrix_exp(nb.tensor(A)).numpy(), want, rtol=1e-12)
    f32 = nb.linalg.matrix_exp(nb.tensor(A[0].astype(np.float32)))
    assert f32.dtype == np.float32
    with pytest.raises(RuntimeError, match=r"linalg\.matrix_exp: .*\(2, 3\)"):
        nb.linalg.matrix_exp(nb.tensor(np.ones((2, 3))))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve_solves_and_differentiates(left, adjoint):
    A = RNG.standard_normal((2, 3, 3))
    B = RNG.standard_normal((2, 3, 2) if left else (2, 2, 3))
    LU, piv = nb.linalg.lu_factor(nb.tensor(A))
    assert piv.dtype == np.int32 and piv.shape == (2, 3)
    X = nb.linalg.lu_solve(LU, piv, nb.tensor(B), left=left, adjoint=adjoint).numpy()
    M = np.swapaxes(A, -1, -2) if adjoint else A
    np.testing.assert_allclose(M @ X if left else X @ M, B, atol=1e-12)
    lu = nb.tensor(LU.numpy(), requires_grad=True)
    b = nb.tensor(B, requires_grad=True)

    def f(lu, b):
        return nb.linalg.lu_solve(lu, piv, b, left=left, adjoint=adjoint)
    assert gradcheck(f, (lu, b)) and gradgradcheck(f, (lu, b))


def test_lu_factor_singular_and_bad_inputs():
    LU, piv = nb.linalg.lu_factor(nb.tensor(np.zeros((3, 3))))  # factored, as PyTorch
    np.testing.assert_array_equal(LU.numpy(), 0)
    with pytest.raises(LinAlgError, match=r"linalg\.lu_factor: .*infs or NaNs"):
        nb.linalg.lu_factor(nb.tensor(np.full((2, 2), np.nan)))
    with pytest.raises(RuntimeError, match=r"linalg\.lu_solve: .*do not fit"):
        nb.linalg.lu_solve(LU, piv, nb.tensor(np.ones((2, 2))))


def test_lstsq_full_rank_gradients():
    a = nb.tensor(RNG.standard_normal((5, 3)), requires_grad=True)
    b = nb.tensor(RNG.standard_normal((5, 2)), requires_grad=True)
    assert gradcheck(lambda a, b: nb.linalg.lstsq(a, b).solution, (a, b))
    assert gradcheck(lambda a, b: nb.linalg.lstsq(a, b, driver="gelsd").residuals, (a, b))
    with pytest.raises(RuntimeError, match=r"linalg\.lstsq: .*do not fit"):
        nb.linalg.lstsq(a, nb.tensor(np.ones((4, 2))))


def _factor_loss(a):
    Q, R = nb.linalg.qr(a)
    LU, piv = nb.linalg.lu_factor(a)
    x = nb.linalg.lu_solve(LU, piv, a)
    sol = nb.linalg.lstsq(a, a[..., :2]).solution
    return (Q.sum() + (R * R).sum() + nb.linalg.matrix_exp(0.3 * a).sum() + x.sum()
            + (LU * LU).sum() + sol.sum())


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_factorizations_jit_equals_eager(mode):
    a = nb.tensor(RNG.standard_normal((2, 3, 3)) + 3 * np.eye(3))
    want_v, want_g = nb.value_and_grad(_factor_loss)(a)
    f = nb.jit(nb.value_and_grad(_factor_loss), mode=mode)
    for _ in range(2):
        v, g = f(a)
        np.testing.assert_allclose(v.numpy(), want_v.numpy(), rtol=1e-12)
        np.testing.assert_allclose(g.numpy(), want_g.numpy(), rtol=1e-10, atol=1e-12)


def test_factorizations_agree_with_torch():
    torch = pytest.importorskip("torch")
    A = RNG.standard_normal((2, 4, 3))
    S = RNG.standard_normal((2, 3, 3))
    B = RNG.standard_normal((2, 3, 2))

    def losses(lib, A, S, B):
        la = lib.linalg
        Q, R = la.qr(A)
        LU, piv = la.lu_factor(S)
        return [(Q ** 3).sum() + (R ** 3).sum(), la.matrix_exp(S).sum(),
                (LU ** 3).sum(), (la.lu_solve(LU, piv, B, adjoint=True) ** 2).sum(),
                la.lstsq(A, A[..., :2]).solution.sum()]

    for k in range(5):
        ts = [torch.tensor(x, requires_grad=True) for x in (A, S, B)]
        ns = [nb.tensor(x, requires_grad=True) for x in (A, S, B)]
        mine, theirs = losses(nb, *ns)[k], losses(torch, *ts)[k]
        np.testing.assert_allclose(mine.numpy(), theirs.detach().numpy(), rtol=1e-10)
        gm = nb.autograd.grad(mine, ns, allow_unused=True)
        gt = torch.autograd.grad(theirs, ts, allow_unused=True)
        for g, t in zip(gm, gt, strict=True):
            if t is not None:
                np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-8, atol=1e-10)


def test_slogdet_gradient_on_singular_matrices():
    A = RNG.standard_normal((3, 2)) @ RNG.standard_normal((2, 3))
    a = nb.tensor(np.stack([A, np.eye(3) * 2]), requires_grad=True)
    sign, logabs = nb.linalg.slogdet(a)
    (sign.sum() + 0.0 * logabs.sum()).backward()  # no gradient through logabsdet: no error
    np.testing.assert_array_equal(a.grad.numpy(), 0)
    sign, logabs = nb.linalg.slogdet(a)
    with pytest.raises(LinAlgError, match=r"linalg\.slogdet backward: .*rank-deficient"):
        logabs.sum().backward()
    b = nb.tensor(np.eye(3) * 2, requires_grad=True)   # second order at a repeated spectrum
    assert gradgradcheck(lambda b: nb.linalg.slogdet(b)[1], (b,))
