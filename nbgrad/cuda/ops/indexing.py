"""CUDA kernels of the indexing ops (as :mod:`nbgrad.ops.indexing` on the CPU): index
and index_put, gathers and scatters along a dimension, take, masked_fill, and the windows
at run-time positions of :mod:`nbgrad.ops.dynamic`."""

from __future__ import annotations

import numpy as np

from ...kernels import window as wk
from ...ops.indexing import flat_positions
from ...ops.registry import kernel
from .. import compute as C
from .. import elementwise as cew
from ..array import CudaArray, copy_into, full
from ..compute import contiguous_flat


@kernel("index", target="cuda")
def _index(x: CudaArray, indices) -> CudaArray:
    if indices.is_basic:
        return C.basic_index(x, indices)
    return C.gather(x, flat_positions(x.shape, indices))


@kernel("index_backward", target="cuda")
def _index_backward(g: CudaArray, sizes, indices) -> CudaArray:
    out = full(tuple(sizes), 0, g.dtype)
    C.scatter(out, flat_positions(out.shape, indices), g, add=True)
    return out


def _fit_values(values: CudaArray, target: tuple[int, ...]) -> CudaArray:
    """Drop leading size-1 dimensions that NumPy's assignment would ignore."""
    while values.ndim > len(target) and values.shape[0] == 1:
        values = C.drop_dims(values, (0,))
    return values


@kernel("index_put", target="cuda")
def _index_put(x: CudaArray, indices, values: CudaArray, accumulate: bool) -> CudaArray:
    out = x.copy()
    vals = values.astype(x.dtype, copy=False)
    if not accumulate and indices.is_basic:
        region = C.basic_index(out, indices)
        copy_into(region, _fit_values(vals, region.shape))
        return out
    positions = flat_positions(x.shape, indices)
    C.scatter(out, positions, _fit_values(vals, positions.shape), add=bool(accumulate))
    return out


@kernel("masked_fill", target="cuda")
def _masked_fill(x, mask, value):
    return cew.run_ternary("where", mask.astype(np.bool_, copy=False),
                           value.astype(x.dtype, copy=False), x, x.dtype)


# ---------------------------------------------------------------------- along one dimension
@kernel("gather", target="cuda")
def _gather(x: CudaArray, dim: int, index: CudaArray) -> CudaArray:
    return C.gather_dim(x, dim, index.astype(np.int64, copy=False))


@kernel("gather_backward", target="cuda")
def _gather_backward(g: CudaArray, sizes, dim: int, index: CudaArray) -> CudaArray:
    out = full(tuple(sizes), 0, g.dtype)
    C.scatter_dim(out, dim, index.astype(np.int64, copy=False), g, True)
    return out


@kernel("scatter", target="cuda")
def _scatter(x: CudaArray, dim: int, index: CudaArray, src: CudaArray) -> CudaArray:
    out = x.copy()
    C.scatter_dim(out, dim, index.astype(np.int64, copy=False), src, False)
    return out


@kernel("scatter_add", target="cuda")
def _scatter_add(x: CudaArray, dim: int, index: CudaArray, src: CudaArray) -> CudaArray:
    out = x.copy()
    C.scatter_dim(out, dim, index.astype(np.int64, copy=False), src, True)
    return out


def along_dim_index(index: CudaArray, shape: tuple[int, ...], dim: int) -> CudaArray:
    """A 1-D index as a view of ``shape``: it varies along ``dim`` only (stride 0 elsewhere)."""
    idx = index.astype(np.int64, copy=False).reshape(-1)
    strides = tuple(idx.strides[0] if d == dim else 0 for d in range(len(shape)))
    return idx.view_as(shape, strides, idx.offset, writeable=False)


def _selected_shape(shape: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    return shape[:dim] + (n,) + shape[dim + 1:] if shape else (n,)


@kernel("index_select", target="cuda")
def index_select(x: CudaArray, dim: int, index: CudaArray) -> CudaArray:
    """``x`` at the positions ``index`` along ``dim`` (also the rows of ``embedding``)."""
    xs = x.reshape(1) if x.ndim == 0 else x
    shape = _selected_shape(xs.shape, dim, index.size)
    out = C.gather_dim(xs, dim, along_dim_index(index, shape, dim))
    return out.reshape(_selected_shape(x.shape, dim, index.size)) if x.ndim else out


@kernel("index_select_backward", target="cuda")
def _index_select_backward(g: CudaArray, sizes, dim: int, index: CudaArray) -> CudaArray:
    sizes = tuple(sizes)
    out = full(sizes if sizes else (1,), 0, g.dtype)
    gs = g.reshape(_selected_shape(out.shape, dim, index.size))
    C.scatter_dim(out, dim, along_dim_index(index, gs.shape, dim), gs, True)
    return out.reshape(sizes)


@kernel("take", target="cuda")
def _take(x: CudaArray, index: CudaArray) -> CudaArray:
    pos = contiguous_flat(index, np.int64)
    return C.gather(x, pos, index.shape)


@kernel("take_backward", target="cuda")
def _take_backward(g: CudaArray, sizes, index: CudaArray) -> CudaArray:
    out = full(tuple(sizes), 0, g.dtype)
    C.scatter(out, contiguous_flat(index, np.int64), g, True, index.shape)
    return out


# ---------------------------------------------------------------------- dynamic windows
def _window(shape: tuple[int, ...], starts: CudaArray, sizes: tuple[int, ...]) -> tuple:
    """The window of ``sizes`` at ``starts`` (read to the host, clamped as on the CPU:
    :func:`nbgrad.kernels.window.clamped_starts`) as a basic index."""
    host = starts.copy_to_host() if isinstance(starts, CudaArray) else np.asarray(starts)
    at = wk.clamped_starts(host.astype(np.int64), np.asarray(shape, np.int64),
                           np.asarray(sizes, np.int64))
    return tuple(slice(int(s), int(s) + n) for s, n in zip(at, sizes, strict=True))


@kernel("dynamic_slice", target="cuda")
def _dynamic_slice(x: CudaArray, starts: CudaArray, sizes) -> CudaArray:
    sizes = tuple(int(s) for s in sizes)
    return C.basic_index(x, _window(x.shape, starts, sizes)).copy()


@kernel("dynamic_slice_backward", target="cuda")
def _dynamic_slice_backward(g: CudaArray, sizes, starts: CudaArray) -> CudaArray:
    sizes = tuple(int(s) for s in sizes)
    out = full(sizes, 0, g.dtype)
    copy_into(C.basic_index(out, _window(sizes, starts, g.shape)), g)
    return out


@kernel("dynamic_update_slice", target="cuda")
def _dynamic_update_slice(x: CudaArray, update: CudaArray, starts: CudaArray) -> CudaArray:
    out = x.copy()
    copy_into(C.basic_index(out, _window(x.shape, starts, update.shape)), update)
    return out
