"""Property tests: random small graphs of table ops on broadcast shapes.

For each drawn program, ``nbgrad.jit`` must give the eager values (float64, 1e-12) on
each of three calls (the first traces; later ones run the compiled graph), in tier 1 and
in tier 2 (promotion check off: tests/conftest.py turns it off for the suite);
``jit(value_and_grad)`` must give the eager gradients, and the gradients of the jitted
function (through its autograd node) must pass a finite-difference check. The wider
differential fuzzer is tests/test_fuzz.py.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nbgrad as nb
from nbgrad.autograd import gradcheck

SHAPES = [(), (3,), (2, 1), (2, 3), (1, 3)]

UNARY = {
    "sin": nb.sin, "cos": nb.cos, "tanh": nb.tanh, "sigmoid": nb.sigmoid,
    "square": nb.square, "neg": nb.neg, "softplus": nb.softplus,
    "exp_tanh": lambda x: nb.exp(nb.tanh(x)),
    "log1p_sq": lambda x: nb.log1p(x * x),
}
BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (1.5 + b * b), "hypot": lambda a, b: nb.hypot(a, b + 2.0),
    "where": lambda a, b: nb.where(a > b, a * b, a - b),
    "lerp": lambda a, b: nb.lerp(a, b, nb.sigmoid(a)),
}


@st.composite
def programs(draw):
    n_in = draw(st.integers(1, 3))
    shapes = [draw(st.sampled_from(SHAPES)) for _ in range(n_in)]
    steps = []
    n_vals = n_in
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "scalar"]))
        a = draw(st.integers(0, n_vals - 1))
        if kind == "unary":
            steps.append(("unary", draw(st.sampled_from(sorted(UNARY))), a))
        elif kind == "binary":
            steps.append(("binary", draw(st.sampled_from(sorted(BINARY))), a,
                          draw(st.integers(0, n_vals - 1))))
        elif kind == "reduce":
            steps.append(("reduce", draw(st.sampled_from(["sum", "mean"])), a,
                          draw(st.integers(-2, 1)), draw(st.booleans())))
        else:
            steps.append(("scalar", draw(st.floats(-2, 2, allow_nan=False, width=32)), a))
        n_vals += 1
    seed = draw(st.integers(0, 2**16))
    return shapes, steps, seed


def _run(steps, inputs):
    vals = list(inputs)
    for step in steps:
        x = vals[step[2]]
        if step[0] == "unary":
            y = UNARY[step[1]](x)
        elif step[0] == "binary":
            b = vals[step[3]]
            try:
                np.broadcast_shapes(x.shape, b.shape)
            except ValueError:
                b = b.sum()
            y = BINARY[step[1]](x, b)
        elif step[0] == "reduce":
            dim = step[3]
            if x.ndim == 0 or not -x.ndim <= dim < x.ndim:
                dim = None
            y = x.sum(dim=dim, keepdim=step[4]) if step[1] == "sum" else \
                x.mean(dim=dim, keepdim=step[4])
        else:
            y = x * float(step[1]) + 0.5
        vals.append(y)
    return vals[len(inputs):]


def _loss(steps):
    def f(*inputs):
        total = None
        for v in _run(steps, inputs):
            s = (v * v).sum() if total is None else total + (v * v).sum()
            total = s
        return total
    return f


SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
CALLS = 3


@SETTINGS
@given(programs())
def test_jit_values_equal_eager(prog):
    _values_equal_eager(prog, "interpret")


@settings(SETTINGS, max_examples=12)
@given(programs())
def test_jit_compile_mode_values_equal_eager(prog):
    _values_equal_eager(prog, "compile")


def _values_equal_eager(prog, mode):
    shapes, steps, seed = prog
    rng = np.random.default_rng(seed)
    inputs = [nb.tensor(rng.uniform(-1, 1, s)) for s in shapes]

    def f(*xs):
        return tuple(_run(steps, xs))

    want = f(*inputs)
    jf = nb.jit(f, mode=mode)
    for _ in range(CALLS):
        got = jf(*inputs)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-14)


@SETTINGS
@given(programs())
def test_jit_gradients_equal_eager_and_finite_differences(prog):
    shapes, steps, seed = prog
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-1, 1, s) for s in shapes]
    loss = _loss(steps)
    argnums = tuple(range(len(arrays)))
    want_v, want_g = nb.value_and_grad(loss, argnums=argnums)(*[nb.tensor(a) for a in arrays])
    vg = nb.jit(nb.value_and_grad(loss, argnums=argnums), mode="interpret")
    for _ in range(CALLS):
        v, gs = vg(*[nb.tensor(a) for a in arrays])
        np.testing.assert_allclose(v.numpy(), want_v.numpy(), rtol=1e-12, atol=1e-14)
        for g, e in zip(gs, want_g, strict=True):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12, atol=1e-13)
    jl = nb.jit(loss, mode="interpret")
    ts = tuple(nb.tensor(a, requires_grad=True) for a in arrays)
    assert gradcheck(jl, ts, eps=1e-6, atol=1e-5, rtol=1e-4)


# Unrolled Python loops whose iterations differ only in an attribute value: re-rolling
# (nbgrad/jit/trace/reroll.py) may merge iterations only when no op can tell their values
# apart. ``-0.0 == 0.0`` in Python (and for np.float64), but not to ``atan2``: iterations
# alternating ``clamp(x, min=0.0)`` and ``min=-0.0`` were rolled into one, every step
# then clamping to +0.0 (16 pi where eager gives 0).
TWINS = [0.0, -0.0, np.float64(0.0), np.float64(-0.0), np.float32(-0.0), 0.5]
ATTR_OPS = {
    "clamp_min": lambda x, c: nb.clamp(x, min=c),
    "clamp_max": lambda x, c: nb.clamp(-x, max=c),
    "leaky_relu": lambda x, c: nb.nn.functional.leaky_relu(x, c),
}


@settings(SETTINGS, max_examples=25)
@given(st.sampled_from(sorted(ATTR_OPS)),
       st.lists(st.sampled_from(range(len(TWINS))), min_size=2, max_size=3))
def test_rerolled_iterations_keep_their_attribute_values(name, pattern):
    op = ATTR_OPS[name]
    values = [TWINS[k] for k in pattern]

    def f(x):
        acc = x * 0.0
        for i in range(12):  # the pattern repeats: re-rolling must keep it
            acc = acc + nb.atan2(op(x, values[i % len(values)]), -1.0 + x * 0.0)
        return acc

    x = nb.tensor(-np.ones(3))
    jf = nb.jit(f, mode="interpret")
    want = f(x).numpy()
    for _ in range(2):
        assert jf(x).numpy().tobytes() == want.tobytes(), (name, values)


# Python scalars passed to a jitted function are baked into its trace, which is cached
# by the arguments: values that compare equal but differ to an op must not share one.
# ``-0.0`` reused the trace of ``0.0`` (the cache key compared them with ``==``).
SCALAR_TWINS = [0.0, -0.0, np.float64(0.0), np.float64(-0.0), np.float32(-0.0),
                float("nan"), 1, 1.0, True, np.int64(1), np.float32(1.0)]


@settings(SETTINGS, max_examples=20)
@given(st.lists(st.sampled_from(range(len(SCALAR_TWINS))), min_size=2, max_size=6))
def test_jit_traces_scalar_arguments_apart_when_an_op_tells_them_apart(order):
    def f(x, c):
        return nb.atan2(nb.clamp(x, min=c), -1.0 + x * 0.0) + x * c

    x = nb.tensor(-np.ones(3))
    jf = nb.jit(f)
    for k in order:
        c = SCALAR_TWINS[k]
        want = f(x, c).numpy()
        got = jf(x, c).numpy()
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), repr(c)
