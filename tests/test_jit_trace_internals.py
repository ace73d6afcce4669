"""nbgrad.jit's trace machinery: re-rolling's period search, the checker's messages, and
what a trace keeps alive (the garbage collector, intermediate arrays)."""

from __future__ import annotations

import gc
import weakref
from collections import Counter, deque

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.jit.trace import reroll as rr
from nbgrad.jit.trace.ir import Graph, Node, Var, check


def _candidates_by_counting(tokens: np.ndarray) -> list[int]:
    """The period search written as a scan of the nodes (the definition it vectorises)."""
    last: dict[int, deque[int]] = {}
    dist: Counter = Counter()
    for i, t in enumerate(tokens.tolist()):
        seen = last.setdefault(t, deque(maxlen=rr.LAGS))
        dist.update(i - j for j in seen if i - j <= rr.MAX_PERIOD)
        seen.append(i)
    return [p for p, n in dist.most_common(12) if n >= rr.MIN_REPS - 1]


@pytest.mark.parametrize("seed", range(6))
def test_period_candidates_match_the_scan_ties_included(seed):
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(rng.integers(1, 5)):  # periodic stretches, noise, few distinct tokens
        p = int(rng.integers(1, 40))
        body = rng.integers(0, int(rng.integers(2, 9)), size=p)
        parts.append(np.tile(body, int(rng.integers(1, 30))))
        parts.append(rng.integers(0, 6, size=int(rng.integers(0, 50))))
    tokens = np.concatenate(parts).astype(np.int64)
    assert rr._candidates(tokens) == _candidates_by_counting(tokens)
    far = np.tile(np.arange(5000) % 4999, 2).astype(np.int64)  # distances past MAX_PERIOD
    assert rr._candidates(far) == _candidates_by_counting(far)


def test_checker_names_the_node_and_output():
    a, b = Var((2,), np.float64), Var((2,), np.float64)
    bad = Graph([a], {}, [Node("neg", [a], [b]), Node("neg", [a], [b])], [b])
    with pytest.raises(nb.TracerError, match=r"defined twice \(output 0 of node 1 \(neg\)\)"):
        check(bad)
    with pytest.raises(nb.TracerError, match=r"node 0 \(add\) has 1 inputs, its op takes 2"):
        check(Graph([a], {}, [Node("add", [a], [b])], [b]))
    with pytest.raises(nb.TracerError, match=r"node 0 \(sum\) lacks attribute 'dim'"):
        check(Graph([a], {}, [Node("sum", [a], [b])], [b]))


def test_tracing_pauses_the_garbage_collector_and_restores_it():
    seen = []

    def f(x):
        seen.append(gc.isenabled())
        return nb.sin(x) * 2.0

    x = nb.tensor(np.arange(3.0))
    was = gc.isenabled()
    try:
        gc.enable()
        nb.jit(f, mode="interpret")(x)
        assert seen == [False] and gc.isenabled()
        gc.disable()  # a caller's choice is kept
        nb.jit(f, mode="interpret")(x + 1.0)
        assert seen == [False, False] and not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_a_trace_keeps_no_intermediate_array_alive():
    alive = []

    def f(x):
        y = nb.sin(x)
        ref = weakref.ref(y._data)
        z = nb.cos(y)
        del y
        alive.append(ref() is not None)
        return z

    x = nb.tensor(np.arange(4.0))
    jf = nb.jit(f, mode="interpret")
    np.testing.assert_allclose(jf(x).numpy(), np.cos(np.sin(np.arange(4.0))))
    assert alive == [False]
    np.testing.assert_allclose(jf(x).numpy(), np.cos(np.sin(np.arange(4.0))))
