"""Indexing and selection functions written over table ops: ``index_add``,
``index_copy``, ``index_fill`` (differentiable through ``index_put``),
``masked_select``, comparisons (``isclose``, ``allclose``, ``equal``), and the
data-dependent ones (``nonzero``, ``argwhere``, ``unique``, ``searchsorted``,
``bucketize``, ``isin``), which read values: they are not differentiable, and inside
``nbgrad.jit`` they raise, as the size of their result is not known when tracing."""

from __future__ import annotations

import numpy as np

from ..factories import arange
from ..tensor import Tensor
from .arrange import movedim
from .dispatch import as_tensor, promote_operands
from .elementwise import where
from .indexing import index_put, scatter_add
from .reduction import amax, amin, prod
from .shape import _dim, broadcast_tensors, cat, ones_like, pad, reshape, unsqueeze
from .statistics import any as any_

__all__ = ["allclose", "argwhere", "bincount", "bucketize", "equal", "histc", "index_add",
           "index_copy", "index_fill", "isclose", "isin", "masked_scatter", "masked_select",
           "nonzero", "nonzero_static", "put", "scatter_reduce", "searchsorted", "unique",
           "unique_consecutive"]


def _along(op: str, self, dim: int, index) -> tuple[Tensor, int, Tensor, bool]:
    x = as_tensor(self)
    scalar = x.ndim == 0
    if scalar:
        x = reshape(x, (1,))
    d = _dim(dim, x.ndim, op)
    idx = as_tensor(index)
    if idx.ndim > 1 or idx.dtype.kind not in "iu":
        raise RuntimeError(f"{op}: index must be a 1-D integer tensor, got {idx.dtype} of "
                           f"shape {tuple(idx.shape)}")
    return x, d, reshape(idx, (-1,)), scalar


def _put(op: str, self, dim: int, index, values, accumulate: bool) -> Tensor:
    x, d, idx, scalar = _along(op, self, dim, index)
    v = as_tensor(values)
    if v.ndim == 0 or scalar:
        v = reshape(v, (-1,) if scalar else v.shape)
    if v.ndim:
        v = movedim(v, d, 0) if v.ndim == x.ndim else v
    out = movedim(index_put(movedim(x, d, 0), (idx,), v, accumulate), 0, d)
    return reshape(out, ()) if scalar else out


def index_add(self: Tensor, dim: int, index: Tensor, source: Tensor, *,
              alpha: float = 1) -> Tensor:
    """``self`` with ``alpha * source`` added at ``index`` along ``dim`` (repeated
    indices accumulate)."""
    src = as_tensor(source)
    return _put("index_add", self, dim, index, src if alpha == 1 else src * alpha, True)


def index_copy(self: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    """``self`` with the slices of ``source`` written at ``index`` along ``dim``."""
    return _put("index_copy", self, dim, index, source, False)


def index_fill(self: Tensor, dim: int, index: Tensor, value) -> Tensor:
    """``self`` with the slices at ``index`` along ``dim`` set to ``value``."""
    x = as_tensor(self)
    v = as_tensor(value).to(x.dtype) if isinstance(value, Tensor) else as_tensor(
        np.asarray(value, x.dtype))
    if v.ndim:
        raise RuntimeError(f"index_fill: value must be a number or a 0-d tensor, got shape "
                           f"{tuple(v.shape)}")
    # each slice is filled once however often its index repeats (value's gradient counts it
    # once)
    index = as_tensor(np.unique(_values("index_fill", index)).astype(np.int64))
    return _put("index_fill", x, dim, index, v, False)


def masked_select(self: Tensor, mask: Tensor) -> Tensor:
    """The entries where ``mask`` (broadcast with ``self``) is True, as a 1-D tensor."""
    x, m = broadcast_tensors(as_tensor(self), as_tensor(mask))
    if m.dtype != np.bool_:
        raise TypeError(f"masked_select: mask must be a bool tensor, got {m.dtype}")
    return x[m]


def put(self: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """``self`` (as if flattened) with ``source`` written (or added) at ``index``."""
    x = as_tensor(self)
    idx = reshape(as_tensor(index), (-1,))
    flat = index_put(reshape(x, (-1,)), (idx,), reshape(as_tensor(source), (-1,)),
                     accumulate)
    return reshape(flat, tuple(x.shape))


def masked_scatter(self: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """``self`` with the entries where ``mask`` (broadcast) is True replaced, in order,
    by the first entries of ``source``."""
    x, m = broadcast_tensors(as_tensor(self), as_tensor(mask))
    where_true = np.flatnonzero(_values("masked_scatter", m))
    src = reshape(as_tensor(source), (-1,))
    if where_true.size > src.shape[0]:
        raise RuntimeError(f"masked_scatter: the mask selects {where_true.size} entries but "
                           f"source has {src.shape[0]}")
    taken = src[as_tensor(np.arange(where_true.size))]
    flat = index_put(reshape(x.clone(), (-1,)), (as_tensor(where_true.astype(np.int64)),),
                     taken)
    return reshape(flat, tuple(x.shape))


def _scatter_candidates(op: str, x: Tensor, d: int, idx: Tensor, s: Tensor, reduce: str,
                        include_self: bool) -> Tensor:
    """``'prod'``, ``'amax'``, ``'amin'`` of :func:`scatter_reduce` over the block of ``x``
    that ``idx`` covers: with ``dim`` last, the ``(..., N, K)`` candidates ``src[..., k]``
    where ``idx[..., k] == n`` (the reduction's identity elsewhere), and ``x`` itself as one
    more with ``include_self``, reduced over the last dim by ``prod``/``amax``/``amin``
    (whose gradients are PyTorch's: exact with zeros, ties share evenly)."""
    block = tuple(slice(0, idx.shape[i]) if i != d else slice(None) for i in range(x.ndim))
    xb = x[block]
    sb = s[tuple(slice(0, n) for n in idx.shape)]
    # scatter_add's kernel checks the indices (also under nbgrad.jit): a zero, kept in
    guard = scatter_add(xb.detach() * 0, d, idx, sb.detach() * 0)
    xm, im, sm = (movedim(t, d, -1) for t in (xb, idx, sb))
    n = xm.shape[-1]
    hit = unsqueeze(im, -2) == reshape(arange(n), (n, 1))              # (..., N, K)
    neutral = {"prod": 1.0, "amax": -np.inf, "amin": np.inf}[reduce]
    cand = where(hit, unsqueeze(sm, -2), neutral)
    if include_self:
        cand = cat([cand, unsqueeze(xm, -1)], -1)
    fold = {"prod": prod, "amax": amax, "amin": amin}[reduce]
    out = fold(cand, -1) if cand.shape[-1] else xm
    if not include_self:
        out = where(any_(hit, -1), out, xm)
    out = movedim(out, -1, d) + guard
    if tuple(out.shape) == tuple(x.shape):
        return out
    widths = [w for i in reversed(range(x.ndim)) for w in (0, x.shape[i] - out.shape[i])]
    return where(pad(ones_like(out), widths) > 0, pad(out, widths), x)


def scatter_reduce(self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    """``self`` with ``src``'s entries reduced into the positions ``index`` names along
    ``dim`` (as :func:`scatter_add`): ``reduce`` is ``'sum'``, ``'mean'`` (the mean of the
    entries sent there, and of ``self``'s own value with ``include_self``), ``'prod'``,
    ``'amax'`` or ``'amin'``; positions nothing is sent to keep ``self``'s value. Gradients
    are PyTorch's (``amax``/``amin``: shared evenly by the tied entries, ``self``'s
    included; with ``include_self=False`` a ``self`` equal to the result does not take a
    share, where PyTorch still counts it; ``prod``: exact with zeros). ``prod``,
    ``amax`` and ``amin`` compare every source entry with every position of its line
    (memory ``src.numel() * self.shape[dim]``)."""
    if reduce not in ("sum", "mean", "prod", "amax", "amin"):
        raise RuntimeError(f"scatter_reduce: reduce must be 'sum', 'prod', 'mean', 'amax' or "
                           f"'amin', got {reduce!r}")
    x, s = promote_operands(self, src)
    idx = as_tensor(index)
    if reduce in ("prod", "amax", "amin"):
        if idx.dtype.kind not in "iu" or idx.ndim != x.ndim or s.ndim != x.ndim or any(
                idx.shape[i] > s.shape[i] or (i != _dim(dim, x.ndim, "scatter_reduce")
                                              and idx.shape[i] > x.shape[i])
                for i in range(idx.ndim)):
            raise RuntimeError(f"scatter_reduce: index ({idx.dtype}, shape "
                               f"{tuple(idx.shape)}) must be an integer tensor of the rank of "
                               f"self {tuple(x.shape)} and src {tuple(s.shape)}, no larger "
                               "than src, nor than self outside dim")
        return _scatter_candidates("scatter_reduce", x, _dim(dim, x.ndim, "scatter_reduce"),
                                   idx, s, reduce, include_self)
    zeros = x * 0.0
    total = scatter_add(zeros, dim, idx, s)
    count = scatter_add(zeros.detach(), dim, idx, (s * 0.0 + 1.0).detach())
    hit = count > 0
    if reduce == "sum":
        return total + (x if include_self else where(hit, 0.0, x))
    if include_self:
        return (total + x) / (count + 1.0)
    return where(hit, total / where(hit, count, 1.0), x)


def isclose(self: Tensor, other: Tensor, rtol: float = 1e-5, atol: float = 1e-8,
            equal_nan: bool = False) -> Tensor:
    """``|self - other| <= atol + rtol * |other|`` (equal infinities match; NaNs match
    each other with ``equal_nan``)."""
    a, b = promote_operands(self, other)
    if a.dtype.kind in "biu" and b.dtype.kind in "biu":
        close = (a - b).abs() <= atol + rtol * b.abs() if a.dtype != np.bool_ else a == b
        return close | (a == b)
    finite = (a - b).abs() <= atol + rtol * b.abs()
    out = (a == b) | (finite & a.isfinite() & b.isfinite())
    if equal_nan:
        out = out | (a.isnan() & b.isnan())
    return out


def allclose(self: Tensor, other: Tensor, rtol: float = 1e-5, atol: float = 1e-8,
             equal_nan: bool = False) -> bool:
    return bool(isclose(self, other, rtol, atol, equal_nan).all())


def equal(self: Tensor, other: Tensor) -> bool:
    """Whether both have one shape and equal entries."""
    a, b = as_tensor(self), as_tensor(other)
    return a.shape == b.shape and bool((a == b).all())


# ------------------------------------------------------------------ data-dependent
def _values(op: str, t) -> np.ndarray:
    return np.asarray(as_tensor(t).detach())  # raises inside nbgrad.jit (shape unknown)


def nonzero(self: Tensor, *, as_tuple: bool = False):
    """The indices of the nonzero entries: an (n, ndim) int64 tensor, or one 1-D tensor
    per dimension with ``as_tuple``."""
    values = _values("nonzero", self)
    if values.ndim == 0:  # one entry with no index dimensions (as torch)
        hit = int(bool(values))
        if as_tuple:
            return (as_tensor(np.zeros(hit, np.int64)),)
        return as_tensor(np.zeros((hit, 0), np.int64))
    found = np.nonzero(values)
    if as_tuple:
        return tuple(as_tensor(i.astype(np.int64)) for i in found)
    return as_tensor(np.stack(found, 1).astype(np.int64).reshape(-1, len(found)))


def argwhere(self: Tensor) -> Tensor:
    return nonzero(self)


def nonzero_static(self: Tensor, *, size: int, fill_value: int = -1) -> Tensor:
    """:func:`nonzero`'s first ``size`` rows, padded with ``fill_value`` to ``size``."""
    found = nonzero(self).numpy()[:size]
    out = np.full((size, found.shape[1]), fill_value, np.int64)
    out[:found.shape[0]] = found
    return as_tensor(out)


def unique_consecutive(self: Tensor, return_inverse: bool = False,
                       return_counts: bool = False, dim: int | None = None):
    """Each run of equal consecutive entries (slices along ``dim``) once."""
    x = _values("unique_consecutive", self)
    d = None if dim is None else _dim(dim, x.ndim, "unique_consecutive")
    lines = x.reshape(-1) if d is None else np.moveaxis(x, d, 0)
    if lines.shape[0] == 0:
        starts = np.zeros(0, np.int64)
    else:
        flat = lines.reshape(lines.shape[0], -1)
        change = np.any(flat[1:] != flat[:-1], axis=1) if flat.shape[1] else \
            np.zeros(flat.shape[0] - 1, bool)
        starts = np.concatenate([[0], np.flatnonzero(change) + 1])
    values = lines[starts]
    results = [as_tensor(values if d is None else np.moveaxis(values, 0, d))]
    if return_inverse:
        inverse = np.cumsum(np.isin(np.arange(lines.shape[0]), starts)) - 1
        results.append(as_tensor(inverse.reshape(x.shape if d is None else (-1,))
                                 .astype(np.int64)))
    if return_counts:
        results.append(as_tensor(np.diff(np.append(starts, lines.shape[0])).astype(np.int64)))
    return results[0] if len(results) == 1 else tuple(results)


def bincount(self: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """How often each non-negative integer occurs (summing ``weights`` if given)."""
    x = _values("bincount", self)
    w = None if weights is None else _values("bincount", weights)
    if x.ndim != 1 or (x.size and x.min() < 0) or x.dtype.kind not in "iu":
        raise RuntimeError(f"bincount: expects a 1-D tensor of non-negative integers, got "
                           f"{x.dtype} of shape {x.shape}")
    out = np.bincount(x, w, minlength)
    return as_tensor(out if w is not None else out.astype(np.int64))


def histc(self: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
    """A histogram of ``bins`` equal bins over [min, max] (the data's range when both
    are 0); values outside are ignored."""
    x = _values("histc", self).astype(np.float64).reshape(-1)
    lo, hi = float(min), float(max)
    if lo == hi:
        lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts, _ = np.histogram(x[(x >= lo) & (x <= hi)], int(bins), (lo, hi))
    return as_tensor(counts.astype(as_tensor(self).dtype))


def unique(self: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim: int | None = None):
    """The distinct entries (or slices along ``dim``), sorted; with their inverse
    indices and counts when asked."""
    x = _values("unique", self)
    out = np.unique(x, return_inverse=True, return_counts=True,
                    axis=None if dim is None else _dim(dim, x.ndim, "unique"))
    values, inverse, counts = out
    results = [as_tensor(values)]
    if return_inverse:
        results.append(as_tensor(inverse.reshape(x.shape if dim is None else (-1,))
                                 .astype(np.int64)))
    if return_counts:
        results.append(as_tensor(counts.astype(np.int64)))
    return results[0] if len(results) == 1 else tuple(results)


def searchsorted(sorted_sequence: Tensor, input, *, out_int32: bool = False,  # noqa: A002
                 right: bool = False, side: str | None = None, sorter=None) -> Tensor:
    """Where ``input``'s values would go in ``sorted_sequence`` (its last dimension,
    row by row for a stack) to keep it sorted."""
    seq = _values("searchsorted", sorted_sequence)
    vals = _values("searchsorted", input)
    if side is not None:
        if side not in ("left", "right") or (right and side == "left"):
            raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
        right = side == "right"
    if sorter is not None:
        seq = np.take_along_axis(seq, _values("searchsorted", sorter), -1)
    how = "right" if right else "left"
    if seq.ndim <= 1:
        out = np.searchsorted(seq, vals, side=how)
    else:
        if seq.shape[:-1] != vals.shape[:-1]:
            raise RuntimeError(f"searchsorted: leading dims of sorted_sequence "
                               f"{seq.shape} and input {vals.shape} differ")
        flat_s, flat_v = seq.reshape(-1, seq.shape[-1]), vals.reshape(-1, vals.shape[-1])
        out = np.stack([np.searchsorted(s, v, side=how) for s, v in
                        zip(flat_s, flat_v, strict=True)]).reshape(vals.shape)
    return as_tensor(np.asarray(out, np.int32 if out_int32 else np.int64))


def bucketize(input: Tensor, boundaries: Tensor, *, out_int32: bool = False,  # noqa: A002
              right: bool = False) -> Tensor:
    """The bucket of each value among the 1-D sorted ``boundaries``."""
    return searchsorted(boundaries, input, out_int32=out_int32, right=right)


def isin(elements, test_elements, *, assume_unique: bool = False,
         invert: bool = False) -> Tensor:
    """Whether each of ``elements`` is among ``test_elements``."""
    return as_tensor(np.isin(_values("isin", elements), _values("isin", test_elements),
                             invert=invert))

