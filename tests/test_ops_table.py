"""Tests generated from the derivative table: one op record per entry.

For every sample of every record: the forward equals the NumPy/SciPy reference, and
(for differentiable entries) gradcheck and gradgradcheck pass in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import gradcheck, gradgradcheck
from nbgrad.ops.registry import table
from nbgrad.testing import all_records, float_tensor_call, make_inputs
from nbgrad.testing.core import check_array_outputs

RECORDS = all_records()


def _seed(name: str) -> int:
    return sum(ord(c) * 31 ** i for i, c in enumerate(name)) % 2**32


def _cases(predicate=lambda rec: True):
    cases = []
    for name in sorted(RECORDS):
        rec = RECORDS[name]
        if not predicate(rec):
            continue
        for i, sample in enumerate(rec.samples(np.random.default_rng(_seed(name)))):
            cases.append(pytest.param(rec, sample, id=f"{name}-{i}-{sample.note}"))
    return cases


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def test_every_table_entry_has_a_record():
    missing = sorted(set(table()) - set(RECORDS))
    assert not missing, f"table entries without an op record: {missing}"


def test_every_record_names_a_table_entry():
    unknown = sorted(set(RECORDS) - set(table()))
    assert not unknown, f"op records for unknown entries: {unknown}"


@pytest.mark.parametrize(("rec", "sample"), _cases(lambda r: r.ref is not None))
def test_forward_matches_reference(rec, sample):
    args, kwargs = make_inputs(sample, requires_grad=False)
    got = _outputs(rec.function()(*args, **kwargs))
    want = _outputs(rec.ref(*sample.args, **sample.kwargs))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert g.shape == w.shape, f"shape {g.shape} != reference {w.shape}"
        np.testing.assert_allclose(g.numpy(), w, rtol=rec.ref_rtol, atol=1e-12)


@pytest.mark.parametrize(("rec", "sample"), _cases())
def test_outputs_convert_with_asarray(rec, sample):
    """Every op's outputs, 0-d ones included, convert with np.asarray to an ndarray of
    their shape and dtype (with and without autograd recording)."""
    for requires_grad in (False, True):
        args, kwargs = make_inputs(sample, requires_grad=requires_grad)
        check_array_outputs(rec.function()(*args, **kwargs), rec.name)


def _check_fn(rec, sample):
    fn = rec.function()

    def call(*args):
        return fn(*args, **kwargs)

    args, kwargs = make_inputs(sample)
    if not any(isinstance(a, nb.Tensor) and a.requires_grad for a in args) and \
            not any(isinstance(a, list) for a in args):
        pytest.skip("no differentiable input in this sample")
    if any(isinstance(a, list) for a in args):
        lists = [i for i, a in enumerate(args) if isinstance(a, list)]
        flat = [t for a in args for t in (a if isinstance(a, list) else [a])]
        sizes = [len(a) if isinstance(a, list) else 1 for a in args]

        def call(*flat_args):  # noqa: F811 - list arguments are flattened for gradcheck
            rebuilt, k = [], 0
            for i, n in enumerate(sizes):
                rebuilt.append(list(flat_args[k:k + n]) if i in lists else flat_args[k])
                k += n
            return fn(*rebuilt, **kwargs)

        return call, tuple(flat)
    return call, args


@pytest.mark.parametrize(("rec", "sample"), _cases(lambda r: r.grad))
def test_gradcheck(rec, sample):
    fn, args = _check_fn(rec, sample)
    assert gradcheck(fn, args, eps=rec.eps, atol=rec.atol, rtol=rec.rtol)


@pytest.mark.parametrize(("rec", "sample"), _cases(lambda r: r.grad and r.second_order))
def test_gradgradcheck(rec, sample):
    fn, args = _check_fn(rec, sample)
    assert gradgradcheck(fn, args, eps=rec.eps, atol=rec.atol, rtol=rec.rtol)


def _several_grad_inputs(rec) -> bool:
    """An entry with formulas for two tensor parameters, or for a tensor list."""
    entry = table()[rec.name]
    params = [p for p in entry.schema.params if p.name in entry.formulas]
    return rec.grad and (len(params) >= 2 or any(p.is_tensor_list for p in params))


@pytest.mark.parametrize(("rec", "sample"), _cases(_several_grad_inputs))
def test_each_input_alone_gets_the_same_gradient(rec, sample):
    """With only one input needing a gradient, a node saves only what that input's
    formula reads (``x * c`` keeps no ``x``): each input's gradient, first and second
    order, equals the one it gets when every input needs one."""
    fn, args = _check_fn(rec, sample)
    wanted = [i for i, a in enumerate(args) if isinstance(a, nb.Tensor) and a.requires_grad]
    if len(wanted) < 2:
        pytest.skip("fewer than two differentiable inputs")
    loss = _float_sum(fn)
    total = loss(*args)
    if not total.requires_grad:
        pytest.skip("no differentiable float output")
    full = nb.autograd.grad(total, [args[i] for i in wanted], allow_unused=True,
                            create_graph=True)
    for k, i in enumerate(wanted):
        alone = [a if j == i or not isinstance(a, nb.Tensor) else a.detach()
                 for j, a in enumerate(args)]
        (g,) = nb.autograd.grad(loss(*alone), [alone[i]], allow_unused=True,
                                create_graph=True)
        assert (g is None) == (full[k] is None), f"input {i}"
        if g is None:
            continue
        np.testing.assert_allclose(g.numpy(), full[k].numpy(), rtol=1e-12, atol=1e-12,
                                   err_msg=f"{rec.name}: input {i}")
        if rec.second_order and g.requires_grad and full[k].requires_grad:
            (gg,) = nb.autograd.grad(g.sum(), [alone[i]], allow_unused=True)
            (gg_full,) = nb.autograd.grad(full[k].sum(), [args[i]], allow_unused=True,
                                          retain_graph=True)
            if gg is not None and gg_full is not None:
                np.testing.assert_allclose(gg.numpy(), gg_full.numpy(), rtol=1e-10,
                                           atol=1e-12, err_msg=f"{rec.name}: input {i}")


def _float_sum(call):
    def loss(*ts):
        outs = [o for o in _outputs(call(*ts)) if isinstance(o, nb.Tensor)
                and o.dtype.kind == "f"]
        total = outs[0].sum()
        for o in outs[1:]:
            total = total + o.sum()
        return total
    return loss


@pytest.mark.parametrize(("rec", "sample"), _cases(lambda r: r.jit))
def test_jit_matches_eager(rec, sample):
    """nbgrad.jit of every table op: values, and gradients of the sum of its float
    outputs (through jit(value_and_grad)), equal eager mode."""
    call, tensors = float_tensor_call(rec, sample)
    want = _outputs(call(*tensors))
    jitted = nb.jit(call, mode="interpret")
    for _ in range(2):  # the trace, then the compiled tape
        got = _outputs(jitted(*tensors))
        check_array_outputs(got, f"nbgrad.jit of {rec.name}")
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-14)
    diff = [i for i, t in enumerate(tensors) if t.dtype.kind == "f"]
    floats = [w for w in want if w.dtype.kind == "f"]
    if not (rec.grad and diff and floats):
        return
    diff = [i for i in diff if sample.diff is None or i in sample.diff] or diff
    loss = _float_sum(call)
    eager_v, eager_g = nb.value_and_grad(loss, argnums=tuple(diff))(*tensors)
    vg = nb.jit(nb.value_and_grad(loss, argnums=tuple(diff)), mode="interpret")
    for _ in range(2):
        v, gs = vg(*tensors)
        np.testing.assert_allclose(v.numpy(), eager_v.numpy(), rtol=1e-12, atol=1e-14)
        for g, e in zip(gs, eager_g, strict=True):
            assert g.shape == e.shape and g.dtype == e.dtype
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12, atol=1e-13)
