"""Neural-network kernels: softmax, losses, layer normalisation, embedding, dropout.

Arrays are C-contiguous and flat, with the shape passed as sizes. A class dimension
is the middle axis of an (A, C, B) view: ``A`` samples before it, ``B`` positions
after it (1 for an (N, C) input). Logarithms of sums take the maximum out first, so
inputs of magnitude 1e3 neither overflow nor lose the result; sums accumulate in
float64.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .layout import as_dtype, broadcast, broadcast_or_ones, check_index, ones_or
from .vecmath import vexp

OPTS = dict(cache=True, nogil=True)
#: rows of a contiguous (A, R) softmax or cross entropy taken per block (about this many
#: values): their shifted values (float64) stay in the L1/L2 cache
ROWS_BLOCK = 4096


@njit(**OPTS)
def _exps(x, base, n, B, m, e):
    """``e[r] = exp(x[base + r * B] - m)`` for r < n, in float64; returns their sum,
    added in order."""
    if B == 1:
        for r in range(n):
            e[r] = math.exp(x[base + r] - m)
    else:
        for r in range(n):
            e[r] = math.exp(x[base + r * B] - m)
    s = 0.0
    for r in range(n):
        s += e[r]
    return s


@njit(**OPTS)
def softmax_arb(x, A, R, B, log, out):
    """softmax (or log_softmax when ``log``) over the middle axis of an (A, R, B) view;
    one exponential per element, kept in float64 until the sum is known."""
    e = np.empty(R)
    for a in range(A):
        for b in range(B):
            base = a * R * B + b
            m = -np.inf
            for r in range(R):
                v = x[base + r * B]
                if v > m or v != v:
                    m = v
            if m == -np.inf or m != m:  # all -inf (torch gives NaN) or a NaN
                for r in range(R):
                    out[base + r * B] = np.nan
                continue
            if m == np.inf:
                for r in range(R):
                    v = x[base + r * B]
                    out[base + r * B] = np.nan if v == np.inf else (-np.inf if log else 0.0)
                continue
            s = _exps(x, base, R, B, m, e)
            if log:
                lse = m + math.log(s)
                for r in range(R):
                    out[base + r * B] = x[base + r * B] - lse
            else:
                inv = 1.0 / s
                for r in range(R):
                    out[base + r * B] = e[r] * inv


@njit(**OPTS)
def softmax_twopass(x, A, R, B, log, out):
    """:func:`softmax_arb` without its scratch row (two exponentials per element; the
    same values): the version CUDA device code compiles, which cannot allocate."""
    for a in range(A):
        for b in range(B):
            base = a * R * B + b
            m = -np.inf
            for r in range(R):
                v = x[base + r * B]
                if v > m or v != v:
                    m = v
            if m == -np.inf or m != m:  # all -inf (torch gives NaN) or a NaN
                for r in range(R):
                    out[base + r * B] = np.nan
                continue
            if m == np.inf:
                for r in range(R):
                    v = x[base + r * B]
                    out[base + r * B] = np.nan if v == np.inf else (-np.inf if log else 0.0)
                continue
            s = 0.0
            for r in range(R):
                s += math.exp(x[base + r * B] - m)
            if log:
                lse = m + math.log(s)
                for r in range(R):
                    out[base + r * B] = x[base + r * B] - lse
            else:
                inv = 1.0 / s
                for r in range(R):
                    out[base + r * B] = math.exp(x[base + r * B] - m) * inv


@njit(**OPTS)
def cross_entropy_fwd(x, target, weight, A, C, B, ignore_index, smoothing, loss, wt):
    """Per-sample cross entropy of logits ``x`` against class indices, fused with a
    stable log-softmax. ``wt`` gets each sample's class weight (0 when ignored)."""
    for a in range(A):
        for b in range(B):
            i = a * B + b
            t = target[i]
            if t == ignore_index:
                loss[i] = 0.0
                wt[i] = 0.0
                continue
            base = a * C * B + b
            m = -np.inf
            for c in range(C):
                v = x[base + c * B]
                if v > m or v != v:
                    m = v
            s = 0.0
            for c in range(C):
                s += math.exp(x[base + c * B] - m)
            lse = m + math.log(s)
            w = weight[t]
            value = -w * (x[base + t * B] - lse)
            if smoothing > 0:
                smooth = 0.0
                for c in range(C):
                    smooth -= weight[c] * (x[base + c * B] - lse)
                value = (1.0 - smoothing) * value + smoothing / C * smooth
            loss[i] = value
            wt[i] = w


@njit(**OPTS)
def nll_fwd(logp, target, weight, A, C, B, ignore_index, smoothing, loss, wt):
    """Per-sample negative log-likelihood of log-probabilities (label smoothing as torch's
    cross entropy: ``(1 - s) * nll + s / C * sum_c -w_c logp_c``)."""
    for a in range(A):
        for b in range(B):
            i = a * B + b
            t = target[i]
            if t == ignore_index:
                loss[i] = 0.0
                wt[i] = 0.0
                continue
            base = a * C * B + b
            w = weight[t]
            value = -w * logp[base + t * B]
            if smoothing > 0:
                smooth = 0.0
                for c in range(C):
                    smooth -= weight[c] * logp[base + c * B]
                value = (1.0 - smoothing) * value + smoothing / C * smooth
            loss[i] = value
            wt[i] = w


@njit(**OPTS)
def nll_bwd(g, target, weight, A, C, B, ignore_index, smoothing, out):
    """The gradient of :func:`nll_fwd` with respect to ``logp`` for per-sample upstream
    gradients ``g`` (already divided by the mean's denominator); ``out`` is zeroed here."""
    out[:] = 0.0
    for a in range(A):
        for b in range(B):
            i = a * B + b
            t = target[i]
            if t == ignore_index:
                continue
            base = a * C * B + b
            gi = g[i]
            out[base + t * B] -= (1.0 - smoothing) * weight[t] * gi
            if smoothing > 0:
                for c in range(C):
                    out[base + c * B] -= smoothing / C * weight[c] * gi


# ------------------------------------------------------------------ contiguous rows
# The CPU natives' path for a class axis last (B == 1, the (N, C) case): the same steps
# as softmax_arb and cross_entropy_fwd, but the exponentials of a block of rows go
# through vexp (<= 1.1 ulp, in float64) in one loop that vectorises, where a libm exp
# per value does not. CUDA device code keeps compiling the (A, R, B) loops above.
@njit(**OPTS)
def _row_maxes(x, base, rows, R, ms):
    """``ms[j]``: the largest of the ``R`` values of row ``j`` (from ``x[base + j * R]``),
    NaN when the row has one (selects, no branch)."""
    for j in range(rows):
        b = base + j * R
        m = -np.inf
        nan = False
        for r in range(R):
            v = x[b + r]
            m = v if v > m else m
            nan |= v != v
        ms[j] = np.nan if nan else m


@njit(**OPTS)
def _shifted_exps(x, base, rows, R, ms, e):
    """``e[j * R + r] = exp(x[base + j * R + r] - ms[j])`` in float64, one loop over all
    the block's values; a row whose maximum is not finite is shifted by 0 (its results
    are set apart by the callers)."""
    for j in range(rows):
        b = base + j * R
        m = ms[j]
        m = m if abs(m) < np.inf else 0.0
        for r in range(R):
            e[j * R + r] = x[b + r] - m
    for i in range(rows * R):
        e[i] = vexp(e[i])


@njit(**OPTS)
def _row_blocks(A, R):
    """``(rows, ms, e)``: how many rows of ``R`` a block holds (about ROWS_BLOCK values),
    and the buffers of one block's maxima and exponentials."""
    rows = max(1, ROWS_BLOCK // max(R, 1))
    return rows, np.empty(min(rows, A)), np.empty(min(rows, A) * R)


@njit(**OPTS)
def _block_exps(x, a0, rows, A, R, ms, e):
    """``(na, base)``: the block of rows from ``a0`` (``na`` rows from ``x[base]``), its
    maxima in ``ms`` and shifted exponentials in ``e``."""
    na = min(rows, A - a0)
    base = a0 * R
    _row_maxes(x, base, na, R, ms)
    _shifted_exps(x, base, na, R, ms, e)
    return na, base


@njit(**OPTS)
def softmax_rows(x, A, R, log, out):
    """:func:`softmax_arb` of ``A`` contiguous rows of ``R`` (``B == 1``): the same
    results and edge cases, the exponentials by vexp."""
    rows, ms, e = _row_blocks(A, R)
    for a0 in range(0, A, rows):
        na, base = _block_exps(x, a0, rows, A, R, ms, e)
        for j in range(na):
            b = base + j * R
            m = ms[j]
            if m == -np.inf or m != m:  # all -inf (torch gives NaN) or a NaN
                for r in range(R):
                    out[b + r] = np.nan
            elif m == np.inf:
                for r in range(R):
                    v = x[b + r]
                    out[b + r] = np.nan if v == np.inf else (-np.inf if log else 0.0)
            else:
                s = 0.0
                for r in range(R):
                    s += e[j * R + r]
                if log:
                    lse = m + math.log(s)
                    for r in range(R):
                        out[b + r] = x[b + r] - lse
                else:
                    inv = 1.0 / s
                    for r in range(R):
                        out[b + r] = e[j * R + r] * inv


@njit(**OPTS)
def cross_entropy_rows(x, target, weight, A, C, ignore_index, smoothing, loss, wt):
    """:func:`cross_entropy_fwd` of ``A`` contiguous rows of ``C`` logits (``B == 1``):
    the same results and edge cases (NaN where a row's maximum is not finite), the
    exponentials by vexp."""
    rows, ms, e = _row_blocks(A, C)
    for a0 in range(0, A, rows):
        na, base = _block_exps(x, a0, rows, A, C, ms, e)
        for j in range(na):
            i = a0 + j
            t = target[i]
            if t == ignore_index:
                loss[i] = 0.0
                wt[i] = 0.0
                continue
            b = base + j * C
            m = ms[j]
            s = 0.0
            for c in range(C):
                s += e[j * C + c]
            lse = m + math.log(s) if abs(m) < np.inf else np.nan
            w = weight[t]
            value = -w * (x[b + t] - lse)
            if smoothing > 0:
                smooth = 0.0
                for c in range(C):
                    smooth -= weight[c] * (x[b + c] - lse)
                value = (1.0 - smoothing) * value + smoothing / C * smooth
            loss[i] = value
            wt[i] = w


@njit(**OPTS)
def layer_norm_fwd(x, M, D, weight, bias, has_weight, has_bias, eps, out):
    """Normalise each of the ``M`` rows of length ``D`` (two-pass mean and variance in
    float64), then scale by ``weight`` and shift by ``bias`` (length ``D``)."""
    for m in range(M):
        row = x[m * D:(m + 1) * D]
        o = out[m * D:(m + 1) * D]
        s = 0.0
        for d in range(D):
            s += row[d]
        mean = s / D
        q = 0.0
        for d in range(D):
            dv = row[d] - mean
            q += dv * dv
        rstd = 1.0 / math.sqrt(q / D + eps)
        for d in range(D):
            v = (row[d] - mean) * rstd
            if has_weight:
                v *= weight[d]
            if has_bias:
                v += bias[d]
            o[d] = v


@njit(**OPTS)
def binary_cross_entropy_fwd(p, t, w, out):
    """``-w * (t * log(p) + (1 - t) * log(1 - p))`` with each log clamped at -100."""
    for i in range(p.size):
        pi = p[i]
        lp = math.log(pi) if pi > 0 else -np.inf
        lq = math.log1p(-pi) if pi < 1 else -np.inf
        out[i] = -w[i] * (t[i] * max(lp, -100.0) + (1.0 - t[i]) * max(lq, -100.0))


@njit(**OPTS)
def bce_with_logits_fwd(x, t, w, pw, has_pos_weight, out):
    """``w * ((1 - t) * x + (1 + (pw - 1) * t) * softplus(-x))``: the stable form of
    ``-w * (pw * t * log(sigmoid(x)) + (1 - t) * log(1 - sigmoid(x)))``."""
    for i in range(x.size):
        xi = x[i]
        sp = max(-xi, 0.0) + math.log1p(math.exp(-abs(xi)))  # softplus(-x)
        coef = 1.0 + (pw[i] - 1.0) * t[i] if has_pos_weight else 1.0
        out[i] = w[i] * ((1.0 - t[i]) * xi + coef * sp)


@njit(**OPTS)
def pointwise_loss(a, b, squared, out):
    """``(a - b)**2`` (``squared``) or ``|a - b|``."""
    for i in range(a.size):
        d = a[i] - b[i]
        out[i] = d * d if squared else abs(d)


@njit(**OPTS)
def embedding_bwd(g, idx, padding_idx, out):
    """Add row ``i`` of ``g`` (shape (n, dim)) into row ``idx[i]`` of ``out``, skipping
    ``padding_idx`` (-1 for none); repeated indices add up."""
    dim = g.shape[1]
    for i in range(idx.size):
        j = idx[i]
        if j == padding_idx:
            continue
        for k in range(dim):
            out[j, k] += g[i, k]


@njit(**OPTS)
def dropout_apply(x, u, p, out, mask):
    """Keep ``x[i]`` where ``u[i] >= p``, scaled by ``1 / (1 - p)``; ``mask`` gets the scale."""
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    for i in range(x.size):
        m = scale if u[i] >= p else 0.0
        mask[i] = m
        out[i] = x[i] * m


@njit(**OPTS)
def add_rows(out, bias):
    """``out[i, :] += bias`` for every row of a 2-D array."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] += bias[j]


# ------------------------------------------------------------------ natives
# ``@njit`` entry points that generated code calls directly (``Opaque.native``) and the
# ops' CPU kernels call too, flat (``NativePlan``). ``reduction``: 0 none, 1 mean, 2 sum.
@njit(**OPTS)
def reduce_loss(values, reduction, denom, like):
    """Per-element losses (float64, flat) in ``like``'s dtype: as they are, summed (in
    float64), or summed and divided by ``denom`` (NaN when it is 0); flat."""
    vals = values.astype(like.dtype)
    if reduction == 0:
        return vals
    total = 0.0
    for v in vals:
        total += v
    if reduction == 1:
        total = total / denom if denom else np.nan
    out = np.empty(1, like.dtype)
    out[0] = total
    return out


@njit(**OPTS)
def check_targets(t, C, ignore_index, op):
    """IndexError naming ``op`` at the first class index outside [0, C) (and not
    ``ignore_index``): the kernels index with them."""
    for v in t:
        if v != ignore_index and (v < 0 or v >= C):
            raise IndexError(op + ": target " + str(v) + " is out of bounds for " + str(C)
                             + " classes")


@njit(**OPTS)
def softmax_native(x, A, R, B, dtype, log):
    """softmax (log_softmax when ``log``) over the middle axis of an (A, R, B) view of
    ``x`` cast to ``dtype`` (if not None)."""
    y = as_dtype(x, dtype)
    out = np.empty(y.size, y.dtype)
    if B == 1:
        softmax_rows(y, A, R, log, out)
    else:
        softmax_arb(y, A, R, B, log, out)
    return out


@njit(**OPTS)
def class_loss_native(x, target, weight, A, C, B, ignore_index, smoothing, reduction,
                      fused, op):
    """cross entropy of logits (``fused``) or nll of log-probabilities ``x`` at class
    indices ``target``; 'mean' divides by the summed weights of the counted targets."""
    t = target.astype(np.int64)
    check_targets(t, C, ignore_index, op)
    w = ones_or(weight, C, np.empty(0))
    loss = np.empty(A * B)
    wt = np.empty(A * B)
    if fused and B == 1:
        cross_entropy_rows(x, t, w, A, C, ignore_index, smoothing, loss, wt)
    elif fused:
        cross_entropy_fwd(x, t, w, A, C, B, ignore_index, smoothing, loss, wt)
    else:
        nll_fwd(x, t, w, A, C, B, ignore_index, smoothing, loss, wt)
    denom = 0.0
    for v in wt:
        denom += v
    return reduce_loss(loss, reduction, denom, x)


@njit(**OPTS)
def nll_backward_native(g, target, weight, A, C, B, ignore_index, smoothing, reduction, op):
    """The gradient of the nll loss for its input (A * C * B values)."""
    t = target.astype(np.int64)
    check_targets(t, C, ignore_index, op)
    w = ones_or(weight, C, np.empty(0))
    if reduction == 0:
        gs = g.astype(np.float64)
    else:
        scale = float(g[0])
        if reduction == 1:
            denom = 0.0
            for i in range(t.size):
                if t[i] != ignore_index:
                    denom += w[t[i]]
            scale = scale / denom if denom else np.nan
        gs = np.full(A * B, scale)
    out = np.empty(A * C * B, g.dtype)
    nll_bwd(gs, t, w, A, C, B, ignore_index, smoothing, out)
    return out


@njit(**OPTS)
def pointwise_loss_native(a, b, a_shape, b_shape, shape, squared, reduction):
    """``(a - b)**2`` (``squared``) or ``|a - b|`` broadcast to ``shape``, reduced."""
    fa = broadcast(a, a_shape, shape)
    fb = broadcast(b.astype(a.dtype), b_shape, shape)
    out = np.empty(fa.size, a.dtype)
    pointwise_loss(fa, fb, squared, out)
    return reduce_loss(out, reduction, out.size, a)


@njit(**OPTS)
def binary_cross_entropy_native(p, t, weight, w_shape, shape, reduction):
    """Binary cross entropy of probabilities ``p`` (each in [0, 1]) against ``t``."""
    if p.size and (p.min() < 0 or p.max() > 1):
        raise RuntimeError("binary_cross_entropy: all input values must be between 0 and 1")
    out = np.empty(p.size, p.dtype)
    binary_cross_entropy_fwd(p, t.astype(p.dtype), broadcast_or_ones(weight, w_shape, shape, p),
                             out)
    return reduce_loss(out, reduction, out.size, p)


@njit(**OPTS)
def bce_with_logits_native(x, t, weight, pos_weight, w_shape, pw_shape, shape, reduction):
    """Binary cross entropy of ``sigmoid(x)`` against ``t``, from the logits."""
    out = np.empty(x.size, x.dtype)
    bce_with_logits_fwd(x, t.astype(x.dtype), broadcast_or_ones(weight, w_shape, shape, x),
                        broadcast_or_ones(pos_weight, pw_shape, shape, x), pos_weight.size > 0,
                        out)
    return reduce_loss(out, reduction, out.size, x)


@njit(**OPTS)
def layer_norm_native(x, weight, bias, M, D, eps):
    """:func:`layer_norm_fwd` of ``x`` as ``M`` rows of ``D``; weight and bias optional
    (empty when absent)."""
    out = np.empty(x.size, x.dtype)
    layer_norm_fwd(x, M, D, ones_or(weight, 1, x), ones_or(bias, 1, x), weight.size > 0,
                   bias.size > 0, eps, out)
    return out


@njit(**OPTS)
def embedding_native(indices, weight, rows, dim, prefix, suffix):
    """Rows of ``weight`` (``rows`` x ``dim``) at ``indices``, flat."""
    check_index(indices, 0, rows, prefix, suffix)
    w = weight.reshape((rows, dim))
    out = np.empty((indices.size, dim), weight.dtype)
    for i in range(indices.size):
        out[i] = w[indices[i]]
    return out.reshape(-1)


@njit(**OPTS)
def embedding_backward_native(g, indices, num_weights, dim, padding_idx, prefix, suffix):
    """The gradient of :func:`embedding_native` for its weight (``padding_idx`` -1: none)."""
    idx = indices.astype(np.int64)
    check_index(idx, 0, num_weights, prefix, suffix)
    out = np.zeros((num_weights, dim), g.dtype)
    embedding_bwd(g.reshape((idx.size, dim)), idx, padding_idx, out)
    return out.reshape(-1)


@njit(**OPTS)
def one_hot_native(x, num_classes, ndim):
    """int64 one-hot rows of length ``num_classes`` for the indices ``x`` (of ``ndim``
    dimensions, for the error message), flat."""
    out = np.zeros((x.size, num_classes), np.int64)
    for i in range(x.size):
        j = x[i]
        if j < -num_classes or j >= num_classes:
            raise IndexError("index " + str(j) + " is out of bounds for axis "
                             + str(ndim) + " with size " + str(num_classes))
        out[i, j if j >= 0 else j + num_classes] = 1
    return out.reshape(-1)
