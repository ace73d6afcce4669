"""Matrix kernels: products through BLAS (NumPy's ``dot`` inside ``@njit``), batched LAPACK
decompositions (``np.linalg`` inside ``@njit``) and triangular solves."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..errors import LinAlgError
from .layout import broadcast, c_contiguous, flat, native_const, permuted, view3

OPTS = dict(cache=True, nogil=True)


@njit(**OPTS)
def mm(a, b, out):
    np.dot(a, b, out)


@njit(**OPTS)
def bmm(a, b, out):
    for i in range(a.shape[0]):
        np.dot(a[i], b[i], out[i])


def blas_ready(x: np.ndarray) -> np.ndarray:
    """A C- or F-contiguous float array (what Numba's BLAS binding accepts)."""
    if x.flags.c_contiguous or x.flags.f_contiguous:
        return x
    return c_contiguous(x)


def matmul2d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b))
    if out.size == 0:
        return out
    if a.shape[1] == 0:
        out[...] = 0
        return out
    mm(blas_ready(a), blas_ready(b), out)
    return out


def matmul3d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]), np.result_type(a, b))
    if out.size == 0:
        return out
    if a.shape[2] == 0:
        out[...] = 0
        return out
    bmm(c_contiguous(a), c_contiguous(b), out)
    return out


def matmul_nd(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy's ``matmul`` semantics: 1-D promotion and broadcast batch dimensions."""
    a1, b1 = a.ndim == 1, b.ndim == 1
    A = a[None, :] if a1 else a
    B = b[:, None] if b1 else b
    if A.ndim == 2 and B.ndim == 2:
        out = matmul2d(A, B)
    else:
        batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        count = int(np.prod(batch, dtype=np.int64))  # not -1: ambiguous for empty matrices
        A3 = np.broadcast_to(A, batch + A.shape[-2:]).reshape((count,) + A.shape[-2:])
        B3 = np.broadcast_to(B, batch + B.shape[-2:]).reshape((count,) + B.shape[-2:])
        out = matmul3d(A3, B3).reshape(batch + (A.shape[-2], B.shape[-1]))
    if a1:
        out = out[..., 0, :]
    if b1:
        out = out[..., 0]
    return c_contiguous(out)


# ------------------------------------------------------------------ einsum of two operands
def einsum_plan(a_shape: tuple[int, ...], a_labels: str, b_shape: tuple[int, ...],
                b_labels: str, out_labels: str) -> tuple:
    """How :func:`einsum_native` computes ``np.einsum(f"{a_labels},{b_labels}->
    {out_labels}", a, b)`` as one batched GEMM: the native's constants ``(a_shape,
    a_perm, a3, b_shape, b_perm, b3, grouped, out_perm)`` (a perm ``()`` where it is the
    identity) and the output's shape.

    The equation must be *clean*: no label repeats within an operand, and every label
    appears in at least two of the two operands and the output. Labels then fall in
    four groups: batch (in both operands and the output), left-free, right-free and
    contracted. ``a`` is laid out as (batch, left, contracted) (``a3``), ``b`` as
    (batch, contracted, right) (``b3``); the product has the ``grouped`` shape (batch,
    left, right) and is transposed by ``out_perm``. No NumPy ``einsum`` is involved.
    """
    size = dict(zip(a_labels, a_shape, strict=True))
    size.update(zip(b_labels, b_shape, strict=True))
    batch = [c for c in out_labels if c in a_labels and c in b_labels]
    left = [c for c in out_labels if c in a_labels and c not in b_labels]
    right = [c for c in out_labels if c in b_labels and c not in a_labels]
    contracted = [c for c in a_labels if c in b_labels and c not in out_labels]

    def prod(labels) -> int:
        n = 1
        for c in labels:
            n *= size[c]
        return n

    def perm(order: list[int]) -> tuple[int, ...]:
        return () if order == sorted(order) else tuple(order)

    nb, m, k, n = prod(batch), prod(left), prod(contracted), prod(right)
    grouped = batch + left + right
    return ((tuple(a_shape), perm([a_labels.index(c) for c in batch + left + contracted]),
             (nb, m, k), tuple(b_shape),
             perm([b_labels.index(c) for c in batch + contracted + right]), (nb, k, n),
             tuple(size[c] for c in grouped), perm([grouped.index(c) for c in out_labels])),
            tuple(size[c] for c in out_labels))


@njit(**OPTS)
def einsum_native(operands, a_shape, a_perm, a3, b_shape, b_perm, b3, grouped, out_perm):
    """The two-operand einsum planned by :func:`einsum_plan` (BLAS products), flat."""
    a = permuted(operands[0], a_shape, a_perm).reshape((a3[0], a3[1], a3[2]))
    b = permuted(operands[1], b_shape, b_perm).reshape((b3[0], b3[1], b3[2]))
    out = np.empty((a3[0], a3[1], b3[2]), a.dtype)
    if out.size:
        if a3[2] == 0:
            out[:] = 0
        else:
            for i in range(a3[0]):
                np.dot(a[i], b[i], out[i])
    return permuted(out.reshape(-1), grouped, out_perm)


def einsum_pair(a: np.ndarray, a_labels: str, b: np.ndarray, b_labels: str,
                out_labels: str) -> np.ndarray:
    """``np.einsum(f"{a_labels},{b_labels}->{out_labels}", a, b)`` (see
    :func:`einsum_plan`)."""
    consts, shape = einsum_plan(a.shape, a_labels, b.shape, b_labels, out_labels)
    return einsum_native((flat(a), flat(b)), *map(native_const, consts)).reshape(shape)


# ------------------------------------------------------------------ LAPACK, batched
# Numba implements np.linalg.* on 2-D arrays through SciPy's LAPACK; these loops run
# them over a C-contiguous (batch, n, n) stack. A LinAlgError raised inside is NumPy's.
@njit(**OPTS)
def inv_batched(a, out):
    for i in range(a.shape[0]):
        out[i] = np.linalg.inv(a[i])


@njit(**OPTS)
def det_batched(a, out):
    for i in range(a.shape[0]):
        out[i] = np.linalg.det(a[i])


@njit(**OPTS)
def slogdet_batched(a, sign, logabs):
    for i in range(a.shape[0]):
        s, v = np.linalg.slogdet(a[i])
        sign[i] = s
        logabs[i] = v


@njit(**OPTS)
def solve_batched(a, b, out):
    for i in range(a.shape[0]):
        out[i] = np.linalg.solve(a[i], b[i])


@njit(**OPTS)
def cholesky_batched(a, out):
    for i in range(a.shape[0]):
        out[i] = np.linalg.cholesky(a[i])


@njit(**OPTS)
def trsm_batched(a, x, upper, unit):
    """Solve ``a[i] @ y = x[i]`` in place for triangular ``a[i]`` (substitution by rows)."""
    n = a.shape[1]
    k = x.shape[2]
    for i in range(a.shape[0]):
        A = a[i]
        X = x[i]
        for step in range(n):
            r = n - 1 - step if upper else step
            row = X[r]
            lo, hi = (r + 1, n) if upper else (0, r)
            for c in range(lo, hi):
                coef = A[r, c]
                if coef != 0:
                    other = X[c]
                    for j in range(k):
                        row[j] -= coef * other[j]
            if not unit:
                d = A[r, r]
                for j in range(k):
                    row[j] /= d


# ------------------------------------------------------------------ natives
# ``@njit`` entry points that generated code calls directly (``Opaque.native``) and the
# ops' CPU kernels call too, flat (``NativePlan``). ``stack``: (batch, rows, cols) of an
# input; (prefix, suffix): the LinAlgError message around NumPy's words.
@njit(**OPTS)
def _lapack_failure(a, b):
    """Why a LAPACK solve or inverse of ``a`` (and ``b``) failed, in NumPy's words."""
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return "Array must not contain infs or NaNs."
    return "Matrix is singular to machine precision."


@njit(**OPTS)
def inv_native(A, stack, prefix, suffix):
    """The inverse of each matrix of ``A``."""
    a = view3(A, stack)
    out = np.empty_like(a)
    for i in range(stack[0]):
        ok = True
        try:
            out[i] = np.linalg.inv(a[i])
        except Exception:  # noqa: BLE001 - Numba binds no exception; the message is NumPy's
            ok = False
        if not ok:
            raise LinAlgError(prefix + _lapack_failure(a[i], a[i]) + suffix)
    return out.reshape(-1)


@njit(**OPTS)
def cholesky_native(A, stack, prefix, suffix):
    """The lower Cholesky factor of each matrix of ``A``."""
    a = view3(A, stack)
    out = np.empty_like(a)
    for i in range(stack[0]):
        ok = True
        try:
            out[i] = np.linalg.cholesky(a[i])
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            raise LinAlgError(prefix + "Matrix is not positive definite." + suffix)
    return out.reshape(-1)


@njit(**OPTS)
def det_native(A, stack):
    """The determinant of each matrix of ``A``."""
    out = np.empty(stack[0], A.dtype)
    det_batched(view3(A, stack), out)
    return out


@njit(**OPTS)
def slogdet_native(A, stack):
    """``(sign, logabsdet)`` of each matrix of ``A``."""
    sign = np.empty(stack[0], A.dtype)
    logabs = np.empty(stack[0], A.dtype)
    slogdet_batched(view3(A, stack), sign, logabs)
    return sign, logabs


@njit(**OPTS)
def solve_native(A, B, a_shape, b_matrix, a_full, b_full, a_stack, b_stack, prefix, suffix):
    """``X`` with ``A @ X = B`` (``B`` as the matrices ``b_matrix``), batches broadcast."""
    a = view3(broadcast(A, a_shape, a_full), a_stack)
    b = view3(broadcast(B, b_matrix, b_full), b_stack)
    out = np.empty_like(b)
    for i in range(a_stack[0]):
        ok = True
        try:
            out[i] = np.linalg.solve(a[i], b[i])
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            raise LinAlgError(prefix + _lapack_failure(a[i], b[i]) + suffix)
    return out.reshape(-1)


@njit(**OPTS)
def solve_triangular_native(A, B, upper, unit, a_shape, b_shape, a_perm, b_perm, a_mat,
                            b_mat, a_full, b_full, a_stack, b_stack, x_shape, out_perm):
    """``X`` with ``A @ X = B`` for a triangular ``A``; with the perms (transposing the
    last two dims of ``a_shape``/``b_shape`` into ``a_mat``/``b_mat``) ``X @ A = B`` as
    ``A.mT @ X.mT = B.mT``."""
    a = view3(broadcast(permuted(A, a_shape, a_perm), a_mat, a_full), a_stack)
    x = view3(broadcast(permuted(B, b_shape, b_perm), b_mat, b_full).copy(), b_stack)
    trsm_batched(a, x, upper, unit)
    return permuted(x.reshape(-1), x_shape, out_perm)
