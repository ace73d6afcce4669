"""The lean dispatch path (``dispatch.apply_lean``) and the compiled backwards
(``record.compile_backward``) give exactly what the general path gives: values, dtypes,
graphs, gradients and errors, and the lean path is taken only in its common case."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import record
from nbgrad.ops.registry import REGISTRY


def _general(monkeypatch) -> None:
    """Turn the lean path and the compiled backwards off: every op takes the general path."""
    for op in list(REGISTRY.values()):
        if op.lean is not None:
            monkeypatch.setattr(op, "lean", None)
        if op.entry is not None:
            monkeypatch.setattr(op, "run_backward", record.run_formulas)


def _spy(monkeypatch) -> list:
    """Count the calls of every lean kernel."""
    calls: list = []
    for op in list(REGISTRY.values()):
        if op.lean is not None:
            def counted(*arrays, _lean=op.lean, _name=op.name):
                calls.append(_name)
                return _lean(*arrays)
            monkeypatch.setattr(op, "lean", counted)
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


@pytest.mark.parametrize("case", ["scalar-tensor", "same-shape", "large"])
def test_lean_shapes_match_the_general_path(monkeypatch, case):
    a = _data(np.float64, 3, (5000,) if case == "large" else (2, 3))
    b = (_data(np.float64, 4, ()) if case == "scalar-tensor"
         else _data(np.float64, 4, a.shape))
    fn = (lambda x, y: (x * y - y) / x)  # noqa: E731
    lean = _run(fn, a, b, True)
    _general(monkeypatch)
    _same(lean, _run(fn, a, b, True))


def test_general_path_outside_the_common_case(monkeypatch):
    """Mixed dtypes, integers, broadcasting, non-contiguous and 0-d-first operands, and
    Python ints take the general path (NumPy promotion), with the same results."""
    calls = _spy(monkeypatch)
    x64 = nb.tensor(_data(np.float64, 5))
    x32 = nb.tensor(_data(np.float32, 6))
    ints = nb.tensor(np.arange(12).reshape(3, 4))
    row = nb.tensor(_data(np.float64, 7, (4,)))
    cases = [x64 + x32, x32 * 2, ints * 1.5, x64 * row, x64.T * 2.0,
             nb.tensor(2.0) * x64, x64 * np.float64(2.0), nb.exp(ints)]
    assert calls == []
    assert [c.dtype for c in cases] == [np.float64, np.float32, np.float64, np.float64,
                                        np.float64, np.float64, np.float64, np.float64]


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
