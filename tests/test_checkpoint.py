"""Gradient checkpointing (issue 16 item 4): ``nbgrad.checkpoint`` and the ``checkpoint=``
of ``fori_loop``/``scan`` give the gradients of the plain computation (first and second
order, closed-over tensors, random ops) while keeping only segment inputs alive."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.recompute import loop_segments


def _t(shape, seed, requires_grad=True):
    rng = np.random.default_rng(seed)
    return nb.tensor(rng.standard_normal(shape), requires_grad=requires_grad)


def _grads(loss, leaves, create_graph=False):
    return nb.autograd.grad(loss, leaves, create_graph=create_graph)


def test_checkpoint_matches_plain_first_and_second_order_with_closures():
    W, x = _t((4, 4), 0), _t((4,), 1)

    def run(ck):
        h = W * 2  # made outside f, used inside: a closed-over non-leaf

        def f(x, scale):
            return nb.tanh(W @ x + h @ x).sum() * x * scale

        y = (nb.checkpoint(f) if ck else f)(x, 0.5)
        gx, gW = _grads((y ** 2).sum() + h.sum(), [x, W], create_graph=True)
        return [g.numpy() for g in (gx, gW, *_grads((gx ** 2).sum() + (gW ** 3).sum(),
                                                      [x, W]))]

    for got, want in zip(run(True), run(False), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_checkpoint_replays_the_random_generator():
    x = _t((50,), 2)

    def f(x):
        return nb.nn.functional.dropout(nb.sin(x), 0.5) * x

    def grad_of(ck):
        nb.random.seed(7)
        return _grads((nb.checkpoint(f) if ck else f)(x).sum(), [x])[0].numpy()

    np.testing.assert_array_equal(grad_of(True), grad_of(False))


def test_checkpoint_pytrees_and_hooks_run_once():
    a, b = _t((3,), 3), _t((3,), 4)
    calls = []
    b.register_hook(lambda g: calls.append(1))

    def f(p):
        return {"s": p[0] * p[1], "t": (nb.exp(p[0]), 3)}

    out = nb.checkpoint(f)((a, b))
    assert out["t"][1] == 3
    ga, gb = _grads(out["s"].sum() + out["t"][0].sum(), [a, b])
    np.testing.assert_allclose(ga.numpy(), b.numpy() + np.exp(a.numpy()))
    np.testing.assert_allclose(gb.numpy(), a.numpy())
    calls.clear()
    out = nb.checkpoint(f)((a, b))
    out["s"].sum().backward()
    assert len(calls) == 1


def test_checkpoint_without_grad():
    x = _t((3,), 5)
    with nb.no_grad():
        assert not nb.checkpoint(nb.sin)(x).requires_grad


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_checkpoint_inside_jit_keeps_only_the_inputs(mode):
    """Traced, checkpoint(f) is a one-step remat loop: same value and gradient as
    without it, and the compiled backward stacks f's input, not its intermediates."""
    W, x = _t((5, 5), 18, False), _t((5,), 19, False)

    def f(x, W):
        h = nb.tanh(W @ x)
        return nb.sin(h) * 2.0, (h ** 2).sum()

    def make(wrap):
        def loss(W):
            a, s = wrap(f)(x, W)
            return (a ** 2).sum() + s
        return nb.value_and_grad(loss)

    want = make(lambda g: g)(W)
    step = nb.jit(make(nb.checkpoint), mode=mode)
    for _ in range(2):
        value, grad = step(W)
        np.testing.assert_allclose(float(value), float(want[0]), rtol=1e-13)
        np.testing.assert_allclose(grad.numpy(), want[1].numpy(), rtol=1e-12, atol=1e-14)
    text = nb.jit(make(nb.checkpoint), mode="interpret").graph(W)
    loops = [line for line in text.splitlines() if "= loop(" in line]
    # the forward loop's outputs are f's two results: no intermediate is stacked
    assert loops and loops[0].split(" = loop(")[0].count(": f64") == 2, text


@pytest.mark.parametrize("how", [True, "sqrt", 7, "log", 1000])
def test_fori_loop_checkpoint_gives_the_plain_gradient(how):
    W, b, x0 = _t((5, 5), 6), _t((5,), 7), _t((5,), 8)

    def loss(W, b, x0, ck):
        body = lambda i, x: x + 0.1 * nb.tanh(W @ x + b) - 0.01 * x * i  # noqa: E731
        return (nb.fori_loop(3, 60, body, x0, checkpoint=ck) ** 2).sum()

    want = nb.grad(loss, argnums=(0, 1, 2))(W, b, x0, None)
    got = nb.grad(loss, argnums=(0, 1, 2))(W, b, x0, how)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-13)


def test_fori_loop_checkpoint_second_order():
    W, x0 = _t((3, 3), 9), _t((3,), 10)

    def loss(W, ck):
        return nb.fori_loop(0, 9, lambda i, x: nb.sin(W @ x), x0, checkpoint=ck).sum()

    np.testing.assert_allclose(nb.hessian(loss)(W, 3).numpy(),
                               nb.hessian(loss)(W, None).numpy(), rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_checkpoint_gives_the_plain_result_and_gradient(reverse):
    W, c0, xs = _t((4, 4), 11), _t((4,), 12), _t((23, 4), 13)

    def loss(W, c0, xs, ck):
        def f(c, x):
            c = nb.tanh(W @ c + x)
            return c, c.sum() * x
        c, ys = nb.scan(f, c0, xs, reverse=reverse, checkpoint=ck)
        return (c ** 2).sum() + (ys ** 3).sum()

    want = nb.value_and_grad(loss, argnums=(0, 1, 2))(W, c0, xs, None)
    got = nb.value_and_grad(loss, argnums=(0, 1, 2))(W, c0, xs, 5)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-13)
    for g, w in zip(got[1], want[1], strict=True):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-13)


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_fori_loop_checkpoint_bounds_the_memory_of_the_gradient():
    """256 steps of a 2048-state loop: the plain gradient keeps every step's values
    (several 16 KB arrays a step); checkpointed, about 2 sqrt(T) carries stay alive."""
    x0 = _t((2048,), 14, requires_grad=False)  # else grad keeps graphs (create_graph)

    def run(ck):
        def loss(x0):
            return nb.fori_loop(0, 256, lambda i, x: nb.tanh(x * 0.9 + 0.1), x0,
                                checkpoint=ck).sum()
        return lambda: nb.grad(loss)(x0)

    plain, sqrt, log = (_peak_bytes(run(ck)) for ck in (None, True, "log"))
    assert sqrt < plain / 4, (plain, sqrt)
    assert log < plain / 4, (plain, log)


def test_loop_segments_and_bad_values():
    assert loop_segments(10, True) == [(0, 4, False), (4, 8, False), (8, 10, False)]
    assert loop_segments(10, 3)[-1] == (9, 10, False)
    assert loop_segments(9, "log") == [(0, 4, True), (4, 9, True)]
    for bad in (0, -2, "fast", 1.5):
        with pytest.raises(ValueError, match="checkpoint="):
            nb.fori_loop(0, 3, lambda i, x: x, nb.zeros(2), checkpoint=bad)
    with pytest.raises(ValueError, match="checkpoint='log' is for fori_loop"):
        nb.scan(lambda c, x: (c, x), nb.zeros(2), nb.zeros((3, 2)), checkpoint="log")


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_fori_loop_checkpoint_under_jit(mode):
    """Under nbgrad.jit the loop runs as segments whose gradient stacks one carry per
    segment (the segment is recomputed during backward): same values and gradients."""
    W, b, x0 = _t((6, 6), 15, False), _t((6,), 16, False), _t((6,), 17, False)

    def make(ck):
        def loss(W, b):
            body = lambda i, x: x + 0.1 * nb.tanh(W @ x + b) - 0.01 * x * i  # noqa: E731
            return (nb.fori_loop(2, 50, body, x0, checkpoint=ck) ** 2).sum()
        return nb.value_and_grad(loss, argnums=(0, 1))

    want = make(None)(W, b)
    for ck in (True, 5, "log"):
        step = nb.jit(make(ck), mode=mode)
        for _ in range(2):
            value, grads = step(W, b)
            np.testing.assert_allclose(float(value), float(want[0]), rtol=1e-13)
            for g, w in zip(grads, want[1], strict=True):
                np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-11, atol=1e-13)
    text = nb.jit(make(True), mode="interpret").graph(W, b)
    stacks = [line for line in text.splitlines() if "= loop(" in line and "ys=((" in line]
    assert stacks and all("f64[48,6]" not in line for line in stacks), text
    assert any("f64[6,6]" in line and "count=6" in line for line in text.splitlines())
    assert "f64[6,7," not in text, text  # no per-step stacks of each segment kept
    # the segments' W gradients accumulate straight into the outer accumulator: one
    # zeros constant of W's size (the outer loop's), none per nesting level
    assert text.count("f64[6,6] = const") == 1, text


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_checkpoint_under_jit(reverse):
    W, c0, xs = _t((4, 4), 20, False), _t((4,), 21, False), _t((23, 4), 22, False)

    def make(ck):
        def loss(W, xs):
            def f(c, x):
                c = nb.tanh(W @ c + x)
                return c, c.sum() * x
            c, ys = nb.scan(f, c0, xs, reverse=reverse, checkpoint=ck)
            return (c ** 2).sum() + (ys ** 3).sum()
        return nb.value_and_grad(loss, argnums=(0, 1))

    want = make(None)(W, xs)
    for ck in (True, 5, 23, 40):
        value, grads = nb.jit(make(ck), mode="interpret")(W, xs)
        np.testing.assert_allclose(float(value), float(want[0]), rtol=1e-13)
        for g, w in zip(grads, want[1], strict=True):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-13)
    text = nb.jit(make(5), mode="interpret").graph(W, xs)
    assert any("= loop(" in line and "count=4" in line for line in text.splitlines()), text


def test_checkpointed_loop_under_jit_bounds_the_memory_of_the_gradient():
    """The compiled gradient of 256 steps of a 2048-state loop: plain, it stacks every
    step's values; with checkpoint=True or "log", one carry per segment."""
    x0 = _t((2048,), 23, requires_grad=False)

    def run(ck):
        step = nb.jit(nb.grad(lambda x0: nb.fori_loop(
            0, 256, lambda i, x: nb.tanh(x * 0.9 + 0.1), x0, checkpoint=ck).sum()),
            mode="interpret")
        step(x0)  # traced and compiled outside the measurement
        return lambda: step(x0)

    plain, sqrt, log = (_peak_bytes(run(ck)) for ck in (None, True, "log"))
    assert sqrt < plain / 4, (plain, sqrt)
    assert log < plain / 4, (plain, log)


def test_segments_of_a_loop_that_ignores_its_counter_do_not_read_it():
    """The segments' start index is dead when the body ignores its counter: dead-code
    removal drops it through every level of nesting (else tier 1 replays the loops step
    by step in Python)."""
    x0 = _t((3,), 24, requires_grad=False)
    step = nb.jit(nb.grad(lambda x0: nb.fori_loop(
        0, 40, lambda i, x: nb.sin(x), x0, checkpoint="log").sum()), mode="interpret")
    text = step.graph(x0)
    assert text.count("= loop(") > 4 and "index=(" not in text, text


def test_checkpointed_segments_run_natively_while_traced(monkeypatch):
    """Tracing runs each loop once; the segments of a counter-free body must not need
    the step-by-step Python replay (they carry no dead integer inputs)."""
    from nbgrad.jit.trace import loops

    def refuse(info, arrays):
        raise AssertionError("a loop ran step by step in Python")

    monkeypatch.setattr(loops, "execute_loop_eager", refuse)
    x0 = _t((3,), 25, requires_grad=False)
    for ck in (True, "log"):
        nb.jit(nb.grad(lambda x0, ck=ck: nb.fori_loop(
            0, 40, lambda i, x: nb.sin(x), x0, checkpoint=ck).sum()), mode="interpret")(x0)


def test_loops_run_while_tracing_do_not_keep_their_pools(monkeypatch):
    """Tracing runs each loop once through a tier-1 tape; keeping each tape's pool (of
    the size of everything the loop touches, parameters included) tripled the memory of
    a checkpointed gradient at large sizes. They get a fresh pool per run."""
    from nbgrad.jit import program
    made = []

    def spy(info, arrays, real=program.loop_executable):
        exe = real(info, arrays)
        made.append(exe)
        return exe

    monkeypatch.setattr(program, "loop_executable", spy)
    x0 = _t((3,), 26, requires_grad=False)
    nb.jit(nb.grad(lambda x0: nb.fori_loop(0, 20, lambda i, x: nb.sin(x), x0,
                                           checkpoint=True).sum()), mode="interpret")(x0)
    assert made and all(exe is not None and exe._pool is None for exe in made)


def test_pytree_flatten_keeps_no_leaf_alive():
    """flatten's recursive closure was a reference cycle that kept the leaves (a
    checkpoint's recomputed outputs) alive until the garbage collector ran."""
    import gc
    import weakref

    from nbgrad import pytree

    t = nb.ones(3)
    ref = weakref.ref(t)
    gc.disable()
    try:
        leaves, _ = pytree.flatten({"a": [t, (t, None)]})
        assert leaves == [t, t]
        del t, leaves
        assert ref() is None
    finally:
        gc.enable()
