"""Variants of existing ops under the names PyTorch also gives them: the ``*_copy`` ops
(the view op, then a copy), the ``*_scatter`` ops (the inverse of a view: ``input`` with
the viewed part replaced by ``src``), identities for real tensors (``conj``, ``real``,
``resolve_conj``...), the integer dtype methods, index factories, ``logspace``, ``ldexp`` and the
running extremes ``cummax``/``cummin``. All differentiate through the ops they call."""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from .. import dtypes
from ..factories import full_like
from ..tensor import Tensor
from .arrange import movedim, narrow
from .dispatch import as_tensor
from .elementwise import where
from .indexing import gather, index_put
from .linalg import diagonal
from .shape import chunk, expand, permute, split, squeeze, t, transpose, unbind, unsqueeze

__all__ = ["alias_copy", "angle", "byte", "char", "conj", "conj_physical", "cummax",
           "cummin", "diagonal_copy", "diagonal_scatter", "expand_copy", "fill",
           "isreal", "ldexp", "logspace", "mvlgamma", "renorm", "narrow_copy", "permute_copy",
           "real",
           "resolve_conj", "resolve_neg", "scalar_tensor", "select_scatter", "short",
           "slice_scatter", "squeeze_copy", "t_copy", "transpose_copy", "tril_indices",
           "triu_indices", "unbind_copy", "unsafe_chunk", "unsafe_split", "unsqueeze_copy",
           "split_with_sizes_copy", "view_copy"]

CumExtreme = namedtuple("CumExtreme", ["values", "indices"])


# ------------------------------------------------------------------ *_copy
def alias_copy(self: Tensor) -> Tensor:
    return as_tensor(self).clone()


def diagonal_copy(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    return diagonal(self, offset, dim1, dim2).clone()


def expand_copy(self: Tensor, *size) -> Tensor:
    return expand(self, *size).clone()


def narrow_copy(self: Tensor, dim: int, start: int, length: int) -> Tensor:
    return narrow(self, dim, start, length).clone()


def permute_copy(self: Tensor, *dims) -> Tensor:
    return permute(self, *dims).clone()


def squeeze_copy(self: Tensor, dim=None) -> Tensor:
    return squeeze(self, dim).clone()


def t_copy(self: Tensor) -> Tensor:
    return t(self).clone()


def transpose_copy(self: Tensor, dim0: int, dim1: int) -> Tensor:
    return transpose(self, dim0, dim1).clone()


def unbind_copy(self: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    return tuple(part.clone() for part in unbind(self, dim))


def split_with_sizes_copy(self: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    return tuple(part.clone() for part in split(self, list(split_sizes), dim))


def unsafe_chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """:func:`chunk` (PyTorch's name for the version whose views skip a check)."""
    return chunk(self, chunks, dim)


def unsafe_split(self: Tensor, split_size, dim: int = 0) -> tuple[Tensor, ...]:
    return split(self, split_size, dim)


def unsqueeze_copy(self: Tensor, dim: int) -> Tensor:
    return unsqueeze(self, dim).clone()


def view_copy(self: Tensor, *size) -> Tensor:
    return as_tensor(self).reshape(*size).clone()


# ------------------------------------------------------------------ *_scatter
def _scatter_along(x: Tensor, src: Tensor, dim: int, positions: np.ndarray) -> Tensor:
    """``x`` with the slices at ``positions`` along ``dim`` replaced by ``src``'s."""
    x, src = as_tensor(x), as_tensor(src)
    d = dim % x.ndim
    moved = movedim(src.to(x.dtype), d, 0) if src.ndim == x.ndim else src.to(x.dtype)
    out = index_put(movedim(x, d, 0), (as_tensor(positions.astype(np.int64)),), moved)
    return movedim(out, 0, d)


def select_scatter(self: Tensor, src: Tensor, dim: int, index: int) -> Tensor:
    """``self`` with ``self.select(dim, index)`` replaced by ``src``."""
    x = as_tensor(self)
    n = x.shape[dim]
    if not -n <= index < n:
        raise IndexError(f"select_scatter: index {index} is out of range for dim {dim} of "
                         f"size {n}")
    return _scatter_along(x, unsqueeze(src, dim % x.ndim), dim, np.array([index % n]))


def slice_scatter(self: Tensor, src: Tensor, dim: int = 0, start: int | None = None,
                  end: int | None = None, step: int = 1) -> Tensor:
    """``self`` with ``self[..., start:end:step, ...]`` (along ``dim``) replaced by ``src``."""
    x = as_tensor(self)
    positions = np.arange(x.shape[dim])[slice(start, end, step)]
    if positions.size == 0:
        return x.clone()
    return _scatter_along(x, src, dim, positions)


def diagonal_scatter(self: Tensor, src: Tensor, offset: int = 0, dim1: int = 0,
                     dim2: int = 1) -> Tensor:
    """``self`` with its diagonal (as :func:`diagonal`, whose shape ``src`` has) replaced
    by ``src``."""
    x = as_tensor(self)
    d1, d2 = dim1 % x.ndim, dim2 % x.ndim
    n1, n2 = x.shape[d1], x.shape[d2]
    rest = [k for k in range(x.ndim) if k not in (d1, d2)]
    order = [d1, d2, *rest]  # the plane first, flattened to one dim of n1 * n2 entries
    plane = permute(x, *order).reshape(n1 * n2, *(x.shape[k] for k in rest))
    length = max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))
    k = np.arange(length)
    rows, cols = (k, k + offset) if offset >= 0 else (k - offset, k)
    values = movedim(as_tensor(src).to(x.dtype), -1, 0)
    plane = index_put(plane, (as_tensor((rows * n2 + cols).astype(np.int64)),), values)
    out = plane.reshape(n1, n2, *(x.shape[k] for k in rest))
    return permute(out, *np.argsort(order).tolist())


# ------------------------------------------------------------------ real-tensor identities
def conj(self: Tensor) -> Tensor:
    """The complex conjugate: the tensor itself (nbgrad's tensors are real)."""
    return as_tensor(self)


conj_physical = resolve_conj = resolve_neg = real = conj


def isreal(self: Tensor) -> Tensor:
    return full_like(as_tensor(self), True, dtype=dtypes.bool_)


def angle(self: Tensor) -> Tensor:
    """The argument of a real number: pi for negative values, else 0 (NaN stays NaN)."""
    x = as_tensor(self)
    x = x if x.dtype.kind == "f" else x.to(dtypes.float64)
    return where(x < 0, math.pi, x * 0.0)


def byte(self: Tensor, memory_format=None) -> Tensor:
    return as_tensor(self).to(np.uint8)


def char(self: Tensor, memory_format=None) -> Tensor:
    return as_tensor(self).to(np.int8)


def short(self: Tensor, memory_format=None) -> Tensor:
    return as_tensor(self).to(np.int16)


# ------------------------------------------------------------------ factories, misc
def fill(self: Tensor, value) -> Tensor:
    """A tensor like ``self`` filled with ``value`` (out of place)."""
    x = as_tensor(self)
    if isinstance(value, Tensor):
        return expand(value.to(x.dtype), *x.shape).clone()
    return full_like(x, value)


def scalar_tensor(value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return Tensor(np.asarray(value, dtypes.as_dtype(dtype or np.float64)),
                  requires_grad=requires_grad, device=device or "cpu")


def _tri_indices(op: str, row: int, col: int, offset: int, lower: bool, dtype) -> Tensor:
    if row < 0 or col < 0:
        raise RuntimeError(f"{op}: row and col must be non-negative, got {row}, {col}")
    rows, cols = (np.tril_indices if lower else np.triu_indices)(row, offset, col)
    return as_tensor(np.stack([rows, cols]).astype(dtypes.as_dtype(dtype or np.int64)))


def tril_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None) -> Tensor:
    return _tri_indices("tril_indices", row, col, offset, True, dtype)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None) -> Tensor:
    return _tri_indices("triu_indices", row, col, offset, False, dtype)


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None, device=None,
             requires_grad: bool = False) -> Tensor:
    """``base ** linspace(start, end, steps)``."""
    values = np.logspace(float(start), float(end), int(steps), base=float(base))
    out_dtype = dtypes.as_dtype(dtype) if dtype is not None else np.float64
    return Tensor(values.astype(out_dtype), requires_grad=requires_grad)


def ldexp(self: Tensor, other: Tensor) -> Tensor:
    """``self * 2 ** other``."""
    x = as_tensor(self)
    x = x if x.dtype.kind == "f" else x.to(dtypes.float64)
    return x * (as_tensor(other).to(x.dtype) * math.log(2.0)).exp()


def mvlgamma(self: Tensor, p: int) -> Tensor:
    """The log of the multivariate gamma function of dimension ``p``:
    ``p (p - 1) / 4 log(pi) + sum_{j < p} lgamma(x - j / 2)``."""
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"mvlgamma: p must be a positive integer, got {p!r}")
    x = as_tensor(self)
    x = x if x.dtype.kind == "f" else x.to(dtypes.float64)
    out = x.lgamma()
    for j in range(1, int(p)):
        out = out + (x - 0.5 * j).lgamma()
    return out + int(p) * (int(p) - 1) * 0.25 * math.log(math.pi)


def renorm(self: Tensor, p: float, dim: int, maxnorm: float) -> Tensor:
    """Each slice along ``dim`` whose ``p``-norm exceeds ``maxnorm`` scaled down to it
    (by ``maxnorm / (norm + 1e-7)``, as PyTorch)."""
    x = as_tensor(self)
    if x.ndim < 2:
        raise RuntimeError(f"renorm: needs at least 2 dimensions, got shape {tuple(x.shape)}")
    d = dim % x.ndim
    n = x.norm(float(p), tuple(k for k in range(x.ndim) if k != d), keepdim=True)
    return x * where(n > float(maxnorm), float(maxnorm) / (n + 1e-7), 1.0)


def _cumulative_extreme(op: str, self, dim: int, pick) -> CumExtreme:
    x = as_tensor(self)
    if x.ndim == 0:
        return CumExtreme(x.clone(), as_tensor(np.zeros((), np.int64)))
    values = np.asarray(x.detach())  # inside nbgrad.jit this raises (values unknown)
    d = dim % x.ndim
    moved = np.moveaxis(values, d, -1)
    idx = np.zeros(moved.shape, np.int64)
    best = moved[..., :1].copy()
    for k in range(1, moved.shape[-1]):
        v = moved[..., k:k + 1]
        take = pick(v, best) | np.isnan(v) | (v == best)
        take &= ~np.isnan(best) | np.isnan(v)
        best = np.where(take, v, best)
        idx[..., k:k + 1] = np.where(take, k, idx[..., k - 1:k])
    indices = as_tensor(np.moveaxis(idx, -1, d).copy())
    return CumExtreme(gather(x, d, indices), indices)


def cummax(self: Tensor, dim: int) -> CumExtreme:
    """The running maximum along ``dim`` and where it was reached (the last position of
    a tie, as PyTorch); NaN propagates."""
    return _cumulative_extreme("cummax", self, dim, np.greater)


def cummin(self: Tensor, dim: int) -> CumExtreme:
    """The running minimum along ``dim`` and its position (as :func:`cummax`)."""
    return _cumulative_extreme("cummin", self, dim, np.less)

