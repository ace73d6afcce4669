"""The layers users expect from ``torch.nn``, over ``nbgrad.nn.functional``.

Weights are initialised as PyTorch's (uniform in ``±1/sqrt(fan_in)`` for linear and
convolution layers) from :mod:`nbgrad.random`'s generator, so ``nbgrad.random.seed``
makes a model reproducible; they are float64 unless ``dtype=`` says otherwise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import dtypes
from .. import random as nb_random
from ..factories import ones, zeros
from ..ops.conv import _pair
from ..tensor import Tensor
from . import functional as F
from .module import Module, Parameter

__all__ = [
    "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose2d",
    "CrossEntropyLoss",
    "Dropout", "Embedding", "Flatten", "GELU", "GroupNorm", "Identity", "LayerNorm",
    "LeakyReLU", "Linear", "LogSoftmax", "MSELoss", "MaxPool2d", "RMSNorm", "ReLU", "SiLU",
    "Sigmoid", "Softmax", "Tanh",
]


def _uniform(shape: tuple[int, ...], bound: float, dtype: Any) -> Parameter:
    values = nb_random._generator(None).uniform(-bound, bound, shape)
    return Parameter(values.astype(dtypes.as_dtype(dtype or np.float64)))


# ------------------------------------------------------------------ linear layers
class Identity(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x


class Linear(Module):
    """``x @ weight.T + bias`` with ``weight`` (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: Any = None) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform((out_features, in_features), bound, dtype)
        self.bias = _uniform((out_features,), bound, dtype) if bias else None
        if not bias:
            self.register_parameter("bias", None)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class _ConvNd(Module):
    _dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1,
                 padding=0, dilation=1, groups: int = 1, bias: bool = True,
                 dtype: Any = None) -> None:
        super().__init__()
        name = type(self).__name__
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: in_channels {in_channels} and out_channels "
                             f"{out_channels} must be divisible by groups {groups}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, name, "kernel_size", self._dims)
        self.stride, self.padding, self.dilation = stride, padding, dilation
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
        self.weight = _uniform((out_channels, in_channels // groups, *self.kernel_size),
                               bound, dtype)
        if bias:
            self.bias = _uniform((out_channels,), bound, dtype)
        else:
            self.register_parameter("bias", None)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}")


class Conv1d(_ConvNd):
    """1-D convolution of (N, C, L) inputs."""

    _dims = 1

    def forward(self, x: Tensor) -> Tensor:
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class Conv2d(_ConvNd):
    """2-D convolution of (N, C, H, W) inputs."""

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class Conv3d(_ConvNd):
    """3-D convolution of (N, C, D, H, W) inputs."""

    _dims = 3

    def forward(self, x: Tensor) -> Tensor:
        return F.conv3d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class ConvTranspose2d(_ConvNd):
    """Transposed 2-D convolution of (N, C, H, W) inputs (weight (C_in, C_out / groups,
    kh, kw), as PyTorch)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1,
                 padding=0, output_padding=0, groups: int = 1, bias: bool = True,
                 dilation=1, dtype: Any = None) -> None:
        super().__init__(out_channels, in_channels, kernel_size, stride, padding, dilation,
                         groups, bias=False, dtype=dtype)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.output_padding = output_padding
        fan_in = out_channels // groups * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
        if bias:
            self.bias = _uniform((out_channels,), bound, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)


class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, embedding_dim) picked by integer indices."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = padding_idx
        values = nb_random._generator(None).standard_normal((num_embeddings, embedding_dim))
        if padding_idx is not None:
            values[padding_idx] = 0.0
        self.weight = Parameter(values.astype(dtypes.as_dtype(dtype or np.float64)))

    def forward(self, indices: Tensor) -> Tensor:
        return F.embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


# ------------------------------------------------------------------ normalisation
class LayerNorm(Module):
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, dtype: Any = None) -> None:
        super().__init__()
        shape = ((int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer))
                 else tuple(normalized_shape))
        self.normalized_shape, self.eps = shape, eps
        self.weight = Parameter(ones(*shape, dtype=dtype)) if elementwise_affine else None
        self.bias = (Parameter(zeros(*shape, dtype=dtype)) if elementwise_affine and bias
                     else None)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, dtype: Any = None) -> None:
        super().__init__()
        shape = ((int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer))
                 else tuple(normalized_shape))
        self.normalized_shape, self.eps = shape, eps
        self.weight = Parameter(ones(*shape, dtype=dtype)) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class GroupNorm(Module):
    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, dtype: Any = None) -> None:
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels {num_channels} must be divisible by "
                             f"num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = Parameter(ones(num_channels, dtype=dtype)) if affine else None
        self.bias = Parameter(zeros(num_channels, dtype=dtype)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class _BatchNorm(Module):
    _ndims: tuple[int, ...] = (2, 3)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 dtype: Any = None) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(zeros(num_features, dtype=dtype)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", zeros((), dtype=np.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in self._ndims:
            raise ValueError(f"{type(self).__name__}: expected an input of "
                             f"{' or '.join(map(str, self._ndims))} dimensions, got shape "
                             f"{tuple(x.shape)}")
        track = self.training and self.track_running_stats
        count = 1
        if track:
            self.num_batches_tracked._data[...] += 1
            count = int(self.num_batches_tracked._data)
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training or not self.track_running_stats, self.momentum,
                            self.eps, num_batches_tracked=count)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (N, C) or (N, C, L) inputs."""


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of (N, C, H, W) inputs."""

    _ndims = (4,)


# ------------------------------------------------------------------ the rest
class Dropout(Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)


def _activation(name: str, fn, doc: str, **defaults) -> type:
    """A module class calling ``fn(x, **its arguments)``."""
    params = list(defaults)

    def __init__(self, *args, **kwargs) -> None:
        Module.__init__(self)
        if len(args) > len(params):
            raise TypeError(f"{name} takes at most {len(params)} argument(s), got {len(args)}")
        values = dict(defaults)
        values.update(zip(params[:len(args)], args, strict=True))
        unknown = set(kwargs) - set(params)
        if unknown:
            raise TypeError(f"{name}: unexpected argument(s) {sorted(unknown)}")
        values.update(kwargs)
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def forward(self, x: Tensor) -> Tensor:
        return fn(x, **{p: getattr(self, p) for p in params})

    def extra_repr(self) -> str:
        return ", ".join(f"{p}={getattr(self, p)!r}" for p in params)

    return type(name, (Module,), {"__init__": __init__, "forward": forward, "__doc__": doc,
                                  "extra_repr": extra_repr, "__module__": __name__})


ReLU = _activation("ReLU", F.relu, "``relu(x)``")
Tanh = _activation("Tanh", F.tanh, "``tanh(x)``")
Sigmoid = _activation("Sigmoid", F.sigmoid, "``sigmoid(x)``")
SiLU = _activation("SiLU", F.silu, "``x * sigmoid(x)``")
GELU = _activation("GELU", F.gelu, "``gelu(x, approximate)``", approximate="none")
LeakyReLU = _activation("LeakyReLU", F.leaky_relu, "``leaky_relu(x, negative_slope)``",
                        negative_slope=0.01)
Softmax = _activation("Softmax", F.softmax, "``softmax(x, dim)``", dim=None)
LogSoftmax = _activation("LogSoftmax", F.log_softmax, "``log_softmax(x, dim)``", dim=None)


class MSELoss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.mse_loss(input, target, self.reduction)


class CrossEntropyLoss(Module):
    def __init__(self, weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.weight, self.ignore_index = weight, ignore_index
        self.reduction, self.label_smoothing = reduction, label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)
