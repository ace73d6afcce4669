"""Convolution and pooling kernels over C-contiguous NCHW arrays.

Convolutions go through im2col + BLAS: for each sample and group, the receptive fields
are copied into a ``(C/groups * kh * kw, Ho * Wo)`` column buffer and multiplied with
the weight matrix by ``np.dot`` (BLAS) inside ``@njit``. The input gradient is the
transpose (``W^T @ grad``, then col2im, a scatter-add), the weight gradient
``grad @ cols^T`` summed over the batch. ``conv2d_direct`` (direct loops) is kept for
comparison: perf/cnn_step.py times both on the issue's CNN.

Pooling kernels are direct loops over each (n, c) plane. Window positions follow
PyTorch: ``h = oh * stride - pad + i * dilation``; padded positions are skipped.

Geometry arguments are plain ints, passed in one order everywhere:
``kh, kw, sh, sw, ph, pw, dh, dw`` (kernel, stride, padding, dilation).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .layout import view3

OPTS = dict(cache=True, nogil=True)


@njit(**OPTS)
def valid_range(n_out, n_in, stride, offset):
    """The outputs ``o`` in ``[lo, hi)`` with ``0 <= o * stride + offset < n_in``."""
    lo = 0 if offset >= 0 else (-offset + stride - 1) // stride
    hi = (n_in - offset + stride - 1) // stride if n_in > offset else 0
    lo = min(lo, n_out)
    hi = min(max(hi, lo), n_out)
    return lo, hi


@njit(**OPTS)
def im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, cols):
    """``cols[(c*kh + i)*kw + j, oh*Wo + ow] = x[c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]``
    (zero outside the input); ``x`` is (C, H, W), ``cols`` (C*kh*kw, Ho*Wo)."""
    C, H, W = x.shape
    for c in range(C):
        xc = x[c]
        for i in range(kh):
            for j in range(kw):
                row = cols[(c * kh + i) * kw + j]
                off = j * dw - pw
                lo, hi = valid_range(Wo, W, sw, off)
                for oh in range(Ho):
                    dst = row[oh * Wo:(oh + 1) * Wo]
                    h = oh * sh - ph + i * dh
                    if h < 0 or h >= H:
                        for ow in range(Wo):
                            dst[ow] = 0
                        continue
                    for ow in range(lo):
                        dst[ow] = 0
                    if sw == 1:  # a contiguous run: explicit loops beat slice assignment
                        src = xc[h, lo + off:hi + off]
                        part = dst[lo:hi]
                        for k in range(hi - lo):
                            part[k] = src[k]
                    else:
                        xr = xc[h]
                        for ow in range(lo, hi):
                            dst[ow] = xr[ow * sw + off]
                    for ow in range(hi, Wo):
                        dst[ow] = 0


@njit(**OPTS)
def col2im(cols, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, x):
    """The transpose of :func:`im2col`: add every column entry back into ``x``."""
    C, H, W = x.shape
    for c in range(C):
        xc = x[c]
        for i in range(kh):
            for j in range(kw):
                row = cols[(c * kh + i) * kw + j]
                off = j * dw - pw
                lo, hi = valid_range(Wo, W, sw, off)
                for oh in range(Ho):
                    h = oh * sh - ph + i * dh
                    if h < 0 or h >= H:
                        continue
                    src = row[oh * Wo:(oh + 1) * Wo]
                    if sw == 1:
                        dst = xc[h, lo + off:hi + off]
                        part = src[lo:hi]
                        for k in range(hi - lo):
                            dst[k] += part[k]
                    else:
                        xr = xc[h]
                        for ow in range(lo, hi):
                            xr[ow * sw + off] += src[ow]


@njit(**OPTS)
def conv2d_forward(x, w, sh, sw, ph, pw, dh, dw, groups, out):
    """``out`` (N, O, Ho, Wo) = conv of ``x`` (N, C, H, W) with ``w`` (O, C/groups, kh, kw)."""
    N, C, H, W = x.shape
    O, Cg, kh, kw = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    Og = O // groups
    K = Cg * kh * kw
    w2 = w.reshape(O, K)
    out3 = out.reshape(N, O, Ho * Wo)
    cols = np.empty((K, Ho * Wo), x.dtype)
    for n in range(N):
        for g in range(groups):
            im2col(x[n, g * Cg:(g + 1) * Cg], kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, cols)
            np.dot(w2[g * Og:(g + 1) * Og], cols, out3[n, g * Og:(g + 1) * Og])


@njit(**OPTS)
def conv2d_input_grad(gy, w, sh, sw, ph, pw, dh, dw, groups, gx):
    """``gx`` (N, C, H, W, zero-filled) += the transposed conv of ``gy`` (N, O, Ho, Wo)."""
    N, O, Ho, Wo = gy.shape
    _, Cg, kh, kw = w.shape
    Og = O // groups
    K = Cg * kh * kw
    wt = np.ascontiguousarray(w.reshape(O, K).T)  # (K, O)
    gy3 = gy.reshape(N, O, Ho * Wo)
    cols = np.empty((K, Ho * Wo), gy.dtype)
    for g in range(groups):
        wg = np.ascontiguousarray(wt[:, g * Og:(g + 1) * Og])
        for n in range(N):
            np.dot(wg, gy3[n, g * Og:(g + 1) * Og], cols)
            col2im(cols, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, gx[n, g * Cg:(g + 1) * Cg])


@njit(**OPTS)
def conv2d_weight_grad(gy, x, sh, sw, ph, pw, dh, dw, groups, gw):
    """``gw`` (O, C/groups, kh, kw) = sum over the batch of ``gy @ cols(x)^T``."""
    N, O, Ho, Wo = gy.shape
    _, Cg, kh, kw = gw.shape
    Og = O // groups
    K = Cg * kh * kw
    gw2 = gw.reshape(O, K)
    gw2[:] = 0
    gy3 = gy.reshape(N, O, Ho * Wo)
    cols = np.empty((K, Ho * Wo), x.dtype)
    part = np.empty((Og, K), x.dtype)
    for n in range(N):
        for g in range(groups):
            im2col(x[n, g * Cg:(g + 1) * Cg], kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, cols)
            np.dot(gy3[n, g * Og:(g + 1) * Og], cols.T, part)
            gw2[g * Og:(g + 1) * Og] += part


@njit(**OPTS)
def conv2d_direct(x, w, sh, sw, ph, pw, dh, dw, groups, out):
    """The same as :func:`conv2d_forward` by direct loops (no column buffer)."""
    N, C, H, W = x.shape
    O, Cg, kh, kw = w.shape
    Ho, Wo = out.shape[2], out.shape[3]
    Og = O // groups
    out[:] = 0
    for n in range(N):
        for o in range(O):
            g = o // Og
            plane = out[n, o]
            for c in range(Cg):
                xc = x[n, g * Cg + c]
                for i in range(kh):
                    for j in range(kw):
                        wv = w[o, c, i, j]
                        off = j * dw - pw
                        lo, hi = valid_range(Wo, W, sw, off)
                        for oh in range(Ho):
                            h = oh * sh - ph + i * dh
                            if h < 0 or h >= H:
                                continue
                            xr = xc[h]
                            orow = plane[oh]
                            if sw == 1:
                                src = xr[lo + off:hi + off]
                                dst = orow[lo:hi]
                                for k in range(hi - lo):
                                    dst[k] += wv * src[k]
                            else:
                                for ow in range(lo, hi):
                                    orow[ow] += wv * xr[ow * sw + off]


# ------------------------------------------------------------------ pooling
@njit(**OPTS)
def _window_ranges(n_out, k, n_in, stride, pad, dilation):
    """For each output position, the kernel taps ``[lo, hi)`` that fall inside the input."""
    lo = np.empty(n_out, np.int64)
    hi = np.empty(n_out, np.int64)
    for o in range(n_out):
        lo[o], hi[o] = valid_range(k, n_in, dilation, o * stride - pad)
    return lo, hi


@njit(**OPTS)
def max_pool2d_forward(x, kh, kw, sh, sw, ph, pw, dh, dw, out, idx):
    """Max over each window of the planes ``x`` (P, H, W) into ``out`` (P, Ho, Wo), and
    the flat position ``h * W + w`` of the maximum into ``idx`` (the first maximum in
    window order; NaN wins, as in torch)."""
    P, H, W = x.shape
    Ho, Wo = out.shape[1], out.shape[2]
    ilos, ihis = _window_ranges(Ho, kh, H, sh, ph, dh)
    jlos, jhis = _window_ranges(Wo, kw, W, sw, pw, dw)
    for p in range(P):
        xp = x[p]
        for oh in range(Ho):
            h0 = oh * sh - ph
            ilo, ihi = ilos[oh], ihis[oh]
            orow = out[p, oh]
            irow = idx[p, oh]
            for ow in range(Wo):
                w0 = ow * sw - pw
                jlo, jhi = jlos[ow], jhis[ow]
                if ilo >= ihi or jlo >= jhi:
                    orow[ow] = -np.inf
                    irow[ow] = -1
                    continue
                best = xp[h0 + ilo * dh, w0 + jlo * dw]
                bi = (h0 + ilo * dh) * W + w0 + jlo * dw
                for i in range(ilo, ihi):
                    h = h0 + i * dh
                    row = xp[h]
                    for j in range(jlo, jhi):
                        v = row[w0 + j * dw]
                        if v > best or v != v:
                            best = v
                            bi = h * W + w0 + j * dw
                orow[ow] = best
                irow[ow] = bi


@njit(**OPTS)
def max_pool2d_2x2(x, out, idx):
    """:func:`max_pool2d_forward` for the common 2x2 window, stride 2, no padding, no
    dilation, where every window lies inside the plane (about 3x faster: the fixed trip
    counts unroll)."""
    W = x.shape[2]
    Ho, Wo = out.shape[1], out.shape[2]
    for p in range(x.shape[0]):
        xp = x[p]
        for oh in range(Ho):
            r0 = xp[2 * oh]
            r1 = xp[2 * oh + 1]
            orow = out[p, oh]
            irow = idx[p, oh]
            b0 = 2 * oh * W
            b1 = b0 + W
            for ow in range(Wo):
                w = 2 * ow
                best = r0[w]
                bi = b0 + w
                v = r0[w + 1]
                if v > best or v != v:
                    best = v
                    bi = b0 + w + 1
                v = r1[w]
                if v > best or v != v:
                    best = v
                    bi = b1 + w
                v = r1[w + 1]
                if v > best or v != v:
                    best = v
                    bi = b1 + w + 1
                orow[ow] = best
                irow[ow] = bi


@njit(**OPTS)
def _avg_window(o, s, p, k, n):
    """(start, end, size with padding) of an average-pooling window, clipped as torch."""
    start = o * s - p
    end = min(start + k, n + p)
    size = end - start
    return max(start, 0), min(end, n), size


@njit(**OPTS)
def avg_pool2d_forward(x, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, out):
    """Mean over each window; ``divisor > 0`` overrides the window size."""
    P, H, W = x.shape
    Ho, Wo = out.shape[1], out.shape[2]
    for p in range(P):
        xp = x[p]
        for oh in range(Ho):
            h0, h1, hs = _avg_window(oh, sh, ph, kh, H)
            for ow in range(Wo):
                w0, w1, ws = _avg_window(ow, sw, pw, kw, W)
                if h0 >= h1 or w0 >= w1:
                    out[p, oh, ow] = 0
                    continue
                acc = 0.0
                for h in range(h0, h1):
                    row = xp[h]
                    for w in range(w0, w1):
                        acc += row[w]
                if divisor > 0:
                    d = divisor
                elif count_include_pad:
                    d = hs * ws
                else:
                    d = (h1 - h0) * (w1 - w0)
                out[p, oh, ow] = acc / d


@njit(**OPTS)
def avg_pool2d_backward(gy, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, gx):
    """The transpose of :func:`avg_pool2d_forward`: spread each gradient over its window
    (``gx`` zero-filled)."""
    P, H, W = gx.shape
    Ho, Wo = gy.shape[1], gy.shape[2]
    for p in range(P):
        gp = gx[p]
        for oh in range(Ho):
            h0, h1, hs = _avg_window(oh, sh, ph, kh, H)
            for ow in range(Wo):
                w0, w1, ws = _avg_window(ow, sw, pw, kw, W)
                if h0 >= h1 or w0 >= w1:
                    continue
                if divisor > 0:
                    d = divisor
                elif count_include_pad:
                    d = hs * ws
                else:
                    d = (h1 - h0) * (w1 - w0)
                v = gy[p, oh, ow] / d
                for h in range(h0, h1):
                    row = gp[h]
                    for w in range(w0, w1):
                        row[w] += v


# ------------------------------------------------------------------ natives
# ``@njit`` entry points that generated code calls directly (``Opaque.native``) and the
# ops' CPU kernels call too: C-contiguous arrays, the geometry as above, then the
# output sizes the op's static computed.
@njit(**OPTS)
def _add_bias(out, b):
    """``out[n, o] += b[o]`` unless ``b`` is empty (absent)."""
    if b.size:
        for n in range(out.shape[0]):
            for o in range(out.shape[1]):
                out[n, o] += b[o]


@njit(**OPTS)
def _view4(x, shape):
    return x.reshape((shape[0], shape[1], shape[2], shape[3]))


@njit(**OPTS)
def conv2d_native(x, w, b, x_shape, w_shape, sh, sw, ph, pw, dh, dw, groups, Ho, Wo):
    """2-D convolution (cross-correlation) of NCHW ``x`` with ``w``, plus ``b``; flat."""
    out = np.empty((x_shape[0], w_shape[0], Ho, Wo), x.dtype)
    if out.size and w_shape[1]:
        conv2d_forward(_view4(x, x_shape), _view4(w, w_shape), sh, sw, ph, pw, dh, dw,
                       groups, out)
    else:
        out[:] = 0
    _add_bias(out, b)
    return out.reshape(-1)


@njit(**OPTS)
def conv1d_native(x, w, b, x_shape, w_shape, sw, pw, dw, groups, Wo):
    """1-D convolution of NCL ``x`` with ``w``: the 2-D one of unit height."""
    x4 = np.array((x_shape[0], x_shape[1], 1, x_shape[2]))
    w4 = np.array((w_shape[0], w_shape[1], 1, w_shape[2]))
    return conv2d_native(x, w, b, x4, w4, 1, sw, 0, pw, 1, dw, groups, 1, Wo)


@njit(**OPTS)
def conv2d_input_backward_native(gy, w, gy_shape, w_shape, input_size, sh, sw, ph, pw, dh,
                                 dw, groups):
    """The gradient of :func:`conv2d_native` for its input (``input_size``), flat."""
    gx = np.zeros((input_size[0], input_size[1], input_size[2], input_size[3]), gy.dtype)
    if gy.size:
        conv2d_input_grad(_view4(gy, gy_shape), _view4(w, w_shape), sh, sw, ph, pw, dh, dw,
                          groups, gx)
    return gx.reshape(-1)


@njit(**OPTS)
def conv2d_weight_backward_native(gy, x, gy_shape, x_shape, weight_size, sh, sw, ph, pw, dh,
                                  dw, groups):
    """The gradient of :func:`conv2d_native` for its weight (``weight_size``), flat."""
    gw = np.zeros((weight_size[0], weight_size[1], weight_size[2], weight_size[3]), gy.dtype)
    if gy.size:
        conv2d_weight_grad(_view4(gy, gy_shape), _view4(x, x_shape), sh, sw, ph, pw, dh, dw,
                           groups, gw)
    return gw.reshape(-1)


@njit(**OPTS)
def max_pool2d_native(x, kh, kw, sh, sw, ph, pw, dh, dw, planes, Ho, Wo, fast):
    """``(max, flat index h * W + w of it)`` over each window of each plane; ``planes``:
    (count, H, W) of ``x``; ``fast``: the 2x2, stride-2 case. Flat."""
    p = view3(x, planes)
    out = np.empty((planes[0], Ho, Wo), x.dtype)
    idx = np.empty((planes[0], Ho, Wo), np.int64)
    if fast:
        max_pool2d_2x2(p, out, idx)
    else:
        max_pool2d_forward(p, kh, kw, sh, sw, ph, pw, dh, dw, out, idx)
    return out.reshape(-1), idx.reshape(-1)


@njit(**OPTS)
def avg_pool2d_native(x, kh, kw, sh, sw, ph, pw, count_include_pad, divisor, planes, Ho, Wo):
    """The mean over each window of each plane (``divisor`` 0: torch's count); flat."""
    out = np.empty((planes[0], Ho, Wo), x.dtype)
    avg_pool2d_forward(view3(x, planes), kh, kw, sh, sw, ph, pw, count_include_pad,
                       divisor, out)
    return out.reshape(-1)


@njit(**OPTS)
def avg_pool2d_backward_native(gy, kh, kw, sh, sw, ph, pw, count_include_pad, divisor,
                               gy_planes, gx_planes):
    """The gradient of :func:`avg_pool2d_native` (the ``gx_planes`` of the input), flat."""
    gx = np.zeros(gx_planes[0] * gx_planes[1] * gx_planes[2], gy.dtype)
    avg_pool2d_backward(view3(gy, gy_planes), kh, kw, sh, sw, ph, pw, count_include_pad,
                        divisor, view3(gx, gx_planes))
    return gx
