"""Natives of the triangle, diagonal and padding ops (``tril``, ``triu``, ``diag``,
``trace``, ``diagonal_backward``, constant ``pad``).

``@njit`` entry points that generated code calls directly (``Opaque.native``) and the
ops' CPU kernels call too: C-contiguous arrays and the constants of the op's static
(shapes, strides and offsets in elements; tuples padded to at least one entry).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from .layout import accumulator, as_sum_dtype

OPTS = dict(cache=True, nogil=True)


@njit(**OPTS)
def triangle_native(x, diagonal, lower, bnm):
    """``np.tril`` (``lower``) or ``np.triu`` of the last two dims, ``bnm`` = (batch, rows,
    cols)."""
    out = x.copy()
    o = out.reshape(bnm)
    for b in range(bnm[0]):
        for i in range(bnm[1]):
            for j in range(bnm[2]):
                if (j > i + diagonal) if lower else (j < i + diagonal):
                    o[b, i, j] = 0
    return out


def _diag(x, k):
    """np.diag of a 1-D or 2-D array."""


@overload(_diag)
def _diag_impl(x, k):
    if x.ndim == 1:
        def build(x, k):
            n = x.size + abs(k)
            out = np.zeros((n, n), x.dtype)
            for i in range(x.size):
                if k >= 0:
                    out[i, i + k] = x[i]
                else:
                    out[i - k, i] = x[i]
            return out
        return build

    def extract(x, k):
        n, m = x.shape
        count = max(0, min(n, m - k)) if k >= 0 else max(0, min(n + k, m))
        out = np.empty(count, x.dtype)
        for i in range(count):
            out[i] = x[i, i + k] if k >= 0 else x[i - k, i]
        return out
    return extract


@njit(**OPTS)
def diag_native(x, diagonal):
    """``np.diag``: a 1-D ``x`` on the ``diagonal``-th diagonal of a square matrix, or that
    diagonal of a 2-D ``x`` (a copy)."""
    return _diag(x, diagonal)


@njit(**OPTS)
def trace_native(x):
    """The sum of the main diagonal of a 2-D ``x`` (int64 for integers; accumulated in
    float64 or int64), as a 0-d array."""
    y = as_sum_dtype(x, None)
    out = np.empty(1, y.dtype)
    acc = accumulator(out, 1)
    acc[0] = 0
    for i in range(min(x.shape[0], x.shape[1])):
        acc[0] += y[i, i]
    out[0] = acc[0]
    return out.reshape(())


@njit(**OPTS)
def diagonal_backward_native(g, sizes, outer, outer_strides, k, r0, c0, s1, s2):
    """Zeros of shape ``sizes`` with ``g`` (shape ``outer + (k,)``) written on the diagonal
    that starts at (``r0``, ``c0``) of the planes of strides (``s1``, ``s2``)."""
    out = np.zeros(sizes, g.dtype)
    of = out.reshape(-1)
    gf = g.reshape(-1)
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
            of[base + (r0 + t) * s1 + (c0 + t) * s2] = gf[p * k + t]
    return out


@njit(**OPTS)
def pad_native(x, out_shape, extent, src_start, dst_start, src_strides, dst_strides, value):
    """Constant padding: ``value`` everywhere, then the block ``extent`` of ``x`` from
    ``src_start`` copied to ``dst_start`` (last dim innermost)."""
    out = np.full(out_shape, value, x.dtype)
    of = out.reshape(-1)
    xf = x.reshape(-1)
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
            of[dst + j] = xf[src + j]
    return out



# ------------------------------------------------------------------ clamp with tensor bounds
def _bound(out, b, shape, upper):
    """``out`` clamped in place by ``b`` broadcast to ``shape`` (from above when
    ``upper``); nothing when ``b`` is None. NaN in ``out`` stays (as maximum/minimum)."""


@overload(_bound)
def _bound_impl(out, b, shape, upper):
    if b is None or isinstance(b, types.NoneType):
        return lambda out, b, shape, upper: None

    def clamp(out, b, shape, upper):
        bf = np.ascontiguousarray(np.broadcast_to(b.astype(out.dtype), shape)).reshape(-1)
        for i in range(out.size):
            a = out[i]
            if upper:
                out[i] = a if (a < bf[i] or a != a) else bf[i]
            else:
                out[i] = a if (a > bf[i] or a != a) else bf[i]
    return clamp


@njit(**OPTS)
def clamp_native(x, lo, hi, shape):
    """``minimum(maximum(x, lo), hi)`` broadcast to ``shape``; an absent bound is None."""
    out = np.ascontiguousarray(np.broadcast_to(x, shape)).reshape(-1).copy()
    _bound(out, lo, shape, False)
    _bound(out, hi, shape, True)
    return out.reshape(shape)
