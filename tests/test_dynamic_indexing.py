"""Dynamic indexing and value-dependent control flow (issue 16, item 3): ``dynamic_slice``,
``dynamic_update_slice``, ``x[i]`` with a traced integer, ``x.at[idx]`` updates,
``while_loop`` and ``cond``; eagerly and under both ``nbgrad.jit`` tiers, gradients
against finite differences and against JAX where it is installed."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import gradcheck, gradgradcheck
from nbgrad.testing.fuzz import Leaf, Program, Step
from nbgrad.testing.fuzz.differential import check_program

MODES = ["eager", "interpret", "compile"]
RNG = np.random.default_rng(16)
M0 = RNG.standard_normal((5, 4))
V0 = RNG.standard_normal(4)


@pytest.fixture(autouse=True)
def _no_promotion_check():
    previous = nb.jit.set_promotion_check(False)
    yield
    nb.jit.set_promotion_check(previous)


def _run(fn, mode):
    return fn if mode == "eager" else nb.jit(fn, mode=mode)


def _t(a, requires_grad=False):
    return nb.tensor(np.array(a, dtype=np.float64), requires_grad=requires_grad)


def _np(t):
    return np.asarray(t.detach() if isinstance(t, nb.Tensor) else t)


def _jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


# ------------------------------------------------------------------ the table ops
@pytest.mark.parametrize("starts", [(1, 2), (4, -3), (-2, 9)])
def test_dynamic_slice_and_update_match_jax(starts):
    jax = _jax()
    x = _t(M0)
    got = nb.dynamic_slice(x, list(starts), (2, 3))
    want = jax.lax.dynamic_slice(M0, starts, (2, 3))
    np.testing.assert_array_equal(_np(got), np.asarray(want))
    u = np.arange(6.0).reshape(2, 3)
    got = nb.dynamic_update_slice(x, _t(u), nb.tensor(np.array(starts)))
    want = jax.lax.dynamic_update_slice(M0, u, starts)
    np.testing.assert_array_equal(_np(got), np.asarray(want))


def test_dynamic_ops_gradcheck_with_tensor_starts():
    x, u = _t(M0, True), _t(np.ones((2, 3)), True)
    i = nb.tensor(3)
    assert gradcheck(lambda x: nb.dynamic_slice(x, [i, 2], (2, 2)) ** 2, (x,))
    assert gradgradcheck(lambda x: nb.dynamic_slice(x, [i, 2], (2, 2)) ** 2, (x,))
    assert gradcheck(lambda x, u: nb.dynamic_update_slice(x, u * u, [i, i]) ** 2, (x, u))


def test_dynamic_op_errors():
    x = _t(M0)
    with pytest.raises(TypeError, match=r"dynamic_slice: sizes \(6, 1\) do not fit"):
        nb.dynamic_slice(x, [0, 0], (6, 1))
    with pytest.raises(TypeError, match="one integer per dimension"):
        nb.dynamic_slice(x, [0], (1, 1))
    with pytest.raises(TypeError, match="one integer per dimension"):
        nb.dynamic_slice(x, nb.tensor([0.0, 1.0]), (1, 1))
    with pytest.raises(TypeError, match=r"update of shape \(6, 1\) does not fit"):
        nb.dynamic_update_slice(x, nb.zeros(6, 1), [0, 0])


# ------------------------------------------------------------------ x[i] with a traced i
INDEXERS = {
    "row": lambda M, i: M[i],
    "row_colon": lambda M, i: M[i, :],
    "column": lambda M, i: M[:, i % 4],
    "element": lambda M, i: M[i, 3 - i % 4][None],
    "window": lambda M, i: M[i:i + 2].sum(0),
    "window_ds": lambda M, i: M[nb.ds(i, 3), 1:3].sum(0),
    "reversed": lambda M, i: M[4 - i],
    "negative": lambda M, i: M[-1 - i],
}


def _loop_sum(index):
    def f(M):
        def body(i, acc):
            r = index(M, i)
            return acc + (r * r).sum() + r.sum()
        return nb.fori_loop(0, 5, body, nb.tensor(0.0))
    return f


def _expected(index_np):
    return sum((index_np(M0, i) ** 2).sum() + index_np(M0, i).sum() for i in range(5))


NUMPY_INDEXERS = {
    "row": lambda M, i: M[i], "row_colon": lambda M, i: M[i, :],
    "column": lambda M, i: M[:, i % 4], "element": lambda M, i: M[i, 3 - i % 4][None],
    "window": lambda M, i: M[min(i, 3):min(i, 3) + 2].sum(0),
    "window_ds": lambda M, i: M[min(i, 2):min(i, 2) + 3, 1:3].sum(0),
    "reversed": lambda M, i: M[4 - i], "negative": lambda M, i: M[-1 - i],
}


@pytest.mark.parametrize("name", sorted(INDEXERS))
@pytest.mark.parametrize("mode", MODES)
def test_traced_index_in_fori_loop(name, mode):
    f = _run(_loop_sum(INDEXERS[name]), mode)
    M = _t(M0, True)
    out = f(M)
    if name not in ("window", "window_ds"):  # eagerly, i + 2 runs past the end (NumPy)
        np.testing.assert_allclose(_np(out), _expected(NUMPY_INDEXERS[name]), rtol=1e-12)
    assert gradcheck(f, (M,))


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_traced_index_gradient_matches_jax(mode):
    jax = _jax()
    jnp = jax.numpy

    def f_jax(M):
        def body(i, acc):
            r = M[i] * M[:, i % 4].sum() + jax.lax.dynamic_slice_in_dim(M, i, 2).sum()
            return acc + jnp.sin(r).sum()
        return jax.lax.fori_loop(0, 5, body, 0.0)

    def f(M):
        def body(i, acc):
            r = M[i] * M[:, i % 4].sum() + M[i:i + 2].sum()
            return acc + nb.sin(r).sum()
        return nb.fori_loop(0, 5, body, nb.tensor(0.0))

    g = nb.jit(nb.value_and_grad(f), mode=mode)
    val, grad = g(_t(M0, True))
    want_val, want_grad = jax.value_and_grad(f_jax)(M0)
    np.testing.assert_allclose(_np(val), float(want_val), rtol=1e-12)
    np.testing.assert_allclose(_np(grad), np.asarray(want_grad), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_traced_index_argument_clamps_like_jax(mode):
    jax = _jax()
    f = nb.jit(lambda M, i, j: M[i] + M[i, j] + M[:, j].sum(), mode=mode)
    fj = jax.jit(lambda M, i, j: M[i] + M[i, j] + M[:, j].sum())
    for i, j in [(0, 0), (4, 3), (-1, -2), (7, 9), (-9, -9)]:
        got = f(_t(M0), nb.tensor(i), nb.tensor(j))
        np.testing.assert_allclose(_np(got), np.asarray(fj(M0, i, j)), rtol=1e-12)


def test_traced_index_errors():
    M = _t(M0)
    with pytest.raises(IndexError, match="static length"):
        nb.jit(lambda M, i, j: M[i:j])(M, nb.tensor(1), nb.tensor(3))
    with pytest.raises(IndexError, match="static length"):
        nb.jit(lambda M, i: M[i:4])(M, nb.tensor(1))
    with pytest.raises(IndexError, match="cannot be combined with a traced index"):
        nb.jit(lambda M, i: M[i, [0, 1]])(M, nb.tensor(1))
    with pytest.raises(IndexError, match="step"):
        nb.jit(lambda M, i: M[::2, i])(M, nb.tensor(1))
    with pytest.raises(IndexError, match="0-d integer tensor"):
        nb.jit(lambda M, i: M[i])(M, nb.tensor([1, 2]))
    with pytest.raises(IndexError, match="longer than dim"):
        M[nb.ds(0, 6)]


def test_ds_eagerly_clamps():
    M = _t(M0)
    np.testing.assert_array_equal(_np(M[nb.ds(4, 2)]), M0[3:5])
    np.testing.assert_array_equal(_np(M[1, nb.ds(nb.tensor(1), 2)]), M0[1, 1:3])


# ------------------------------------------------------------------ x.at[idx]
def _at_cases(xp_at):
    """(name, fn(x, v)) over a JAX-like ``at`` accessor."""
    return {
        "set_row": lambda x, v: xp_at(x)[1].set(v),
        "add_repeats": lambda x, v: xp_at(x)[np.array([0, 2, 0]), 1].add(v[:3]),
        "mul_slice": lambda x, v: xp_at(x)[1:4, ::2].multiply(v[:2]),
        "min_col": lambda x, v: xp_at(x)[:, 2].min(v[0]),
        "max_elem": lambda x, v: xp_at(x)[3, 1].max(v[1]),
        "set_bool": lambda x, v: xp_at(x)[x[:, 0] > 0].set(0.5),
    }


@pytest.mark.parametrize("name", sorted(_at_cases(lambda x: x.at)))
def test_at_static_matches_jax(name):
    jax = _jax()
    got = _at_cases(lambda x: x.at)[name](_t(M0), _t(V0))
    want = _at_cases(lambda x: x.at)[name](jax.numpy.asarray(M0), jax.numpy.asarray(V0)) \
        if name != "set_bool" else np.where((M0[:, 0] > 0)[:, None], 0.5, M0)
    np.testing.assert_allclose(_np(got), np.asarray(want), rtol=1e-12)
    if name != "set_bool":
        assert gradcheck(lambda x, v: _at_cases(lambda x: x.at)[name](x, v) ** 2,
                         (_t(M0, True), _t(V0 + 0.1, True)))


def test_at_repeats_refused_for_multiply():
    with pytest.raises(RuntimeError, match="repeats positions"):
        _t(M0).at[np.array([1, 1])].multiply(2.0)
    with pytest.raises(RuntimeError, match=r"values of shape \(3,\) cannot be written"):
        _t(M0).at[1].set(nb.zeros(3))


def _at_loop(x, v):
    def body(i, acc):
        acc = acc.at[i].add(v * i.to(nb.float64))
        acc = acc.at[i, 4 - i % 4 - 1].multiply(acc[i, 0])
        acc = acc.at[nb.ds(i, 2), 1:3].max(v[1:3])
        return acc.at[i + 3].set(-1.0)  # out of range from i = 2 on: dropped
    return nb.fori_loop(0, 5, body, x)


@pytest.mark.parametrize("mode", MODES)
def test_at_traced_in_fori_loop(mode):
    f = _run(_at_loop, mode)
    x, v = _t(M0, True), _t(V0, True)
    want = _at_loop(x, v)
    np.testing.assert_allclose(_np(f(x, v)), _np(want), rtol=1e-12)
    assert gradcheck(lambda x, v: f(x, v) ** 2, (x, v))


def test_at_traced_matches_jax():
    jax = _jax()

    def f_jax(x, v):
        def body(i, acc):
            acc = acc.at[i].add(v * i)
            acc = acc.at[i, 4 - i % 4 - 1].multiply(acc[i, 0])
            win = jax.lax.dynamic_slice(acc, (i, 1), (2, 2))
            acc = jax.lax.dynamic_update_slice(acc, jax.numpy.maximum(win, v[1:3]), (i, 1))
            return acc.at[i + 3].set(-1.0)
        return jax.lax.fori_loop(0, 5, body, x)

    g = nb.jit(nb.value_and_grad(lambda x, v: (_at_loop(x, v) ** 2).sum(), argnums=(0, 1)))
    val, (gx, gv) = g(_t(M0, True), _t(V0, True))
    want_val, (wx, wv) = jax.value_and_grad(lambda x, v: (f_jax(x, v) ** 2).sum(),
                                            argnums=(0, 1))(M0, V0)
    np.testing.assert_allclose(_np(val), float(want_val), rtol=1e-12)
    np.testing.assert_allclose(_np(gx), np.asarray(wx), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(gv), np.asarray(wv), rtol=1e-10, atol=1e-12)


def test_at_with_a_tensor_index_drops_out_of_range_eagerly_too():
    x = _t(M0)
    np.testing.assert_array_equal(_np(x.at[nb.tensor(9)].set(0.0)), M0)
    np.testing.assert_array_equal(_np(x.at[nb.tensor(-1)].set(0.0))[4], np.zeros(4))


# ------------------------------------------------------------------ while_loop
def _collatz(n, x):
    def cond_fun(c):
        n, _, _ = c
        return n != 1

    def body_fun(c):
        n, steps, x = c
        odd = (n % 2) == 1
        return nb.where(odd, 3 * n + 1, n // 2), steps + 1, x * 0.5 + 1.0
    return nb.while_loop(cond_fun, body_fun, (n, nb.tensor(0), x))


@pytest.mark.parametrize("mode", MODES)
def test_while_loop(mode):
    f = _run(_collatz, mode)
    x = _t(V0)
    for n, steps in [(6, 8), (27, 111), (1, 0)]:
        n_out, s, xo = f(nb.tensor(n), x)
        assert int(n_out) == 1 and int(s) == steps
        want = V0.copy()
        for _ in range(steps):
            want = want * 0.5 + 1.0
        np.testing.assert_allclose(_np(xo), want, rtol=1e-12)


def test_while_loop_matches_jax_and_closes_over_values():
    jax = _jax()
    lim = _t([30.0])

    def f(x):
        return nb.while_loop(lambda c: c.sum() < lim.sum(), lambda c: c * 1.5 + x, x)

    def fj(x):
        return jax.lax.while_loop(lambda c: c.sum() < 30.0, lambda c: c * 1.5 + x, x)

    for mode in ["interpret", "compile"]:
        g = nb.jit(f, mode=mode)
        for scale in (1.0, 0.1, 3.0):
            x = np.abs(V0) * scale + 0.1
            np.testing.assert_allclose(_np(g(_t(x))), np.asarray(fj(x)), rtol=1e-12)


def test_while_loop_inside_fori_loop():
    def f(x):
        def body(i, c):
            return nb.while_loop(lambda v: v.sum() < 10.0 * (i + 1), lambda v: v + 1.0, c)
        return nb.fori_loop(0, 3, body, x)

    x = _t([0.5, 0.25])
    want = _np(f(x))
    for mode in ["interpret", "compile"]:
        np.testing.assert_allclose(_np(nb.jit(f, mode=mode)(x)), want)
    np.testing.assert_allclose(want, [15.5, 15.25])


@pytest.mark.parametrize("mode", MODES)
def test_while_loop_refuses_differentiation(mode):
    x = _t(V0, True)

    def loss(x):
        return nb.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 2.0 + 1.0, x).sum()

    with pytest.raises(RuntimeError, match="differentiation through nbgrad.while_loop"):
        _run(nb.grad(loss), mode)(x)
    with pytest.raises(RuntimeError, match="differentiation through nbgrad.while_loop"):
        _run(loss, mode)(x).backward()
    with nb.no_grad():  # forward only is fine
        assert np.isfinite(float(_run(loss, mode)(x)))


def test_while_loop_errors():
    with pytest.raises(TypeError, match="carry leaf 0 changes"):
        nb.while_loop(lambda c: c.sum() < 3, lambda c: c.to(nb.float32), _t([1.0]))
    with pytest.raises(TypeError, match="predicate must be a scalar bool"):
        nb.jit(lambda x: nb.while_loop(lambda c: c < 3, lambda c: c + 1, x))(_t([1.0, 2.0]))


# ------------------------------------------------------------------ cond
def _branchy(x, y):
    return nb.cond(x.sum() > 0, lambda a, b: (a * b, b.exp()), lambda a, b: (a - b, b * b),
                   x, y)


@pytest.mark.parametrize("mode", MODES)
def test_cond(mode):
    f = _run(_branchy, mode)
    for sign in (1.0, -1.0):
        x, y = _t(np.abs(V0) * sign, True), _t(V0[::-1].copy(), True)
        got = f(x, y)
        want = (x * y, y.exp()) if sign > 0 else (x - y, y * y)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(_np(g), _np(w), rtol=1e-12)
        assert gradcheck(lambda x, y: f(x, y)[0] + f(x, y)[1], (x, y))


def test_cond_gradient_matches_jax():
    jax = _jax()

    def fj(x):
        return jax.lax.cond(x.sum() > 0, lambda a: jax.numpy.sin(a) * a, lambda a: a ** 3,
                            x).sum()

    def f(x):
        return nb.cond(x.sum() > 0, lambda a: nb.sin(a) * a, lambda a: a ** 3, x).sum()

    g = nb.jit(nb.grad(f))
    for x in (V0, -np.abs(V0)):
        np.testing.assert_allclose(_np(g(_t(x, True))), np.asarray(jax.grad(fj)(x)),
                                   rtol=1e-12)


def test_cond_errors():
    x = _t(V0)
    with pytest.raises(TypeError, match="both branches must return the same shapes"):
        nb.jit(lambda x: nb.cond(x.sum() > 0, lambda a: a, lambda a: a[:2], x))(x)
    with pytest.raises(TypeError, match="same structure"):
        nb.jit(lambda x: nb.cond(x.sum() > 0, lambda a: (a, a), lambda a: a, x))(x)
    with pytest.raises(TypeError, match="predicate must be a scalar"):
        nb.cond(x > 0, lambda a: a, lambda a: a, x)
    assert nb.cond(True, lambda a: a + 1, lambda a: a - 1, 1) == 2


def test_tracer_error_points_to_control_flow():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(nb.TracerError) as info:
        nb.jit(f)(_t(V0))
    for name in ("nbgrad.cond", "nbgrad.while_loop", "nbgrad.fori_loop"):
        assert name in str(info.value)


# ------------------------------------------------------------------ the fuzzer's loop bodies
@pytest.mark.parametrize("body", ["index_read", "index_update"])
def test_fuzz_loop_bodies_indexing_with_the_counter(body):
    program = Program(nodes=(Leaf(shape=(2, 3), domain="unit"), Leaf(shape=(3,), domain="unit"),
                             Step(op="fori_loop", inputs=(0, 1), params=(3, body))), seed=5)
    found = check_program(program)
    assert not found, "\n\n".join(m.report() for m in found)


def test_at_eagerly_with_concrete_tensor_bounds():
    x, i, j = _t(M0), nb.tensor(1), nb.tensor(2)
    want = M0.copy()
    want[1, 2:4] = 7.0
    np.testing.assert_array_equal(_np(x.at[i, j:j + 2].set(7.0)), want)
    np.testing.assert_array_equal(_np(nb.fori_loop(0, 1, lambda k, c: c.at[k + 1, j:j + 2].set(
        7.0), x)), want)
