"""Scatter kernels: gradients of indexing accumulate over repeated indices."""

from __future__ import annotations

import numpy as np
from numba import njit

from .layout import broadcast, check_index, view3

OPTS = dict(cache=True, nogil=True)


@njit(**OPTS)
def scatter_add_flat(out, positions, values):
    """``out[positions[i]] += values[i]`` for every i (repeats add up)."""
    for i in range(positions.size):
        out[positions[i]] += values[i]


@njit(**OPTS)
def gather_flat(src, positions, out):
    for i in range(positions.size):
        out[i] = src[positions[i]]


# ------------------------------------------------------------------ along one dimension
# Arrays are C-contiguous (A, N, B) views: A = the dimensions before ``dim``, N = ``dim``,
# B = the dimensions after it. Indices are int64 and already checked to be in range.
@njit(**OPTS)
def gather_dim(src, idx, out):
    """``out[a, m, b] = src[a, idx[a, m, b], b]`` (torch's ``gather``)."""
    for a in range(idx.shape[0]):
        s = src[a]
        for m in range(idx.shape[1]):
            irow = idx[a, m]
            orow = out[a, m]
            for b in range(idx.shape[2]):
                orow[b] = s[irow[b], b]


@njit(**OPTS)
def scatter_dim(out, idx, src, accumulate):
    """``out[a, idx[a, m, b], b] = src[a, m, b]`` (``+=`` when ``accumulate``: repeats add)."""
    for a in range(idx.shape[0]):
        o = out[a]
        for m in range(idx.shape[1]):
            irow = idx[a, m]
            srow = src[a, m]
            if accumulate:
                for b in range(idx.shape[2]):
                    o[irow[b], b] += srow[b]
            else:
                for b in range(idx.shape[2]):
                    o[irow[b], b] = srow[b]


@njit(**OPTS)
def index_select_dim(src, idx, out):
    """``out[a, m, :] = src[a, idx[m], :]`` (``index_select``)."""
    for a in range(src.shape[0]):
        for m in range(idx.size):
            out[a, m, :] = src[a, idx[m], :]


@njit(**OPTS)
def index_add_dim(out, idx, src):
    """``out[a, idx[m], :] += src[a, m, :]`` (repeats add up)."""
    for a in range(src.shape[0]):
        for m in range(idx.size):
            orow = out[a, idx[m]]
            srow = src[a, m]
            for b in range(srow.size):
                orow[b] += srow[b]


@njit(**OPTS)
def masked_fill_flat(out, mask, value):
    """``out[i] = value`` where ``mask[i]``."""
    for i in range(out.size):
        if mask[i]:
            out[i] = value


# ------------------------------------------------------------------ natives
# ``@njit`` entry points that generated code calls directly (``Opaque.native``) and the
# ops' CPU kernels call too. ``where = (prefix, suffix)`` of the IndexError message of
# an index out of range; ``x3``, ``i3``: (A, N, B) sizes of an array and of the index
# around ``dim`` (see above); ``ishape``, ``strides``: the index's shape and the
# element strides of the indexed array, both at least 1-D, for an index that covers
# only part of the array's other dimensions (``full`` False).
@njit(**OPTS)
def _offset(p, pos, ishape, strides, dim):
    """The flat offset in the indexed array of entry ``p`` of the index (value ``pos``)."""
    off = 0
    rem = p
    for k in range(len(ishape) - 1, -1, -1):
        i = rem % ishape[k]
        rem //= ishape[k]
        off += (pos if k == dim else i) * strides[k]
    return off


@njit(**OPTS)
def gather_native(x, index, dim, n, full, x3, i3, ishape, strides, prefix, suffix):
    """``torch.gather``: ``out[..., m, ...] = x[..., index[..., m, ...], ...]`` along ``dim``
    (of size ``n``); the output has the index's shape."""
    idx = index.astype(np.int64)
    check_index(idx, 0, n, prefix, suffix)
    out = np.empty(idx.size, x.dtype)
    if full:
        gather_dim(view3(x, x3), view3(idx, i3), view3(out, i3))
    else:
        for p in range(idx.size):
            out[p] = x[_offset(p, idx[p], ishape, strides, dim)]
    return out


@njit(**OPTS)
def _scatter_into(out, index, src, dim, n, full, x3, i3, ishape, strides, accumulate,
                  prefix, suffix):
    idx = index.astype(np.int64)
    check_index(idx, 0, n, prefix, suffix)
    s = src.astype(out.dtype)
    if s.size != idx.size:  # a 0-d src goes everywhere
        s = np.full(idx.size, s[0], out.dtype)
    if full:
        scatter_dim(view3(out, x3), view3(idx, i3), view3(s, i3), accumulate)
        return
    for p in range(idx.size):
        off = _offset(p, idx[p], ishape, strides, dim)
        if accumulate:
            out[off] += s[p]
        else:
            out[off] = s[p]


@njit(**OPTS)
def scatter_native(x, index, src, dim, n, full, x3, i3, ishape, strides, accumulate,
                   prefix, suffix):
    """A copy of ``x`` with ``src`` written (added when ``accumulate``) at ``index``."""
    out = x.copy()
    _scatter_into(out, index, src, dim, n, full, x3, i3, ishape, strides, accumulate,
                  prefix, suffix)
    return out


@njit(**OPTS)
def gather_backward_native(g, index, size, dim, n, full, x3, i3, ishape, strides, prefix,
                           suffix):
    """``size`` zeros with ``g`` added at ``index`` along ``dim``."""
    out = np.zeros(size, g.dtype)
    _scatter_into(out, index, g, dim, n, full, x3, i3, ishape, strides, True, prefix, suffix)
    return out


@njit(**OPTS)
def index_select_native(x, index, x3, prefix, suffix):
    """The entries at positions ``index`` along the middle axis of ``x`` as (A, N, B)."""
    idx = index.astype(np.int64)
    check_index(idx, 0, x3[1], prefix, suffix)
    out = np.empty((x3[0], idx.size, x3[2]), x.dtype)
    index_select_dim(view3(x, x3), idx, out)
    return out.reshape(-1)


@njit(**OPTS)
def index_select_backward_native(g, index, x3, prefix, suffix):
    """Zeros of the (A, N, B) ``x3`` with ``g`` added at positions ``index`` of N."""
    idx = index.astype(np.int64)
    check_index(idx, 0, x3[1], prefix, suffix)
    out = np.zeros(x3[0] * x3[1] * x3[2], g.dtype)
    index_add_dim(view3(out, x3), idx, g.reshape((x3[0], idx.size, x3[2])))
    return out


@njit(**OPTS)
def _flat_positions(index, n, prefix, suffix):
    pos = index.astype(np.int64)
    check_index(pos, -n, n, prefix, suffix)
    for i in range(pos.size):
        if pos[i] < 0:
            pos[i] += n
    return pos


@njit(**OPTS)
def take_native(x, index, prefix, suffix):
    """The entries of the flattened ``x`` at ``index`` (negatives count from the end)."""
    pos = _flat_positions(index, x.size, prefix, suffix)
    out = np.empty(pos.size, x.dtype)
    gather_flat(x, pos, out)
    return out


@njit(**OPTS)
def take_backward_native(g, index, size, prefix, suffix):
    """``size`` zeros with ``g`` added at the flat positions ``index``."""
    out = np.zeros(size, g.dtype)
    pos = _flat_positions(index, out.size, prefix, suffix)
    scatter_add_flat(out, pos, g)
    return out


@njit(**OPTS)
def masked_fill_native(x, mask, value, mask_shape, shape):
    """A copy of ``x`` (of ``shape``) with the 0-d ``value`` where ``mask`` (of
    ``mask_shape``, broadcast to ``shape``) is true."""
    out = x.copy()
    masked_fill_flat(out, broadcast(mask, mask_shape, shape), value[0])
    return out
