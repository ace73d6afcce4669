"""A jitted graph's backward multiplies each use's gradient by its derivative before it
sums the uses, as eager mode does (finding F5): the graph is differentiated before common
subexpressions are merged and loop invariants hoisted. Merged first, ``sigmoid(x)`` used
in six re-rolled steps at ``x = 1e300`` summed its six gradients to ``inf`` and then
multiplied by ``sigmoid'(x) = 0``: NaN where eager gives 0."""

from __future__ import annotations

import functools

import numpy as np
import pytest

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
    x = nb.tensor(np.array([value]), requires_grad=True)
    with np.errstate(all="ignore"):
        _unread_carry(x).backward()
        eager = x.grad.numpy()
        jf = nb.jit(_unread_carry, mode=mode)
        for _ in range(2):
            xj = nb.tensor(np.array([value]), requires_grad=True)
            jf(xj).backward()
            np.testing.assert_array_equal(xj.grad.numpy(), eager)
    assert eager.tolist() == [15.0]


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
    x = nb.tensor(np.array([value]), requires_grad=True)
    with np.errstate(all="ignore"):
        fn(x).backward()
        eager = x.grad.numpy()
        jf = nb.jit(fn, mode=mode)
        for _ in range(2):
            xj = nb.tensor(np.array([value]), requires_grad=True)
            jf(xj).backward()
            np.testing.assert_array_equal(xj.grad.numpy(), eager)
    assert not np.isnan(eager).any()


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
