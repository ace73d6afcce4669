"""Trust in the jit tiers (issue 12): no silently wrong value or gradient.

- a fused region of tier 2 that reads one buffer through two different views (offsets,
  steps, reversed, transposed, broadcast, reshaped, integer indexed; in loops and out)
  reads every element it names (the load cache once ignored offsets: ``x[:, 0] * x[:, 1]``
  read column 0 twice from the second call on), and a loop whose new carry is a view of
  an old carry (``c.T``, carries exchanged through reshapes) reads the old values, in
  both tiers (tier 1 once computed a new carry in place over an old value that another
  new carry still had to read);
- 0-d carries, per-step outputs and closed-over values of ``fori_loop``/``scan`` compile
  in tier 2, forward and backward;
- a body that changes a carry's dtype raises the same TypeError eagerly and in both
  tiers (the loop index is an int64 tensor, so ``c * 0.5 + 0.05 * i`` is float64).
- a 0-d loop result (or a 0-d value inside a body) indexed (``[...]``, ``[None]``),
  reshaped or expanded compiles in tier 2 with a backward (generated code once mixed a
  0-d array and a scalar in one variable: a raw Numba TypingError);
- an input that requires grad but that no output with a gradient reaches gets no
  gradient (``.grad`` stays None, ``autograd.grad`` gives None or raises without
  ``allow_unused``), as eagerly and in PyTorch, loops counted step by step; the
  functional transforms give zeros for it, as eagerly (and in JAX).

Every compiled function is called three times: the first call of a signature runs the
trace (eagerly), only later calls run the tier under test.
"""

from __future__ import annotations

import nbgrad.cuda as nbcuda

nbcuda.use_simulator_if_no_gpu()  # before numba.cuda is imported (as in test_cuda_jit.py)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import nbgrad as nb  # noqa: E402
import nbgrad.jit as J  # noqa: E402
from nbgrad.jit import program  # noqa: E402
from nbgrad.nn import functional as F  # noqa: E402

RTOL, ATOL = 1e-12, 1e-12
CALLS = 3


@pytest.fixture(autouse=True)
def no_promotion_check():
    """Test tier 2 itself: a wrong result must fail here, not be replaced by tier 1's."""
    if not hasattr(J, "set_promotion_check"):
        yield
        return
    previous = J.set_promotion_check(False)
    yield
    J.set_promotion_check(previous)


def _close(got, want, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, \
        (what, got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def _same_as_eager(f, *args, modes=("interpret", "compile")) -> None:
    """Values and gradients of ``f`` under jit equal eager mode, on every call."""
    ev, eg = nb.value_and_grad(f)(*args)
    for mode in modes:
        jf = nb.jit(f, mode=mode)
        jvg = nb.jit(nb.value_and_grad(f), mode=mode)
        for call in range(CALLS):
            _close(jf(*args).numpy(), ev.numpy(), f"{mode} value, call {call}")
            v, g = jvg(*args)
            _close(v.numpy(), ev.numpy(), f"{mode} value_and_grad value, call {call}")
            _close(g.numpy(), eg.numpy(), f"{mode} gradient, call {call}")


# ------------------------------------------------------------------ two views of one buffer
def _rosenbrock(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def _in_fori_loop(x):  # a closed-over buffer read at two offsets in the body
    return nb.fori_loop(0, 3, lambda i, c: c * 0.5 + (x[1:] * x[:-1]).sum(), x[0])


def _carry_two_offsets(x):  # the carry itself read directly and reversed
    return nb.fori_loop(0, 3, lambda i, c: nb.sin(c * 0.9 + 0.2 * c[::-1]), x).sum()


def _scan_rows(x):  # each row (read in place from the stack) at two offsets
    return nb.scan(lambda c, r: (c + (r[1:] * r[:-1]).sum(), c), x[0, 0], x)[1].sum()


def _carry_transposed(x):  # the new carry is a view of the old one
    return (nb.fori_loop(0, 3, lambda i, c: c.T, x[:4]) * nb.arange(16.0).reshape(4, 4)).sum()


def _carries_exchanged(x, view):  # each new carry a view of the other old one
    a, b = nb.fori_loop(0, 3, lambda i, c: (view(c[1], (2, 3)), view(c[0], (3, 2))),
                        (x[:2, :3], x[2:5, :2]))
    return (a * nb.arange(6.0).reshape(2, 3)).sum() + (b * b).sum()


def _carries_old_and_new(x):  # one new carry is computed, the other is its old value
    a, b = nb.fori_loop(0, 3, lambda i, c: (c[1], nb.sin(c[0]) * 1.5), (x, nb.cos(x)))
    return (a * nb.arange(8.0)).sum() + (b * b).sum()


def _scan_carry_kept(x):  # the same in a scan, through a transposed view
    (a, b), ys = nb.scan(lambda c, r: ((c[0] * 0.9 + r[0], c[0].T), c[1][0] * r),
                         (x[:4], x[2:]), x[:4].reshape(4, 1, 4))
    return (a * nb.arange(16.0).reshape(4, 4)).sum() + (b * b).sum() + (ys * ys).sum()


VIEWS = {
    "columns": (lambda x: (x[:, 0] * x[:, 1]).sum(), "M"),
    "rows": (lambda x: (x[0] * x[1]).sum(), "M"),
    "shifted": (lambda x: (x[1:] * x[:-1]).sum(), "v"),
    "shifted columns": (lambda x: (x[:, 1:] * x[:, :-1]).sum(), "M"),
    "even odd": (lambda x: (x[::2] * x[1::2]).sum(), "v"),
    "reversed": (lambda x: (x * x[::-1]).sum(), "v"),
    "negative step": (lambda x: (x[::-2] * x[::2]).sum(), "v"),
    "stencil": (lambda x: ((x[:-2] - 2 * x[1:-1] + x[2:]) ** 2).sum(), "v"),
    "rosenbrock": (_rosenbrock, "v"),
    "transpose": (lambda x: (x[:4] * x[:4].T).sum(), "M"),
    "broadcast": (lambda x: (x[:, :1] * x + x[:1, :]).sum(), "M"),
    "expand": (lambda x: (x[:, 2:3].expand(6, 4) * x).sum(), "M"),
    "reshape": (lambda x: (x.reshape(24)[:12] * x.reshape(24)[12:]).sum(), "M"),
    "integer index": (lambda x: (x[:, 1] * x[:, 3] + x[2, 0] * x[4, 1]).sum(), "M"),
    "matmul intermediate": (lambda x: (lambda m: (m[0] * m[-1]).sum())(x @ x.T), "M"),
    "in fori_loop": (_in_fori_loop, "v"),
    "loop carry": (_carry_two_offsets, "v"),
    "scan rows": (_scan_rows, "M"),
    "carry transposed": (_carry_transposed, "M"),
    "carries exchanged by transposes": (lambda x: _carries_exchanged(x, lambda t, s: t.T), "M"),
    "carries old and new": (_carries_old_and_new, "v"),
    "scan carry kept": (_scan_carry_kept, "M"),
    "carries exchanged by reshapes": (lambda x: _carries_exchanged(x, lambda t, s: t.reshape(s)),
                                      "M"),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_two_views_of_one_buffer_match_eager(name):
    f, kind = VIEWS[name]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 4) if kind == "M" else (8,))
    _same_as_eager(f, nb.tensor(x))


def test_issue_repro_columns_of_arange():
    f = nb.jit(lambda x: (x[:, 0] * x[:, 1]).sum(), mode="compile")
    x = nb.tensor(np.arange(12.0).reshape(6, 2))
    assert [f(x).item() for _ in range(CALLS)] == [250.0] * CALLS


def test_generated_code_loads_each_element_it_reads():
    f = nb.jit(lambda x: (x[:, 0] * x[:, 1]).sum(), mode="compile")
    x = nb.tensor(np.arange(12.0).reshape(6, 2))
    f(x)
    src = f.source(x)
    assert "[i0_, 0]" in src and "[i0_, 1]" in src


@pytest.mark.parametrize("name", ["columns", "stencil", "matmul intermediate", "in fori_loop"])
def test_two_views_after_promotion_in_auto_mode(name, monkeypatch):
    monkeypatch.setattr(program, "PROMOTE_AFTER", 2)
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    f, kind = VIEWS[name]
    x = nb.tensor(np.random.default_rng(3).standard_normal((6, 4) if kind == "M" else (8,)))
    ev, eg = nb.value_and_grad(f)(x)
    jvg = nb.jit(nb.value_and_grad(f))
    for _ in range(4):
        jvg(x)
    assert program.wait_for_promotions(timeout=240)
    assert "@njit(cache=True" in jvg.source(x)  # tier 2 serves it now
    for _ in range(CALLS):
        v, g = jvg(x)
        _close(v.numpy(), ev.numpy(), "value")
        _close(g.numpy(), eg.numpy(), "gradient")


def test_rosenbrock_l_bfgs_b_converges_through_promoted_jit(monkeypatch):
    so = pytest.importorskip("scipy.optimize")
    monkeypatch.setattr(program, "PROMOTE_AFTER", 2)
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    vg = nb.jit(nb.value_and_grad(_rosenbrock))
    x0 = np.full(100, -1.0)
    x0[::2] = -1.2

    def fun(z):
        v, g = vg(nb.tensor(z))
        return float(v.item()), g.numpy()

    for _ in range(4):
        fun(x0)
    assert program.wait_for_promotions(timeout=240)
    assert "@njit(cache=True" in vg.source(nb.tensor(x0))
    res = so.minimize(fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": 5000})
    assert res.fun < 1e-6, (res.fun, res.message)


def test_rosenbrock_hessian_through_promoted_jit(monkeypatch):
    monkeypatch.setattr(program, "PROMOTE_AFTER", 2)
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    x = nb.tensor(np.random.default_rng(5).uniform(-1.5, 1.5, 100))
    want = nb.hessian(_rosenbrock)(x).numpy()
    h = nb.jit(nb.hessian(_rosenbrock))
    for _ in range(4):
        h(x)
    assert program.wait_for_promotions(timeout=240)
    assert "@njit(cache=True" in h.source(x)
    for _ in range(CALLS):
        got = h(x).numpy()
        assert np.abs(got - want).max() <= 1e-10 * np.abs(want).max()


# ------------------------------------------------------------------ 0-d loop values
def _fori_0d(x):
    return nb.fori_loop(0, 2, lambda i, c: nb.sin(c), x)


def _fori_0d_index(x):
    return nb.fori_loop(0, 3, lambda i, c: c * 0.5 + 0.05 * i + nb.cos(c), x)


def _fori_two_0d(x):  # two 0-d carries exchanging values
    a, b = nb.fori_loop(0, 3, lambda i, c: (c[1] * 1.5, nb.sin(c[0])), (x, x * 2.0))
    return a + b


def _fori_mixed(x):  # a 0-d carry beside an array carry
    s, v = nb.fori_loop(0, 3, lambda i, c: (c[0] + c[1].sum(), c[1] * nb.tanh(c[0])),
                        (x, nb.stack([x, x * 3.0])))
    return s * v.sum()


def _fori_0d_closure(x):  # a 0-d closed-over value
    s = nb.exp(x * 0.5)
    return nb.fori_loop(0, 3, lambda i, c: c * s + nb.sin(s), x)


def _scan_0d(v):  # 0-d carry, 0-d rows, 0-d per-step outputs
    return nb.scan(lambda c, a: (c * a, c), v[0], v)[1].sum()


def _scan_0d_final(v):
    c, ys = nb.scan(lambda c, a: (nb.sin(c) + a, c * a), v[1], v, reverse=True)
    return c * ys.sum()


def _scan_0d_closure(v):
    s = v.sum()
    return nb.scan(lambda c, a: (c + s * a, nb.cos(c * s)), v[0], v)[1].sum()


ZERO_D = {
    "fori 0-d carry": (_fori_0d, ()),
    "fori 0-d carry and index": (_fori_0d_index, ()),
    "fori two 0-d carries": (_fori_two_0d, ()),
    "fori 0-d and array carries": (_fori_mixed, ()),
    "fori 0-d closure": (_fori_0d_closure, ()),
    "scan 0-d": (_scan_0d, (3,)),
    "scan 0-d reversed": (_scan_0d_final, (4,)),
    "scan 0-d closure": (_scan_0d_closure, (3,)),
}


@pytest.mark.parametrize("name", list(ZERO_D))
def test_zero_d_loop_values_match_eager_in_both_tiers(name):
    f, shape = ZERO_D[name]
    x = np.random.default_rng(11).uniform(0.2, 0.9, shape)
    _same_as_eager(f, nb.tensor(x))


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("transform", ["grad", "value_and_grad"])
def test_issue_repro_zero_d_fori_loop_gradient(mode, transform):
    f = nb.jit(getattr(nb, transform)(_fori_0d), mode=mode)
    x = nb.tensor(0.7)
    want = np.cos(np.sin(0.7)) * np.cos(0.7)
    for _ in range(CALLS):
        out = f(x)
        g = out[1] if transform == "value_and_grad" else out
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-14)


# ------------------------------------------------------------------ carry dtypes
def _fori_index(x):
    return nb.fori_loop(0, 3, lambda i, c: c * 0.5 + 0.05 * i, x)


def _scan_index(x):
    return nb.scan(lambda c, a: (c * 0.5 + 0.05 * a, c), x, nb.arange(3))[0]


def _fori_index_cast(x):
    return nb.fori_loop(0, 3, lambda i, c: c * 0.5 + (0.05 * i).to(c.dtype), x)


def _scan_index_cast(x):
    return nb.scan(lambda c, a: (c * 0.5 + (0.05 * a).to(c.dtype), c), x, nb.arange(3))[0]


def _fori_shape(x):
    return nb.fori_loop(0, 3, lambda i, c: c.sum(), x)


def _scan_shape(x):
    return nb.scan(lambda c, a: (c[:1] * a, a), x, nb.ones(3))[0]


def _run(f, x, mode):
    if mode == "eager":
        return f(x)
    jf = nb.jit(f, mode=mode)
    out = None
    for _ in range(CALLS):
        out = jf(x)
    return out


MODES = ["eager", "interpret", "compile"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("f, fn", [(_fori_index, "fori_loop"), (_scan_index, "scan")])
def test_loop_index_in_a_carry_is_the_same_in_eager_and_both_tiers(mode, dtype, f, fn):
    x = nb.tensor(np.array([1.0, 2.0], dtype))
    if dtype == "float64":
        want = f(x).numpy()
        _close(_run(f, x, mode).numpy(), want, mode)
        return
    # the index is an int64 tensor: 0.05 * i is float64 and would promote the carry
    with pytest.raises(TypeError, match=rf"{fn}: carry leaf 0 changes from float32\[2\] "
                                        r"to float64\[2\]"):
        _run(f, x, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("f", [_fori_index_cast, _scan_index_cast])
def test_a_carry_cast_back_keeps_its_dtype_everywhere(mode, dtype, f):
    x = nb.tensor(np.array([1.0, 2.0], dtype))
    got = _run(f, x, mode)
    assert got.dtype == np.dtype(dtype)
    _close(got.numpy(), f(x).numpy(), mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("f, fn", [(_fori_shape, "fori_loop"), (_scan_shape, "scan")])
def test_a_carry_changing_shape_raises_everywhere(mode, f, fn):
    x = nb.tensor(np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match=rf"{fn}: carry leaf 0 changes from float64\[2\] to "
                                        r"float64\[(1)?\]"):
        _run(f, x, mode)


# ------------------------------------------------------------------ 0-d values indexed
def _fl(x):  # a 0-d loop result
    return nb.fori_loop(0, 2, lambda i, c: c * 0.5 + 0.1 * c * c, x.sum())


ZERO_D_INDEXED = {
    "fori [...]": lambda x: _fl(x)[...] * 2.0,
    "fori [None]": lambda x: _fl(x)[None].sum(),
    "fori [None, ..., None]": lambda x: (_fl(x)[None, ..., None] * x).sum(),
    "fori reshape": lambda x: (_fl(x).reshape(1, 1) * x).sum(),
    "fori expand": lambda x: (_fl(x).expand(2) * x).sum(),
    "fori unsqueeze": lambda x: (_fl(x).unsqueeze(0) * x).sum(),
    "scan carry [...]": lambda x: nb.scan(lambda c, r: (c * 0.5 + r, c), x.sum(), x)[0][...],
    "scan ys row [...]": lambda x: nb.scan(lambda c, r: (c * 0.5 + r, c * r), x.sum(),
                                           x)[1][1][...],
    "body c[...]": lambda x: nb.fori_loop(0, 3, lambda i, c: (c * 0.9)[...], x.sum()),
    "body c[None]": lambda x: nb.fori_loop(0, 3, lambda i, c: nb.sin(c[None]).sum(), x.sum()),
    "body two 0-d carries": lambda x: sum(nb.fori_loop(
        0, 3, lambda i, c: (c[1][...], nb.sin(c[0])[None][0]), (x.sum(), x.prod()))),
    "scan 0-d rows": lambda x: nb.scan(lambda c, r: (c + r[...] * c, r[None].sum()), x[0],
                                       x)[1].sum(),
    "nested loops": lambda x: nb.fori_loop(0, 2, lambda i, c: nb.fori_loop(
        0, 2, lambda j, d: (d * 0.7)[...], c)[None].sum(), x.sum()),
}


@pytest.mark.parametrize("name", list(ZERO_D_INDEXED))
def test_zero_d_values_indexed_match_eager_in_both_tiers(name):
    f = ZERO_D_INDEXED[name]
    x = np.array([0.5, 0.25])
    _same_as_eager(f, nb.tensor(x))  # one graph (forward and backward traced together)
    xt = nb.tensor(x, requires_grad=True)  # .backward(): separate forward and backward graphs
    f(xt).backward()
    want = xt.grad.numpy()
    for mode in ("interpret", "compile"):
        jf = nb.jit(f, mode=mode)
        for call in range(CALLS):
            xt.grad = None
            jf(xt).backward()
            _close(xt.grad.numpy(), want, f"{mode} .backward(), call {call}")


def test_issue_repro_fuzz_seed_82():
    f = lambda x: nb.fori_loop(0, 2, lambda i, c: c * 0.5 + 0.1 * c * c,  # noqa: E731
                               x.sum())[...] * 2.0
    x = nb.tensor(np.array([0.5, 0.25]), requires_grad=True)
    f(x).backward()
    want = x.grad.numpy()
    jf = nb.jit(f, mode="compile")
    for _ in range(CALLS):
        x.grad = None
        jf(x).backward()
        _close(x.grad.numpy(), want, "gradient")


# ------------------------------------------------------------------ unreached inputs
#: name -> (f(a, b), which of a, b eager autograd reaches)
UNREACHED = {
    "unused argument": (lambda a, b: (a * 2).sum(), (True, False)),
    "integer path": (lambda a, b: (a * (b > 0)).sum(), (True, False)),
    "scan ys read the old carry (fuzz seed 272)": (lambda a, b: nb.scan(
        lambda c, x: (c * nb.sigmoid(x) + x, nb.tanh(c)), b.sum(), a[:1])[1].sum(),
        (False, True)),
    "scan ys read the old carry, two steps": (lambda a, b: nb.scan(
        lambda c, x: (c * nb.sigmoid(x) + x, nb.tanh(c)), b.sum(), a)[1].sum(),
        (True, True)),
    "scan reversed": (lambda a, b: nb.scan(lambda c, x: (c * x, c * 2.0), b.sum(), a[:1],
                                           reverse=True)[1].sum(), (False, True)),
    "fori independent carries": (lambda a, b: nb.fori_loop(
        0, 3, lambda i, c: (c[0] * 2.0, c[1] * 3.0), (a, b))[0].sum(), (True, False)),
    "fori carries exchanged, odd steps": (lambda a, b: nb.fori_loop(
        0, 3, lambda i, c: (c[1] * 2.0, c[0] * 3.0), (a, b))[0].sum(), (False, True)),
    "fori carries exchanged, even steps": (lambda a, b: nb.fori_loop(
        0, 4, lambda i, c: (c[1] * 2.0, c[0] * 3.0), (a, b))[0].sum(), (True, False)),
    "fori carries in a three-cycle": (lambda a, b: nb.fori_loop(
        0, 5, lambda i, c: (c[1], c[2], c[0] * 1.5), (a, b, a * 2.0))[0].sum(), (True, False)),
    "fori closure in an unread carry": (lambda a, b: nb.fori_loop(
        0, 2, lambda i, c: (c[0] * 2.0, c[1] * b), (a, a))[0].sum(), (True, False)),
    "nested loops": (lambda a, b: nb.fori_loop(0, 2, lambda i, c: nb.fori_loop(
        0, 2, lambda j, d: (d[0] * 0.5, d[1] * b), c), (a, a))[0].sum(), (True, False)),
    "one of two outputs": (lambda a, b: (a * 2.0, nb.sin(b)), (True, False)),
}


def _leaves():
    return (nb.tensor(np.array([0.3, -0.4]), requires_grad=True),
            nb.tensor(np.array([0.6, 0.2]), requires_grad=True))


def _loss(out):
    return out[0].sum() if isinstance(out, tuple) else out


def _grads_as_eager(got, want, what):
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g is None) == (w is None), (what, k, g, w)
        if w is not None:
            _close(g.numpy(), w.numpy(), f"{what}, input {k}")


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("name", list(UNREACHED))
def test_unreached_input_gets_no_gradient_as_eager(name, mode):
    f, reached = UNREACHED[name]
    a, b = _leaves()
    _loss(f(a, b)).backward()
    want = [a.grad, b.grad]
    assert [w is not None for w in want] == list(reached)
    jf = nb.jit(f, mode=mode)
    for call in range(CALLS):
        a, b = _leaves()
        _loss(jf(a, b)).backward()
        _grads_as_eager([a.grad, b.grad], want, f"{mode} .grad, call {call}")
        a, b = _leaves()
        got = nb.autograd.grad(_loss(jf(a, b)), [a, b], allow_unused=True)
        _grads_as_eager(got, want, f"{mode} autograd.grad, call {call}")
        if not all(reached):  # without allow_unused: the same error as eagerly
            with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
                nb.autograd.grad(_loss(jf(a, b)), [a, b])


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_unreached_input_with_create_graph_gets_none(mode):
    f = lambda a, b: (a ** 3).sum()  # noqa: E731
    jf = nb.jit(f, mode=mode)
    for _ in range(CALLS):
        a, b = _leaves()
        ga, gb = nb.autograd.grad(jf(a, b), [a, b], create_graph=True, allow_unused=True)
        assert gb is None
        _close(ga.numpy(), 3 * a.numpy() ** 2, "gradient")


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("name", ["unused argument", "scan ys read the old carry (fuzz seed 272)",
                                  "fori independent carries"])
def test_functional_transforms_give_zeros_for_unreached_inputs_as_eager(name, mode):
    f, reached = UNREACHED[name]
    x, y = (t.detach() for t in _leaves())
    want = nb.grad(f, argnums=(0, 1))(x, y)
    assert not np.any(want[reached.index(False)].numpy())
    for transform in (lambda: nb.jit(nb.grad(f, argnums=(0, 1)), mode=mode),
                      lambda: nb.grad(nb.jit(f, mode=mode), argnums=(0, 1))):
        g = transform()
        for call in range(CALLS):
            got = g(x, y)
            for k in range(2):
                _close(got[k].numpy(), want[k].numpy(), f"{mode} nb.grad {k}, call {call}")


# ------------------------------------------------------------------ CUDA fused code
CUDA_VIEWS = ["columns", "rows", "shifted", "even odd", "reversed", "negative step",
              "stencil", "transpose", "broadcast"]


@pytest.mark.cuda
@pytest.mark.parametrize("name", CUDA_VIEWS)
def test_cuda_fused_two_views_of_one_buffer_match_eager(name):
    f, kind = VIEWS[name]
    x = np.random.default_rng(7).standard_normal((6, 4) if kind == "M" else (8,))
    xc = nb.tensor(x, device="cuda")
    ev, eg = nb.value_and_grad(f)(xc)
    jvg = nb.jit(nb.value_and_grad(f))
    for _ in range(CALLS):
        v, g = jvg(xc)
        _close(v.numpy(), ev.numpy(), "value")
        _close(g.numpy(), eg.numpy(), "gradient")


# ------------------------------------------------------------------ reductions sharing a region
# Tier 2 accumulates a reduction whose output dtype differs from its accumulator's
# (float32 sums accumulate in float64; means divide at the end) in a pooled buffer. It
# was released while the region was still being written, so a second such reduction in
# the same region accumulated into the same buffer (layer_norm's weight and bias
# gradients came out as their sum; fuzz seed 500780).
REGION_REDUCTIONS = {
    "layer_norm_weight_and_bias": lambda x, w, b, c: (
        F.layer_norm(x, (3,), w, b) * c).sum(),
    "two_sums_over_dim0": lambda x, w, b, c: (
        (x * w).sum(0) * b + (x * c).sum(0)).sum(),
    "two_means_over_dim0": lambda x, w, b, c: (
        (x * w).mean(0) * (x * c).mean(0) + b).sum(),
    "three_reductions": lambda x, w, b, c: (
        (x * w).sum(0) + (x * c).mean(0) * (x - c).sum(0) + b).sum(),
}


@pytest.mark.parametrize("name", sorted(REGION_REDUCTIONS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_reductions_in_one_region_keep_their_own_accumulators(name, dtype, mode):
    f = REGION_REDUCTIONS[name]
    rng = np.random.default_rng(7)
    arrays = [rng.uniform(0.5, 2.0, (5, 3)), rng.normal(size=3), rng.normal(size=3),
              rng.uniform(0.5, 1.5, (5, 3))]

    def run(fn):
        ts = [nb.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
        out = fn(*ts)
        out.backward()
        return [out.detach().numpy()] + [t.grad.numpy() for t in ts]

    want = run(f)
    jf = nb.jit(f, mode=mode)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for call in range(CALLS):
        for k, (g, w) in enumerate(zip(run(jf), want, strict=True)):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"{k}, call {call}")
