"""The fuzzer's argument layouts (nbgrad.testing.fuzz.layouts): jitted functions are
called on leaves that share one buffer in strided, reversed and transposed views, and the
results of earlier calls are checked again after the last one. Each test breaks an
executor the way such bugs look and checks that the fuzzer reports it."""

from __future__ import annotations

import numpy as np

import nbgrad as nb
from nbgrad.tensor import Tensor
from nbgrad.testing.fuzz import Leaf, Program, Step, check_program, layouts
from nbgrad.testing.fuzz import differential as diff_mod

#: x0 (3, 4) and x1 (4,): matmul and a sum, cheap under mode="reference"
PROGRAM = Program(nodes=(Leaf(shape=(3, 4), domain="real"), Leaf(shape=(4,), domain="real"),
                         Step(op="matmul", inputs=(0, 1), params=()),
                         Step(op="mul", inputs=(2,), params=(1.5, "right"))), seed=3)


def test_leaves_hold_the_values_in_one_shared_buffer():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in [(3, 4), (4,), (2, 3, 2), (), (0, 3)]]
    seen = set()
    for seed in range(12):
        ts, kinds = layouts.leaves(arrays, np.random.default_rng(seed))
        seen.update(kinds)
        bases = {id(t._data.base if t._data.base is not None else t._data) for t in ts
                 if t._data.size}
        assert len(bases) == 1  # every non-empty leaf views the one buffer
        for t, a, kind in zip(ts, arrays, kinds, strict=True):
            assert t.is_leaf and t.requires_grad
            np.testing.assert_array_equal(t.numpy(), a)
            if kind == "reversed":
                assert t._data.strides[0] < 0
            if kind in ("strided", "transposed"):
                assert not t._data.flags.c_contiguous
    assert seen == set(layouts.LAYOUTS)


def _reference_jit(transform):
    """A stand-in for nbgrad.jit: mode="reference", with ``transform`` applied to what
    the jitted function receives and returns (a broken executor)."""
    def make(fn, mode):
        inner = nb.jit(fn, mode="reference")

        def call(*xs):
            return transform(inner, xs)
        call._cache = {}
        return call
    return make


def test_an_executor_that_ignores_strides_is_caught(monkeypatch):
    """Reading an argument's memory in its own order (as code that assumes C order
    does) is right for contiguous leaves only."""
    def memory_order(inner, xs):
        bad = [Tensor._make(np.ravel(x._data, order="K").reshape(x.shape),
                            requires_grad=True) for x in xs]
        return inner(*bad)

    monkeypatch.setattr(diff_mod, "jit", _reference_jit(memory_order))
    found = check_program(PROGRAM, ("reference",))
    assert found, "a layout-blind executor passed"
    detail = found[0].detail
    assert "[arguments: x0 reversed" in detail or "[arguments: x0 transposed" in detail


def test_an_executor_that_reuses_its_output_buffer_is_caught(monkeypatch):
    """A result handed out on one call and overwritten by the next: each call alone is
    right; the results kept from earlier calls are not."""
    buffers: dict = {}

    def reused_output(inner, xs):
        ((out, loss),) = inner(*xs)
        buf = buffers.setdefault(out.shape, np.empty(out.shape))
        buf[...] = out.numpy()
        return ((Tensor._make(buf), loss),)

    monkeypatch.setattr(diff_mod, "jit", _reference_jit(reused_output))
    found = check_program(PROGRAM, ("reference",))
    assert [m.what for m in found] == [f"result of call 1, read after call {diff_mod.CALLS} "
                                       "(a later call wrote into it)"]
    assert found[0].call == diff_mod.CALLS


def test_the_unbroken_reference_executor_passes():
    assert check_program(PROGRAM, ("reference",)) == []
