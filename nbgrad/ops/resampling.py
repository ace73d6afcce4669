"""Pooling, resampling and rearranging functions of ``torch.nn.functional`` written over
table ops: 1-D pools, adaptive pools, ``interpolate`` (nearest, nearest-exact, linear,
bilinear, trilinear, area), ``unfold``, pixel and channel shuffles, ``bilinear`` and
``local_response_norm``.

Separable linear maps (adaptive average pooling, linear interpolation) are small
matrices built from the shapes and applied with ``matmul`` along each spatial dim, so
they differentiate to any order and lower natively; nearest sampling and window maxima
are index selections.
"""

from __future__ import annotations

import math

import numpy as np

from ..tensor import Tensor
from .conv import avg_pool2d, max_pool2d
from .dispatch import as_tensor
from .linalg import einsum, matmul
from .reduction import amax
from .shape import pad, permute, reshape, squeeze, transpose, unsqueeze

__all__ = ["adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
           "adaptive_max_pool1d", "adaptive_max_pool2d", "avg_pool1d", "bilinear",
           "channel_shuffle", "conv3d", "interpolate", "local_response_norm", "max_pool1d",
           "max_unpool1d", "max_unpool2d",
           "pixel_shuffle", "pixel_unshuffle", "upsample", "upsample_bilinear",
           "upsample_nearest"]
# ``unfold`` is only ``nbgrad.nn.functional.unfold``: ``Tensor.unfold`` is another op
NN_ONLY = ["unfold"]


def _spatial(op: str, x, dims: int) -> Tensor:
    x = as_tensor(x)
    if x.ndim not in (dims + 1, dims + 2):
        raise ValueError(f"{op}: expected a {dims + 1}-D or {dims + 2}-D input, got shape "
                         f"{tuple(x.shape)}")
    if x.dtype.kind != "f":
        raise TypeError(f"{op}: expected a floating input, got {x.dtype}")
    return x


def _sizes(op: str, value, dims: int) -> tuple[int, ...]:
    scalar = value is None or isinstance(value, (int, float, np.integer, np.floating))
    sizes = (value,) * dims if scalar else tuple(value)
    if len(sizes) != dims:
        raise ValueError(f"{op}: expected {dims} output size(s), got {value!r}")
    return sizes


def _along(x: Tensor, matrix: np.ndarray, dim: int) -> Tensor:
    """``matrix`` (out, in) applied along ``dim`` of ``x``."""
    m = as_tensor(matrix.astype(x.dtype))
    moved = transpose(x, dim, -1) if dim != x.ndim - 1 else x
    out = matmul(moved, transpose(m, 0, 1))
    return transpose(out, dim, -1) if dim != x.ndim - 1 else out


# ------------------------------------------------------------------ 1-D pools
def max_pool1d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode: bool = False, return_indices: bool = False):
    """Maximum over windows of the last dimension (``max_pool2d`` of height 1)."""
    x = unsqueeze(_spatial("max_pool1d", input, 1), -2)
    k = int(_sizes("max_pool1d", kernel_size, 1)[0])
    s = k if stride is None or stride == () else int(_sizes("max_pool1d", stride, 1)[0])
    out = max_pool2d(x, (1, k), (1, s), (0, int(_sizes("max_pool1d", padding, 1)[0])),
                     (1, int(_sizes("max_pool1d", dilation, 1)[0])), ceil_mode, return_indices)
    if return_indices:
        return squeeze(out[0], -2), squeeze(out[1], -2)
    return squeeze(out, -2)


def avg_pool1d(input: Tensor, kernel_size, stride=None, padding=0,  # noqa: A002
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    """Average over windows of the last dimension (``avg_pool2d`` of height 1)."""
    x = unsqueeze(_spatial("avg_pool1d", input, 1), -2)
    k = int(_sizes("avg_pool1d", kernel_size, 1)[0])
    s = k if stride is None or stride == () else int(_sizes("avg_pool1d", stride, 1)[0])
    return squeeze(avg_pool2d(x, (1, k), (1, s), (0, int(_sizes("avg_pool1d", padding, 1)[0])),
                              ceil_mode, count_include_pad), -2)


# ------------------------------------------------------------------ adaptive pools
def _windows(n: int, out: int) -> list[tuple[int, int]]:
    return [(i * n // out, -(-(i + 1) * n // out)) for i in range(out)]


def _average_matrix(n: int, out: int) -> np.ndarray:
    m = np.zeros((out, n))
    for i, (a, b) in enumerate(_windows(n, out)):
        m[i, a:b] = 1.0 / (b - a)
    return m


def _adaptive_avg(op: str, input, output_size, dims: int) -> Tensor:  # noqa: A002
    x = _spatial(op, input, dims)
    sizes = _sizes(op, output_size, dims)
    for k, size in enumerate(sizes):
        d = x.ndim - dims + k
        size = x.shape[d] if size is None else int(size)
        if size <= 0 and x.shape[d]:
            raise ValueError(f"{op}: output sizes must be positive, got {output_size!r}")
        x = _along(x, _average_matrix(x.shape[d], size), d)
    return x


def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:  # noqa: A002
    """Averages over ``output_size`` windows covering the last dimension (as PyTorch's)."""
    return _adaptive_avg("adaptive_avg_pool1d", input, output_size, 1)


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:  # noqa: A002
    """Averages over windows covering the last two dimensions (None keeps a size)."""
    return _adaptive_avg("adaptive_avg_pool2d", input, output_size, 2)


def adaptive_avg_pool3d(input: Tensor, output_size) -> Tensor:  # noqa: A002
    return _adaptive_avg("adaptive_avg_pool3d", input, output_size, 3)


def _adaptive_max(op: str, input, output_size, dims: int, return_indices: bool):  # noqa: A002
    x = _spatial(op, input, dims)
    spatial = x.shape[x.ndim - dims:]
    out = tuple(n if o is None else int(o)
                for n, o in zip(spatial, _sizes(op, output_size, dims), strict=True))
    # each output's window as flat positions in its plane, padded to one width by
    # repeating the window's last entry (no new maximum)
    per_dim = [_windows(n, o) for n, o in zip(spatial, out, strict=True)]
    strides = np.cumprod((1, *spatial[::-1]))[:-1][::-1]
    windows = []
    for spans in np.ndindex(*out):
        ranges = [np.arange(*per_dim[k][i]) for k, i in enumerate(spans)]
        grid = np.meshgrid(*ranges, indexing="ij")
        windows.append(sum(g.reshape(-1) * s for g, s in zip(grid, strides, strict=True)))
    width = max((w.size for w in windows), default=0)
    picks = np.array([np.pad(w, (0, width - w.size), mode="edge") for w in windows],
                     np.int64).reshape(len(windows), width)
    lead = x.shape[:x.ndim - dims]
    plane = reshape(x, (*lead, math.prod(spatial)))
    taken = reshape(plane.index_select(-1, as_tensor(picks.reshape(-1))),
                    (*lead, *out, width))
    values = amax(taken, -1)
    if not return_indices:
        return values
    slot = taken.detach().argmax(-1).numpy()
    flat_windows = picks.reshape(*out, width)
    positions = np.take_along_axis(np.broadcast_to(flat_windows, (*lead, *out, width)),
                                   slot[..., None], -1)[..., 0]
    return values, as_tensor(positions.astype(np.int64))


def adaptive_max_pool1d(input: Tensor, output_size, return_indices: bool = False):  # noqa: A002
    return _adaptive_max("adaptive_max_pool1d", input, output_size, 1, return_indices)


def adaptive_max_pool2d(input: Tensor, output_size, return_indices: bool = False):  # noqa: A002
    """Maxima over windows covering the last two dimensions (a window's maximum is the
    maximum of its rows' maxima)."""
    return _adaptive_max("adaptive_max_pool2d", input, output_size, 2, return_indices)


# ------------------------------------------------------------------ interpolate
def _source_index(n_in: int, n_out: int, align_corners: bool, scale: float | None):
    i = np.arange(n_out, dtype=np.float64)
    if align_corners:
        return i * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
    ratio = 1.0 / scale if scale else n_in / n_out
    return np.maximum((i + 0.5) * ratio - 0.5, 0.0)


def _linear_matrix(n_in: int, n_out: int, align_corners: bool, scale) -> np.ndarray:
    src = _source_index(n_in, n_out, align_corners, scale)
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    w = src - lo
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), lo), 1.0 - w)
    np.add.at(m, (np.arange(n_out), hi), w)
    return m


def _nearest_index(n_in: int, n_out: int, exact: bool, scale) -> np.ndarray:
    ratio = 1.0 / scale if scale else n_in / n_out
    i = np.arange(n_out, dtype=np.float64)
    src = np.floor((i + 0.5) * ratio) if exact else np.floor(i * ratio)
    return np.minimum(src.astype(np.int64), n_in - 1)


_LINEAR_DIMS = {"linear": 1, "bilinear": 2, "trilinear": 3}


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",  # noqa: A002
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """Resample the spatial dimensions (all but the first two) to ``size`` or by
    ``scale_factor``: ``'nearest'``, ``'nearest-exact'``, ``'linear'``, ``'bilinear'``,
    ``'trilinear'`` or ``'area'``, with PyTorch's sampling positions."""
    x = as_tensor(input)
    dims = x.ndim - 2
    if dims < 1:
        raise ValueError(f"interpolate: expected an input of at least 3 dimensions, got "
                         f"shape {tuple(x.shape)}")
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")
    if mode in _LINEAR_DIMS and _LINEAR_DIMS[mode] != dims:
        raise ValueError(f"interpolate: mode {mode!r} needs a {_LINEAR_DIMS[mode] + 2}-D "
                         f"input, got shape {tuple(x.shape)}")
    if mode not in ("nearest", "nearest-exact", "area", *_LINEAR_DIMS):
        raise NotImplementedError(f"interpolate: mode {mode!r} is not supported")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    if size is not None:
        out, scales = _sizes("interpolate", size, dims), (None,) * dims
    else:
        scales = tuple(float(s) for s in _sizes("interpolate", scale_factor, dims))
        out = tuple(int(math.floor(n * s)) for n, s in zip(x.shape[2:], scales, strict=True))
        if recompute_scale_factor:
            scales = (None,) * dims
    if mode == "area":
        return _adaptive_avg("interpolate", x, out, dims)
    for k, (n_out, scale) in enumerate(zip(out, scales, strict=True)):
        d = 2 + k
        if mode in _LINEAR_DIMS:
            x = _along(x, _linear_matrix(x.shape[d], int(n_out), bool(align_corners), scale), d)
        else:
            picks = _nearest_index(x.shape[d], int(n_out), mode == "nearest-exact", scale)
            x = x.index_select(d, as_tensor(picks))
    return x


def upsample(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",  # noqa: A002
             align_corners: bool | None = None) -> Tensor:
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(input: Tensor, size=None, scale_factor=None) -> Tensor:  # noqa: A002
    return interpolate(input, size, scale_factor, "nearest")


def upsample_bilinear(input: Tensor, size=None, scale_factor=None) -> Tensor:  # noqa: A002
    return interpolate(input, size, scale_factor, "bilinear", align_corners=True)


# ------------------------------------------------------------------ unpooling
def _max_unpool(op: str, input, indices, kernel_size, stride, padding, output_size,  # noqa: A002
                dims: int) -> Tensor:
    x = _spatial(op, input, dims)
    k = _sizes(op, kernel_size, dims)
    s = k if stride is None else _sizes(op, stride, dims)
    p = _sizes(op, padding, dims)
    spatial = x.shape[x.ndim - dims:]
    size = tuple((n - 1) * s[i] - 2 * p[i] + k[i] for i, n in enumerate(spatial))
    if output_size is not None:
        size = tuple(output_size)[-dims:]
    lead = x.shape[:x.ndim - dims]
    plane = math.prod(size)
    idx = np.asarray(as_tensor(indices).detach()).reshape(*lead, -1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= plane):
        raise RuntimeError(f"{op}: indices must be in [0, {plane}) for an output of spatial "
                           f"size {size}")
    # each value goes to its plane's flat position: one index_put over all planes
    rows = np.arange(math.prod(lead)).reshape(*lead, 1) * plane + idx
    zeros = as_tensor(np.zeros(math.prod(lead) * plane, x.dtype))
    flat = zeros.index_put((as_tensor(rows.reshape(-1)),), reshape(x, (-1,)))
    return reshape(flat, (*lead, *size))


def max_unpool1d(input: Tensor, indices: Tensor, kernel_size, stride=None,  # noqa: A002
                 padding=0, output_size=None) -> Tensor:
    """The inverse of :func:`max_pool1d`: each value at the position its index names,
    zeros elsewhere."""
    return _max_unpool("max_unpool1d", input, indices, kernel_size, stride, padding,
                       output_size, 1)


def max_unpool2d(input: Tensor, indices: Tensor, kernel_size, stride=None,  # noqa: A002
                 padding=0, output_size=None) -> Tensor:
    """The inverse of ``max_pool2d(..., return_indices=True)``."""
    return _max_unpool("max_unpool2d", input, indices, kernel_size, stride, padding,
                       output_size, 2)


# ------------------------------------------------------------------ rearranging
def _blocks(op: str, x: Tensor, k, dl, p, s) -> tuple[Tensor, tuple[int, ...]]:
    """im2col over the trailing ``len(k)`` dims of ``x`` (N, C, *spatial): (N, C, K, L)
    for ``K`` kernel positions and ``L`` windows, and the windows' grid shape. ``p`` holds
    a (before, after) padding pair per dim."""
    dims = len(k)
    if any(any(pair) for pair in p):
        x = pad(x, tuple(v for i in reversed(range(dims)) for v in p[i]))
    N, C, *spatial = x.shape
    grid = tuple((n - dl[i] * (k[i] - 1) - 1) // s[i] + 1 for i, n in enumerate(spatial))
    if min(grid) <= 0:
        raise RuntimeError(f"{op}: kernel {tuple(k)} with dilation {tuple(dl)} does not fit "
                           f"the padded input of shape {tuple(x.shape)}")
    strides = np.cumprod((1, *spatial[::-1]))[:-1][::-1]
    flat = 0
    for i in range(dims):  # offset of kernel position i plus window start, per dim
        along = (np.arange(k[i]) * dl[i])[:, None] + (np.arange(grid[i]) * s[i])[None, :]
        shape = [1] * (2 * dims)
        shape[i], shape[dims + i] = k[i], grid[i]
        flat = flat + along.reshape(shape) * strides[i]
    positions = as_tensor(np.asarray(flat).reshape(-1).astype(np.int64))
    taken = reshape(x, (N, C, math.prod(spatial))).index_select(2, positions)
    return reshape(taken, (N, C, math.prod(k), math.prod(grid))), grid


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:  # noqa: A002
    """Sliding blocks (im2col): (N, C, H, W) to (N, C * kh * kw, L) for ``L`` blocks."""
    x = _spatial("unfold", input, 2)
    batched = x.ndim == 4
    if not batched:
        x = unsqueeze(x, 0)
    k, dl, p, s = (_sizes("unfold", v, 2) for v in (kernel_size, dilation, padding, stride))
    blocks, grid = _blocks("unfold", x, k, dl, [(v, v) for v in p], s)
    out = reshape(blocks, (x.shape[0], x.shape[1] * math.prod(k), math.prod(grid)))
    return out if batched else squeeze(out, 0)


def conv3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,  # noqa: A002
           padding=0, dilation=1, groups: int = 1) -> Tensor:
    """3-D convolution (cross-correlation) of (N, C, D, H, W) or (C, D, H, W) inputs with
    ``weight`` (O, C / groups, kd, kh, kw), as im2col and one batched product."""
    x = _spatial("conv3d", input, 3)
    w = as_tensor(weight)
    batched = x.ndim == 5
    if not batched:
        x = unsqueeze(x, 0)
    g = int(groups)
    if w.ndim != 5 or x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        raise RuntimeError(f"conv3d: input {tuple(x.shape)} and weight {tuple(w.shape)} do "
                           f"not fit with groups={g} (weight (O, C/groups, kd, kh, kw))")
    k = tuple(w.shape[2:])
    dl, s = (_sizes("conv3d", v, 3) for v in (dilation, stride))
    if padding == "valid":
        pairs = [(0, 0)] * 3
    elif padding == "same":  # the output keeps the input's size (stride 1), as PyTorch
        if any(v != 1 for v in s):
            raise ValueError("conv3d: padding='same' needs stride 1")
        totals = [dl[i] * (k[i] - 1) for i in range(3)]
        pairs = [(t // 2, t - t // 2) for t in totals]
    elif isinstance(padding, str):
        raise ValueError(f"conv3d: padding must be 'valid', 'same' or sizes, got {padding!r}")
    else:
        pairs = [(v, v) for v in _sizes("conv3d", padding, 3)]
    blocks, grid = _blocks("conv3d", x, k, dl, pairs, s)  # (N, C, K, L)
    N, C, K, L = blocks.shape
    O = w.shape[0]
    cols = reshape(blocks, (N, g, (C // g) * K, L))
    out = matmul(reshape(w, (g, O // g, (C // g) * K)), cols)  # (N, g, O/g, L)
    out = reshape(out, (N, O, *grid))
    if bias is not None:
        out = out + reshape(as_tensor(bias), (1, O, 1, 1, 1))
    return out if batched else squeeze(out, 0)


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:  # noqa: A002
    """(…, C r², H, W) to (…, C, H r, W r)."""
    x, r = as_tensor(input), int(upscale_factor)
    if x.ndim < 3 or x.shape[-3] % (r * r):
        raise RuntimeError(f"pixel_shuffle: channels of shape {tuple(x.shape)} must be "
                           f"divisible by {r * r}")
    *lead, c, h, w = x.shape
    y = reshape(x, (*lead, c // (r * r), r, r, h, w))
    n = len(lead)
    y = permute(y, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
    return reshape(y, (*lead, c // (r * r), h * r, w * r))


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:  # noqa: A002
    """(…, C, H r, W r) to (…, C r², H, W)."""
    x, r = as_tensor(input), int(downscale_factor)
    if x.ndim < 3 or x.shape[-1] % r or x.shape[-2] % r:
        raise RuntimeError(f"pixel_unshuffle: height and width of shape {tuple(x.shape)} "
                           f"must be divisible by {r}")
    *lead, c, h, w = x.shape
    y = reshape(x, (*lead, c, h // r, r, w // r, r))
    n = len(lead)
    y = permute(y, (*range(n), n, n + 2, n + 4, n + 1, n + 3))
    return reshape(y, (*lead, c * r * r, h // r, w // r))


def channel_shuffle(input: Tensor, groups: int) -> Tensor:  # noqa: A002
    """Interleave the channels (dimension 1) of ``groups`` groups."""
    x, g = as_tensor(input), int(groups)
    if x.ndim < 3 or x.shape[1] % g:
        raise RuntimeError(f"channel_shuffle: {x.shape[1] if x.ndim > 1 else 0} channels "
                           f"cannot be split into {g} groups")
    n, c = x.shape[:2]
    y = reshape(x, (n, g, c // g) + x.shape[2:])
    return reshape(transpose(y, 1, 2), x.shape)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None
             ) -> Tensor:
    """``x1^T W_o x2 + b_o`` for each output feature ``o``."""
    out = einsum("...i,oij,...j->...o", input1, weight, input2)
    return out if bias is None else out + bias


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4,  # noqa: A002
                        beta: float = 0.75, k: float = 1.0) -> Tensor:
    """``x / (k + alpha * mean of x² over size neighbouring channels) ** beta`` (the
    window zero-padded at the edges, as PyTorch)."""
    x = as_tensor(input)
    if x.ndim < 3:
        raise ValueError(f"local_response_norm: expected an input of at least 3 "
                         f"dimensions, got shape {tuple(x.shape)}")
    C = x.shape[1]
    window = np.zeros((C, C))
    for c in range(C):
        window[c, max(c - size // 2, 0):min(c + (size - 1) // 2 + 1, C)] = 1.0 / size
    div = _along(x * x, window, 1)
    return x / (div * float(alpha) + float(k)) ** float(beta)
