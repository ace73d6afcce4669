"""Host-side drivers of the CUDA kernels: reductions, matrix products, views, gathers.

Each function takes and returns :class:`~nbgrad.cuda.array.CudaArray` values, picks
launch shapes and calls a kernel of :mod:`nbgrad.cuda.kernels`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from . import kernels as K
from .array import CudaArray, collapse, empty, full, grid_1d
from .launch import run_kernel
from .memory import device_buffer


# ---------------------------------------------------------------------- reductions
def reduce(x: CudaArray, dims: tuple[int, ...], out_shape: tuple[int, ...], op: int,
           out_dtype, div: float = 1.0) -> CudaArray:
    """Combine ``x`` over ``dims`` (sorted, unique) with ``op`` (SUM, PROD, MAX, MIN).

    Accumulates in float64 and divides by ``div`` (the count, for a mean). Rows whose
    reduced elements are contiguous get a shared-memory tree per row (split over
    several blocks when rows are long and few); otherwise one thread reduces a row,
    so that neighbouring threads read neighbouring elements.
    """
    kept = tuple(d for d in range(x.ndim) if d not in dims)
    view = x.permuted(kept + tuple(dims))
    M = math.prod(x.shape[d] for d in kept)
    R = math.prod(x.shape[d] for d in dims)
    out = empty(out_shape, out_dtype)
    if M == 0:
        return out
    if R == 0:
        value = {K.SUM: 0.0, K.PROD: 1.0, K.MAX: -math.inf, K.MIN: math.inf}[op]
        return full(out_shape, value / div if div else math.nan, out_dtype)
    shape, (strides,) = collapse(view.shape, view.strides)
    inner = view.strides[-1] if dims else 1
    big_rows = R >= K.RTPB // 4
    if big_rows and (inner == 1 or M < 4 * K.RTPB):
        nsplit = 1
        if M < 64:  # few long rows: split each over several blocks, then combine
            nsplit = max(1, min(math.ceil(R / (8 * K.RTPB)), 1024 // M, 2 if _sim() else 1024))
        gx = min(M, 65535)
        if nsplit == 1:
            run_kernel(K.reduce_rows_block, (gx, 1), K.RTPB, out.buf, x.buf, view.offset, shape,
                       strides, M, R, op, float(div))
            return out
        partial = device_buffer(M * nsplit, np.float64)
        run_kernel(K.reduce_rows_block, (gx, nsplit), K.RTPB, partial, x.buf, view.offset, shape,
                   strides, M, R, op, 1.0)
        run_kernel(K.reduce_rows_block, (gx, 1), K.RTPB, out.buf, partial, 0, (M * nsplit,), (1,),
                   M, nsplit, op, float(div))
        return out
    blocks, threads = grid_1d(M)
    run_kernel(K.reduce_rows_thread, blocks, threads, out.buf, x.buf, view.offset, shape, strides,
               M, R, op, float(div))
    return out


def _sim() -> bool:
    return K._SIM


# ---------------------------------------------------------------------- matrix products
def matmul3(a: CudaArray, b: CudaArray, batch_strides: tuple[int, int] | None = None
            ) -> CudaArray:
    """(batch, M, K) @ (batch, K, N) -> C-contiguous (batch, M, N); any strides."""
    batch, M, Kd = a.shape
    N = b.shape[2]
    dtype = np.result_type(a.dtype, b.dtype)
    if batch * M * N == 0:
        return empty((batch, M, N), dtype)
    if Kd == 0:
        return full((batch, M, N), 0, dtype)
    out = empty((batch, M, N), dtype)
    sa = (batch_strides[0] if batch_strides else a.strides[0], a.strides[1], a.strides[2])
    sb = (batch_strides[1] if batch_strides else b.strides[0], b.strides[1], b.strides[2])
    grid = (math.ceil(N / K.TILE), math.ceil(M / K.TILE), min(batch, 65535))
    run_kernel(K.matmul_tiled, grid, (K.TILE, K.TILE), out.buf, a.buf, a.offset, sa, b.buf,
               b.offset, sb, batch, M, N, Kd)
    return out


def matmul_nd(a: CudaArray, b: CudaArray) -> CudaArray:
    """NumPy's ``matmul``: 1-D operands are promoted, batch dimensions broadcast."""
    a1, b1 = a.ndim == 1, b.ndim == 1
    A = a.view_as((1, a.shape[0]), (0, a.strides[0]), a.offset) if a1 else a
    B = b.view_as((b.shape[0], 1), (b.strides[0], 0), b.offset) if b1 else b
    batch = tuple(np.broadcast_shapes(A.shape[:-2], B.shape[:-2]))
    A = A.broadcast_to(batch + A.shape[-2:])
    B = B.broadcast_to(batch + B.shape[-2:])
    M, N = A.shape[-2], B.shape[-1]
    nb = math.prod(batch)
    bshape, (bsa, bsb) = collapse(batch, A.strides[:-2], B.strides[:-2]) if batch else \
        ((1,), [(0,), (0,)])
    if len(bshape) == 1:
        A3 = A.view_as((nb,) + A.shape[-2:], (bsa[0],) + A.strides[-2:], A.offset)
        B3 = B.view_as((nb,) + B.shape[-2:], (bsb[0],) + B.strides[-2:], B.offset)
    else:  # batch dimensions that no single stride walks: materialise them
        A3 = A.copy().reshape((nb,) + A.shape[-2:])
        B3 = B.copy().reshape((nb,) + B.shape[-2:])
    out = matmul3(A3, B3)
    shape = batch + ((M,) if not a1 else ()) + ((N,) if not b1 else ())
    return out.reshape(shape)


# ---------------------------------------------------------------------- views
def insert_dims(x: CudaArray, dims: tuple[int, ...]) -> CudaArray:
    """``np.expand_dims(x, dims)`` as a view (``dims`` sorted, of the result)."""
    shape, strides = [], []
    it = iter(zip(x.shape, x.strides, strict=True))
    for d in range(x.ndim + len(dims)):
        if d in dims:
            shape.append(1)
            strides.append(0)
        else:
            s, st = next(it)
            shape.append(s)
            strides.append(st)
    return x.view_as(tuple(shape), tuple(strides), x.offset)


def drop_dims(x: CudaArray, dims: tuple[int, ...]) -> CudaArray:
    """Remove dimensions of size 1 (a view)."""
    keep = [d for d in range(x.ndim) if d not in dims]
    return x.view_as(tuple(x.shape[d] for d in keep), tuple(x.strides[d] for d in keep),
                     x.offset)


def narrow(x: CudaArray, dim: int, start: int, length: int) -> CudaArray:
    """``x`` restricted to ``start:start+length`` along ``dim`` (a view)."""
    shape = list(x.shape)
    shape[dim] = length
    return x.view_as(tuple(shape), x.strides, x.offset + start * x.strides[dim])


def select(x: CudaArray, dim: int, i: int) -> CudaArray:
    """``x`` at index ``i`` along ``dim``, the dimension removed (a view)."""
    return drop_dims(narrow(x, dim, i, 1), (dim,))


def basic_index(x: CudaArray, idx) -> CudaArray:
    """A view for an index of ints, slices, ``None`` and ``...`` (NumPy's basic indexing)."""
    items = list(idx)
    used = sum(1 for i in items if i is not None and i is not Ellipsis)
    if Ellipsis in items:
        k = items.index(Ellipsis)
        items[k:k + 1] = [slice(None)] * (x.ndim - used)
    else:
        items += [slice(None)] * (x.ndim - used)
    shape, strides, offset, d = [], [], x.offset, 0
    for item in items:
        if item is None:
            shape.append(1)
            strides.append(0)
            continue
        size, stride = x.shape[d], x.strides[d]
        d += 1
        if isinstance(item, slice):
            start, stop, step = item.indices(size)
            offset += start * stride
            shape.append(len(range(start, stop, step)))
            strides.append(stride * step)
        else:
            offset += (int(item) % size) * stride
    return x.view_as(tuple(shape), tuple(strides), offset)


# ---------------------------------------------------------------------- gathers, scatters
def upload_positions(positions: np.ndarray):
    flat = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
    return cuda.to_device(flat if flat.size else np.zeros(1, np.int64))


def gather(x: CudaArray, positions, shape: tuple[int, ...] | None = None) -> CudaArray:
    """``x.reshape(-1)[positions]`` (logical element numbers, negative ones from the end;
    any strides of ``x``). ``positions``: a host array, or a flat int64 device array
    of ``shape``."""
    out = empty(positions.shape if shape is None else shape, x.dtype)
    n = out.size
    if n:
        shape, (strides,) = collapse(x.shape, x.strides)
        blocks, threads = grid_1d(n)
        pos = positions if not isinstance(positions, np.ndarray) else \
            upload_positions(positions)
        run_kernel(K.gather, blocks, threads, out.buf, n, pos, x.buf, x.offset, shape, strides,
                   x.size)
    return out


def scatter(out: CudaArray, positions, values: CudaArray, add: bool,
            shape: tuple[int, ...] | None = None) -> None:
    """``out.reshape(-1)[positions] (+)= values`` (``out`` fresh and C-contiguous; repeats
    add up). ``positions``: a host array, or a flat int64 device array of ``shape``."""
    shape = positions.shape if shape is None else shape
    n = math.prod(shape)
    if n == 0:
        return
    vals = values.broadcast_to(shape)
    cshape, (strides,) = collapse(vals.shape, vals.strides)
    pos = positions if not isinstance(positions, np.ndarray) else upload_positions(positions)
    blocks, threads = grid_1d(n)
    kern = K.scatter_add if add else K.scatter_set
    run_kernel(kern, blocks, threads, out.buf, n, pos, vals.buf, vals.offset, cshape, strides,
               out.size)


def _padded(x: CudaArray) -> CudaArray:
    return x.reshape(1) if x.ndim == 0 else x


def gather_dim(x: CudaArray, dim: int, index: CudaArray) -> CudaArray:
    """torch's ``gather`` along ``dim`` (the output has the index's shape)."""
    out = empty(index.shape, x.dtype)
    n = out.size
    if n:
        xi, ii = _padded(x), _padded(index)
        blocks, threads = grid_1d(n)
        run_kernel(K.gather_dim, blocks, threads, out.buf, n, ii.shape, ii.buf, ii.offset,
                   ii.strides, xi.buf, xi.offset, xi.strides, dim)
    return out


def scatter_dim(out: CudaArray, dim: int, index: CudaArray, src: CudaArray, accumulate: bool,
                skip: int = -(2 ** 62)) -> None:
    """``out[... index ...] (+)= src`` along ``dim`` over the index's shape (``out``
    C-contiguous; ``src`` broadcast to the index's shape; ``skip``: an index to leave out)."""
    n = index.size
    if n == 0:
        return
    oi, ii = _padded(out), _padded(index)
    si = _padded(src.astype(out.dtype, copy=False)).broadcast_to(ii.shape)
    blocks, threads = grid_1d(n)
    run_kernel(K.scatter_dim, blocks, threads, out.buf, n, ii.shape, ii.buf, ii.offset, ii.strides,
               si.buf, si.offset, si.strides, oi.strides, dim, skip, bool(accumulate))


# ---------------------------------------------------------------------- rows and lines
def sum_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of a sum or product: integers and booleans accumulate in int64."""
    return np.dtype(np.int64) if dtype.kind in "biu" else dtype


def flat(v: CudaArray):
    """The device buffer of a C-contiguous array, exactly ``v.size`` long."""
    if v.offset == 0 and v.buf.size == v.size:
        return v.buf
    return v.buf[v.offset:v.offset + v.size]


def contiguous_flat(x: CudaArray, dtype=None):
    """:func:`flat` of ``x`` converted to ``dtype`` (if given) and made C-contiguous."""
    v = x.astype(dtype, copy=False) if dtype is not None else x
    if not v.is_contiguous():
        v = v.copy()
    return flat(v)


def rows_last(x: CudaArray, dims: tuple[int, ...]) -> tuple[CudaArray, int, int, tuple]:
    """``x`` with ``dims`` moved last, C-contiguous: (array, rows M, row length R, kept)."""
    kept = tuple(d for d in range(x.ndim) if d not in dims)
    v = x.permuted(kept + tuple(dims))
    if not v.is_contiguous():
        v = v.copy()
    return v, math.prod(x.shape[d] for d in kept), math.prod(x.shape[d] for d in dims), \
        tuple(x.shape[d] for d in kept)


def launch(kernel, n: int, *args) -> None:
    """Launch ``kernel`` over ``n`` threads (a 1-D grid; nothing when ``n`` is 0)."""
    if n:
        blocks, threads = grid_1d(n)
        run_kernel(kernel, blocks, threads, *args)


def along(x: CudaArray, dim: int, out_dtype, run) -> CudaArray:
    """``run(flat, M, R, out_flat)`` over the lines along ``dim``; the result in x's shape."""
    if x.ndim == 0:
        x1 = x.reshape(1)
        return along(x1, 0, out_dtype, run).reshape(())
    v, M, R, kept = rows_last(x, (dim,))
    out = empty(v.shape, out_dtype)
    if M and R:
        run(flat(v), M, R, out.buf)
    order = tuple(d for d in range(x.ndim) if d != dim) + (dim,)
    back = tuple(int(i) for i in np.argsort(order))
    res = out.permuted(back)
    return res if res.is_contiguous() else res.copy()
