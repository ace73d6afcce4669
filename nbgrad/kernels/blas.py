"""Matrix-product kernels: BLAS through NumPy's ``dot`` inside ``@njit``."""

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
        A3 = np.broadcast_to(A, batch + A.shape[-2:]).reshape((-1,) + A.shape[-2:])
        B3 = np.broadcast_to(B, batch + B.shape[-2:]).reshape((-1,) + B.shape[-2:])
        out = matmul3d(A3, B3).reshape(batch + (A.shape[-2], B.shape[-1]))
    if a1:
        out = out[..., 0, :]
    if b1:
        out = out[..., 0]
    return c_contiguous(out)
