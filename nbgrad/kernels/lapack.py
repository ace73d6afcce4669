"""Spectral and orthogonal decompositions as batched ``@njit`` natives: ``eigh``,
``svd``, ``pinv``, ``qr``, ``lu_factor``/``lu_solve`` and ``matrix_exp``, plus the
checked eigen-gap division that their gradients use.

Each native takes its input flat with the stack ``(batch, rows, cols)`` and returns flat
results (see :class:`~nbgrad.ops.traits.NativePlan`). The decompositions call LAPACK
through Numba's ``np.linalg`` (which binds SciPy's LAPACK); ``getrf`` (LU with partial
pivoting) is Numba's binding of SciPy's ``?getrf``. A failure raises
:class:`~nbgrad.errors.LinAlgError` with the op's name and the input's shape
(``prefix``/``suffix``).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload
from numba.np.linalg import _LAPACK, F_INT_nptype, get_blas_kind

from ..errors import LinAlgError
from .layout import view3

OPTS = dict(cache=True, nogil=True)

#: LAPACK's integer type (LU pivots are returned as int32, as PyTorch does)
F_INT = F_INT_nptype


@njit(**OPTS)
def _finite_message(a):
    if not np.all(np.isfinite(a)):
        return "Array must not contain infs or NaNs."
    return "The algorithm failed to converge."


# ------------------------------------------------------------------ eigh
@njit(**OPTS)
def _symmetric_copy(a, upper):
    """The symmetric matrix whose lower (or, with ``upper``, upper) triangle is ``a``'s."""
    n = a.shape[0]
    s = np.empty((n, n), a.dtype)
    for i in range(n):
        for j in range(i + 1):
            v = a[j, i] if upper else a[i, j]
            s[i, j] = v
            s[j, i] = v
    return s


@njit(**OPTS)
def eigh_native(A, stack, upper, prefix, suffix):
    """Eigenvalues (ascending) and orthonormal eigenvectors (columns) of each symmetric
    matrix of ``A``, read from its lower (``upper``: upper) triangle."""
    a = view3(A, stack)
    b, n = stack[0], stack[1]
    w = np.zeros((b, n), A.dtype)
    v = np.zeros((b, n, n), A.dtype)
    for i in range(b if n else 0):
        s = _symmetric_copy(a[i], upper)
        ok = True
        try:
            wi, vi = np.linalg.eigh(s)
            w[i] = wi
            v[i] = vi
        except Exception:  # noqa: BLE001 - Numba binds no exception; the message is ours
            ok = False
        if not ok:
            raise LinAlgError(prefix + _finite_message(s) + suffix)
    return w.reshape(-1), v.reshape(-1)


@njit(**OPTS)
def eigvalsh_native(A, stack, upper, prefix, suffix):
    """Eigenvalues (ascending) of each symmetric matrix of ``A``."""
    a = view3(A, stack)
    b, n = stack[0], stack[1]
    w = np.zeros((b, n), A.dtype)
    for i in range(b if n else 0):
        s = _symmetric_copy(a[i], upper)
        ok = True
        try:
            w[i] = np.linalg.eigvalsh(s)
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            raise LinAlgError(prefix + _finite_message(s) + suffix)
    return w.reshape(-1)


@njit(**OPTS)
def gap_divide_native(X, L, stack, prefix, suffix):
    """``X[i, j] / (L[j] - L[i])`` off the diagonal and 0 on it, for each matrix of ``X``
    (``stack``: batch, n, n) and vector of ``L``. Where two values of ``L`` are equal up to
    rounding (gap <= 64 n eps max|L|) the entry must be exactly 0 (no gradient reached
    the vectors of that eigenspace), else LinAlgError: the quotient would be inf, NaN or
    rounding noise."""
    b, n = stack[0], stack[1]
    x = view3(X, stack)
    lam = L.reshape((b, n))
    out = np.zeros((b, n, n), X.dtype)
    eps = np.finfo(X.dtype).eps
    for k in range(b):
        scale = 0.0
        for i in range(n):
            scale = max(scale, abs(lam[k, i]))
        tol = 64.0 * n * eps * scale
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                gap = lam[k, j] - lam[k, i]
                if abs(gap) <= tol:
                    if x[k, i, j] != 0:
                        raise LinAlgError(prefix + suffix)
                else:
                    out[k, i, j] = x[k, i, j] / gap
    return out.reshape(-1)


@njit(**OPTS)
def column_divide_native(X, d, stack, prefix, suffix):
    """``X[..., i, j] / d[..., j]`` for each matrix of ``X`` (``stack``: batch, m, k);
    where ``|d[j]| <= 64 max(m, k) eps max|d|`` the column must be exactly 0 (it is then
    0), else LinAlgError."""
    b, m, k = stack[0], stack[1], stack[2]
    x = view3(X, stack)
    dv = d.reshape((b, k))
    out = np.zeros((b, m, k), X.dtype)
    eps = np.finfo(X.dtype).eps
    for t in range(b):
        scale = 0.0
        for j in range(k):
            scale = max(scale, abs(dv[t, j]))
        tol = 64.0 * max(m, k) * eps * scale
        for j in range(k):
            small = abs(dv[t, j]) <= tol
            for i in range(m):
                if small:
                    if x[t, i, j] != 0:
                        raise LinAlgError(prefix + suffix)
                else:
                    out[t, i, j] = x[t, i, j] / dv[t, j]
    return out.reshape(-1)


# ------------------------------------------------------------------ svd
@njit(**OPTS)
def svd_native(A, stack, full, prefix, suffix):
    """``U, S, Vh`` of each matrix of ``A`` (``full``: U is m x m and Vh n x n)."""
    a = view3(A, stack)
    b, m, n = stack[0], stack[1], stack[2]
    k = min(m, n)
    ku, kv = (m, n) if full else (k, k)
    U = np.zeros((b, m, ku), A.dtype)
    S = np.zeros((b, k), A.dtype)
    Vh = np.zeros((b, kv, n), A.dtype)
    for i in range(b):
        if k == 0:  # an empty matrix: identity bases, no singular values
            for r in range(ku):
                U[i, r, r] = 1.0
            for r in range(kv):
                Vh[i, r, r] = 1.0
            continue
        ok = True
        try:
            u, s, vh = np.linalg.svd(np.ascontiguousarray(a[i]), full_matrices=full)
            U[i] = u
            S[i] = s
            Vh[i] = vh
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            raise LinAlgError(prefix + _finite_message(a[i]) + suffix)
    return U.reshape(-1), S.reshape(-1), Vh.reshape(-1)


@njit(**OPTS)
def svdvals_native(A, stack, prefix, suffix):
    """The singular values (descending) of each matrix of ``A``."""
    return svd_native(A, stack, False, prefix, suffix)[1]


@njit(**OPTS)
def pinv_native(A, stack, atol, rtol, hermitian, prefix, suffix):
    """The pseudo-inverse of each matrix of ``A``: singular values (eigenvalue moduli when
    ``hermitian``) at most ``max(atol, rtol * largest)`` count as zero."""
    b, m, n = stack[0], stack[1], stack[2]
    out = np.zeros((b, n, m), A.dtype)
    if min(m, n) == 0:
        return out.reshape(-1)
    if hermitian:
        w, v = eigh_native(A, stack, False, prefix, suffix)
        w2 = w.reshape((b, n))
        v3 = v.reshape((b, n, n))
        for i in range(b):
            big = np.max(np.abs(w2[i]))
            cut = max(atol, rtol * big)
            d = np.zeros(n, A.dtype)
            for j in range(n):
                if abs(w2[i, j]) > cut:
                    d[j] = 1.0 / w2[i, j]
            out[i] = (v3[i] * d) @ v3[i].T
        return out.reshape(-1)
    U, S, Vh = svd_native(A, stack, False, prefix, suffix)
    k = min(m, n)
    U3, S2, V3 = U.reshape((b, m, k)), S.reshape((b, k)), Vh.reshape((b, k, n))
    for i in range(b):
        cut = max(atol, rtol * S2[i, 0])
        d = np.zeros(k, A.dtype)
        for j in range(k):
            if S2[i, j] > cut:
                d[j] = 1.0 / S2[i, j]
        out[i] = (V3[i].T * d) @ U3[i].T
    return out.reshape(-1)


# ------------------------------------------------------------------ qr
@njit(**OPTS)
def qr_native(A, stack, complete, keep_q, prefix, suffix):
    """``Q, R`` of each matrix of ``A`` (``complete``: Q is m x m; LAPACK's Householder
    QR, as NumPy's; without ``keep_q`` Q comes back empty). A complete Q of a tall matrix
    is the Q of ``[A, 0]``: the reflectors of zero columns are the identity, so its first
    n columns are the reduced Q."""
    a = view3(A, stack)
    b, m, n = stack[0], stack[1], stack[2]
    k = min(m, n)
    kq = m if complete else k
    Q = np.zeros((b, m, kq), A.dtype)
    R = np.zeros((b, kq, n), A.dtype)
    for i in range(b):
        if m == 0 or n == 0:
            for r in range(min(m, kq)):
                Q[i, r, r] = 1.0
            continue
        src = np.ascontiguousarray(a[i])
        if complete and m > n:
            src = np.zeros((m, m), A.dtype)
            src[:, :n] = a[i]
        ok = True
        try:
            q, r = np.linalg.qr(src)
            Q[i] = q[:, :kq]
            R[i] = r[:kq, :n]
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            raise LinAlgError(prefix + _finite_message(a[i]) + suffix)
    if not keep_q:  # mode='r': Q is an empty tensor, as PyTorch's
        return np.empty(0, A.dtype), R.reshape(-1)
    return Q.reshape(-1), R.reshape(-1)


# ------------------------------------------------------------------ lu
def getrf(a, piv):
    """LAPACK ``?getrf`` on the F-contiguous ``a`` in place; returns ``info``."""


@overload(getrf)
def _getrf(a, piv):
    fn = _LAPACK().numba_xxgetrf(a.dtype)
    kind = ord(get_blas_kind(a.dtype, "lu_factor"))

    def impl(a, piv):
        m, n = a.shape
        return fn(kind, m, n, a.ctypes, max(m, 1), piv.ctypes)

    return impl


@njit(**OPTS)
def lu_factor_native(A, stack, prefix, suffix):
    """The packed LU factors (L's strict lower part with a unit diagonal, U) and the
    1-based row pivots of each matrix of ``A`` (LAPACK ``getrf``). A singular matrix is
    factored too (U has a zero on its diagonal), as PyTorch does."""
    a = view3(A, stack)
    b, m, n = stack[0], stack[1], stack[2]
    k = min(m, n)
    LU = np.empty((b, m, n), A.dtype)
    piv = np.ones((b, k), np.int32)
    for i in range(b):
        if k == 0:
            continue
        if not np.all(np.isfinite(a[i])):
            raise LinAlgError(prefix + "Array must not contain infs or NaNs." + suffix)
        f = np.asfortranarray(a[i])
        p = np.empty(k, F_INT)
        info = getrf(f, p)
        if info < 0:
            raise LinAlgError(prefix + "LAPACK getrf: an illegal argument." + suffix)
        LU[i] = f
        for j in range(k):
            piv[i, j] = p[j]
    return LU.reshape(-1), piv.reshape(-1)


@njit(**OPTS)
def lu_perm_native(pivots, stack):
    """The row permutation ``perm`` (``A[perm] = L @ U``) of each set of LAPACK pivots
    (``stack``: batch, m, k)."""
    b, m, k = stack[0], stack[1], stack[2]
    p = pivots.reshape((b, k))
    out = np.empty((b, m), np.int64)
    for i in range(b):
        for r in range(m):
            out[i, r] = r
        for j in range(k):
            t = p[i, j] - 1
            out[i, j], out[i, t] = out[i, t], out[i, j]
    return out.reshape(-1)


# ------------------------------------------------------------------ matrix_exp
_PADE13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0,
           1187353796428800.0, 129060195264000.0, 10559470521600.0, 670442572800.0,
           33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0, 1.0)


@njit(**OPTS)
def _expm(a):
    """exp(a) by scaling and squaring with a degree-13 Padé approximant (Higham 2005)."""
    n = a.shape[0]
    c = _PADE13
    norm = 0.0
    for j in range(n):
        col = 0.0
        for i in range(n):
            col += abs(a[i, j])
        norm = max(norm, col)
    s = 0
    if norm > 5.371920351148152:
        s = int(np.ceil(np.log2(norm / 5.371920351148152)))
    x = (a / (2.0 ** s)).astype(np.float64)
    ident = np.eye(n)
    x2 = x @ x
    x4 = x2 @ x2
    x6 = x4 @ x2
    u = x @ (x6 @ (c[13] * x6 + c[11] * x4 + c[9] * x2)
             + c[7] * x6 + c[5] * x4 + c[3] * x2 + c[1] * ident)
    v = (x6 @ (c[12] * x6 + c[10] * x4 + c[8] * x2)
         + c[6] * x6 + c[4] * x4 + c[2] * x2 + c[0] * ident)
    r = np.ascontiguousarray(np.linalg.solve(v - u, v + u))
    for _ in range(s):
        r = np.ascontiguousarray(r @ r)
    return r


@njit(**OPTS)
def matrix_exp_native(A, stack):
    """The matrix exponential of each matrix of ``A`` (computed in float64)."""
    a = view3(A, stack)
    b, n = stack[0], stack[1]
    out = np.empty((b, n, n), A.dtype)
    for i in range(b if n else 0):
        if not np.all(np.isfinite(a[i])):
            out[i] = np.nan
            continue
        out[i] = _expm(np.ascontiguousarray(a[i]))
    return out.reshape(-1)
