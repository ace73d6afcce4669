"""CUDA kernels of the neural-network ops (as :mod:`nbgrad.ops.nn` on the CPU):
softmax, losses, layer norm, linear, embedding, one-hot and gelu."""

from __future__ import annotations

import math

import numpy as np

from ...ops.registry import get, kernel
from .. import compute as C
from .. import elementwise as cew
from .. import kernels as K
from .. import rows as R_
from ..array import CudaArray, empty, full
from ..compute import along, contiguous_flat, launch
from .indexing import along_dim_index, index_select


@kernel("gelu", target="cuda")
def _gelu(x: CudaArray, approximate: str) -> CudaArray:
    """The expression's parameter ``p0`` encodes ``approximate`` (the kind's ``encode``)."""
    return cew.run_unary("gelu", x, x.dtype, *get("gelu").kind.encode(approximate))


# ---------------------------------------------------------------------- softmax
def _softmax(x: CudaArray, dim: int, dtype, log: bool) -> CudaArray:
    if dtype is not None:
        x = x.astype(dtype, copy=False)
    return along(x, dim, x.dtype, lambda f, M, R, o: launch(
        R_.softmax_rows, M, f, M, R, 1, log, o))


@kernel("softmax", target="cuda")
def _softmax_k(x: CudaArray, dim: int, dtype) -> CudaArray:
    return _softmax(x, dim, dtype, False)


@kernel("log_softmax", target="cuda")
def _log_softmax_k(x: CudaArray, dim: int, dtype) -> CudaArray:
    return _softmax(x, dim, dtype, True)


# ---------------------------------------------------------------------- class losses
def _class_layout(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) == 1:
        return 1, shape[0], 1
    return shape[0], shape[1], math.prod(shape[2:])


def _class_weight(weight: CudaArray | None, C: int):
    if weight is None:
        return full((C,), 1.0, np.float64).buf
    return contiguous_flat(weight, np.float64)


def _loss_from_samples(loss: CudaArray, wt: CudaArray, tshape, reduction: str, dtype):
    loss = loss.astype(dtype, copy=False)
    if reduction == "none":
        return loss.reshape(tshape)
    total = C.reduce(loss, (0,), (), K.SUM, np.float64)
    if reduction == "mean":
        denom = C.reduce(wt, (0,), (), K.SUM, np.float64)
        total = cew.run_binary("div", total, denom, np.dtype(np.float64))
    return total.astype(dtype, copy=False)


def _class_loss(rows_kernel, x: CudaArray, target: CudaArray, weight, ignore_index: int,
                reduction: str, label_smoothing: float, dtype) -> CudaArray:
    A, Cn, B = _class_layout(x.shape)
    loss = empty((A * B,), np.float64)
    wt = empty((A * B,), np.float64)
    if A * B:
        launch(rows_kernel, A, contiguous_flat(x), contiguous_flat(target, np.int64),
               _class_weight(weight, Cn), A, Cn, B, int(ignore_index),
               float(label_smoothing), loss.buf, wt.buf)
    return _loss_from_samples(loss, wt, target.shape, reduction, dtype)


@kernel("cross_entropy", target="cuda")
def _cross_entropy(x, target, weight, ignore_index, reduction, label_smoothing):
    return _class_loss(R_.cross_entropy_rows, x, target, weight, ignore_index, reduction,
                       label_smoothing, x.dtype)


@kernel("nll_loss", target="cuda")
def _nll_loss(logp, target, weight, ignore_index, reduction, label_smoothing):
    return _class_loss(R_.nll_rows, logp, target, weight, ignore_index, reduction,
                       label_smoothing, logp.dtype)


@kernel("nll_loss_backward", target="cuda")
def _nll_loss_backward(g, target, weight, sizes, ignore_index, reduction, label_smoothing):
    sizes = tuple(sizes)
    A, Cn, B = _class_layout(sizes)
    t = contiguous_flat(target, np.int64)
    w = _class_weight(weight, Cn)
    if reduction == "none":
        gs = contiguous_flat(g, np.float64)
    else:
        scale = float(g.copy_to_host())
        if reduction == "mean":
            th = target.copy_to_host().reshape(-1).astype(np.int64)
            wh = np.ones(Cn) if weight is None else weight.copy_to_host().astype(np.float64)
            denom = wh[th[th != ignore_index]].sum()
            scale = scale / denom if denom else math.nan
        gs = full((A * B,), scale, np.float64).buf
    out = empty(sizes, g.dtype)
    launch(R_.nll_backward_rows, A, gs, t, w, A, Cn, B, int(ignore_index),
           float(label_smoothing), out.buf)
    return out


# ---------------------------------------------------------------------- other losses, layers
@kernel("layer_norm", target="cuda")
def _layer_norm(x, normalized_shape, weight, bias, eps):
    D = math.prod(normalized_shape)
    M = x.size // D if D else 0
    out = empty(x.shape, x.dtype)
    dummy = full((1,), 0, x.dtype).buf
    w = dummy if weight is None else contiguous_flat(weight, x.dtype)
    b = dummy if bias is None else contiguous_flat(bias, x.dtype)
    launch(R_.layer_norm_rows, M, contiguous_flat(x), M, D, w, b, weight is not None,
           bias is not None, float(eps), out.buf)
    return out


def _pointwise_loss(a: CudaArray, b: CudaArray, reduction: str, squared: bool) -> CudaArray:
    d = cew.run_binary("sub", a, b, a.dtype)
    v = cew.run_binary("mul", d, d, a.dtype) if squared else cew.run_unary("abs", d, a.dtype)
    if reduction == "none":
        return v
    count = v.size
    if reduction == "mean" and count == 0:
        return full((), math.nan, a.dtype)
    return C.reduce(v, tuple(range(v.ndim)), (), K.SUM, a.dtype,
                    float(count) if reduction == "mean" else 1.0)


@kernel("mse_loss", target="cuda")
def _mse_loss(a, b, reduction):
    return _pointwise_loss(a, b, reduction, True)


@kernel("l1_loss", target="cuda")
def _l1_loss(a, b, reduction):
    return _pointwise_loss(a, b, reduction, False)


@kernel("linear", target="cuda")
def _linear(x, weight, bias):
    out = C.matmul_nd(x, weight.permuted((1, 0)))
    return out if bias is None else cew.run_binary("add", out, bias, out.dtype)


@kernel("embedding", target="cuda")
def _embedding(indices: CudaArray, weight: CudaArray, padding_idx) -> CudaArray:
    rows = index_select(weight, 0, indices.reshape(-1))
    return rows.reshape(indices.shape + weight.shape[1:])


@kernel("embedding_backward", target="cuda")
def _embedding_backward(g: CudaArray, indices: CudaArray, num_weights: int,
                        padding_idx) -> CudaArray:
    dim = g.shape[-1]
    out = full((num_weights, dim), 0, g.dtype)
    g2 = g.reshape(-1, dim)
    idx = along_dim_index(indices, g2.shape, 0)
    C.scatter_dim(out, 0, idx, g2, True,
                  skip=-(2 ** 62) if padding_idx is None else int(padding_idx))
    return out


@kernel("one_hot", target="cuda")
def _one_hot(x: CudaArray, num_classes: int) -> CudaArray:
    out = full(x.shape + (int(num_classes),), 0, np.int64)
    idx = x.astype(np.int64, copy=False).reshape(x.shape + (1,))
    C.scatter_dim(out, out.ndim - 1, idx, full((), 1, np.int64), False)
    return out
