"""Tensor construction, attributes, dtypes, operators, NumPy interop and indexing."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb


def test_tensor_from_scalars_lists_and_arrays_keeps_numpy_dtypes():
    assert nb.tensor(1.5).dtype == np.float64 and nb.tensor(1.5).shape == ()
    assert nb.tensor([1, 2]).dtype == np.int64
    assert nb.tensor([True, False]).dtype == np.bool_
    assert nb.tensor(np.ones(3, np.float32)).dtype == np.float32
    assert nb.tensor([1, 2], dtype=nb.float32).dtype == np.float32


def test_tensor_copies_non_contiguous_and_negative_stride_arrays():
    base = np.arange(12.0).reshape(3, 4)
    t = nb.tensor(base[:, ::-2])
    np.testing.assert_array_equal(t.numpy(), base[:, ::-2])
    base[0, 3] = 100.0
    assert t.numpy()[0, 0] == 3.0


def test_bad_data_and_dtypes_raise_type_errors():
    with pytest.raises(TypeError, match="float16"):
        nb.tensor(np.ones(2, np.float16))
    with pytest.raises(TypeError):
        nb.tensor(["a", "b"])
    with pytest.raises(TypeError):
        nb.tensor(None)
    with pytest.raises(TypeError, match="floating"):
        nb.tensor([1, 2], requires_grad=True)


def test_attributes():
    t = nb.tensor(np.ones((2, 3)), requires_grad=True)
    assert t.shape == (2, 3) and t.ndim == 2 and t.size == 6 and t.device == "cpu"
    assert t.is_leaf and t.requires_grad and t.grad is None and t.grad_fn is None
    assert t.T.shape == (3, 2)
    y = t * 2
    assert not y.is_leaf and y.grad_fn is not None


def test_factories():
    assert nb.zeros(2, 3).shape == (2, 3) and nb.zeros((2, 3)).numpy().sum() == 0
    assert nb.ones(4, dtype=nb.float32).dtype == np.float32
    np.testing.assert_array_equal(nb.full((2,), 7.0).numpy(), [7.0, 7.0])
    np.testing.assert_array_equal(nb.arange(5).numpy(), np.arange(5))
    np.testing.assert_allclose(nb.linspace(0, 1, 5).numpy(), np.linspace(0, 1, 5))
    np.testing.assert_array_equal(nb.eye(3).numpy(), np.eye(3))
    t = nb.tensor([[1.0, 2.0]])
    assert nb.zeros_like(t).shape == (1, 2) and nb.ones_like(t).numpy().sum() == 2


def test_promotion_follows_numpy_and_python_scalars_are_weak():
    f32 = nb.ones(2, dtype=nb.float32)
    f64 = nb.ones(2)
    i64 = nb.tensor([1, 2])
    assert (f32 + f64).dtype == np.float64
    assert (f32 * 2.5).dtype == np.float32
    assert (2.5 * f32).dtype == np.float32
    assert (i64 + 1).dtype == np.int64
    assert (i64 + 1.5).dtype == np.float64
    assert (i64 / 2).dtype == np.float64
    assert nb.exp(i64).dtype == np.float64


def test_numpy_interop():
    t = nb.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    a = np.asarray(t)
    assert isinstance(a, np.ndarray) and a.shape == (2, 2)
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.item() if t.size == 1 else True
    assert nb.tensor(3.0).item() == 3.0
    assert t.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert isinstance(np.ones(2) + nb.ones(2), nb.Tensor)  # NumPy defers to our operators


def test_operators():
    a, b = nb.tensor([1.0, 4.0]), nb.tensor([2.0, 2.0])
    np.testing.assert_allclose((a + b).numpy(), [3, 6])
    np.testing.assert_allclose((a - b).numpy(), [-1, 2])
    np.testing.assert_allclose((a * b).numpy(), [2, 8])
    np.testing.assert_allclose((a / b).numpy(), [0.5, 2])
    np.testing.assert_allclose((a ** b).numpy(), [1, 16])
    np.testing.assert_allclose((-a).numpy(), [-1, -4])
    np.testing.assert_allclose(abs(-a).numpy(), [1, 4])
    assert (a @ b).item() == 10.0
    np.testing.assert_allclose((1 - a).numpy(), [0, -3])
    np.testing.assert_allclose((8 / a).numpy(), [8, 2])


def test_comparisons_return_bool_tensors_without_grad():
    a = nb.tensor([1.0, 2.0], requires_grad=True)
    c = a > 1.5
    assert c.dtype == np.bool_ and not c.requires_grad
    np.testing.assert_array_equal(c.numpy(), [False, True])
    np.testing.assert_array_equal((a == nb.tensor([1.0, 0.0])).numpy(), [True, False])


def test_basic_and_advanced_indexing_match_numpy():
    x = np.arange(24.0).reshape(2, 3, 4)
    t = nb.tensor(x)
    for idx in [1, (1, 2), (slice(None), 0), (Ellipsis, 1), (None, 0), (0, slice(None, None, -1)),
                ([0, 1, 1],), (slice(None), [2, 0]), (x[..., 0] > 5,), (nb.tensor([1, 0]),)]:
        np.testing.assert_array_equal(t[idx].numpy(), x[idx if not isinstance(idx, tuple) or
                                                        not isinstance(idx[0], nb.Tensor)
                                                        else (idx[0].numpy(),)])


def test_basic_indexing_is_a_view_sharing_the_version():
    t = nb.zeros(3, 3)
    v = t[1]
    v.fill_(2.0)
    assert t.numpy()[1].tolist() == [2.0, 2.0, 2.0] and t._version == 1


def test_advanced_index_gradient_accumulates_repeats():
    x = nb.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[[0, 2, 2, 2]].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 0.0, 3.0])


def test_index_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match="out of range"):
        nb.zeros(3)[5]
    with pytest.raises(IndexError):
        nb.zeros(3)[[0, 7]]


def test_shape_mismatch_names_the_op_and_shapes():
    with pytest.raises(RuntimeError, match=r"add: shapes \(2, 3\) and \(4,\)"):
        nb.add(nb.ones(2, 3), nb.ones(4))
    with pytest.raises(RuntimeError, match=r"where: shapes"):
        nb.where(nb.ones(2, 3) > 0, nb.ones(2), nb.ones(3))
    with pytest.raises(RuntimeError, match="matmul"):
        nb.ones(2, 3) @ nb.ones(4, 2)


def test_repr_and_bool():
    assert "requires_grad=True" in repr(nb.tensor([1.0], requires_grad=True))
    assert bool(nb.tensor(1.0)) and not bool(nb.tensor(0.0))
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(nb.ones(2))


def test_random_factories_are_seeded():
    a = nb.random.normal((3, 2), seed=7)
    b = nb.random.normal((3, 2), seed=7)
    assert a.shape == (3, 2) and a.dtype == np.float64
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    u = nb.random.uniform(1000, low=2.0, high=3.0, seed=1, dtype=nb.float32)
    assert u.dtype == np.float32 and 2.0 <= u.numpy().min() and u.numpy().max() < 3.0
    nb.random.seed(5)
    c = nb.random.normal(4)
    nb.random.seed(5)
    np.testing.assert_array_equal(c.numpy(), nb.random.normal(4).numpy())
