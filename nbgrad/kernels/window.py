"""Windows at run-time positions (``dynamic_slice``, ``dynamic_update_slice``).

A window of ``sizes`` starts at ``starts`` (one int per dimension, a run-time value);
as in ``jax.lax``, a negative start counts from the end (once), then each start is
clamped to ``[0, shape[d] - sizes[d]]`` so that the window always lies inside the
array: nothing is ever read or written out of bounds.
The natives take flat arrays and the shapes as int64 arrays (see
:class:`~nbgrad.ops.traits.NativePlan`), so each compiles once per dtype.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .layout import c_strides

OPTS = dict(cache=True, nogil=True)


@njit(**OPTS)
def clamped_starts(starts, shape, sizes):
    """``starts`` (a negative one counting from the end, once) clamped so that a window
    of ``sizes`` fits in ``shape``."""
    out = np.zeros(shape.size, np.int64)
    for d in range(shape.size):
        s = np.int64(starts[d])
        if s < 0:
            s += shape[d]
        hi = shape[d] - sizes[d]
        if s > hi:
            s = hi
        if s < 0:
            s = 0
        out[d] = s
    return out


@njit(**OPTS)
def window_offsets(starts, shape, sizes):
    """The flat offsets in an array of ``shape`` of the window's elements, in C order."""
    st = clamped_starts(starts, shape, sizes)
    strides = c_strides(shape)
    n = 1
    for d in range(sizes.size):
        n *= sizes[d]
    out = np.empty(n, np.int64)
    nd = sizes.size
    idx = np.zeros(nd, np.int64)
    base = 0
    for d in range(nd):
        base += st[d] * strides[d]
    off = base
    for p in range(n):
        out[p] = off
        d = nd - 1
        while d >= 0:
            idx[d] += 1
            off += strides[d]
            if idx[d] < sizes[d]:
                break
            off -= strides[d] * sizes[d]
            idx[d] = 0
            d -= 1
    return out


@njit(**OPTS)
def dynamic_slice_native(x, starts, shape, sizes):
    """The window of ``sizes`` of ``x`` (of ``shape``) at the clamped ``starts``."""
    offs = window_offsets(starts, shape, sizes)
    out = np.empty(offs.size, x.dtype)
    for p in range(offs.size):
        out[p] = x[offs[p]]
    return out


@njit(**OPTS)
def dynamic_slice_backward_native(g, starts, shape, sizes):
    """Zeros of ``shape`` with ``g`` (of ``sizes``) written at the clamped ``starts``."""
    n = 1
    for d in range(shape.size):
        n *= shape[d]
    out = np.zeros(n, g.dtype)
    offs = window_offsets(starts, shape, sizes)
    for p in range(offs.size):
        out[offs[p]] = g[p]
    return out


@njit(**OPTS)
def dynamic_update_slice_native(x, update, starts, shape, sizes):
    """A copy of ``x`` (of ``shape``) with ``update`` (of ``sizes``) written at the
    clamped ``starts``."""
    out = x.copy()
    offs = window_offsets(starts, shape, sizes)
    for p in range(offs.size):
        out[offs[p]] = update[p]
    return out
