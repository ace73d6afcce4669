"""Records for the shape ops (``flip, roll, repeat, tile, tril, triu, pad, chunk``) and the
indexing ops (``gather, scatter, scatter_add, index_select, take, masked_fill``,
``dynamic_slice``, ``dynamic_update_slice`` and their backward ops). Index samples repeat
positions wherever the op accumulates."""

from __future__ import annotations

import numpy as np

from ..core import OpRecord, Sample, sample_array


def _arr(rng, *shape):
    return sample_array(rng, shape)


def _tile_ref(x, reps):
    reps = tuple(reps)
    return np.tile(x.reshape((1,) * (len(reps) - x.ndim) + x.shape), reps)


def _pad_ref(x, pad, mode="constant", value=None):
    pairs = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        pairs[x.ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    if mode != "constant":
        np_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
        return np.pad(x, pairs, mode=np_mode)
    crop = tuple(slice(max(-lo, 0), x.shape[d] - max(-hi, 0)) for d, (lo, hi) in
                 enumerate(pairs))
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    return np.pad(x[crop], grow, constant_values=0.0 if value is None else value)


def _chunk_ref(x, chunks, dim=0):
    n = x.shape[dim]
    step = -(-n // chunks)
    return tuple(np.split(x, list(range(step, n, step)), axis=dim))


def _unique_index(rng, shape, dim, size):
    """Indices along ``dim`` without repeats inside each line (scatter needs that)."""
    moved = list(shape)
    m = moved.pop(dim)
    lines = [rng.permutation(size)[:m] for _ in range(int(np.prod(moved)))]
    return np.moveaxis(np.array(lines).reshape(tuple(moved) + (m,)), -1, dim)


def _gather_ref(x, dim, index):
    dim %= x.ndim
    region = tuple(slice(None) if k == dim else slice(0, s) for k, s in enumerate(index.shape))
    return np.take_along_axis(x[region], index, axis=dim)


def _along_positions(index, dim):
    """NumPy index tuple addressing ``out[..., index, ...]`` for each entry of ``index``."""
    grid = list(np.indices(index.shape, sparse=True))
    grid[dim] = index
    return tuple(grid)


def _gather_backward_ref(g, sizes, dim, index):
    out = np.zeros(sizes)
    np.add.at(out, _along_positions(index, dim), g)
    return out


def _scatter_ref(x, dim, index, src):
    out = x.copy()
    src = np.broadcast_to(src, index.shape) if np.ndim(src) == 0 else \
        src[tuple(slice(0, s) for s in index.shape)]
    out[_along_positions(index, dim)] = src
    return out


def _scatter_add_ref(x, dim, index, src):
    out = x.copy()
    np.add.at(out, _along_positions(index, dim), src[tuple(slice(0, s) for s in index.shape)])
    return out


def _index_select_backward_ref(g, sizes, dim, index):
    out = np.zeros(sizes)
    pos = [slice(None)] * len(sizes)
    pos[dim] = index
    np.add.at(out, tuple(pos), g)
    return out


def _take_backward_ref(g, sizes, index):
    out = np.zeros(int(np.prod(sizes)))
    np.add.at(out, index.reshape(-1) % out.size, g.reshape(-1))
    return out.reshape(sizes)


def _window(shape, starts, sizes) -> tuple:
    """jax.lax's window: a negative start counts from the end, then clamped to fit."""
    starts = np.where(np.asarray(starts) < 0, np.asarray(starts) + shape, starts)
    return tuple(slice(s, s + k) for s, k in
                 zip(np.clip(starts, 0, np.subtract(shape, sizes)), sizes, strict=True))


def _dynamic_slice_ref(x, starts, sizes):
    return x[_window(x.shape, starts, sizes)]


def _dynamic_slice_backward_ref(g, sizes, starts):
    out = np.zeros(sizes)
    out[_window(tuple(sizes), starts, g.shape)] = g
    return out


def _dynamic_update_slice_ref(x, update, starts):
    out = x.copy()
    out[_window(x.shape, starts, update.shape)] = update
    return out


def _gather_samples(rng):
    return [Sample((_arr(rng, 3, 4, 5), 1, rng.integers(0, 4, (3, 6, 5))), note="dim1-repeats"),
            Sample((_arr(rng, 3, 4, 5), 0, rng.integers(0, 3, (2, 3, 5))), note="dim0-smaller"),
            Sample((_arr(rng, 3, 4), -1, rng.integers(0, 4, (3, 2))), note="dim-1")]


def _scatter_samples(rng):
    return [Sample((_arr(rng, 4, 5), 0, _unique_index(rng, (3, 5), 0, 4), _arr(rng, 3, 5)),
                   note="dim0"),
            Sample((_arr(rng, 3, 4, 5), 1, _unique_index(rng, (2, 3, 4), 1, 4),
                    _arr(rng, 2, 4, 4)), note="dim1-larger-src"),
            Sample((_arr(rng, 4, 5), 1, _unique_index(rng, (4, 2), 1, 5), 1.5), note="value")]


def _scatter_add_samples(rng):
    return [Sample((_arr(rng, 4, 5), 0, rng.integers(0, 4, (6, 5)), _arr(rng, 6, 5)),
                   note="dim0-repeats"),
            Sample((_arr(rng, 3, 4, 5), 2, rng.integers(0, 5, (2, 4, 7)), _arr(rng, 2, 4, 7)),
                   note="dim2-smaller")]


RECORDS = [
    OpRecord("flip", lambda rng: [Sample((_arr(rng, 2, 3, 4), (0, 2)), note="dims02"),
                                  Sample((_arr(rng, 5), (-1,)), note="1d")],
             ref=lambda x, dims: np.flip(x, dims)),
    OpRecord("roll", lambda rng: [Sample((_arr(rng, 2, 3, 4), (1, -2), (0, 2)), note="dims"),
                                  Sample((_arr(rng, 2, 3), 4), note="flat")],
             ref=lambda x, shifts, dims=None: np.roll(x, shifts, axis=dims)),
    OpRecord("repeat", lambda rng: [Sample((_arr(rng, 2, 3), (2, 1, 3)), note="new-dim"),
                                    Sample((_arr(rng, 3), (2, 2)), note="1d"),
                                    Sample((_arr(rng), (3,)), note="0d")],
             ref=_tile_ref),
    OpRecord("tile", lambda rng: [Sample((_arr(rng, 2, 3), (2,)), note="fewer-dims"),
                                  Sample((_arr(rng, 2, 3), (2, 1, 2)), note="more-dims")],
             ref=lambda x, dims: np.tile(x, dims)),
    OpRecord("tril", lambda rng: [Sample((_arr(rng, 3, 4),), note="main"),
                                  Sample((_arr(rng, 2, 3, 4), 1), note="batch-above"),
                                  Sample((_arr(rng, 4, 3), -1), note="below")],
             ref=lambda x, diagonal=0: np.tril(x, diagonal)),
    OpRecord("triu", lambda rng: [Sample((_arr(rng, 3, 4),), note="main"),
                                  Sample((_arr(rng, 2, 3, 4), 1), note="batch-above"),
                                  Sample((_arr(rng, 4, 3), -1), note="below")],
             ref=lambda x, diagonal=0: np.triu(x, diagonal)),
    OpRecord("pad", lambda rng: [
        Sample((_arr(rng, 2, 3, 4), (1, 2)), note="last-dim"),
        Sample((_arr(rng, 2, 3, 4), (1, 0, -1, 2), "constant", 0.5), note="crop-and-value"),
        Sample((_arr(rng, 2, 3, 4), (2, 1, 1, 2), "reflect"), note="reflect"),
        Sample((_arr(rng, 2, 3, 4), (2, 1, 0, 2), "replicate"), note="replicate"),
        Sample((_arr(rng, 2, 3, 4), (3, 1), "circular"), note="circular")],
        ref=_pad_ref),
    OpRecord("chunk", lambda rng: [Sample((_arr(rng, 5, 2), 2), note="uneven"),
                                   Sample((_arr(rng, 2, 7), 3, 1), note="dim1")],
             ref=_chunk_ref),
    OpRecord("gather", _gather_samples, ref=_gather_ref),
    OpRecord("gather_backward", lambda rng: [
        Sample((_arr(rng, 3, 6, 5), (3, 4, 5), 1, rng.integers(0, 4, (3, 6, 5))),
               note="repeats"),
        Sample((_arr(rng, 2, 3), (3, 4), 0, rng.integers(0, 3, (2, 3))), note="smaller")],
        ref=_gather_backward_ref),
    OpRecord("scatter", _scatter_samples, ref=_scatter_ref),
    OpRecord("scatter_add", _scatter_add_samples, ref=_scatter_add_ref),
    OpRecord("index_select", lambda rng: [
        Sample((_arr(rng, 3, 4, 5), 2, np.array([2, 0, 2, 1])), note="repeats"),
        Sample((_arr(rng, 3, 4), 0, np.array([1])), note="dim0")],
        ref=lambda x, dim, index: np.take(x, index, axis=dim)),
    OpRecord("index_select_backward", lambda rng: [
        Sample((_arr(rng, 3, 4, 4), (3, 4, 5), 2, np.array([2, 0, 2, 1])), note="repeats")],
        ref=_index_select_backward_ref),
    OpRecord("take", lambda rng: [Sample((_arr(rng, 3, 4), np.array([[0, -1], [5, 5]])),
                                         note="negative-repeats"),
                                  Sample((_arr(rng, 5), np.array(2)), note="0d-index")],
             ref=lambda x, index: np.take(x, index)),
    OpRecord("take_backward", lambda rng: [
        Sample((_arr(rng, 2, 2), (3, 4), np.array([[0, -1], [5, 5]])), note="repeats")],
        ref=_take_backward_ref),
    OpRecord("dynamic_slice", lambda rng: [
        Sample((_arr(rng, 4, 5), np.array([1, 2]), (2, 3)), note="inside"),
        Sample((_arr(rng, 4, 5), np.array([3, -2]), (2, 4)), note="clamped"),
        Sample((_arr(rng, 3, 4, 2), np.array([2, 0, 1]), (1, 4, 1)), note="3d"),
        Sample((np.array(1.5), np.zeros(0, np.int64), ()), note="0d")],
        ref=_dynamic_slice_ref),
    OpRecord("dynamic_slice_backward", lambda rng: [
        Sample((_arr(rng, 2, 3), (4, 5), np.array([3, 1])), note="clamped")],
        ref=_dynamic_slice_backward_ref),
    OpRecord("dynamic_update_slice", lambda rng: [
        Sample((_arr(rng, 4, 5), _arr(rng, 2, 3), np.array([1, 1])), note="inside"),
        Sample((_arr(rng, 4, 5), _arr(rng, 1, 5), np.array([9, -3])), note="clamped")],
        ref=_dynamic_update_slice_ref),
    OpRecord("masked_fill", lambda rng: [
        Sample((_arr(rng, 3, 4), rng.random(4) > 0.5, np.array(0.7)), note="broadcast-mask"),
        Sample((_arr(rng, 3, 4), rng.random((3, 4)) > 0.5, -2.0), note="python-value")],
        ref=lambda x, mask, value: np.where(mask, value, x)),
]
