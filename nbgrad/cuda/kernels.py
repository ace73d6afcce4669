"""Hand-written CUDA kernels: strided copies, fills, gathers, scatters, reductions, matmul.

Every operand is a flat device buffer read through ``(offset, shape, strides)``
(strides in elements, shapes and strides as tuples): views need no copies. Launches
are grid-stride loops, so any grid size is correct (the simulator uses a tiny one).
Elementwise arithmetic is generated from the scalar expressions instead
(:mod:`nbgrad.cuda.elementwise`).
"""

from __future__ import annotations

import math

from numba import cuda, float64
from numba.cuda.core import config as _cuda_config

from .. import cache_guard

cache_guard.install()  # numba-cuda's cache files are pickles: safe folders only

_SIM = bool(_cuda_config.ENABLE_CUDASIM)
#: threads per block of the reduction kernels (a power of two)
RTPB = 32 if _SIM else 256
#: side of a matmul tile (blocks are TILE x TILE threads)
TILE = 4 if _SIM else 16

SUM, PROD, MAX, MIN = 0, 1, 2, 3


@cuda.jit(device=True)
def offset_of(i, shape, strides, offset):
    """Memory offset of logical (C-order) element ``i`` of a strided view."""
    off = offset
    for d in range(len(shape) - 1, -1, -1):
        s = shape[d]
        off += (i % s) * strides[d]
        i //= s
    return off


@cuda.jit(cache=True)
def fill(out, n, value):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        out[i] = value
        i += step


@cuda.jit(cache=True)
def copy_strided(dst, do, ds, src, so, ss, shape, n):
    """``dst[...] = src[...]`` over ``shape`` (dtype conversion by assignment)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        dst[offset_of(i, shape, ds, do)] = src[offset_of(i, shape, ss, so)]
        i += step


@cuda.jit(cache=True)
def gather(out, n, pos, src, so, shape, strides, total):
    """``out[i] = src[pos[i]]``; ``pos`` are logical element numbers of ``src`` (negative
    ones count from ``total``, the element count)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        p = pos[i]
        if p < 0:
            p += total
        out[i] = src[offset_of(p, shape, strides, so)]
        i += step


@cuda.jit(cache=True)
def scatter_add(out, n, pos, vals, vo, shape, strides, total):
    """``out[pos[i]] += vals[i]`` with atomics (repeated positions add up; negative
    positions count from ``total``)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        p = pos[i]
        if p < 0:
            p += total
        cuda.atomic.add(out, p, vals[offset_of(i, shape, strides, vo)])
        i += step


@cuda.jit(cache=True)
def scatter_set(out, n, pos, vals, vo, shape, strides, total):
    """``out[pos[i]] = vals[i]`` (repeated positions: one of them wins)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        p = pos[i]
        if p < 0:
            p += total
        out[p] = vals[offset_of(i, shape, strides, vo)]
        i += step


@cuda.jit(cache=True)
def gather_dim(out, n, shape, idx, io, istrides, src, so, sstrides, dim):
    """torch's ``gather``: ``out[e] = src[e with its coordinate along dim = idx[e]]``,
    ``e`` running over the index's shape (``out`` is C-contiguous in that shape)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        e = i
        ioff = io
        soff = so
        for d in range(len(shape) - 1, -1, -1):
            s = shape[d]
            c = e % s
            e //= s
            ioff += c * istrides[d]
            if d != dim:
                soff += c * sstrides[d]
        out[i] = src[soff + idx[ioff] * sstrides[dim]]
        i += step


@cuda.jit(cache=True)
def scatter_dim(out, n, shape, idx, io, istrides, src, so, sstrides, ostrides, dim, skip,
                accumulate):
    """``out[e with its coordinate along dim = idx[e]] (+)= src[e]`` over the index's
    shape; indices equal to ``skip`` are left out; additions are atomic."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        e = i
        ioff = io
        soff = so
        ooff = 0
        for d in range(len(shape) - 1, -1, -1):
            s = shape[d]
            c = e % s
            e //= s
            ioff += c * istrides[d]
            soff += c * sstrides[d]
            if d != dim:
                ooff += c * ostrides[d]
        t = idx[ioff]
        if t != skip:
            if accumulate:
                cuda.atomic.add(out, ooff + t * ostrides[dim], src[soff])
            else:
                out[ooff + t * ostrides[dim]] = src[soff]
        i += step


@cuda.jit(cache=True)
def triangle(out, n, shape, x, xo, strides, diagonal, lower):
    """``out`` (C-contiguous) = ``x`` on and below (``lower``) or on and above the
    ``diagonal``-th diagonal of the last two dimensions, zero elsewhere."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    nd = len(shape)
    while i < n:
        col = i % shape[nd - 1]
        row = (i // shape[nd - 1]) % shape[nd - 2]
        keep = col - row <= diagonal if lower else col - row >= diagonal
        out[i] = x[offset_of(i, shape, strides, xo)] if keep else 0
        i += step


# ---------------------------------------------------------------------- reductions
@cuda.jit(device=True)
def _identity(op):
    if op == SUM:
        return 0.0
    if op == PROD:
        return 1.0
    if op == MAX:
        return -math.inf
    return math.inf


@cuda.jit(device=True)
def _combine(op, a, b):
    if op == SUM:
        return a + b
    if op == PROD:
        return a * b
    if op == MAX:
        return a if (a > b or a != a) else b  # NaN propagates
    return a if (a < b or a != a) else b


@cuda.jit(cache=True)
def reduce_rows_block(out, x, xo, shape, strides, M, R, op, div):
    """Reduce each row of the logical (M, R) view ``x``: a tree in shared memory.

    Block (o, s) of a (., S) grid combines elements ``s*RTPB + tid + k*S*RTPB`` of row
    ``o`` and writes ``out[o*S + s]`` (divided by ``div``): with S > 1 the partial
    results are reduced again by a second launch.
    """
    acc_buf = cuda.shared.array(RTPB, float64)
    tid = cuda.threadIdx.x
    nsplit = cuda.gridDim.y
    s = cuda.blockIdx.y
    o = cuda.blockIdx.x
    while o < M:
        acc = _identity(op)
        r = s * RTPB + tid
        while r < R:
            acc = _combine(op, acc, float64(x[offset_of(o * R + r, shape, strides, xo)]))
            r += nsplit * RTPB
        acc_buf[tid] = acc
        cuda.syncthreads()
        width = RTPB // 2
        while width > 0:
            if tid < width:
                acc_buf[tid] = _combine(op, acc_buf[tid], acc_buf[tid + width])
            cuda.syncthreads()
            width //= 2
        if tid == 0:
            out[o * nsplit + s] = acc_buf[0] / div
        cuda.syncthreads()
        o += cuda.gridDim.x


@cuda.jit(cache=True)
def reduce_rows_thread(out, x, xo, shape, strides, M, R, op, div):
    """Reduce each row of the logical (M, R) view ``x``, one thread per row."""
    o = cuda.grid(1)
    step = cuda.gridsize(1)
    while o < M:
        acc = _identity(op)
        for r in range(R):
            acc = _combine(op, acc, float64(x[offset_of(o * R + r, shape, strides, xo)]))
        out[o] = acc / div
        o += step


# ---------------------------------------------------------------------- matmul
@cuda.jit(cache=True)
def matmul_tiled(out, a, ao, a_strides, b, bo, b_strides, batch, M, N, K):
    """``out[z] = a[z] @ b[z]`` for z < batch: TILE x TILE tiles staged in shared memory.

    ``a_strides`` / ``b_strides`` are (batch, row, column) strides in elements, so
    transposed and broadcast operands need no copy; ``out`` is C-contiguous
    (batch, M, N). Accumulates in float64.
    """
    sa = cuda.shared.array((TILE, TILE), float64)
    sb = cuda.shared.array((TILE, TILE), float64)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    col = cuda.blockIdx.x * TILE + tx
    row = cuda.blockIdx.y * TILE + ty
    z = cuda.blockIdx.z
    while z < batch:
        abase = ao + z * a_strides[0]
        bbase = bo + z * b_strides[0]
        acc = 0.0
        for t in range((K + TILE - 1) // TILE):
            k = t * TILE + tx
            if row < M and k < K:
                sa[ty, tx] = a[abase + row * a_strides[1] + k * a_strides[2]]
            else:
                sa[ty, tx] = 0.0
            k = t * TILE + ty
            if col < N and k < K:
                sb[ty, tx] = b[bbase + k * b_strides[1] + col * b_strides[2]]
            else:
                sb[ty, tx] = 0.0
            cuda.syncthreads()
            for kk in range(TILE):
                acc += sa[ty, kk] * sb[kk, tx]
            cuda.syncthreads()
        if row < M and col < N:
            out[(z * M + row) * N + col] = acc
        z += cuda.gridDim.z
