"""Records for conversion, reduction, linear-algebra, shape and indexing ops of the foundation."""

from __future__ import annotations

import numpy as np

from ... import ops
from ..core import OpRecord, Sample, sample_array


def _arr(rng, *shape):
    return sample_array(rng, shape)


def _reduce_samples(rng):
    x = _arr(rng, 2, 3, 4)
    return [Sample((x,), {}, "all"), Sample((x,), {"dim": 1}, "dim1"),
            Sample((x,), {"dim": (0, 2), "keepdim": True}, "dims02-keep"),
            Sample((x,), {"dim": -1}, "dim-1"), Sample((_arr(rng),), {}, "0d")]


def _np_dim(dim):
    return dim if dim is None or isinstance(dim, int) else tuple(dim)


def _sum_ref(x, dim=None, keepdim=False):
    return np.sum(x, axis=_np_dim(dim), keepdims=keepdim)


def _mean_ref(x, dim=None, keepdim=False):
    return np.mean(x, axis=_np_dim(dim), keepdims=keepdim)


def _matmul_samples(rng):
    return [Sample((_arr(rng, 3, 4), _arr(rng, 4, 2)), note="2dx2d"),
            Sample((_arr(rng, 4), _arr(rng, 4, 2)), note="1dx2d"),
            Sample((_arr(rng, 3, 4), _arr(rng, 4)), note="2dx1d"),
            Sample((_arr(rng, 4), _arr(rng, 4)), note="1dx1d"),
            Sample((_arr(rng, 2, 3, 4), _arr(rng, 4, 2)), note="3dx2d"),
            Sample((_arr(rng, 2, 1, 3, 4), _arr(rng, 3, 4, 2)), note="batch-broadcast")]


def _index_samples(rng):
    x = _arr(rng, 4, 5)
    return [Sample((x, (1, slice(None))), note="int-slice"),
            Sample((x, (slice(1, 3), slice(None, None, 2))), note="slices"),
            Sample((x, (np.array([0, 2, 2]),)), note="int-array-repeat"),
            Sample((x, (x[:, 0] > 0,)), note="bool-mask"),
            Sample((x, (np.array([1, 3]), np.array([0, 4]))), note="two-arrays"),
            Sample((x, (None, Ellipsis, 1)), note="none-ellipsis")]


RECORDS = [
    OpRecord("to_dtype", lambda rng: [Sample((_arr(rng, 2, 3), np.float32))],
             ref=lambda x, dtype: x.astype(dtype), atol=1e-4, rtol=1e-2, eps=1e-3,
             ref_rtol=1e-6),
    OpRecord("to_device", lambda rng: [Sample((_arr(rng, 2, 3), "cpu"))],
             ref=lambda x, device: x, jit=False),
    OpRecord("contiguous", lambda rng: [Sample((_arr(rng, 3, 2),))],
             call=lambda x: ops.contiguous(ops.transpose(x, 0, 1)), ref=lambda x: x.T),
    OpRecord("zeros_like", lambda rng: [Sample((_arr(rng, 2, 3),))], ref=np.zeros_like,
             grad=False),
    OpRecord("ones_like", lambda rng: [Sample((_arr(rng, 2, 3),))], ref=np.ones_like,
             grad=False),
    OpRecord("sum", _reduce_samples, ref=_sum_ref),
    OpRecord("mean", _reduce_samples, ref=_mean_ref),
    OpRecord("sum_to", lambda rng: [Sample((_arr(rng, 2, 3, 4), (3, 1))),
                                    Sample((_arr(rng, 2, 3), (1, 3))),
                                    Sample((_arr(rng, 2, 3), ()))],
             ref=lambda x, size: np.sum(x, axis=tuple(range(x.ndim - len(size))) + tuple(
                 x.ndim - len(size) + i for i, s in enumerate(size) if s == 1 and
                 x.shape[x.ndim - len(size) + i] != 1), keepdims=False).reshape(size)),
    OpRecord("sum_backward", lambda rng: [Sample((_arr(rng, 2, 4), (2, 3, 4), 1, False)),
                                          Sample((_arr(rng), (2, 3), None, False)),
                                          Sample((_arr(rng, 1, 3), (2, 3), 0, True))],
             ref=lambda g, sizes, dim, keepdim: np.broadcast_to(
                 g if keepdim or dim is None else np.expand_dims(g, dim), sizes)),
    OpRecord("matmul", _matmul_samples, ref=np.matmul),
    OpRecord("mm", lambda rng: [Sample((_arr(rng, 3, 4), _arr(rng, 4, 2)))], ref=np.matmul),
    OpRecord("bmm", lambda rng: [Sample((_arr(rng, 2, 3, 4), _arr(rng, 2, 4, 2)))],
             ref=np.matmul),
    OpRecord("dot", lambda rng: [Sample((_arr(rng, 5), _arr(rng, 5)))], ref=np.dot),
    OpRecord("outer", lambda rng: [Sample((_arr(rng, 3), _arr(rng, 4)))], ref=np.outer),
    OpRecord("reshape", lambda rng: [Sample((_arr(rng, 2, 3), (3, 2))),
                                     Sample((_arr(rng, 2, 3), (-1,)))],
             ref=lambda x, shape: x.reshape(shape)),
    OpRecord("view", lambda rng: [Sample((_arr(rng, 2, 3), (6, 1)))],
             ref=lambda x, size: x.reshape(size)),
    OpRecord("flatten", lambda rng: [Sample((_arr(rng, 2, 3, 4),)),
                                     Sample((_arr(rng, 2, 3, 4), 1, 2))],
             ref=lambda x, s=0, e=-1: x.reshape(x.shape[:s] + (-1,) + x.shape[e % x.ndim + 1:])),
    OpRecord("permute", lambda rng: [Sample((_arr(rng, 2, 3, 4), (2, 0, 1)))],
             ref=lambda x, dims: np.transpose(x, dims)),
    OpRecord("transpose", lambda rng: [Sample((_arr(rng, 2, 3, 4), 0, 2))],
             ref=lambda x, a, b: np.swapaxes(x, a, b)),
    OpRecord("squeeze", lambda rng: [Sample((_arr(rng, 2, 1, 3, 1),)),
                                     Sample((_arr(rng, 2, 1, 3, 1), 1))],
             ref=lambda x, dim=None: np.squeeze(x, axis=dim)),
    OpRecord("unsqueeze", lambda rng: [Sample((_arr(rng, 2, 3), 1)),
                                       Sample((_arr(rng, 2, 3), -1))],
             ref=lambda x, dim: np.expand_dims(x, dim)),
    OpRecord("expand", lambda rng: [Sample((_arr(rng, 3, 1), (2, 3, 4)))],
             ref=lambda x, size: np.broadcast_to(x, size)),
    OpRecord("broadcast_to", lambda rng: [Sample((_arr(rng, 3), (2, 3)))],
             ref=lambda x, size: np.broadcast_to(x, size)),
    OpRecord("cat", lambda rng: [Sample(([_arr(rng, 2, 3), _arr(rng, 1, 3)],)),
                                 Sample(([_arr(rng, 2, 3), _arr(rng, 2, 2)], 1))],
             ref=lambda ts, dim=0: np.concatenate(ts, dim)),
    OpRecord("stack", lambda rng: [Sample(([_arr(rng, 2, 3), _arr(rng, 2, 3)],)),
                                   Sample(([_arr(rng, 2, 3), _arr(rng, 2, 3)], 2))],
             ref=lambda ts, dim=0: np.stack(ts, dim)),
    OpRecord("split", lambda rng: [Sample((_arr(rng, 5, 2), 2)),
                                   Sample((_arr(rng, 2, 5), [1, 4], 1))],
             ref=lambda x, s, dim=0: _split_ref(x, s, dim)),
    OpRecord("split_with_sizes", lambda rng: [Sample((_arr(rng, 5, 2), (2, 3)))],
             ref=lambda x, sizes, dim=0: tuple(np.split(x, np.cumsum(sizes)[:-1], axis=dim))),
    OpRecord("unbind", lambda rng: [Sample((_arr(rng, 3, 2),)), Sample((_arr(rng, 3, 2), 1))],
             ref=lambda x, dim=0: tuple(np.moveaxis(x, dim, 0))),
    OpRecord("index", _index_samples, ref=lambda x, idx: x[idx]),
    OpRecord("index_backward", lambda rng: [
        Sample((_arr(rng, 3), (4, 5), ops.normalize_index((np.array([0, 2, 2]), 1), (4, 5))))],
        ref=lambda g, sizes, idx: _scatter_ref(g, sizes, idx)),
    OpRecord("index_put", lambda rng: [
        Sample((_arr(rng, 4, 3), (np.array([0, 2]),), _arr(rng, 2, 3)), note="rows"),
        Sample((_arr(rng, 4, 3), (np.array([0, 2, 0]),), _arr(rng, 3), True), note="acc"),
        Sample((_arr(rng, 4, 3), (slice(1, 3), 0), _arr(rng)), note="scalar-value")],
        ref=lambda x, idx, v, acc=False: _index_put_ref(x, idx, v, acc)),
]


def _scatter_ref(g, sizes, idx):
    out = np.zeros(sizes)
    np.add.at(out, idx, g)
    return out


def _index_put_ref(x, idx, v, acc):
    out = x.copy()
    if acc:
        np.add.at(out, idx, np.broadcast_to(v, out[idx].shape))
    else:
        out[idx] = v
    return out


def _split_ref(x, s, dim):
    bounds = range(s, x.shape[dim], s) if isinstance(s, int) else np.cumsum(s)[:-1]
    return tuple(np.split(x, list(bounds), axis=dim))
