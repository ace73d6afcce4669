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

OPTS = dict(cache=True, nogil=True)


@njit(**OPTS)
def softmax_arb(x, A, R, B, log, out):
    """softmax (or log_softmax when ``log``) over the middle axis of an (A, R, B) view."""
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
