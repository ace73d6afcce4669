"""The lean dispatch path (``dispatch.lean_path``) and the compiled backwards
(``record.compile_backward``) give exactly what the general path gives: values, dtypes,
graphs, gradients and errors, and the lean path is taken only in its common case."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbgrad as nb
from nbgrad.autograd import engine, record
from nbgrad.kernels import elementwise as ew
from nbgrad.ops import dispatch
from nbgrad.ops.registry import REGISTRY, not_lean


class _NoNode:
    """No node is of this type: in place of ``engine.OpNode``, it turns the engine's
    inlined common case off (every node through ``GraphTask.execute``)."""


def _general(monkeypatch) -> None:
    """Turn the lean path, the compiled recorders and backwards and the engine's inlined
    common case off: every op and node takes the general path."""
    for op in list(REGISTRY.values()):
        monkeypatch.setattr(op, "lean", None)
        monkeypatch.setattr(op, "lean_apply", not_lean)
        monkeypatch.setattr(op, "lean_reflected", not_lean)
        monkeypatch.setattr(op, "run_record", None)
        if op.entry is not None:
            monkeypatch.setattr(op, "run_backward", record.run_formulas)
    monkeypatch.setattr(dispatch, "_recorder", record._record_general)
    monkeypatch.setattr(dispatch, "apply_lean_inplace", lambda *args: None)
    monkeypatch.setattr(engine, "OpNode", _NoNode)


@contextlib.contextmanager
def general_path():
    """``_general`` for the length of a ``with`` block."""
    with pytest.MonkeyPatch.context() as mp:
        _general(mp)
        yield


def _spy(monkeypatch) -> list:
    """Count the ops applied on their lean paths (``OpDef.lean_apply`` and
    ``lean_reflected`` answering a tensor)."""
    calls: list = []
    for op in list(REGISTRY.values()):
        for path in ("lean_apply", "lean_reflected"):
            real = getattr(op, path)
            if real is not not_lean:
                def counted(*args, _path=real, _name=op.name):
                    out = _path(*args)
                    if out is not None:
                        calls.append(_name)
                    return out
                monkeypatch.setattr(op, path, counted)
    return calls


def _data(dtype, seed: int, shape=(3, 4)):
    return np.random.default_rng(seed).uniform(0.5, 2.0, shape).astype(dtype)


# (name, function of two tensors (or a tensor and a float), differentiable)
BINARY = [
    ("mul", lambda a, b: a * b, True),
    ("add", lambda a, b: a + b, True),
    ("sub", lambda a, b: a - b, True),
    ("rsub-scalar", lambda a, b: 1.5 - a, True),
    ("div", lambda a, b: a / b, True),
    ("pow", lambda a, b: a ** b, True),
    ("mul-scalar", lambda a, b: a * 1.0001 + 0.001, True),
    ("div-scalar", lambda a, b: a / 3.0, True),
    ("maximum", lambda a, b: nb.maximum(a, b), True),
    ("exp-neg", lambda a, b: nb.exp(-a) * nb.tanh(b), True),
    ("lt", lambda a, b: a < b, False),
    ("add-alpha", lambda a, b: nb.add(a, b, alpha=2.0), True),
    # int and bool scalars (weak: a float32 tensor stays float32), reflected operators
    ("mul-int", lambda a, b: a * 3 - 2, True),
    ("pow-int", lambda a, b: a ** 2, True),
    ("add-bool", lambda a, b: a + True, True),
    ("rmul-int", lambda a, b: 2 * a, True),
    ("radd-float", lambda a, b: 0.25 + a, True),
    ("rsub-int", lambda a, b: 1 - a, True),
    ("rdiv-int", lambda a, b: 3 / a, True),
    ("rdiv-float", lambda a, b: 1.5 / a, True),
    ("rmul-bool", lambda a, b: True * a, True),
    ("lt-int", lambda a, b: a < 1, False),
]


def _run(fn, a_np, b_np, requires_grad: bool):
    a = nb.tensor(a_np, requires_grad=requires_grad)
    b = nb.tensor(b_np, requires_grad=requires_grad) if isinstance(b_np, np.ndarray) else b_np
    out = fn(a, b)
    node = out.grad_fn
    graph = None if node is None else (node.name(), [
        None if f is None else f.name() for f, _ in node.next_functions])
    grads = None
    if requires_grad and out.requires_grad:
        g = nb.tensor(np.random.default_rng(7).standard_normal(out.shape).astype(out.dtype))
        inputs = [a] + ([b] if isinstance(b, nb.Tensor) else [])
        grads = [None if x is None else (x.numpy().copy(), x.dtype)
                 for x in nb.autograd.grad(out, inputs, g, allow_unused=True)]
    return out.numpy().copy(), out.dtype, out.requires_grad, graph, grads


def _same(lean, general) -> None:
    value, dtype, req, graph, grads = lean
    value2, dtype2, req2, graph2, grads2 = general
    assert dtype == dtype2 and req == req2 and graph == graph2
    np.testing.assert_array_equal(value, value2)  # bit for bit, NaNs in place
    assert (grads is None) == (grads2 is None)
    for g, g2 in zip(grads or (), grads2 or (), strict=True):
        assert (g is None) == (g2 is None)
        if g is not None:
            assert g[1] == g2[1]
            np.testing.assert_array_equal(g[0], g2[0])


@pytest.mark.parametrize("name,fn,diff", BINARY, ids=[c[0] for c in BINARY])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lean_path_matches_the_general_path(monkeypatch, name, fn, diff, dtype):
    a, b = _data(dtype, 1), _data(dtype, 2)
    calls = _spy(monkeypatch)
    lean = [_run(fn, a, b, rg) for rg in (False, True)]
    assert calls, f"{name}: the lean path was not taken"
    monkeypatch.undo()
    _general(monkeypatch)
    general = [_run(fn, a, b, rg) for rg in (False, True)]
    for x, y in zip(lean, general, strict=True):
        _same(x, y)


@pytest.mark.parametrize("case", ["scalar-tensor", "same-shape", "large", "bias",
                                  "large-bias", "column"])
def test_lean_shapes_match_the_general_path(monkeypatch, case):
    shape = {"large": (5000,), "large-bias": (1000, 6), "column": (300, 4)}.get(case, (2, 3))
    a = _data(np.float64, 3, shape)
    b = _data(np.float64, 4, {"scalar-tensor": (), "bias": (3,), "large-bias": (6,),
                              "column": (300, 1)}.get(case, a.shape))
    if case in ("bias", "large-bias", "column"):  # ``h + bias``: the lean path broadcasts
        calls = _spy(monkeypatch)
        _run(lambda x, y: x * y, a, b, False)
        assert calls == ["mul"]
        monkeypatch.undo()
    fn = (lambda x, y: (x * y - y) / x)  # noqa: E731
    lean = _run(fn, a, b, True)
    _general(monkeypatch)
    _same(lean, _run(fn, a, b, True))


def test_general_path_outside_the_common_case(monkeypatch):
    """Mixed dtypes, integers, broadcasting, non-contiguous and 0-d-first operands,
    Python ints not exact in float64, NumPy scalars and reflected ``**`` take the general
    path (NumPy promotion), with the same results."""
    calls = _spy(monkeypatch)
    x64 = nb.tensor(_data(np.float64, 5))
    x32 = nb.tensor(_data(np.float32, 6))
    ints = nb.tensor(np.arange(12).reshape(3, 4))
    row = nb.tensor(_data(np.float64, 7, (4,)))
    cases = [x64 + x32, x32 * (2 ** 53 + 1), ints * 1.5, row * x64, x64.T * 2.0,
             nb.tensor(2.0) * x64, x64 * np.float64(2.0), nb.exp(ints),
             -(2 ** 60) * x32, np.float32(2.0) * x32, 2 ** x64, 2 * x64.T, 2 * ints]
    assert calls == []  # (``row * x64``: the result is wider than the left operand)
    assert [c.dtype for c in cases] == [np.float64, np.float32, np.float64, np.float64,
                                        np.float64, np.float64, np.float64, np.float64,
                                        np.float32, np.float32, np.float64, np.float64,
                                        np.int64]


def test_int_and_bool_scalars_keep_a_float_tensors_dtype(monkeypatch):
    """As in PyTorch (and NumPy's weak scalars): ``float32 op int`` is float32, on the
    lean path, both ways round."""
    calls = _spy(monkeypatch)
    x = nb.tensor(np.array([0.5, -1.5, 3.0], np.float32))
    for y in (x * 2, 2 * x, x + True, 1 - x, 3 / x, x ** 2, x - 2 ** 53):
        assert y.dtype == np.float32
    assert len(calls) == 7
    np.testing.assert_array_equal((1 - x).numpy(), np.float32(1) - x.numpy())
    np.testing.assert_array_equal((3 / x).numpy(), np.float32(3) / x.numpy())


def test_hooks_turn_the_lean_path_off(monkeypatch):
    """Anomaly mode, forward-mode levels and the jit tracer see every op."""
    calls = _spy(monkeypatch)
    x = nb.tensor(_data(np.float64, 8), requires_grad=True)
    with nb.autograd.detect_anomaly():
        x * 2.0
    _, tangent = nb.jvp(lambda v: v * 3.0, (x,), (nb.ones_like(x),))
    np.testing.assert_array_equal(tangent.numpy(), np.full(x.shape, 3.0))
    batched = nb.vmap(lambda v: v * 2.0)(x)
    np.testing.assert_array_equal(batched.numpy(), x.detach().numpy() * 2.0)
    batched = nb.vmap(lambda v: 1 - 2 * v)(x)  # reflected operators, int scalars
    np.testing.assert_array_equal(batched.numpy(), 1.0 - 2.0 * x.detach().numpy())
    _, tangent = nb.jvp(lambda v: 3 * v, (x,), (nb.ones_like(x),))
    np.testing.assert_array_equal(tangent.numpy(), np.full(x.shape, 3.0))
    assert calls == []


def test_lean_errors_match_the_general_path(monkeypatch):
    x = nb.tensor(_data(np.float64, 9))
    bad = [lambda: x * "a", lambda: x + nb.tensor(_data(np.float64, 1, (2, 5))),
           lambda: nb.exp("a")]
    lean = []
    for f in bad:
        with pytest.raises(Exception) as info:
            f()
        lean.append((type(info.value), str(info.value)))
    _general(monkeypatch)
    for f, (kind, message) in zip(bad, lean, strict=True):
        with pytest.raises(kind) as info:
            f()
        assert str(info.value) == message


def test_compiled_backward_checks_saved_versions():
    x = nb.tensor(_data(np.float64, 10), requires_grad=True)
    y = x * 1.0
    out = (y * y).sum()
    y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (0,), (7, 9, 11)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_whole_sum_shortcuts_match_the_general_reduction(shape, dtype):
    from nbgrad.ops import reduction

    x = (np.random.default_rng(11).standard_normal(shape) * 1e3).astype(dtype)
    whole = reduction.reduce_sum(x, None, False)
    general = reduction.reduce_sum(x, tuple(range(x.ndim)), False)
    assert whole.shape == general.shape == () and whole.dtype == general.dtype
    assert whole.tobytes() == general.tobytes()
    g = np.asarray(1.25, dtype)
    back = reduction._sum_backward_kernel(g, shape, None, False)
    want = np.broadcast_to(g.reshape((1,) * len(shape)), shape).copy()
    assert back.shape == want.shape and back.dtype == want.dtype and back.flags.c_contiguous
    np.testing.assert_array_equal(back, want)


def test_signed_zero_scalars_keep_their_sign():
    """-0.0 == 0.0 and hashes alike: the scalar caches must not hand one for the other."""
    for dtype in (np.float64, np.float32):
        x = nb.tensor(np.array([1.0, -1.0], dtype))
        for scalar in (0.0, -0.0, 0.0, dtype(-0.0), dtype(0.0)):
            want = np.array([1.0, -1.0], dtype) * np.asarray(scalar, dtype)
            assert (x * scalar).numpy().tobytes() == want.tobytes(), (dtype, scalar)
            assert (scalar * x).numpy().tobytes() == want.tobytes(), (dtype, scalar)


def test_wrap_array_is_make():
    """The lean path's ``wrap_array`` sets every slot as ``Tensor._make`` does."""
    from nbgrad.tensor import Tensor, wrap_array

    data = np.arange(3.0)
    a, b = wrap_array(data), Tensor._make(data)
    for name in Tensor.__slots__:
        if name not in ("__weakref__", "_data"):
            assert getattr(a, name) == getattr(b, name), name
    assert a._data is b._data is data and a._version_box is not b._version_box


# ------------------------------------------------------- random programs, both paths
#: element values: signed zeros, and numbers whose products and quotients round
VALUES = [0.0, -0.0, 0.5, -1.25, 2.0, 3.0, -0.3, 7.1]
#: broadcast against each other; "T" is a transposed (not C-contiguous) (2, 3)
SHAPES = [(2, 3), (3,), (2, 1), (), "T"]
SCALARS = [0.0, -0.0, 1.5, -2.0, 0.1, 1, 0, -3, 2 ** 53, 2 ** 53 + 1, True, False]
PROGRAM_OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "pow": lambda a, b: nb.abs(a) ** b,
    "nb.mul": lambda a, b: nb.mul(a, b), "nb.add-alpha": lambda a, b: nb.add(a, b, alpha=2),
    "maximum": lambda a, b: nb.maximum(a, b) if isinstance(b, nb.Tensor) else a,
    "rsub": lambda a, b: 1.5 - a, "neg": lambda a, b: -a, "exp": lambda a, b: nb.exp(a),
    # reflected: ``b op a`` (a Python scalar ``b`` on the left)
    "radd": lambda a, b: b + a, "rsub-b": lambda a, b: b - a, "rmul": lambda a, b: b * a,
    "rdiv": lambda a, b: b / a, "lt": lambda a, b: a < b,
    "tanh": lambda a, b: nb.tanh(a), "sum-keep": lambda a, b: a.sum(0, keepdim=True)
    if a.ndim else a,
    "unbind-last": lambda a, b: a.unbind(0)[-1] if a.ndim else a,  # several outputs
    # an in-place change of a tensor that nodes may have saved (version counters)
    "mul_": lambda a, b: a.mul_(2.0) if a.grad_fn is not None or not a.requires_grad else a,
    "use-then-mul_": lambda a, b: _use_then_modify(a, b),
    "hook": lambda a, b: _hooked(a),  # a tensor hook: the engine's general step
    "no_grad": lambda a, b: _no_grad_mul(a, b),
    "clamp-min": lambda a, b: nb.clamp(a, min=b) if isinstance(b, nb.Tensor) else a,
    "where": lambda a, b: nb.where(a > 0.0, a, b),
}


def _use_then_modify(a, b):
    out = a * b  # saves a (for b's gradient)
    if a.grad_fn is not None or not a.requires_grad:
        a.mul_(2.0)  # a saved tensor changed: a gradient through ``out`` raises
    return out


def _hooked(a):
    if a.requires_grad and a.grad_fn is not None:
        a.register_hook(lambda g: g * 2.0)
    return a


def _no_grad_mul(a, b):
    with nb.no_grad():
        return a * b


#: the steps of the second random test: in-place changes, hooks, no_grad, optionals
STATEFUL_OPS = ["use-then-mul_", "mul_", "hook", "no_grad", "mul", "add", "tanh", "where",
                "clamp-min", "exp", "rmul", "rsub-b"]


@st.composite
def _programs(draw, ops=None):
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        shape = draw(st.sampled_from(SHAPES))
        n = 6 if shape == "T" else int(np.prod(shape))
        values = draw(st.lists(st.sampled_from(VALUES), min_size=n, max_size=n))
        other = draw(st.sampled_from([None, None, None, np.float32, np.float64]))
        inputs.append((shape, values, other or dtype,
                       draw(st.sampled_from([True, True, True, False]))))
    steps = draw(st.lists(st.tuples(st.sampled_from(ops or sorted(PROGRAM_OPS)),
                                    st.integers(0, 9),
                                    st.one_of(st.integers(0, 9), st.sampled_from(SCALARS))),
                          min_size=1, max_size=6))
    return inputs, steps, draw(st.booleans()), draw(st.sampled_from([False, False, True]))


def _bits(t) -> tuple | None:
    """A tensor as exactly comparable data: dtype, shape, bytes (signed zeros, NaNs)."""
    if t is None:
        return None
    a = t.detach().numpy()
    return str(a.dtype), a.shape, np.ascontiguousarray(a).tobytes(), t.requires_grad


def _execute(program) -> list:
    """Values, gradients (``grad``, then ``backward`` into ``.grad``) and, with
    ``double``, gradients of gradients of a random program, in anomaly mode with
    ``anomaly``; an error as its message."""
    inputs, steps, double, anomaly = program
    if anomaly:
        with warnings.catch_warnings(), nb.autograd.detect_anomaly():
            warnings.simplefilter("ignore")
            return _execute((inputs, steps, double, False))
    leaves = []
    for shape, values, dtype, requires_grad in inputs:
        if shape == "T":
            data = np.array(values, dtype).reshape(3, 2).T
        else:
            data = np.array(values, dtype).reshape(shape)
        leaves.append(nb.tensor(data, requires_grad=requires_grad))
    pool = list(leaves)
    try:
        for name, i, j in steps:
            other = pool[j % len(pool)] if type(j) is int else j
            pool.append(PROGRAM_OPS[name](pool[i % len(pool)], other))
        seen = [_bits(t) for t in pool]
        out = pool[-1]
        wrt = [t for t in leaves if t.requires_grad]
        if not (out.requires_grad and wrt):
            return seen
        rng = np.random.default_rng(0)
        g = nb.tensor(rng.choice(VALUES, out.shape).astype(out.dtype))
        grads = nb.autograd.grad(out, wrt, g, allow_unused=True, retain_graph=True,
                                 create_graph=double)
        seen += [_bits(x) for x in grads]
        if double:
            total = [(x * x).sum() for x in grads if x is not None and x.requires_grad]
            if total:
                seen += [_bits(x) for x in nb.autograd.grad(
                    sum(total[1:], total[0]), wrt, allow_unused=True)]
        else:
            out.backward(g)
            seen += [_bits(t.grad) for t in wrt]
        return seen
    except Exception as exc:  # both paths must fail alike
        return [type(exc).__name__, str(exc)]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(_programs())
def test_random_programs_match_the_general_path(program):
    """Random short programs of small ops (broadcast shapes, transposed and 0-d operands,
    signed zeros, Python scalars, mixed dtypes, double backward) give bit for bit the
    same values, gradients and errors on the lean path as on the general path."""
    lean = _execute(program)
    with general_path():
        general = _execute(program)
    assert lean == general


@settings(max_examples=40, deadline=None, derandomize=True)
@given(_programs(STATEFUL_OPS))
def test_random_stateful_programs_match_the_general_path(program):
    """The same for programs that change saved tensors in place (version counters),
    register tensor hooks, run steps under no_grad and pass optional tensors."""
    lean = _execute(program)
    with general_path():
        general = _execute(program)
    assert lean == general


def test_nan_operands_do_not_fill_the_constant_caches():
    """A NaN key is never found again (NaN != NaN): caching it would fill the tables
    (1024 entries) and stop every later constant from being cached."""
    x = nb.tensor(np.ones(3))
    before = len(dispatch._SCALARS), sum(len(t) for t in dispatch._CONSTANTS.values())
    for _ in range(50):
        y = x * float("nan")
        z = x.double() + float("nan")
    assert np.isnan(y.numpy()).all() and np.isnan(z.numpy()).all()
    after = len(dispatch._SCALARS), sum(len(t) for t in dispatch._CONSTANTS.values())
    assert after == before


def test_quiet_ufunc_calls_the_ufunc_directly_with_warnings_off():
    """``elementwise._quieted``: the lean path's ufunc call (``quiet_ufunc``) is a closure
    over the ufunc (no ``out`` keyword unless given), NumPy's warnings off during the call
    only; its tables hold the quiet calls themselves."""
    seen = []

    def stub(*args, **kwargs):
        seen.append((len(args), kwargs, np.geterr()))
        return args[0]

    call = ew._quieted(stub)
    a = np.ones(3)
    with np.errstate(all="raise"):
        assert call(a, a) is a
        assert call(a, out=a) is a
        assert np.geterr()["over"] == "raise"  # restored after each call
    assert seen[0][:2] == (2, {}) and seen[1][:2] == (1, {"out": a})
    assert all(set(err.values()) == {"ignore"} for _, _, err in seen)
    assert ew.quiet_ufunc("mul") is ew._UFUNCS["mul"]
    with np.errstate(all="raise"):  # the real ufunc: overflow and 0/0 quietly, IEEE values
        big = np.full(4, 1e308)
        np.testing.assert_array_equal(ew.quiet_ufunc("mul")(big, big), np.full(4, np.inf))
        assert np.isnan(ew.quiet_ufunc("div")(np.zeros(2), np.zeros(2))).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", ["add_", "sub_", "mul_", "div_"])
def test_in_place_ops_without_gradients_write_in_place_as_the_general_path(
        monkeypatch, name, dtype):
    """``x.sub_(y)`` where no gradient is involved writes through the op's ufunc into
    ``x``'s memory: the same bits as the general path (compute, then copy in), for
    tensors of ``x``'s shape, broadcast rows, 0-d tensors, Python floats and ints (weak
    scalars: a float32 tensor stays float32), under ``no_grad`` on a leaf that requires
    grad too; the version counter shared with views goes up and views see the values."""
    operands = [_data(dtype, 8), _data(dtype, 9, (4,)), _data(dtype, 10, ()), 0.3, 3, True]

    def run(lean: bool) -> list:
        results = []
        for y in operands:
            x = nb.tensor(_data(dtype, 11), requires_grad=True)
            view = x[1]
            version = x._version
            other = nb.tensor(y) if isinstance(y, np.ndarray) else y
            memory = x._data
            with nb.no_grad():
                out = getattr(x, name)(other)
            assert out is x and x._data is memory and x.dtype == dtype
            assert x._version == version + 1 and view._version == version + 1
            np.testing.assert_array_equal(view.numpy(), x.numpy()[1])
            results.append(x.numpy().copy())
        return results

    calls = []
    real = dispatch.apply_lean_inplace
    monkeypatch.setattr(dispatch, "apply_lean_inplace",
                        lambda *args: calls.append(1) or real(*args))
    lean = run(True)
    assert calls and all(c == 1 for c in calls)
    monkeypatch.undo()
    _general(monkeypatch)
    for got, want in zip(lean, run(False), strict=True):
        np.testing.assert_array_equal(got, want)


def test_in_place_ops_with_gradients_or_odd_operands_keep_the_general_path():
    """Where a gradient is involved, or the operand is of another dtype, wider than the
    tensor or not a weak scalar, the general path runs: it records the graph, promotes,
    and raises its errors."""
    x = nb.tensor(_data(np.float64, 12), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        x.mul_(2.0)
    h = x * 1.0
    h.mul_(3.0)
    assert h.grad_fn is not None and h.grad_fn.name() == "MulBackward"
    (g,) = nb.autograd.grad(h.sum(), [x])
    np.testing.assert_array_equal(g.numpy(), np.full((3, 4), 3.0))
    y = nb.tensor(_data(np.float32, 13))
    y.add_(nb.tensor(_data(np.float64, 14)))  # float64 into float32: same_kind cast
    assert y.dtype == np.float32
    with pytest.raises(RuntimeError, match="cannot be stored in place"):
        nb.tensor(_data(np.float64, 15, (4,))).add_(nb.tensor(_data(np.float64, 16)))
    ro = nb.broadcast_to(nb.tensor(_data(np.float64, 17, (4,))), (3, 4))
    with pytest.raises(RuntimeError, match="read-only view"):
        ro.mul_(2.0)


def test_in_place_ops_take_the_general_path_without_numpys_error_state(monkeypatch):
    """Where NumPy lacks the error-state switch the lean path needs (``ew.QUIET``), every
    call of an in-place op takes the general path, first and later (a cached ufunc made
    a second call unpack None)."""
    from nbgrad.kernels import elementwise as ew
    monkeypatch.setattr(ew, "QUIET", None)
    monkeypatch.setattr(dispatch, "_INPLACE_UFUNCS", {})
    x = nb.tensor(_data(np.float64, 18))
    want = x.numpy() * 4.0
    with nb.no_grad():
        x.mul_(2.0)
        x.mul_(2.0)
    np.testing.assert_array_equal(x.numpy(), want)


def test_exact_ints_share_their_float_twins_constant(monkeypatch):
    """The lean path finds an exact Python int's constant under the float equal to it
    (one cached pair for ``2 * x`` and ``2.0 * x``, found without converting the int);
    ints wider than float64's exact range are no weak scalars there (the general path
    converts them)."""
    x = nb.tensor(np.array([1.5, -2.0]))
    want = (2.0 * x).numpy()
    monkeypatch.setattr(dispatch, "_weak_scalar", None)  # a cached int needs no call
    np.testing.assert_array_equal((2 * x).numpy(), want)
    np.testing.assert_array_equal((x * 2).numpy(), want)
    monkeypatch.undo()
    for dt in (np.dtype(np.float64), np.dtype(np.float32)):
        assert dispatch._lean_constant(2, dt) is dispatch._lean_constant(2.0, dt)
        assert dispatch._lean_constant(True, dt) is dispatch._lean_constant(1.0, dt)
        assert dispatch._lean_constant(-3, dt)[0].numpy() == dt.type(-3.0)
        dispatch._lean_constant(float(2 ** 60), dt)  # its float twin cached
        assert dispatch._lean_constant(2 ** 60, dt) is None
        assert dispatch._lean_constant(2 ** 53, dt) is dispatch._lean_constant(2.0 ** 53, dt)
        zero = dispatch._lean_constant(0, dt)[0].numpy()
        assert zero == 0 and not np.signbit(zero)


def test_tracers_are_counted_in_and_out_and_the_lean_path_steps_aside_while_tracing():
    """The lean path reads the thread-local tracer only while some tracer is installed
    (``tensor.TRACERS``): the count is 0 at rest, 1 inside a traced function, 0 again
    after a trace that raised, and an op traced in one thread while another thread
    computes on the lean path lands in the trace, with the other thread's values and
    gradients those of the general path."""
    import threading

    from nbgrad.jit.program import wait_for_promotions
    from nbgrad.tensor import TRACERS

    assert wait_for_promotions(timeout=300)  # (a promotion traces in the background)
    base = TRACERS.active  # 0, unless some other thread traces
    seen = []

    def f(x):
        seen.append(TRACERS.active)
        return (x * 2.0 + 1.0).sum()

    out = nb.jit(f, mode="interpret")(nb.tensor(np.arange(3.0)))
    assert seen == [base + 1] and TRACERS.active == base and float(out) == 9.0

    def bad(x):
        raise ValueError("no")

    with pytest.raises(ValueError):
        nb.jit(bad, mode="interpret")(nb.tensor(np.arange(3.0)))
    assert TRACERS.active == base

    # thread A traces (and waits inside its trace); thread B computes meanwhile
    inside, done = threading.Event(), threading.Event()

    def traced(x):
        inside.set()
        done.wait(10)
        return (x * 3.0).sum()

    results = {}

    def thread_a():
        results["a"] = float(nb.jit(traced, mode="interpret")(nb.tensor(np.ones(4))))

    t = threading.Thread(target=thread_a)
    t.start()
    assert inside.wait(10) and TRACERS.active == base + 1
    x = nb.tensor(_data(np.float64, 3), requires_grad=True)
    y = (x * 1.5 + 0.25).sum()
    (gx,) = nb.autograd.grad(y, x)
    done.set()
    t.join(10)
    assert results["a"] == 12.0 and TRACERS.active == base
    np.testing.assert_array_equal(gx.numpy(), np.full((3, 4), 1.5))
    np.testing.assert_array_equal(y.numpy(), (x.numpy() * 1.5 + 0.25).sum())


def test_an_elementwise_node_shares_its_inputs_metadata_only_where_it_is_the_same():
    """A compiled record gives an elementwise op's node its first input's metadata
    (the node's ``output_meta`` tuple when that input's node has one output) only where
    the output has that input's shape, dtype and device; else its own."""
    x = nb.tensor(_data(np.float64, 4), requires_grad=True)
    y = x * 2.0
    z = y + 1.0
    assert z.grad_fn.output_meta is y.grad_fn.output_meta
    assert z.grad_fn.output_meta[0][:2] == ((3, 4), np.dtype(np.float64))
    wide = y + nb.tensor(_data(np.float64, 5, (2, 3, 4)))  # broadcast wider than y
    assert wide.grad_fn.output_meta[0][0] == (2, 3, 4)
    assert wide.grad_fn.input_meta[0][0] == (3, 4)
    row = nb.tensor(_data(np.float64, 6, (4,)), requires_grad=True)
    r = row * y  # the first input narrower than the output
    assert r.grad_fn.output_meta[0][0] == (3, 4) and r.grad_fn.input_meta[0][0] == (4,)
    (g_row, g_x) = nb.autograd.grad(r.sum() + wide.sum(), [row, x])
    assert g_row.shape == (4,) and g_x.shape == (3, 4)
    np.testing.assert_allclose(g_row.numpy(), y.numpy().sum(0))
    np.testing.assert_allclose(g_x.numpy(), 2 * (np.broadcast_to(row.numpy(), (3, 4)) + 2))


def test_a_backward_returning_a_wrong_number_of_gradients_raises(monkeypatch):
    """The engine's inlined common case checks that a node's backward returned one
    gradient per input (what ``zip(strict=True)`` checked before)."""
    x = nb.tensor(_data(np.float64, 8), requires_grad=True)
    y = (x * 2.0).sum()
    op = REGISTRY["mul"]
    real = op.run_backward or record.compile_backward(op)
    monkeypatch.setattr(op, "run_backward", lambda node, grads: real(node, grads)[:1])
    with pytest.raises(RuntimeError, match="MulBackward returned 1 gradients for 2 inputs"):
        y.backward()


def test_the_lean_path_is_quiet_inside_its_own_context_and_where_it_is_taken():
    """Small arrays run the op's ufunc in ``ew.QUIET_RUN``'s context (no floating-point
    warnings); where that context is entered already (another thread inside it; here
    this thread, which makes ``run`` raise the same way) the lean path sets the error
    state itself: the same values, still no warnings, and the caller's error state is
    untouched either way."""
    if ew.QUIET_RUN is None:
        pytest.skip("this NumPy has no error-state context variable")
    x = nb.tensor(np.array([1e308, -1.0, 0.0, 2.0]), requires_grad=True)

    def ops():
        y = x * 10.0  # overflow
        z = nb.log(y - 20.0)  # log of negatives and -inf: invalid, divide
        w = 1.0 / x  # divide by zero
        (g,) = nb.autograd.grad((z + w).sum(), x)
        return [y.numpy(), z.numpy(), w.numpy(), g.numpy()]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            outside = ops()
            inside = ew.QUIET_RUN(ops)  # nested: run refuses, quiet_call takes over
            assert np.geterr()["over"] == "raise"
            with pytest.raises(FloatingPointError):
                np.multiply(np.array([1e308]), 10.0)
    for a, b in zip(outside, inside, strict=True):
        np.testing.assert_array_equal(a, b)
    assert np.isinf(outside[0][0]) and np.isnan(outside[1][1]) and np.isinf(outside[2][2])


def test_tensors_on_ndarray_subclasses_take_the_general_path(monkeypatch):
    """A tensor on an ndarray subclass (``from_numpy`` keeps one) is outside the lean
    path's common case: no subclass hook runs in ``ew.QUIET_RUN``'s shared context, and
    the result is the general path's (a plain array), as either operand."""

    class Sub(np.ndarray):
        pass

    calls = _spy(monkeypatch)
    s = nb.from_numpy(np.arange(1.0, 5.0).view(Sub))
    x = nb.tensor(np.arange(4.0))
    assert type(s._data) is Sub
    outs = [s * 2.0, 2.0 * s, x + s, nb.exp(s), -s]
    assert calls == []
    for out in outs:
        assert type(out._data) is np.ndarray
    np.testing.assert_array_equal(outs[2].numpy(), np.arange(4.0) + np.arange(1.0, 5.0))
