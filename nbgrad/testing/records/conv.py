"""Records for convolution and pooling, with hand-written NumPy references (one strided
slice per kernel tap, so they share no code with the im2col kernels)."""

from __future__ import annotations

import numpy as np

from ..core import OpRecord, Sample, sample_array


def _arr(rng, *shape):
    return sample_array(rng, shape)


def _pair(v, n=2):
    return (v,) * n if isinstance(v, int) else tuple(v) * (n if len(v) == 1 else 1)


def _taps(xp, kh, kw, s, d, Ho, Wo):
    """(i, j, x[..., i*d0 + s0*oh, j*d1 + s1*ow]) for every kernel tap."""
    for i in range(kh):
        for j in range(kw):
            h0, w0 = i * d[0], j * d[1]
            yield i, j, xp[..., h0:h0 + s[0] * (Ho - 1) + 1:s[0], w0:w0 + s[1] * (Wo - 1) + 1:s[1]]


def _geometry(x_shape, w_shape, stride, padding, dilation):
    s, p, d = _pair(stride), _pair(padding), _pair(dilation)
    kh, kw = w_shape[-2:]
    Ho = (x_shape[-2] + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    Wo = (x_shape[-1] + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    return s, p, d, kh, kw, Ho, Wo


def conv2d_ref(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str):
        kh, kw = w.shape[-2:]
        d = _pair(dilation)
        tot = (d[0] * (kh - 1), d[1] * (kw - 1))
        x = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(t // 2, t - t // 2) for t in tot]) \
            if padding == "same" else x
        padding = 0
    s, p, d, kh, kw, Ho, Wo = _geometry(x.shape, w.shape, stride, padding, dilation)
    xp = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(p[0], p[0]), (p[1], p[1])])
    O, Cg = w.shape[:2]
    Og = O // groups
    out = np.zeros(x.shape[:-3] + (O, Ho, Wo))
    for i, j, patch in _taps(xp, kh, kw, s, d, Ho, Wo):
        for g in range(groups):
            out[..., g * Og:(g + 1) * Og, :, :] += np.einsum(
                "...chw,oc->...ohw", patch[..., g * Cg:(g + 1) * Cg, :, :],
                w[g * Og:(g + 1) * Og, :, i, j])
    return out if b is None else out + b[:, None, None]


def conv2d_input_backward_ref(gy, w, input_size, stride, padding, dilation, groups):
    s, p, d, kh, kw, Ho, Wo = _geometry(input_size, w.shape, stride, padding, dilation)
    H, W = input_size[-2] + 2 * p[0], input_size[-1] + 2 * p[1]
    gxp = np.zeros(tuple(input_size[:-2]) + (H, W))
    O, Cg = w.shape[:2]
    Og = O // groups
    for i, j, view in _taps(gxp, kh, kw, s, d, Ho, Wo):
        for g in range(groups):
            view[:, g * Cg:(g + 1) * Cg] += np.einsum(
                "nohw,oc->nchw", gy[:, g * Og:(g + 1) * Og], w[g * Og:(g + 1) * Og, :, i, j])
    return gxp[..., p[0]:H - p[0], p[1]:W - p[1]]


def conv2d_weight_backward_ref(gy, x, weight_size, stride, padding, dilation, groups):
    s, p, d, kh, kw, Ho, Wo = _geometry(x.shape, weight_size, stride, padding, dilation)
    xp = np.pad(x, [(0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])])
    O, Cg = weight_size[:2]
    Og = O // groups
    gw = np.zeros(weight_size)
    for i, j, patch in _taps(xp, kh, kw, s, d, Ho, Wo):
        for g in range(groups):
            gw[g * Og:(g + 1) * Og, :, i, j] = np.einsum(
                "nohw,nchw->oc", gy[:, g * Og:(g + 1) * Og], patch[:, g * Cg:(g + 1) * Cg])
    return gw


def conv1d_ref(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    def one(v):
        return (1, _pair(v, 1)[0])

    pad = (0, _pair(padding, 1)[0])
    return conv2d_ref(x[..., None, :], w[..., None, :], b, one(stride), pad, one(dilation),
                      groups)[..., 0, :]


def _pool_size(n, k, s, p, d, ceil_mode):
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def max_pool2d_ref(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                   return_indices=False):
    k = _pair(kernel_size)
    s = k if stride is None else _pair(stride)
    p, d = _pair(padding), _pair(dilation)
    H, W = x.shape[-2:]
    Ho = _pool_size(H, k[0], s[0], p[0], d[0], ceil_mode)
    Wo = _pool_size(W, k[1], s[1], p[1], d[1], ceil_mode)
    out = np.full(x.shape[:-2] + (Ho, Wo), -np.inf)
    idx = np.zeros(out.shape, np.int64)
    for oh in range(Ho):
        for ow in range(Wo):
            for i in range(k[0]):
                for j in range(k[1]):
                    h, w = oh * s[0] - p[0] + i * d[0], ow * s[1] - p[1] + j * d[1]
                    if 0 <= h < H and 0 <= w < W:
                        v = x[..., h, w]
                        better = v > out[..., oh, ow]
                        out[..., oh, ow] = np.where(better, v, out[..., oh, ow])
                        idx[..., oh, ow] = np.where(better, h * W + w, idx[..., oh, ow])
    return (out, idx) if return_indices else out


def _avg_windows(H, W, k, s, p, ceil_mode):
    Ho = _pool_size(H, k[0], s[0], p[0], 1, ceil_mode)
    Wo = _pool_size(W, k[1], s[1], p[1], 1, ceil_mode)
    for oh in range(Ho):
        for ow in range(Wo):
            h0, w0 = oh * s[0] - p[0], ow * s[1] - p[1]
            h1, w1 = min(h0 + k[0], H + p[0]), min(w0 + k[1], W + p[1])
            size = (h1 - h0) * (w1 - w0)
            h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, H), min(w1, W)
            yield oh, ow, slice(h0, h1), slice(w0, w1), size, (h1 - h0) * (w1 - w0)


def _avg_divisor(size, inside, count_include_pad, divisor_override):
    return divisor_override or (size if count_include_pad else inside)


def avg_pool2d_ref(x, kernel_size, stride=None, padding=0, ceil_mode=False,
                   count_include_pad=True, divisor_override=None):
    k = _pair(kernel_size)
    s = k if stride is None else _pair(stride)
    p = _pair(padding)
    H, W = x.shape[-2:]
    Ho = _pool_size(H, k[0], s[0], p[0], 1, ceil_mode)
    Wo = _pool_size(W, k[1], s[1], p[1], 1, ceil_mode)
    out = np.zeros(x.shape[:-2] + (Ho, Wo))
    for oh, ow, hs, ws, size, inside in _avg_windows(H, W, k, s, p, ceil_mode):
        div = _avg_divisor(size, inside, count_include_pad, divisor_override)
        out[..., oh, ow] = x[..., hs, ws].sum(axis=(-2, -1)) / div
    return out


def avg_pool2d_backward_ref(gy, input_size, kernel_size, stride, padding, ceil_mode,
                            count_include_pad, divisor_override):
    gx = np.zeros(input_size)
    k, s, p = _pair(kernel_size), _pair(stride), _pair(padding)
    for oh, ow, hs, ws, size, inside in _avg_windows(*input_size[-2:], k, s, p, ceil_mode):
        div = _avg_divisor(size, inside, count_include_pad, divisor_override)
        gx[..., hs, ws] += gy[..., oh, ow][..., None, None] / div
    return gx


def _conv2d_samples(rng):
    return [
        Sample((_arr(rng, 2, 2, 5, 5), _arr(rng, 3, 2, 3, 3), _arr(rng, 3)), note="bias"),
        Sample((_arr(rng, 1, 2, 6, 5), _arr(rng, 2, 2, 3, 3)), {"stride": 2, "padding": 1},
               note="stride-padding"),
        Sample((_arr(rng, 1, 4, 5, 4), _arr(rng, 4, 2, 2, 3), _arr(rng, 4)),
               {"groups": 2, "dilation": (1, 2), "padding": (0, 1)}, note="groups-dilation"),
        Sample((_arr(rng, 2, 4, 4), _arr(rng, 2, 2, 2, 2)), {"padding": "same"},
               note="unbatched-same-asymmetric"),
    ]


RECORDS = [
    OpRecord("conv2d", _conv2d_samples, ref=conv2d_ref, ref_rtol=1e-9),
    OpRecord("conv2d_input_backward", lambda rng: [
        Sample((_arr(rng, 2, 3, 3, 3), _arr(rng, 3, 2, 3, 3), (2, 2, 5, 5), (1, 1), (0, 0),
                (1, 1), 1), note="plain"),
        Sample((_arr(rng, 1, 4, 4, 2), _arr(rng, 4, 1, 2, 3), (1, 2, 6, 5), (2, 2), (1, 0),
                (1, 1), 2), note="stride-groups")],
        ref=conv2d_input_backward_ref, ref_rtol=1e-9),
    OpRecord("conv2d_weight_backward", lambda rng: [
        Sample((_arr(rng, 2, 3, 3, 3), _arr(rng, 2, 2, 5, 5), (3, 2, 3, 3), (1, 1), (0, 0),
                (1, 1), 1), note="plain"),
        Sample((_arr(rng, 1, 4, 4, 2), _arr(rng, 1, 2, 6, 5), (4, 1, 2, 3), (2, 2), (1, 0),
                (1, 1), 2), note="stride-groups")],
        ref=conv2d_weight_backward_ref, ref_rtol=1e-9),
    OpRecord("conv1d", lambda rng: [
        Sample((_arr(rng, 2, 3, 7), _arr(rng, 4, 3, 3), _arr(rng, 4)), note="bias"),
        Sample((_arr(rng, 1, 2, 9), _arr(rng, 2, 1, 3)),
               {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}, note="all-options")],
        ref=conv1d_ref, ref_rtol=1e-9),
    OpRecord("max_pool2d", lambda rng: [
        Sample((_arr(rng, 2, 2, 4, 6), 2), note="k2"),
        Sample((_arr(rng, 1, 2, 5, 5), 3, 2, 1), {"return_indices": True},
               note="padding-indices"),
        Sample((_arr(rng, 2, 5, 6), (2, 3), 2), {"ceil_mode": True, "return_indices": True},
               note="unbatched-ceil"),
        Sample((_arr(rng, 1, 1, 6, 6), 2, 1, 0, 2), note="dilation")],
        ref=max_pool2d_ref),
    OpRecord("avg_pool2d", lambda rng: [
        Sample((_arr(rng, 2, 2, 4, 6), 2), note="k2"),
        Sample((_arr(rng, 1, 2, 5, 5), 3, 2, 1), note="padding"),
        Sample((_arr(rng, 1, 2, 5, 5), 3, 2, 1), {"count_include_pad": False},
               note="exclude-pad"),
        Sample((_arr(rng, 2, 5, 6), (2, 3), 2), {"ceil_mode": True}, note="unbatched-ceil"),
        Sample((_arr(rng, 1, 1, 4, 4), 2), {"divisor_override": 3}, note="divisor")],
        ref=avg_pool2d_ref),
    OpRecord("avg_pool2d_backward", lambda rng: [
        Sample((_arr(rng, 1, 2, 3, 3), (1, 2, 5, 5), (3, 3), (2, 2), (1, 1), False, True,
                None), note="padding"),
        Sample((_arr(rng, 1, 2, 3, 3), (1, 2, 5, 5), (3, 3), (2, 2), (1, 1), True, False,
                None), note="ceil-exclude-pad")],
        ref=avg_pool2d_backward_ref),
]
