"""Forward mode (issue 16 item 2), checked for every table entry against reverse mode.

Generated from the op records: for every sample of every differentiable entry, ``jvp``
(tangents pushed forward by the table's forward derivatives) equals the double-vjp
construction built from the reverse-mode formulas, which ``test_ops_table`` checks against
finite differences; forward over reverse (``hvp``) equals the double-vjp of the gradient;
and ``nbgrad.jit`` of a ``jvp`` equals eager. Then the compositions (nesting, reverse over
forward, custom Functions, in-place ops, loops) and the path each op takes.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_ops_table import _cases, _seed

import nbgrad as nb
from nbgrad.autograd import forward
from nbgrad.functional import jvp_by_double_vjp
from nbgrad.ops.registry import REGISTRY
from nbgrad.testing import all_records, float_tensor_call

RECORDS = all_records()


def _float_outputs(call):
    def f(*ts):
        out = call(*ts)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(o for o in outs if isinstance(o, nb.Tensor) and o.dtype.kind == "f")
    return f


def _first_samples(predicate, count: int) -> list:
    """The first ``count`` samples of every record ``predicate`` accepts (the costlier
    checks run on these; ``jvp`` itself runs on every sample)."""
    cases = []
    for name in sorted(RECORDS):
        rec = RECORDS[name]
        if not predicate(rec):
            continue
        for i, sample in enumerate(rec.samples(np.random.default_rng(_seed(name)))[:count]):
            cases.append(pytest.param(rec, sample, id=f"{name}-{i}-{sample.note}"))
    return cases


def _setup(rec, sample):
    call, tensors = float_tensor_call(rec, sample)
    if not tensors:
        pytest.skip("no floating tensor argument")
    rng = np.random.default_rng(_seed(rec.name) + 1)
    tangents = [nb.tensor(rng.standard_normal(t.shape)) for t in tensors]
    return _float_outputs(call), tensors, tangents


def _close(got, want, rtol=1e-8, atol=1e-10):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize(("rec", "sample"), _cases(lambda r: r.grad))
def test_jvp_matches_reverse_mode(rec, sample):
    f, tensors, tangents = _setup(rec, sample)
    value, tangent = nb.jvp(f, tensors, tangents)
    want_value, want_tangent = jvp_by_double_vjp(f, tensors, tangents)
    _close(value, want_value, 0, 0)
    _close(tangent, want_tangent)


@pytest.mark.parametrize(("rec", "sample"), _first_samples(lambda r: r.grad and r.second_order,
                                                       2))
def test_forward_over_reverse_matches(rec, sample):
    f, tensors, tangents = _setup(rec, sample)

    def loss(*ts):
        outs = f(*ts)
        total = outs[0].sum()
        for o in outs[1:]:
            total = total + o.sum()
        return total

    argnums = tuple(range(len(tensors)))
    _, got = nb.hvp(loss, tuple(tensors), tuple(tangents))
    _, want = jvp_by_double_vjp(nb.grad(loss, argnums), tensors, tangents)
    _close(tuple(got), tuple(want), 1e-7, 1e-9)


@pytest.mark.parametrize(("rec", "sample"), _first_samples(lambda r: r.grad and r.jit, 1))
def test_jit_of_jvp_matches_eager(rec, sample):
    f, tensors, tangents = _setup(rec, sample)
    n = len(tensors)

    def both(*ts):
        return nb.jvp(f, ts[:n], ts[n:])

    want = both(*tensors, *tangents)
    jitted = nb.jit(both, mode="interpret")
    for _ in range(2):
        got = jitted(*tensors, *tangents)
        _close(got[0], want[0], 1e-12, 1e-14)
        _close(got[1], want[1], 1e-12, 1e-13)


# ------------------------------------------------------------------ compositions
def _x(shape=(3, 4), seed=0):
    return nb.tensor(np.random.default_rng(seed).standard_normal(shape))


def _mixed(x):
    W = nb.tensor(np.linspace(-1, 1, 20).reshape(4, 5))
    A = x[:, :3] @ x[:, :3].mT + nb.eye(3)
    return ((nb.sin(x) ** 3).sum() + nb.logsumexp(x @ W, 1).prod()
            + nb.linalg.inv(A).sum() + nb.softmax(x, 1)[:, 1].sum())


def test_hessians_by_every_composition_agree():
    x = _x()
    want = nb.hessian(_mixed)(x).numpy()
    for how in (nb.jacfwd(nb.jacfwd(_mixed)), nb.jacfwd(nb.grad(_mixed)),
                nb.jacobian(nb.jacfwd(_mixed)), nb.jacrev(nb.jacrev(_mixed))):
        np.testing.assert_allclose(how(x).numpy(), want, rtol=1e-10, atol=1e-12)


def test_hvp_is_forward_over_reverse_and_matches_the_hessian():
    x, t = _x(), _x(seed=1)
    value, product = nb.hvp(_mixed, x, t)
    H = nb.hessian(_mixed)(x).numpy().reshape(12, 12)
    np.testing.assert_allclose(product.numpy().ravel(), H @ t.numpy().ravel(), rtol=1e-10,
                               atol=1e-12)
    assert float(value) == pytest.approx(float(_mixed(x)))


def test_nested_jvp_gives_second_directional_derivatives():
    x, t1, t2 = nb.tensor([0.3, 0.7]), nb.tensor([1.0, 2.0]), nb.tensor([0.5, -1.0])
    for fn, second in ((nb.sin, lambda v: -np.sin(v)), (nb.exp, np.exp), (nb.tanh, None)):
        got = nb.jvp(lambda x, fn=fn: nb.jvp(fn, (x,), (t1,))[1], (x,), (t2,))[1]
        if second is None:  # tanh'' = -2 tanh (1 - tanh^2)
            th = np.tanh(x.numpy())
            want = -2 * th * (1 - th ** 2)
        else:
            want = second(x.numpy())
        np.testing.assert_allclose(got.numpy(), want * t1.numpy() * t2.numpy(), rtol=1e-12)


def test_reverse_over_forward():
    x, t = _x(), _x(seed=1)

    def directional(x):
        return nb.jvp(_mixed, (x,), (t,))[1]

    got = nb.grad(directional)(x).numpy().ravel()
    H = nb.hessian(_mixed)(x).numpy().reshape(12, 12)
    np.testing.assert_allclose(got, H @ t.numpy().ravel(), rtol=1e-10, atol=1e-12)


def test_jacfwd_shapes_structure_and_aux():
    def f(a, b):
        return {"s": (a * b).sum(), "v": nb.sin(a) * b[0]}, a.sum()

    a, b = _x((2, 3)), _x((3,), 1)
    jf, aux = nb.jacfwd(f, argnums=(0, 1), has_aux=True)(a, b)
    jr, _ = nb.jacobian(f, argnums=(0, 1), has_aux=True)(a, b)
    for key in ("s", "v"):
        for k in range(2):
            assert jf[key][k].shape == jr[key][k].shape
            np.testing.assert_allclose(jf[key][k].numpy(), jr[key][k].numpy(), rtol=1e-12)
    assert float(aux) == pytest.approx(float(a.sum()))


def test_custom_function_with_and_without_jvp():
    class Cube(nb.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x * x * g

    class CubeJvp(Cube):
        @staticmethod
        def jvp(ctx, t):
            return 3 * ctx.saved_tensors[0] ** 2 * t

    x, t = _x(), _x(seed=1)
    want = 3 * x.numpy() ** 2 * t.numpy()
    for cls in (Cube, CubeJvp):
        _, got = nb.jvp(cls.apply, (x,), (t,))
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_in_place_ops_carry_tangents():
    x, t = _x(), _x(seed=1)

    def f(x):
        y = x * 2
        y.mul_(x)          # y = 2 x^2
        y[0] = nb.sin(x[0])
        y.add_(1.0)
        return y

    _, got = nb.jvp(f, (x,), (t,))
    want = 4 * x.numpy() * t.numpy()
    want[0] = np.cos(x.numpy()[0]) * t.numpy()[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_fill_in_place_drops_the_tangent():
    x, t = _x(), _x(seed=1)

    def f(x):
        y = x * 1.0
        y.zero_()
        return y + x

    np.testing.assert_allclose(nb.jvp(f, (x,), (t,))[1].numpy(), t.numpy())


def test_detach_stops_tangents_as_in_jax():
    x, t = _x(), _x(seed=1)
    _, got = nb.jvp(lambda x: x.detach() * x, (x,), (t,))
    np.testing.assert_allclose(got.numpy(), x.numpy() * t.numpy())


def test_fori_loop_eager_and_clear_error_under_jit():
    x, t = _x(), _x(seed=1)

    def f(x):
        return nb.fori_loop(0, 3, lambda i, c: nb.sin(c) * x, x)

    _, got = nb.jvp(f, (x,), (t,))
    _, want = jvp_by_double_vjp(f, (x,), (t,))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    jitted = nb.jit(lambda x, t: nb.jvp(f, (x,), (t,)), mode="interpret")
    with pytest.raises(NotImplementedError, match="fori_loop/scan inside nbgrad.jit"):
        jitted(x, t)


def test_jit_of_jvp_in_both_tiers():
    x, t = _x(), _x(seed=1)
    want = nb.jvp(_mixed, (x,), (t,))
    for mode in ("interpret", "compile"):
        jitted = nb.jit(lambda x, t: nb.jvp(_mixed, (x,), (t,)), mode=mode)
        for _ in range(2):
            got = jitted(x, t)
            np.testing.assert_allclose(got[1].numpy(), want[1].numpy(), rtol=1e-12)


def test_errors_name_the_transform():
    x = _x()
    with pytest.raises(ValueError, match="jvp: tangents have structure"):
        nb.jvp(nb.sin, (x,), ((x, x),))
    with pytest.raises(TypeError, match="jvp: primals must be a tuple"):
        nb.jvp(nb.sin, x, (x,))


def test_no_level_leaks_after_a_transform():
    x, t = _x(), _x(seed=1)
    nb.jvp(nb.sin, (x,), (t,))
    assert not forward.active()
    from nbgrad.ops import dispatch
    assert dispatch._forward is None


def test_which_rule_each_op_takes():
    """Every differentiable entry has a forward path; the table's formulas and the kind
    rules cover the common ops (the transpose of backward is the fallback)."""
    by_rule = {"formula": [], "kind": [], "transpose": []}
    for name, op in REGISTRY.items():
        if op.entry is None or not op.differentiable:
            continue
        by_rule[forward.rule_of(op)].append(name)
    for name in ("add", "mul", "exp", "sin", "sum", "reshape", "permute", "cat", "matmul",
                 "linear", "where", "expand"):
        assert name in by_rule["kind"] + by_rule["formula"], name


def test_jvp_of_a_jitted_function_and_of_vmap_closures():
    """Compiled graphs and vmap replays carry tangents: a jitted function called inside
    jvp runs its ops eagerly; a tensor with a tangent closed over by vmap stays itself;
    vmap of jvp of vmap (what jacfwd of jacfwd runs) keeps every level's tangents."""
    x, t, w = nb.tensor([0.3, 0.7]), nb.tensor([1.0, 2.0]), nb.tensor([2.0, 3.0])
    f = nb.jit(lambda x: nb.sin(x) * x, mode="interpret")
    xs, ts = x.numpy(), t.numpy()
    np.testing.assert_allclose(nb.jvp(f, (x,), (t,))[1].numpy(),
                               (np.cos(xs) * xs + np.sin(xs)) * ts, rtol=1e-14)
    X = nb.tensor(np.arange(6.0).reshape(3, 2))
    _, got = nb.jvp(lambda w: nb.vmap(lambda r: (nb.sin(w) * r).sum())(X), (w,), (t,))
    np.testing.assert_allclose(got.numpy(), X.numpy() @ (np.cos(w.numpy()) * ts), rtol=1e-14)
    E, D = nb.eye(3) * 2.0, nb.eye(3)
    x3 = nb.tensor([0.3, 0.7, 1.1])

    def inner(x):
        return nb.vmap(lambda e: (nb.sin(x) * e).sum())(E)

    got = nb.vmap(lambda d: nb.jvp(inner, (x3,), (d,))[1])(D).numpy()
    np.testing.assert_allclose(got, np.diag(2 * np.cos(x3.numpy())), rtol=1e-14, atol=1e-15)
    _, got = nb.jvp(lambda x: nb.vmap(lambda e: (x.detach() * e).sum())(E), (x3,), (x3,))
    np.testing.assert_array_equal(got.numpy(), np.zeros(3))  # detach stops tangents


# ------------------------------------------------------------------ symbolic zeros
ZERO_DERIVATIVE = sorted(name for name, op in REGISTRY.items()
                         if op.entry is not None and op.entry.zero_derivative)


def test_the_zero_derivative_ops_are_the_rounding_ones():
    assert {"floor", "ceil", "round", "trunc", "sign"} <= set(ZERO_DERIVATIVE)
    assert "hypot" not in ZERO_DERIVATIVE and "abs" not in ZERO_DERIVATIVE


@pytest.mark.parametrize("name", ZERO_DERIVATIVE)
@pytest.mark.parametrize("jit", [False, True])
def test_a_zero_derivative_gives_no_tangent_to_turn_into_nan(name, jit):
    """Fuzz seed 32150: ``hypot(floor(x), floor(x))`` at ``floor(x) == 0`` (hypot's own
    0/0 is gone, see below; ``sqrt`` keeps the singular point). Forward mode had pushed
    floor's zero tangent into ``t / (2 sqrt(0))``, 0/0, and gave NaN where reverse mode
    (floor's backward zeros the infinity) and JAX (a symbolic zero) give 0."""
    op = getattr(nb, name)
    x = nb.tensor(np.array([0.25, 0.4, 0.1]))  # rounded: 0 (sign and ceil: 1)
    shift = 1.0 if name in ("sign", "ceil") else 0.0

    def f(t):
        r = op(t) - shift
        return nb.sqrt(r * r).sum()

    jvp = nb.jit(lambda t, v: nb.jvp(f, [t], [v])) if jit else \
        (lambda t, v: nb.jvp(f, [t], [v]))
    value, tangent = jvp(x, nb.tensor(np.ones(3)))
    assert value.item() == 0.0 and tangent.item() == 0.0
    np.testing.assert_array_equal(nb.grad(f)(x).numpy(), 0.0)
    # the op's own output still gets its (zero) tangent where jvp returns it
    _, t_out = nb.jvp(lambda t: op(t) * 2.0, [x], [nb.tensor(np.ones(3))])
    np.testing.assert_array_equal(t_out.numpy(), np.zeros(3))


@pytest.mark.parametrize("mode", ["eager", "interpret", "compile"])
def test_hypot_at_the_apex_has_gradient_zero_in_both_modes(mode):
    """Fuzz seed 38890: ``hypot(m, m)`` with ``m = masked_fill(x, mask, 0)``. hypot's
    ``grad * self / result`` is 0/0 at (0, 0): reverse mode's masked_fill zeroed the NaN,
    forward mode's materialised zero tangents met it. The gradient is now 0 where hypot
    is 0, as ``norm``'s (and what central differences give at the cone's apex)."""
    x = nb.tensor(np.array([0.0, 3.0, -0.0]))
    y = nb.tensor(np.array([0.0, 4.0, 0.0]))

    def f(a, b):
        return nb.hypot(a, b).sum()

    grad = nb.grad(f, argnums=(0, 1))
    jvp = lambda a, b: nb.jvp(f, [a, b], [nb.tensor(np.ones(3)), nb.tensor(np.ones(3))])[1]  # noqa: E731
    if mode != "eager":
        grad, jvp = nb.jit(grad, mode=mode), nb.jit(jvp, mode=mode)
    ga, gb = grad(x, y)
    np.testing.assert_array_equal(ga.numpy(), [0.0, 0.6, 0.0])
    np.testing.assert_array_equal(gb.numpy(), [0.0, 0.8, 0.0])
    assert jvp(x, y).item() == pytest.approx(1.4)
    eps = 1e-7
    fd = (f(x + eps, y).item() - f(x - eps, y).item()) / (2 * eps)
    assert fd == pytest.approx(0.6, abs=1e-6)  # the apex's central difference is 0

    m = nb.masked_fill(nb.tensor(np.array([[0.57]])), nb.tensor(np.array([[True]])), 0.0)
    _, t = nb.jvp(lambda v: nb.hypot(nb.masked_fill(v, nb.tensor(np.array([[True]])), 0.0),
                                     m).sum(), [nb.tensor(np.array([[0.57]]))],
                  [nb.tensor(np.ones((1, 1)))])
    assert t.item() == 0.0
