"""Accuracy of the vectorised math (nbgrad.kernels.vecmath) as CPU kernels run it.

Every function goes through the eager elementwise kernels (the loops that LLVM
vectorises, with the libm fix-up pass of sin/cos/tan), in float64 and float32 (pow in
float64): at most 2 ulp over dense sweeps against np.longdouble (mpmath where NumPy has no
long double function), special values exactly as libm gives them.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.nn.functional as F
from nbgrad.kernels import elementwise as ew
from nbgrad.kernels import vecmath

mp = pytest.importorskip("mpmath")

L = np.longdouble
RNG = np.random.default_rng(20261126)
MAX_ULP = 2.0  # the limit, float64 and float32
#: what the docstrings claim in float64 (the cheap trig reduction rounds r once: sin/cos
#: measured 1.52 ulp over 12e6 points, the sweeps below included)
CLAIMED = {"exp": 1.1, "sin": 1.6, "cos": 1.6, "tanh": 1.5, "sigmoid": 1.5}


def _sweep(lo: float, hi: float, n: int = 40_000, log: bool = False) -> np.ndarray:
    if log:
        return np.exp(RNG.uniform(np.log(lo), np.log(hi), n))
    return RNG.uniform(lo, hi, n)


def _both_signs(a: np.ndarray) -> np.ndarray:
    return np.concatenate([a, -a])


def _mp_ref(fn, xs: np.ndarray) -> np.ndarray:
    mp.mp.dps = 40
    out = np.empty(xs.size, L)
    for i, v in enumerate(xs):
        r = fn(mp.mpf(float(v)))
        hi = float(r)
        out[i] = L(hi) + L(float(r - hi))
    return out


def _softplus_ref(x):
    z = 2.0 * x
    return np.where(z > 20.0, x, (np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))) / 2.0)


# name: (run, long double reference, sweeps); softplus with beta=2, threshold=20
_TINY = _both_signs(_sweep(1e-300, 1, log=True))
_BIG = _both_signs(_sweep(1, 2e12, log=True))  # past TRIG_MAX = 2**40 too
_K = np.concatenate([RNG.integers(1, 70_000, 20_000), RNG.integers(1, 2 ** 39, 20_000)])
# the doubles nearest k pi/2 (tiny reduced arguments: the third part of pi/2 matters)
_AXIS = _both_signs((_K.astype(L) * L("1.57079632679489661923132169163975144")).astype(float))
# reduced arguments in [0.5, 0.5236]: sin r in the binade below r (r's rounding counts twice)
_WINDOW = _both_signs(_K[:20_000] * (np.pi / 2) + RNG.uniform(0.5, 0.5236, 20_000))
CASES = {
    "exp": (nb.exp, np.exp, [_sweep(-745.2, 709.78), _sweep(-1, 1), _sweep(-1e-6, 1e-6)]),
    "expm1": (nb.expm1, np.expm1, [_sweep(-40, 709.78), _sweep(-0.8, 0.8), _TINY]),
    "log": (nb.log, np.log, [_sweep(1e-307, 1e307, log=True), _sweep(0.5, 2),
                             _sweep(4.9e-324, 2.2e-308, log=True)]),
    "log1p": (nb.log1p, np.log1p, [_sweep(-0.999999, 10), _TINY, _sweep(1, 1e300, log=True)]),
    "sin": (nb.sin, np.sin, [_sweep(-10, 10), _sweep(-1e5, 1e5), _BIG, _TINY, _AXIS, _WINDOW]),
    "cos": (nb.cos, np.cos, [_sweep(-10, 10), _sweep(-1e5, 1e5), _BIG, _AXIS, _WINDOW]),
    "tan": (nb.tan, np.tan, [_sweep(-10, 10), _sweep(-1e5, 1e5), _BIG, _TINY]),
    "tanh": (nb.tanh, np.tanh, [_sweep(-25, 25), _sweep(-1, 1), _sweep(17, 21), _TINY]),
    "atan": (nb.atan, np.arctan, [_sweep(-5, 5), _both_signs(_sweep(1e-300, 1e300, log=True))]),
    "sigmoid": (nb.sigmoid, lambda x: 1 / (1 + np.exp(-x)), [_sweep(-745, 745), _sweep(-40, 40)]),
    "softplus": (lambda t: F.softplus(t, beta=2.0, threshold=20.0), _softplus_ref,
                 [_sweep(-400, 20), _sweep(-5, 15)]),
    "erf": (nb.erf, lambda x: _mp_ref(mp.erf, x),
            [_sweep(-6.5, 6.5, 1500), _sweep(-1.2, 1.2, 1000), _TINY[::160]]),
}

# each function at points where libm's result is exact (or an exact limit): ±0, ±inf,
# NaN, subnormals, overflow and underflow edges, huge arguments (sin/cos/tan past
# TRIG_MAX go through libm again)
SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 1e-310,
           -2.2250738585072014e-308, 709.782712893384, 709.7827128933841, 710.0, -708.4,
           -745.1332191019411, -745.1332191019412, -746.0, 1e300, -1e300, 1e22,
           2.0 ** 40 + 0.5, 3.0e15, 1.0, -1.0, -0.9999999999999999, 40.0, -40.0, 20.0, 6.0,
           27.0]
LIBM = {"exp": np.exp, "expm1": np.expm1, "log": np.log, "log1p": np.log1p, "sin": np.sin,
        "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "atan": np.arctan,
        "erf": np.vectorize(math.erf)}


def _ulps(got: np.ndarray, ref: np.ndarray, dtype) -> np.ndarray:
    """|got - ref| in units of the last place of ``ref`` rounded to ``dtype``."""
    finfo = np.finfo(dtype)
    with np.errstate(all="ignore"):
        r = ref.astype(dtype)
    ulp = np.maximum(np.spacing(np.abs(r)).astype(L), L(finfo.smallest_subnormal))
    with np.errstate(all="ignore"):
        err = np.abs(got.astype(L) - ref) / ulp
    same = (np.isnan(got) & np.isnan(r)) | (np.isinf(r) & (got == r))
    err = np.where(same, 0, err)
    return np.where(np.isnan(got) != np.isnan(r), np.inf, err)


def _run(run, xs: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(run(nb.tensor(xs)).numpy())


@pytest.mark.parametrize("name", list(CASES))
def test_within_two_ulp(name):
    run, ref, sweeps = CASES[name]
    xs = np.concatenate(sweeps)
    with np.errstate(all="ignore"):
        want = ref(xs.astype(L))
    err64 = _ulps(_run(run, xs), want, np.float64)
    i = int(np.argmax(err64))
    bound = CLAIMED.get(name, MAX_ULP)
    assert err64[i] <= bound, f"{name}(float64): {float(err64[i]):.2f} ulp at x = {xs[i]!r}"
    # float32: inputs rounded to float32, the same long double reference of them
    with np.errstate(all="ignore"):
        x32 = xs.astype(np.float32)
    x32 = x32[np.isfinite(x32)]
    with np.errstate(all="ignore"):
        want32 = ref(x32.astype(L))
    got32 = _run(run, x32)
    assert got32.dtype == np.float32
    err32 = _ulps(got32, want32, np.float32)
    i = int(np.argmax(err32))
    assert err32[i] <= MAX_ULP, f"{name}(float32): {float(err32[i]):.2f} ulp at x = {x32[i]!r}"


@pytest.mark.parametrize("name", list(LIBM))
def test_special_values_exact(name):
    xs = np.array(SPECIAL)
    got = _run(CASES[name][0], xs)
    with np.errstate(all="ignore"):
        want = LIBM[name](xs)
    for x, g, w in zip(xs, got, want, strict=True):
        if math.isnan(w):
            assert math.isnan(g), f"{name}({x!r}) = {g!r}, libm {w!r}"
        elif math.isinf(w) or w == 0 or abs(x) > vecmath.TRIG_MAX:
            # exact: infinities, signed zeros, and huge trig arguments (libm's own result)
            assert g == w and math.copysign(1, g) == math.copysign(1, w), \
                f"{name}({x!r}) = {g!r}, libm {w!r}"
        else:
            assert abs(g - w) <= MAX_ULP * np.spacing(abs(w)), f"{name}({x!r}) = {g!r}, libm {w!r}"


def test_pow_within_two_ulp_and_special_values():
    """a ** b (mpmath on a few thousand points; C99 pow's special cases as NumPy's)."""
    n = 600
    a = np.concatenate([np.exp(RNG.uniform(-700, 700, n)), RNG.uniform(0.5, 2, n),
                        RNG.uniform(0, 10, n), -RNG.uniform(0.1, 3, n)])
    b = np.concatenate([RNG.uniform(-1, 1, n), RNG.uniform(-1000, 1000, n),
                        RNG.uniform(-10, 10, n), np.round(RNG.uniform(-60, 60, n))])
    got = _run(lambda t: t ** nb.tensor(b), a)
    mp.mp.dps = 40
    exact = (mp.power(mp.mpf(float(x)), mp.mpf(float(y))) for x, y in zip(a, b, strict=True))
    want = np.array([L(float(r)) + L(float(r - float(r))) for r in exact])
    err = _ulps(got, want, np.float64)
    i = int(np.argmax(err))
    assert err[i] <= MAX_ULP, f"pow: {float(err[i]):.2f} ulp at {a[i]!r} ** {b[i]!r}"
    edge = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, math.inf, -math.inf,
                     math.nan, 5e-324, 1e308, -1e308, 2.5, -2.5])
    xa, xb = (v.ravel() for v in np.meshgrid(edge, edge))
    got = _run(lambda t: t ** nb.tensor(xb), xa)
    with np.errstate(all="ignore"):
        want = np.power(xa, xb)
    with np.errstate(all="ignore"):
        close = np.isfinite(want) & (want != 0) & (np.abs(got - want) <= np.spacing(np.abs(want)))
    same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
    assert (same | close).all(), list(zip(xa[~(same | close)], xb[~(same | close)], strict=True))


def test_sigmoid_softplus_special_values():
    xs = np.array([0.0, -0.0, math.inf, -math.inf, math.nan, 800.0, -800.0, 5e-324])
    sig = _run(nb.sigmoid, xs)
    np.testing.assert_array_equal(sig, [0.5, 0.5, 1.0, 0.0, math.nan, 1.0, 0.0, 0.5])
    sp = _run(lambda t: F.softplus(t, beta=1.0, threshold=20.0), xs)
    np.testing.assert_array_equal(sp[2:6], [math.inf, 0.0, math.nan, 800.0])
    assert sp[0] == math.log(2.0) and sp[6] == 0.0


def test_cpu_kernels_call_the_vectorised_math():
    """The eager kernels' source calls vecmath; the CUDA expressions keep libm."""
    src = ew.kernel_source()
    for name, fn in [("exp", "vexp"), ("sin", "vsin"), ("tanh", "vtanh"), ("sigmoid", "vsigmoid"),
                     ("pow", "vpow")]:
        body = src[src.index(f"def unary_{name}(" if name != "pow" else "def binary_pow("):]
        body = body[:body.index("\ndef ", 1)]
        assert re.search(rf"\b{fn}\((x|a, b)\)", body), body
    assert "TRIG_MAX" in src[src.index("def unary_sin("):src.index("def unary_cos(")]
    assert ew.UNARY["exp"].expr == "math.exp(x)"


def test_elementwise_loop_vectorises():
    """The W3-like loop (sin, cos, exp, tanh, a sum; erf, which LLVM inlines only as
    ``alwaysinline``) is SIMD code, no libm call."""
    from numba import njit

    @njit(error_model="numpy")
    def loop(xs, out):
        acc = 0.0
        for i in range(xs.size):
            x = xs[i]
            e = vecmath.vexp(-x * x)
            t = vecmath.vtanh(x)
            out[i] = e * vecmath.vcos(x) + 1.0 - t * t + vecmath.verf(x)
            acc = vecmath.radd(acc, vecmath.vsin(x) * e + t)
        return acc

    xs = np.linspace(-3, 3, 1001)
    loop(xs, np.empty_like(xs))
    llvm = loop.inspect_llvm(loop.signatures[0])
    assert re.search(r"<[48] x double>", llvm), "the loop did not vectorise"
    assert not re.search(r"call [^\n]*@(sin|cos|exp|tanh|erf)\b", llvm)
    assert not re.search(r"call [^\n]*@_ZN6nbgrad7kernels7vecmath", llvm), \
        "a vecmath function was not inlined"


def test_fused_loop_redoes_huge_trig_arguments():
    """Tier 2's fused loop: arguments past TRIG_MAX are computed again through libm."""
    def f(x):
        return (nb.sin(x) * nb.exp(-x * x) + nb.cos(x) + nb.tan(x)).sum()

    g = nb.jit(nb.value_and_grad(f), mode="compile")
    xs = np.array([0.5, -1.25, 1e22, 3.0e15, -2.0 ** 41, 2.0], np.float64)
    loss, grad = g(nb.tensor(xs))
    want = np.sin(xs) * np.exp(-xs * xs) + np.cos(xs) + np.tan(xs)
    np.testing.assert_allclose(float(loss), want.sum(), rtol=1e-14)
    dwant = np.exp(-xs * xs) * (np.cos(xs) - 2 * xs * np.sin(xs)) - np.sin(xs) \
        + 1 / np.cos(xs) ** 2
    np.testing.assert_allclose(np.asarray(grad), dwant, rtol=1e-13)
