"""Convolution and pooling ops for ``nbgrad.nn.functional``: ``conv1d``, ``conv2d``,
``max_pool2d``, ``avg_pool2d``, and the backward ops their gradients are made of.

``conv2d_input_backward`` (a transposed convolution) and ``conv2d_weight_backward``
have table entries whose formulas are convolutions again (as PyTorch's
``convolution_backward``), so double backward needs no extra code. ``conv1d`` runs
on the 2-D kernels with a unit height. Kernels: :mod:`nbgrad.kernels.conv`.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels import conv as ck
from ..kernels.layout import call_native
from ..tensor import Tensor
from .convert import to_dtype
from .dispatch import apply, as_tensor, promote_operands
from .registry import formula_helper, get, kernel, op_function
from .shape import pad, reshape, squeeze, unsqueeze
from .traits import NativePlan, Opaque, batching

# ``pad`` lives in nbgrad.ops.shape; it is listed here too so that nbgrad.nn.functional
# (which star-imports this module) has torch's ``F.pad``
__all__ = ["avg_pool2d", "avg_pool2d_backward", "conv1d", "conv2d", "conv2d_input_backward",
           "conv2d_weight_backward", "conv_transpose1d", "conv_transpose2d", "max_pool2d", "pad"]


def _pair(value, op: str, name: str, n: int = 2) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)):
        return (int(value),) * n
    try:
        out = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int or a tuple of {n} ints, "
                        f"got {value!r}") from None
    if len(out) == 1:
        out = out * n
    if len(out) != n:
        raise RuntimeError(f"{op}: {name} must have {n} entries, got {value!r}")
    return out


def conv_out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    """Output length of a convolution along one dimension."""
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def pool_out_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """Output length of a pooling window along one dimension (torch's rule)."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _floats(op: str, *tensors):
    ts = promote_operands(*[t for t in tensors if t is not None])
    if ts[0].dtype.kind != "f":
        ts = [to_dtype(t, "float64") for t in ts]
    it = iter(ts)
    return [None if t is None else next(it) for t in tensors]


# ------------------------------------------------------------------ conv2d
def _conv_geometry(x_shape, w_shape, stride, padding, dilation) -> tuple[int, int]:
    kh, kw = w_shape[2:]
    return (conv_out_size(x_shape[2], kh, stride[0], padding[0], dilation[0]),
            conv_out_size(x_shape[3], kw, stride[1], padding[1], dilation[1]))


def _geometry(attrs: dict) -> tuple[int, ...]:
    """sh, sw, ph, pw, dh, dw, groups: the conv natives' geometry."""
    return (*attrs["stride"], *attrs["padding"], *attrs["dilation"], int(attrs["groups"]))


def _conv2d_static(attrs: dict, shapes: tuple) -> NativePlan:
    x, w = tuple(shapes[0]), tuple(shapes[1])
    Ho, Wo = _conv_geometry(x, w, attrs["stride"], attrs["padding"], attrs["dilation"])
    return NativePlan((x, w, *_geometry(attrs), Ho, Wo), ((x[0], w[0], Ho, Wo),))


_CONV2D = Opaque(native=ck.conv2d_native, static=_conv2d_static)


def _conv_attrs(stride, padding, dilation, groups) -> dict:
    return {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


@kernel("conv2d", kind=_CONV2D, batch=batching("conv"))
def _conv2d_kernel(x, w, b, stride, padding, dilation, groups):
    return call_native(_CONV2D, (x, w, b), _conv_attrs(stride, padding, dilation, groups))


def _check_conv(op: str, x: Tensor, w: Tensor, b: Tensor | None, stride, padding, dilation,
                groups: int, nd: int) -> None:
    shapes = f"(input {tuple(x.shape)}, weight {tuple(w.shape)})"
    if x.ndim != nd + 2 or w.ndim != nd + 2:
        raise RuntimeError(f"{op}: expects a {nd + 2}-D input (batch, channels, ...) and a "
                           f"{nd + 2}-D weight {shapes}")
    if not isinstance(groups, (int, np.integer)) or groups < 1:
        raise RuntimeError(f"{op}: groups must be a positive int, got {groups!r}")
    if x.shape[1] % groups or w.shape[0] % groups or w.shape[1] * groups != x.shape[1]:
        raise RuntimeError(f"{op}: {x.shape[1]} input channels and {w.shape[0]} output "
                           f"channels with groups={groups} need a weight of shape "
                           f"({w.shape[0]}, {x.shape[1] // groups}, ...) {shapes}")
    if b is not None and b.shape != (w.shape[0],):
        raise RuntimeError(f"{op}: bias must have shape ({w.shape[0]},), got "
                           f"{tuple(b.shape)}")
    if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise RuntimeError(f"{op}: stride and dilation must be positive and padding "
                           f"non-negative, got stride={stride}, padding={padding}, "
                           f"dilation={dilation}")
    for k in range(nd):
        size = conv_out_size(x.shape[2 + k], w.shape[2 + k], stride[k], padding[k],
                             dilation[k])
        if size < 1:
            raise RuntimeError(f"{op}: the kernel (with dilation and padding) is larger "
                               f"than the input {shapes}")


def _same_padding(op: str, w: Tensor, stride, dilation, nd: int):
    """torch's padding='same': (pad before, pad after) per spatial dimension."""
    if any(s != 1 for s in stride):
        raise RuntimeError(f"{op}: padding='same' needs stride 1, got {stride}")
    total = [dilation[k] * (w.shape[2 + k] - 1) for k in range(nd)]
    return [(t // 2, t - t // 2) for t in total]


def _conv_prepare(op: str, input, weight, bias, stride, padding, dilation, groups, nd: int):
    """Promote, unsqueeze an unbatched input, resolve string padding; returns the args of
    the table op and whether to squeeze the batch dimension away again."""
    x, w, b = _floats(op, input, weight, bias)
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = unsqueeze(x, 0)
    stride = _pair(stride, op, "stride", nd)
    dilation = _pair(dilation, op, "dilation", nd)
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0,) * nd
        elif padding == "same":
            pairs = _same_padding(op, w, stride, dilation, nd)
            if any(lo != hi for lo, hi in pairs):
                x = pad(x, [v for lo, hi in reversed(pairs) for v in (lo, hi)])
                padding = (0,) * nd
            else:
                padding = tuple(lo for lo, _ in pairs)
        else:
            raise ValueError(f"{op}: padding must be 'valid', 'same', an int or a tuple, "
                             f"got {padding!r}")
    else:
        padding = _pair(padding, op, "padding", nd)
    _check_conv(op, x, w, b, stride, padding, dilation, groups, nd)
    return x, w, b, stride, padding, dilation, int(groups), unbatched


@op_function("conv2d")
def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> Tensor:
    """2-D convolution (cross-correlation, as torch) of ``input`` (N, C, H, W) or (C, H, W)
    with ``weight`` (O, C/groups, kh, kw); ``padding`` may be ``'valid'`` or ``'same'``."""
    x, w, b, s, p, d, g, unbatched = _conv_prepare("conv2d", input, weight, bias, stride,
                                                    padding, dilation, groups, 2)
    out = apply(get("conv2d"), (x, w, b, s, p, d, g))
    if unbatched:
        out = squeeze(out, 0)
    return out


_CONV2D_INPUT_BACKWARD = Opaque(native=ck.conv2d_input_backward_native,
                                static=lambda attrs, shapes: NativePlan(
                                    (*map(tuple, shapes), tuple(attrs["input_size"]),
                                     *_geometry(attrs)), (tuple(attrs["input_size"]),)))


@kernel("conv2d_input_backward", kind=_CONV2D_INPUT_BACKWARD,
        batch=batching("conv2d_input_backward"))
def _conv2d_input_backward_kernel(gy, w, input_size, stride, padding, dilation, groups):
    return call_native(_CONV2D_INPUT_BACKWARD, (gy, w), {
        "input_size": input_size, **_conv_attrs(stride, padding, dilation, groups)})


@op_function("conv2d_input_backward")
def conv2d_input_backward(self: Tensor, weight: Tensor, input_size, stride, padding, dilation,
                          groups: int) -> Tensor:
    """The gradient of ``conv2d`` for its input: the transposed convolution of ``self``
    (the output gradient) with ``weight``, of shape ``input_size``."""
    self, weight = _floats("conv2d_input_backward", self, weight)
    return apply(get("conv2d_input_backward"),
                 (self, weight, tuple(int(s) for s in input_size), _pair(stride, "", ""),
                  _pair(padding, "", ""), _pair(dilation, "", ""), int(groups)))


_CONV2D_WEIGHT_BACKWARD = Opaque(native=ck.conv2d_weight_backward_native,
                                 static=lambda attrs, shapes: NativePlan(
                                     (*map(tuple, shapes), tuple(attrs["weight_size"]),
                                      *_geometry(attrs)), (tuple(attrs["weight_size"]),)))


@kernel("conv2d_weight_backward", kind=_CONV2D_WEIGHT_BACKWARD,
        batch=batching("conv2d_weight_backward"))
def _conv2d_weight_backward_kernel(gy, x, weight_size, stride, padding, dilation, groups):
    return call_native(_CONV2D_WEIGHT_BACKWARD, (gy, x), {
        "weight_size": weight_size, **_conv_attrs(stride, padding, dilation, groups)})


@op_function("conv2d_weight_backward")
def conv2d_weight_backward(self: Tensor, input: Tensor, weight_size, stride, padding,
                           dilation, groups: int) -> Tensor:
    """The gradient of ``conv2d`` for its weight: ``self`` (the output gradient) correlated
    with ``input``, of shape ``weight_size``."""
    self, input = _floats("conv2d_weight_backward", self, input)
    return apply(get("conv2d_weight_backward"),
                 (self, input, tuple(int(s) for s in weight_size), _pair(stride, "", ""),
                  _pair(padding, "", ""), _pair(dilation, "", ""), int(groups)))


# ------------------------------------------------------------------ conv1d
@formula_helper
def unit_height(shape) -> tuple[int, ...]:
    """``shape`` with a height of 1 inserted before the last dimension (1-D as 2-D)."""
    return tuple(shape[:-1]) + (1, shape[-1])


@formula_helper
def conv_pair(values, lead: int) -> tuple[int, int]:
    """A 1-D convolution parameter as the 2-D one of unit height: ``(lead, values[0])``."""
    return (lead, int(values[0]))


def _conv1d_static(attrs: dict, shapes: tuple) -> NativePlan:
    s, p, d = attrs["stride"][0], attrs["padding"][0], attrs["dilation"][0]
    x, w = tuple(shapes[0]), tuple(shapes[1])
    Wo = conv_out_size(x[2], w[2], s, p, d)
    return NativePlan((x, w, s, p, d, int(attrs["groups"]), Wo), ((x[0], w[0], Wo),))


_CONV1D = Opaque(native=ck.conv1d_native, static=_conv1d_static)


@kernel("conv1d", kind=_CONV1D, batch=batching("conv"))
def _conv1d_kernel(x, w, b, stride, padding, dilation, groups):
    return call_native(_CONV1D, (x, w, b), _conv_attrs(stride, padding, dilation, groups))


@op_function("conv1d")
def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> Tensor:
    """1-D convolution of ``input`` (N, C, L) or (C, L) with ``weight`` (O, C/groups, k)."""
    x, w, b, s, p, d, g, unbatched = _conv_prepare("conv1d", input, weight, bias, stride,
                                                    padding, dilation, groups, 1)
    out = apply(get("conv1d"), (x, w, b, s, p, d, g))
    if unbatched:
        out = squeeze(out, 0)
    return out


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None,  # noqa: A002
                     stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> Tensor:
    """The transposed 2-D convolution of ``input`` (N, C_in, H, W) or (C_in, H, W) with
    ``weight`` (C_in, C_out / groups, kh, kw): the gradient of ``conv2d`` for its input,
    so it differentiates through ``conv2d_input_backward``."""
    x, w = _floats("conv_transpose2d", input, weight)
    unbatched = x.ndim == 3
    if unbatched:
        x = unsqueeze(x, 0)
    if x.ndim != 4 or w.ndim != 4 or x.shape[1] != w.shape[0]:
        raise RuntimeError(f"conv_transpose2d: expects input (N, C_in, H, W) and weight "
                           f"(C_in, C_out/groups, kh, kw), got {tuple(x.shape)} and "
                           f"{tuple(w.shape)}")
    s, p, op_, d = (_pair(v, "conv_transpose2d", name) for v, name in
                    ((stride, "stride"), (padding, "padding"),
                     (output_padding, "output_padding"), (dilation, "dilation")))
    size = tuple((n - 1) * s[i] - 2 * p[i] + d[i] * (w.shape[2 + i] - 1) + op_[i] + 1
                 for i, n in enumerate(x.shape[2:]))
    if min(size) <= 0 or any(op_[i] >= s[i] for i in range(2)):
        raise RuntimeError(f"conv_transpose2d: output size {size} is not positive, or "
                           f"output_padding {op_} is not smaller than the stride {s} (larger "
                           "output padding, which PyTorch allows below the dilation, is not "
                           "supported)")
    out = conv2d_input_backward(x, w, (x.shape[0], w.shape[1] * int(groups), *size), s, p, d,
                                int(groups))
    if bias is not None:
        out = out + reshape(bias, (1, -1, 1, 1))
    return squeeze(out, 0) if unbatched else out


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None,  # noqa: A002
                     stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> Tensor:
    """The transposed 1-D convolution (``conv_transpose2d`` of height 1)."""
    x = as_tensor(input)
    def one(v) -> tuple[int, int]:
        return 1, int(v[0] if isinstance(v, (tuple, list)) else v)

    out = conv_transpose2d(unsqueeze(x, -2), unsqueeze(weight, -2), bias, one(stride),
                           (0, one(padding)[1]), (0, one(output_padding)[1]), groups,
                           one(dilation))
    return squeeze(out, -2)


# ------------------------------------------------------------------ pooling
def _pool_args(op: str, input: Tensor, kernel_size, stride, padding, dilation=1):
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{op}: expects a 3-D (C, H, W) or 4-D (N, C, H, W) input, got "
                           f"shape {tuple(input.shape)}")
    k = _pair(kernel_size, op, "kernel_size")
    s = k if stride is None or (not isinstance(stride, int) and len(stride) == 0) \
        else _pair(stride, op, "stride")
    p = _pair(padding, op, "padding")
    d = _pair(dilation, op, "dilation")
    if min(k) < 1 or min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise RuntimeError(f"{op}: kernel_size, stride and dilation must be positive and "
                           f"padding non-negative (kernel_size={k}, stride={s}, padding={p})")
    if any(p[i] > (d[i] * (k[i] - 1) + 1) // 2 for i in range(2)):
        raise RuntimeError(f"{op}: padding {p} must be at most half of the kernel size {k}")
    return k, s, p, d


def _pool_shape(op, shape, k, s, p, d, ceil_mode) -> tuple[int, int]:
    Ho = pool_out_size(shape[-2], k[0], s[0], p[0], d[0], ceil_mode)
    Wo = pool_out_size(shape[-1], k[1], s[1], p[1], d[1], ceil_mode)
    if Ho < 1 or Wo < 1:
        raise RuntimeError(f"{op}: the window {k} does not fit the input of shape "
                           f"{tuple(shape)} (output size {Ho}x{Wo})")
    return Ho, Wo


def _planes(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(count, H, W) of the planes of an array of ``shape``."""
    return (math.prod(shape[:-2]), *shape[-2:])


def _max_pool_static(attrs: dict, shapes: tuple) -> NativePlan:
    shape = tuple(shapes[0])
    k, s, p, d = (tuple(attrs[n]) for n in ("kernel_size", "stride", "padding", "dilation"))
    Ho, Wo = _pool_shape("max_pool2d", shape, k, s, p, d, attrs["ceil_mode"])
    fast = (k == (2, 2) and s == (2, 2) and p == (0, 0) and d == (1, 1)
            and 2 * Ho <= shape[-2] and 2 * Wo <= shape[-1])
    return NativePlan((*k, *s, *p, *d, _planes(shape), Ho, Wo, fast),
                      (shape[:-2] + (Ho, Wo),) * 2)


_MAX_POOL2D = Opaque(native=ck.max_pool2d_native, static=_max_pool_static)


@kernel("max_pool2d", kind=_MAX_POOL2D, batch=batching("images"))
def _max_pool2d_kernel(x, kernel_size, stride, padding, dilation, ceil_mode):
    return call_native(_MAX_POOL2D, (x,), {
        "kernel_size": kernel_size, "stride": stride, "padding": padding,
        "dilation": dilation, "ceil_mode": ceil_mode})


@formula_helper
def plane_flat_shape(shape) -> tuple[int, ...]:
    """``shape`` with its last two dimensions merged."""
    return tuple(shape[:-2]) + (shape[-2] * shape[-1],)


@op_function("max_pool2d")
def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False, return_indices: bool = False):
    """Maximum over ``kernel_size`` windows of each plane; with ``return_indices`` also
    the flat position ``h * W + w`` of each maximum. The gradient goes to the maximum."""
    k, s, p, d = _pool_args("max_pool2d", input, kernel_size, stride, padding, dilation)
    _pool_shape("max_pool2d", input.shape, k, s, p, d, bool(ceil_mode))
    out, idx = apply(get("max_pool2d"), (input, k, s, p, d, bool(ceil_mode)))
    return (out, idx) if return_indices else out


def _avg_geometry(attrs: dict) -> tuple:
    return (*attrs["kernel_size"], *attrs["stride"], *attrs["padding"],
            bool(attrs["count_include_pad"]), int(attrs["divisor_override"] or 0))


def _avg_pool_static(attrs: dict, shapes: tuple) -> NativePlan:
    shape = tuple(shapes[0])
    Ho, Wo = _pool_shape("avg_pool2d", shape, attrs["kernel_size"], attrs["stride"],
                         attrs["padding"], (1, 1), attrs["ceil_mode"])
    return NativePlan((*_avg_geometry(attrs), _planes(shape), Ho, Wo),
                      (shape[:-2] + (Ho, Wo),))


_AVG_POOL2D = Opaque(native=ck.avg_pool2d_native, static=_avg_pool_static)


def _avg_attrs(kernel_size, stride, padding, ceil_mode, count_include_pad,
               divisor_override) -> dict:
    return {"kernel_size": kernel_size, "stride": stride, "padding": padding,
            "ceil_mode": ceil_mode, "count_include_pad": count_include_pad,
            "divisor_override": divisor_override}


@kernel("avg_pool2d", kind=_AVG_POOL2D, batch=batching("images"))
def _avg_pool2d_kernel(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override):
    return call_native(_AVG_POOL2D, (x,), _avg_attrs(
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override))


def _check_divisor(op: str, divisor_override) -> int | None:
    if divisor_override is None:
        return None
    if not isinstance(divisor_override, (int, np.integer)) or divisor_override <= 0:
        raise RuntimeError(f"{op}: divisor_override must be a positive int, got "
                           f"{divisor_override!r}")
    return int(divisor_override)


@op_function("avg_pool2d")
def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Mean over ``kernel_size`` windows of each plane (torch's rules for padding,
    ``ceil_mode``, ``count_include_pad`` and ``divisor_override``)."""
    k, s, p, _ = _pool_args("avg_pool2d", input, kernel_size, stride, padding)
    _pool_shape("avg_pool2d", input.shape, k, s, p, (1, 1), bool(ceil_mode))
    if input.dtype.kind != "f":
        raise TypeError(f"avg_pool2d: needs a floating input, got {input.dtype}")
    return apply(get("avg_pool2d"), (input, k, s, p, bool(ceil_mode), bool(count_include_pad),
                                     _check_divisor("avg_pool2d", divisor_override)))


_AVG_POOL2D_BACKWARD = Opaque(native=ck.avg_pool2d_backward_native,
                              static=lambda attrs, shapes: NativePlan(
                                  (*_avg_geometry(attrs), _planes(tuple(shapes[0])),
                                   _planes(tuple(attrs["input_size"]))),
                                  (tuple(attrs["input_size"]),)))


@kernel("avg_pool2d_backward", kind=_AVG_POOL2D_BACKWARD, batch=batching("images", "input_size"))
def _avg_pool2d_backward_kernel(gy, input_size, kernel_size, stride, padding, ceil_mode,
                                count_include_pad, divisor_override):
    return call_native(_AVG_POOL2D_BACKWARD, (gy,), {"input_size": input_size, **_avg_attrs(
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)})


@op_function("avg_pool2d_backward")
def avg_pool2d_backward(self: Tensor, input_size, kernel_size, stride, padding,
                        ceil_mode: bool, count_include_pad: bool,
                        divisor_override: int | None) -> Tensor:
    """The gradient of ``avg_pool2d``: each output gradient spread evenly over its window,
    in zeros of shape ``input_size``."""
    return apply(get("avg_pool2d_backward"),
                 (self, tuple(int(s) for s in input_size), _pair(kernel_size, "", ""),
                  _pair(stride, "", ""), _pair(padding, "", ""), bool(ceil_mode),
                  bool(count_include_pad), divisor_override))
