"""Scalar functions used inside elementwise kernels (CPU ``@njit`` and CUDA alike).

Each is ``register_jitable``: callable from Python, from ``@njit`` code, and from
CUDA kernels. They are written for numerical care (no overflow for |x| ~ 1e3).
"""

from __future__ import annotations

import math

from numba.core.extending import register_jitable


@register_jitable
def sign(x):
    if x > 0:
        return 1.0
    if x < 0:
        return -1.0
    return x * 0.0  # keeps 0.0 and NaN


@register_jitable
def sigmoid(x):
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@register_jitable
def softplus(x, beta, threshold):
    z = x * beta
    if z > threshold:
        return x
    return (max(z, 0.0) + math.log1p(math.exp(-abs(z)))) / beta


@register_jitable
def relu(x):
    return 0.0 if x <= 0 else x


@register_jitable
def digamma(x):
    if x == 0.0:
        return math.copysign(math.inf, -x)
    if x < 0.0:
        if x == math.floor(x):
            return math.nan
        # reflection: psi(1 - x) - psi(x) = pi * cot(pi * x)
        return digamma(1.0 - x) - math.pi / math.tan(math.pi * x)
    result = 0.0
    while x < 6.0:
        result -= 1.0 / x
        x += 1.0
    inv = 1.0 / x
    inv2 = inv * inv
    series = inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (
        1.0 / 240 - inv2 * (1.0 / 132)))))
    return result + math.log(x) - 0.5 * inv - series


@register_jitable
def polygamma(n, x):
    """The n-th derivative of digamma, n >= 1, for x > 0 (NaN elsewhere on poles)."""
    if n == 0:
        return digamma(x)
    if x <= 0.0 and x == math.floor(x):
        return math.nan
    fact = 1.0
    for k in range(2, n + 1):
        fact *= k
    sgn = 1.0 if n % 2 == 1 else -1.0
    if x < 0.0:
        # shift right with the recurrence until x > 0
        acc = 0.0
        while x < 0.0:
            acc += 1.0 / x ** (n + 1)
            x += 1.0
        return polygamma(n, x) + sgn * fact * acc
    acc = 0.0
    while x < 20.0:
        acc += 1.0 / x ** (n + 1)
        x += 1.0
    # asymptotic series: (n-1)!/x^n + n!/(2 x^(n+1)) + sum B2k (2k+n-1)!/((2k)! x^(2k+n))
    bern = (1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66, -691.0 / 2730, 7.0 / 6)
    fact_nm1 = fact / n
    tail = fact_nm1 / x ** n + fact / (2.0 * x ** (n + 1))
    num = fact  # (2k+n-1)! starting at k=1: (n+1)!
    num *= n + 1
    den = 2.0  # (2k)!
    for k in range(1, 8):
        tail += bern[k - 1] * num / (den * x ** (2 * k + n))
        num *= (2 * k + n) * (2 * k + n + 1)
        den *= (2 * k + 1) * (2 * k + 2)
    return sgn * (fact * acc + tail)
