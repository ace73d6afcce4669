"""Matrix kernels: products through BLAS (NumPy's ``dot`` inside ``@njit``), batched LAPACK
decompositions (``np.linalg`` inside ``@njit``) and triangular solves."""

from __future__ import annotations

import numpy as np
from numba import njit

from .layout import c_contiguous

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


def c_writable(x: np.ndarray) -> np.ndarray:
    """A C-contiguous, writeable array (read-only views would compile a second signature)."""
    x = c_contiguous(x)
    return x if x.flags.writeable else x.copy()


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
def einsum_pair(a: np.ndarray, a_labels: str, b: np.ndarray, b_labels: str,
                out_labels: str) -> np.ndarray:
    """``np.einsum(f"{a_labels},{b_labels}->{out_labels}", a, b)`` as one batched GEMM.

    The equation must be *clean*: no label repeats within an operand, and every label
    appears in at least two of the two operands and the output. Labels then fall in
    four groups: batch (in both operands and the output), left-free, right-free and
    contracted. ``a`` is laid out as (batch, left, contracted), ``b`` as (batch,
    contracted, right), and the product goes through :func:`matmul3d` (BLAS); no NumPy
    ``einsum`` is involved.
    """
    size = dict(zip(a_labels, a.shape, strict=True))
    size.update(zip(b_labels, b.shape, strict=True))
    batch = [c for c in out_labels if c in a_labels and c in b_labels]
    left = [c for c in out_labels if c in a_labels and c not in b_labels]
    right = [c for c in out_labels if c in b_labels and c not in a_labels]
    contracted = [c for c in a_labels if c in b_labels and c not in out_labels]

    def prod(labels) -> int:
        n = 1
        for c in labels:
            n *= size[c]
        return n

    nb, m, k, n = prod(batch), prod(left), prod(contracted), prod(right)
    a3 = np.transpose(a, [a_labels.index(c) for c in batch + left + contracted])
    b3 = np.transpose(b, [b_labels.index(c) for c in batch + contracted + right])
    a3 = c_writable(a3).reshape(nb, m, k)
    b3 = c_writable(b3).reshape(nb, k, n)
    out = matmul2d(a3[0], b3[0])[None] if nb == 1 else matmul3d(a3, b3)
    grouped = batch + left + right
    out = out.reshape(tuple(size[c] for c in grouped))
    return c_contiguous(np.transpose(out, [grouped.index(c) for c in out_labels]))


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
