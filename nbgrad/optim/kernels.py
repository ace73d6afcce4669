"""The optimizers' update rules as Numba kernels: one call updates every parameter of a
group, stored end to end in flat buffers (segment ``s`` is ``offsets[s]:offsets[s+1]``).

A segment whose parameter has no gradient (``active[s] == 0``) is left alone, and its
step count does not advance, as PyTorch skips such parameters. The arithmetic follows
PyTorch's single-tensor implementations, so trajectories agree to rounding.
"""

from __future__ import annotations

import math

from numba import njit

OPTS = dict(cache=True, nogil=True)


@njit(**OPTS)
def sgd_step(param, grad, buf, offsets, active, steps, lr, momentum, dampening,
             weight_decay, nesterov, maximize):
    """SGD with momentum (the buffer starts as the first gradient), Nesterov and L2."""
    for s in range(offsets.size - 1):
        if not active[s]:
            continue
        first = steps[s] == 0
        steps[s] += 1
        for i in range(offsets[s], offsets[s + 1]):
            d = -grad[i] if maximize else grad[i]
            if weight_decay != 0.0:
                d += weight_decay * param[i]
            if momentum != 0.0:
                b = d if first else momentum * buf[i] + (1.0 - dampening) * d
                buf[i] = b
                d = d + momentum * b if nesterov else b
            param[i] -= lr * d


@njit(**OPTS)
def adam_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, offsets, active, steps, lr,
              beta1, beta2, eps, weight_decay, decoupled, amsgrad, maximize):
    """Adam (``decoupled``: AdamW's weight decay) with bias correction and AMSGrad."""
    for s in range(offsets.size - 1):
        if not active[s]:
            continue
        steps[s] += 1
        t = steps[s]
        step_size = lr / (1.0 - beta1 ** t)
        bc2_sqrt = math.sqrt(1.0 - beta2 ** t)
        for i in range(offsets[s], offsets[s + 1]):
            g = -grad[i] if maximize else grad[i]
            p = param[i]
            if weight_decay != 0.0:
                if decoupled:
                    p *= 1.0 - lr * weight_decay
                else:
                    g += weight_decay * p
            m = exp_avg[i] + (1.0 - beta1) * (g - exp_avg[i])  # torch's lerp
            v = beta2 * exp_avg_sq[i] + (1.0 - beta2) * g * g
            exp_avg[i] = m
            exp_avg_sq[i] = v
            if amsgrad:
                v = max(max_exp_avg_sq[i], v)
                max_exp_avg_sq[i] = v
            param[i] = p - step_size * (m / (math.sqrt(v) / bc2_sqrt + eps))
