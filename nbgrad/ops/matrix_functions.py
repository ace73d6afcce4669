"""Linear-algebra functions written over table ops (``nbgrad.linalg`` re-exports them
under PyTorch's ``torch.linalg`` names): vector and matrix norms, ``vecdot``, ``vdot``,
``vander``, the ``*_ex`` variants, and the legacy ``cholesky``, ``cholesky_inverse``
and ``triangular_solve``. Each differentiates through the ops it calls."""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from ..tensor import Tensor
from .decomp import cholesky as linalg_cholesky
from .decomp import inv, solve, solve_triangular
from .dispatch import as_tensor, promote_operands
from .linalg import matmul
from .reduction import amax, amin, norm, sum
from .shape import permute, reshape, stack, transpose
from .spectral import svdvals

__all__ = ["cholesky", "cholesky_inverse", "matrix_norm", "triangular_solve", "vander", "vdot",
           "vecdot", "vector_norm"]

InvEx = namedtuple("InvEx", ["inverse", "info"])
SolveEx = namedtuple("SolveEx", ["result", "info"])
CholeskyEx = namedtuple("CholeskyEx", ["L", "info"])
TriangularSolve = namedtuple("TriangularSolve", ["solution", "cloned_coefficient"])


def vector_norm(x: Tensor, ord: float = 2, dim=None, keepdim: bool = False, *,  # noqa: A002
                dtype=None) -> Tensor:
    """The ``ord``-norm of the entries over ``dim`` (all of them when None)."""
    x = as_tensor(x)
    if dtype is not None:
        x = x.to(dtype)
    if isinstance(ord, str):
        raise ValueError(f"vector_norm: ord must be a number, got {ord!r}")
    return norm(x, float(ord), dim, keepdim=keepdim)


def matrix_norm(A: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *,  # noqa: A002
                dtype=None) -> Tensor:
    """A matrix norm over the two dims ``dim``: ``'fro'``, the induced ``1``, ``-1``
    (column sums), ``inf``, ``-inf`` (row sums), or through the singular values
    (:func:`~nbgrad.linalg.svdvals`) ``'nuc'`` (their sum), ``2`` and ``-2`` (the largest
    and smallest)."""
    A = as_tensor(A)
    if dtype is not None:
        A = A.to(dtype)
    if A.ndim < 2:
        raise RuntimeError(f"matrix_norm: needs a matrix or a stack of them, got shape "
                           f"{tuple(A.shape)}")
    rows, cols = (d % A.ndim for d in dim)
    if ord == "fro":
        return norm(A, 2.0, (rows, cols), keepdim=keepdim)
    if ord in ("nuc", 2, -2):
        if rows == cols:
            raise RuntimeError(f"matrix_norm: dim must name two different dims, got {dim}")
        rest = [i for i in range(A.ndim) if i not in (rows, cols)]
        S = svdvals(permute(A, (*rest, rows, cols)))
        out = sum(S, -1) if ord == "nuc" else (amax if ord == 2 else amin)(S, -1)
        if keepdim:
            out = reshape(out, tuple(1 if i in (rows, cols) else n
                                     for i, n in enumerate(A.shape)))
        return out
    if ord not in (1, -1, np.inf, -np.inf):
        raise ValueError(f"matrix_norm: ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, "
                         f"got {ord!r}")
    summed, other = (rows, cols) if ord in (1, -1) else (cols, rows)
    sums = sum(abs(A), summed, keepdim=True)
    pick = amax if ord > 0 else amin
    out = pick(sums, other, keepdim=True)
    return out if keepdim else reshape(out, tuple(s for i, s in enumerate(A.shape)
                                                  if i not in (rows, cols)))


def linalg_norm(A: Tensor, ord=None, dim=None, keepdim: bool = False, *,  # noqa: A002
                dtype=None) -> Tensor:
    """``torch.linalg.norm``: a vector norm (``dim`` an int, or a 1-D input) or a matrix
    norm (``dim`` a pair, or a 2-D input); with neither ``ord`` nor ``dim`` the 2-norm of
    all entries."""
    A = as_tensor(A)
    if isinstance(dim, (int, np.integer)):
        dim = (int(dim),)
    if ord is None:
        return vector_norm(A, 2, dim, keepdim, dtype=dtype)
    if dim is None:
        if A.ndim == 1:
            dim = (0,)
        elif A.ndim == 2:
            dim = (0, 1)
        else:
            raise RuntimeError(f"linalg.norm: ord={ord!r} needs dim for an input of shape "
                               f"{tuple(A.shape)} (1-D or 2-D inputs need none)")
    if len(dim) == 2:
        return matrix_norm(A, ord, dim, keepdim, dtype=dtype)
    return vector_norm(A, ord, dim, keepdim, dtype=dtype)


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """The dot product of ``x`` and ``y`` (broadcast) along ``dim``."""
    a, b = promote_operands(x, y)
    return sum(a * b, dim)


def vdot(self: Tensor, other: Tensor) -> Tensor:
    """The dot product of two 1-D tensors (for real tensors, :func:`dot`)."""
    a, b = promote_operands(self, other)
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise RuntimeError(f"vdot: expects two 1-D tensors of one size, got shapes "
                           f"{tuple(a.shape)} and {tuple(b.shape)}")
    return sum(a * b)


def vander(x: Tensor, N: int | None = None, increasing: bool = True) -> Tensor:  # noqa: N803
    """The Vandermonde matrix of the last dimension: columns ``x**0, x**1, ...``
    (``torch.linalg.vander``'s increasing order; ``increasing=False`` as NumPy's)."""
    x = as_tensor(x)
    if x.ndim == 0:
        x = reshape(x, (1,))
    n = x.shape[-1] if N is None else int(N)
    cols = [x ** k if k else x * 0 + 1 for k in range(n)]
    out = stack(cols, -1)
    return out if increasing else out.flip(-1)


def inv_ex(A: Tensor, *, check_errors: bool = False) -> InvEx:
    inverse = inv(A)
    return InvEx(inverse, as_tensor(np.zeros(tuple(inverse.shape[:-2]), np.int32)))


def solve_ex(A: Tensor, B: Tensor, *, left: bool = True, check_errors: bool = False) -> SolveEx:
    result = solve(A, B, left=left)
    return SolveEx(result, as_tensor(np.zeros(tuple(as_tensor(A).shape[:-2]), np.int32)))


def cholesky_ex(A: Tensor, *, upper: bool = False, check_errors: bool = False) -> CholeskyEx:
    L = linalg_cholesky(A, upper=upper)
    return CholeskyEx(L, as_tensor(np.zeros(tuple(L.shape[:-2]), np.int32)))


def cholesky(self: Tensor, upper: bool = False) -> Tensor:
    """``torch.cholesky`` (the older spelling of ``torch.linalg.cholesky``)."""
    return linalg_cholesky(self, upper=upper)


def cholesky_inverse(L: Tensor, upper: bool = False) -> Tensor:  # noqa: N803
    """The inverse of ``A = L L^T`` (``U^T U`` with ``upper``) from its factor."""
    L = as_tensor(L)
    eye = as_tensor(np.broadcast_to(np.eye(L.shape[-1], dtype=L.dtype), L.shape).copy())
    Linv = solve_triangular(L, eye, upper=upper)
    Lt = transpose(Linv, -2, -1)
    return matmul(Linv, Lt) if upper else matmul(Lt, Linv)


def triangular_solve(b: Tensor, A: Tensor, upper: bool = True, transpose_: bool = False,
                     unitriangular: bool = False, **kwargs) -> TriangularSolve:
    """``torch.triangular_solve(b, A)``: the solution of ``A X = b`` and a copy of ``A``
    (``transpose=True`` solves ``A^T X = b``)."""
    transpose_ = bool(kwargs.pop("transpose", transpose_))
    if kwargs:
        raise TypeError(f"triangular_solve: unexpected arguments {sorted(kwargs)}")
    A = as_tensor(A)
    M = transpose(A, -2, -1) if transpose_ else A
    X = solve_triangular(M, b, upper=upper != transpose_, unitriangular=unitriangular)
    return TriangularSolve(X, A.clone())
