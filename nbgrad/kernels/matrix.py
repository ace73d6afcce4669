"""Natives of the triangle, diagonal and padding ops (``tril``, ``triu``, ``diag``,
``trace``, ``diagonal_backward``, constant ``pad``).

``@njit`` entry points that generated code calls directly (``Opaque.native``) and the
ops' CPU kernels call too, flat (``NativePlan``): flat arrays and the constants of the
op's static (shapes, strides and offsets in elements; tuples padded to at least one
entry), flat results.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .layout import accumulator, as_sum_dtype, broadcast, view3

OPTS = dict(cache=True, nogil=True)


@njit(**OPTS)
def triangle_native(x, diagonal, lower, bnm):
    """``np.tril`` (``lower``) or ``np.triu`` of the last two dims, ``bnm`` = (batch, rows,
    cols)."""
    out = x.copy()
    o = view3(out, bnm)
    for b in range(bnm[0]):
        for i in range(bnm[1]):
            for j in range(bnm[2]):
                if (j > i + diagonal) if lower else (j < i + diagonal):
                    o[b, i, j] = 0
    return out


@njit(**OPTS)
def diag_native(x, diagonal, rows, cols, build):
    """``np.diag``: a 1-D ``x`` (``build``) on the ``diagonal``-th diagonal of a square
    matrix, or that diagonal of ``x`` as a ``rows`` x ``cols`` matrix (a copy); flat."""
    k = diagonal
    if build:
        n = x.size + abs(k)
        out = np.zeros((n, n), x.dtype)
        for i in range(x.size):
            if k >= 0:
                out[i, i + k] = x[i]
            else:
                out[i - k, i] = x[i]
        return out.reshape(-1)
    m = x.reshape((rows, cols))
    count = max(0, min(rows, cols - k)) if k >= 0 else max(0, min(rows + k, cols))
    out = np.empty(count, x.dtype)
    for i in range(count):
        out[i] = m[i, i + k] if k >= 0 else m[i - k, i]
    return out


@njit(**OPTS)
def trace_native(x, rows, cols):
    """The sum of the main diagonal of ``x`` as a ``rows`` x ``cols`` matrix (int64 for
    integers; accumulated in float64 or int64), one value."""
    y = as_sum_dtype(x, None).reshape((rows, cols))
    out = np.empty(1, y.dtype)
    acc = accumulator(out, 1)
    acc[0] = 0
    for i in range(min(rows, cols)):
        acc[0] += y[i, i]
    out[0] = acc[0]
    return out


@njit(**OPTS)
def diagonal_backward_native(g, size, outer, outer_strides, k, r0, c0, s1, s2):
    """``size`` zeros with ``g`` (shape ``outer + (k,)``) written on the diagonal that
    starts at (``r0``, ``c0``) of the planes of strides (``s1``, ``s2``)."""
    out = np.zeros(size, g.dtype)
    count = 1
    for s in outer:
        count *= s
    for p in range(count):
        rem = p
        base = 0
        for d in range(len(outer) - 1, -1, -1):
            base += (rem % outer[d]) * outer_strides[d]
            rem //= outer[d]
        for t in range(k):
            out[base + (r0 + t) * s1 + (c0 + t) * s2] = g[p * k + t]
    return out


@njit(**OPTS)
def pad_native(x, size, extent, src_start, dst_start, src_strides, dst_strides, value):
    """Constant padding: ``size`` values ``value``, then the block ``extent`` of ``x`` from
    ``src_start`` copied to ``dst_start`` (last dim innermost)."""
    out = np.full(size, value, x.dtype)
    nd = len(extent)
    inner = extent[nd - 1]
    count = 1
    for d in range(nd - 1):
        count *= extent[d]
    if inner == 0:
        return out
    for p in range(count):
        rem = p
        src = (src_start[nd - 1]) * src_strides[nd - 1]
        dst = (dst_start[nd - 1]) * dst_strides[nd - 1]
        for d in range(nd - 2, -1, -1):
            i = rem % extent[d]
            rem //= extent[d]
            src += (i + src_start[d]) * src_strides[d]
            dst += (i + dst_start[d]) * dst_strides[d]
        for j in range(inner):
            out[dst + j] = x[src + j]
    return out


# ------------------------------------------------------------------ clamp with tensor bounds
@njit(**OPTS)
def _bound(out, b, b_shape, shape, upper):
    """``out`` clamped in place by ``b`` (of ``b_shape``) broadcast to ``shape`` (from
    above when ``upper``); nothing when ``b`` is empty (absent). NaN in ``out`` stays (as
    maximum/minimum)."""
    if b.size == 0:
        return
    bf = broadcast(b.astype(out.dtype), b_shape, shape)
    for i in range(out.size):
        a = out[i]
        if upper:
            out[i] = a if (a < bf[i] or a != a) else bf[i]
        else:
            out[i] = a if (a > bf[i] or a != a) else bf[i]


@njit(**OPTS)
def clamp_native(x, lo, hi, x_shape, lo_shape, hi_shape, shape):
    """``minimum(maximum(x, lo), hi)`` broadcast to ``shape``; an absent bound is empty."""
    out = broadcast(x, x_shape, shape).copy()
    _bound(out, lo, lo_shape, shape, False)
    _bound(out, hi, hi_shape, shape, True)
    return out
