"""The hand-written Numba floor: each workload fused by hand, gradient derived by hand.

These are the practical lower bound on this CPU for one thread: what a careful person
writes in Numba with the derivative worked out on paper. They allocate their outputs
on every call like the frameworks do. ``fastmath`` is on where it helps (reassociating
the reductions); every function is cached on disk.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, fastmath=True)
def w1_rollout(W, b, x0, steps, dt):
    """W1: forward keeping the states, then the adjoint loop; returns (loss, gW, gb)."""
    n = x0.shape[0]
    c = 1.0 - dt * 0.1
    xs = np.empty((steps + 1, n))
    hs = np.empty((steps, n))
    xs[0, :] = x0
    for t in range(steps):
        for i in range(n):
            acc = b[i]
            for j in range(n):
                acc += W[i, j] * xs[t, j]
            h = np.tanh(acc)
            hs[t, i] = h
            xs[t + 1, i] = c * xs[t, i] + dt * h
    loss = 0.0
    for i in range(n):
        loss += xs[steps, i] * xs[steps, i]
    gW = np.zeros((n, n))
    gb = np.zeros(n)
    gx = np.empty(n)
    gxn = np.empty(n)
    ga = np.empty(n)
    for i in range(n):
        gx[i] = 2.0 * xs[steps, i]
    for t in range(steps - 1, -1, -1):
        for i in range(n):
            h = hs[t, i]
            ga[i] = gx[i] * dt * (1.0 - h * h)
            gb[i] += ga[i]
        for j in range(n):
            gxn[j] = c * gx[j]
        for i in range(n):
            g = ga[i]
            for j in range(n):
                gW[i, j] += g * xs[t, j]
                gxn[j] += W[i, j] * g
        gx, gxn = gxn, gx
    return loss, gW, gb


@njit(cache=True, nogil=True, fastmath=True)
def _relu_mask_inplace(d, z):
    """d *= (z > 0), elementwise over 2-D arrays of the same shape."""
    for i in range(d.shape[0]):
        for j in range(d.shape[1]):
            if z[i, j] <= 0:
                d[i, j] = 0


@njit(cache=True, nogil=True, fastmath=True)
def w2_sgd_step(W1, b1, W2, b2, W3, b3, X, y, lr):
    """W2: MLP forward, softmax cross-entropy, backward, SGD update in place (float32).

    Returns (loss, gW1, gb1, gW2, gb2, gW3, gb3); matmuls go to BLAS through np.dot.
    """
    n = X.shape[0]
    z1 = X @ W1 + b1
    h1 = np.maximum(z1, np.float32(0))
    z2 = h1 @ W2 + b2
    h2 = np.maximum(z2, np.float32(0))
    z3 = h2 @ W3 + b3
    k = z3.shape[1]
    d3 = np.empty_like(z3)
    loss = 0.0
    inv_n = np.float32(1.0) / np.float32(n)
    for i in range(n):
        m = z3[i, 0]
        for j in range(1, k):
            m = max(m, z3[i, j])
        s = 0.0
        for j in range(k):
            e = np.exp(z3[i, j] - m)
            d3[i, j] = e
            s += e
        loss += np.log(s) + m - z3[i, y[i]]
        r = inv_n / s
        for j in range(k):
            d3[i, j] *= r
        d3[i, y[i]] -= inv_n
    loss /= n
    gW3 = h2.T @ d3
    gb3 = d3.sum(axis=0)
    d2 = d3 @ W3.T
    _relu_mask_inplace(d2, z2)
    gW2 = h1.T @ d2
    gb2 = d2.sum(axis=0)
    d1 = d2 @ W2.T
    _relu_mask_inplace(d1, z1)
    gW1 = X.T @ d1
    gb1 = d1.sum(axis=0)
    W1 -= lr * gW1
    b1 -= lr * gb1
    W2 -= lr * gW2
    b2 -= lr * gb2
    W3 -= lr * gW3
    b3 -= lr * gb3
    return loss, gW1, gb1, gW2, gb2, gW3, gb3


@njit(cache=True, nogil=True, fastmath=True)
def w3_elementwise(x):
    """W3: one pass computing the loss and the gradient; tanh through expm1.

    ``tanh|x| = -m / (2 + m)`` with ``m = expm1(-2|x|)`` (exact near 0, no overflow);
    scalar libm ``tanh`` is slower (no SVML in the pip llvmlite).
    """
    n = x.shape[0]
    g = np.empty(n)
    loss = 0.0
    for i in range(n):
        v = x[i]
        e = np.exp(-v * v)
        s = np.sin(v)
        m = np.expm1(-2.0 * abs(v))
        t = -m / (2.0 + m)
        if v < 0:
            t = -t
        loss += s * e + t
        g[i] = e * (np.cos(v) - 2.0 * v * s) + 1.0 - t * t
    return loss, g


@njit(cache=True, nogil=True, fastmath=True)
def w4_hvp(X, y, w, v, lam):
    """W4: loss and H v of L2-regularised logistic regression, two passes over X."""
    n, d = X.shape
    loss = 0.0
    u = np.empty(n)
    for i in range(n):
        z = 0.0
        xv = 0.0
        for j in range(d):
            z += X[i, j] * w[j]
            xv += X[i, j] * v[j]
        az = abs(z)
        loss += max(z, 0.0) + np.log1p(np.exp(-az)) - y[i] * z
        s = 1.0 / (1.0 + np.exp(-z))
        u[i] = s * (1.0 - s) * xv
    hv = lam * v
    inv_n = 1.0 / n
    for i in range(n):
        ui = u[i] * inv_n
        for j in range(d):
            hv[j] += X[i, j] * ui
    sq = 0.0
    for j in range(d):
        sq += w[j] * w[j]
    return loss * inv_n + 0.5 * lam * sq, hv


@njit(cache=True, nogil=True, fastmath=True)
def w5_softclip(x0, steps):
    """W5: the derivative carried along the forward (a product per element).

    Steps outside, elements inside, so each step is one vectorised pass.
    """
    n = x0.shape[0]
    x = x0.copy()
    g = np.ones(n)
    for _ in range(steps):
        for i in range(n):
            r = 1.0 / (1.0 + abs(x[i]))
            g[i] *= 0.9 + 0.1 * r * r
            x[i] = 0.9 * x[i] + 0.1 * x[i] * r
    loss = 0.0
    for i in range(n):
        loss += x[i]
    return loss, g


@njit(cache=True, nogil=True, fastmath=True)
def w6_tiny(x, steps, a, b):
    """W6: the affine chain per element; the gradient is a**steps by repeated product."""
    n = x.shape[0]
    g = np.empty(n)
    loss = 0.0
    for i in range(n):
        y = x[i]
        gi = 1.0
        for _ in range(steps):
            y = y * a + b
            gi *= a
        loss += y
        g[i] = gi
    return loss, g
