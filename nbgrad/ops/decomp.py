"""Decompositions and solvers, the ops behind :mod:`nbgrad.linalg`: ``inv``, ``det``,
``slogdet``, ``solve``, ``cholesky`` and ``solve_triangular``.

Every op takes a stack of matrices ``(..., n, n)``; the kernels loop over the stack in
``@njit`` code that calls LAPACK (Numba's ``np.linalg``) or substitutes by rows
(triangular solves). Integer inputs are promoted to float64. Gradients are in
``formulas/derivatives.yaml`` (and are themselves differentiable).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..kernels import blas
from ..kernels.layout import c_contiguous
from ..tensor import Tensor
from .dispatch import apply, as_tensor, promote_operands
from .registry import formula_helper, get, kernel, op_function

# nothing at the top level: nbgrad.linalg is the public address; nbgrad.det, .inverse and
# .slogdet (also Tensor methods) are thin wrappers in nbgrad.ops.linalg
__all__: list[str] = []


class LinAlgError(RuntimeError):
    """A matrix is singular or not positive definite (``torch.linalg.LinAlgError``)."""


class SlogdetResult(NamedTuple):
    """``(sign, logabsdet)`` of :func:`slogdet`."""

    sign: Tensor
    logabsdet: Tensor


def _float(op: str, A) -> Tensor:
    A = as_tensor(A)
    if A.dtype.kind != "f":
        from .convert import to_dtype

        A = to_dtype(A, "float64")
    return A


def _square(op: str, A: Tensor) -> None:
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"{op}: expects a square matrix or a stack of them (..., n, n), "
                           f"got shape {A.shape}")


def _stack(x: np.ndarray) -> np.ndarray:
    """A C-contiguous, writeable (batch, rows, cols) copy or view of ``x``."""
    count = int(np.prod(x.shape[:-2], dtype=np.int64))  # not -1: ambiguous for empty matrices
    return blas.c_writable(x).reshape((count,) + x.shape[-2:])


def _broadcast_stacks(op: str, A: np.ndarray, B: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    batch = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    a = _stack(np.broadcast_to(A, batch + A.shape[-2:]))
    b = _stack(np.broadcast_to(B, batch + B.shape[-2:]))
    return a, b, batch


def _lapack(op: str, shape, fn, *args) -> None:
    try:
        fn(*args)
    except np.linalg.LinAlgError as exc:
        raise LinAlgError(f"{op}: {exc} (input of shape {tuple(shape)})") from None


# ------------------------------------------------------------------ inv
@kernel("linalg.inv")
def _inv_kernel(A):
    a = _stack(A)
    out = np.empty_like(a)
    _lapack("linalg.inv", A.shape, blas.inv_batched, a, out)
    return out.reshape(A.shape)


@op_function("linalg.inv")
def inv(A: Tensor) -> Tensor:
    """The inverse of a square matrix (or of each matrix of a stack)."""
    A = _float("linalg.inv", A)
    _square("linalg.inv", A)
    return apply(get("linalg.inv"), (A,))


# ------------------------------------------------------------------ det, slogdet
@kernel("linalg.det")
def _det_kernel(A):
    a = _stack(A)
    out = np.empty(a.shape[0], a.dtype)
    blas.det_batched(a, out)
    return out.reshape(A.shape[:-2])


@op_function("linalg.det")
def det(A: Tensor) -> Tensor:
    """The determinant of a square matrix (or of each matrix of a stack)."""
    A = _float("linalg.det", A)
    _square("linalg.det", A)
    return apply(get("linalg.det"), (A,))


@kernel("linalg.slogdet")
def _slogdet_kernel(A):
    a = _stack(A)
    sign = np.empty(a.shape[0], a.dtype)
    logabs = np.empty(a.shape[0], a.dtype)
    blas.slogdet_batched(a, sign, logabs)
    return sign.reshape(A.shape[:-2]), logabs.reshape(A.shape[:-2])


@op_function("linalg.slogdet")
def slogdet(A: Tensor) -> SlogdetResult:
    """``(sign, logabsdet)`` with ``det = sign * exp(logabsdet)``; only ``logabsdet`` has a
    gradient (sign is 0 and logabsdet -inf for a singular matrix)."""
    A = _float("linalg.slogdet", A)
    _square("linalg.slogdet", A)
    sign, logabs = apply(get("linalg.slogdet"), (A,))
    return SlogdetResult(sign, logabs)


# ------------------------------------------------------------------ solve
@formula_helper
def solve_is_vector(A, B) -> bool:
    """Whether ``B`` is a (batch of) vector(s) for ``linalg.solve`` (torch's rule)."""
    return len(B.shape) == 1 or (len(B.shape) == len(A.shape) - 1
                                 and tuple(B.shape) == tuple(A.shape[:-1]))


@kernel("linalg.solve")
def _solve_kernel(A, B):
    vector = solve_is_vector(A, B)
    Bm = B[..., None] if vector else B
    a, b, batch = _broadcast_stacks("linalg.solve", A, Bm)
    out = np.empty_like(b)
    _lapack("linalg.solve", A.shape, blas.solve_batched, a, b, out)
    out = out.reshape(batch + Bm.shape[-2:])
    return c_contiguous(out[..., 0]) if vector else out


@op_function("linalg.solve")
def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:
    """The solution ``X`` of ``A @ X = B`` (or of ``X @ A = B`` when ``left=False``).

    ``B`` is a vector (or a batch of vectors) when it is 1-D or has the shape
    ``A.shape[:-1]``, else a matrix ``(..., n, k)``; batch dimensions broadcast.
    """
    A, B = promote_operands(A, B)
    A, B = _float("linalg.solve", A), _float("linalg.solve", B)
    _square("linalg.solve", A)
    if not left:
        from .shape import transpose

        if B.ndim < 2:
            raise RuntimeError(f"linalg.solve: left=False needs a matrix B, got shape "
                               f"{B.shape}")
        return transpose(solve(transpose(A, -2, -1), transpose(B, -2, -1)), -2, -1)
    vector = solve_is_vector(A, B)
    rows = B.shape[-1] if vector else (B.shape[-2] if B.ndim >= 2 else -1)
    if B.ndim == 0 or rows != A.shape[-1]:
        raise RuntimeError(f"linalg.solve: A of shape {A.shape} and B of shape {B.shape} "
                           "do not fit (B needs n rows)")
    try:
        np.broadcast_shapes(A.shape[:-2], (B.shape[:-1] if vector else B.shape[:-2]))
    except ValueError:
        raise RuntimeError(f"linalg.solve: batch dimensions of A {A.shape} and B {B.shape} "
                           "do not broadcast") from None
    return apply(get("linalg.solve"), (A, B))


# ------------------------------------------------------------------ cholesky
@kernel("linalg.cholesky")
def _cholesky_kernel(A):
    a = _stack(A)
    out = np.empty_like(a)
    _lapack("linalg.cholesky", A.shape, blas.cholesky_batched, a, out)
    return out.reshape(A.shape)


@op_function("linalg.cholesky")
def cholesky(A: Tensor, *, upper: bool = False) -> Tensor:
    """The Cholesky factor ``L`` (lower, ``A = L @ L.mT``) of a symmetric positive-definite
    matrix, or ``U = L.mT`` when ``upper=True``. Only the lower triangle of ``A`` is read."""
    A = _float("linalg.cholesky", A)
    _square("linalg.cholesky", A)
    L = apply(get("linalg.cholesky"), (A,))
    if upper:
        from .shape import transpose

        return transpose(L, -2, -1)
    return L


# ------------------------------------------------------------------ triangular solve
@kernel("linalg.solve_triangular")
def _solve_triangular_kernel(A, B, upper, left, unitriangular):
    if not left:  # X A = B  <=>  A^T X^T = B^T
        xt = _solve_triangular_kernel(np.swapaxes(A, -1, -2), np.swapaxes(B, -1, -2),
                                      not upper, True, unitriangular)
        return c_contiguous(np.swapaxes(xt, -1, -2))
    a, b, batch = _broadcast_stacks("linalg.solve_triangular", A, B)
    x = b.copy() if b is B or np.may_share_memory(b, B) else b
    blas.trsm_batched(a, x, bool(upper), bool(unitriangular))
    return x.reshape(batch + B.shape[-2:])


@op_function("linalg.solve_triangular")
def solve_triangular(A: Tensor, B: Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False) -> Tensor:
    """The solution ``X`` of ``A @ X = B`` (``X @ A = B`` when ``left=False``) for a
    triangular ``A``: only its upper (``upper=True``) or lower triangle is read, and its
    diagonal is taken as ones when ``unitriangular``. ``B`` is a matrix ``(..., n, k)``."""
    A, B = promote_operands(A, B)
    A, B = _float("linalg.solve_triangular", A), _float("linalg.solve_triangular", B)
    _square("linalg.solve_triangular", A)
    if B.ndim < 2:
        raise RuntimeError(f"linalg.solve_triangular: B must be a matrix (..., n, k), got "
                           f"shape {B.shape}")
    n = B.shape[-2] if left else B.shape[-1]
    if n != A.shape[-1]:
        raise RuntimeError(f"linalg.solve_triangular: A of shape {A.shape} and B of shape "
                           f"{B.shape} do not fit (left={left})")
    try:
        np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    except ValueError:
        raise RuntimeError(f"linalg.solve_triangular: batch dimensions of A {A.shape} and B "
                           f"{B.shape} do not broadcast") from None
    return apply(get("linalg.solve_triangular"),
                 (A, B, bool(upper), bool(left), bool(unitriangular)))
