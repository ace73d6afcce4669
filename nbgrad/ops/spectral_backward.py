"""Backward helpers of the decompositions (PyTorch's ``FunctionsManual.cpp`` formulas):
``eigh``, ``svd``, ``pinv``, ``det`` on singular matrices, ``qr``, ``lu_factor`` and
``matrix_exp``. Plain Python over table ops, as :mod:`nbgrad.ops.backward`, so the
gradients differentiate again; they branch only on shapes and flags.
"""

from __future__ import annotations

from .backward import exclusive_cumprod, mT, ops
from .orthogonal import qr_differentiable
from .registry import backward_helper
from .spectral import log_of

__all__: list[str] = []


# -------------------------------------------------------------------- pieces
@backward_helper
def diag_embed_last(x):
    """Each last-dim vector of ``x`` on the diagonal of a square matrix."""
    return ops.diagonal_backward(x, (*x.shape, x.shape[-1]), 0, x.ndim - 1, x.ndim)


@backward_helper
def narrow_last(x, dim, length):
    """The first ``length`` entries of ``dim`` (-1 or -2) of ``x``."""
    size = x.shape[dim]
    if length == size:
        return x
    return ops.split_with_sizes(x, [length, size - length], dim)[0]


@backward_helper
def skew(x):
    """``x - x^T``."""
    return x - mT(x)


# -------------------------------------------------------------------- eigh, svd
@backward_helper
def eigh_backward(gL, gV, L, V):
    """``V (diag(gL) + sym-part(V^T gV) / E) V^T`` with ``E[i, j] = L[j] - L[i]``."""
    inner = ops.gap_divide(0.5 * skew(ops.matmul(mT(V), gV)), L, "linalg.eigh")
    return ops.matmul(V, ops.matmul(inner + diag_embed_last(gL), mT(V)))


@backward_helper
def eigvalsh_backward(grad, A, UPLO):
    """``V diag(grad) V^T``: no eigenvalue gap involved."""
    V = ops.linalg.eigh(A, UPLO)[1]
    return ops.matmul(V * ops.unsqueeze(grad, -2), mT(V))


@backward_helper
def svd_backward(gU, gS, gVh, U, S, Vh, full_matrices):
    """PyTorch's ``svd_backward`` (the extra columns of a full U / rows of Vh dropped)."""
    k = S.shape[-1]
    if full_matrices:
        U, gU = narrow_last(U, -1, k), narrow_last(gU, -1, k)
        Vh, gVh = narrow_last(Vh, -2, k), narrow_last(gVh, -2, k)
    m, n = U.shape[-2], Vh.shape[-1]
    Srow, Scol = ops.unsqueeze(S, -2), ops.unsqueeze(S, -1)
    UhgU = skew(ops.matmul(mT(U), gU))
    VhgV = skew(ops.matmul(Vh, mT(gVh)))
    gA = ops.gap_divide(UhgU * Srow + Scol * VhgV, S * S, "linalg.svd") + diag_embed_last(gS)
    if m > n:
        gUSinv = ops.column_divide(gU, S, "linalg.svd")
        gA = ops.matmul(U, gA) + gUSinv - ops.matmul(U, ops.matmul(mT(U), gUSinv))
        return ops.matmul(gA, Vh)
    if m < n:
        SinvgVh = mT(ops.column_divide(mT(gVh), S, "linalg.svd"))
        gA = ops.matmul(gA, Vh) + SinvgVh - ops.matmul(ops.matmul(SinvgVh, mT(Vh)), Vh)
        return ops.matmul(U, gA)
    return ops.matmul(U, ops.matmul(gA, Vh))


@backward_helper
def svdvals_backward(grad, A):
    """``U diag(grad) Vh``: no gap between singular values involved."""
    U, S, Vh = ops.linalg.svd(A, False)
    return ops.matmul(U * ops.unsqueeze(grad, -2), Vh)


@backward_helper
def pinv_backward(grad, pinvA, A):
    """PyTorch's ``pinv_backward``: the derivative of ``A^+`` through ``A^+`` itself."""
    m, n = A.shape[-2], A.shape[-1]
    pinvAh, gradh = mT(pinvA), mT(grad)
    if m <= n:
        K = ops.matmul(gradh, pinvA)
        KpinvAh = ops.matmul(K, pinvAh)
        return (-mT(ops.matmul(pinvA, K)) + KpinvAh
                - ops.matmul(ops.matmul(A, pinvA), KpinvAh)
                + ops.matmul(ops.matmul(pinvAh, pinvA), gradh - ops.matmul(K, A)))
    K = ops.matmul(pinvA, gradh)
    pinvAhK = ops.matmul(pinvAh, K)
    return (-mT(ops.matmul(K, pinvA))
            + ops.matmul(ops.matmul(gradh - ops.matmul(A, K), pinvA), pinvAh)
            + pinvAhK - ops.matmul(ops.matmul(pinvAhK, pinvA), A))


# -------------------------------------------------------------------- det
@backward_helper
def det_singular_grad(d, A):
    """``d * adj(A)^T`` through the SVD, ``A = U diag(S) Vh``: ``U diag(d * alpha *
    prod_{j != i} S_j) Vh`` with ``alpha = det(U) det(Vh)`` (no division)."""
    U, S, Vh = ops.linalg.svd(A, False)
    alpha = ops.where(ops.linalg.det(U) * ops.linalg.det(Vh) < 0, -1.0, 1.0)
    D = ops.unsqueeze(d * alpha, -1) * exclusive_cumprod(S, -1) \
        * exclusive_cumprod(S, -1, True)
    return ops.matmul(U * ops.unsqueeze(D, -2), Vh)


@backward_helper
def det_backward(grad, A, det, eps):
    """PyTorch's ``linalg_det_backward``: ``grad * det * A^-T`` by a solve where
    ``|det| >= 100 eps``, else through the SVD (right on singular matrices); each path
    sees a harmless stand-in (the identity, ``diag(1..n)``) for the other's matrices."""
    d = grad * det
    ones = ops.ones_like(ops.diagonal(A, 0, -2, -1))
    singular = ops.unsqueeze(ops.unsqueeze(ops.abs(det) < 100.0 * eps, -1), -1)
    eye = diag_embed_last(ones)
    distinct = diag_embed_last(ops.cumsum(ones, -1))
    regular = ops.linalg.solve(mT(ops.where(singular, eye, A)),
                               diag_embed_last(ops.unsqueeze(d, -1) * ones))
    return ops.where(singular, det_singular_grad(grad, ops.where(singular, A, distinct)),
                     regular)


@backward_helper
def slogdet_backward(g, A, logabsdet, eps):
    """``g * A^-T`` by a solve; where ``|det| < 100 eps`` (as :func:`det_backward`) through
    the SVD, ``U diag(g / S) Vh``, where a zero singular value raises LinAlgError unless
    ``g`` is 0 (only the sign was used: then the gradient is 0, as PyTorch's)."""
    ones = ops.ones_like(ops.diagonal(A, 0, -2, -1))
    singular = ops.unsqueeze(ops.unsqueeze(logabsdet < log_of(100.0 * eps), -1), -1)
    regular = ops.linalg.solve(mT(ops.where(singular, diag_embed_last(ones), A)),
                               diag_embed_last(ops.unsqueeze(g, -1) * ones))
    U, S, Vh = ops.linalg.svd(ops.where(singular, A, diag_embed_last(ops.cumsum(ones, -1))),
                              False)
    D = ops.column_divide(ops.unsqueeze(ops.unsqueeze(g, -1) * ones, -2), S, "linalg.slogdet")
    return ops.where(singular, ops.matmul(U * D, Vh), regular)


# -------------------------------------------------------------------- qr, matrix_exp
@backward_helper
def qr_backward(gQ, gR, Q, R, mode):
    """PyTorch's ``linalg_qr_backward``."""
    m, n = qr_differentiable(mode, Q.shape, R.shape)
    gA = ops.matmul(gR, mT(R)) - ops.matmul(mT(Q), gQ)
    if m >= n:
        sym = ops.triu(gA)
        sym = sym + mT(sym)
        sym = sym - diag_embed_last(0.5 * ops.diagonal(sym, 0, -2, -1))
        return ops.linalg.solve_triangular(mT(R), ops.matmul(Q, sym) + gQ, upper=False,
                                           left=False)
    skew_low = ops.tril(mT(gA) - gA)
    gA = ops.linalg.solve_triangular(mT(narrow_last(R, -1, m)), ops.matmul(Q, skew_low),
                                     upper=False, left=False)
    tail = ops.zeros_like(ops.split_with_sizes(R, [m, n - m], -1)[1])
    return ops.cat([gA, tail], -1) + ops.matmul(Q, gR)


@backward_helper
def matrix_exp_backward(grad, A):
    """The top-right block of ``matrix_exp([[A^T, grad], [0, A^T]])``."""
    n = A.shape[-1]
    At = mT(A)
    block = ops.cat([ops.cat([At, grad], -1), ops.cat([ops.zeros_like(A), At], -1)], -2)
    top = ops.split_with_sizes(ops.linalg.matrix_exp(block), [n, n], -2)[0]
    return ops.split_with_sizes(top, [n, n], -1)[1]


# -------------------------------------------------------------------- lu_factor
@backward_helper
def lu_factor_backward(grad, LU, pivots):
    """PyTorch's ``lu_factor_ex_backward`` (``linalg_lu_backward`` with ``gL = grad[:, :k]``,
    ``gU = grad[:k]``), ``A = P L U``."""
    m, n = LU.shape[-2], LU.shape[-1]
    k = min(m, n)
    P = mT(ops.to_dtype(ops.one_hot(ops.lu_permutation(pivots, m), m), LU.dtype))
    eye_m = diag_embed_last(ops.ones_like(ops.sum(LU, -1)))
    L = ops.tril(narrow_last(LU, -1, k), -1) + narrow_last(eye_m, -1, k)
    U = ops.triu(narrow_last(LU, -2, k))
    gL, gU = narrow_last(grad, -1, k), narrow_last(grad, -2, k)
    if m == n:
        gA = ops.tril(ops.matmul(mT(L), gL), -1) + ops.triu(ops.matmul(gU, mT(U)))
        gA = ops.linalg.solve_triangular(mT(U), gA, upper=False, left=False)
        gA = ops.linalg.solve_triangular(mT(L), gA, upper=True, unitriangular=True)
    elif m < n:
        gA = ops.matmul(mT(L), gL) - ops.matmul(ops.triu(gU), mT(U))
        gA = ops.linalg.solve_triangular(mT(narrow_last(U, -1, k)), ops.tril(gA, -1),
                                         upper=False, left=False)
        rest = ops.split_with_sizes(gU, [k, n - k], -1)[1]
        gA = ops.cat([gA + ops.triu(narrow_last(gU, -1, k)), rest], -1)
        gA = ops.linalg.solve_triangular(mT(L), gA, upper=True, unitriangular=True)
    else:
        gA = ops.matmul(gU, mT(U)) - ops.matmul(mT(L), ops.tril(gL, -1))
        L1 = narrow_last(L, -2, k)
        gA = ops.linalg.solve_triangular(mT(L1), ops.triu(gA), upper=True,
                                         unitriangular=True)
        rest = ops.split_with_sizes(gL, [k, m - k], -2)[1]
        gA = ops.cat([gA + ops.tril(narrow_last(gL, -2, k), -1), rest], -2)
        gA = ops.linalg.solve_triangular(mT(U), gA, upper=False, left=False)
    return ops.matmul(P, gA)
