"""nbgrad.special: values against scipy.special in the hard regions (the tails, the
poles, overflow), special values, float32, and gradients of the composite functions.

The table ops themselves (erfinv, erfcx, ndtri, log_ndtr, i0, i0e, i1, i1e, copysign) are
also gradchecked, jitted and run on CUDA by the tests generated from their op records
(tests/test_ops_table.py, tests/test_cuda.py); these tests are eager only, but one.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.special as sp

import nbgrad as nb
from nbgrad.autograd import gradcheck, gradgradcheck

special = nb.special

_TAIL = np.logspace(-16, -1, 61)
#: function -> (grid over its hard regions, rtol against SciPy)
GRIDS = {
    # near ±1 (1 - 1e-16 rounds to 1 - 2**-53), and tiny arguments
    "erfinv": (np.concatenate([np.linspace(-0.999, 0.999, 999), 1 - _TAIL, _TAIL - 1,
                               np.logspace(-300, -1, 31), -np.logspace(-300, -1, 31)]),
               1e-14),
    # p from 1e-300 (the AS 241 far tail) to 1 - 1e-16
    "ndtri": (np.concatenate([np.logspace(-300, -1, 300), np.linspace(0.01, 0.99, 99),
                              1 - _TAIL]), 1e-14),
    # exp(x**2) erfc(x) from -5 to 1e5 (the asymptotic series from 26)
    "erfcx": (np.concatenate([np.linspace(-5, 30, 701), np.logspace(0, 5, 101)]), 1e-14),
    # down to -1e3 (erfcx form below -5); SciPy is 2e-13 off near x = 35
    "log_ndtr": (np.concatenate([np.linspace(-40, 37, 771), -np.logspace(0, 3, 61)]),
                 1e-12),
    "i0": (np.linspace(-700, 700, 1401), 1e-14),
    "i1": (np.linspace(-700, 700, 1401), 1e-14),
    "i0e": (np.concatenate([np.linspace(-50, 50, 1001), np.logspace(0, 4, 81),
                            -np.logspace(0, 4, 81)]), 1e-14),
    "i1e": (np.concatenate([np.linspace(-50, 50, 1001), np.logspace(0, 4, 81),
                            -np.logspace(0, 4, 81)]), 1e-14),
    # the far lower tail loses x**2 * 1e-16 to the rounding of x / sqrt(2)
    "ndtr": (np.linspace(-37, 9, 461), 1e-13),
    "erf": (np.linspace(-6, 6, 121), 1e-15),
    "erfc": (np.linspace(-6, 26, 321), 1e-13),  # SciPy: 5e-14 off past 10 (libm: 3e-16)
    "expit": (np.linspace(-700, 700, 141), 1e-15),
    "logit": (np.linspace(0.001, 0.999, 99), 1e-13),
    "gammaln": (np.concatenate([np.linspace(0.01, 30, 300), np.linspace(-4.95, -0.05, 99)]),
                1e-12),
    "digamma": (np.linspace(0.05, 30, 300), 1e-12),
    "entr": (np.concatenate([[0.0, -1.0, np.inf], np.logspace(-300, 300, 61)]), 1e-14),
    "softplus": (np.concatenate([np.linspace(-800, 800, 161), np.linspace(-3, 3, 61)]), 1e-14),
}


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_values_match_scipy(name):
    x, rtol = GRIDS[name]
    got = getattr(special, name)(x)
    assert isinstance(got, nb.Tensor) and got.dtype == nb.float64 and got.shape == x.shape
    np.testing.assert_allclose(got.numpy(), getattr(sp, name)(x), rtol=rtol, atol=0)


def test_log_ndtr_upper_tail_is_minus_the_lower_cdf():
    """Past x = 37.5 ``log Phi(x) = -Phi(-x)`` is subnormal, then 0."""
    x = np.array([37.5, 38.0, 38.5, 40.0, 1e300])
    np.testing.assert_allclose(special.log_ndtr(x).numpy(), sp.log_ndtr(x), atol=1e-315)


_E = np.exp(713.9 / 2)
#: where SciPy's value is not the function's: Cephes' i0 and i1 give NaN at +-inf, and
#: overflow with exp(|x|) past 709.78 (I0 itself overflows past 713.98)
_NOT_SCIPY = {"i0": {np.inf: np.inf, -np.inf: np.inf, 713.9: sp.i0e(713.9) * _E * _E,
                     -713.9: sp.i0e(713.9) * _E * _E},
              "i1": {np.inf: np.inf, -np.inf: -np.inf, 713.9: sp.i1e(713.9) * _E * _E,
                     -713.9: -sp.i1e(713.9) * _E * _E}}


@pytest.mark.parametrize("name", ["erfinv", "ndtri", "erfcx", "log_ndtr", "ndtr", "i0", "i0e",
                                  "i1", "i1e", "entr", "expit", "softplus"])
def test_special_values_match_scipy(name):
    """Infinities, zeros of both signs, NaN, the domain edges and overflow thresholds
    (rtol 1e-13: SciPy's erfcx, log_ndtr and ndtr are up to 7e-14 off at |x| = 26.6,
    where these are within 4e-16 of mpmath, ndtr 4e-14)."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1.5, -1.5, 5e-324, 1e308,
                  -1e308, 26.6, -26.6, 26.7, -26.7, 713.9, -713.9, 715.0])
    with np.errstate(all="ignore"):
        want = getattr(sp, name)(x)
    for value, fixed in _NOT_SCIPY.get(name, {}).items():
        want[x == value] = fixed
    got = getattr(special, name)(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-300)  # SciPy's expit: no
    assert np.array_equal(np.isnan(got), np.isnan(want))  # subnormals


def test_composites_of_two_arguments_match_scipy():
    rng = np.random.default_rng(5)
    a, b = rng.uniform(0.1, 30, (4, 5)), rng.uniform(0.1, 30, (5,))
    np.testing.assert_allclose(special.betaln(a, b).numpy(), sp.betaln(a, b), rtol=1e-12,
                               atol=1e-13)
    x, y = rng.standard_normal((3, 4)), rng.uniform(0.1, 3, (3, 4))
    y[0, 0], x[0, 0] = 0.0, 0.0
    np.testing.assert_allclose(special.xlogy(x, y).numpy(), sp.xlogy(x, y), rtol=1e-14)
    np.testing.assert_allclose(special.xlog1py(x, y).numpy(), sp.xlog1py(x, y), rtol=1e-14)
    for d in (1, 2, 5):
        av = rng.uniform(0.5 * d, 0.5 * d + 20, (7,))
        np.testing.assert_allclose(special.multigammaln(av, d).numpy(), sp.multigammaln(av, d),
                                   rtol=1e-13)
    xs = rng.uniform(0.05, 30, (6,))
    for n in (0, 1, 3):
        np.testing.assert_allclose(special.polygamma(n, xs).numpy(), sp.polygamma(n, xs),
                                   rtol=1e-10)
    p = rng.uniform(0.0, 1.0, (4,))
    np.testing.assert_allclose(nb.copysign(p, [-1.0, 0.0, -0.0, 2.0]).numpy(),
                               np.copysign(p, [-1.0, 0.0, -0.0, 2.0]), rtol=0)
    with pytest.raises(ValueError, match="positive integer"):
        special.multigammaln(3.0, 0)
    with pytest.raises(ValueError, match="positive integer"):
        special.multigammaln(3.0, 1.5)


HUGE_NEGATIVE = """
import numpy as np, nbgrad as nb
xs = np.array([-np.inf, -1e300, -1e30, -9.3e18, -2.0 ** 52, -1e15 + 0.5, -1e7 + 0.5,
               -1e5 - 0.25, -40.75, -33.3, -31.7, -2.5])
for n in (0, 1, 2, 3):
    print(n, repr(nb.polygamma(n, nb.tensor(xs)).numpy().tolist()))
for dt in ("float32", "float64"):
    x = nb.tensor(xs.astype(dt), requires_grad=True)
    nb.digamma(x).sum().backward()
    print(dt, repr(x.grad.numpy().astype(float).tolist()))
"""


def test_polygamma_and_digamma_of_huge_negative_arguments():
    """Poles by value (math.floor's int used to wrap beyond 2^63, and a shift of |x| steps
    right never ended: a fuzzed digamma backward hung on -inf in float32); beyond the shift,
    the reflection at the fractional part (mpmath's values; SciPy's own hang there)."""
    proc = subprocess.run([sys.executable, "-c", HUGE_NEGATIVE], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split(" ", 1)[0]: eval(line.split(" ", 1)[1], {"inf": np.inf, "nan": np.nan})
            for line in proc.stdout.splitlines()}
    poles = 5  # -inf and the whole numbers
    # mpmath at 50 digits, by the reflection formula
    want = {
        "0": [np.nan] * poles + [34.538776394910684, 16.11809565095832, 14.654525618536063,
                                 0.5780829439704547, 5.802997937052514, 1.189505963475717,
                                 1.103156640645243],
        "1": [np.inf] * poles + [9.869604401089358, 9.869604301089359, 19.739198802253718,
                                 19.71496756495509, 15.049830061410802, 15.048360297376933,
                                 9.539246644989124],
    }
    for n, values in want.items():
        np.testing.assert_allclose(rows[n], values, rtol=1e-9)
    for n, sign in (("2", -1.0), ("3", 1.0)):
        assert rows[n][:poles] == [sign * np.inf] * poles
        assert np.isfinite(rows[n][poles:]).all()
    np.testing.assert_allclose(rows["float64"], want["1"], rtol=1e-9)
    assert rows["float32"][:7] == [np.inf] * 7  # -1e15 + 0.5, -1e7 + 0.5: whole in float32
    np.testing.assert_allclose(rows["float32"][7:], want["1"][7:], rtol=1e-5)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1, (0, 1)])
def test_logsumexp_matches_scipy(axis, keepdims):
    rng = np.random.default_rng(9)
    a = rng.standard_normal((3, 4)) * 300
    b = rng.uniform(0.0, 2.0, (4,))
    b[1] = 0.0
    for kw in ({}, {"b": b}):
        got = special.logsumexp(a, axis=axis, keepdims=keepdims, **kw)
        np.testing.assert_allclose(got.numpy(), sp.logsumexp(a, axis=axis, keepdims=keepdims,
                                                             **kw), rtol=1e-13)
    got, sign = special.logsumexp(a, axis=axis, b=b - 1.0, keepdims=keepdims, return_sign=True)
    want, wsign = sp.logsumexp(a, axis=axis, b=b - 1.0, keepdims=keepdims, return_sign=True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-13)
    np.testing.assert_array_equal(sign.numpy(), wsign)


@pytest.mark.parametrize("name", ["erfinv", "ndtri", "erfcx", "log_ndtr", "i0", "i0e", "i1",
                                  "i1e", "ndtr", "entr"])
def test_float32_keeps_its_dtype(name):
    x = np.array([0.01, 0.3, 0.5, 0.9], np.float32)
    got = getattr(special, name)(x)
    assert got.dtype == nb.float32
    np.testing.assert_allclose(got.numpy(), getattr(sp, name)(x.astype(np.float64)), rtol=1e-6)


# ------------------------------------------------------------------ gradients
def _t(values):
    return nb.tensor(np.asarray(values, np.float64), requires_grad=True)


COMPOSITES = {
    "ndtr": (lambda x: special.ndtr(x), [_t([-3.0, -0.4, 0.0, 1.2, 4.0])]),
    "betaln": (lambda a, b: special.betaln(a, b), [_t([[0.7, 2.5], [4.0, 1.1]]), _t([1.3, 3.0])]),
    "multigammaln": (lambda a: special.multigammaln(a, 3), [_t([1.2, 2.5, 7.0])]),
    "entr": (lambda x: special.entr(x), [_t([0.2, 1.0, 2.5, 7.0])]),
    "softplus": (lambda x: special.softplus(x), [_t([-30.0, -1.0, 0.5, 25.0])]),
    "logsumexp": (lambda a: special.logsumexp(a, axis=1),
                  [_t([[0.1, -2.0, 3.0], [1.0, 1.0, 0.5]])]),
    "logsumexp_b": (lambda a, b: special.logsumexp(a, axis=0, b=b),
                    [_t([[0.1, -2.0, 3.0], [1.0, 1.0, 0.5]]), _t([[0.5], [2.0]])]),
    "xlogy": (lambda x, y: special.xlogy(x, y), [_t([0.5, -1.0, 2.0]), _t([0.3, 1.5, 2.0])]),
}


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composites_gradcheck_and_gradgradcheck(name):
    fn, args = COMPOSITES[name]
    assert gradcheck(fn, tuple(args))
    assert gradgradcheck(fn, tuple(args))


def _grads(fn, x, order=2):
    """The first ``order`` derivatives of elementwise ``fn`` at the values ``x``."""
    t = _t(x)
    out, y = [], fn(t)
    for _ in range(order):
        (g,) = nb.autograd.grad(y.sum(), t, create_graph=True)
        out.append(g.detach().numpy())
        y = g
    return out


def _i1_second(x):
    """I1''(x) from the power series of I1 (no cancellation near 0)."""
    k = np.arange(1, 25)[:, None]
    logc = (np.log(2 * k + 1) + np.log(2 * k) - (2 * k + 1) * np.log(2)
            - sp.gammaln(k + 1) - sp.gammaln(k + 2))
    return np.sum(np.exp(logc) * x ** (2 * k - 1), axis=0)


def test_gradients_at_zero_are_finite_and_right():
    """i1, i1e: 1/2 at 0, their Taylor series below |x| = 1e-4 (no 0/0 or overflow in the
    second derivative); i0e: 0 at its kink (as abs); copysign: 0 where self is 0, and no
    gradient for other."""
    x = np.array([0.0, 1e-300, 3e-6, -2e-5, 9e-5, -2e-4, 2.0])
    safe = np.where(x == 0, 1.0, x)
    g1, g2 = _grads(nb.i1, x)
    np.testing.assert_allclose(g1, np.where(x == 0, 0.5, sp.i0(x) - sp.i1(x) / safe),
                               rtol=1e-15)
    np.testing.assert_allclose(g2, _i1_second(x), rtol=1e-6, atol=1e-300)
    g1, g2 = _grads(nb.i1e, x)
    np.testing.assert_allclose(g1, np.where(x == 0, 0.5, sp.i0e(x) - sp.i1e(x) * (
        np.sign(x) + 1 / safe)), rtol=1e-14)
    assert np.all(np.isfinite(g2))
    g1, _ = _grads(nb.i0e, [0.0, 2.0])
    np.testing.assert_allclose(g1, [0.0, sp.i1e(2.0) - sp.i0e(2.0)], rtol=1e-14)
    x, y = _t([0.0, -2.0, 3.0]), _t([-1.0, 1.0, -5.0])
    gx, gy = nb.autograd.grad(nb.copysign(x, y).sum(), (x, y))
    np.testing.assert_array_equal(gx.numpy(), [0.0, -1.0, -1.0])
    np.testing.assert_array_equal(gy.numpy(), [0.0, 0.0, 0.0])


def test_gradients_in_the_tails_do_not_overflow():
    """log_ndtr's gradient is sqrt(2/pi) / erfcx(-x/sqrt2): about -x far below 0 and
    phi(x) above; entr's is 0 (not NaN) at 0 and below."""
    (g1, _) = _grads(special.log_ndtr, [-1e3, -40.0, 0.0, 10.0, 40.0])
    phi = np.exp(-0.5 * np.array([0.0, 10.0]) ** 2) / np.sqrt(2 * np.pi)
    want = [1e3 + 1e-3, None, phi[0] / 0.5, phi[1], 0.0]
    np.testing.assert_allclose(g1[0], want[0], rtol=1e-8)
    np.testing.assert_allclose(g1[2:4], want[2:4], rtol=1e-13)
    assert g1[4] == 0.0 and 40.0 < g1[1] < 40.1
    (g1,) = _grads(nb.erfinv, [1 - 2**-52, 0.0], order=1)
    np.testing.assert_allclose(g1, [np.sqrt(np.pi) / 2 * np.exp(sp.erfinv(1 - 2**-52) ** 2),
                                    np.sqrt(np.pi) / 2], rtol=1e-12)
    (g1,) = _grads(nb.ndtri, [1e-300], order=1)
    np.testing.assert_allclose(g1, np.sqrt(2 * np.pi) * np.exp(0.5 * sp.ndtri(1e-300) ** 2),
                               rtol=1e-12)
    (g1,) = _grads(special.entr, [0.0, -1.0, 1.0], order=1)
    np.testing.assert_array_equal(g1, [0.0, 0.0, -1.0])


def test_logsumexp_with_weights_under_jit():
    """The weighted form (a detached maximum) traces; a zero weight keeps a finite
    gradient."""
    a = nb.tensor(np.array([[0.5, 700.0], [1.0, 2.0]]))
    b = nb.tensor(np.array([[1.0, 0.0], [2.0, 0.5]]))

    def loss(a, b):
        return special.logsumexp(a, axis=1, b=b).sum()

    want_v, want_g = nb.value_and_grad(loss, argnums=(0, 1))(a, b)
    assert np.all(np.isfinite(want_g[1].numpy()))
    got_v, got_g = nb.jit(nb.value_and_grad(loss, argnums=(0, 1)), mode="interpret")(a, b)
    np.testing.assert_allclose(got_v.numpy(), want_v.numpy(), rtol=1e-14)
    for g, w in zip(got_g, want_g, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-14)


# ------------------------------------------------------------------ the module
def test_special_is_reachable_right_after_import():
    code = ("import sys, nbgrad; assert 'nbgrad.special' not in sys.modules; "
            "print(float(nbgrad.special.ndtri(0.975)), nbgrad.special.erfinv is nbgrad.erfinv)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    value, same = proc.stdout.split()
    assert abs(float(value) - 1.959963984540054) < 1e-15 and same == "True"


def test_every_public_name_is_a_function():
    for name in special.__all__:
        assert callable(getattr(special, name)), name
    assert nb.Tensor.erfinv is not None and nb.tensor([0.5]).i0().shape == (1,)
