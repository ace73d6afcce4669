"""Scalar functions used inside elementwise kernels (CPU ``@njit`` and CUDA alike).

Each is ``register_jitable``: callable from Python, from ``@njit`` code, and from
CUDA kernels. They are written for numerical care (no overflow for |x| ~ 1e3).
"""

from __future__ import annotations

import math

import numpy as np
from numba.core import types
from numba.core.extending import overload, register_jitable


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
def _digamma_pos(x):
    """digamma for x > 0: recurrence up to x >= 10, then the asymptotic series."""
    result = 0.0
    while x < 10.0:
        result -= 1.0 / x
        x += 1.0
    inv = 1.0 / x
    inv2 = inv * inv
    series = inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 * (
        1.0 / 240 - inv2 * (1.0 / 132 - inv2 * (691.0 / 32760 - inv2 / 12))))))
    return result + math.log(x) - 0.5 * inv - series


@register_jitable
def digamma(x):
    """The logarithmic derivative of the gamma function (SciPy's values at the poles)."""
    if x != x:
        return x
    if x == 0.0:
        return math.copysign(math.inf, -x)
    if x == math.inf:
        return math.inf
    if x < 0.0:
        if x == math.floor(x):
            return math.nan
        # reflection: psi(1 - x) - psi(x) = pi * cot(pi * x)
        return _digamma_pos(1.0 - x) - math.pi / math.tan(math.pi * x)
    return _digamma_pos(x)


@register_jitable
def _polygamma_pos(n, x):
    """polygamma(n, x) for n >= 1 and x > 0."""
    fact = 1.0
    for k in range(2, n + 1):
        fact *= k
    sgn = 1.0 if n % 2 == 1 else -1.0
    acc = 0.0
    while x < 20.0:
        acc += 1.0 / x ** (n + 1)
        x += 1.0
    # asymptotic series: (n-1)!/x^n + n!/(2 x^(n+1)) + sum B2k (2k+n-1)!/((2k)! x^(2k+n))
    bern = (1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66, -691.0 / 2730, 7.0 / 6)
    fact_nm1 = fact / n
    tail = fact_nm1 / x ** n + fact / (2.0 * x ** (n + 1))
    num = fact * (n + 1)  # (2k+n-1)! at k=1
    den = 2.0  # (2k)!
    for k in range(1, 8):
        tail += bern[k - 1] * num / (den * x ** (2 * k + n))
        num *= (2 * k + n) * (2 * k + n + 1)
        den *= (2 * k + 1) * (2 * k + 2)
    return sgn * (fact * acc + tail)


@register_jitable
def polygamma(n, x):
    """The n-th derivative of digamma (n >= 0); infinite at the poles (integers <= 0)."""
    if n == 0:
        return digamma(x)
    if x != x:
        return x
    if x <= 0.0 and x == math.floor(x):
        return math.inf if n % 2 == 1 else -math.inf  # SciPy's values at the poles
    if x < 0.0:
        # shift right with psi_n(x) = psi_n(x + 1) - (-1)^(n+1) n! / x^(n+1)
        fact = 1.0
        for k in range(2, n + 1):
            fact *= k
        sgn = 1.0 if n % 2 == 1 else -1.0
        acc = 0.0
        while x < 0.0:
            acc += 1.0 / x ** (n + 1)
            x += 1.0
        return _polygamma_pos(n, x) + sgn * fact * acc
    return _polygamma_pos(n, x)


@register_jitable
def gelu(x, approximate):
    """GELU: ``x * Phi(x)`` (``approximate == 0``) or the tanh approximation (otherwise).

    The exact form uses ``erfc`` so that large negative ``x`` keep their relative accuracy.
    """
    if approximate != 0:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + math.tanh(inner))
    return 0.5 * x * math.erfc(-x * 0.7071067811865476)


# ---------------------------------------------------------------- division with rounding
# Floats: Python's ``%`` and ``//``, which Numba (CPU and CUDA) compiles to CPython's
# (and NumPy's npy_divmod) algorithm over the exact fmod, so huge or tiny quotients are
# right (remainder(1e20, 3) == 1, floor_divide(-0.25, -0.001) == 249) and a zero divisor
# gives NaN or an infinity. Integers: exact, and a zero divisor raises ZeroDivisionError
# as in PyTorch. Each is a Python function (the CUDA simulator calls it) with a typed
# Numba implementation.


def _integers(a, b) -> bool:
    return isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer))


def remainder(a, b):
    """Python's ``a % b``: the remainder of floor division (sign of ``b``)."""
    if _integers(a, b) and b == 0:
        raise ZeroDivisionError("remainder: integer division by zero")
    with np.errstate(all="ignore"):
        return np.remainder(a, b)


def floor_divide(a, b):
    """Python's ``a // b``: the quotient rounded towards minus infinity."""
    if _integers(a, b) and b == 0:
        raise ZeroDivisionError("floor_divide: integer division by zero")
    with np.errstate(all="ignore"):
        return np.floor_divide(a, b)


#: compiled without fast-math even inside fast-math callers (Numba otherwise inherits the
#: caller's flags, and ``arcp`` turns ``x / b`` into ``x * (1 / b)``)
_EXACT = {"fastmath": False}


def _integer_types(a, b) -> bool:
    return isinstance(a, (types.Integer, types.Boolean)) and \
        isinstance(b, (types.Integer, types.Boolean))


@overload(remainder, jit_options=_EXACT)
def _remainder_typed(a, b):
    if _integer_types(a, b):
        def int_remainder(a, b):
            if b == 0:
                raise ZeroDivisionError("remainder: integer division by zero")
            return a % b
        return int_remainder
    return lambda a, b: a % b


@overload(floor_divide, jit_options=_EXACT)
def _floor_divide_typed(a, b):
    if _integer_types(a, b):
        def int_floor_divide(a, b):
            if b == 0:
                raise ZeroDivisionError("floor_divide: integer division by zero")
            return a // b
        return int_floor_divide
    return lambda a, b: a // b
