"""Who owns what a PythonOp makes: its context, which is its own handle where the handle
leaves the run only as itself (``handles.SelfHandle``), and the arrays its user code
returns, which are the graph's values without a copy where nothing else can reach them
(``pythonop_run._alone_array``), copies where something can (a saved output, a returned input,
a view, a kept array)."""

from __future__ import annotations

import copy
import gc
import weakref

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import Function
from nbgrad.jit.trace import handles as htable
from nbgrad.jit.trace import pythonop


class Made(Function):
    """Square, remembering (weakly) the arrays its forward and backward return."""

    jit_path = "python"
    made: list = []

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        y = x * x
        Made.made.append(weakref.ref(y._data))
        return y

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        r = 2 * x * g
        Made.made.append(weakref.ref(r._data))
        return r


class Keeps(Function):
    """Returns ``x * 3`` or its input, keeping (per ``Keeps.how``) the output, a view of it
    or its array where later code can reach and modify them."""

    jit_path = "python"
    how = "saved"
    kept: list = []

    @staticmethod
    def forward(ctx, x):
        y = x * 3.0
        if Keeps.how == "saved":
            ctx.save_for_backward(y)
            Keeps.kept.append(ctx)
        elif Keeps.how == "view":
            Keeps.kept.append(y[1:])
        elif Keeps.how == "array":
            Keeps.kept.append(y.numpy())
        elif Keeps.how == "input":
            return x
        return y

    @staticmethod
    def backward(ctx, g):
        return 3.0 * g


@pytest.fixture(autouse=True)
def _no_leaked_contexts():
    yield
    Made.made.clear()
    Keeps.kept.clear()
    gc.collect()
    assert htable.live_contexts() == 0, htable.HANDLES.stats()


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_a_segmented_forward_returns_the_context_as_its_handle(mode):
    """Where the handle leaves the run only as itself, it is the context (no table entry,
    no weak reference): it lives as long as the outputs' backward node holds it."""
    jf = nb.jit(lambda t: Made.apply(t).sum(), mode=mode)
    x0 = np.linspace(-1.0, 1.0, 5)
    for _ in range(3):  # the trace, then the segmented runs
        x = nb.tensor(x0, requires_grad=True)
        jf(x).backward()
        np.testing.assert_array_equal(x.grad.numpy(), 2 * x0)
    assert next(iter(jf._cache.values())).executable("fwd").arrays_own
    refs = len(htable._OWNER_REFS)
    loss = jf(nb.tensor(x0, requires_grad=True))
    assert htable.live_contexts() == 1 and len(htable.HANDLES) == 0
    assert len(htable._OWNER_REFS) == refs
    (ctx,) = [r for r in loss.grad_fn.residuals if isinstance(r, htable.SelfHandle)]
    assert len(ctx.to_save) == 1
    del loss, ctx  # the context dies with the outputs (no collection needed)
    assert htable.live_contexts() == 0


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_a_backward_no_gradient_flows_through_takes_the_context(mode):
    """The backward of a PythonOp after ``sign`` (whose gradient is zero) has no
    PythonOpGrad node, but is still given the forward's context among its inputs: native
    code takes it as a handle array (fuzz seed 640020: tier 2 raised a TypeError)."""
    jf = nb.jit(lambda t: (Made.apply(nb.sign(t)) * 0.5).sum(), mode=mode)
    x0 = np.linspace(-1.0, 1.0, 6)
    for _ in range(3):  # the trace, then the segmented runs
        x = nb.tensor(x0, requires_grad=True)
        loss = jf(x)
        loss.backward()
        assert loss.item() == pytest.approx(0.5 * np.sum(np.sign(x0) ** 2))
        np.testing.assert_array_equal(x.grad.numpy(), np.zeros(6))
    del loss, x


def test_handles_read_by_native_code_become_table_entries():
    """A context given as its own handle to code that reads handles as numbers (a
    backward that does not run segmented) gets a handle array for the run."""
    from nbgrad.jit import segments

    ctx = htable.SelfHandle()
    twin = copy.copy(ctx)  # counted too
    assert htable.live_contexts() == 2
    del twin
    arr = htable.as_handle(ctx)
    assert arr.dtype == np.int64 and arr.shape == ()
    assert htable.HANDLES.get(int(arr), "f") is ctx
    assert htable.as_handle(arr) is arr
    del arr
    assert len(htable.HANDLES) == 0
    jf = nb.jit(lambda t: Made.apply(t).sum(), mode="interpret")
    x0 = np.linspace(-1.0, 1.0, 5)
    for _ in range(2):
        jf(nb.tensor(x0, requires_grad=True)).backward()
    entry = next(iter(jf._cache.values()))
    loss = jf(nb.tensor(x0, requires_grad=True))
    assert any(isinstance(r, htable.SelfHandle) for r in loss.grad_fn.residuals)
    saved, segments.ENABLED = segments.ENABLED, False
    try:  # the backward built again, not segmented: its tape reads the handle
        entry.program._exe.pop("bwd")
        x = nb.tensor(x0, requires_grad=True)
        loss = jf(x)
        loss.backward()
        bwd = entry.program._exe["bwd"]
        assert isinstance(bwd, htable.HandleInputs) and htable.owning(bwd) is bwd
    finally:
        segments.ENABLED = saved
    np.testing.assert_array_equal(x.grad.numpy(), 2 * x0)
    del ctx, loss


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_arrays_nothing_else_reaches_are_not_copied(mode):
    jf = nb.jit(lambda t: Made.apply(t), mode=mode)
    x0 = np.linspace(-1.0, 1.0, 5)
    for _ in range(3):
        Made.made.clear()
        y = jf(nb.tensor(x0))
        np.testing.assert_array_equal(y.numpy(), x0 * x0)
    assert y._data is Made.made[0]()  # the forward's own array
    jg = nb.jit(lambda t: Made.apply(t).sum(), mode=mode)
    for _ in range(2):
        jg(nb.tensor(x0, requires_grad=True)).backward()
    bwd = next(iter(jg._cache.values())).executable("bwd")
    (plan,) = [p for _, p, _, _, _ in bwd.steps if p is not None]
    ctx = pythonop.FunctionCtx()
    ctx.save_for_backward(nb.tensor(x0))
    handle = htable.HANDLES.owned(ctx, plan.name)
    Made.made.clear()
    (g,) = plan.run([handle, np.ones(5), x0 * x0])
    assert g is Made.made[0]()  # the backward's own array
    np.testing.assert_array_equal(g, 2 * x0)


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("how", ["saved", "view", "array", "input"])
def test_arrays_something_else_reaches_are_copied(mode, how):
    """Writing into what the forward kept, after the call, leaves the result alone (and
    writing into the result leaves the input alone)."""
    Keeps.how = how
    jf = nb.jit(lambda t: Keeps.apply(t), mode=mode)
    x0 = np.linspace(-1.0, 1.0, 5)
    want = x0 if how == "input" else 3.0 * x0
    for _ in range(3):
        x = nb.tensor(x0)
        y = jf(x)
        np.testing.assert_array_equal(y.numpy(), want)
        for kept in Keeps.kept:
            arr = kept.saved_tensors[0]._data if how == "saved" else \
                kept._data if how == "view" else kept
            arr[...] = 7.0
        Keeps.kept.clear()
        np.testing.assert_array_equal(y.numpy(), want)
        y._data[...] = -7.0
        np.testing.assert_array_equal(x.numpy(), x0)
