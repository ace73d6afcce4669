"""CUDA kernels of the shape ops (as :mod:`nbgrad.ops.shape` on the CPU): views,
joins and splits, flips, rolls, triangles, tiles and padding."""

from __future__ import annotations

import math

import numpy as np

from ...ops.registry import kernel
from ...ops.shape import _pad_pairs
from .. import compute as C
from .. import kernels as K
from ..array import CudaArray, copy_into, empty, full, grid_1d
from ..launch import run_kernel


@kernel("contiguous", target="cuda")
def _contiguous(x: CudaArray) -> CudaArray:
    return x.copy()


@kernel("zeros_like", target="cuda")
def _zeros_like(x: CudaArray) -> CudaArray:
    return full(x.shape, 0, x.dtype)


@kernel("ones_like", target="cuda")
def _ones_like(x: CudaArray) -> CudaArray:
    return full(x.shape, 1, x.dtype)


# ---------------------------------------------------------------------- views
@kernel("reshape", target="cuda")
def _reshape(x: CudaArray, shape) -> CudaArray:
    try:
        return x.reshape(tuple(shape))
    except ValueError:
        raise RuntimeError(f"reshape: shape {tuple(shape)} is invalid for a tensor of shape "
                           f"{x.shape} ({x.size} elements)") from None


@kernel("view", target="cuda")
def _view(x: CudaArray, size) -> CudaArray:
    if not x.flags.c_contiguous:
        raise RuntimeError("view: the tensor is not contiguous; use reshape()")
    return _reshape(x, size)


@kernel("flatten", target="cuda")
def _flatten(x: CudaArray, start_dim: int, end_dim: int) -> CudaArray:
    if x.ndim == 0:
        return x.reshape(1)
    shape = (x.shape[:start_dim] + (math.prod(x.shape[start_dim:end_dim + 1]),)
             + x.shape[end_dim + 1:])
    return x.reshape(shape)


@kernel("permute", target="cuda")
def _permute(x: CudaArray, dims) -> CudaArray:
    return x.permuted(tuple(dims))


@kernel("transpose", target="cuda")
def _transpose(x: CudaArray, dim0: int, dim1: int) -> CudaArray:
    dims = list(range(x.ndim))
    if x.ndim:
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
    return x.permuted(tuple(dims))


@kernel("squeeze", target="cuda")
def _squeeze(x: CudaArray, dim) -> CudaArray:
    dims = tuple(i for i, s in enumerate(x.shape) if s == 1 and (dim is None or i in dim))
    return C.drop_dims(x, dims)


@kernel("unsqueeze", target="cuda")
def _unsqueeze(x: CudaArray, dim: int) -> CudaArray:
    return C.insert_dims(x, (dim,))


@kernel("expand", target="cuda")
def _expand(x: CudaArray, size) -> CudaArray:
    try:
        return x.broadcast_to(tuple(size))
    except ValueError:
        raise RuntimeError(f"expand: shape {x.shape} cannot be expanded to {tuple(size)}") \
            from None


@kernel("broadcast_to", target="cuda")
def _broadcast_to(x: CudaArray, size) -> CudaArray:
    return _expand(x, size)


# ---------------------------------------------------------------------- joins and splits
@kernel("cat", target="cuda")
def _cat(tensors: list[CudaArray], dim: int) -> CudaArray:
    first = tensors[0]
    if any(t.ndim != first.ndim or t.shape[:dim] + t.shape[dim + 1:] !=
           first.shape[:dim] + first.shape[dim + 1:] for t in tensors):
        shapes = [t.shape for t in tensors]
        raise RuntimeError(f"cat: shapes {shapes} do not match outside dim {dim}")
    total = sum(t.shape[dim] for t in tensors)
    shape = first.shape[:dim] + (total,) + first.shape[dim + 1:]
    out = empty(shape, np.result_type(*[t.dtype for t in tensors]))
    start = 0
    for t in tensors:
        copy_into(C.narrow(out, dim, start, t.shape[dim]), t)
        start += t.shape[dim]
    return out


@kernel("stack", target="cuda")
def _stack(tensors: list[CudaArray], dim: int) -> CudaArray:
    first = tensors[0]
    if any(t.shape != first.shape for t in tensors):
        shapes = [t.shape for t in tensors]
        raise RuntimeError(f"stack: expects tensors of one shape, got {shapes}")
    shape = first.shape[:dim] + (len(tensors),) + first.shape[dim:]
    out = empty(shape, np.result_type(*[t.dtype for t in tensors]))
    for i, t in enumerate(tensors):
        copy_into(C.select(out, dim, i), t)
    return out


@kernel("split_with_sizes", target="cuda")
def _split_with_sizes(x: CudaArray, split_sizes, dim: int) -> list[CudaArray]:
    if sum(split_sizes) != x.shape[dim]:
        raise RuntimeError(f"split_with_sizes: sizes {tuple(split_sizes)} do not add up to "
                           f"{x.shape[dim]} (dim {dim} of shape {x.shape})")
    out, start = [], 0
    for s in split_sizes:
        out.append(C.narrow(x, dim, start, int(s)))
        start += int(s)
    return out


@kernel("split", target="cuda")
def _split(x: CudaArray, split_size_or_sections, dim: int) -> list[CudaArray]:
    n = x.shape[dim]
    if isinstance(split_size_or_sections, (int, np.integer)):
        step = int(split_size_or_sections)
        if step <= 0:
            raise ValueError(f"split: split_size must be positive, got {step}")
        sizes = [step] * (n // step) + ([n % step] if n % step else [])
    else:
        sizes = [int(s) for s in split_size_or_sections]
    return _split_with_sizes(x, sizes, dim)


@kernel("unbind", target="cuda")
def _unbind(x: CudaArray, dim: int) -> list[CudaArray]:
    return [C.select(x, dim, i) for i in range(x.shape[dim])]


@kernel("chunk", target="cuda")
def _chunk(x: CudaArray, chunks: int, dim: int) -> list[CudaArray]:
    n = x.shape[dim]
    if n == 0:
        return [x.view_as(x.shape, x.strides, x.offset)]
    step = -(-n // chunks)
    return _split(x, step, dim)


# ---------------------------------------------------------------------- copies
@kernel("flip", target="cuda")
def _flip(x: CudaArray, dims) -> CudaArray:
    shape, strides, offset = x.shape, list(x.strides), x.offset
    for d in dims:
        if shape[d]:
            offset += (shape[d] - 1) * strides[d]
        strides[d] = -strides[d]
    return x.view_as(shape, tuple(strides), offset).copy()


def _roll_one(x: CudaArray, shift: int, dim: int) -> CudaArray:
    n = x.shape[dim]
    out = empty(x.shape, x.dtype)
    s = shift % n if n else 0
    if n == 0 or s == 0:
        copy_into(out, x)
        return out
    copy_into(C.narrow(out, dim, s, n - s), C.narrow(x, dim, 0, n - s))
    copy_into(C.narrow(out, dim, 0, s), C.narrow(x, dim, n - s, s))
    return out


@kernel("roll", target="cuda")
def _roll(x: CudaArray, shifts, dims) -> CudaArray:
    if dims is None:
        return _roll_one(x.reshape(-1), int(shifts[0]), 0).reshape(x.shape)
    out = x
    for s, d in zip(shifts, dims, strict=True):
        out = _roll_one(out, int(s), d)
    return out if out is not x else x.copy()


def _tri(x: CudaArray, diagonal: int, lower: bool) -> CudaArray:
    out = empty(x.shape, x.dtype)
    n = out.size
    if n:
        blocks, threads = grid_1d(n)
        run_kernel(K.triangle, blocks, threads, out.buf, n, x.shape, x.buf, x.offset, x.strides,
                   int(diagonal), lower)
    return out


@kernel("tril", target="cuda")
def _tril(x: CudaArray, diagonal: int) -> CudaArray:
    return _tri(x, diagonal, True)


@kernel("triu", target="cuda")
def _triu(x: CudaArray, diagonal: int) -> CudaArray:
    return _tri(x, diagonal, False)


def _tile(x: CudaArray, reps) -> CudaArray:
    reps = tuple(int(r) for r in reps)
    x = x.reshape((1,) * (len(reps) - x.ndim) + x.shape)
    inter = tuple(v for r, s in zip(reps, x.shape, strict=True) for v in (r, s))
    view = x.view_as(inter, tuple(v for st in x.strides for v in (0, st)), x.offset)
    return view.copy().reshape(tuple(r * s for r, s in zip(reps, x.shape, strict=True)))


@kernel("repeat", target="cuda")
def _repeat(x: CudaArray, repeats) -> CudaArray:
    return _tile(x, repeats)


@kernel("tile", target="cuda")
def _tile_k(x: CudaArray, dims) -> CudaArray:
    return _tile(x, dims)


@kernel("pad", target="cuda")
def _pad(x: CudaArray, pad, mode: str, value) -> CudaArray:
    if mode != "constant":
        raise RuntimeError(f"pad: the kernel only pads in constant mode, got {mode!r}")
    shape = list(x.shape)
    src, dst = x, None
    regions = []
    for d, lo, hi in _pad_pairs(pad, x.ndim):
        n = x.shape[d]
        shape[d] = n + lo + hi
        s0, s1 = max(-lo, 0), n - max(-hi, 0)
        regions.append((d, s0, max(s1 - s0, 0), max(lo, 0)))
    out = full(tuple(shape), 0 if value is None else value, x.dtype)
    dst = out
    for d, s0, length, d0 in regions:
        src = C.narrow(src, d, s0, length)
        dst = C.narrow(dst, d, d0, length)
    copy_into(dst, src)
    return out
