"""A jitted graph's backward multiplies each use's gradient by its derivative before it
sums the uses, as eager mode does (finding F5): the graph is differentiated before common
subexpressions are merged and loop invariants hoisted. Merged first, ``sigmoid(x)`` used
in six re-rolled steps at ``x = 1e300`` summed its six gradients to ``inf`` and then
multiplied by ``sigmoid'(x) = 0``: NaN where eager gives 0."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import nbgrad as nb
from nbgrad.testing.fuzz import runner


def _reduce(c0, s):
    return functools.reduce(lambda c, i: c * nb.sigmoid(s) + 0.1 * nb.sin(c), range(6), c0)


def _merged(x, s):
    return (nb.sigmoid(s) * x).sum() + (nb.sigmoid(s) * x).sum()


@pytest.mark.parametrize("fn", [_reduce, _merged], ids=["hoisted", "merged"])
@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_overflowing_uses_are_differentiated_as_eager(fn, mode):
    def f(x, s):
        return fn(x, s).sum()

    jf = nb.jit(f, mode=mode)
    normal = [nb.tensor(np.array([0.3, -0.2]), requires_grad=True),
              nb.tensor(np.array(-0.7), requires_grad=True)]
    for _ in range(2):
        jf(*normal).backward()
    special = [nb.tensor(np.array([1e308, -1.0]), requires_grad=True),
               nb.tensor(np.array(1e300), requires_grad=True)]
    eager = [nb.tensor(t.numpy(), requires_grad=True) for t in special]
    with np.errstate(all="ignore"):
        jf(*special).backward()
        f(*eager).backward()
    for got, want in zip(special, eager, strict=True):
        np.testing.assert_array_equal(got.grad.numpy(), want.grad.numpy())
    assert special[1].grad.item() == 0.0


#: fuzz seeds (``--max-steps 6``) whose tier-1 gradients on special inputs were NaN where
#: eager's were numbers, through hoisting or merging before the graph was differentiated
F5_SEEDS = [35883, 37875, 46269, 46502, 47744, 51353, 51613, 57209, 120155]


def test_f5_fuzz_seeds_agree_with_eager():
    summary = runner.run_seeds(F5_SEEDS, ["eager", "interpret"], max_steps=6)
    assert summary.tried["interpret"] == len(F5_SEEDS)
    assert not summary.failures, [m.program.seed for m in summary.failures]


def _unread_carry(x):
    """Only the first carry is read; the second feeds only itself (finding F4)."""
    c = nb.fori_loop(0, 3, lambda i, c: (c[0] * 2.0 + x, c[1] * x), (x, x))
    return c[0].sum()


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("value", [1.0, 1e308, np.inf])
def test_a_carry_that_only_feeds_itself_is_dropped_before_differentiation(mode, value):
    """Eager never reaches the unread carry ``c[1] * x``; the jitted graph drops it (dead
    code), so its zero cotangent is never multiplied by ``x = inf`` (NaN before)."""
    assert _backward_as_eager(_unread_carry, mode, value).tolist() == [15.0]


def _backward_as_eager(fn, mode: str, value: float) -> np.ndarray:
    """Eager's gradient of ``fn`` at ``[value]``, which ``nbgrad.jit(fn, mode=mode)`` then
    ``.backward()`` must give on two calls."""
    x = nb.tensor(np.array([value]), requires_grad=True)
    with np.errstate(all="ignore"):
        fn(x).backward()
        eager = x.grad.numpy()
        jf = nb.jit(fn, mode=mode)
        for _ in range(2):
            xj = nb.tensor(np.array([value]), requires_grad=True)
            jf(xj).backward()
            np.testing.assert_array_equal(xj.grad.numpy(), eager)
    return eager


def test_dead_code_drops_carries_that_only_feed_themselves():
    from nbgrad.jit.trace.ir import LOOP, LoopInfo
    from nbgrad.jit.trace.passes import dce
    f = nb.jit(_unread_carry, mode="interpret")
    x = nb.tensor(np.array([1.0]))
    f(x)
    (entry,) = f._cache.values()
    loops = [n for n in dce(entry.traced).nodes if n.op == LOOP]
    assert [LoopInfo.of(n).n_carry for n in loops] == [1]


def _feeding_carry(x):
    """The second carry's final value is unread, but the first reads it every step."""
    c = nb.fori_loop(0, 3, lambda i, c: (c[0] * 2.0 + c[1], c[1] * x), (x, x))
    return c[0].sum()


def _feeding_chain(x):
    """A chain of two such carries (two last steps to take out), and the counter."""
    def body(i, c):
        return c[0] + c[1] * i, c[1] + c[2], c[2] * x
    return nb.fori_loop(1, 5, body, (x, x, x))[0].sum()


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("value", [1.0, 1e308, np.inf])
@pytest.mark.parametrize("fn", [_feeding_carry, _feeding_chain])
def test_a_carry_only_other_carries_read_gets_no_last_step_gradient(fn, mode, value):
    """Eager never differentiates the last updates of a carry whose final value nothing
    reads; the jitted graph takes those steps out of the loop before it is
    differentiated (``passes.peel_unread_carries``), so no zero cotangent meets
    ``x = inf`` there (NaN before)."""
    assert not np.isnan(_backward_as_eager(fn, mode, value)).any()


def test_peeling_takes_out_only_the_steps_needed():
    from nbgrad.jit.trace.ir import LOOP, LoopInfo
    from nbgrad.jit.trace.passes import BEFORE_AUTODIFF, optimize, peel_unread_carries
    for fn, steps, peeled in ((_feeding_carry, 3, 1), (_feeding_chain, 4, 2),
                              (_unread_carry, 3, 0)):
        f = nb.jit(fn, mode="interpret")
        f(nb.tensor(np.array([1.0])))
        (entry,) = f._cache.values()
        graph = optimize(entry.traced, BEFORE_AUTODIFF)
        (loop,) = [n for n in graph.nodes if n.op == LOOP]
        assert LoopInfo.of(loop).count == steps - peeled
        if not peeled:  # a loop that needs none is left as it is
            assert peel_unread_carries(graph) is graph


# ------------------------------------------------------------------ F4's siblings
#: updates of carry k: ``(name, fn(carries, k, i, x))``; each reads its own carry and,
#: through ``feed``, the next one (the last carry reads only itself)
_UPDATES = {
    "scale": lambda c, k, i, x: c[k] * x,
    "affine": lambda c, k, i, x: 0.5 * c[k] + x,
    "tanh": lambda c, k, i, x: nb.tanh(c[k]) * x,
    "counter": lambda c, k, i, x: 0.9 * c[k] + 0.1 * i * x,
}


@st.composite
def _carry_loops(draw):
    n = draw(st.integers(2, 3))
    updates = [draw(st.sampled_from(sorted(_UPDATES))) for _ in range(n)]
    feeds = [draw(st.booleans()) for _ in range(n - 1)] + [False]
    read = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))
    steps = draw(st.integers(1, 5))
    value = draw(st.sampled_from([0.7, -1.3, 1e308, np.inf, -np.inf]))
    return n, updates, feeds, sorted(read), steps, value


def _check_carry_loop(case, mode, through_grad=False):
    """``nbgrad.jit(f)`` then ``.backward()`` (or ``nbgrad.jit(nbgrad.grad(f))``) against
    eager (a Python loop) on ``case``."""
    n, updates, feeds, read, steps, value = case

    def body(i, c, x):
        return tuple(_UPDATES[updates[k]](c, k, i, x) + (0.25 * c[k + 1] if feeds[k] else 0.0)
                     for k in range(n))

    def f(x):
        out = nb.fori_loop(0, steps, lambda i, c: body(i, c, x), (x,) * n)
        return sum(out[k].sum() for k in read)

    with np.errstate(all="ignore"):
        x = nb.tensor(np.array([value, 0.5]), requires_grad=True)
        c = (x,) * n
        for i in range(steps):  # eager: a Python loop
            c = body(nb.tensor(np.int64(i)), c, x)
        loss = sum(c[k].sum() for k in read)
        loss.backward()
        want_loss, want = loss.numpy(), x.grad.numpy()
        xj = nb.tensor(np.array([value, 0.5]), requires_grad=True)
        if through_grad:
            got_loss, got = nb.jit(nb.value_and_grad(f), mode=mode)(xj)
        else:
            got_loss = nb.jit(f, mode=mode)(xj)
            got_loss.backward()
            got = xj.grad
    got = got.numpy()
    np.testing.assert_array_equal(np.isnan(got_loss.numpy()), np.isnan(want_loss))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12)


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_carry_loops())
def test_loops_with_unread_carries_differentiate_as_eager(case):
    """Random fori_loops of 2-3 carries, each update reading its own carry and maybe
    the next, some carries unread after the loop, on ordinary and special inputs:
    ``nbgrad.jit(f)`` then ``.backward()`` gives eager's value and gradient (NaN where
    eager has NaN, the same infinities) in tier 1. Without ``peel_unread_carries`` it
    finds a loop of one step whose unread second carry feeds the first, at ``inf``."""
    _check_carry_loop(case, "interpret")


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_carry_loops())
def test_loops_with_unread_carries_differentiate_as_eager_in_tier_2(case):
    """The same in tier 2 (a few cases: each compiles)."""
    _check_carry_loop(case, "compile")


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_carry_loops())
@example(case=(2, ["affine", "scale"], [True, False], [0], 1, np.inf))  # a feeding carry
@example(case=(2, ["affine", "scale"], [False, False], [0], 3, 1e308))  # a dead carry
def test_loops_with_unread_carries_differentiate_as_eager_under_jit_grad(case):
    """The same loops under ``nbgrad.jit(nbgrad.value_and_grad(f))``, where the loop's
    backward is built while tracing (``loop_zeros``): a carry no read carry reads drops
    out of the reversed loop, and the reversed loop's first steps run without the
    cotangents still zero there. Without the first it finds a one-carry-read loop at
    1e308 (NaN); without the second, a read carry fed by an unread one at inf."""
    _check_carry_loop(case, "interpret", through_grad=True)


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_carry_loops())
def test_loops_with_unread_carries_differentiate_as_eager_under_jit_grad_in_tier_2(case):
    _check_carry_loop(case, "compile", through_grad=True)


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("value", [1.0, 1e308, np.inf])
@pytest.mark.parametrize("fn", [_feeding_carry, _feeding_chain])
def test_a_feeding_carry_gets_no_last_step_gradient_under_jit_grad(fn, mode, value):
    """``nbgrad.jit(nbgrad.grad(f))`` gives eager's gradient (inf, not NaN, at 1e308)."""
    x = nb.tensor(np.array([value]), requires_grad=True)
    with np.errstate(all="ignore"):
        fn(x).backward()
        g = nb.jit(nb.grad(fn), mode=mode)
        for _ in range(2):
            np.testing.assert_array_equal(g(nb.tensor(np.array([value]))).numpy(),
                                          x.grad.numpy())


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("value", [1.0, 1e308, np.inf])
def test_a_dead_carry_leaves_the_loops_under_jit_grad(mode, value):
    """``_unread_carry`` under ``nbgrad.jit(nbgrad.grad(f))``: eager's gradient, and the
    compiled graph keeps neither the dead carry in the forward loop nor its cotangent in
    the reversed one."""
    from nbgrad.jit.trace.ir import LOOP, LoopInfo
    g = nb.jit(nb.grad(_unread_carry), mode=mode)
    with np.errstate(all="ignore"):
        for _ in range(2):
            assert g(nb.tensor(np.array([value]))).numpy().tolist() == [15.0]
    (entry,) = g._cache.values()
    loops = [LoopInfo.of(n) for n in entry.traced.nodes if n.op == LOOP]
    assert [info.n_carry for info in loops] == [1, 2]  # c0; its cotangent and x's sum
