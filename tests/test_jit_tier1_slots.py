"""Tier 1 reads large inputs in place and hands out its output arrays without a copy
(slots, :func:`nbgrad.jit.tier1.storage.place_outside`): the aliasing hazards, each
compared with eager on arrays of every layout. ``slots`` puts every input and output of
at least one element in a slot, so small arrays exercise the path."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.jit.tier1 import storage
from nbgrad.jit.tier1.tape import TapeExecutable


@pytest.fixture
def slots(monkeypatch):
    monkeypatch.setattr(storage, "OUTSIDE_MIN", 1)


def _tapes(f) -> list[TapeExecutable]:
    return [exe for entry in f._cache.values()
            for exe in entry.program.executables().values() if isinstance(exe, TapeExecutable)]


def _check(fn, *arrays, calls: int = 2, slots: bool = True) -> list:
    """``fn`` jitted on tier 1 gives eager's values (on every call, on the same
    arrays or tensors); returns the results of the first call (numpy) and checks the
    tape used slots."""
    f = nb.jit(fn, mode="interpret")
    args = [a if isinstance(a, nb.Tensor) else nb.tensor(a) for a in arrays]
    ref = fn(*args)
    ref = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
    first = None
    for _ in range(calls):
        got = f(*args)
        got = [g.numpy() for g in (got if isinstance(got, tuple) else (got,))]
        for g, r in zip(got, ref, strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-14, atol=0)
        first = first or got
    assert any(len(exe.ext) > 1 for exe in _tapes(f)) == slots  # the slot path ran
    return first


def test_results_of_a_call_survive_later_calls(slots):
    f = nb.jit(lambda x: (nb.exp(x) * 2.0, -x), mode="interpret")
    a, b = np.linspace(-1, 1, 7), np.linspace(3, 4, 7)
    f(nb.tensor(b))  # traced: the calls below run the tape
    r1 = f(nb.tensor(a))
    keep = [t.numpy().copy() for t in r1]
    r2 = f(nb.tensor(b))
    for t, k in zip(r1, keep, strict=True):
        np.testing.assert_array_equal(t.numpy(), k)
    np.testing.assert_array_equal(r2[1].numpy(), -b)
    assert not np.shares_memory(r1[0].numpy(), r2[0].numpy())


def test_saved_values_for_backward_survive_later_calls(slots):
    f = nb.jit(lambda x: (nb.sin(x) * nb.exp(x)).sum(), mode="interpret")
    a, b = np.linspace(-1, 1, 9), np.linspace(2, 3, 9)
    x1, x2 = nb.tensor(a, requires_grad=True), nb.tensor(b, requires_grad=True)
    for _ in range(2):  # the second pair of calls runs the tape
        l1 = f(x1)
        l2 = f(x2)
    (g1,) = nb.autograd.grad(l1, x1)
    (g2,) = nb.autograd.grad(l2, x2)
    for g, v in ((g1, a), (g2, b)):
        np.testing.assert_allclose(g.numpy(), np.exp(v) * (np.sin(v) + np.cos(v)), rtol=1e-13)


def test_same_array_twice_and_inputs_unchanged(slots):
    a = np.linspace(-2, 2, 11)
    keep = a.copy()
    x = nb.tensor(a)
    f = nb.jit(lambda p, q: (p * q + p, nb.tanh(q) - p), mode="interpret")
    for _ in range(2):
        got = f(x, x)
    np.testing.assert_allclose(got[0].numpy(), a * a + a, rtol=1e-15)
    np.testing.assert_allclose(got[1].numpy(), np.tanh(a) - a, rtol=1e-15)
    np.testing.assert_array_equal(a, keep)


def test_overlapping_views_as_two_inputs(slots):
    base = np.linspace(0, 1, 20)
    _check(lambda p, q: p * 3.0 - nb.exp(q), base[2:12], base[:10])


def test_an_input_returned_is_a_copy(slots):
    x = nb.tensor(np.arange(6.0))
    f = nb.jit(lambda t: (t, t.reshape(2, 3), t * 2.0), mode="interpret")
    for _ in range(2):
        got = f(x)
    for g in got:
        assert not np.shares_memory(g.numpy(), x.numpy())
    np.testing.assert_array_equal(got[1].numpy(), x.numpy().reshape(2, 3))


def test_one_value_returned_twice_gives_two_arrays(slots):
    a = np.arange(5.0)
    f = nb.jit(lambda x: (nb.exp(x), nb.exp(x), nb.exp(x).reshape(5, 1)), mode="interpret")
    for _ in range(2):
        got = [g.numpy() for g in f(nb.tensor(a))]
    assert not any(np.shares_memory(got[i], got[j]) for i in range(3) for j in range(i))
    np.testing.assert_array_equal(got[2].ravel(), np.exp(a))


_BASE = np.random.default_rng(1).standard_normal((6, 8))
#: tensors viewing another tensor's data (not C-contiguous but the first two)
_LAYOUTS = {
    "view_of_view": lambda t: t.reshape(-1)[5:40][3:],
    "readonly": lambda t: nb.from_numpy(np.frombuffer(_BASE.tobytes(), np.float64)),
    "strided": lambda t: t[:, ::3],
    "negative": lambda t: t[::-1, ::-2],
    "transposed": lambda t: t.T,
    "transposed_slice": lambda t: t.T[1:, ::2],
    "broadcast": lambda t: t.expand(3, 6, 8),
    "diagonal": lambda t: t.diagonal(),
}


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_input_layouts(slots, layout):
    x = _LAYOUTS[layout](nb.tensor(_BASE))
    assert layout in ("view_of_view", "readonly") or not x.numpy().flags.c_contiguous
    _check(lambda t: nb.sin(t) * 2.0 + t, x)


def test_zero_d_and_empty_inputs(monkeypatch):
    monkeypatch.setattr(storage, "OUTSIDE_MIN", 0)  # empty arrays still stay in the pool
    _check(lambda s, e, v: (nb.exp(s) * v, e * 2.0 + 1.0), np.array(0.5), np.zeros((0, 3)),
           np.arange(3.0))


def test_a_loop_carry_and_stacked_outputs(slots):
    def fn(x0, w):
        def body(i, x):
            return x * 0.5 + nb.tanh(w)
        return nb.fori_loop(0, 4, body, x0)
    _check(fn, np.linspace(-1, 1, 8), np.linspace(0, 2, 8))


def test_an_eager_step_between_native_segments(slots):
    # digamma runs as an eager step: it reads an input slot and writes an output slot
    _check(lambda x: (nb.digamma(x + 1.0) * 2.0, nb.digamma(x)), np.linspace(0.5, 3, 9))


def test_large_inputs_take_slots_without_the_fixture():
    n = storage.OUTSIDE_MIN
    a = np.linspace(-1, 1, n)[::-1]
    _check(lambda x, y: (nb.exp(x) * y, y[:1] * 2.0), a, np.ones(n))


def test_sin_and_cos_beyond_the_vector_range():
    # the dedicated loops compute vsin/vcos, then libm again where |x| > TRIG_MAX from
    # x itself: x (a dead temporary here) must not share the result's storage
    from nbgrad.kernels.vecmath import TRIG_MAX
    x = np.array([0.5, -2.0, TRIG_MAX * 3, -TRIG_MAX * 7.5, 1e300, 3.0, 1e22, -0.0])
    got = _check(lambda t: (nb.sin(t * 1.0) + 1.0, nb.cos(t + 0.0) * 2.0), x, slots=False)
    np.testing.assert_array_equal(got[0], np.sin(x) + 1.0)
    np.testing.assert_array_equal(got[1], np.cos(x) * 2.0)
