"""Normalisations of ``torch.nn.functional`` written over table ops: ``batch_norm``,
``instance_norm``, ``group_norm`` and ``rms_norm`` (``layer_norm`` has its own kernel in
:mod:`nbgrad.ops.nn`). Each differentiates to any order and runs natively in both jit
tiers.

Running statistics are updated in place, without recording a gradient, as PyTorch does.
Inside ``nbgrad.jit`` that update would run only while the function is traced, so it
raises instead: normalise with the running statistics there (``training=False``), or
pass no running statistics.
"""

from __future__ import annotations

import math

import numpy as np

from ..grad_mode import no_grad
from ..tensor import STATE_TRACE, Tensor
from .dispatch import as_tensor
from .elementwise import rsqrt
from .reduction import mean
from .shape import reshape

__all__ = ["batch_norm", "group_norm", "instance_norm", "rms_norm"]


def _float_input(op: str, input, min_ndim: int) -> Tensor:  # noqa: A002
    x = as_tensor(input)
    if x.dtype.kind != "f":
        raise TypeError(f"{op}: expected a floating input, got {x.dtype} of shape "
                        f"{tuple(x.shape)}")
    if x.ndim < min_ndim:
        raise ValueError(f"{op}: expected an input of at least {min_ndim} dimensions "
                         f"(N, C, ...), got shape {tuple(x.shape)}")
    return x


def _channel_param(op: str, name: str, p, C: int, ndim: int) -> Tensor | None:
    """``p`` (a per-channel vector of length C) shaped to broadcast over (N, C, ...)."""
    if p is None:
        return None
    p = as_tensor(p)
    if tuple(p.shape) != (C,):
        raise ValueError(f"{op}: {name} must have shape ({C},) for {C} channels, got "
                         f"{tuple(p.shape)}")
    return reshape(p, (1, C) + (1,) * (ndim - 2))


def _affine(y: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _update_running(op: str, running: Tensor, stat: Tensor, momentum: float | None,
                    count: int) -> None:
    """``running = (1 - momentum) * running + momentum * stat`` in place (a cumulative
    average over ``count`` updates when ``momentum`` is None, as PyTorch)."""
    tracer = STATE_TRACE.tracer
    if tracer is not None and tracer.is_traced(stat):
        raise RuntimeError(
            f"{op}: updating running statistics inside nbgrad.jit is not supported (the "
            "update would run only while the function is traced); call .eval() on the "
            "module (training=False) inside the jitted function, use "
            "track_running_stats=False, or run the training step eagerly")
    factor = 1.0 / count if momentum is None else float(momentum)
    with no_grad():
        data = running._data
        data *= 1.0 - factor
        data += factor * np.asarray(stat._data, dtype=data.dtype).reshape(data.shape)
    running._version_box[0] += 1


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,  # noqa: A002
               weight: Tensor | None = None, bias: Tensor | None = None,
               training: bool = False, momentum: float | None = 0.1, eps: float = 1e-5,
               *, num_batches_tracked: int = 1) -> Tensor:
    """Normalise each channel (dimension 1) over the batch and spatial dimensions.

    In training (or without running statistics) the batch's mean and biased variance
    normalise; the running statistics, when given, move towards the batch's mean and
    unbiased variance by ``momentum``. Otherwise the running statistics normalise.
    """
    x = _float_input("batch_norm", input, 2)
    C = x.shape[1]
    dims = (0, *range(2, x.ndim))
    use_batch = training or running_mean is None or running_var is None
    if use_batch:
        count = x.size // C if C else 0
        if training and count <= 1:
            raise ValueError("batch_norm: expected more than 1 value per channel when "
                             f"training, got input of shape {tuple(x.shape)}")
        mu = mean(x, dims, keepdim=True)
        var = mean((x - mu) ** 2, dims, keepdim=True)
        if training:
            for running, stat in ((running_mean, mu), (running_var, var * (count / (count - 1)))):
                if running is not None:
                    _update_running("batch_norm", running, stat, momentum, num_batches_tracked)
    else:
        mu = _channel_param("batch_norm", "running_mean", running_mean, C, x.ndim)
        var = _channel_param("batch_norm", "running_var", running_var, C, x.ndim)
    y = (x - mu) * rsqrt(var + eps)
    return _affine(y, _channel_param("batch_norm", "weight", weight, C, x.ndim),
                   _channel_param("batch_norm", "bias", bias, C, x.ndim))


def instance_norm(input: Tensor, running_mean: Tensor | None = None,  # noqa: A002
                  running_var: Tensor | None = None, weight: Tensor | None = None,
                  bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalise each channel of each sample over its spatial dimensions."""
    x = _float_input("instance_norm", input, 3)
    N, C = x.shape[:2]
    if use_input_stats:
        dims = tuple(range(2, x.ndim))
        mu = mean(x, dims, keepdim=True)
        var = mean((x - mu) ** 2, dims, keepdim=True)
        count = math.prod(x.shape[2:])
        for running, stat in ((running_mean, mu), (running_var, var * (count / max(count - 1, 1)))):
            if running is not None:
                _update_running("instance_norm", running, mean(stat, 0), momentum, 1)
        y = (x - mu) * rsqrt(var + eps)
    else:
        y = batch_norm(x, running_mean, running_var, training=False, eps=eps)
    return _affine(y, _channel_param("instance_norm", "weight", weight, C, x.ndim),
                   _channel_param("instance_norm", "bias", bias, C, x.ndim))


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,  # noqa: A002
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalise each of ``num_groups`` groups of channels of each sample."""
    x = _float_input("group_norm", input, 2)
    N, C = x.shape[:2]
    if num_groups <= 0 or C % num_groups:
        raise ValueError(f"group_norm: {C} channels cannot be split into {num_groups} "
                         f"groups (input of shape {tuple(x.shape)})")
    g = reshape(x, (N, num_groups, -1))
    mu = mean(g, 2, keepdim=True)
    var = mean((g - mu) ** 2, 2, keepdim=True)
    y = reshape((g - mu) * rsqrt(var + eps), tuple(x.shape))
    return _affine(y, _channel_param("group_norm", "weight", weight, C, x.ndim),
                   _channel_param("group_norm", "bias", bias, C, x.ndim))


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,  # noqa: A002
             eps: float | None = None) -> Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last ``len(normalized_shape)``
    dimensions (``eps`` defaults to the dtype's machine epsilon, as PyTorch)."""
    x = as_tensor(input)
    if x.dtype.kind != "f":
        raise TypeError(f"rms_norm: expected a floating input, got {x.dtype}")
    shape = ((int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer))
             else tuple(int(s) for s in normalized_shape))
    if not shape or len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise ValueError(f"rms_norm: normalized_shape {shape} does not match the last "
                         f"dimensions of the input's shape {tuple(x.shape)}")
    eps = float(np.finfo(x.dtype).eps) if eps is None else float(eps)
    dims = tuple(range(x.ndim - len(shape), x.ndim))
    y = x * rsqrt(mean(x * x, dims, keepdim=True) + eps)
    if weight is not None:
        weight = as_tensor(weight)
        if tuple(weight.shape) != shape:
            raise ValueError(f"rms_norm: weight of shape {tuple(weight.shape)} must have "
                             f"shape {shape}")
        y = y * weight
    return y
