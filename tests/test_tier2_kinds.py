"""Tier 2 lowers ops by their declared kind (nbgrad/ops/traits.py), never by name.

Every table op whose kind tier 2 has a rule for (every kind but Opaque, and Opaque ops
that declare a ``native`` function) runs in generated code without ``objmode``, with
the values of eager mode; an opaque op without one goes through ``objmode`` and the
generated source shows the reason it declares. (New ops of known kinds defined outside
nbgrad: tests/test_op_extension.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit, types

import nbgrad as nb
from nbgrad.jit.program import wait_for_promotions
from nbgrad.ops.registry import REGISTRY
from nbgrad.ops.traits import Elementwise, NativePlan, Opaque
from nbgrad.testing import all_records, float_tensor_call

RECORDS = all_records()
HEADER = "nbgrad.jit tier 2: generated code"


def _native_kind(name: str) -> bool:
    kind = REGISTRY[name].kind
    return not isinstance(kind, Opaque) or kind.native is not None


def _seed(name: str) -> int:
    return sum(ord(c) * 31 ** i for i, c in enumerate(name)) % 2**32


#: ops compiled together in one tier-2 graph (a compile per op cost minutes on a cold cache)
CHUNK = 8


def _cases(predicate):
    """Every op ``predicate`` selects, with all its samples (one per elementwise op: they
    share one rule, the scalar expression), in chunks of :data:`CHUNK` ops."""
    ops = []
    for name in sorted(RECORDS):
        rec = RECORDS[name]
        if name not in REGISTRY or not rec.jit or not predicate(name):
            continue
        samples = rec.samples(np.random.default_rng(_seed(name)))
        if isinstance(REGISTRY[name].kind, Elementwise):
            samples = samples[:1]
        ops.append((rec, samples))
    return [pytest.param(ops[k:k + CHUNK], id=f"{ops[k][0].name}..{ops[k + CHUNK - 1][0].name}"
                         if k + CHUNK <= len(ops) else f"{ops[k][0].name}..")
            for k in range(0, len(ops), CHUNK)]


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def _compiled(chunk):
    """(source, outputs, eager outputs, the op of each output) of every sample of the
    chunk's ops, jitted with tier 2 as one graph."""
    calls = [(rec.name, *float_tensor_call(rec, sample))
             for rec, samples in chunk for sample in samples]
    tensors = [t for _, _, ts in calls for t in ts]
    sizes = [len(ts) for _, _, ts in calls]
    owners: list[str] = []

    def every_sample(*ts):
        outs, k = [], 0
        owners.clear()
        for (name, call, _), n in zip(calls, sizes, strict=True):
            res = _outputs(call(*ts[k:k + n]))
            outs += res
            owners.extend([name] * len(res))
            k += n
        return tuple(outs)

    want = every_sample(*tensors)
    jitted = nb.jit(every_sample, mode="compile")
    got = _outputs(jitted(*tensors))
    return jitted.source(*tensors), got, want, list(owners)


@pytest.mark.parametrize("chunk", _cases(_native_kind))
def test_ops_of_native_kinds_never_reach_objmode(chunk):
    """Every sample of every op whose kind tier 2 lowers (and of every opaque op with a
    native) runs in generated code without objmode, equal to eager."""
    src, got, want, owners = _compiled(chunk)
    names = [rec.name for rec, _ in chunk]
    assert HEADER in src, f"tier 2 refused the graph of {names}"
    body = src.split("def run_graph", 1)[1]
    objmode = [line for line in body.splitlines() if "objmode(" in line]
    assert not objmode, f"objmode in the graph of {names}: {objmode}"
    assert len(got) == len(want)
    for g, w, name in zip(got, want, owners, strict=True):
        assert isinstance(g, nb.Tensor) == isinstance(w, nb.Tensor), name
        if isinstance(w, nb.Tensor):
            assert g.dtype == w.dtype and g.shape == w.shape, name
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-14,
                                       err_msg=name)


# ------------------------------------------------------------------ opaque ops
# Test natives in the flat ABI (``NativePlan``): flat arrays in and out.
@njit(cache=False)
def _softmax_rows(x, rows, cols):
    """softmax over the rows of a ``rows`` x ``cols`` matrix (the test's native)."""
    m = x.reshape((rows, cols))
    out = np.empty_like(m)
    for i in range(rows):
        e = np.exp(m[i] - m[i].max())
        out[i] = e / e.sum()
    return out.reshape(-1)


def _rows_static(attrs, shapes):
    return NativePlan(tuple(shapes[0]), (tuple(shapes[0]),))


def _rows_static_named(attrs, shapes):  # the dim (-1 here) as a constant too
    return NativePlan((*shapes[0], attrs["dim"] - len(shapes[0])), (tuple(shapes[0]),))


@njit(cache=False)
def _softmax_rows_dim(x, rows, cols, dim):
    return _softmax_rows(x, rows, cols)


@njit(cache=False)
def _max_rows(x, rows, cols):
    """max_dim(x, 1): (values, indices) of a ``rows`` x ``cols`` matrix."""
    m = x.reshape((rows, cols))
    values = np.empty(rows, x.dtype)
    indices = np.empty(rows, np.int64)
    for i in range(rows):
        j = np.argmax(m[i])
        values[i], indices[i] = m[i, j], j
    return values, indices


@njit(cache=False)
def _mse(a, b, reduction):
    d = a - b
    total = (d * d).sum()
    out = np.empty(1, a.dtype)
    out[0] = total / d.size if reduction == "mean" else total
    return out


@njit(cache=False)
def _clamp(x, lo, hi):
    out = x.copy()
    if lo.size:
        out = np.maximum(out, lo)
    if hi.size:
        out = np.minimum(out, hi)
    return out


def _jit_source(fn, *tensors):
    want = _outputs(fn(*tensors))
    jitted = nb.jit(fn, mode="compile")
    got = _outputs(jitted(*tensors))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-14)
    src = jitted.source(*tensors)
    assert HEADER in src
    return src.split("def run_graph", 1)[1], src


def _op(name):
    return REGISTRY[name].fn


@pytest.mark.parametrize(("name", "native", "static", "call", "text"), [
    ("softmax", _softmax_rows, _rows_static, lambda x, y: _op("softmax")(x * 2, 1),
     "(v3_.reshape(-1), np.int64(3), np.int64(4))"),
    ("softmax", _softmax_rows_dim, _rows_static_named, lambda x, y: _op("softmax")(x * 2, 1),
     "(v3_.reshape(-1), np.int64(3), np.int64(4), np.int64(-1))"),
    ("max_dim", _max_rows, lambda attrs, shapes: NativePlan(
        tuple(shapes[0]), ((shapes[0][0],),) * 2), lambda x, y: _op("max_dim")(x, 1),
     "(v0_.reshape(-1), np.int64(3), np.int64(4))"),
    ("mse_loss", _mse, lambda attrs, shapes: NativePlan((attrs["reduction"],), ((),)),
     lambda x, y: _op("mse_loss")(x, y) * 3,
     "(v0_.reshape(-1), v1_.reshape(-1), nb_unicode('mean'))"),
    ("mse_loss", _mse, lambda attrs, shapes: NativePlan((attrs["reduction"],), ((),)),
     lambda x, y: _op("mse_loss")(x.T, y.T, "sum"),
     "(np.ascontiguousarray(v2_).reshape(-1), np.ascontiguousarray(v3_).reshape(-1), "
     "nb_unicode('sum'))"),
    ("clamp_tensor", _clamp, lambda attrs, shapes: NativePlan((), (tuple(shapes[0]),)),
     lambda x, y: _op("clamp_tensor")(x, y, None),
     "(v0_.reshape(-1), v1_.reshape(-1), nb_empty((0,), np.float64))"),
], ids=["softmax", "softmax-static", "max_dim", "mse_loss", "mse_loss-views", "clamp_tensor"])
def test_opaque_op_with_native_is_called_directly(rng, monkeypatch, name, native, static,
                                                  call, text):
    """A native function: called from the generated code as ``NativePlan`` says (tensors
    flat, an absent one empty, tuples as int64 arrays, numbers as int64/bool values),
    its flat results reshaped; never through objmode."""
    monkeypatch.setattr(REGISTRY[name], "kind", Opaque(native=native, static=static))
    x, y = nb.tensor(rng.standard_normal((3, 4))), nb.tensor(rng.standard_normal((3, 4)))
    body, src = _jit_source(call, x, y)
    assert "objmode(" not in body
    assert f"_native_0{text}" in body, body
    assert f"_native_0 = {native.py_func.__module__}.{native.py_func.__qualname__}" in src


def test_an_opaque_native_needs_a_plan():
    with pytest.raises(TypeError, match="needs a static"):
        Opaque(native=_clamp)


def test_native_compiles_once_for_every_constant(rng, tmp_path, monkeypatch):
    """Constants reach a native as int64/bool values, not literals (a literal would
    compile the native once per value): graphs that differ only in a native's constants
    share one specialisation of it."""
    monkeypatch.setenv("NBGRAD_CACHE_DIR", str(tmp_path))  # compiled here, not loaded
    native = REGISTRY["softmax"].kind.native
    for shape, dim in [((3, 4), 1), ((3, 4), 0), ((5, 2), -1)]:
        x = nb.tensor(rng.standard_normal(shape))
        step = nb.jit(lambda x, dim=dim: _op("softmax")(x * 2, dim), mode="compile")
        for _ in range(3):
            step(x)
        assert "objmode(" not in step.source(x)
    wait_for_promotions()
    literal = [sig for sig in native.signatures if "Literal" in str(sig)]
    assert not literal, literal
    # Other tests may add a signature with a dtype argument; these graphs pass none.
    flat = [sig for sig in native.signatures
            if sig[0] == types.float64[::1] and sig[4] == types.none]
    assert len(flat) == 1, native.signatures


def test_opaque_op_without_native_shows_its_reason(rng, monkeypatch):
    monkeypatch.setattr(REGISTRY["softmax"], "kind",
                        Opaque(why_not_native="it needs a Python callback"))
    monkeypatch.setattr(REGISTRY["amax"], "kind", Opaque())  # no native, no reason given
    x = nb.tensor(rng.standard_normal((3, 4)))
    body, _ = _jit_source(lambda x: _op("softmax")(x * 2, 1) + _op("amax")(x, 1, True), x)
    assert "softmax(%2) {dim=1, dtype=None}  [through objmode: it needs a Python callback]" \
        in body, body
    assert "amax(%0) {dim=1, keepdim=True}  [through objmode: the op declares no native " \
        "function]" in body, body


def test_native_compiles_once_for_every_message(rng, tmp_path, monkeypatch):
    """String constants (the error messages name the shapes) reach a native as
    unicode_type, not one Literal[str] per message: graphs of different shapes share one
    specialisation of the native (each cost a LAPACK native's compile, about 1 s)."""
    monkeypatch.setenv("NBGRAD_CACHE_DIR", str(tmp_path))
    native = REGISTRY["linalg.solve"].kind.native
    for n in (2, 3, 4):
        a = nb.tensor(rng.standard_normal((n, n)) + n * np.eye(n))
        b = nb.tensor(rng.standard_normal((n, 2)))
        step = nb.jit(lambda a, b: nb.linalg.solve(a, b) * 2.0, mode="compile")
        for _ in range(2):
            step(a, b)
        assert "objmode(" not in step.source(a, b)
    literal = [sig for sig in native.signatures if "Literal" in str(sig)]
    assert not literal, literal
    assert len([sig for sig in native.signatures if sig[0] == types.float64[::1]]) == 1
