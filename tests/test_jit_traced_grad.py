"""Tracing ``nbgrad.jit(nbgrad.grad(f))`` of a Python loop differentiates the re-rolled
forward (nbgrad.jit.trace.traced_grad) instead of tracing the unrolled eager backward,
where that gives eager autograd's gradient by construction; elsewhere the engine runs."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.jit.trace import traced_grad as tg
from nbgrad.jit.trace.ir import LOOP

STEPS = 12


def _step(x, w, b):
    return x + 0.1 * nb.tanh(x @ w.T + b)


def _loss(w, b, x):
    for _ in range(STEPS):
        x = _step(x, w, b)
    return (x * x).sum()


def _args(seed=0):
    rng = np.random.default_rng(seed)
    return [nb.tensor(rng.normal(size=(3, 3)) / 2), nb.tensor(rng.normal(size=3) / 4),
            nb.tensor(rng.normal(size=(2, 3)))]


def _flat(tree):
    from nbgrad import pytree
    return [t.numpy() if isinstance(t, nb.Tensor) else np.asarray(t)
            for t in pytree.flatten(tree)[0]]


def _check(fn, args, rolled: bool):
    """jit(fn)'s first and second calls equal eager's; ``rolled``: whether the trace
    differentiated a re-rolled forward."""
    want = _flat(fn(*args))
    before = tg.STATS["rerolled"]
    jitted = nb.jit(fn)
    for _ in range(2):
        got = _flat(jitted(*args))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
    assert (tg.STATS["rerolled"] > before) == rolled
    return jitted


def test_grad_of_a_python_loop_differentiates_the_rerolled_forward():
    jitted = _check(nb.grad(_loss, argnums=(0, 1, 2)), _args(), rolled=True)
    # the backward is one loop node: the traced graph has no unrolled copies of it
    graph = next(iter(jitted._cache.values())).traced
    assert any(n.op == LOOP for n in graph.nodes)
    assert len(graph.nodes) < 40


@pytest.mark.parametrize("case", ["value_and_grad", "aux", "unused", "outside",
                                  "grad_outputs"])
def test_rerolled_forward_cases_agree_with_eager(case):
    w, b, x = _args(1)
    if case == "value_and_grad":
        fn, args = nb.value_and_grad(_loss, argnums=(0, 2)), (w, b, x)
    elif case == "aux":  # an intermediate of the unrolled forward is returned too
        def f(w, b, x):
            h = _step(x, w, b)
            return _loss(w, b, h), h * 2.0
        fn, args = nb.grad(f, argnums=1, has_aux=True), (w, b, x)
    elif case == "unused":  # an argument the loss does not read gets zeros
        z = nb.tensor(x.numpy().copy())
        fn, args = nb.grad(lambda w, b, x, z: _loss(w, b, x), argnums=(0, 3)), (w, b, x, z)
    elif case == "outside":  # the weights are read before the loop too
        fn, args = nb.grad(lambda w, b, x: _loss(w, b, x @ w) + (w * w).sum()), (w, b, x)
    else:  # autograd.grad with a given, non-unit cotangent
        def fn(w, b, x):
            w = w.detach().requires_grad_(True)
            y = x
            for _ in range(STEPS):
                y = _step(y, w, b)
            return nb.autograd.grad(y, w, grad_outputs=y * 3.0 - 1.0)[0]
        args = (w, b, x)
    _check(fn, args, rolled=True)


@pytest.mark.parametrize("case", ["detach", "no_grad", "hook", "alias", "short"])
def test_cuts_hooks_and_short_loops_keep_the_eager_backward(case):
    w, b, x = _args(2)
    if case == "detach":  # eager cuts the graph inside the loop: counts differ, declined
        def f(w, b, x):
            for k in range(STEPS):
                x = _step(x.detach() if k == 5 else x, w, b)
            return (x * x).sum()
    elif case == "no_grad":
        def f(w, b, x):
            for k in range(STEPS):
                if k == 3:
                    with nb.no_grad():
                        x = _step(x, w, b)
                else:
                    x = _step(x, w, b)
            return (x * x).sum()
    elif case == "hook":
        def f(w, b, x):
            for k in range(STEPS):
                x = _step(x, w, b)
                if k == 4:
                    x.register_hook(lambda g: g * 2.0)
            return (x * x).sum()
    elif case == "alias":  # one tensor passed twice, differentiated as one argument only:
        # the trace cannot tell the two apart (eager: the other one gets zeros)
        _check(nb.grad(lambda w, b, x, z: _loss(w, b, x), argnums=(0, 3)), (w, b, x, x),
               rolled=False)
        return
    else:  # too short to re-roll
        def f(w, b, x):
            return (_step(x, w, b) ** 2).sum()
    _check(nb.grad(f, argnums=(0, 1)), (w, b, x), rolled=False)
