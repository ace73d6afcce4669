"""Products and matrix functions written over table ops (as PyTorch's composites): ``mv``,
``inner``, ``tensordot``, ``kron``, the ``add*`` fused forms, ``multi_dot``,
``matrix_power``, ``cholesky_solve``, ``logdet``, ``cross``, ``dist``, ``cdist``,
``diag_embed``, ``block_diag``. Each differentiates to any order through the table's
formulas and runs natively in both jit tiers.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence

import numpy as np

from ..tensor import Tensor
from .decomp import inv, slogdet, solve_triangular
from .dispatch import as_tensor, promote_operands
from .elementwise import where
from .linalg import matmul
from .reduction import norm, sum
from .shape import _dim, broadcast_tensors, cat, pad, permute, reshape, stack, transpose, unbind


def _scaled(t: Tensor, factor) -> Tensor:
    return t if factor == 1 else t * factor


def mv(self: Tensor, vec: Tensor) -> Tensor:
    """Matrix times vector."""
    if as_tensor(self).ndim != 2 or as_tensor(vec).ndim != 1:
        raise RuntimeError(f"mv: expects a matrix and a vector, got shapes "
                           f"{tuple(as_tensor(self).shape)} and {tuple(as_tensor(vec).shape)}")
    return matmul(self, vec)


def inner(self: Tensor, other: Tensor) -> Tensor:
    """Sums of products over the last dimension of both (``a[..., k] * b[..., k]`` for
    every pair of leading indices, as NumPy's and PyTorch's ``inner``)."""
    a, b = promote_operands(self, other)
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    return tensordot(a, b, ([-1], [-1]))


def tensordot(a: Tensor, b: Tensor, dims=2) -> Tensor:
    """Contraction of the last ``dims`` dimensions of ``a`` with the first ``dims`` of
    ``b``, or of the listed dimensions ``dims = (dims_a, dims_b)``."""
    a, b = promote_operands(a, b)
    if isinstance(dims, (int, np.integer)):
        da, db = list(range(a.ndim - int(dims), a.ndim)), list(range(int(dims)))
    else:
        da, db = ([d] if isinstance(d, (int, np.integer)) else list(d) for d in dims)
    da = [_dim(d, a.ndim, "tensordot") for d in da]
    db = [_dim(d, b.ndim, "tensordot") for d in db]
    if [a.shape[i] for i in da] != [b.shape[j] for j in db]:
        raise RuntimeError(f"tensordot: contracted sizes of shapes {tuple(a.shape)} and "
                           f"{tuple(b.shape)} differ (dims {da} and {db})")
    fa = [d for d in range(a.ndim) if d not in da]
    fb = [d for d in range(b.ndim) if d not in db]
    k = math.prod(a.shape[i] for i in da)
    am = reshape(permute(a, tuple(fa + da)), (-1, k))
    bm = reshape(permute(b, tuple(db + fb)), (k, -1))
    return reshape(matmul(am, bm), tuple(a.shape[i] for i in fa) + tuple(b.shape[j] for j in fb))


def kron(self: Tensor, other: Tensor) -> Tensor:
    """The Kronecker product (NumPy's rule for different numbers of dimensions)."""
    a, b = promote_operands(self, other)
    nd = max(a.ndim, b.ndim)
    a = reshape(a, (1,) * (nd - a.ndim) + tuple(a.shape))
    b = reshape(b, (1,) * (nd - b.ndim) + tuple(b.shape))
    ai = reshape(a, tuple(s for n in a.shape for s in (n, 1)))
    bi = reshape(b, tuple(s for n in b.shape for s in (1, n)))
    return reshape(ai * bi, tuple(m * n for m, n in zip(a.shape, b.shape, strict=True)))


def addmm(self: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * self + alpha * (mat1 @ mat2)``."""
    return _scaled(as_tensor(self), beta) + _scaled(matmul(mat1, mat2), alpha)


def addmv(self: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * self + alpha * (mat @ vec)``."""
    return _scaled(as_tensor(self), beta) + _scaled(mv(mat, vec), alpha)


def addr(self: Tensor, vec1: Tensor, vec2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * self + alpha * outer(vec1, vec2)``."""
    outer = reshape(vec1, (-1, 1)) * reshape(vec2, (1, -1))
    return _scaled(as_tensor(self), beta) + _scaled(outer, alpha)


def baddbmm(self: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * self + alpha * (batch1 @ batch2)`` for stacks of matrices."""
    return _scaled(as_tensor(self), beta) + _scaled(matmul(batch1, batch2), alpha)


def addbmm(self: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * self + alpha * sum_i batch1[i] @ batch2[i]``."""
    return _scaled(as_tensor(self), beta) + _scaled(sum(matmul(batch1, batch2), 0), alpha)


def multi_dot(tensors: Sequence[Tensor]) -> Tensor:
    """The product of a chain of matrices, left to right (the first may be a vector,
    read as a row, the last a vector, read as a column, as ``torch.linalg.multi_dot``)."""
    ts = [as_tensor(t) for t in tensors]
    if len(ts) < 2:
        raise RuntimeError("multi_dot: expects at least two tensors")
    left = ts[0]
    for t in ts[1:]:
        left = matmul(left, t)
    return left


def matrix_power(self: Tensor, n: int) -> Tensor:
    """``A`` to the integer power ``n`` (by squaring; ``inv(A)**-n`` for negative ``n``,
    the identity for 0)."""
    A = as_tensor(self)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"matrix_power: expects square matrices, got shape {tuple(A.shape)}")
    n = int(n)
    if n == 0:
        eye = as_tensor(np.broadcast_to(np.eye(A.shape[-1], dtype=A.dtype), A.shape).copy())
        return eye + A * 0.0  # in the graph, so its gradient (zero) reaches A
    if n < 0:
        A, n = inv(A), -n
    result, base = None, A
    while n:
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    return result


def cholesky_solve(self: Tensor, L: Tensor, upper: bool = False) -> Tensor:
    """``X`` with ``A @ X = B`` (``B = self``) for ``A = L @ L.mT`` given its Cholesky
    factor ``L`` (``A = U.mT @ U`` when ``upper``)."""
    B, L = promote_operands(self, L)
    Lt = transpose(L, -2, -1)
    if upper:  # A = U.mT @ U: U.mT y = B, then U x = y
        return solve_triangular(L, solve_triangular(Lt, B, upper=False), upper=True)
    return solve_triangular(Lt, solve_triangular(L, B, upper=False), upper=True)


def logdet(self: Tensor) -> Tensor:
    """``log(det(A))``: NaN for a negative determinant, -inf for a singular matrix."""
    sign, logabs = slogdet(self)
    return where(sign < 0, math.nan, logabs)


def cross(self: Tensor, other: Tensor, dim: int = -1) -> Tensor:
    """The cross product of 3-vectors along ``dim`` (broadcast)."""
    a, b = broadcast_tensors(*promote_operands(self, other))
    d = _dim(dim, a.ndim, "cross")
    if a.shape[d] != 3:
        raise RuntimeError(f"cross: dim {d} must have size 3, got shape {tuple(a.shape)}")
    a1, a2, a3 = unbind(a, d)
    b1, b2, b3 = unbind(b, d)
    return stack([a2 * b3 - a3 * b2, a3 * b1 - a1 * b3, a1 * b2 - a2 * b1], d)


def dist(self: Tensor, other: Tensor, p: float = 2.0) -> Tensor:
    """The p-norm of ``self - other`` (broadcast), over all elements."""
    d = self - other
    return norm(reshape(d, (-1,)), float(p), 0)


def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode: str | None = None) -> Tensor:
    """The p-norm distances between the rows of ``x1`` (…, P, M) and of ``x2`` (…, R, M):
    shape (…, P, R); the gradient at a zero distance is 0 (as PyTorch). ``compute_mode``
    (PyTorch's choice of a faster, less accurate matmul form) is accepted: the distances
    are always computed directly."""
    a, b = promote_operands(x1, x2)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-1]:
        raise RuntimeError(f"cdist: expects (..., P, M) and (..., R, M), got shapes "
                           f"{tuple(a.shape)} and {tuple(b.shape)}")
    diff = reshape(a, a.shape[:-1] + (1, a.shape[-1])) - \
        reshape(b, b.shape[:-2] + (1,) + b.shape[-2:])
    return norm(diff, float(p), -1)


def diag_embed(self: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """Each last-dimension vector of ``self`` on the ``offset``-th diagonal of a new
    square plane in dimensions ``dim1``, ``dim2`` of the result."""
    x = as_tensor(self)
    n = x.shape[-1] if x.ndim else 1
    eye = as_tensor(np.eye(n, dtype=x.dtype))
    planes = reshape(x, x.shape + (1,)) * eye           # (..., n, n), vectors on rows
    k = int(offset)
    if k:
        planes = pad(planes, (k, 0, 0, k) if k > 0 else (0, -k, -k, 0))
    nd = planes.ndim
    d1, d2 = _dim(dim1, nd, "diag_embed"), _dim(dim2, nd, "diag_embed")
    if d1 == d2:
        raise RuntimeError(f"diag_embed: dim1 and dim2 are the same dimension ({d1})")
    rest = iter(range(nd - 2))
    order = [nd - 2 if k == d1 else nd - 1 if k == d2 else next(rest) for k in range(nd)]
    return permute(planes, tuple(order))


def block_diag(*tensors: Tensor) -> Tensor:
    """The matrices (0-D and 1-D tensors as rows) on the diagonal of one matrix."""
    ts = []
    for t in tensors:
        t = as_tensor(t)
        if t.ndim > 2:
            raise RuntimeError(f"block_diag: expects tensors of at most 2 dimensions, got "
                               f"shape {tuple(t.shape)}")
        ts.append(reshape(t, (1,) * (2 - t.ndim) + tuple(t.shape)))
    if not ts:
        return as_tensor(np.zeros((1, 0)))
    dtype = np.result_type(*(t.dtype for t in ts))
    ts = [t if t.dtype == dtype else t.to(dtype) for t in ts]
    width = builtins.sum(t.shape[1] for t in ts)
    rows, left = [], 0
    for t in ts:
        rows.append(pad(t, (left, width - left - t.shape[1])))
        left += t.shape[1]
    return cat(rows, 0)


__all__ = ["addbmm", "addmm", "addmv", "addr", "baddbmm", "block_diag", "cdist",
           "cholesky_solve", "cross", "diag_embed", "dist", "inner", "kron", "logdet",
           "matrix_power", "multi_dot", "mv", "tensordot"]
