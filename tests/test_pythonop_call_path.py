"""The PythonOp call path's shortcuts (``pythonop.RunPlan.direct``/``one_out``, the
single-owner ``handles.settle``): values, gradients, errors and context lifetimes equal
the general path's in both tiers."""

from __future__ import annotations

import functools
import gc

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import Function
from nbgrad.jit.trace import handles as htable


class Square(Function):
    """The custom Function of ``perf.custom_function_overhead`` (reflected int scalar in
    its backward)."""

    jit_path = "python"

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class Shifty(Function):
    """Its output dtype depends on a value: float32 when the input's first element is
    negative (which inside nbgrad.jit must be refused, never passed on)."""

    jit_path = "python"

    @staticmethod
    def forward(ctx, x):
        y = x * 3
        return y.float() if float(x.numpy()[0]) < 0 else y

    @staticmethod
    def backward(ctx, g):
        if float(g.numpy()[0]) > 100:
            raise ZeroDivisionError("gradient too large")
        return 3 * g


@pytest.fixture(autouse=True)
def _no_leaked_contexts():
    yield
    gc.collect()
    assert htable.live_contexts() == 0, htable.HANDLES.stats()


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_values_and_gradients_equal_eager_bit_for_bit(mode):
    x0 = np.random.default_rng(0).standard_normal(100)
    xe = nb.tensor(x0, requires_grad=True)
    ye = Square.apply(xe)
    (ye * 1.5).sum().backward()
    jf = nb.jit(lambda t: (Square.apply(t) * 1.5).sum(), mode=mode)
    for k in range(4):  # the trace, then the compiled forward and backward
        x = nb.tensor(x0, requires_grad=True)
        loss = jf(x)
        assert htable.live_contexts() == (k > 0)  # the trace's contexts are gone
        loss.backward()
        assert htable.live_contexts() == 0
        np.testing.assert_array_equal(loss.numpy(), (ye * 1.5).sum().numpy())
        np.testing.assert_array_equal(x.grad.numpy(), xe.grad.numpy())


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_value_dependent_output_dtype_and_user_errors_are_clear(mode):
    jf = nb.jit(lambda t: Shifty.apply(t).sum(), mode=mode)
    x0 = np.linspace(1.0, 2.0, 5)
    for _ in range(3):
        x = nb.tensor(x0, requires_grad=True)
        jf(x).backward()
        np.testing.assert_array_equal(x.grad.numpy(), np.full(5, 3.0))
    with pytest.raises(RuntimeError, match=r"Shifty\.forward returned float32\[5\] as "
                                           r"output 0.*expects f64\[5\]"):
        jf(nb.tensor(-x0, requires_grad=True))
    loss = jf(nb.tensor(x0, requires_grad=True))
    with pytest.raises(ZeroDivisionError, match=r"Shifty\.backward: gradient too large"):
        loss.backward(nb.tensor(1000.0))
    del loss


def test_two_python_ops_in_one_graph_share_the_owner_array():
    """Several handles leaving one run through one residual array: the general branch of
    ``settle`` (each owner takes its own reference)."""
    jf = nb.jit(lambda t: Square.apply(Square.apply(t)).sum())
    x0 = np.array([0.5, -1.0, 2.0])
    for k in range(3):
        x = nb.tensor(x0, requires_grad=True)
        loss = jf(x)
        assert htable.live_contexts() == 2 * (k > 0)  # the trace's contexts are gone
        loss.backward(retain_graph=True)
        assert htable.live_contexts() == 2 * (k > 0)
        loss.backward()
        assert htable.live_contexts() == 0
        np.testing.assert_allclose(x.grad.numpy(), 2 * 4 * x0 ** 3, rtol=1e-15)  # two backwards
    loss = jf(nb.tensor(x0, requires_grad=True))
    del loss  # no backward: released with the outputs
    assert htable.live_contexts() == 0
    assert not htable._OWNER_REFS


class Cube(Function):
    """Records its calls (their order is the program's)."""

    jit_path = "python"
    calls: list = []

    @staticmethod
    def forward(ctx, x):
        Cube.calls.append("Cube")
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


class Twice(Function):
    jit_path = "python"

    @staticmethod
    def forward(ctx, x):
        Cube.calls.append("Twice")
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_python_ops_are_python_calls_between_native_segments(mode):
    """``nbgrad.jit.segments``: no objmode block, no eager step; native nodes in the
    earliest segment (two native calls around two PythonOps), PythonOps in program order."""
    from nbgrad.jit.segments import SegmentedExecutable

    def f(t):
        return (Cube.apply(t * 0.5) + Twice.apply(t * 3.0)).sum()

    x0 = np.linspace(-1.0, 2.0, 7)
    jf = nb.jit(f, mode=mode)
    for k in range(3):  # the trace, then the compiled forward and backward
        Cube.calls.clear()
        x = nb.tensor(x0, requires_grad=True)
        loss = jf(x)
        loss.backward()
        assert k == 0 or Cube.calls == ["Cube", "Twice"]  # once each, in order
        np.testing.assert_allclose(loss.item(), np.sum((x0 / 2) ** 3 + 6 * x0), rtol=1e-14)
        np.testing.assert_allclose(x.grad.numpy(), 0.375 * x0 ** 2 + 6.0, rtol=1e-14)
    entry = next(iter(jf._cache.values()))
    for role, calls in (("fwd", 2), ("bwd", 2)):
        exe = entry.executable(role)
        assert isinstance(exe, SegmentedExecutable) and exe.tier == mode
        assert exe.stats["python_calls"] == calls and exe.stats["segments"] <= 2
        assert "objmode(" not in exe.source() and "EAGER" not in exe.source()
    assert entry.executable("fwd").stats["segments"] == 2  # mul, mul | add, sum


def test_python_op_calls_are_thread_safe():
    import threading

    jf = nb.jit(lambda t: (Square.apply(t) * 1.5).sum(), mode="compile")
    jf(nb.tensor(np.ones(3), requires_grad=True)).backward()
    errors = []

    def work(k):
        try:
            for j in range(20):
                x0 = np.arange(3.0) + k + j
                x = nb.tensor(x0, requires_grad=True)
                jf(x).backward()
                np.testing.assert_array_equal(x.grad.numpy(), 3.0 * x0)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


class Failing(Function):
    """Its forward raises once ``Failing.armed`` is set (after the trace)."""

    jit_path = "python"
    armed = False

    @staticmethod
    def forward(ctx, x):
        if Failing.armed:
            raise ValueError("refused")
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def test_handles_owned_by_their_arrays_need_no_owner_scope():
    """``SegmentedExecutable.arrays_own``: where each handle leaves a run only as its own
    array, that array owns it from its creation (no owner scope in the generated code);
    a backward (PythonOpGrads only) has none either. Contexts are released with the
    arrays: after the backward, with the outputs, after an error."""
    from nbgrad.jit.segments import SegmentedExecutable

    jf = nb.jit(lambda t: Failing.apply(Square.apply(t) * 1.5).sum(), mode="interpret")
    x0 = np.array([0.5, -1.0, 2.0])
    for _ in range(2):
        x = nb.tensor(x0, requires_grad=True)
        loss = jf(x)
        assert htable.live_contexts() in (0, 2)  # (the trace's contexts are gone)
        loss.backward()
        np.testing.assert_allclose(x.grad.numpy(), 6.0 * x0, rtol=1e-15)
    assert htable.live_contexts() == 0
    entry = next(iter(jf._cache.values()))
    for role in ("fwd", "bwd"):
        exe = entry.executable(role)
        assert isinstance(exe, SegmentedExecutable) and exe.arrays_own
        assert "_Scope(" not in exe.text
    loss = jf(nb.tensor(x0, requires_grad=True))
    assert htable.live_contexts() == 2
    del loss  # no backward: released with the outputs
    assert htable.live_contexts() == 0
    Failing.armed = True
    try:
        with pytest.raises(ValueError, match="refused"):
            jf(nb.tensor(x0, requires_grad=True))  # Square's context made, then the error
    finally:
        Failing.armed = False
    gc.collect()
    assert htable.live_contexts() == 0
    # a PythonOp inside a loop's native code: the handles it makes need the owner scope
    jf2 = nb.jit(lambda t: Square.apply(nb.fori_loop(0, 2, lambda i, v: Square.apply(v) * 0.5,
                                                     t)).sum(), mode="interpret")
    for _ in range(2):
        x = nb.tensor(x0, requires_grad=True)
        jf2(x).backward()
        np.testing.assert_allclose(x.grad.numpy(), x0 ** 7 / 8, rtol=1e-14)
    fwd = next(iter(jf2._cache.values())).executable("fwd")
    assert not fwd.arrays_own and "_Scope(" in fwd.text


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_segmented_step_runners_take_any_layout_and_name_the_function(mode):
    """The runners of a segmented run's PythonOp and PythonOpGrad steps: the common input
    (a C-contiguous array of the node's dtype) and odd ones (a list, another dtype, a
    strided view, another shape of the same size) give the same values; a result of the
    wrong dtype and a user error raise, naming the Function."""
    from nbgrad.jit.trace.pythonop_run import run_backward, run_forward

    jf = nb.jit(lambda t: Shifty.apply(t).sum(), mode=mode)
    x0 = np.linspace(1.0, 2.0, 5)
    for _ in range(3):
        jf(nb.tensor(x0, requires_grad=True)).backward()
    entry = next(iter(jf._cache.values()))
    (fstep,) = [s for s in entry.executable("fwd").steps if s[1] is not None]
    (bstep,) = [s for s in entry.executable("bwd").steps if s[1] is not None]
    fplan, bplan = fstep[1], bstep[1]
    assert (fstep[0], bstep[0]) == (fplan.run, bplan.run)
    # the common input takes the runners' inline copy, the odd ones the general one
    frun = functools.partial(run_forward, fplan)
    brun = functools.partial(run_backward, bplan)
    h0, y0 = frun([x0])
    (g0,) = brun([h0, np.ones(5), y0])
    for arg in (x0, list(x0), np.linspace(1.0, 2.0, 9)[::2], x0.reshape(1, 5)):
        h, y = frun([arg])
        np.testing.assert_array_equal(y, y0)
        assert y.dtype == y0.dtype and y.flags.c_contiguous
        for g in (np.ones(5), list(np.ones(5)), np.full(5, 1.0, np.float32)):
            np.testing.assert_array_equal(brun([h, g, y])[0], g0)
        del h
    with pytest.raises(RuntimeError, match=r"Shifty\.forward returned float32\[5\]"):
        frun([-x0])  # a value-dependent dtype
    with pytest.raises(ZeroDivisionError, match=r"Shifty\.backward: gradient too"):
        brun([h0, np.full(5, 1000.0), y0])  # a user error
    with pytest.raises(ValueError, match=r"PythonOp of .*Shifty: 2 inputs, the node has 1"):
        frun([x0, x0])
    del h0
    gc.collect()
    assert htable.live_contexts() == 0
