"""Creating tensors: ``tensor`` and the factories of SPEC.md."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import dtypes
from .device import Device
from .kernels.layout import c_contiguous
from .tensor import Tensor

#: installed by nbgrad.complex: ``fn(data, dtype, requires_grad)``, a ComplexTensor of
#: complex data (or a complex dtype), else None
COMPLEX_DATA: list = [None]


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False,
           device: Any = "cpu") -> Tensor:
    """A new tensor holding a copy of ``data`` (scalar, nested list or array); complex data
    gives a :class:`~nbgrad.complex_tensor.ComplexTensor`."""
    try:
        return Tensor(data, dtype=dtype, requires_grad=requires_grad, device=device)
    except TypeError:
        made = None if COMPLEX_DATA[0] is None else COMPLEX_DATA[0](data, dtype, requires_grad)
        if made is None:
            raise
        return made


def as_tensor(data: Any, dtype: Any = None) -> Tensor:
    """``data`` itself when it is a tensor of that dtype, else a new tensor."""
    if isinstance(data, Tensor) and (dtype is None or data.dtype == dtypes.as_dtype(dtype)):
        return data
    return tensor(data, dtype=dtype)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with ``array`` (which must be C-contiguous)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a NumPy array, not {type(array).__name__}")
    dt = dtypes.as_dtype(array.dtype)
    if dt != array.dtype:
        raise TypeError(f"from_numpy: dtype {array.dtype} is not supported (nbgrad.tensor "
                        "converts it, with a copy)")
    if not array.flags.c_contiguous:
        raise TypeError(f"from_numpy: the array (shape {array.shape}, strides "
                        f"{array.strides}) is not C-contiguous, so memory cannot be shared; "
                        "use nbgrad.tensor(array), which copies")
    return Tensor._make(array)


def from_dlpack(obj: Any) -> Tensor:
    """A tensor sharing memory with any DLPack producer on the CPU (a NumPy array, a
    PyTorch tensor, a JAX array...): no copy is made when the data is C-contiguous.

    Writes through either side are seen by the other; JAX arrays come in read-only.
    A non-contiguous producer is copied. The other direction is ``Tensor.__dlpack__``:
    ``torch.from_dlpack(t)``, ``np.from_dlpack(t)`` and ``jax.dlpack.from_dlpack(t)``
    share ``t``'s memory (JAX only for 64-byte-aligned buffers of a dtype it keeps;
    it copies otherwise, e.g. float64 unless ``jax_enable_x64`` is set).
    """
    try:
        arr = np.from_dlpack(obj)
    except (TypeError, BufferError, RuntimeError) as exc:
        raise TypeError(f"from_dlpack: cannot import a {type(obj).__name__} without a copy: "
                        f"{exc}") from None
    try:
        dtypes.as_dtype(arr.dtype)
    except (TypeError, ValueError):
        raise TypeError(f"from_dlpack: dtype {arr.dtype} is not supported by nbgrad") from None
    return Tensor._make(arr if arr.flags.c_contiguous else c_contiguous(arr))


def _shape(size: Sequence[int] | int, op: str = "size") -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    try:
        shape = tuple(operator.index(s) for s in size)
    except TypeError:
        raise TypeError(f"{op}: size must be ints, got {tuple(size)!r}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"{op}: negative dimension in size {shape}")
    return shape


def _make(array: np.ndarray, requires_grad: bool, device: Any) -> Tensor:
    return Tensor(array, requires_grad=requires_grad, device=device) \
        if (requires_grad or Device.of(device).type != "cpu") else Tensor._make(array)


def _dt(dtype: Any, default=dtypes.float64) -> np.dtype:
    return dtypes.as_dtype(dtype) if dtype is not None else default


def zeros(*size, dtype: Any = None, requires_grad: bool = False, device: Any = "cpu") -> Tensor:
    return _make(np.zeros(_shape(size, "zeros"), _dt(dtype)), requires_grad, device)


def ones(*size, dtype: Any = None, requires_grad: bool = False, device: Any = "cpu") -> Tensor:
    return _make(np.ones(_shape(size, "ones"), _dt(dtype)), requires_grad, device)


def empty(*size, dtype: Any = None, requires_grad: bool = False, device: Any = "cpu") -> Tensor:
    return _make(np.zeros(_shape(size, "empty"), _dt(dtype)), requires_grad, device)


def _numbers(op: str, **values: Any) -> None:
    """Refuse, naming ``op``, any of ``values`` that is not a real number."""
    for name, value in values.items():
        if not (isinstance(value, (int, float, np.integer, np.floating, np.bool_))
                or (isinstance(value, Tensor) and value.ndim == 0)):
            raise TypeError(f"{op}: {name} must be a number, not {type(value).__name__}")


def full(size, fill_value, dtype: Any = None, requires_grad: bool = False,
         device: Any = "cpu") -> Tensor:
    _numbers("full", fill_value=fill_value)
    default = dtypes.as_dtype(np.asarray(fill_value).dtype)
    shape = _shape((size,) if isinstance(size, (int, np.integer)) else tuple(size), "full")
    return _make(np.full(shape, fill_value, _dt(dtype, default)), requires_grad, device)


def _like(t: Tensor, value: float, dtype: Any, requires_grad: bool, device: Any) -> Tensor:
    dt = _dt(dtype, t.dtype)
    return _make(np.full(t.shape, value, dt), requires_grad,
                 t.device if device is None else device)


def full_like(t: Tensor, fill_value, dtype: Any = None, requires_grad: bool = False, *,
              device: Any = None) -> Tensor:
    """``fill_value`` in the shape (and dtype and device) of ``t``."""
    return _like(t, fill_value, dtype, requires_grad, device)


def empty_like(t: Tensor, dtype: Any = None, requires_grad: bool = False, *,
               device: Any = None) -> Tensor:
    """A tensor of the shape (and dtype and device) of ``t`` (zeros)."""
    return _like(t, 0, dtype, requires_grad, device)


def arange(start, end=None, step=1, dtype: Any = None, requires_grad: bool = False,
           device: Any = "cpu") -> Tensor:
    if end is None:
        start, end = 0, start
    _numbers("arange", start=start, end=end, step=step)
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    arr = np.arange(start, end, step)
    return _make(arr.astype(_dt(dtype, dtypes.as_dtype(arr.dtype))), requires_grad, device)


def linspace(start: float, end: float, steps: int, dtype: Any = None,
             requires_grad: bool = False, device: Any = "cpu") -> Tensor:
    _numbers("linspace", start=start, end=end)
    steps = _shape((steps,), "linspace")[0]
    return _make(np.linspace(start, end, steps, dtype=_dt(dtype)), requires_grad, device)


def eye(n: int, m: int | None = None, dtype: Any = None, requires_grad: bool = False,
        device: Any = "cpu") -> Tensor:
    n, m = _shape((n, n if m is None else m), "eye")
    return _make(np.eye(n, m, dtype=_dt(dtype)), requires_grad, device)
