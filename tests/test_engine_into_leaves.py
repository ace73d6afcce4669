"""The engine's shortcut for a backward that is one node's and then leaves'
accumulations (``GraphTask._run_into_leaves``: ``loss.backward()`` of a jitted call, or
of one op on leaves) against the general walk, which every other graph takes."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import engine
from nbgrad.autograd.node import RETAIN_GRAPH_MESSAGE

#: grad mode inside each backward of SumSq (off unless create_graph)
MODES: list[bool] = []


class SumSq(nb.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return (x * x * y).sum()

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        MODES.append(nb.is_grad_enabled())
        return 2 * x * y * g, x * x * g


def _jit_pair(x, y):
    return (x * y).sum(), (x.exp() * y).sum()


_JIT_PAIR = nb.jit(_jit_pair, mode="interpret")
_JIT_ONE = nb.jit(lambda x, y: (x * y.sin()).sum(), mode="interpret")


def _leaves(requires=(True, True), grads=(None, None)):
    rng = np.random.default_rng(3)
    out = []
    for k, (r, g) in enumerate(zip(requires, grads, strict=True)):
        t = nb.tensor(rng.standard_normal(4) + k, requires_grad=r)
        if g is not None:
            t.grad = nb.tensor(np.full(4, g))
        out.append(t)
    return out


def _scenario(name):
    """``(leaves, run)``: ``run()`` calls backward as a user would and returns what to
    compare (the leaves' gradients and anything it asserts on the way)."""
    if name == "one op":
        x, y = _leaves()
        return [x, y], lambda: nb.dot(x, y).backward()
    if name == "one op, a leaf without grad":
        x, y = _leaves((True, False))
        return [x, y], lambda: nb.dot(x, y).backward()
    if name == "existing grads add":
        x, y = _leaves(grads=(1.5, -2.0))
        return [x, y], lambda: nb.dot(x, y).backward()
    if name == "jit":
        x, y = _leaves()
        return [x, y], lambda: _JIT_ONE(x, y).backward()
    if name == "jit, second output":
        x, y = _leaves()
        return [x, y], lambda: _JIT_PAIR(x, y)[1].backward()
    if name == "jit, twice with retain_graph":
        x, y = _leaves()

        def run():
            loss = _JIT_ONE(x, y)
            loss.backward(retain_graph=True)
            loss.backward()
            with pytest.raises(RuntimeError, match="second time"):
                loss.backward()
        return [x, y], run
    if name == "custom Function":
        x, y = _leaves()

        def run():
            MODES.clear()
            SumSq.apply(x, y).backward(nb.tensor(0.5))
            SumSq.apply(x, y).backward(nb.tensor(0.5), create_graph=True)
            return list(MODES)
        return [x, y], run
    if name == "create_graph, then through the gradient":
        x, y = _leaves()

        def run():
            nb.dot(x, y).backward(create_graph=True)
            gx = x.grad
            x.grad = None
            (gx * gx).sum().backward()  # y.grad: y from the first, 2 y from this one
            return gx.detach().numpy()
        return [x, y], run
    if name == "released":
        x, y = _leaves()

        def run():
            loss = nb.dot(x, y)
            loss.backward()
            with pytest.raises(RuntimeError) as err:
                loss.backward()
            return str(err.value) == RETAIN_GRAPH_MESSAGE or "second time" in str(err.value)
        return [x, y], run
    raise AssertionError(name)


SHORTCUT = ["one op", "one op, a leaf without grad", "existing grads add", "jit",
            "jit, second output", "jit, twice with retain_graph", "custom Function",
            "create_graph, then through the gradient", "released"]


@pytest.fixture
def taken(monkeypatch) -> list:
    """One entry per backward that took the shortcut."""
    calls: list = []
    real = engine.GraphTask._run_into_leaves
    monkeypatch.setattr(engine.GraphTask, "_run_into_leaves",
                        lambda self, root: calls.append(1) or real(self, root))
    return calls


@pytest.mark.parametrize("name", SHORTCUT)
def test_the_shortcut_gives_what_the_general_walk_gives(monkeypatch, taken, name):
    leaves, run = _scenario(name)
    extra = run()
    got = [None if t.grad is None else t.grad.numpy().copy() for t in leaves]
    assert taken, f"{name}: the shortcut was not taken"
    monkeypatch.setattr(engine.GraphTask, "_into_leaves", lambda self, node: False)
    leaves2, run2 = _scenario(name)
    extra2 = run2()
    want = [None if t.grad is None else t.grad.numpy().copy() for t in leaves2]
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(np.asarray(extra), np.asarray(extra2))


def test_graphs_with_hooks_or_more_nodes_take_the_general_walk(taken):
    x, y = _leaves()
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    nb.dot(x, y).backward()  # a leaf's hook
    np.testing.assert_array_equal(seen[0], y.detach().numpy())
    loss = nb.dot(y, y)
    loss.retain_grad()
    loss.backward()  # the root's retained gradient; one leaf on two edges
    assert loss.grad.item() == 1.0
    np.testing.assert_array_equal(y.grad.numpy(), x.detach().numpy() + 2 * y.detach().numpy())
    (x * y).sum().backward()  # two nodes
    nb.autograd.grad(nb.dot(x, y), [x])  # grad(): captures
    with nb.autograd.detect_anomaly():
        nb.dot(x, y).backward()
    assert taken == []
