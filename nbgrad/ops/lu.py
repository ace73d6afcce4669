"""LU with partial pivoting: ``linalg.lu_factor`` (a table op whose ``@njit`` native calls
LAPACK ``getrf`` through Numba's binding of SciPy's LAPACK, with PyTorch's
``lu_factor_ex_backward``), ``lu_permutation`` (the rows that LAPACK's pivots pick, not
differentiable) and ``linalg.lu_solve``, a composite of triangular solves (so its gradient
in ``LU`` and ``B`` is PyTorch's and differentiates again)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..kernels import lapack
from ..kernels.layout import call_native
from ..tensor import Tensor
from .convert import to_dtype
from .decomp import _float, _square, _stack_shape, _where, solve_triangular
from .dispatch import apply, as_tensor
from .linalg import matmul
from .nn import one_hot
from .registry import get, kernel, op_function
from .shape import transpose, tril, triu
from .spectral import _matrix
from .traits import NativePlan, Opaque, batching

__all__: list[str] = []  # public names are in nbgrad.linalg


class LUFactorResult(NamedTuple):
    """``(LU, pivots)`` of :func:`lu_factor`."""

    LU: Tensor
    pivots: Tensor


def _lu_static(attrs: dict, shapes: tuple) -> NativePlan:
    shape = tuple(shapes[0])
    k = min(shape[-2:])
    return NativePlan((_stack_shape(shape), *_where("linalg.lu_factor", shape)),
                      (shape, shape[:-2] + (k,)))


_LU_FACTOR = Opaque(native=lapack.lu_factor_native, static=_lu_static)


@kernel("linalg.lu_factor", kind=_LU_FACTOR, batch=batching("leading"))
def _lu_factor_kernel(A):
    return call_native(_LU_FACTOR, (A,), {})


@op_function("linalg.lu_factor")
def lu_factor(A: Tensor, *, pivot: bool = True) -> LUFactorResult:
    """The packed LU factorization of a matrix or stack ``(..., m, n)`` with partial
    pivoting (LAPACK ``getrf``): ``LU`` holds ``L`` below the diagonal (unit diagonal) and
    ``U`` on and above it, ``pivots`` (int32, 1-based, as LAPACK and PyTorch) the row
    swaps. A singular matrix is factored too (``U`` has a zero on its diagonal)."""
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting (pivot=False) is not "
                           "supported on CPU (as in PyTorch)")
    A = _float("linalg.lu_factor", A)
    _matrix("linalg.lu_factor", A)
    LU, pivots = apply(get("linalg.lu_factor"), (A,))
    return LUFactorResult(LU, pivots)


_LU_PERM = Opaque(native=lapack.lu_perm_native, static=lambda attrs, shapes: NativePlan(
    ((int(np.prod(shapes[0][:-1], dtype=np.int64)), attrs["m"], shapes[0][-1]),),
    (tuple(shapes[0][:-1]) + (attrs["m"],),)))


@kernel("lu_permutation", kind=_LU_PERM, batch=batching("leading"))
def _lu_permutation_kernel(pivots, m):
    return call_native(_LU_PERM, (pivots,), {"m": m})


@op_function("lu_permutation")
def lu_permutation(pivots: Tensor, m: int) -> Tensor:
    """``perm`` (int64, ``(..., m)``) with ``A[..., perm, :] = L @ U`` for LAPACK's 1-based
    ``pivots`` ``(..., k)`` of an ``m``-row matrix."""
    pivots = as_tensor(pivots)
    if pivots.ndim < 1 or pivots.dtype.kind not in "iu" or pivots.shape[-1] > m:
        raise RuntimeError(f"lu_permutation: expects integer pivots (..., k) with k <= m = "
                           f"{m}, got shape {tuple(pivots.shape)} of {pivots.dtype}")
    return apply(get("lu_permutation"), (pivots, int(m)))


def permutation_matrix(pivots: Tensor, m: int, dtype) -> Tensor:
    """``Pt`` (``(..., m, m)``) with ``Pt @ A = L @ U``: row ``i`` is ``e[perm[i]]``."""
    return to_dtype(one_hot(lu_permutation(pivots, m), m), dtype)


def lu_solve(LU: Tensor, pivots: Tensor, B: Tensor, *, left: bool = True,
             adjoint: bool = False) -> Tensor:
    """The solution ``X`` of ``A X = B`` (``X A = B`` when ``left=False``; with ``A^T``
    when ``adjoint``) from :func:`lu_factor`'s ``(LU, pivots)`` of a square ``A``; batch
    dimensions broadcast. Differentiable in ``LU`` and ``B`` (triangular solves)."""
    LU, B = _float("linalg.lu_solve", LU), _float("linalg.lu_solve", B)
    _square("linalg.lu_solve", LU)
    pivots = as_tensor(pivots)
    n = LU.shape[-1]
    if B.ndim < 2 or (B.shape[-2] if left else B.shape[-1]) != n:
        raise RuntimeError(f"linalg.lu_solve: LU of shape {tuple(LU.shape)} and B of shape "
                           f"{tuple(B.shape)} do not fit (B must be a matrix with n "
                           f"{'rows' if left else 'columns'}, left={left})")
    if tuple(pivots.shape) != tuple(LU.shape[:-1]):
        raise RuntimeError(f"linalg.lu_solve: pivots of shape {tuple(pivots.shape)} do not "
                           f"fit LU of shape {tuple(LU.shape)}")
    if not left:  # X A = B  <=>  A^T X^T = B^T
        Bt = transpose(B, -2, -1)
        return transpose(lu_solve(LU, pivots, Bt, adjoint=not adjoint), -2, -1)
    Pt = permutation_matrix(pivots, n, LU.dtype)
    if not adjoint:  # A = Pt^T L U
        Y = solve_triangular(LU, matmul(Pt, B), upper=False, unitriangular=True)
        return solve_triangular(triu(LU), Y, upper=True)
    Y = solve_triangular(transpose(triu(LU), -2, -1), B, upper=False)
    L_T = transpose(tril(LU, -1), -2, -1)
    Z = solve_triangular(L_T, Y, upper=True, unitriangular=True)
    return matmul(transpose(Pt, -2, -1), Z)
