"""An op defined outside nbgrad lowers natively in both jit tiers by its declared kind.

This module adds two ops the way a user would, touching nothing in ``nbgrad/``: a
matrix product ``ext_affine`` (``self @ weight.T + bias``, kind
``Matmul(transpose_b=True, bias=2)``) and a view ``ext_merge`` (the first two
dimensions merged, kind ``View()``), each a CPU kernel with its kind, a function and a
table entry (:func:`nbgrad.ops.registry.register_entries`), with op records like the
table's. Tier 1 runs them with no eager step and tier 2 with no ``objmode``: neither
tier names ops, both read the kind. The ops are removed again after the module
(:func:`nbgrad.ops.registry.remove_ops`), so the per-table-op tests never see them.
"""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.nn.functional as F
from nbgrad.autograd import gradcheck, gradgradcheck
from nbgrad.errors import TableError
from nbgrad.ops import registry as reg
from nbgrad.ops.dispatch import apply
from nbgrad.ops.traits import Matmul, Opaque, View
from nbgrad.testing import OpRecord, Sample, make_inputs

ENTRIES = """
- name: ext_affine(Tensor self, Tensor weight, Tensor? bias=None) -> Tensor
  self: mm(grad, weight)
  weight: mm(transpose(grad, 0, 1), self)
  bias: sum(grad, 0)

- name: ext_merge(Tensor self) -> Tensor
  self: reshape(grad, self.shape)
"""
NAMES = ("ext_affine", "ext_merge")
TIER2 = "nbgrad.jit tier 2: generated code"


def _affine_kernel(x, weight, bias):
    out = np.ascontiguousarray(x @ weight.T)
    return out if bias is None else out + bias


def _merge_kernel(x):
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def ext_affine(self, weight, bias=None):
    """``self @ weight.T + bias`` for a matrix ``self`` (rows) and ``weight``."""
    return apply(reg.get("ext_affine"), (self, weight, bias))


def ext_merge(self):
    """``self`` with its first two dimensions merged (a view)."""
    return apply(reg.get("ext_merge"), (self,))


@pytest.fixture(scope="module")
def ops():
    """Define the two ops (kernel with its kind, function, table entry); forget them
    after the module."""
    try:
        reg.kernel("ext_affine", kind=Matmul(transpose_b=True, bias=2))(_affine_kernel)
        reg.kernel("ext_merge", view_of=0, kind=View())(_merge_kernel)
        affine = reg.op_function("ext_affine")(ext_affine)
        merge = reg.op_function("ext_merge")(ext_merge)
        reg.register_entries(ENTRIES)
        yield affine, merge
    finally:
        reg.remove_ops(*NAMES)


def _records() -> list[OpRecord]:
    def affine_samples(rng):
        x, w, b = rng.standard_normal((4, 3)), rng.standard_normal((5, 3)), \
            rng.standard_normal(5)
        return [Sample((x, w, b), note="bias"), Sample((x, w), note="no-bias")]

    def merge_samples(rng):
        return [Sample((rng.standard_normal((2, 3, 4)),), note="3d"),
                Sample((rng.standard_normal((3, 2)),), note="2d")]

    return [
        OpRecord("ext_affine", affine_samples,
                 ref=lambda x, w, b=None: x @ w.T + (0 if b is None else b)),
        OpRecord("ext_merge", merge_samples,
                 ref=lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])),
    ]


RECORDS = {rec.name: rec for rec in _records()}
CASES = [pytest.param(name, i, id=f"{name}-{i}") for name in NAMES for i in range(2)]


def _sample(name: str, i: int) -> Sample:
    return RECORDS[name].samples(np.random.default_rng(7))[i]


def _close(got, want) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-13)


# ------------------------------------------------------------------ the ops are ops
@pytest.mark.parametrize(("name", "i"), CASES)
def test_records_forward_and_gradients(ops, name, i):
    """As the generated per-table-op tests: forward against the reference, gradcheck
    and gradgradcheck through the entry's formulas."""
    rec, sample = RECORDS[name], _sample(name, i)
    args, _ = make_inputs(sample, requires_grad=False)
    got = rec.function()(*args)
    np.testing.assert_allclose(got.numpy(), rec.ref(*sample.args), rtol=1e-12)
    args, _ = make_inputs(sample)
    fn = rec.function()
    assert gradcheck(fn, args, eps=rec.eps, atol=rec.atol, rtol=rec.rtol)
    assert gradgradcheck(fn, args, eps=rec.eps, atol=rec.atol, rtol=rec.rtol)


def test_registered_ops_are_in_the_table(ops):
    assert set(NAMES) <= set(reg.table())
    assert reg.kind_of("ext_affine") == Matmul(transpose_b=True, bias=2)
    assert isinstance(reg.kind_of("ext_merge"), View)


# ------------------------------------------------------------------ both tiers, natively
def _model(affine, merge):
    def f(x, w, b):
        return nb.tanh(affine(merge(x), w, b)).sum() * 2.0
    return f


def _inputs():
    rng = np.random.default_rng(3)
    return (nb.tensor(rng.standard_normal((2, 3, 4))), nb.tensor(rng.standard_normal((5, 4))),
            nb.tensor(rng.standard_normal(5)))


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "value_and_grad"])
def test_tier1_runs_new_ops_natively(ops, grad):
    """Tier 1 lowers the new ops by their kinds: no eager step; the product is one
    MATMUL plus the bias added to its rows, the view an alias (no copy)."""
    f = _model(*ops)
    if grad:
        f = nb.value_and_grad(f, argnums=(0, 1, 2))
    args = _inputs()
    want = f(*args)
    jitted = nb.jit(f, mode="interpret")
    for _ in range(2):  # the trace, then the tape
        got = jitted(*args)
    src = jitted.source(*args)
    assert "0 eager step(s)" in src and "EAGER" not in src, src
    assert "ADD" in src  # the bias
    if not grad:  # the view is an alias: no copy, no gather
        assert src.count("MATMUL") == 1 and "GATHER" not in src and "COPY" not in src, src
        _close(got, want)
        return
    _close(got[0], want[0])
    for g, w in zip(got[1], want[1], strict=True):
        _close(g, w)


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "value_and_grad"])
def test_tier2_runs_new_ops_natively(ops, grad):
    """Tier 2 writes the new ops by their kinds: no objmode in the generated code."""
    f = _model(*ops)
    if grad:
        f = nb.value_and_grad(f, argnums=(0, 1, 2))
    args = _inputs()
    want = f(*args)
    jitted = nb.jit(f, mode="compile")
    got = jitted(*args)
    src = jitted.source(*args)
    assert TIER2 in src, src
    assert "objmode(" not in src.split("def run_graph", 1)[1], src
    assert "ext_affine(" in src and "ext_merge(" in src
    if not grad:
        _close(got, want)
        return
    _close(got[0], want[0])
    for g, w in zip(got[1], want[1], strict=True):
        _close(g, w)


def test_linear_lowers_natively_in_tier1():
    """``linear`` (``Matmul(transpose_b=True, bias=2)``): rows of the input times
    weight.T plus the bias, with and without a bias, batched input included."""
    rng = np.random.default_rng(5)
    w = nb.tensor(rng.standard_normal((3, 4)))
    b = nb.tensor(rng.standard_normal(3))
    for shape in [(5, 4), (2, 5, 4), (4,)]:
        x = nb.tensor(rng.standard_normal(shape))
        for bias in (b, None):
            def f(x, w, bias=bias):
                return nb.tanh(F.linear(x, w, bias)).sum()
            vg = nb.value_and_grad(f, argnums=(0, 1))
            want_v, want_g = vg(x, w)
            jitted = nb.jit(vg, mode="interpret")
            for _ in range(2):
                got_v, got_g = jitted(x, w)
            src = jitted.source(x, w)
            assert "0 eager step(s)" in src and "MATMUL" in src, src
            _close(got_v, want_v)
            for g, e in zip(got_g, want_g, strict=True):
                _close(g, e)


# ------------------------------------------------------------------ the registration API
def test_register_entries_checks_entries(ops):
    with pytest.raises(TableError, match="has no CPU kernel"):
        reg.register_entries("- name: ext_missing(Tensor self) -> Tensor\n"
                             "  self: grad\n")
    with pytest.raises(TableError, match="has this op already"):
        reg.register_entries("- name: ext_merge(Tensor self) -> Tensor\n"
                             "  self: reshape(grad, self.shape)\n")
    with pytest.raises(TableError, match="unknown_op"):
        reg.register_entries("- name: ext_merge2(Tensor self) -> Tensor\n"
                             "  self: unknown_op(grad)\n")
    with pytest.raises(ValueError, match="nbgrad's table"):
        reg.remove_ops("mm")
    assert "ext_missing" not in reg.REGISTRY and "ext_merge2" not in reg.table()


# ------------------------------------------------------------------ kinds, not names
def test_tier1_follows_the_declared_kind(monkeypatch):
    """The same op declared opaque runs as an eager step: tier 1 reads the kind."""
    rng = np.random.default_rng(2)
    a, b = nb.tensor(rng.standard_normal((3, 4))), nb.tensor(rng.standard_normal((4, 2)))

    def f(a, b):
        return nb.tanh(nb.mm(a, b))

    src = nb.jit(f, mode="interpret").source(a, b)
    assert "0 eager step(s)" in src and "MATMUL" in src
    monkeypatch.setattr(reg.REGISTRY["mm"], "kind", Opaque())
    jitted = nb.jit(f, mode="interpret")
    src = jitted.source(a, b)
    assert "EAGER mm(f64[3,4], f64[4,2])" in src and "MATMUL" not in src, src
    _close(jitted(a, b), f(a, b))


def test_constant_folding_follows_the_fill_kind(monkeypatch):
    """A Fill node reads only its input's shape: folded to a constant, unless its op is
    declared opaque."""
    x = nb.tensor(np.arange(3.0))

    def f(x):
        return x * nb.ones_like(x)

    ops = [n.op for n in nb.jit(f, mode="interpret")._entry((x,), {}).graph.nodes]
    assert "ones_like" not in ops
    monkeypatch.setattr(reg.REGISTRY["ones_like"], "kind", Opaque())
    ops = [n.op for n in nb.jit(f, mode="interpret")._entry((x,), {}).graph.nodes]
    assert "ones_like" in ops


def test_batching_is_declared_with_the_kernel():
    """An Opaque op's batching rule is a trait of its kind, given where it registers;
    other kinds batch by their kind, so ``batch=`` on them is refused."""
    from nbgrad.batching.opaque import FAMILIES, rule_for
    from nbgrad.ops.traits import Batching, Elementwise
    assert reg.REGISTRY["softmax"].kind.batch == Batching("along")
    assert reg.REGISTRY["linalg.solve_triangular"].kind.batch.args == (2, 2)
    declared = {op.kind.batch.family for op in reg.REGISTRY.values()
                if isinstance(op.kind, Opaque) and op.kind.batch is not None}
    assert declared <= set(FAMILIES)
    assert rule_for(None) is None
    with pytest.raises(TypeError, match="batch= is for Opaque ops"):
        reg.kernel("mul", kind=Elementwise(spec=None), batch=Batching("along"))
