"""Reductions written over table ops (as PyTorch's composites): ``any``, ``all``,
``count_nonzero``, ``nansum``, ``nanmean``, ``var_mean``, ``std_mean``, ``aminmax``,
``argsort``, ``kthvalue``, ``median``, ``nanmedian``, ``quantile``, ``nanquantile``,
``logcumsumexp``. The order statistics sort once (``sort``'s gradient goes back to where
each value came from), so they differentiate to any order and run natively in both jit
tiers.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import dtypes
from ..tensor import Tensor
from .convert import to_dtype
from .dispatch import as_tensor
from .elementwise import where
from .indexing import gather
from .pointwise import isnan
from .reduction import ValuesIndices, amax, amin, cumsum, mean, sort, std, sum, var
from .shape import _dim, reshape, squeeze, stack, unsqueeze


class MinMax(NamedTuple):
    """What ``aminmax`` returns (as torch)."""

    min: Tensor
    max: Tensor


def _dims(dim, axis):
    if axis is not None:
        if dim is not None:
            raise TypeError("give dim or axis, not both")
        return axis
    return dim


def _flat_or(x: Tensor, dim) -> tuple[Tensor, int]:
    """``(x, dim)``, or ``x`` flattened and 0 when ``dim`` is None or ``x`` is 0-d (whose
    only dims are 0 and -1)."""
    if dim is None or x.ndim == 0:
        if dim is not None:
            _dim(dim, 1, "reduction")
        return reshape(x, (-1,)), 0
    return x, _dim(dim, x.ndim, "reduction")


def any(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:  # noqa: A001
    """Whether any element over ``dim`` is nonzero (a bool tensor)."""
    return sum(as_tensor(self) != 0, _dims(dim, axis), keepdim) > 0


def all(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:  # noqa: A001
    """Whether every element over ``dim`` is nonzero (a bool tensor)."""
    return sum(as_tensor(self) == 0, _dims(dim, axis), keepdim) == 0


def count_nonzero(self: Tensor, dim=None, *, axis=None) -> Tensor:
    """The number of nonzero elements over ``dim`` (int64)."""
    return sum(as_tensor(self) != 0, _dims(dim, axis), False, dtypes.int64)


def nansum(self: Tensor, dim=None, keepdim: bool = False, dtype=None, *,
           axis=None) -> Tensor:
    """The sum over ``dim`` with NaN counted as 0 (no gradient to the NaN entries)."""
    x = as_tensor(self)
    return sum(where(isnan(x), 0.0, x), _dims(dim, axis), keepdim, dtype)


def nanmean(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """The mean over ``dim`` of the entries that are not NaN (NaN where all are)."""
    x = as_tensor(self)
    d = _dims(dim, axis)
    count = sum(~isnan(x), d, keepdim, x.dtype)
    return nansum(x, d, keepdim) / count


def var_mean(self: Tensor, dim=None, correction: float = 1, keepdim: bool = False, *,
             unbiased: bool | None = None, axis=None) -> tuple[Tensor, Tensor]:
    """``(var, mean)`` over ``dim``."""
    if isinstance(dim, (bool, np.bool_)):  # torch's var_mean(x, unbiased)
        dim, unbiased = None, bool(dim)
    d = _dims(dim, axis)
    v = var(self, d, correction, keepdim, unbiased=unbiased)
    return v, mean(self, d, keepdim)


def std_mean(self: Tensor, dim=None, correction: float = 1, keepdim: bool = False, *,
             unbiased: bool | None = None, axis=None) -> tuple[Tensor, Tensor]:
    """``(std, mean)`` over ``dim``."""
    if isinstance(dim, (bool, np.bool_)):  # torch's std_mean(x, unbiased)
        dim, unbiased = None, bool(dim)
    d = _dims(dim, axis)
    s = std(self, d, correction, keepdim, unbiased=unbiased)
    return s, mean(self, d, keepdim)


def aminmax(self: Tensor, *, dim=None, keepdim: bool = False) -> MinMax:
    """``(min, max)`` over ``dim`` (all elements when None)."""
    return MinMax(amin(self, dim, keepdim), amax(self, dim, keepdim))


def argsort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = False, *,
            axis=None) -> Tensor:
    """The indices that sort ``dim`` (a stable sort; NaN last)."""
    return sort(self, _dims(dim, axis) if axis is not None else dim, descending)[1]


def kthvalue(self: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
    """The ``k``-th smallest value along ``dim`` (1-based) and its index."""
    x, d = _flat_or(as_tensor(self), dim)
    n = x.shape[d]
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue: k={k} is out of range for dim {d} of size {n}")
    values, indices = sort(x, d)
    pick = _at(values, d, k - 1), _at(indices, d, k - 1)
    if keepdim and as_tensor(self).ndim:  # a 0-d input gives 0-d results (as torch)
        return ValuesIndices(*(unsqueeze(p, d) for p in pick))
    return ValuesIndices(*pick)


def _at(x: Tensor, d: int, position: int) -> Tensor:
    return x[(slice(None),) * d + (int(position),)]


def _order_statistic(op: str, x, dim, nan_aware: bool):
    """(sorted values, their indices, dim, the number of entries that are not NaN per
    line when ``nan_aware``, else None) for the median and quantiles."""
    x = as_tensor(x)
    if x.dtype.kind != "f":
        raise TypeError(f"{op}: needs a floating tensor, got {x.dtype}")
    x, d = _flat_or(x, dim)
    values, indices = sort(x, d)  # NaN sorts last
    count = sum(~isnan(x), d, True, dtypes.int64) if nan_aware else None
    return values, indices, d, count


def median(self: Tensor, dim=None, keepdim: bool = False):
    """The lower median (as PyTorch: the smaller of the two middle values); with
    ``dim``, ``(values, indices)``; NaN when a NaN is present."""
    return _median("median", self, dim, keepdim, nan_aware=False)


def nanmedian(self: Tensor, dim=None, keepdim: bool = False):
    """The lower median of the entries that are not NaN (NaN where all are)."""
    return _median("nanmedian", self, dim, keepdim, nan_aware=True)


def _median(op: str, x, dim, keepdim: bool, nan_aware: bool):
    keepdim = keepdim and as_tensor(x).ndim > 0  # a 0-d input gives 0-d results (as torch)
    values, indices, d, count = _order_statistic(op, x, dim, nan_aware)
    n = values.shape[d]
    if n == 0:
        raise IndexError(f"{op}: cannot take the median of an empty dimension")
    if count is None:  # a NaN anywhere in a line makes its median NaN (sorted last)
        pos = where(any(isnan(values), d, True), n - 1, (n - 1) // 2)
    else:
        pos = where(count > 0, (count - 1) // 2, 0)
    pos = to_dtype(pos, dtypes.int64) if pos.dtype != dtypes.int64 else pos
    v, i = gather(values, d, pos), gather(indices, d, pos)
    if dim is None:
        return reshape(v, ())
    if not keepdim:
        v, i = squeeze(v, d), squeeze(i, d)
    return ValuesIndices(v, i)


def quantile(self: Tensor, q, dim=None, keepdim: bool = False, *,
             interpolation: str = "linear") -> Tensor:
    """The ``q``-th quantiles (``q`` in [0, 1], a number or a 1-D tensor, whose values
    then lead the result's shape) along ``dim``, interpolated as NumPy's and PyTorch's
    ``'linear'`` (also ``'lower'``, ``'higher'``, ``'nearest'``, ``'midpoint'``)."""
    return _quantile("quantile", self, q, dim, keepdim, interpolation, nan_aware=False)


def nanquantile(self: Tensor, q, dim=None, keepdim: bool = False, *,
                interpolation: str = "linear") -> Tensor:
    """:func:`quantile` of the entries that are not NaN (NaN where all are)."""
    return _quantile("nanquantile", self, q, dim, keepdim, interpolation, nan_aware=True)


_INTERPOLATIONS = ("linear", "lower", "higher", "nearest", "midpoint")


def _quantile(op: str, x, q, dim, keepdim: bool, interpolation: str, nan_aware: bool):
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(f"{op}: interpolation must be one of {_INTERPOLATIONS}, got "
                         f"{interpolation!r}")
    qs = np.atleast_1d(np.asarray(q.detach().numpy() if isinstance(q, Tensor) else q,
                                  np.float64))
    if qs.ndim != 1 or (qs.size and (qs.min() < 0 or qs.max() > 1)):
        raise ValueError(f"{op}: q must be a number or a 1-D tensor of values in [0, 1]")
    keepdim = keepdim and as_tensor(x).ndim > 0  # a 0-d input gives 0-d results (as torch)
    values, _, d, count = _order_statistic(op, x, dim, nan_aware)
    n = values.shape[d]
    if n == 0:
        raise IndexError(f"{op}: cannot take a quantile of an empty dimension")
    if count is None:
        last = as_tensor(np.asarray(n - 1, np.float64))
        last = where(any(isnan(values), d, True), math.nan, last)
    else:
        last = to_dtype(count, values.dtype) - 1.0
    outs = []
    for qv in qs:
        pos = last * float(qv)                       # fractional rank, per line
        lo = pos.floor()
        hi = pos.ceil()
        frac = pos - lo
        lo_i, hi_i = (_index_of(t, n) for t in (lo, hi))
        a, b = gather(values, d, lo_i), gather(values, d, hi_i)
        if interpolation == "linear":
            v = a + (b - a) * frac
        elif interpolation == "lower":
            v = a
        elif interpolation == "higher":
            v = b
        elif interpolation == "midpoint":
            v = (a + b) * 0.5
        else:  # nearest, half to even as NumPy
            v = gather(values, d, _index_of(pos.round(), n))
        v = where(last != last, math.nan, v) if count is None else \
            where(count > 0, v, math.nan)
        outs.append(v if keepdim and dim is not None else squeeze(v, d))
    if dim is None and not keepdim:
        outs = [reshape(v, ()) for v in outs]
    if isinstance(q, (int, float, np.floating, np.integer)) or np.ndim(q) == 0:
        return outs[0]
    return stack(outs, 0)


def _index_of(pos: Tensor, n: int) -> Tensor:
    """A float rank as an int64 index in [0, n) (a NaN rank reads index 0)."""
    safe = where(pos != pos, 0.0, pos)
    return to_dtype(safe, dtypes.int64).clamp(0, n - 1)


def logcumsumexp(self: Tensor, dim: int) -> Tensor:
    """``log(cumsum(exp(x)))`` along ``dim``, without overflow."""
    x = as_tensor(self)
    d = _dim(dim, x.ndim, "logcumsumexp") if x.ndim else 0
    if x.ndim == 0:
        return x
    m = amax(x, d, keepdim=True)
    m = where(m.abs() == math.inf, 0.0, m)  # all -inf (or an inf): no shift
    return cumsum((x - m).exp(), d).log() + m


__all__ = ["MinMax", "aminmax", "all", "any", "argsort", "count_nonzero", "kthvalue",
           "logcumsumexp", "median", "nanmean", "nanmedian", "nanquantile", "nansum",
           "quantile", "std_mean", "var_mean"]
