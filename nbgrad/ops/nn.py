"""Neural-network ops (activations, losses, normalisation) for ``nbgrad.nn.functional``.

Each op has a table entry whose formulas are expressions over table ops, so second
and higher derivatives need no extra code. Losses that combine a log-softmax with a
likelihood (``cross_entropy``, ``binary_cross_entropy_with_logits``) run fused,
numerically stable kernels from :mod:`nbgrad.kernels.nn`. Probability targets of
``cross_entropy`` go through ``log_softmax`` and table ops, so the target gets a
gradient too.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..kernels import elementwise as ew
from ..kernels import nn as nk
from ..kernels import reduction as rk
from ..kernels.blas import matmul2d
from ..kernels.layout import c_contiguous
from ..tensor import STATE_TRACE, Tensor
from . import elementwise as _elementwise
from .dispatch import apply, as_tensor, promote_operands
from .registry import formula_helper, get, kernel, op_function

__all__ = [
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy", "dropout",
    "elu", "embedding", "gelu", "layer_norm", "leaky_relu", "linear", "l1_loss",
    "log_softmax", "mse_loss", "nll_loss", "one_hot", "silu", "softmax",
]

silu = _elementwise.silu  # registered from its scalar expression

_REDUCTIONS = ("none", "mean", "sum")


def _float_tensor(value, op: str, like: Tensor | None = None) -> Tensor:
    t = as_tensor(value, dtype=like.dtype if like is not None and not isinstance(
        value, Tensor) else None)
    if t.dtype.kind != "f":
        from .convert import to_dtype
        t = to_dtype(t, like.dtype if like is not None and like.dtype.kind == "f"
                     else dtypes.float64)
    return t


def _reduction(reduction: str, op: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


def _reduce_loss(values: np.ndarray, reduction: str, denom: float | None = None):
    """Per-element losses reduced: as they are, summed, or summed and divided by ``denom``
    (default: their count; NaN when it is 0, as torch)."""
    if reduction == "none":
        return values
    total = values.sum(dtype=np.float64)
    if reduction == "mean":
        denom = values.size if denom is None else denom
        total = total / denom if denom else np.nan
    return np.asarray(total, values.dtype)


def _flat_broadcast(x: np.ndarray, shape: tuple[int, ...], dtype) -> np.ndarray:
    return c_contiguous(np.broadcast_to(x, shape), dtype).reshape(-1)


# ------------------------------------------------------------------ metadata helpers
@formula_helper
def class_dim(ndim: int) -> int:
    """The class dimension of a loss input: 0 for a 1-D input, else 1."""
    return 0 if ndim == 1 else 1


@formula_helper
def loss_divisor(reduction: str, *shapes) -> int:
    """What a loss's 'mean' divides by (the broadcast element count); 1 otherwise."""
    if reduction != "mean":
        return 1
    return int(np.prod(np.broadcast_shapes(*shapes), dtype=np.int64))


@formula_helper
def trailing_dims(ndim: int, normalized_shape) -> tuple[int, ...]:
    """The last ``len(normalized_shape)`` dimensions (what layer_norm normalises)."""
    return tuple(range(ndim - len(normalized_shape), ndim))


# ------------------------------------------------------------------ activations
@op_function("leaky_relu")
def leaky_relu(self: Tensor, negative_slope: float = 0.01) -> Tensor:
    """``x`` where ``x > 0``, else ``negative_slope * x`` (slope at 0: ``negative_slope``)."""
    return apply(get("leaky_relu"), (_float_tensor(self, "leaky_relu"),
                                     float(negative_slope)))


@op_function("elu")
def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
    """``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``."""
    return apply(get("elu"), (_float_tensor(self, "elu"), float(alpha)))


@kernel("gelu")
def _gelu_kernel(x, approximate):
    return ew.run_unary("gelu", x, x.dtype, 0.0 if approximate == "none" else 1.0)


@op_function("gelu")
def gelu(self: Tensor, approximate: str = "none") -> Tensor:
    """``x * Phi(x)`` (``approximate='none'``) or its tanh approximation (``'tanh'``)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return apply(get("gelu"), (_float_tensor(self, "gelu"), approximate))


# ------------------------------------------------------------------ softmax
def _softmax(x: np.ndarray, dim: int, dtype, log: bool) -> np.ndarray:
    if dtype is not None and x.dtype != dtype:
        x = x.astype(dtype)
    flat, A, R, B, _ = rk.arb_view(x, (dim,))
    out = np.empty(flat.size, x.dtype)
    nk.softmax_arb(flat, A, R, B, log, out)
    return out.reshape(x.shape)


@kernel("softmax")
def _softmax_kernel(x, dim, dtype):
    return _softmax(x, dim, dtype, False)


@kernel("log_softmax")
def _log_softmax_kernel(x, dim, dtype):
    return _softmax(x, dim, dtype, True)


def _softmax_args(op: str, self, dim, dtype, axis):
    self = _float_tensor(self, op)
    if axis is not None:
        dim = axis
    if dim is None:
        raise TypeError(f"{op}: dim is required")
    d = rk.normalize_dims(int(dim), self.ndim, op)[0]
    dt = dtypes.as_dtype(dtype) if dtype is not None else None
    if dt is not None and dt.kind != "f":
        raise TypeError(f"{op}: dtype must be floating, got {dt}")
    return self, d, dt


@op_function("softmax")
def softmax(self: Tensor, dim: int | None = None, dtype=None, *, axis=None) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim``, with the maximum taken out first."""
    return apply(get("softmax"), _softmax_args("softmax", self, dim, dtype, axis))


@op_function("log_softmax")
def log_softmax(self: Tensor, dim: int | None = None, dtype=None, *, axis=None) -> Tensor:
    """``x - logsumexp(x)`` along ``dim``; stable for inputs of any magnitude."""
    return apply(get("log_softmax"), _softmax_args("log_softmax", self, dim, dtype, axis))


# ------------------------------------------------------------------ nll_loss, cross_entropy
def _class_layout(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(A, C, B) of a loss input: (1, C, 1) for (C,), (N, C, prod(rest)) otherwise."""
    if len(shape) == 1:
        return 1, shape[0], 1
    return shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64))


def _class_weight(weight: np.ndarray | None, C: int, dtype) -> np.ndarray:
    return np.ones(C, dtype) if weight is None else c_contiguous(weight, dtype).reshape(-1)


def _check_classes(op: str, self: Tensor, target: Tensor, weight, ignore_index: int) -> None:
    shape, tshape = tuple(self.shape), tuple(target.shape)
    if self.ndim == 0:
        raise RuntimeError(f"{op}: input must have a class dimension, got shape {shape}")
    want = () if self.ndim == 1 else (shape[0],) + shape[2:]
    if tshape != want:
        raise RuntimeError(f"{op}: target of shape {tshape} does not match input of shape "
                           f"{shape} (expected target shape {want})")
    C = shape[0] if self.ndim == 1 else shape[1]
    if weight is not None and tuple(weight.shape) != (C,):
        raise RuntimeError(f"{op}: weight must have shape ({C},) for {C} classes, got "
                           f"{tuple(weight.shape)}")
    tracer = STATE_TRACE.tracer
    if tracer is None or not tracer.is_traced(target):  # traced: the kernel checks
        _check_target_values(op, target.numpy(), C, ignore_index)  # a host copy on CUDA


def _check_target_values(op: str, t: np.ndarray, C: int, ignore_index: int) -> None:
    """Class indices must lie in [0, C) (or equal ``ignore_index``): the kernels index
    with them, so this runs before every CPU kernel too (e.g. in jit replays)."""
    bad = (t != ignore_index) & ((t < 0) | (t >= C))
    if bad.any():
        raise IndexError(f"{op}: target {int(t[bad].reshape(-1)[0])} is out of bounds for "
                         f"{C} classes")


def _loss_from_samples(loss: np.ndarray, wt: np.ndarray, tshape, reduction: str, dtype):
    loss = loss.astype(dtype, copy=False)
    if reduction == "none":
        return loss.reshape(tshape)
    return _reduce_loss(loss, reduction, float(wt.sum(dtype=np.float64)))


@kernel("nll_loss")
def _nll_loss_kernel(logp, target, weight, ignore_index, reduction, label_smoothing):
    A, C, B = _class_layout(logp.shape)
    _check_target_values("nll_loss", target, C, ignore_index)
    loss = np.empty(A * B, np.float64)
    wt = np.empty(A * B, np.float64)
    nk.nll_fwd(c_contiguous(logp).reshape(-1), c_contiguous(target, np.int64).reshape(-1),
               _class_weight(weight, C, np.float64), A, C, B, ignore_index,
               label_smoothing, loss, wt)
    return _loss_from_samples(loss, wt, target.shape, reduction, logp.dtype)


@kernel("nll_loss_backward")
def _nll_loss_backward_kernel(g, target, weight, sizes, ignore_index, reduction,
                              label_smoothing):
    sizes = tuple(sizes)
    A, C, B = _class_layout(sizes)
    _check_target_values("nll_loss_backward", target, C, ignore_index)
    t = c_contiguous(target, np.int64).reshape(-1)
    w = _class_weight(weight, C, np.float64)
    if reduction == "none":
        gs = c_contiguous(g, np.float64).reshape(-1)
    else:
        scale = float(g)
        if reduction == "mean":
            kept = t != ignore_index
            denom = w[t[kept]].sum()
            scale = scale / denom if denom else np.nan
        gs = np.full(A * B, scale)
    out = np.empty(A * C * B, g.dtype)
    nk.nll_bwd(gs, t, w, A, C, B, ignore_index, label_smoothing, out)
    return out.reshape(sizes)


@op_function("nll_loss_backward")
def nll_loss_backward(grad_output: Tensor, target: Tensor, weight: Tensor | None, sizes,
                      ignore_index: int, reduction: str, label_smoothing: float) -> Tensor:
    """The gradient of :func:`nll_loss` with respect to its input (a backward helper)."""
    return apply(get("nll_loss_backward"),
                 (grad_output, target, weight, tuple(int(s) for s in sizes),
                  int(ignore_index), reduction, float(label_smoothing)))


def _nll_args(op: str, self, target, weight, ignore_index, reduction, label_smoothing):
    self = _float_tensor(self, op)
    target = as_tensor(target)
    if target.dtype.kind not in "iu":
        raise TypeError(f"{op}: target must hold class indices (an integer tensor), got "
                        f"{target.dtype}")
    if weight is not None:
        weight = _float_tensor(weight, op, self)
        if weight.dtype != self.dtype:
            from .convert import to_dtype
            weight = to_dtype(weight, self.dtype)
    _check_classes(op, self, target, weight, int(ignore_index))
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    return (self, target, weight, int(ignore_index), _reduction(reduction, op),
            float(label_smoothing))


@op_function("nll_loss")
def nll_loss(self: Tensor, target: Tensor, weight: Tensor | None = None,
             ignore_index: int = -100, reduction: str = "mean",
             label_smoothing: float = 0.0) -> Tensor:
    """Negative log-likelihood of log-probabilities ``self`` ((C,), (N, C) or (N, C, d...))
    at class indices ``target``; ``weight`` per class; ``'mean'`` divides by the summed
    weights of the targets that are not ``ignore_index``. ``label_smoothing`` (an
    nbgrad extension) mixes in the uniform distribution as ``cross_entropy`` does."""
    return apply(get("nll_loss"), _nll_args("nll_loss", self, target, weight, ignore_index,
                                            reduction, label_smoothing))


@kernel("cross_entropy")
def _cross_entropy_kernel(x, target, weight, ignore_index, reduction, label_smoothing):
    A, C, B = _class_layout(x.shape)
    _check_target_values("cross_entropy", target, C, ignore_index)
    loss = np.empty(A * B, np.float64)
    wt = np.empty(A * B, np.float64)
    nk.cross_entropy_fwd(c_contiguous(x).reshape(-1), c_contiguous(target, np.int64)
                         .reshape(-1), _class_weight(weight, C, np.float64), A, C, B,
                         ignore_index, label_smoothing, loss, wt)
    return _loss_from_samples(loss, wt, target.shape, reduction, x.dtype)


def _soft_cross_entropy(x: Tensor, q: Tensor, weight, reduction: str, smoothing: float):
    """Cross entropy against class probabilities ``q``, from table ops (so ``q`` gets a
    gradient too)."""
    from . import reshape, sum
    cdim = class_dim(x.ndim)
    C = x.shape[cdim]
    if smoothing:
        q = q * (1.0 - smoothing) + smoothing / C
    if weight is not None:
        shape = [1] * x.ndim
        shape[cdim] = C
        q = q * reshape(weight, shape)
    per = -sum(q * log_softmax(x, cdim), cdim)
    if reduction == "none":
        return per
    total = sum(per)
    return total / (x.size // C) if reduction == "mean" else total


@op_function("cross_entropy")
def cross_entropy(self: Tensor, target: Tensor, weight: Tensor | None = None,
                  ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """Cross entropy of logits ``self`` ((C,), (N, C) or (N, C, d...)) against class indices
    (integer ``target``) or class probabilities (float ``target`` of the input's shape),
    with torch's ``weight``, ``ignore_index``, ``reduction`` and ``label_smoothing``.
    Computed through a stable log-softmax (logits of magnitude 1e3 are fine)."""
    t = as_tensor(target)
    if t.dtype.kind == "f":
        x = _float_tensor(self, "cross_entropy")
        if tuple(t.shape) != tuple(x.shape):
            raise RuntimeError(f"cross_entropy: probability target of shape {t.shape} must "
                               f"match the input's shape {x.shape}")
        if x.ndim == 0:
            raise RuntimeError("cross_entropy: input must have a class dimension")
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got "
                             f"{label_smoothing}")
        x, t = promote_operands(x, t)
        w = None if weight is None else _float_tensor(weight, "cross_entropy", x)
        C = x.shape[class_dim(x.ndim)]
        if w is not None and tuple(w.shape) != (C,):
            raise RuntimeError(f"cross_entropy: weight must have shape ({C},), got "
                               f"{tuple(w.shape)}")
        return _soft_cross_entropy(x, t, w, _reduction(reduction, "cross_entropy"),
                                   float(label_smoothing))
    return apply(get("cross_entropy"), _nll_args("cross_entropy", self, t, weight,
                                                 ignore_index, reduction, label_smoothing))


# ------------------------------------------------------------------ one_hot
@kernel("one_hot")
def _one_hot_kernel(x, num_classes):
    out = np.zeros(x.shape + (num_classes,), np.int64)
    np.put_along_axis(out, x.astype(np.int64)[..., None], 1, axis=-1)
    return out


@op_function("one_hot")
def one_hot(self: Tensor, num_classes: int = -1) -> Tensor:
    """Integer class indices as one-hot int64 rows of length ``num_classes`` (default:
    the largest index plus one)."""
    self = as_tensor(self)
    if self.dtype.kind not in "iu":
        raise TypeError(f"one_hot: needs an integer tensor, got {self.dtype}")
    data = self._data
    if num_classes < 0:
        num_classes = int(data.max()) + 1 if data.size else 0
    if data.size and (data.min() < 0 or data.max() >= num_classes):
        raise RuntimeError(f"one_hot: class values must be in [0, {num_classes}), got "
                           f"[{int(data.min())}, {int(data.max())}]")
    return apply(get("one_hot"), (self, int(num_classes)))


# ------------------------------------------------------------------ regression losses
def _pair_loss_args(op: str, self, target, reduction):
    a, b = promote_operands(self, target)
    if a.dtype.kind != "f":
        from .convert import to_dtype
        a, b = to_dtype(a, dtypes.float64), to_dtype(b, dtypes.float64)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise RuntimeError(f"{op}: input of shape {a.shape} and target of shape {b.shape} "
                           "cannot be broadcast together") from None
    return a, b, _reduction(reduction, op)


def _pointwise_loss(a: np.ndarray, b: np.ndarray, reduction: str, squared: bool):
    shape = np.broadcast_shapes(a.shape, b.shape)
    out = np.empty(int(np.prod(shape, dtype=np.int64)), a.dtype)
    nk.pointwise_loss(_flat_broadcast(a, shape, a.dtype), _flat_broadcast(b, shape, a.dtype),
                      squared, out)
    return _reduce_loss(out.reshape(shape), reduction)


@kernel("mse_loss")
def _mse_loss_kernel(a, b, reduction):
    return _pointwise_loss(a, b, reduction, True)


@kernel("l1_loss")
def _l1_loss_kernel(a, b, reduction):
    return _pointwise_loss(a, b, reduction, False)


@op_function("mse_loss")
def mse_loss(self: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """``(self - target)**2``, averaged (``'mean'``), summed or per element (``'none'``)."""
    return apply(get("mse_loss"), _pair_loss_args("mse_loss", self, target, reduction))


@op_function("l1_loss")
def l1_loss(self: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """``|self - target|``, reduced as :func:`mse_loss`; its gradient at a tie is 0."""
    return apply(get("l1_loss"), _pair_loss_args("l1_loss", self, target, reduction))


# ------------------------------------------------------------------ binary cross entropy
def _binary_args(op: str, self, target, weights, reduction):
    x = _float_tensor(self, op)
    t = _float_tensor(target, op, x)
    if tuple(t.shape) != tuple(x.shape):
        raise ValueError(f"{op}: target of shape {tuple(t.shape)} must have the input's "
                         f"shape {tuple(x.shape)}")
    x, t = promote_operands(x, t)
    out = [x, t]
    for name, w in weights:
        if w is not None:
            w = _float_tensor(w, op, x)
            try:
                np.broadcast_shapes(w.shape, x.shape)
            except ValueError:
                raise RuntimeError(f"{op}: {name} of shape {tuple(w.shape)} does not "
                                   f"broadcast to the input's shape {tuple(x.shape)}") from None
            if w.dtype != x.dtype:
                from .convert import to_dtype
                w = to_dtype(w, x.dtype)
        out.append(w)
    return (*out, _reduction(reduction, op))


def _weights(w: np.ndarray | None, shape, dtype) -> np.ndarray:
    if w is None:
        return np.ones(int(np.prod(shape, dtype=np.int64)), dtype)
    return _flat_broadcast(w, shape, dtype)


@kernel("binary_cross_entropy")
def _bce_kernel(p, t, weight, reduction):
    if p.size and (p.min() < 0 or p.max() > 1):
        raise RuntimeError("binary_cross_entropy: all input values must be between 0 and 1 "
                           f"(got [{p.min()}, {p.max()}])")
    out = np.empty(p.size, p.dtype)
    nk.binary_cross_entropy_fwd(c_contiguous(p).reshape(-1), c_contiguous(t).reshape(-1),
                                _weights(weight, p.shape, p.dtype), out)
    return _reduce_loss(out.reshape(p.shape), reduction)


@op_function("binary_cross_entropy")
def binary_cross_entropy(self: Tensor, target: Tensor, weight: Tensor | None = None,
                         reduction: str = "mean") -> Tensor:
    """``-weight * (target * log(p) + (1 - target) * log(1 - p))`` for probabilities ``p``;
    each log is clamped at -100 (as torch)."""
    return apply(get("binary_cross_entropy"),
                 _binary_args("binary_cross_entropy", self, target, [("weight", weight)],
                              reduction))


@kernel("binary_cross_entropy_with_logits")
def _bce_logits_kernel(x, t, weight, pos_weight, reduction):
    out = np.empty(x.size, x.dtype)
    nk.bce_with_logits_fwd(c_contiguous(x).reshape(-1), c_contiguous(t).reshape(-1),
                           _weights(weight, x.shape, x.dtype),
                           _weights(pos_weight, x.shape, x.dtype), pos_weight is not None,
                           out)
    return _reduce_loss(out.reshape(x.shape), reduction)


@op_function("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(self: Tensor, target: Tensor,
                                     weight: Tensor | None = None,
                                     pos_weight: Tensor | None = None,
                                     reduction: str = "mean") -> Tensor:
    """Binary cross entropy of ``sigmoid(self)``, computed from the logits without
    overflow (logits of magnitude 1e3 are fine); ``pos_weight`` weighs the positive
    term (broadcast over the classes in the last dimension)."""
    return apply(get("binary_cross_entropy_with_logits"),
                 _binary_args("binary_cross_entropy_with_logits", self, target,
                              [("weight", weight), ("pos_weight", pos_weight)], reduction))


# ------------------------------------------------------------------ layer_norm
@kernel("layer_norm")
def _layer_norm_kernel(x, normalized_shape, weight, bias, eps):
    D = int(np.prod(normalized_shape, dtype=np.int64))
    M = x.size // D if D else 0
    out = np.empty(x.size, x.dtype)
    dummy = np.zeros(1, x.dtype)
    nk.layer_norm_fwd(c_contiguous(x).reshape(-1), M, D,
                      dummy if weight is None else c_contiguous(weight, x.dtype).reshape(-1),
                      dummy if bias is None else c_contiguous(bias, x.dtype).reshape(-1),
                      weight is not None, bias is not None, float(eps), out)
    return out.reshape(x.shape)


@op_function("layer_norm")
def layer_norm(self: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise over the last ``len(normalized_shape)`` dimensions to mean 0 and
    variance 1 (biased, plus ``eps``), then ``* weight + bias``."""
    x = _float_tensor(self, "layer_norm")
    shape = ((int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer))
             else tuple(int(s) for s in normalized_shape))
    if not shape or tuple(x.shape[x.ndim - len(shape):]) != shape or len(shape) > x.ndim:
        raise RuntimeError(f"layer_norm: normalized_shape {shape} does not match the last "
                           f"dimensions of the input's shape {tuple(x.shape)}")
    params = []
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            p = _float_tensor(p, "layer_norm", x)
            if tuple(p.shape) != shape:
                raise RuntimeError(f"layer_norm: {name} of shape {tuple(p.shape)} must have "
                                   f"shape {shape}")
            if p.dtype != x.dtype:
                from .convert import to_dtype
                p = to_dtype(p, x.dtype)
        params.append(p)
    return apply(get("layer_norm"), (x, shape, params[0], params[1], float(eps)))


# ------------------------------------------------------------------ dropout
@kernel("dropout")
def _dropout_kernel(x, p, training, inplace, generator):
    if generator is None:
        from .. import random as nb_random
        generator = nb_random._generator(None)  # the one nbgrad.random.seed() resets
    u = generator.random(x.size)  # float64 for every dtype: a seed gives one mask
    out = np.empty(x.size, x.dtype)
    mask = np.empty(x.size, x.dtype)
    nk.dropout_apply(c_contiguous(x).reshape(-1), u, float(p), out, mask)
    return out.reshape(x.shape), mask.reshape(x.shape)


@op_function("dropout")
def dropout(self: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False,
            generator: np.random.Generator | None = None, *, seed: int | None = None) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    The mask comes from ``generator`` (a NumPy Generator), or from a fresh generator
    seeded with ``seed``, or else from :mod:`nbgrad.random`'s generator (which
    ``nbgrad.random.seed`` resets); it is saved for the
    backward, never drawn again. Outside training (``training=False``) or with
    ``p=0`` the input is returned unchanged.
    """
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if inplace:
        raise ValueError("dropout: inplace=True is not supported; use the returned tensor")
    if seed is not None:
        if generator is not None:
            raise TypeError("dropout: give seed or generator, not both")
        generator = np.random.default_rng(seed)
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"dropout: generator must be a numpy.random.Generator, got "
                        f"{type(generator).__name__}")
    x = _float_tensor(self, "dropout")
    if not training or float(p) == 0.0:
        return x
    return apply(get("dropout"), (x, float(p), True, False, generator))[0]


# ------------------------------------------------------------------ embedding, linear
@kernel("embedding")
def _embedding_kernel(indices, weight, padding_idx):
    _embedding_range("embedding", indices, weight.shape)
    return np.take(weight, indices, axis=0)


def _embedding_range(op: str, indices: np.ndarray, weight_shape: tuple) -> None:
    from .indexing import check_index_range

    n = weight_shape[0]
    check_index_range(op, indices, 0, n, f"{n} rows",
                      f"(input {tuple(indices.shape)}, weight {tuple(weight_shape)})")


@op_function("embedding")
def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:  # noqa: A002
    """Rows of ``weight`` at the integer ``input`` indices (output ``input.shape + (dim,)``);
    the row ``padding_idx`` gets no gradient. Repeated indices accumulate gradient."""
    idx = as_tensor(input)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be an integer tensor, got {idx.dtype}")
    w = as_tensor(weight)
    if w.ndim != 2:
        raise RuntimeError(f"embedding: weight must be 2-D, got shape {tuple(w.shape)}")
    n = w.shape[0]
    data = idx._data
    if data.size and (data.min() < 0 or data.max() >= n):
        bad = data.min() if data.min() < 0 else data.max()
        raise IndexError(f"embedding: index {int(bad)} is out of range for {n} rows "
                         f"(input {tuple(idx.shape)}, weight {tuple(w.shape)})")
    if padding_idx is not None:
        if not -n <= padding_idx < n:
            raise ValueError(f"embedding: padding_idx {padding_idx} is out of range for {n} "
                             "rows")
        padding_idx = int(padding_idx) % n
    return apply(get("embedding"), (idx, w, padding_idx))


@kernel("embedding_backward")
def _embedding_backward_kernel(g, indices, num_weights, padding_idx):
    dim = g.shape[-1]
    _embedding_range("embedding_backward", indices, (num_weights, dim))
    out = np.zeros((num_weights, dim), g.dtype)
    nk.embedding_bwd(c_contiguous(g).reshape(indices.size, dim),  # not -1: dim may be 0
                     c_contiguous(indices, np.int64).reshape(-1),
                     -1 if padding_idx is None else padding_idx, out)
    return out


@op_function("embedding_backward")
def embedding_backward(grad_output: Tensor, input: Tensor, num_weights: int,  # noqa: A002
                       padding_idx: int | None = None) -> Tensor:
    """The gradient of :func:`embedding` for its weight (a backward helper)."""
    return apply(get("embedding_backward"), (grad_output, input, int(num_weights),
                                             padding_idx))


@kernel("linear")
def _linear_kernel(x, weight, bias):
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))  # not -1: x may have 0 features
    x2 = c_contiguous(x).reshape(rows, x.shape[-1])
    out = matmul2d(x2, weight.T)
    if bias is not None:
        nk.add_rows(out, c_contiguous(bias, out.dtype).reshape(-1))
    return out.reshape(x.shape[:-1] + (weight.shape[0],))


@op_function("linear")
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
    """``input @ weight.T + bias`` with ``weight`` of shape (out_features, in_features)."""
    x, w = promote_operands(input, weight)
    if x.dtype.kind != "f":
        from .convert import to_dtype
        x, w = to_dtype(x, dtypes.float64), to_dtype(w, dtypes.float64)
    if w.ndim != 2 or x.ndim == 0 or x.shape[-1] != w.shape[1]:
        raise RuntimeError(f"linear: input of shape {tuple(x.shape)} and weight of shape "
                           f"{tuple(w.shape)} do not fit (need input (..., in) and weight "
                           "(out, in))")
    b = None
    if bias is not None:
        b = _float_tensor(bias, "linear", x)
        if tuple(b.shape) not in ((w.shape[0],), ()):
            raise RuntimeError(f"linear: bias of shape {tuple(b.shape)} must have shape "
                               f"({w.shape[0]},)")
        if b.dtype != x.dtype:
            from .convert import to_dtype
            b = to_dtype(b, x.dtype)
        if b.ndim == 0:
            from . import expand
            b = expand(b, (w.shape[0],))
    return apply(get("linear"), (x, w, b))

