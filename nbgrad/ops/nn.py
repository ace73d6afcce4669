"""Neural-network ops (activations, losses, normalisation) for ``nbgrad.nn.functional``.

Each op has a table entry whose formulas are expressions over table ops, so second
and higher derivatives need no extra code. Losses that combine a log-softmax with a
likelihood (``cross_entropy``, ``binary_cross_entropy_with_logits``) run fused,
numerically stable kernels from :mod:`nbgrad.kernels.nn`. Probability targets of
``cross_entropy`` go through ``log_softmax`` and table ops, so the target gets a
gradient too.
"""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from .. import random as nb_random
from ..kernels import elementwise as ew
from ..kernels import nn as nk
from ..kernels import reduction as rk
from ..kernels.blas import matmul2d
from ..kernels.layout import c_contiguous, call_native
from ..tensor import STATE_TRACE, Tensor
from . import elementwise as _elementwise
from .convert import to_dtype
from .dispatch import apply, as_tensor, promote_operands
from .reduction import sum as _sum
from .registry import formula_helper, get, kernel, op_function
from .shape import expand, reshape
from .traits import Elementwise, Matmul, NativePlan, Opaque, batching

__all__ = [
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy", "dropout",
    "dropout1d", "dropout2d", "dropout3d", "elu", "embedding", "gelu", "layer_norm",
    "leaky_relu", "linear", "l1_loss", "log_softmax", "mse_loss", "nll_loss", "one_hot",
    "silu", "softmax",
]

silu = _elementwise.silu  # registered from its scalar expression

_REDUCTIONS = ("none", "mean", "sum")


def _float_tensor(value, op: str, like: Tensor | None = None) -> Tensor:
    t = as_tensor(value, dtype=like.dtype if like is not None and not isinstance(
        value, Tensor) else None)
    if t.dtype.kind != "f":
        t = to_dtype(t, like.dtype if like is not None and like.dtype.kind == "f"
                     else dtypes.float64)
    return t


def _reduction(reduction: str, op: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


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


def _gelu_params(approximate: str) -> tuple[float]:
    return (0.0 if approximate == "none" else 1.0,)


@kernel("gelu", kind=Elementwise(ew.UNARY["gelu"], encode=_gelu_params))
def _gelu_kernel(x, approximate):
    return ew.run_unary("gelu", x, x.dtype, *_gelu_params(approximate))


@op_function("gelu")
def gelu(self: Tensor, approximate: str = "none") -> Tensor:
    """``x * Phi(x)`` (``approximate='none'``) or its tanh approximation (``'tanh'``)."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return apply(get("gelu"), (_float_tensor(self, "gelu"), approximate))


# ------------------------------------------------------------------ softmax
def _softmax_kind(log: bool) -> Opaque:
    return Opaque(native=nk.softmax_native, static=lambda attrs, shapes: NativePlan(
        (*rk.arb_plan(shapes[0], (attrs["dim"],) if shapes[0] else ())[1:4], attrs["dtype"],
         log), (tuple(shapes[0]),)))


_SOFTMAX, _LOG_SOFTMAX = _softmax_kind(False), _softmax_kind(True)


@kernel("softmax", kind=_SOFTMAX, batch=batching("along"))
def _softmax_kernel(x, dim, dtype):
    return call_native(_SOFTMAX, (x,), {"dim": dim, "dtype": dtype})


@kernel("log_softmax", kind=_LOG_SOFTMAX, batch=batching("along"))
def _log_softmax_kernel(x, dim, dtype):
    return call_native(_LOG_SOFTMAX, (x,), {"dim": dim, "dtype": dtype})


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


def _loss_code(reduction: str) -> int:
    return _REDUCTIONS.index(reduction)


def _loss_shape(reduction: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape) if reduction == "none" else ()


def _class_loss_kind(op: str, fused: bool) -> Opaque:
    def static(attrs: dict, shapes: tuple) -> NativePlan:
        return NativePlan((*_class_layout(shapes[0]), int(attrs["ignore_index"]),
                           float(attrs["label_smoothing"]), _loss_code(attrs["reduction"]),
                           fused, op), (_loss_shape(attrs["reduction"], shapes[1]),))
    return Opaque(native=nk.class_loss_native, static=static)


_NLL = _class_loss_kind("nll_loss", False)
_CROSS_ENTROPY = _class_loss_kind("cross_entropy", True)


def _class_loss_attrs(ignore_index, reduction, label_smoothing) -> dict:
    return {"ignore_index": ignore_index, "reduction": reduction,
            "label_smoothing": label_smoothing}


@kernel("nll_loss", kind=_NLL, batch=batching("class_loss"))
def _nll_loss_kernel(logp, target, weight, ignore_index, reduction, label_smoothing):
    return call_native(_NLL, (logp, target, weight),
                       _class_loss_attrs(ignore_index, reduction, label_smoothing))


def _nll_backward_static(attrs: dict, shapes: tuple) -> NativePlan:
    sizes = tuple(attrs["sizes"])
    return NativePlan((*_class_layout(sizes), int(attrs["ignore_index"]),
                       float(attrs["label_smoothing"]), _loss_code(attrs["reduction"]),
                       "nll_loss_backward"), (sizes,))


_NLL_BACKWARD = Opaque(native=nk.nll_backward_native, static=_nll_backward_static)


@kernel("nll_loss_backward", kind=_NLL_BACKWARD, batch=batching("nll_loss_backward"))
def _nll_loss_backward_kernel(g, target, weight, sizes, ignore_index, reduction,
                              label_smoothing):
    return call_native(_NLL_BACKWARD, (g, target, weight), {
        "sizes": sizes, **_class_loss_attrs(ignore_index, reduction, label_smoothing)})


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


@kernel("cross_entropy", kind=_CROSS_ENTROPY, batch=batching("class_loss"))
def _cross_entropy_kernel(x, target, weight, ignore_index, reduction, label_smoothing):
    return call_native(_CROSS_ENTROPY, (x, target, weight),
                       _class_loss_attrs(ignore_index, reduction, label_smoothing))


def _soft_cross_entropy(x: Tensor, q: Tensor, weight, reduction: str, smoothing: float):
    """Cross entropy against class probabilities ``q``, from table ops (so ``q`` gets a
    gradient too)."""
    cdim = class_dim(x.ndim)
    C = x.shape[cdim]
    if smoothing:
        q = q * (1.0 - smoothing) + smoothing / C
    if weight is not None:
        shape = [1] * x.ndim
        shape[cdim] = C
        q = q * reshape(weight, shape)
    per = -_sum(q * log_softmax(x, cdim), cdim)
    if reduction == "none":
        return per
    total = _sum(per)
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
_ONE_HOT = Opaque(native=nk.one_hot_native, static=lambda attrs, shapes: NativePlan(
    (int(attrs["num_classes"]), len(shapes[0])),
    (tuple(shapes[0]) + (int(attrs["num_classes"]),),)))


@kernel("one_hot", kind=_ONE_HOT, batch=batching("one_hot"))
def _one_hot_kernel(x, num_classes):
    return call_native(_ONE_HOT, (x,), {"num_classes": num_classes})


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
        a, b = to_dtype(a, dtypes.float64), to_dtype(b, dtypes.float64)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise RuntimeError(f"{op}: input of shape {a.shape} and target of shape {b.shape} "
                           "cannot be broadcast together") from None
    return a, b, _reduction(reduction, op)


def _pointwise_kind(squared: bool) -> Opaque:
    def static(attrs: dict, shapes: tuple) -> NativePlan:
        shape = np.broadcast_shapes(*shapes)
        return NativePlan((*map(tuple, shapes), shape, squared, _loss_code(attrs["reduction"])),
                          (_loss_shape(attrs["reduction"], shape),))
    return Opaque(native=nk.pointwise_loss_native, static=static)


_MSE, _L1 = _pointwise_kind(True), _pointwise_kind(False)


@kernel("mse_loss", kind=_MSE, batch=batching("broadcasting", first=False))
def _mse_loss_kernel(a, b, reduction):
    return call_native(_MSE, (a, b), {"reduction": reduction})


@kernel("l1_loss", kind=_L1, batch=batching("broadcasting", first=False))
def _l1_loss_kernel(a, b, reduction):
    return call_native(_L1, (a, b), {"reduction": reduction})


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
                w = to_dtype(w, x.dtype)
        out.append(w)
    return (*out, _reduction(reduction, op))


def _binary_static(attrs: dict, shapes: tuple) -> NativePlan:
    """The weights' shapes (() when absent), the input's, the reduction."""
    return NativePlan((*(() if s is None else tuple(s) for s in shapes[2:]), tuple(shapes[0]),
                       _loss_code(attrs["reduction"])),
                      (_loss_shape(attrs["reduction"], shapes[0]),))


_BCE = Opaque(native=nk.binary_cross_entropy_native, static=_binary_static)
_BCE_LOGITS = Opaque(native=nk.bce_with_logits_native, static=_binary_static)


@kernel("binary_cross_entropy", kind=_BCE, batch=batching("broadcasting", first=False))
def _bce_kernel(p, t, weight, reduction):
    if p.size and (p.min() < 0 or p.max() > 1):  # the native says it without the values
        raise RuntimeError("binary_cross_entropy: all input values must be between 0 and 1 "
                           f"(got [{p.min()}, {p.max()}])")
    return call_native(_BCE, (p, t, weight), {"reduction": reduction})


@op_function("binary_cross_entropy")
def binary_cross_entropy(self: Tensor, target: Tensor, weight: Tensor | None = None,
                         reduction: str = "mean") -> Tensor:
    """``-weight * (target * log(p) + (1 - target) * log(1 - p))`` for probabilities ``p``;
    each log is clamped at -100 (as torch)."""
    return apply(get("binary_cross_entropy"),
                 _binary_args("binary_cross_entropy", self, target, [("weight", weight)],
                              reduction))


@kernel("binary_cross_entropy_with_logits", kind=_BCE_LOGITS,
        batch=batching("broadcasting", first=False))
def _bce_logits_kernel(x, t, weight, pos_weight, reduction):
    return call_native(_BCE_LOGITS, (x, t, weight, pos_weight), {"reduction": reduction})


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
def _layer_norm_static(attrs: dict, shapes: tuple) -> NativePlan:
    D = math.prod(attrs["normalized_shape"])
    return NativePlan(((math.prod(shapes[0]) // D if D else 0), D, float(attrs["eps"])),
                      (tuple(shapes[0]),))


_LAYER_NORM = Opaque(native=nk.layer_norm_native, static=_layer_norm_static)


@kernel("layer_norm", kind=_LAYER_NORM, batch=batching("layer_norm"))
def _layer_norm_kernel(x, normalized_shape, weight, bias, eps):
    return call_native(_LAYER_NORM, (x, weight, bias),
                       {"normalized_shape": normalized_shape, "eps": eps})


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
                p = to_dtype(p, x.dtype)
        params.append(p)
    return apply(get("layer_norm"), (x, shape, params[0], params[1], float(eps)))


# ------------------------------------------------------------------ dropout
@kernel("dropout", kind=Opaque(why_not_native=(
    "its mask comes from a NumPy Generator chosen in Python at each call (nbgrad.random's "
    "unless one is given)")))
def _dropout_kernel(x, p, training, inplace, generator):
    if generator is None:
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


def _feature_dropout(op: str, x, p: float, training: bool, spatial: int) -> Tensor:
    """Whole channels zeroed: one mask value per (sample, channel), drawn by dropout."""
    x = _float_tensor(x, op)
    if x.ndim not in (spatial + 1, spatial + 2):
        raise ValueError(f"{op}: expected a {spatial + 1}-D or {spatial + 2}-D input, got "
                         f"shape {tuple(x.shape)}")
    if not training or float(p) == 0.0:
        return x
    lead = x.shape[:x.ndim - spatial]
    ones = Tensor._make(np.ones(lead + (1,) * spatial, x.dtype), device=x._device)
    return x * dropout(ones, p, True)


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, L) or (C, L) inputs with probability ``p``."""
    return _feature_dropout("dropout1d", input, p, training, 1)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    """Zero whole channels of (N, C, H, W) or (C, H, W) inputs with probability ``p``."""
    return _feature_dropout("dropout2d", input, p, training, 2)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True,  # noqa: A002
              inplace: bool = False) -> Tensor:
    return _feature_dropout("dropout3d", input, p, training, 3)


# ------------------------------------------------------------------ embedding, linear
def _range_suffix(op: str, n: int, shapes: tuple) -> tuple[str, str]:
    """The two halves around the bad index of check_index_range's message."""
    return (f"{op}: index ", f" is out of range for {n} rows (input {tuple(shapes[0])}, "
            f"weight {tuple(shapes[1])})")


_EMBEDDING = Opaque(native=nk.embedding_native, static=lambda attrs, shapes: NativePlan(
    (shapes[1][0], shapes[1][1], *_range_suffix("embedding", shapes[1][0], shapes)),
    (tuple(shapes[0]) + tuple(shapes[1][1:]),)))


@kernel("embedding", kind=_EMBEDDING, batch=batching("embedding"))
def _embedding_kernel(indices, weight, padding_idx):
    return call_native(_EMBEDDING, (indices, weight), {"padding_idx": padding_idx})


def _embedding_backward_static(attrs: dict, shapes: tuple) -> NativePlan:
    n, pad, dim = int(attrs["num_weights"]), attrs["padding_idx"], shapes[0][-1]
    return NativePlan((n, dim, -1 if pad is None else int(pad), *_range_suffix(
        "embedding_backward", n, (shapes[1], (n, dim)))), ((n, dim),))


_EMBEDDING_BACKWARD = Opaque(native=nk.embedding_backward_native,
                             static=_embedding_backward_static)


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


@kernel("embedding_backward", kind=_EMBEDDING_BACKWARD, batch=batching("embedding_backward"))
def _embedding_backward_kernel(g, indices, num_weights, padding_idx):
    return call_native(_EMBEDDING_BACKWARD, (g, indices),
                       {"num_weights": num_weights, "padding_idx": padding_idx})


@op_function("embedding_backward")
def embedding_backward(grad_output: Tensor, input: Tensor, num_weights: int,  # noqa: A002
                       padding_idx: int | None = None) -> Tensor:
    """The gradient of :func:`embedding` for its weight (a backward helper)."""
    return apply(get("embedding_backward"), (grad_output, input, int(num_weights),
                                             padding_idx))


@kernel("linear", kind=Matmul(transpose_b=True, bias=2))
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
            b = to_dtype(b, x.dtype)
        if b.ndim == 0:
            b = expand(b, (w.shape[0],))
    return apply(get("linear"), (x, w, b))

