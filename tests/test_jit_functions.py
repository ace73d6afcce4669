"""Custom autograd.Functions inside nbgrad.jit: the native path and PythonOp / PythonOpGrad."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import Function
from nbgrad.autograd.function import once_differentiable
from nbgrad.jit.trace import handles as htable
from nbgrad.jit.trace import pythonop
from nbgrad.jit.trace.ir import FUNCTION, PYTHON_OP, PYTHON_OP_GRAD, check
from nbgrad.testing.fuzz.constructs import Softclip, SoftclipNumpy

RTOL = 1e-12


def _close(a, b, rtol=RTOL, atol=1e-13):
    a = a.numpy() if isinstance(a, nb.Tensor) else np.asarray(a)
    b = b.numpy() if isinstance(b, nb.Tensor) else np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def _entry(jf, *args):
    return jf._entry(args, {})


def _ops(graph) -> list[str]:
    return [n.op for n in graph.walk()]


def _find(graph, op):
    return [n for n in graph.walk() if n.op == op]


def _with_path(cls, path):
    """``cls`` forced onto a path ("native", "python") or left to decide ("auto")."""
    return type(f"{cls.__name__}_{path}", (cls,), {"jit_path": path})


@pytest.fixture(autouse=True)
def _no_leaked_contexts():
    """Every test ends with no PythonOp context alive."""
    yield
    gc.collect()
    assert htable.live_contexts() == 0, htable.HANDLES.stats()


# ------------------------------------------------------------------ W5: softclip
# Softclip (nbgrad ops, traceable) and SoftclipNumpy (NumPy, a PythonOp): the fuzzer's own
def _w5(fn_cls, steps=50):
    def f(x):
        for _ in range(steps):
            x = 0.9 * x + 0.1 * fn_cls.apply(x)
        return x.sum()
    return f


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("fn_cls, kind", [(Softclip, FUNCTION), (SoftclipNumpy, PYTHON_OP)])
def test_w5_values_and_gradients_equal_eager(rng, fn_cls, kind, mode):
    x0 = rng.standard_normal(1000) * 3.0
    f = _w5(fn_cls)
    xe = nb.tensor(x0, requires_grad=True)
    le = f(xe)
    le.backward()
    jf = nb.jit(f, mode=mode)
    for _ in range(3):  # the trace, then the compiled forward and backward
        x = nb.tensor(x0, requires_grad=True)
        loss = jf(x)
        loss.backward()
        _close(loss, le)
        _close(x.grad, xe.grad)
        assert htable.live_contexts() == 0  # released after each backward
    entry = _entry(jf, x)
    assert kind in _ops(entry.graph)
    fwd, bwd = entry.split().fwd, entry.split().bwd
    if kind == FUNCTION:  # inlined: the compiled forward and backward are table ops only
        assert not {FUNCTION, PYTHON_OP, PYTHON_OP_GRAD} & set(_ops(fwd) + _ops(bwd))
        assert "div" in _ops(fwd) and "div" in _ops(bwd)
        assert "PythonOp" not in jf.source(x)
    else:
        assert PYTHON_OP in _ops(fwd) and PYTHON_OP_GRAD in _ops(bwd)
    # the trace's 50 steps are one loop node, not 50 copies
    assert sum(1 for n in entry.graph.walk() if n.op == kind) == 1
    if mode == "compile":  # tier 2: one native call, calling back into Python for PythonOps
        exe_f, exe_b = entry.executable("fwd"), entry.executable("bwd")
        assert exe_f.tier == exe_b.tier == "compile"
        if kind == FUNCTION:
            assert exe_f.stats["fallbacks"] == exe_b.stats["fallbacks"] == []
        else:
            assert exe_f.stats["fallbacks"] == [PYTHON_OP]
            assert exe_b.stats["fallbacks"] == [PYTHON_OP_GRAD]
    else:  # tier 1: the Python code runs between native segments
        assert ("EAGER" in jf.source(x)) == (kind == PYTHON_OP)
    with nb.no_grad():
        _close(jf(nb.tensor(x0)), le.detach())
    assert htable.live_contexts() == 0


def test_native_path_uses_the_users_backward_not_the_autodiff_of_the_forward(rng):
    class RoundSTE(Function):  # straight-through: the table's derivative of round is 0
        @staticmethod
        def forward(ctx, x):
            return nb.round(x * 4.0) / 4.0

        @staticmethod
        def backward(ctx, g):
            return g * 1.0

    class SinWrongCos(Function):  # a deliberately "wrong" backward: 2 cos(x) for sin(x)
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return nb.sin(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2.0 * g * nb.cos(x)

    def f(x):
        return (RoundSTE.apply(x) * SinWrongCos.apply(x)).sum()

    x0 = rng.standard_normal(7)
    xe = nb.tensor(x0, requires_grad=True)
    f(xe).backward()
    jf = nb.jit(f)
    for _ in range(3):
        x = nb.tensor(x0, requires_grad=True)
        _close(jf(x), f(nb.tensor(x0)))
        jf(x).backward()
        _close(x.grad, xe.grad)
    assert _ops(_entry(jf, x).graph).count(FUNCTION) == 2
    assert PYTHON_OP not in _ops(_entry(jf, x).split().bwd)


# ------------------------------------------------------------------ attributes
class Everything(Function):
    """Tensor and non-tensor arguments of every kind; ``seen`` records what arrived."""

    seen: list = []

    @staticmethod
    def forward(ctx, x, k, s, it, ft, none, obj, y, flag):
        Everything.seen.append((k, s, it, ft, none, obj, flag, ctx.needs_input_grad))
        ctx.save_for_backward(x, y)
        ctx.k, ctx.s = k, s
        return x * y * (k * s + sum(it) + sum(ft)) + obj.offset

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        c = ctx.k * ctx.s + 6.5
        return g * y * c, None, None, None, None, None, None, g * x * c, None


class Offset:
    offset = 0.25


OBJ = Offset()


def _everything(cls):
    def f(x, y):
        return cls.apply(x, 3, 2.5, (1, 2), (0.5, 1.5), None, OBJ, y, True).sum()
    return f


@pytest.mark.parametrize("path", ["native", "python"])
def test_non_tensor_arguments_and_gradients_equal_eager(rng, path):
    cls = _with_path(Everything, path)
    f = _everything(cls)
    x0, y0 = rng.standard_normal(5), rng.standard_normal(5)
    xe, ye = nb.tensor(x0, requires_grad=True), nb.tensor(y0, requires_grad=True)
    le = f(xe, ye)
    le.backward()
    jf = nb.jit(f)
    Everything.seen.clear()
    for _ in range(3):
        x, y = nb.tensor(x0, requires_grad=True), nb.tensor(y0, requires_grad=True)
        loss = jf(x, y)
        loss.backward()
        _close(loss, le)
        _close(x.grad, xe.grad)
        _close(y.grad, ye.grad)
    for k, s, it, ft, none, obj, flag, _ in Everything.seen:  # exact types and identities
        assert (k, s, it, ft, none, flag) == (3, 2.5, (1, 2), (0.5, 1.5), None, True)
        assert type(k) is int and type(s) is float and obj is OBJ and flag is True
    assert all(s[-1] == (True,) + (False,) * 6 + (True, False) for s in Everything.seen)
    node = _find(_entry(jf, x, y).graph, FUNCTION if path == "native" else PYTHON_OP)[0]
    a = node.attrs
    assert a["name"].endswith("Everything_" + path)
    assert a["input_convention"] == "dccccccdc"
    assert a["input_requires_grads"] == (1, 1)
    assert a["input_tensor_types"] == (11, 11) and a["input_tensor_ranks"] == (1, 1)
    assert a["input_int_scalars"] == (3,) and a["input_int_scalar_positions"] == (1,)
    assert a["input_float_scalars"] == (2.5,) and a["input_float_scalar_positions"] == (2,)
    assert a["input_int_tuples"] == (1, 2) and a["input_int_tuple_positions"] == (3,)
    assert a["input_int_tuple_begins"] == (0,)
    assert a["input_float_tuples"] == (0.5, 1.5) and a["input_float_tuple_positions"] == (4,)
    assert [r.obj for r in a["input_pointer_scalars"]] == [None, OBJ, True]
    assert a["input_pointer_scalar_positions"] == (5, 6, 8)
    assert a["output_tensor_types"] == (11,) and a["output_tensor_ranks"] == (1,)


def test_python_op_and_grad_nodes_have_onnx_runtime_attributes(rng):
    f = _everything(_with_path(Everything, "python"))
    x = nb.tensor(rng.standard_normal(5), requires_grad=True)
    y = nb.tensor(rng.standard_normal((3, 5)).astype(np.float64))
    jf = nb.jit(f)
    jf(x, y).backward()
    entry = _entry(jf, x, y)
    (op,) = _find(entry.graph, PYTHON_OP)
    assert op.outputs[0].shape == () and op.outputs[0].dtype == np.int64  # the handle
    assert len(op.outputs) == 2 and op.outputs[1].shape == (3, 5)
    a = op.attrs
    assert a["input_requires_grads"] == (1, 0) and a["input_tensor_ranks"] == (1, 2)
    assert a["output_tensor_types"] == (11,) and a["output_tensor_ranks"] == (2,)
    assert a["output_tensor_requires_grads"] == (1,)
    assert a["training_mode"] == 1 and a["inplace"] == 0
    (grad,) = _find(entry.split().bwd, PYTHON_OP_GRAD)
    assert len(grad.inputs) == 3  # the handle, one output gradient, one output
    assert grad.inputs[0].dtype == np.int64 and grad.inputs[0].shape == ()
    g = grad.attrs
    assert g["name"] == a["name"] and g["output_convention"] == "dccccccdc"
    assert g["input_tensor_types"] == (11,) and g["input_tensor_ranks"] == (2,)
    assert g["input_tensor_requires_grads"] == (1,)
    assert g["output_tensor_requires_grads"] == (1, 0)  # only x requires grad
    assert g["output_tensor_types"] == (11,) and g["output_tensor_ranks"] == (1,)
    assert len(grad.outputs) == 1 and grad.outputs[0].shape == (5,)
    check(entry.split().fwd)
    check(entry.split().bwd)
    text = jf.graph(x, y)
    for word in ("PythonOp(", "PythonOpGrad(", "input_convention='dccccccdc'",
                 "input_pointer_scalars=(None, <Offset object #", "training_mode=1",
                 "output_convention=", "i64[]"):
        assert word in text, word


def test_a_redefined_function_class_gets_its_own_graph(rng):
    def make(scale):
        class Scale(Function):
            jit_path = "python"

            @staticmethod
            def forward(ctx, x):
                return nb.tensor(x.numpy() * scale)

            @staticmethod
            def backward(ctx, g):
                return g * scale
        return Scale

    x = nb.tensor(rng.standard_normal(4))
    first, second = make(2.0), make(3.0)
    (name0, k0), (name1, k1) = (pythonop.fn_ref(c).tag.rstrip(">").rsplit("#", 1)
                                for c in (first, second))
    assert name0 == name1 and name0.endswith("make.<locals>.Scale") and int(k1) == int(k0) + 1
    for mode in ("interpret", "compile"):
        j1 = nb.jit(lambda t: first.apply(t), mode=mode)
        j2 = nb.jit(lambda t: second.apply(t), mode=mode)
        for _ in range(2):
            _close(j1(x), x * 2.0)
            _close(j2(x), x * 3.0)


# ------------------------------------------------------------------ ctx features
class Pair(Function):
    """Two differentiable outputs and one marked non-differentiable; grads not
    materialised; gradients only where ``needs_input_grad``."""

    calls: list = []

    @staticmethod
    def forward(ctx, x, y):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, y)
        Pair.calls.append(("forward", ctx.needs_input_grad))
        c = x * 2.0
        ctx.mark_non_differentiable(c)
        return x * y, x + y, c

    @staticmethod
    def backward(ctx, ga, gb, gc):
        x, y = ctx.saved_tensors
        Pair.calls.append(("backward", ga is None, gb is None, gc is None))
        gx = gy = None
        if ctx.needs_input_grad[0]:
            gx = (ga * y if ga is not None else 0.0 * x) + (gb if gb is not None else 0.0)
        if ctx.needs_input_grad[1]:
            gy = (ga * x if ga is not None else 0.0 * y) + (gb if gb is not None else 0.0)
        return gx, gy


def _pair_loss(cls, use_a):
    def f(x, y):
        a, b, c = cls.apply(x, y)
        assert not c.requires_grad
        return ((a * 3.0).sum() if use_a else (b * b).sum()) + c.sum()
    return f


@pytest.mark.parametrize("path", ["native", "python"])
@pytest.mark.parametrize("use_a", [True, False])
def test_multiple_outputs_non_differentiable_materialize_and_needs_input_grad(rng, path,
                                                                             use_a):
    cls = _with_path(Pair, path)
    f = _pair_loss(cls, use_a)
    x0, y0 = rng.standard_normal(4), rng.standard_normal(4)
    xe, ye = nb.tensor(x0, requires_grad=True), nb.tensor(y0)
    Pair.calls.clear()
    le = f(xe, ye)
    le.backward()
    eager_calls = list(Pair.calls)
    assert eager_calls == [("forward", (True, False)), ("backward", not use_a, use_a, True)]
    jf = nb.jit(f)
    for _ in range(3):
        Pair.calls.clear()
        x = nb.tensor(x0, requires_grad=True)
        loss = jf(x, nb.tensor(y0))
        loss.backward()
        _close(loss, le)
        _close(x.grad, xe.grad)
    Pair.calls.clear()
    jf(nb.tensor(x0, requires_grad=True), nb.tensor(y0)).backward()
    if path == "python":  # exactly one forward and one backward call, as in eager mode
        assert Pair.calls == eager_calls
    else:  # natively nothing calls back into Python
        assert Pair.calls == []


class ArgsortScale(Function):
    """An integer output (marked non-differentiable) beside a float one, NumPy inside."""

    @staticmethod
    def forward(ctx, x, s):
        a = x.numpy()
        idx = nb.tensor(np.argsort(a).astype(np.int64))
        ctx.mark_non_differentiable(idx)
        ctx.s = s
        return idx, nb.tensor(a * s)

    @staticmethod
    def backward(ctx, gi, gy):
        return gy * ctx.s, None


@pytest.mark.parametrize("mode", ["interpret", "compile", "reference"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_integer_outputs_and_float32_in_every_tier(rng, mode, dtype):
    def f(x):
        idx, y = ArgsortScale.apply(x, 3.0)
        return (y * y).sum(), idx

    x0 = rng.standard_normal(6).astype(dtype)
    xe = nb.tensor(x0, requires_grad=True)
    le, ie = f(xe)
    le.backward()
    jf = nb.jit(f, mode=mode)
    rtol = 1e-12 if dtype == np.float64 else 1e-6
    for _ in range(3):
        x = nb.tensor(x0, requires_grad=True)
        loss, idx = jf(x)
        loss.backward()
        _close(loss, le, rtol=rtol)
        _close(idx, ie)
        _close(x.grad, xe.grad, rtol=rtol)


@pytest.mark.parametrize("path", ["native", "python"])
def test_function_inside_fori_loop(rng, path):
    cls = _with_path(Softclip, path)

    def f(x):
        return nb.fori_loop(0, 6, lambda i, v: 0.9 * v + 0.1 * cls.apply(v), x).sum()

    x0 = rng.standard_normal(9)
    xe = nb.tensor(x0, requires_grad=True)
    le = f(xe)
    le.backward()
    jf = nb.jit(f)
    for _ in range(3):
        x = nb.tensor(x0, requires_grad=True)
        loss = jf(x)
        loss.backward()
        _close(loss, le)
        _close(x.grad, xe.grad)


@pytest.mark.parametrize("path", ["native", "python"])
def test_gradients_computed_inside_the_jitted_function(rng, path):
    cls = _with_path(Softclip, path)

    def f(x):
        return nb.value_and_grad(lambda t: (cls.apply(t) * t).sum())(x)

    x0 = rng.standard_normal(6)
    want_v, want_g = f(nb.tensor(x0))
    jf = nb.jit(f)
    for _ in range(3):
        v, g = jf(nb.tensor(x0))
        _close(v, want_v)
        _close(g, want_g)
        assert htable.live_contexts() == 0  # the handle never left the run
    ops = _ops(_entry(jf, nb.tensor(x0)).graph)
    if path == "python":
        assert PYTHON_OP in ops and PYTHON_OP_GRAD in ops
    else:
        assert PYTHON_OP not in ops


# ------------------------------------------------------------------ context lifetime
def test_contexts_are_released_after_backward_and_kept_under_retain_graph(rng):
    f = _w5(SoftclipNumpy, steps=3)
    x0 = rng.standard_normal(5)
    xe = nb.tensor(x0, requires_grad=True)
    f(xe).backward()
    jf = nb.jit(f)
    jf(nb.tensor(x0, requires_grad=True)).backward()  # the trace; builds the backward
    assert htable.live_contexts() == 0
    x = nb.tensor(x0, requires_grad=True)
    loss = jf(x)
    assert htable.live_contexts() == 3  # one per step, waiting for the backward
    handles = list(htable.HANDLES._live)
    assert all(type(h) is int and 0 < h < 2 ** 40 for h in handles)  # counters, not addresses
    loss.backward(retain_graph=True)
    assert htable.live_contexts() == 3
    loss.backward()
    assert htable.live_contexts() == 0
    _close(x.grad, 2 * xe.grad)
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        loss.backward()


def test_contexts_are_released_when_the_outputs_die_without_backward(rng):
    jf = nb.jit(_w5(SoftclipNumpy, steps=4))
    x0 = rng.standard_normal(5)
    jf(nb.tensor(x0, requires_grad=True)).backward()
    loss = jf(nb.tensor(x0, requires_grad=True))
    assert htable.live_contexts() == 4
    del loss  # no backward: the JitBackward node dies with the output
    assert htable.live_contexts() == 0
    ys = [jf(nb.tensor(x0, requires_grad=True)) for _ in range(5)]
    assert htable.live_contexts() == 20
    ys[2].backward()
    assert htable.live_contexts() == 16
    del ys
    assert htable.live_contexts() == 0
    assert not htable._OWNER_REFS  # the weak references that released them went too


def test_handle_table_errors_name_the_function():
    table = htable.HandleTable()
    h = table.register(pythonop.FunctionCtx(), "mod.Fn")
    assert table.get(h, "mod.Fn") is not None and len(table) == 1
    table.release(h)
    assert len(table) == 0
    with pytest.raises(RuntimeError, match=r"mod\.Fn.*already released.*retain_graph=True"):
        table.get(h, "mod.Fn")
    assert table.register(pythonop.FunctionCtx(), "mod.Fn") == h + 1


def _rss_kib() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4


class _CountedSoftclip(SoftclipNumpy):
    """SoftclipNumpy, counting its forward calls (each makes a context)."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        _CountedSoftclip.calls += 1
        return SoftclipNumpy.forward(ctx, x)


@pytest.mark.parametrize("mode, calls", [("interpret", 10_000), ("compile", 2_000)])
def test_ten_thousand_calls_do_not_grow_contexts_or_memory(rng, mode, calls):
    jf = nb.jit(lambda t: (_CountedSoftclip.apply(t) * 2.0).sum(), mode=mode)
    x0 = rng.standard_normal(8)

    def run(n: int) -> None:
        for k in range(n):
            x = nb.tensor(x0, requires_grad=True)
            loss = jf(x)
            if k % 2:
                loss.backward()  # half with a backward, half dropped without one
            if k % 250 in (0, 1):  # (live_contexts() scans the collector's objects)
                assert htable.live_contexts() <= 1

    run(300)  # warm up: trace, backward graph, caches
    gc.collect()
    rss0 = _rss_kib()
    made0 = _CountedSoftclip.calls
    run(calls)
    gc.collect()
    assert htable.live_contexts() == 0
    assert _CountedSoftclip.calls - made0 == calls  # every call made a context
    assert _rss_kib() - rss0 < 8 * 1024  # KiB; a leaked context per call is ~20 MiB
    tracemalloc.start()  # and, allocation by allocation, over two shorter runs: a leak
    try:  # grows in both, a one-time resize of a shared dict (weakref's registry) in one
        snaps = [tracemalloc.take_snapshot()]
        for _ in range(2):
            run(1_000)
            gc.collect()
            snaps.append(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
    grown = [sum(s.size_diff for s in b.compare_to(a, "filename"))
             for a, b in zip(snaps[:-1], snaps[1:], strict=True)]
    assert min(grown) < 64 * 1024, grown  # bytes


# ------------------------------------------------------------------ errors
class Picky(Function):
    """Its forward refuses large values (NumPy code: a PythonOp)."""

    @staticmethod
    def forward(ctx, x):
        a = x.numpy()
        if np.abs(a).max() > 10:
            raise ValueError("input out of range")
        return nb.tensor(a * 2.0)

    @staticmethod
    def backward(ctx, g):
        if float(g.numpy().sum()) < 0:
            raise KeyError("negative gradient")
        return g * 2.0


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_user_exceptions_keep_their_type_and_name_the_function(rng, mode):
    jf = nb.jit(lambda t, w: (Picky.apply(t) * w).sum(), mode=mode)
    x = nb.tensor(rng.random(4), requires_grad=True)
    jf(x, nb.tensor(np.ones(4))).backward()
    jf(x, nb.tensor(np.ones(4))).backward()
    with pytest.raises(ValueError, match=r"Picky\.forward: input out of range"):
        jf(nb.tensor(np.full(4, 50.0), requires_grad=True), nb.tensor(np.ones(4)))
    loss = jf(x, nb.tensor(-np.ones(4)))
    with pytest.raises(KeyError, match=r"Picky\.backward.*negative gradient"):
        loss.backward()
    del loss
    with pytest.raises(ValueError, match=r"Picky\.forward"):  # also while tracing
        nb.jit(lambda t: Picky.apply(t))(nb.tensor(np.full(3, 20.0)))


class TooMany(Function):
    jit_path = "python"

    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0, g


class WrongShape(Function):
    @staticmethod
    def forward(ctx, x):
        return x.sum(dim=0)

    @staticmethod
    def backward(ctx, g):
        return nb.ones(7) * g.sum()


@pytest.mark.parametrize("fn_cls", [TooMany, WrongShape, _with_path(WrongShape, "python")])
def test_wrong_gradients_are_named_as_in_eager_mode(rng, fn_cls):
    x0 = rng.standard_normal((3, 4))
    with pytest.raises(RuntimeError) as eager:
        fn_cls.apply(nb.tensor(x0, requires_grad=True)).sum().backward()
    jf = nb.jit(lambda t: fn_cls.apply(t).sum())
    for _ in range(2):
        with pytest.raises(RuntimeError) as jitted:
            jf(nb.tensor(x0, requires_grad=True)).backward()
        assert str(jitted.value) == str(eager.value)
        assert fn_cls.__name__ in str(jitted.value)
    # the native path refused it (the backward failed while probing): a PythonOp
    assert PYTHON_OP in _ops(_entry(jf, nb.tensor(x0, requires_grad=True)).graph)


def test_forcing_the_native_path_explains_why_it_fails(rng):
    with pytest.raises(nb.TracerError, match=r"SoftclipNumpy_native cannot run natively.*"
                                              r"numpy\(\)"):
        nb.jit(lambda t: _with_path(SoftclipNumpy, "native").apply(t))(
            nb.tensor(rng.standard_normal(3)))


def test_unsupported_uses_are_clear_tracer_errors(rng):
    class Dirty(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class ReadsClosure(Function):
        @staticmethod
        def forward(ctx, x):
            return x * hidden[0]

        @staticmethod
        def backward(ctx, g):
            return g

    class Kw(Function):
        @staticmethod
        def forward(ctx, x, *, y):
            return x * y

        @staticmethod
        def backward(ctx, g):
            return g

    x = nb.tensor(rng.standard_normal(3))
    with pytest.raises(nb.TracerError, match="mark_dirty"):
        nb.jit(lambda t: Dirty.apply(t * 1.0))(x)
    hidden = []

    def f(t):
        hidden[:] = [t * 2.0]
        return ReadsClosure.apply(t)

    with pytest.raises(nb.TracerError, match="not one of its arguments"):
        nb.jit(f)(x)
    with pytest.raises(nb.TracerError, match="positional arguments"):
        nb.jit(lambda t: Kw.apply(t, y=t))(x)

    class Listed(Function):
        @staticmethod
        def forward(ctx, ts):
            return nb.tensor(ts[0].numpy() * 2.0)

        @staticmethod
        def backward(ctx, g):
            return None

    with pytest.raises(nb.TracerError, match="holds a traced tensor inside a list"):
        nb.jit(lambda t: Listed.apply([t]))(x)


# ------------------------------------------------------------------ double backward
class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3.0 * g * x * x


class CubeOnce(Cube):
    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3.0 * g * x * x


@pytest.mark.parametrize("path", ["native", "python"])
def test_double_backward_through_a_custom_function(rng, path):
    cls = _with_path(Cube, path)
    jf = nb.jit(lambda t: (cls.apply(t) * 2.0).sum())
    x0 = rng.standard_normal(5)
    for _ in range(3):
        _close(nb.grad(lambda t: nb.grad(jf)(t).sum())(nb.tensor(x0)), 12.0 * x0)
        x = nb.tensor(x0, requires_grad=True)
        (g,) = nb.autograd.grad(jf(x), x, create_graph=True)
        _close(g, 6.0 * x0 * x0)
        (gg,) = nb.autograd.grad(g.sum(), x)
        _close(gg, 12.0 * x0)
    assert (PYTHON_OP in _ops(_entry(jf, nb.tensor(x0, requires_grad=True)).graph)) == (
        path == "python")


def test_differentiating_a_python_op_backward_inside_jit_is_a_clear_error(rng):
    def f(t):
        return (_with_path(Cube, "python").apply(t) * 2.0).sum()

    x = nb.tensor(rng.standard_normal(3))
    with pytest.raises(nb.TracerError, match=r"backward of Cube_python inside nbgrad\.jit"):
        nb.jit(lambda t: nb.grad(lambda u: nb.grad(f)(u).sum())(t))(x)
    native = _with_path(Cube, "native")
    jf = nb.jit(lambda t: nb.grad(lambda u: nb.grad(lambda w: native.apply(w).sum())(u)
                                  .sum())(t))
    for _ in range(2):
        _close(jf(x), 6.0 * x)


@pytest.mark.parametrize("path", ["native", "python"])
def test_double_backward_through_once_differentiable_raises(rng, path):
    cls = _with_path(CubeOnce, path)
    x0 = rng.standard_normal(5)
    with pytest.raises(RuntimeError, match="once_differentiable") as eager:
        nb.grad(lambda t: nb.grad(lambda u: (cls.apply(u) * 2.0).sum())(t).sum())(
            nb.tensor(x0))
    jf = nb.jit(lambda t: (cls.apply(t) * 2.0).sum())
    x = nb.tensor(x0, requires_grad=True)
    jf(x).backward()  # first order works
    _close(x.grad, 6.0 * x0 * x0)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="once_differentiable") as jitted:
            nb.grad(lambda t: nb.grad(jf)(t).sum())(nb.tensor(x0))
        assert "CubeOnce" in str(jitted.value) and "CubeOnce" in str(eager.value)


@pytest.mark.parametrize("mode", ["compile", "interpret"])
def test_python_op_code_gets_numpys_own_dtype_objects(rng, mode):
    """Arrays from cached Numba code carry equal but unpickled dtype objects; the tensors
    handed to a PythonOp's forward and backward carry NumPy's own, so that the eager ops
    inside them take the lean path (it tests dtypes by identity)."""
    seen = []

    class Probe(Function):
        jit_path = "python"

        @staticmethod
        def forward(ctx, x):
            seen.append(x._data.dtype)
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            seen.append(g._data.dtype)
            (x,) = ctx.saved_tensors
            return 2.0 * x * g

    jf = nb.jit(lambda t: (Probe.apply(t * 1.5) * 3.0).sum(), mode=mode)
    x0 = rng.standard_normal(7)
    for _ in range(3):
        x = nb.tensor(x0, requires_grad=True)
        jf(x).backward()
        _close(x.grad, 13.5 * x0)
    assert seen and all(dt is np.dtype(np.float64) for dt in seen), seen
