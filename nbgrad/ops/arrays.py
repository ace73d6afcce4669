"""More of NumPy's and PyTorch's array functions, written over table ops: flips and
stacks by direction, splits, ``repeat_interleave``, ``cartesian_prod``, ``diagflat``,
the ``new_*`` and ``*_as`` methods, angle conversions, ``cov``/``corrcoef`` and
``cumulative_trapezoid``. Each differentiates through the ops it calls."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .. import dtypes
from ..factories import empty, full, ones, zeros
from ..tensor import Tensor
from .arrange import atleast_1d, atleast_3d, hstack, tensor_split
from .convert import to_dtype
from .dispatch import as_tensor
from .elementwise import div, where
from .indexing import index_select
from .linalg import diag, matmul
from .reduction import cumsum, mean, sum
from .shape import _dim, cat, flip, reshape, stack, transpose

__all__ = ["cartesian_prod", "column_stack", "corrcoef", "cov", "cumulative_trapezoid",
           "deg2rad", "diagflat", "dsplit", "dstack", "fliplr", "flipud", "hsplit", "msort",
           "new_empty", "new_full", "new_ones", "new_zeros", "positive", "rad2deg",
           "repeat_interleave", "reshape_as", "sgn", "sum_to_size", "swapdims",
           "true_divide", "view_as", "vsplit"]


# ------------------------------------------------------------------ pointwise
def deg2rad(self: Tensor) -> Tensor:
    return as_tensor(self) * (math.pi / 180.0)


def rad2deg(self: Tensor) -> Tensor:
    return as_tensor(self) * (180.0 / math.pi)


def positive(self: Tensor) -> Tensor:
    """The tensor itself (``+x``)."""
    return as_tensor(self)


def true_divide(self: Tensor, other) -> Tensor:
    return div(self, other)


def sgn(self: Tensor) -> Tensor:
    """The sign (for real tensors, :func:`sign`)."""
    return as_tensor(self).sign()


# ------------------------------------------------------------------ flips, stacks, splits
def fliplr(self: Tensor) -> Tensor:
    """Reverse the columns (dimension 1)."""
    x = as_tensor(self)
    if x.ndim < 2:
        raise RuntimeError(f"fliplr: needs at least 2 dimensions, got shape {tuple(x.shape)}")
    return flip(x, 1)


def flipud(self: Tensor) -> Tensor:
    """Reverse the rows (dimension 0)."""
    x = as_tensor(self)
    if x.ndim < 1:
        raise RuntimeError("flipud: needs at least 1 dimension, got a 0-d tensor")
    return flip(x, 0)


def dstack(tensors: Sequence[Tensor]) -> Tensor:
    """Stack along the third dimension (after making each at least 3-D)."""
    return cat([atleast_3d(t) for t in tensors], 2)


def column_stack(tensors: Sequence[Tensor]) -> Tensor:
    """1-D tensors as columns, 2-D ones as they are, side by side."""
    return hstack([reshape(t, (-1, 1)) if as_tensor(t).ndim <= 1 else t for t in tensors])


def _split_along(op: str, x, sections, dim: int, min_ndim: int) -> tuple[Tensor, ...]:
    x = as_tensor(x)
    if x.ndim < min_ndim:
        raise RuntimeError(f"{op}: needs at least {min_ndim} dimension(s), got shape "
                           f"{tuple(x.shape)}")
    if isinstance(sections, (int, np.integer)) and x.shape[dim] % int(sections):
        raise RuntimeError(f"{op}: dimension {dim} of size {x.shape[dim]} cannot be split "
                           f"into {sections} equal parts")
    return tensor_split(x, sections, dim)


def hsplit(self: Tensor, sections) -> tuple[Tensor, ...]:
    """Split along dimension 1 (0 for a 1-D tensor), as NumPy."""
    x = as_tensor(self)
    return _split_along("hsplit", x, sections, 1 if x.ndim > 1 else 0, 1)


def vsplit(self: Tensor, sections) -> tuple[Tensor, ...]:
    return _split_along("vsplit", self, sections, 0, 2)


def dsplit(self: Tensor, sections) -> tuple[Tensor, ...]:
    return _split_along("dsplit", self, sections, 2, 3)


def swapdims(self: Tensor, dim0: int, dim1: int) -> Tensor:
    return transpose(self, dim0, dim1)


def msort(self: Tensor) -> Tensor:
    """Sorted along dimension 0."""
    return as_tensor(self).sort(0).values


def repeat_interleave(self: Tensor, repeats, dim: int | None = None, *,
                      output_size: int | None = None) -> Tensor:
    """Each entry (along ``dim``, of the flattened tensor when None) repeated ``repeats``
    times (a number, or one count per entry)."""
    x = as_tensor(self)
    if dim is None:
        x, dim = reshape(x, (-1,)), 0
    d = _dim(dim, x.ndim, "repeat_interleave")
    n = x.shape[d]
    counts = repeats.numpy() if isinstance(repeats, Tensor) else np.asarray(repeats)
    counts = np.broadcast_to(counts.astype(np.int64), (n,)) if counts.ndim == 0 else counts
    if counts.shape != (n,) or (counts.size and counts.min() < 0):
        raise RuntimeError(f"repeat_interleave: repeats must be non-negative, one per entry "
                           f"of dim {d} (size {n}), got {counts.tolist()}")
    picks = np.repeat(np.arange(n), counts)
    if output_size is not None and output_size != picks.size:
        raise RuntimeError(f"repeat_interleave: output_size {output_size} does not match "
                           f"the repeats' sum {picks.size}")
    return index_select(x, d, as_tensor(picks))


def cartesian_prod(*tensors: Tensor) -> Tensor:
    """Every combination of one entry of each 1-D tensor, as rows (a 1-D tensor for one)."""
    ts = [as_tensor(t) for t in tensors]
    if len(ts) == 1:
        return ts[0]
    grids = np.meshgrid(*[np.arange(t.shape[0]) for t in ts], indexing="ij")
    return stack([index_select(t, 0, as_tensor(g.reshape(-1))) for t, g in
                  zip(ts, grids, strict=True)], 1)


def diagflat(self: Tensor, offset: int = 0) -> Tensor:
    """The flattened input on diagonal ``offset`` of a square matrix."""
    return diag(reshape(as_tensor(self), (-1,)), offset)


# ------------------------------------------------------------------ methods
def reshape_as(self: Tensor, other: Tensor) -> Tensor:
    return reshape(self, tuple(other.shape))


def view_as(self: Tensor, other: Tensor) -> Tensor:
    return as_tensor(self).view(tuple(other.shape))


def sum_to_size(self: Tensor, *size) -> Tensor:
    """Summed over the broadcast dimensions down to ``size``."""
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    x = as_tensor(self)
    try:
        np.broadcast_shapes(shape, x.shape)
        lead = x.ndim - len(shape)
        if lead < 0 or np.broadcast_shapes(shape, x.shape) != x.shape:
            raise ValueError
    except ValueError:
        raise RuntimeError(f"sum_to_size: size {shape} is not expandable to the tensor's "
                           f"shape {tuple(x.shape)}") from None
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and x.shape[lead + i] != 1)
    return reshape(sum(x, dims, keepdim=True), shape) if dims else x


def _new(fill, self: Tensor, size, fill_value=None, dtype=None, device=None,
         requires_grad: bool = False) -> Tensor:
    x = as_tensor(self)
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    kwargs = dict(dtype=dtype or x.dtype, device=device or x.device,
                  requires_grad=requires_grad)
    return fill(shape, fill_value, **kwargs) if fill is full else fill(*shape, **kwargs)


def new_zeros(self: Tensor, *size, dtype=None, device=None, requires_grad: bool = False):
    """Zeros of ``size`` with this tensor's dtype and device (unless given)."""
    return _new(zeros, self, size, None, dtype, device, requires_grad)


def new_ones(self: Tensor, *size, dtype=None, device=None, requires_grad: bool = False):
    return _new(ones, self, size, None, dtype, device, requires_grad)


def new_empty(self: Tensor, *size, dtype=None, device=None, requires_grad: bool = False):
    return _new(empty, self, size, None, dtype, device, requires_grad)


def new_full(self: Tensor, size, fill_value, *, dtype=None, device=None,
             requires_grad: bool = False):
    return _new(full, self, (size,), fill_value, dtype, device, requires_grad)


# ------------------------------------------------------------------ statistics
def cov(self: Tensor, *, correction: int = 1, fweights: Tensor | None = None,
        aweights: Tensor | None = None) -> Tensor:
    """The covariance matrix of the variables in the rows (observations in columns),
    weighted as NumPy's ``cov``."""
    x = atleast_1d(self)
    if x.ndim > 2:
        raise RuntimeError(f"cov: expects at most 2 dimensions, got shape {tuple(x.shape)}")
    x = reshape(x, (1, -1)) if x.ndim == 1 else x
    if x.dtype.kind != "f":
        x = to_dtype(x, dtypes.float64)
    n = x.shape[1]
    w = None
    if fweights is not None:
        w = as_tensor(fweights)
    if aweights is not None:
        w = as_tensor(aweights) if w is None else w * aweights
    if w is None:
        avg = mean(x, 1, keepdim=True)
        norm_ = n - correction
        xc = x - avg
        return reshape(matmul(xc, transpose(xc, 0, 1)) / max(norm_, 0), _cov_shape(self))
    w = to_dtype(w, x.dtype)
    w_sum = sum(w)
    avg = sum(x * w, 1, keepdim=True) / w_sum
    if aweights is None or correction == 0:
        norm_ = w_sum - correction
    else:
        norm_ = w_sum - correction * sum(w * aweights) / w_sum
    xc = x - avg
    c = matmul(xc * w, transpose(xc, 0, 1)) / where(norm_ > 0, norm_, 0.0)
    return reshape(c, _cov_shape(self))


def _cov_shape(x) -> tuple[int, ...]:
    x = as_tensor(x)
    return () if x.ndim < 2 or x.shape[0] == 1 else (x.shape[0], x.shape[0])


def corrcoef(self: Tensor) -> Tensor:
    """Pearson correlation coefficients of the rows, clipped to [-1, 1]."""
    c = cov(self)
    if c.ndim == 0:
        return c / c
    d = diag(c).sqrt()
    r = c / reshape(d, (-1, 1)) / reshape(d, (1, -1))
    return r.clamp(-1.0, 1.0)


def cumulative_trapezoid(y: Tensor, x: Tensor | None = None, *, dx: float = 1.0,
                         dim: int = -1) -> Tensor:
    """The running trapezoid-rule integral of ``y`` along ``dim`` (one entry shorter)."""
    y = as_tensor(y)
    d = _dim(dim, y.ndim, "cumulative_trapezoid")
    n = y.shape[d]
    lo, hi = (index_select(y, d, as_tensor(np.arange(a, b))) for a, b in ((0, n - 1),
                                                                             (1, n)))
    if x is None:
        areas = (lo + hi) * (float(dx) / 2.0)
    else:
        xs = as_tensor(x)
        if xs.ndim == 1:
            xs = reshape(xs, (-1,) + (1,) * (y.ndim - d - 1))
            steps = xs[1:] - xs[:-1]
        else:
            xd = _dim(dim, xs.ndim, "cumulative_trapezoid")
            m = xs.shape[xd]
            steps = (index_select(xs, xd, as_tensor(np.arange(1, m)))
                     - index_select(xs, xd, as_tensor(np.arange(0, m - 1))))
        areas = (lo + hi) * steps / 2.0
    return cumsum(areas, d)

