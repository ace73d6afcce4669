"""Tier 2's scratch buffers: large internal buffers (W5's stack of saved values) are
allocated once per compiled graph and passed back in on every call, never returned.
Each test would fail if a buffer a result can reach were kept: the result of one call
would change under the next."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.jit.tier2 import store


@pytest.fixture
def small_scratch(monkeypatch):
    """Scratch from 64 bytes on, so that small test graphs have some."""
    monkeypatch.setattr(store, "SCRATCH_MIN_BYTES", 64)


def _softclip_steps(x):
    for _ in range(4):
        x = 0.9 * x + 0.1 * (x / (1.0 + x.abs()))
    return x.sum()


def _steps_loop(x):
    return nb.fori_loop(0, 4, lambda i, x: 0.9 * x + 0.1 * (x / (1.0 + x.abs())), x).sum()


def _eager(fn, a):
    x = nb.tensor(a, requires_grad=True)
    loss = fn(x)
    loss.backward()
    return loss.item(), x.grad.numpy().copy()


@pytest.mark.parametrize("fn", [_softclip_steps, _steps_loop])
def test_results_survive_later_calls(small_scratch, fn):
    jitted = nb.jit(nb.value_and_grad(fn), mode="compile")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(64) * 2 for _ in range(3)]
    kept = [jitted(nb.tensor(a)) for a in arrays]
    assert "nb_empty" in jitted.source(nb.tensor(arrays[0]))
    gen = next(iter(jitted._cache.values())).program.executables()
    assert any(getattr(getattr(x, "inner", x), "scratch_specs", None)
               for x in gen.values()), "the graph was expected to have scratch buffers"
    for (value, grad), a in zip(kept, arrays, strict=True):
        want_value, want_grad = _eager(fn, a)
        assert value.item() == pytest.approx(want_value, rel=1e-12)
        np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-12)


def test_a_returned_carry_is_never_scratch(small_scratch):
    """The carry buffers of a loop are swapped every step; the one holding the result
    is returned, so none of them may be kept (whichever ends up returned)."""
    f = nb.jit(lambda x: nb.fori_loop(0, 3, lambda i, c: c * 1.5 + 1.0, x), mode="compile")
    a, b = np.arange(32.0), -np.arange(32.0)
    f(nb.tensor(b))  # the first call returns what the trace computed
    second = f(nb.tensor(a))  # tier 2's
    f(nb.tensor(b))
    np.testing.assert_array_equal(second.numpy(), ((a * 1.5 + 1) * 1.5 + 1) * 1.5 + 1)


def test_concurrent_calls_get_their_own_scratch(small_scratch):
    jitted = nb.jit(nb.value_and_grad(_steps_loop), mode="compile")
    rng = np.random.default_rng(1)
    # long enough calls (1e5 elements, tier 2 runs without the GIL) to overlap
    arrays = [rng.standard_normal(100_000) * 2 for _ in range(4)]
    jitted(nb.tensor(arrays[0]))  # compiled before the threads start
    jitted(nb.tensor(arrays[0]))
    got: dict[int, list] = {}

    def work(k: int) -> None:
        got[k] = [jitted(nb.tensor(arrays[k]))[1].numpy().copy() for _ in range(20)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, a in enumerate(arrays):
        want = _eager(_steps_loop, a)[1]
        for g in got[k]:
            np.testing.assert_allclose(g, want, rtol=1e-12)


def test_scratch_slots_follow_swaps():
    f64 = np.dtype(np.float64)
    big = ((1 << 18,), f64, "")
    allocs = {"a": big, "b": big, "c": big, "d": ((4,), f64, "")}
    # a and b swap; b is returned: neither may be kept; c is internal; d is small
    assert store.scratch_slots(allocs, [("a", "b")], {"b"}) == ["c"]
    # a swap with a name the pool does not own (an input) rules the group out
    assert store.scratch_slots(allocs, [("c", "v0")], set()) == ["a", "b"]


def test_graphs_with_blas_products_have_scratch_too(small_scratch):
    """A BLAS product (the ``gemm`` native) writes into a pool buffer; its graph keeps
    scratch, and tier 2's results still survive later calls."""
    rng = np.random.default_rng(2)
    w = nb.tensor(rng.standard_normal((40, 40)))

    def loss(x):
        return (nb.tanh(x @ w) @ w).sum()

    jitted = nb.jit(nb.value_and_grad(loss), mode="compile")
    arrays = [rng.standard_normal((40, 40)) for _ in range(3)]
    kept = [jitted(nb.tensor(a)) for a in arrays]
    exes = next(iter(jitted._cache.values())).program.executables().values()
    assert any(getattr(getattr(x, "inner", x), "scratch_specs", None) for x in exes)
    assert "gemm" in jitted.source(nb.tensor(arrays[0]))
    for (value, grad), a in zip(kept, arrays, strict=True):
        want_value, want_grad = _eager(loss, a)
        assert value.item() == pytest.approx(want_value, rel=1e-12)
        np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-12)
