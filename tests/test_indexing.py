"""Indexing semantics beyond the generated op tests: repeated indices accumulate, torch's
semantics for gather/scatter/index_select/take/masked_fill, and errors before kernels."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.nn.functional as F
from nbgrad.autograd import gradcheck, gradgradcheck


def _t(a, requires_grad=False):
    return nb.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


# ------------------------------------------------------------------ repeated indices
def test_advanced_index_gradient_accumulates_repeats():
    x = _t(np.arange(5.0), requires_grad=True)
    x[np.array([0, 0, 3, 0, 3])].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 0.0, 0.0, 2.0, 0.0])


def test_two_array_index_gradient_accumulates_repeats():
    x = _t(np.zeros((3, 4)), requires_grad=True)
    w = _t(np.arange(4.0) + 1.0)
    (x[np.array([1, 1, 2, 1]), np.array([0, 0, 3, 0])] * w).sum().backward()
    want = np.zeros((3, 4))
    want[1, 0] = 1.0 + 2.0 + 4.0
    want[2, 3] = 3.0
    np.testing.assert_array_equal(x.grad.numpy(), want)


def test_repeated_index_second_order():
    idx = np.array([2, 2, 0, 2])
    x = _t(np.random.default_rng(0).standard_normal(4), requires_grad=True)
    assert gradgradcheck(lambda x: (x[idx] ** 3), (x,))


def test_index_put_accumulate_sums_repeats_and_its_gradients():
    x = _t(np.zeros((4, 2)), requires_grad=True)
    v = _t([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]], requires_grad=True)
    idx = (np.array([1, 3, 1]),)
    out = nb.index_put(x, idx, v, accumulate=True)
    np.testing.assert_array_equal(out.numpy(), [[0, 0], [101, 202], [0, 0], [10, 20]])
    g = np.arange(8.0).reshape(4, 2)
    out.backward(_t(g))
    np.testing.assert_array_equal(x.grad.numpy(), g)  # every position passes through
    np.testing.assert_array_equal(v.grad.numpy(), g[[1, 3, 1]])
    assert gradgradcheck(lambda x, v: nb.index_put(x, idx, v * v, accumulate=True) ** 2,
                         (_t(np.ones((4, 2)), True), _t(np.ones((3, 2)) * 0.5, True)))


def test_index_put_without_accumulate_drops_overwritten_gradient():
    x = _t(np.ones((3, 2)), requires_grad=True)
    out = nb.index_put(x, (np.array([0, 2]),), _t([5.0, 6.0]))
    np.testing.assert_array_equal(out.numpy(), [[5, 6], [1, 1], [5, 6]])
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 0], [1, 1], [0, 0]])


def test_setitem_with_repeats_writes_one_of_the_values():
    base = nb.zeros(3)
    with nb.no_grad():
        base[np.array([0, 0, 1])] = nb.tensor([1.0, 2.0, 3.0])
    assert base[1].item() == 3.0  # plain assignment: one of the repeated writes wins


def test_gather_and_scatter_add_gradients_accumulate_repeats():
    x = _t(np.arange(4.0), requires_grad=True)
    idx = nb.tensor(np.array([0, 0, 0, 2]))
    nb.gather(x, 0, idx).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 0.0, 1.0, 0.0])
    src = _t(np.ones(4), requires_grad=True)
    out = nb.scatter_add(nb.zeros(3, dtype="float64"), 0, nb.tensor([1, 1, 1, 0]), src)
    np.testing.assert_array_equal(out.numpy(), [1.0, 3.0, 0.0])
    (out * _t([5.0, 7.0, 9.0])).sum().backward()
    np.testing.assert_array_equal(src.grad.numpy(), [7.0, 7.0, 7.0, 5.0])


def test_index_select_and_take_gradients_accumulate_repeats():
    x = _t(np.zeros((2, 3)), requires_grad=True)
    nb.index_select(x, 1, nb.tensor([2, 2, 0])).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1, 0, 2], [1, 0, 2]])
    y = _t(np.zeros((2, 3)), requires_grad=True)
    nb.take(y, nb.tensor([[5, -1], [0, 5]])).sum().backward()
    np.testing.assert_array_equal(y.grad.numpy(), [[1, 0, 0], [0, 0, 3]])


def test_max_pool_gradient_goes_to_the_argmax_of_overlapping_windows():
    x = _t(np.array([[[[0.0, 1.0, 0.0], [0.0, 5.0, 0.0], [2.0, 0.0, 3.0]]]]),
           requires_grad=True)
    out, idx = F.max_pool2d(x, 2, stride=1, return_indices=True)
    np.testing.assert_array_equal(out.numpy()[0, 0], [[5.0, 5.0], [5.0, 5.0]])
    np.testing.assert_array_equal(idx.numpy()[0, 0], [[4, 4], [4, 4]])
    assert idx.dtype == np.int64 and not idx.requires_grad
    out.sum().backward()
    want = np.zeros((3, 3))
    want[1, 1] = 4.0
    np.testing.assert_array_equal(x.grad.numpy()[0, 0], want)


# ------------------------------------------------------------------ against PyTorch
def test_indexing_ops_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 5))
    tx = torch.tensor(x, requires_grad=True)
    nx = _t(x, requires_grad=True)
    idx = rng.integers(0, 4, (3, 2, 5))
    src = rng.standard_normal((3, 2, 5))
    mask = rng.random((4, 1)) > 0.5
    cases = [
        (lambda a: nb.gather(a, 1, nb.tensor(idx)), lambda a: a.gather(1, torch.tensor(idx))),
        (lambda a: nb.scatter_add(a, 1, nb.tensor(idx), _t(src)),
         lambda a: a.scatter_add(1, torch.tensor(idx), torch.tensor(src))),
        (lambda a: nb.index_select(a, 0, nb.tensor([2, 0, 2])),
         lambda a: a.index_select(0, torch.tensor([2, 0, 2]))),
        (lambda a: nb.take(a, nb.tensor([[0, -1], [7, 7]])),
         lambda a: torch.take(a, torch.tensor([[0, -1], [7, 7]]))),
        (lambda a: nb.masked_fill(a, nb.tensor(mask), -3.0),
         lambda a: a.masked_fill(torch.tensor(mask), -3.0)),
    ]
    for ours, theirs in cases:
        nx.grad, tx.grad = None, None
        a, b = ours(nx), theirs(tx)
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-12)
        g = rng.standard_normal(b.shape)
        a.backward(_t(g))
        b.backward(torch.tensor(g))
        np.testing.assert_allclose(nx.grad.numpy(), tx.grad.numpy(), rtol=1e-12)


def test_scatter_value_and_src_match_torch():
    torch = pytest.importorskip("torch")
    x = np.zeros((3, 5))
    idx = np.array([[0, 1, 2, 0, 0], [2, 0, 0, 1, 2]])
    src = np.arange(10.0).reshape(2, 5) + 1
    ours = nb.scatter(_t(x), 0, nb.tensor(idx), _t(src))
    theirs = torch.tensor(x).scatter(0, torch.tensor(idx), torch.tensor(src))
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    ours = nb.scatter(_t(x), 1, nb.tensor(idx[:, :2]), value=4.5)
    theirs = torch.tensor(x).scatter(1, torch.tensor(idx[:, :2]), 4.5)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_masked_fill_value_tensor_gets_a_gradient():
    x = _t(np.ones((2, 3)), requires_grad=True)
    v = _t(2.0, requires_grad=True)
    mask = nb.tensor(np.array([True, False, True]))
    out = nb.masked_fill(x, mask, v)
    np.testing.assert_array_equal(out.numpy(), [[2, 1, 2], [2, 1, 2]])
    out.sum().backward()
    assert v.grad.item() == 4.0
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1, 0], [0, 1, 0]])
    assert gradcheck(lambda x, v: nb.masked_fill(x, mask, v) * x, (x, v))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(("call", "op"), [
    (lambda x: nb.gather(x, 1, nb.tensor([[0, 4]])), "gather"),
    (lambda x: nb.gather(x, 0, nb.tensor([[-1, 0]])), "gather"),
    (lambda x: nb.scatter(x, 0, nb.tensor([[3]]), 1.0), "scatter"),
    (lambda x: nb.scatter_add(x, 1, nb.tensor([[9]]), _t([[1.0]])), "scatter_add"),
    (lambda x: nb.index_select(x, 0, nb.tensor([0, 3])), "index_select"),
    (lambda x: nb.take(x, nb.tensor([12])), "take"),
    (lambda x: nb.take(x, nb.tensor([-13])), "take"),
    (lambda x: x[np.array([0, 3])], "index"),
    (lambda x: nb.index_put(x, (np.array([5]),), 1.0), "index_put"),
])
def test_out_of_range_index_names_op_and_shapes(call, op, monkeypatch):
    from nbgrad.ops import registry

    x = _t(np.zeros((3, 4)))
    ran = []
    for name in ("gather", "scatter", "scatter_add", "index_select", "take", "index",
                 "index_put"):
        kernel = registry.REGISTRY[name].kernels["cpu"]
        monkeypatch.setitem(registry.REGISTRY[name].kernels, "cpu",
                            lambda *a, _k=kernel, _n=name: ran.append(_n) or _k(*a))
    with pytest.raises(IndexError) as info:
        call(x)
    assert str(info.value).startswith(f"{op}:")
    assert "(3, 4)" in str(info.value)
    assert not ran, f"a kernel ran before the index was checked: {ran}"


def test_index_tensor_errors():
    x = _t(np.zeros((3, 4)))
    with pytest.raises(TypeError, match="gather: index must be an integer tensor"):
        nb.gather(x, 0, _t([[0.0]]))
    with pytest.raises(RuntimeError, match="gather: index must have as many dimensions"):
        nb.gather(x, 0, nb.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="gather: index is larger than self in dim 1"):
        nb.gather(x, 0, nb.tensor([[0] * 5]))
    with pytest.raises(RuntimeError, match="scatter_add: index of shape .* does not fit src"):
        nb.scatter_add(x, 0, nb.tensor([[0, 1, 2]]), _t([[1.0, 2.0]]))
    with pytest.raises(TypeError, match="scatter: give exactly one of src and value"):
        nb.scatter(x, 0, nb.tensor([[0]]))
    with pytest.raises(RuntimeError, match="index_select: index must be 0-D or 1-D"):
        nb.index_select(x, 0, nb.tensor([[0]]))
    with pytest.raises(TypeError, match="masked_fill: mask must be a bool tensor"):
        nb.masked_fill(x, nb.tensor([1, 0, 1, 0]), 1.0)
    with pytest.raises(RuntimeError, match="masked_fill: mask of shape .* do not broadcast"):
        nb.masked_fill(x, nb.tensor(np.ones((2, 3, 5), bool)), 1.0)
    assert nb.masked_fill(x, nb.tensor(np.ones((2,) + tuple(x.shape), bool)), 1.0).shape == \
        (2,) + tuple(x.shape)  # self broadcasts to the mask (issue 14)
    with pytest.raises(RuntimeError, match="masked_fill: value must be a number"):
        nb.masked_fill(x, nb.tensor(np.ones(4, bool)), _t([1.0, 2.0]))
    with pytest.raises(IndexError, match="gather: dim 2 is out of range"):
        nb.gather(x, 2, nb.tensor([[0]]))


def test_axis_alias_and_methods():
    x = _t(np.arange(12.0).reshape(3, 4))
    idx = nb.tensor([[0, 2]])
    np.testing.assert_array_equal(nb.gather(x, 0, idx, axis=1).numpy(),
                                  x.gather(1, idx).numpy())
    np.testing.assert_array_equal(x.index_select(1, nb.tensor([3])).numpy(), [[3], [7], [11]])
    np.testing.assert_array_equal(x.take(nb.tensor([11])).numpy(), [11.0])
