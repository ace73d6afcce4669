"""Interop: DLPack exchange without copies (NumPy, PyTorch, JAX) and ``__array__`` objects."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb


def _aligned(n: int, dtype=np.float32, align: int = 64) -> np.ndarray:
    """A C-contiguous 1-D array whose data starts on an ``align``-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    buf = np.empty(n * itemsize + align, np.uint8)
    off = (-buf.ctypes.data) % align
    return buf[off:off + n * itemsize].view(dtype)


# ------------------------------------------------------------------ NumPy
def test_numpy_imports_a_tensor_without_copy():
    t = nb.tensor([[1.0, 2.0], [3.0, 4.0]])
    a = np.from_dlpack(t)
    assert np.shares_memory(a, t.numpy())
    with nb.no_grad():
        t.mul_(2.0)
    np.testing.assert_array_equal(a, [[2.0, 4.0], [6.0, 8.0]])


def test_from_dlpack_shares_a_numpy_array():
    a = np.arange(6.0).reshape(2, 3)
    t = nb.from_dlpack(a)
    assert np.shares_memory(t.numpy(), a)
    a[1, 2] = -7.0
    assert t[1, 2].item() == -7.0


def test_from_dlpack_copies_only_a_non_contiguous_producer():
    a = np.arange(12.0).reshape(3, 4)[:, ::2]
    t = nb.from_dlpack(a)
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.numpy().flags.c_contiguous


def test_from_dlpack_rejects_an_unsupported_dtype():
    with pytest.raises(TypeError, match="from_dlpack"):
        nb.from_dlpack(np.ones(3, np.float16))


def test_tensor_from_an_object_with_array():
    class Modern:
        def __array__(self, dtype=None, copy=None):
            return np.array([1.0, 2.0, 3.0])

    class Legacy:  # an older __array__ without the dtype/copy keywords
        def __array__(self):
            return np.array([[1, 2], [3, 4]], np.int32)

    t = nb.tensor(Modern(), requires_grad=True)
    assert t.dtype == np.float64 and t.requires_grad
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0, 3.0])
    u = nb.tensor(Legacy())
    assert u.dtype == np.int32 and u.shape == (2, 2)
    assert nb.tensor(Legacy(), dtype="float64").dtype == np.float64


def test_tensor_copies_the_data_of_an_array_object():
    src = np.arange(4.0)

    class Wrapper:
        def __array__(self, dtype=None, copy=None):
            return src

    t = nb.tensor(Wrapper())
    src[0] = 99.0
    assert t[0].item() == 0.0


# ------------------------------------------------------------------ PyTorch
def test_torch_shares_memory_both_ways():
    torch = pytest.importorskip("torch")
    t = nb.tensor([[1.0, 2.0], [3.0, 4.0]], dtype="float32")
    tt = torch.from_dlpack(t)
    assert tt.data_ptr() == t.numpy().ctypes.data
    assert tt.dtype == torch.float32
    tt[0, 0] = 10.0  # a write through torch is seen by nbgrad
    assert t[0, 0].item() == 10.0

    src = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    n = nb.from_dlpack(src)
    assert n.numpy().ctypes.data == src.data_ptr()
    src[1, 1] = -1.0
    assert n[1, 1].item() == -1.0
    assert n.shape == (2, 3) and n.dtype == np.float64


def test_torch_tensor_through_array_is_a_copy_and_differentiable():
    torch = pytest.importorskip("torch")
    src = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    t = nb.tensor(src, requires_grad=True)
    src[0] = 50.0
    assert t[0].item() == 1.0
    (t * t).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), [2.0, 4.0, 6.0])


# ------------------------------------------------------------------ JAX
def test_jax_array_into_nbgrad_without_copy():
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    t = nb.from_dlpack(x)
    assert t.numpy().ctypes.data == x.unsafe_buffer_pointer()
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))
    assert not t.numpy().flags.writeable  # JAX arrays are immutable
    with pytest.raises(RuntimeError, match="read-only"), nb.no_grad():
        t.add_(1.0)
    assert float((nb.exp(t) * 0).sum().item()) == 0.0  # usable as an input


def test_jax_imports_an_aligned_tensor_without_copy():
    jax = pytest.importorskip("jax")
    buf = _aligned(6)
    buf[:] = np.arange(6)
    t = nb.from_numpy(buf.reshape(2, 3))
    j = jax.dlpack.from_dlpack(t)
    assert j.unsafe_buffer_pointer() == buf.ctypes.data
    with nb.no_grad():
        t.add_(1.0)  # a write through nbgrad is seen by JAX
    np.testing.assert_array_equal(np.asarray(j), np.arange(1, 7).reshape(2, 3))
