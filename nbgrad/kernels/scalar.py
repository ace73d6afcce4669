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


#: 2^52: every float of at least this magnitude is a whole number
_WHOLE = 4503599627370496.0


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
        if x <= -_WHOLE or x == math.floor(x):  # (math.floor's int holds no larger x)
            return math.nan
        # reflection: psi(1 - x) - psi(x) = pi * cot(pi * x), cot of period 1 taken at
        # the fractional part (exact here), not at pi * x (rounded: -1e15 + 0.5 was off)
        return _digamma_pos(1.0 - x) - math.pi / math.tan(math.pi * (x - math.floor(x)))
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


#: the most steps :func:`polygamma` shifts a negative argument right (beyond: reflection)
_SHIFT_MAX = 32.0


@register_jitable
def polygamma(n, x):
    """The n-th derivative of digamma (n >= 0); infinite at the poles (integers <= 0)."""
    if n == 0:
        return digamma(x)
    if x != x:
        return x
    if x <= 0.0 and (x <= -_WHOLE or x == math.floor(x)):
        return math.inf if n % 2 == 1 else -math.inf  # SciPy's values at the poles
    if x < -_SHIFT_MAX:
        # reflection, psi_n(x) = (-1)^n psi_n(1 - x) - pi^(n+1) cot^(n)(pi x), with the
        # cot term (period 1) from the same formula at the fractional part f of x, in (0, 1)
        # (exact: |x| < 2^52 here); no shift of |x| steps (x = -1e15 + 0.5 never ended)
        f = x - math.floor(x)
        sgn = 1.0 if n % 2 == 0 else -1.0
        return sgn * (_polygamma_pos(n, 1.0 - x) - _polygamma_pos(n, 1.0 - f)) + \
            _polygamma_pos(n, f)
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


# ---------------------------------------------------------------- special functions
# Written so that plain Python (the CUDA simulator) raises no OverflowError or
# ValueError either: every ``math.exp``, ``math.log`` and ``math.sqrt`` is guarded.
# The modified Bessel helpers are ``bessel_*`` (jit-generated code names loop indices
# ``i0``, ``i1``...).

_SQRT1_2 = 0.7071067811865476  # 1 / sqrt(2)
_INV_SQRT_PI = 0.5641895835477563  # 1 / sqrt(pi)
_TWO_INV_SQRT_PI = 1.1283791670955126  # 2 / sqrt(pi)
_EXP_MAX = 709.782712893384  # log of the largest float64


@register_jitable
def _exp_x2(x, s):
    """``exp(s * x * x)`` for ``s`` a power of two, without the rounding error of
    ``x * x`` (Dekker's exact product ``x * x = hi + lo``), which ``exp`` would multiply
    by ``x * x`` (1e-13 relative at x = 26)."""
    hi = x * x
    if s * hi > _EXP_MAX:
        return math.inf
    if s * hi < -746.0:  # underflows (and x = inf would make NaN below)
        return 0.0
    c = 134217729.0 * x  # 2**27 + 1: split x into two 26-bit halves
    xh = c - (c - x)
    xl = x - xh
    lo = ((xh * xh - hi) + 2.0 * xh * xl) + xl * xl
    e = math.exp(s * hi)
    return e + e * (s * lo)


@register_jitable
def _erfcx_pos(x):
    """``exp(x**2) erfc(x)`` for ``x >= 0``."""
    if x < 26.0:  # erfc(x) is a normal float64 here, accurate to an ulp
        return _exp_x2(x, 1.0) * math.erfc(x)
    if x > 1e150:  # 1 / (2 x**2) is below an ulp (and x * x would overflow)
        return _INV_SQRT_PI / x
    # the asymptotic series 1/(x sqrt(pi)) sum (-1)^k (2k-1)!! / (2x^2)^k: at x >= 26
    # its terms fall below 1e-19 by k = 8
    inv = 0.5 / (x * x)
    term = 1.0
    total = 1.0
    for k in range(1, 10):
        term *= -(2 * k - 1) * inv
        total += term
    return _INV_SQRT_PI * total / x


@register_jitable
def erfcx(x):
    """The scaled complementary error function ``exp(x**2) erfc(x)`` (no overflow or
    underflow for large positive ``x``; +inf below about -26.64, as SciPy)."""
    if x != x:
        return x + 0.0
    if x >= 0:
        return _erfcx_pos(x)
    if x * x > _EXP_MAX:
        return math.inf
    return 2.0 * _exp_x2(x, 1.0) - _erfcx_pos(-x)


@register_jitable
def _ppnd16(q, r):
    """The standard normal quantile at ``p`` from ``q = p - 0.5`` and ``r = min(p, 1 - p)``
    (0 < r <= 0.5; each exact where it is used): Wichura's algorithm AS 241 (PPND16,
    Applied Statistics 37, 1988), accurate to about 1e-16."""
    if abs(q) <= 0.425:
        r = 0.180625 - q * q
        num = (((((((2509.0809287301226727 * r + 33430.575583588128105) * r
                    + 67265.770927008700853) * r + 45921.953931549871457) * r
                  + 13731.693765509461125) * r + 1971.5909503065514427) * r
                + 133.14166789178437745) * r + 3.3871328727963666080)
        den = (((((((5226.4952788528545610 * r + 28729.085735721942674) * r
                    + 39307.895800092710610) * r + 21213.794301586595867) * r
                  + 5394.1960214247511077) * r + 687.18700749205790830) * r
                + 42.313330701600911252) * r + 1.0)
        return q * num / den
    r = math.sqrt(-math.log(r))
    if r <= 5.0:
        r -= 1.6
        num = (((((((7.74545014278341407640e-4 * r + 2.27238449892691845833e-2) * r
                    + 2.41780725177450611770e-1) * r + 1.27045825245236838258) * r
                  + 3.64784832476320460504) * r + 5.76949722146069140550) * r
                + 4.63033784615654529590) * r + 1.42343711074968357734)
        den = (((((((1.05075007164441684324e-9 * r + 5.47593808499534494600e-4) * r
                    + 1.51986665636164571966e-2) * r + 1.48103976427480074590e-1) * r
                  + 6.89767334985100004550e-1) * r + 1.67638483018380384940) * r
                + 2.05319162663775882187) * r + 1.0)
    else:
        r -= 5.0
        num = (((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r
                    + 1.24266094738807843860e-3) * r + 2.65321895265761230930e-2) * r
                  + 2.96560571828504891230e-1) * r + 1.78482653991729133580) * r
                + 5.46378491116411436990) * r + 6.65790464350110377720)
        den = (((((((2.04426310338993978564e-15 * r + 1.42151175831644588870e-7) * r
                    + 1.84631831751005468180e-5) * r + 7.86869131145613259100e-4) * r
                  + 1.48753612908506148525e-2) * r + 1.36929880922735805310e-1) * r
                + 5.99832206555887937690e-1) * r + 1.0)
    value = num / den
    return -value if q < 0.0 else value


@register_jitable
def ndtri(p):
    """The inverse of the standard normal CDF (the quantile function): ``-inf`` at 0,
    ``+inf`` at 1, NaN outside ``[0, 1]`` (AS 241)."""
    if p != p:
        return p + 0.0
    if p <= 0.0 or p >= 1.0:
        if p == 0.0:
            return -math.inf
        return math.inf if p == 1.0 else math.nan
    return _ppnd16(p - 0.5, p if p < 0.5 else 1.0 - p)  # 1 - p is exact for p >= 0.5


@register_jitable
def erfinv(x):
    """The inverse error function: ``±inf`` at ``±1``, NaN outside ``[-1, 1]``.

    ``erfinv(x) = ndtri((1 + x) / 2) / sqrt(2)`` by AS 241 with exact arguments
    (``|x| / 2`` in the centre, ``(1 - |x|) / 2`` in the tail), then one Halley step on
    ``erf(y) = |x|`` (written ``1 - |x| - erfc(y)`` above 0.5, which keeps the residual
    exact up to ``±1``).
    """
    if x != x:
        return x + 0.0
    a = abs(x)
    if a >= 1.0:
        return math.copysign(math.inf, x) if a == 1.0 else math.nan
    if a <= 0.85:
        y = _ppnd16(0.5 * a, 0.5 - 0.5 * a) * _SQRT1_2
    else:
        t = 0.5 * (1.0 - a)
        y = -_ppnd16(t - 0.5, t) * _SQRT1_2
    # Halley on f(y) = erf(y) - a: f' = 2/sqrt(pi) exp(-y^2), f'' = -2 y f'
    if a > 0.5:
        f = (1.0 - a) - math.erfc(y)  # 1 - a is exact here
    else:
        f = math.erf(y) - a
    y = y - f / (_TWO_INV_SQRT_PI * math.exp(-y * y) + y * f)
    return math.copysign(y, x)


@register_jitable
def log_ndtr(x):
    """``log`` of the standard normal CDF, accurate in both tails: ``log1p(-Phi(-x))``
    above 0, ``log(erfcx(-x/sqrt2) / 2) - x**2/2`` below -5 (no underflow)."""
    if x != x:
        return x + 0.0
    if x > 0.0:  # Phi(-x) = exp(-x**2/2) erfcx(x/sqrt2) / 2, x**2 exact
        return math.log1p(-0.5 * _exp_x2(x, -0.5) * _erfcx_pos(x * _SQRT1_2))
    if x > -5.0:
        return math.log(0.5 * math.erfc(-x * _SQRT1_2))
    if x == -math.inf:
        return -math.inf
    return math.log(0.5 * _erfcx_pos(-x * _SQRT1_2)) - 0.5 * x * x


# Cephes' Chebyshev coefficients (i0.c, i1.c): exp(-x) I0(x) and exp(-x) I1(x) / x on
# [0, 8] (argument x/2 - 2), exp(-x) sqrt(x) I0(x) and I1(x) on [8, inf] (32/x - 2)
_I0_A = (
    -4.41534164647933937950e-18, 3.33079451882223809783e-17, -2.43127984654795469359e-16,
    1.71539128555513303061e-15, -1.16853328779934516808e-14, 7.67618549860493561688e-14,
    -4.85644678311192946090e-13, 2.95505266312963983461e-12, -1.72682629144155570723e-11,
    9.67580903537323691224e-11, -5.18979560163526290666e-10, 2.65982372468238665035e-9,
    -1.30002500998624804212e-8, 6.04699502254191894932e-8, -2.67079385394061173391e-7,
    1.11738753912010371815e-6, -4.41673835845875056359e-6, 1.64484480707288970893e-5,
    -5.75419501008210370398e-5, 1.88502885095841655729e-4, -5.76375574538582365885e-4,
    1.63947561694133579842e-3, -4.32430999505057594430e-3, 1.05464603945949983183e-2,
    -2.37374148058994688156e-2, 4.93052842396707084878e-2, -9.49010970480476444210e-2,
    1.71620901522208775349e-1, -3.04682672343198398683e-1, 6.76795274409476084995e-1)
_I0_B = (
    -7.23318048787475395456e-18, -4.83050448594418207126e-18, 4.46562142029675999901e-17,
    3.46122286769746109310e-17, -2.82762398051658348494e-16, -3.42548561967721913462e-16,
    1.77256013305652638360e-15, 3.81168066935262242075e-15, -9.55484669882830764870e-15,
    -4.15056934728722208663e-14, 1.54008621752140982691e-14, 3.85277838274214270114e-13,
    7.18012445138366623367e-13, -1.79417853150680611778e-12, -1.32158118404477131188e-11,
    -3.14991652796324136454e-11, 1.18891471078464383424e-11, 4.94060238822496958910e-10,
    3.39623202570838634515e-9, 2.26666899049817806459e-8, 2.04891858946906374183e-7,
    2.89137052083475648297e-6, 6.88975834691682398426e-5, 3.36911647825569408990e-3,
    8.04490411014108831608e-1)
_I1_A = (
    2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
    -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
    3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
    -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-9,
    9.38153738649577178388e-9, -4.44505912879632808065e-8, 2.00329475355213526229e-7,
    -8.56872026469545474066e-7, 3.47025130813767847674e-6, -1.32731636560394358279e-5,
    4.78156510755005422638e-5, -1.61760815825896745588e-4, 5.12285956168575772895e-4,
    -1.51357245063125314899e-3, 4.15642294431288815669e-3, -1.05640848946261981558e-2,
    2.47264490306265168283e-2, -5.29459812080949914269e-2, 1.02643658689847095384e-1,
    -1.76416518357834055153e-1, 2.52587186443633654823e-1)
_I1_B = (
    7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
    -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
    -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
    4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
    -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
    3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
    -3.83538038596423702205e-9, -2.63146884688951950684e-8, -2.51223623787020892529e-7,
    -3.88256480887769039346e-6, -1.10588938762623716291e-4, -9.76109749136146840777e-3,
    7.78576235018280120474e-1)


@register_jitable
def _chbevl(x, coefs):
    """Clenshaw's sum of the Chebyshev series ``coefs`` (highest order first) at ``x``."""
    b0 = coefs[0]
    b1 = 0.0
    b2 = 0.0
    for i in range(1, len(coefs)):
        b2 = b1
        b1 = b0
        b0 = x * b1 - b2 + coefs[i]
    return 0.5 * (b0 - b2)


@register_jitable
def _i0e_abs(a):
    """``exp(-a) I0(a)`` for ``a = |x|`` (not NaN)."""
    if a <= 8.0:
        return _chbevl(0.5 * a - 2.0, _I0_A)
    return _chbevl(32.0 / a - 2.0, _I0_B) / math.sqrt(a)


@register_jitable
def _i1e_abs(a):
    """``exp(-a) I1(a)`` for ``a = |x|`` (not NaN)."""
    if a <= 8.0:
        return _chbevl(0.5 * a - 2.0, _I1_A) * a
    return _chbevl(32.0 / a - 2.0, _I1_B) / math.sqrt(a)


@register_jitable
def _exp_times(a, scaled):
    """``exp(a) * scaled``, finite up to the overflow of the product (not of exp(a))."""
    if a <= 700.0:
        return math.exp(a) * scaled
    if a > 1400.0:  # I0, I1 overflow past a = 713.99
        return math.inf
    h = math.exp(0.5 * a)
    return h * scaled * h


@register_jitable
def bessel_i0(x):
    """The modified Bessel function of the first kind of order 0 (Cephes' ``i0``)."""
    if x != x:
        return x + 0.0
    a = abs(x)
    return _exp_times(a, _i0e_abs(a))


@register_jitable
def bessel_i0e(x):
    """``exp(-|x|) I0(x)`` (Cephes' ``i0e``)."""
    if x != x:
        return x + 0.0
    return _i0e_abs(abs(x))


@register_jitable
def bessel_i1(x):
    """The modified Bessel function of the first kind of order 1 (odd; Cephes' ``i1``)."""
    if x != x:
        return x + 0.0
    a = abs(x)
    return math.copysign(_exp_times(a, _i1e_abs(a)), x)


@register_jitable
def bessel_i1e(x):
    """``exp(-|x|) I1(x)`` (Cephes' ``i1e``)."""
    if x != x:
        return x + 0.0
    return math.copysign(_i1e_abs(abs(x)), x)
