"""Branch-free transcendental functions that LLVM vectorises (CPU elementwise loops).

Numba's ``math.exp``/``math.sin``... are scalar libm calls, and a loop that calls them
never vectorises (the pip llvmlite has no SVML). Each function here is range reduction
(Cody-Waite, with FMA) plus a polynomial, written with arithmetic, integer bit
operations and selects only, so a loop calling it runs on SIMD lanes once LLVM inlines
it. They take float64 or float32 and compute in float64 (a float32 result is the
float64 one rounded); accuracy is checked against mpmath by ``tests/test_vecmath.py``.

Traps (``DESIGN-NOTES.md``): these are compiled with ``fastmath={'contract'}`` only and
the public ones are *not* ``inline='always'`` (Numba would retype them under the caller's
flags, and a caller's ``reassoc``/``fast`` would reach the polynomials; the private
helpers are, into functions here with the same flags); ``forceinline=True`` instead
marks them LLVM ``alwaysinline``, which keeps each instruction's own flags and does not
depend on LLVM's size budget (vtanh and verf were over it, and a call stops
vectorisation). Floats become integers by bit casts, never by conversion of a possibly
NaN/inf value; polynomials of more than ~16 terms are split (a longer loop over the
coefficient tuple is not unrolled, and then the caller's loop does not vectorise).
``sin``/``cos``/``tan`` reduce correctly only for ``|x| <= TRIG_MAX``: the loops that call
them redo larger arguments through libm (:data:`TRIG_MAX`). Accuracy is spent where the
2-ulp budget allows: sin/cos round their reduced argument once (tan, whose error that would
double, reduces in double-double), exp evaluates one polynomial without a 1 + r split.

Polynomial coefficients: Chebyshev fits made with ``mpmath.chebyfit`` (50 digits) of the
tails below, on the reduced ranges.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["TRIG_MAX", "radd", "vatan", "vcos", "verf", "vexp", "vexpm1", "vlog", "vlog1p",
           "vpow", "vsigmoid", "vsin", "vsoftplus", "vtan", "vtanh"]

_vm = njit(cache=True, nogil=True, error_model="numpy", fastmath={"contract"}, forceinline=True)
#: helpers of the functions here, inlined into them by Numba (same flags): one compile per
#: public function instead of one per helper and polynomial (cold start)
_helper = njit(error_model="numpy", fastmath={"contract"}, inline="always")

#: ``sin``/``cos``/``tan`` are accurate (<= 2 ulp) for ``|x| <= TRIG_MAX``; callers redo
#: larger finite arguments through libm
TRIG_MAX = 2.0 ** 40

_D = ir.DoubleType()
_I = ir.IntType(64)


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (``llvm.fma.f64``)."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_D, [_D] * 3),
                                            "llvm.fma.f64")
        return builder.call(fn, args)
    return sig, codegen


@intrinsic
def _bits(typingctx, x):
    """The IEEE bits of float64 ``x`` as an int64."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _I)
    return types.int64(types.float64), codegen


@intrinsic
def _float(typingctx, i):
    """The float64 whose IEEE bits are int64 ``i``."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _D)
    return types.float64(types.int64), codegen


@intrinsic
def radd(typingctx, acc, v):
    """``acc + v`` marked reassociable: a loop summing with it vectorises (LLVM needs
    ``reassoc`` on the reduction's add) while every other operation keeps its order."""
    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1], flags=("reassoc",))
    return types.float64(types.float64, types.float64), codegen


#: ``t + _MAGIC`` for a float |t| < 2**51 rounds ``t`` to an integer held in the low bits
_MAGIC = 6755399441055744.0  # 1.5 * 2**52
_MAGIC_BITS = 0x4338000000000000
_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471805599453  # ln 2 = _LN2_HI + _LN2_LO
_LN2_LO = 2.3190468138462996e-17
_LN2_32 = 0.6931471803691238  # 32 significant bits: k * _LN2_32 is exact
_LN2_32LO = 1.9082149292705877e-10
_TWO_OVER_PI = 0.6366197723675814
_PIO2_1 = 1.5707963267948966  # pi/2 = _PIO2_1 + _PIO2_2 + _PIO2_3
_PIO2_2 = 6.123233995736766e-17
_PIO2_3 = -1.4973849048591698e-33

EXP_P = (
    0.16666666666666669, 0.041666666666666664, 0.008333333333329989,
    0.00138888888888865, 0.0001984126986342035, 2.480158731740639e-05,
    2.755726789174553e-06, 2.755728256374953e-07, 2.510065503606659e-08,
    2.0911429114372476e-09)
EXPM1_P = (
    0.16666666666666666, 0.041666666666666664, 0.008333333333333333,
    0.001388888888888889, 0.00019841269841271603, 2.480158730158828e-05,
    2.7557319221890625e-06, 2.7557319222822425e-07, 2.5052109572678863e-08,
    2.0876757647138137e-09, 1.6058698581827017e-10, 1.1470553869070668e-11,
    7.696923360464833e-13, 4.807112907243083e-14)
LOG_P = (
    0.6666666666666666, 0.40000000000000885, 0.28571428570799784, 0.22222222392581045,
    0.18181795547521137, 0.15386244737621665, 0.13268638369266825, 0.13088034850927555)
# (sin r - r) / r^3 and (cos r - 1 + r^2 / 2) / r^4 in z = r^2, |r| <= pi/4
SIN_P = (
    -0.16666666666666666, 0.008333333333330946, -0.0001984126983675497,
    2.755731610068303e-06, -2.5051131455427946e-08, 1.591810123027412e-10)
COS_P = (
    1.0, -0.5, 0.041666666666666664, -0.0013888888888887395, 2.4801587298763433e-05,
    -2.7557317270560326e-07, 2.0876146024689747e-09, -1.1382614868556325e-11)
# e**r, |r| <= ln(2) / 2 (vexp; _exp_parts keeps EXP_P for its callers' 1 + r split)
EXPF_P = (
    1.0, 1.0, 0.5, 0.16666666666666666, 0.04166666666665136, 0.008333333333332155,
    0.0013888888905881542, 0.0001984126985433861, 2.4801536388690766e-05,
    2.755728006701698e-06, 2.761380686153829e-07, 2.5095554677111112e-08)
# (e**r - 1 - r) / r^2, 0 <= r <= ln 2 (vtanh)
TANH_EM_P = (
    0.5, 0.16666666666666666, 0.041666666666669364, 0.00833333333320017,
    0.0013888888913810803, 0.00019841267493599075, 2.480171366032333e-05,
    2.755319807713756e-06, 2.764002020319741e-07, 2.4059305880048738e-08,
    2.7317935686115336e-09)
TAN_P = (
    0.3333333333333333, 0.1333333333333336, 0.05396825396821537, 0.021869488538244202,
    0.00886323547067296, 0.0035921290493352268, 0.0014558230557834536,
    0.0005901147020558141, 0.0002386517751133861, 9.880382017933713e-05,
    3.383889715395333e-05, 2.7273202947843618e-05, -1.040654761350457e-05,
    1.971257197891616e-05, -9.832779690481298e-06, 3.96919871208727e-06)
ATAN_P = (
    -0.3333333333333333, 0.19999999999999998, -0.1428571428571382, 0.11111111111048523,
    -0.09090909086522003, 0.07692307507649769, -0.06666661615663204,
    0.058822587723204305, -0.052619272025386604, 0.04750473611038553,
    -0.042722466546891845, 0.03648077169491371, -0.025774286340507768,
    0.010638580802083502)

# erf(x) / x in z = x^2, |x| <= 1
ERF_P = (
    1.1283791670955126, -0.3761263890318375, 0.11283791670954878, -0.02686617064507674,
    0.0052239776248174784, -0.0008548326980801447, 0.00012055331110409494,
    -1.4925595235970651e-05, 1.6460999970345427e-06, -1.6350307065234626e-07,
    1.4659736155673959e-08, -1.1372693191126323e-09, 5.956905633653031e-11)
# erfcx(x) / t in u = t - _ERFCX_T0, t = 2 / (2 + x), 0.5 <= x <= 27.4 (erf uses x <= 6)
_ERFCX_T0 = 0.43406360544217687
ERFCX_P = (
    0.4678676222574845, 0.6155392155004155, 0.5259444195049809, 0.18612287018562604,
    -0.13210575672515049, -0.13658377556294696, 0.0643560132465601, 0.09427028577388892,
    -0.06404786033242396, -0.062244026300396826, 0.08125883284527423,
    0.02166069526061863, -0.09477335674174242, 0.037739442058450125,
    0.07858552730825026, -0.10591459013065681, -0.004255488287101131,
    0.1372433971189764, -0.1253746825421551, -0.06544332914667099, 0.22537349317897254,
    -0.09664271505085723, -0.16416177827697975, 0.15218631747257935)


@_helper
def _poly(z, c):
    p = c[-1]
    for k in range(len(c) - 2, -1, -1):
        p = fma(p, z, c[k])
    return p


@_helper
def _pow2(k):
    """2**k for an int64 ``-1022 <= k <= 1023``."""
    return _float((k + 1023) << 52)


# ------------------------------------------------------------------ exp, expm1
@_helper
def _exp_parts(x):
    """(p, lo, k): e**x = (p + lo) 2**k, |lo| < 0.1, for x clamped to [-746, 710]."""
    xc = x if x > -746.0 else -746.0  # NaN -> -746 (callers replace the result)
    xc = xc if xc < 710.0 else 710.0
    t = xc * _LOG2E + _MAGIC
    kf = t - _MAGIC
    r = fma(-kf, _LN2_HI, xc)  # exact
    r = fma(-kf, _LN2_LO, r)
    tail = r * r * fma(r, _poly(r, EXP_P), 0.5)
    p = 1.0 + r
    return p, ((1.0 - p) + r) + tail, _bits(t) - _MAGIC_BITS  # 1 + r's rounding kept


@_helper
def _scale(e, k):
    """e * 2**k for -1076 <= k <= 1024: two factors, no overflow of the exponent field."""
    k1 = k >> 1
    return e * _pow2(k1) * _pow2(k - k1)


@_helper
def _exp_mul(x, f, c):
    """f e**x (1 + c) for finite f and |c| < 2**-30, rounded once where the product
    of f, e**x and 1 + c would round three times."""
    p, lo, k = _exp_parts(x)
    return x if x != x else _scale(f * (p + fma(p + lo, c, lo)), k)


@_vm
def vexp(x):
    """e**x (<= 1.1 ulp; exact overflow to inf, gradual underflow, NaN kept)."""
    x = float(x)
    # a NaN passes the clamps: its k is an integer of no use (no overflow: bits of a NaN
    # minus _MAGIC_BITS) times a NaN polynomial, so the result is NaN
    xc = -746.0 if x < -746.0 else x
    xc = 710.0 if xc > 710.0 else xc
    t = xc * _LOG2E + _MAGIC
    kf = t - _MAGIC
    r = fma(-kf, _LN2_LO, fma(-kf, _LN2_HI, xc))
    return _scale(_poly(r, EXPF_P), _bits(t) - _MAGIC_BITS)


@_vm
def vexpm1(x):
    """e**x - 1 (<= 1.5 ulp, exact for tiny x)."""
    x = float(x)
    xc = x if x > -40.0 else -40.0
    xc = xc if xc < 710.0 else 710.0
    t = xc * _LOG2E + _MAGIC
    t = t if abs(xc) > 0.7 else _MAGIC  # |x| <= 0.7: no reduction (no cancellation)
    kf = t - _MAGIC
    k = _bits(t) - _MAGIC_BITS
    r = fma(-kf, _LN2_HI, xc)
    r = fma(-kf, _LN2_LO, r)
    em = r + r * r * fma(r, _poly(r, EXPM1_P), 0.5)
    k1 = k >> 1
    s1 = _pow2(k1)
    s = s1 * _pow2(k - k1)
    big = ((1.0 + em) * s1) * _pow2(k - k1)  # -1 is below half an ulp; no overflow of s
    res = em if k == 0 else fma(s, em, s - 1.0)
    res = big if k > 1000 else res
    res = -1.0 if x <= -40.0 else res
    res = x if abs(x) < 5.551115123125783e-17 else res  # 2**-54: ±0, subnormals
    return x if x != x else res


# ------------------------------------------------------------------ log, log1p
@_helper
def _log_pos(x):
    """log(x) for finite x > 0 (subnormals included)."""
    sub = x < 2.2250738585072014e-308
    xs = x * 18014398509481984.0 if sub else x  # 2**54
    ix = _bits(xs) - 0x3FE6A09E667F3BCD  # sqrt(1/2): m in [sqrt(1/2), sqrt(2))
    k = ix >> 52
    m = _float(_bits(xs) - (k << 52))
    kf = float(k) - (54.0 if sub else 0.0)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    hfsq = 0.5 * f * f
    r = z * _poly(z, LOG_P)
    return kf * _LN2_32 - ((hfsq - (s * (hfsq + r) + kf * _LN2_32LO)) - f)


@_vm
def vlog(x):
    """log(x) (<= 1 ulp; log(0) = -inf, log(x < 0) = NaN)."""
    x = float(x)
    ok = x > 0.0 and x < math.inf
    res = _log_pos(x if ok else 1.0)
    res = res if ok else (x if x == math.inf else (-math.inf if x == 0.0 else math.nan))
    return res


@_vm
def vlog1p(x):
    """log(1 + x) (<= 1.5 ulp, exact for tiny x)."""
    x = float(x)
    u = 1.0 + x
    ok = x > -1.0 and x < math.inf
    uc = u if ok else 2.0
    c = (x - (uc - 1.0)) / uc  # the rounding error of 1 + x, to first order
    c = c if abs(x) < 1e300 else 0.0
    res = _log_pos(uc) + c
    res = x if abs(x) < 1e-300 else res  # keeps -0.0 and subnormals
    res = res if ok else (x if x == math.inf else (-math.inf if x == -1.0 else math.nan))
    return res


# ------------------------------------------------------------------ sin, cos, tan
@_helper
def _reduce(x):
    """(r, rl, q): x = q pi/2 + r + rl, |r| <= pi/4, r + rl to ~2**-100 relative."""
    t = x * _TWO_OVER_PI + _MAGIC
    kf = t - _MAGIC
    a = fma(-kf, _PIO2_1, x)  # exact
    b = -kf * _PIO2_2
    bl = fma(-kf, _PIO2_2, -b)  # b + bl = -kf * _PIO2_2 exactly
    s = a + b
    v = s - a
    e = (a - (s - v)) + (b - v)  # a + b = s + e exactly
    lo = fma(-kf, _PIO2_3, bl + e)
    r = s + lo
    return r, lo - (r - s), _bits(t)


@_helper
def _reduce_fast(x):
    """(r, rl, q): x = q pi/2 + r + rl, |r| <= pi/4, r rounded once (half an ulp): the
    first step is exact, ``rl`` the third part of pi/2 (matters where r is tiny)."""
    t = x * _TWO_OVER_PI + _MAGIC
    kf = t - _MAGIC
    r = fma(-kf, _PIO2_2, fma(-kf, _PIO2_1, x))
    return r, -kf * _PIO2_3, _bits(t)


@_helper
def _sin_poly(r):
    z = r * r
    return fma(r * z, _poly(z, SIN_P), r)


@_helper
def _cos_poly(r):
    return _poly(r * r, COS_P)


@_vm
def vsin(x):
    """sin(x) (<= 1.6 ulp for |x| <= TRIG_MAX)."""
    x = float(x)
    r, rl, q = _reduce_fast(x)
    s = _sin_poly(r)
    c = _cos_poly(r)
    res = fma(-rl, s, c) if q & 1 else fma(rl, c, s)
    res = -res if q & 2 else res
    return x if x == 0.0 else res  # sin(-0.0) = -0.0 (r + r^3 p(r^2) gives +0.0)


@_vm
def vcos(x):
    """cos(x) (<= 1.6 ulp for |x| <= TRIG_MAX)."""
    x = float(x)
    r, rl, q = _reduce_fast(x)
    q += 1  # cos x = sin(x + pi/2)
    s = _sin_poly(r)
    c = _cos_poly(r)
    res = fma(-rl, s, c) if q & 1 else fma(rl, c, s)
    return -res if q & 2 else res


@_vm
def vtan(x):
    """tan(x) (<= 1.5 ulp for |x| <= TRIG_MAX)."""
    x = float(x)
    r, rl, q = _reduce(x)  # tan needs r to ~2**-100
    z = r * r
    a = r * z * _poly(z, TAN_P)
    t = r + a  # tan r = t + tl, to ~2**-60 (|a| < |r|: the error of r + a is exact)
    tl = ((r - t) + a) + rl * fma(t, t, 1.0)  # tan(r + rl) = tan r + rl (1 + tan^2 r)
    y = -1.0 / t  # -1 / (t + tl) = y (1 + rho + y tl), rho = 1 + y t
    y = fma(y, fma(y, t, 1.0) + y * tl, y)
    res = y if q & 1 else t + tl
    return x if abs(x) < 3.725290298461914e-09 else res


# ------------------------------------------------------------------ tanh, sigmoid, softplus
@_vm
def vtanh(x):
    """tanh(x) = m / (m + 2), m = expm1(2|x|) (<= 1.5 ulp)."""
    x = float(x)
    ax = abs(x)
    # m = expm1(t), t = 2|x| in [0, 40] = k ln 2 + r, 0 <= r <= ln 2 (k = rint(t / ln 2 -
    # 1/2)): m = 2**k (1 + expm1(r)) - 1 never cancels
    t = 2.0 * (20.0 if ax > 20.0 else ax)  # tanh(20) rounds to 1; a NaN stays (as vexp)
    tk = fma(t, _LOG2E, -0.5) + _MAGIC
    kf = tk - _MAGIC
    r = fma(-kf, _LN2_LO, fma(-kf, _LN2_HI, t))
    em = fma(r * r, _poly(r, TANH_EM_P), r)
    s = _float((_bits(tk) - _MAGIC_BITS + 1023) << 52)  # 2**k, k <= 57
    m = fma(s, em, s - 1.0)
    den = m + 2.0
    big = m if m > 2.0 else 2.0
    derr = (2.0 if m > 2.0 else m) - (den - big)  # m + 2 = den + derr exactly
    inv = 1.0 / den  # one division (two made LLVM refuse to inline vtanh)
    q = m * inv
    q = fma(fma(-q, den, m) - q * derr, inv, q)  # the quotient refined by its residual
    return math.copysign(q, x)


@_vm
def vsigmoid(x):
    """1 / (1 + e**-x) without overflow (<= 1.5 ulp)."""
    x = float(x)
    e = vexp(-abs(x))
    num = 1.0 if x >= 0.0 else e
    den = 1.0 + e
    derr = (1.0 - den) + e  # 1 + e = den + derr exactly (e <= 1)
    inv = 1.0 / den
    y = num * inv
    return fma(fma(-y, den, num) - y * derr, inv, y)  # refined by its residual


@_vm
def vsoftplus(x, beta, threshold):
    """log(1 + e**(beta x)) / beta, and x where beta x > threshold (as PyTorch)."""
    x = float(x)
    z = x * beta
    soft = ((z if z > 0.0 else 0.0) + vlog1p(vexp(-abs(z)))) / beta
    return x if z > threshold else soft


# ------------------------------------------------------------------ atan
@_vm
def vatan(x):
    """atan(x) (<= 1 ulp): fdlibm's five intervals, chosen by selects."""
    x = float(x)
    ax = abs(x)
    # t = (ax - c) / (1 + c ax) around c = 0, 0.5, 1, 1.5, inf
    b1 = ax >= 0.4375
    b2 = ax >= 0.6875
    b3 = ax >= 1.1875
    b4 = ax >= 2.4375
    num = (-1.0 if b4 else (ax - 1.5 if b3 else (ax - 1.0 if b2 else 2.0 * ax - 1.0))) \
        if b1 else ax
    den = (ax if b4 else (fma(1.5, ax, 1.0) if b3 else (ax + 1.0 if b2 else 2.0 + ax))) \
        if b1 else 1.0
    hi = (1.5707963267948966 if b4 else (0.982793723247329 if b3 else
          (0.7853981633974483 if b2 else 0.4636476090008061))) if b1 else 0.0
    lo = (6.123233995736766e-17 if b4 else (1.3903311031230998e-17 if b3 else
          (3.061616997868383e-17 if b2 else 2.2698777452961687e-17))) if b1 else 0.0
    den = 1.0 if ax == math.inf else den
    num = 0.0 if ax == math.inf else num  # NaN stays
    t = num / den
    z = t * t
    tail = t * z * _poly(z, ATAN_P)
    res = hi - ((-tail - lo) - t)
    res = x if ax < 7.450580596923828e-09 else math.copysign(res, x)  # 2**-27
    return res


# ------------------------------------------------------------------ erf, erfc
_TWO_OVER_SQRTPI = 1.1283791670955126


@_helper
def _erfc_tail(ax):
    """erfc(ax) for 0.5 <= ax <= 27.4: exp(-ax^2) erfcx(ax), erfcx = t h(t). Up to 4.6
    ulp (rounded coefficients and a chain of roundings): enough for erf = 1 - erfc
    past x = 1, not for erfc itself, which CPU code keeps in libm."""
    d = 2.0 + ax
    bv = d - 2.0
    de = (2.0 - (d - bv)) + (ax - bv)  # 2 + ax = d + de exactly
    t = 2.0 / d
    dt = (fma(-t, d, 2.0) - t * de) * (0.5 * t)  # the exact t is t + dt (to first order)
    u = t - _ERFCX_T0
    u4 = (u * u) * (u * u)
    # in halves: a 24-term loop over the tuple is not unrolled, and then nothing vectorises
    g = t * fma(_poly(u, ERFCX_P[12:]), u4 * u4 * u4, _poly(u, ERFCX_P[:12]))
    # erfcx(x(t + dt)) = g + d erfcx/dx dx/dt dt, dx/dt = -d^2 / 2
    g = fma(fma(2.0 * ax, g, -_TWO_OVER_SQRTPI), -0.5 * d * d * dt, g)
    hi = ax * ax
    lo = fma(ax, ax, -hi)  # ax^2 = hi + lo exactly
    return _exp_mul(-hi, g, -lo)  # g exp(-hi - lo) = g exp(-hi) (1 - lo)


@_vm
def verf(x):
    """erf(x) (<= 2 ulp)."""
    x = float(x)
    ax = abs(x)
    small = x * _poly(x * x, ERF_P)
    tail = 1.0 - _erfc_tail(ax if ax < 6.0 else 6.0 if ax == ax else 1.0)
    res = small if ax < 1.0 else math.copysign(tail, x)  # erfc(1) < 0.16: little error
    return x if x != x else res



# ------------------------------------------------------------------ pow
@_helper
def _two_sum(a, b):
    s = a + b
    v = s - a
    return s, (a - (s - v)) + (b - v)


#: (2 atanh(s) - 2 s - 2/3 s^3) / s^5 in z = s^2 (as LOG_P without its first term)
_LOG_DD_P = (0.4, 0.2857142857142937, 0.22222222221652765, 0.18181818336099848,
             0.1538459488700718, 0.1333480879881234, 0.11706126464563398,
             0.11724327060846747)


@_helper
def _log_dd(x):
    """log(x) = hi + lo to ~2**-70 relative, for finite x > 0."""
    sub = x < 2.2250738585072014e-308
    xs = x * 18014398509481984.0 if sub else x  # 2**54
    ix = _bits(xs) - 0x3FE6A09E667F3BCD
    k = ix >> 52
    m = _float(_bits(xs) - (k << 52))
    kf = float(k) - (54.0 if sub else 0.0)
    f = m - 1.0  # exact
    d = 2.0 + f
    dl = (2.0 - d) + f  # |f| < 2: 2 + f = d + dl exactly
    sh = f / d
    sl = (fma(-sh, d, f) - sh * dl) / d  # s = f / (2 + f) = sh + sl
    zh = sh * sh
    zl = fma(sh, sh, -zh) + 2.0 * sh * sl  # s^2 = zh + zl
    ch = sh * zh
    cl = fma(sh, zh, -ch) + (sh * zl + sl * zh)  # s^3 = ch + cl
    # log(1 + f) = 2 s + 2/3 s^3 + s^5 (2/5 + ...): the first two terms in double-double
    th = 0.6666666666666666 * ch
    tl = fma(0.6666666666666666, ch, -th) + (3.700743415417188e-17 * ch
                                             + 0.6666666666666666 * cl)
    rest = ch * zh * _poly(zh, _LOG_DD_P)  # 2/5 s^5 + 2/7 s^7 + ...
    hi, lo = _two_sum(2.0 * sh, th)
    lo = lo + (2.0 * sl + tl + rest)
    hi2, lo2 = _two_sum(kf * _LN2_32, hi)  # kf * _LN2_32 is exact
    return _two_sum(hi2, lo2 + (lo + kf * _LN2_32LO))


@_vm
def vpow(a, b):
    """a ** b as C99 pow (<= 1 ulp): special cases by selects, |a|**b = exp(b log|a|)
    with log|a| and the product in double-double."""
    a = float(a)
    b = float(b)
    ax = abs(a)
    fin = ax > 0.0 and ax < math.inf
    lh, ll = _log_dd(ax if fin else 2.0)
    yh = b * lh
    yl = fma(b, lh, -yh) + b * ll
    big = not abs(yh) < 1e300  # overflows or underflows whatever yl is
    yl = 0.0 if big else yl
    yh = math.copysign(1e300, yh) if big else yh
    mag = _exp_mul(yh, 1.0, yl)  # exp(yh + yl) = exp(yh) (1 + yl), |yl| < 2**-40
    b_int = np.floor(b) == b
    b_odd = b_int and np.floor(0.5 * b) != 0.5 * b
    # a = +-0: +0 ** b = +0 (b > 0) or +inf (b < 0); a = +-inf: the reverse
    edge = (0.0 if b > 0.0 else math.inf) if ax == 0.0 else (math.inf if b > 0.0 else 0.0)
    mag = mag if fin else edge
    # |a| = 1 or b = +-inf: 1, 0 or inf by |a| against 1
    mag = mag if abs(b) < math.inf else (
        1.0 if ax == 1.0 else (math.inf if (ax > 1.0) == (b > 0.0) else 0.0))
    res = -mag if (a < 0.0 or (a == 0.0 and math.copysign(1.0, a) < 0.0)) and b_odd else mag
    res = math.nan if a < 0.0 and not b_int and ax < math.inf else res
    res = res if a == a and b == b else math.nan
    return 1.0 if b == 0.0 or a == 1.0 else res
