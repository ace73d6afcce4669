"""Every way eager mode cuts the autograd graph cuts it inside ``nbgrad.jit`` too.

``detach()``, ``.data``, ``detach_()``, ``requires_grad_(False)``, ``no_grad()`` and
``set_grad_enabled(False)`` (blocks, decorators, calls), ``enable_grad()`` inside them,
results of ``autograd.grad`` without ``create_graph``, custom Functions' non-differentiable
outputs, the functional transforms and ``fori_loop``/``scan`` bodies: the values, the
gradients (``None`` included) and ``autograd.grad``'s ``allow_unused`` behaviour of a
jitted function equal eager mode's, in every jit mode, over three calls (the trace, then
the compiled graph).
"""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.jit as J

MODES = ("interpret", "compile")
CALLS = 3


@pytest.fixture(autouse=True)
def no_promotion_check():
    """Test the generated code itself: no tier-1 safety net."""
    previous = J.set_promotion_check(False)
    yield
    J.set_promotion_check(previous)


# ------------------------------------------------------------------ the class
@nb.no_grad()
def _double_no_grad(x):
    return x * 2.0


@nb.set_grad_enabled(False)
def _double_set_grad(x):
    return x * 2.0


class _SplitNonDiff(nb.autograd.Function):
    """(2x, x**2) with the second output marked non-differentiable."""

    @staticmethod
    def forward(ctx, x):
        y, z = x * 2.0, x * x
        ctx.mark_non_differentiable(z)
        return y, z

    @staticmethod
    def backward(ctx, gy, gz):
        return gy * 2.0


class _SplitNonDiffPython(_SplitNonDiff):
    jit_path = "python"


def f_detach(a, b):
    return (a * b.detach()).sum()


def f_data(a, b):
    return (a * b.data + b).sum()


def f_detach_both_paths(a, b):
    return (a * b.detach() * b).sum()


def f_no_grad(a, b):
    with nb.no_grad():
        c = b * 2.0
    return (a * c).sum()


def f_no_grad_chain(a, b):
    with nb.no_grad():
        c = (a * b).exp()
        d = c * b
    return (a * d + b).sum()


def f_set_grad_block(a, b):
    with nb.set_grad_enabled(False):
        c = b * a
    return (a * c).sum()


def f_set_grad_call(a, b):
    nb.set_grad_enabled(False)
    try:
        c = b * a
    finally:
        nb.set_grad_enabled(True)
    return (a * c + b).sum()


def f_no_grad_decorator(a, b):
    return (a * _double_no_grad(b)).sum()


def f_set_grad_decorator(a, b):
    return (a * _double_set_grad(a * b)).sum()


def f_enable_inside_no_grad(a, b):
    with nb.no_grad():
        c = b * 2.0
        with nb.enable_grad():
            d = a * b * c
    return (c * d).sum()


def f_detach_inplace_flag(a, b):
    y = b * 3.0
    y.detach_()
    return (a * y).sum()


def f_requires_grad_false(a, b):
    b.requires_grad_(False)
    return (a * b).sum()


def f_grad_no_create_graph(a, b):
    g, = nb.autograd.grad((b * b * b * a).sum(), b)
    return (a * g).sum()


def f_new_leaf(a, b):
    x = b.detach().requires_grad_(True)
    g, = nb.autograd.grad((x * x * x).sum(), x, create_graph=True)
    return (a * g).sum()


def f_custom_native(a, b):
    y, z = _SplitNonDiff.apply(b)
    return (a * y + a * z).sum()


def f_custom_python(a, b):
    y, z = _SplitNonDiffPython.apply(b)
    return (a * y + a * z).sum()


def f_grad_transform(a, b):
    gb = nb.grad(lambda x: (x * x * a.detach()).sum())(b)
    return (a * gb).sum()


def f_value_and_grad_transform(a, b):
    v, gb = nb.value_and_grad(lambda x: (x.detach() * x * a).sum())(b)
    return v + (gb * a).sum()


def f_fori_detach(a, b):
    return nb.fori_loop(0, 3, lambda i, c: c * b.detach() + a * c, a).sum()


def f_fori_no_grad(a, b):
    def body(i, c):
        with nb.no_grad():
            s = c * b
        return c * a + s
    return nb.fori_loop(0, 3, body, b).sum()


def f_fori_detached_init(a, b):
    return nb.fori_loop(0, 3, lambda i, c: c * a, b.detach()).sum()


def f_fori_detach_carry(a, b):
    return nb.fori_loop(0, 3, lambda i, c: c.detach() * a + c * b, a).sum()


def f_scan_detach(a, b):
    xs = nb.stack([a, b, a * b])

    def step(c, x):
        return c * x.detach() + x, c * a
    c, ys = nb.scan(step, b, xs)
    return c.sum() + ys.sum()


def f_loop_in_no_grad(a, b):
    with nb.no_grad():
        c = nb.fori_loop(0, 2, lambda i, c: c * b, a)
    return (a * c).sum()


def f_python_loop(a, b):
    """An unrolled Python loop, which the jit re-rolls into a loop node."""
    c = a
    for _ in range(8):
        with nb.no_grad():
            s = c * 0.5
        c = c * b.detach() + c * a + s
    return c.sum()


def f_nested_loops(a, b):
    def outer(i, c):
        inner = nb.fori_loop(0, 2, lambda j, d: d * c.detach() + d * a, c)
        return inner * b + c.detach()
    return nb.fori_loop(0, 2, outer, a * b).sum()


CLASS = {f.__name__[2:]: f for f in (
    f_detach, f_data, f_detach_both_paths, f_no_grad, f_no_grad_chain, f_set_grad_block,
    f_set_grad_call, f_no_grad_decorator, f_set_grad_decorator, f_enable_inside_no_grad,
    f_detach_inplace_flag, f_requires_grad_false, f_grad_no_create_graph, f_new_leaf,
    f_custom_native, f_custom_python, f_grad_transform, f_value_and_grad_transform,
    f_fori_detach, f_fori_no_grad, f_fori_detached_init, f_fori_detach_carry,
    f_scan_detach, f_loop_in_no_grad, f_nested_loops, f_python_loop)}

A0 = np.array([0.3, -0.4, 0.7])
B0 = np.array([0.6, 0.2, -0.5])


def _fresh():
    return (nb.tensor(A0.copy(), requires_grad=True), nb.tensor(B0.copy(), requires_grad=True))


def _np(t):
    return None if t is None else np.array(t.numpy(), copy=True)


def _run_backward(g):
    """Per call: the value and both inputs' ``.grad`` after ``backward()``."""
    out = []
    for _ in range(CALLS):
        a, b = _fresh()
        y = g(a, b)
        if y.requires_grad:
            y.backward()
        out.append((_np(y), y.requires_grad, _np(a.grad), _np(b.grad)))
    return out


def _run_autograd_grad(g, allow_unused):
    """Per call: ``autograd.grad`` of the value w.r.t. both inputs, or the error type."""
    out = []
    for _ in range(CALLS):
        a, b = _fresh()
        y = g(a, b)
        try:
            gs = nb.autograd.grad(y, (a, b), allow_unused=allow_unused)
        except RuntimeError:
            out.append("RuntimeError")
            continue
        out.append(tuple(_np(t) for t in gs))
    return out


def _same(got, want, what):
    if isinstance(want, str) or isinstance(got, str):
        assert got == want, what
        return
    assert len(got) == len(want), what
    for k, (x, w) in enumerate(zip(got, want, strict=True)):
        if isinstance(w, (bool, np.bool_)) or w is None or x is None:
            assert (x is None) == (w is None) and (w is None or x == w), (what, k, x, w)
        else:
            np.testing.assert_allclose(x, w, rtol=1e-12, atol=1e-12, err_msg=f"{what} [{k}]")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CLASS))
def test_backward_matches_eager(name, mode):
    f = CLASS[name]
    want = _run_backward(f)
    got = _run_backward(nb.jit(f, mode=mode))
    for call, (g, w) in enumerate(zip(got, want, strict=True)):
        _same(g, w, f"{name}, {mode}, call {call}")


@pytest.mark.parametrize("allow_unused", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(set(CLASS) - {"requires_grad_false"}))
def test_autograd_grad_allow_unused_matches_eager(name, mode, allow_unused):
    f = CLASS[name]
    want = _run_autograd_grad(f, allow_unused)
    got = _run_autograd_grad(nb.jit(f, mode=mode), allow_unused)
    for call, (g, w) in enumerate(zip(got, want, strict=True)):
        _same(g, w, f"{name}, {mode}, allow_unused={allow_unused}, call {call}")


# ------------------------------------------------------------------ transforms of a jitted
# function that detaches, and jitted transforms (second order through the cut)
def h_detach(x):
    return (x * x * x.detach()).sum() + (x.detach() * x).exp().sum()


def h_no_grad(x):
    with nb.no_grad():
        c = (x * x).sin()
    return (c * x * x).sum()


def h_loop(x):
    return nb.fori_loop(0, 2, lambda i, c: c * x.detach() + c * x, x).sum()


# (not custom_python: higher-order gradients through a PythonOp raise a TracerError)
def _of_one(f):
    return lambda x: f(x, x * 1.5 - 0.2)


TRANSFORMED = {"detach": h_detach, "no_grad": h_no_grad, "loop": h_loop,
               **{name: _of_one(CLASS[name]) for name in (
                   "data", "no_grad_chain", "set_grad_block", "no_grad_decorator",
                   "enable_inside_no_grad", "detach_inplace_flag", "grad_no_create_graph",
                   "custom_native", "fori_detach", "fori_no_grad",
                   "fori_detach_carry", "scan_detach", "loop_in_no_grad", "nested_loops",
                   "python_loop")}}


def _x():
    return nb.tensor(np.array([0.3, -0.4, 0.7]), requires_grad=True)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(TRANSFORMED))
def test_jitted_grad_and_its_backward_match_eager(name, mode):
    """``jit(grad(h))`` and a backward through it (second order through the cut)."""
    h = TRANSFORMED[name]
    jg = nb.jit(nb.grad(h), mode=mode)
    for call in range(CALLS):
        rows = []
        for fn in (nb.grad(h), jg):
            x = _x()
            g = fn(x)
            if g.requires_grad:
                (g * g).sum().backward()
            rows.append((_np(g), g.requires_grad, _np(x.grad)))
        _same(rows[1], rows[0], f"{name}, {mode}, call {call}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(TRANSFORMED))
def test_transforms_of_jitted_function_match_eager(name, mode):
    """``grad``, ``value_and_grad`` and ``hessian`` of ``jit(h)`` (create_graph through
    the jitted function), and ``jit(hessian(h))``."""
    h = TRANSFORMED[name]
    jh = nb.jit(h, mode=mode)
    for call in range(CALLS):
        x = _x().detach()
        want = [_np(nb.grad(h)(x)), *(_np(t) for t in nb.value_and_grad(h)(x)),
                _np(nb.hessian(h)(x))]
        got = [_np(nb.grad(jh)(x)), *(_np(t) for t in nb.value_and_grad(jh)(x)),
               _np(nb.hessian(jh)(x)), _np(nb.jit(nb.hessian(h), mode=mode)(x))]
        _same(got, want + want[-1:], f"{name}, {mode}, call {call}")


@pytest.mark.parametrize("mode", MODES)
def test_create_graph_backward_through_jit_matches_eager(mode):
    """Double backward through a jitted function that detaches."""
    jh = nb.jit(h_detach, mode=mode)
    for call in range(CALLS):
        rows = []
        for fn in (h_detach, jh):
            x = _x()
            g, = nb.autograd.grad(fn(x), x, create_graph=True)
            gg, = nb.autograd.grad((g * g).sum(), x)
            rows.append((_np(g), _np(gg)))
        _same(rows[1], rows[0], f"{mode}, call {call}")


# ------------------------------------------------------------------ the cut in the graph
def test_detach_is_a_stop_gradient_marker_only_where_a_gradient_flows():
    a, b = _fresh()
    text = nb.jit(f_detach, mode="interpret").graph(a, b)
    assert "StopGradient" in text
    with nb.no_grad():  # nothing is differentiated: no marker
        a, b = _fresh()
        assert "StopGradient" not in nb.jit(f_detach, mode="interpret").graph(a, b)
    a, b = (nb.tensor(A0), nb.tensor(B0))
    assert "StopGradient" not in nb.jit(f_no_grad, mode="interpret").graph(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_inplace_on_detached_view_raises_tracer_error(mode):
    """Eager writes through the detached alias into ``b``; the jit refuses clearly."""
    def f(a, b):
        d = b.detach()
        d.mul_(2.0)
        return (a * b).sum()
    a, b = _fresh()
    with pytest.raises(nb.TracerError, match="modified in place"):
        nb.jit(f, mode=mode)(a, b)


@pytest.mark.parametrize("mode", MODES)
def test_closure_parameter_detached_matches_eager(mode):
    """A closed-over tensor requiring grad (an implicit input) read detached and not."""
    p = nb.tensor(np.array([1.5, -0.5, 0.25]), requires_grad=True)

    def f(a):
        return (a * p.detach() + p * p.detach() + (a * p).detach() * p).sum()
    rows = []
    for g in (f, nb.jit(f, mode=mode)):
        got = []
        for _ in range(CALLS):
            p.grad = None
            a = nb.tensor(A0.copy(), requires_grad=True)
            y = g(a)
            y.backward()
            got.append((_np(y), _np(a.grad), _np(p.grad)))
        rows.append(got)
    for call, (g, w) in enumerate(zip(rows[1], rows[0], strict=True)):
        _same(g, w, f"{mode}, call {call}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["detach", "no_grad", "fori_detach", "scan_detach"])
def test_no_grad_call_of_jitted_function_matches_eager(name, mode):
    """Called under no_grad (nothing differentiated): the values, and no markers."""
    f = CLASS[name]
    j = nb.jit(f, mode=mode)
    for _ in range(CALLS):
        with nb.no_grad():
            a, b = _fresh()
            want, got = f(a, b), j(a, b)
        assert not got.requires_grad
        _same((_np(got),), (_np(want),), name)
    with nb.no_grad():
        assert "StopGradient" not in j.graph(*_fresh())
