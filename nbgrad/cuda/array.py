"""``CudaArray``: a strided view of a flat CUDA buffer, the data of a CUDA tensor.

Numba's device arrays are the memory; this class adds what the rest of nbgrad reads
from a tensor's data (``shape``, ``dtype``, ``strides``, ``flags``, ``copy()``...) and
makes views cheap: ``permute``, ``expand`` (stride 0), slicing and reshaping a
contiguous array only change ``shape``, ``strides`` (in elements) and ``offset``, and
every kernel reads its operands through those strides. The same code runs on a GPU
and under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).

NumPy functions that nbgrad's core calls on tensor data (``np.copyto``,
``np.may_share_memory``, ``np.shares_memory``) are answered on the device through
``__array_function__``; every other NumPy function, and ``np.asarray``, raises
``TypeError`` instead of silently copying to the host.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import cuda
from numba.cuda.core import config as _cuda_config

from . import kernels as K
from .launch import run_kernel
from .memory import device_buffer

#: True under Numba's CUDA simulator
SIMULATED: bool = bool(_cuda_config.ENABLE_CUDASIM)
#: threads per block of 1-D launches (the simulator runs one Python thread per CUDA thread)
TPB: int = 32 if SIMULATED else 256
#: most blocks of a grid-stride launch
MAX_BLOCKS: int = 2 if SIMULATED else 4096


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-order strides, in elements."""
    strides = []
    step = 1
    for s in reversed(shape):
        strides.append(step)
        step *= max(int(s), 1)
    return tuple(reversed(strides))


def grid_1d(n: int) -> tuple[int, int]:
    """(blocks, threads) of a grid-stride launch over ``n`` items."""
    return max(1, min(math.ceil(n / TPB), MAX_BLOCKS)), TPB


class _Flags:
    __slots__ = ("c_contiguous", "f_contiguous", "writeable")

    def __init__(self, c: bool, f: bool, w: bool) -> None:
        self.c_contiguous = c
        self.f_contiguous = f
        self.writeable = w


class CudaArray:
    """A strided array in CUDA memory (a view of ``buf``, a flat Numba device array)."""

    __slots__ = ("buf", "shape", "strides", "offset", "dtype", "base", "writeable")
    __array_priority__ = 2000

    def __init__(self, buf, shape: tuple[int, ...], strides: tuple[int, ...] | None = None,
                 offset: int = 0, base: CudaArray | None = None, writeable: bool = True
                 ) -> None:
        self.buf = buf
        self.shape = tuple(int(s) for s in shape)
        self.strides = contiguous_strides(self.shape) if strides is None else \
            tuple(int(s) for s in strides)
        self.offset = int(offset)
        self.dtype = np.dtype(buf.dtype)
        self.base = base
        self.writeable = writeable

    # ------------------------------------------------------------------ metadata
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def root(self) -> CudaArray:
        """The array that owns the memory."""
        return self if self.base is None else self.base

    def is_contiguous(self) -> bool:
        """C-contiguous (dimensions of size 1 may have any stride)."""
        step = 1
        for s, st in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if s != 1 and st != step:
                return False
            step *= s
        return True

    @property
    def flags(self) -> _Flags:
        c = self.is_contiguous()
        f = c if self.ndim <= 1 else \
            self.permuted(tuple(range(self.ndim - 1, -1, -1))).is_contiguous()
        return _Flags(c, f, self.writeable)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"CudaArray(shape={self.shape}, dtype={self.dtype})"

    # ------------------------------------------------------------------ views
    def view_as(self, shape, strides, offset: int, writeable: bool | None = None) -> CudaArray:
        """A view of the same memory with new metadata."""
        return CudaArray(self.buf, shape, strides, offset, self.root,
                         self.writeable if writeable is None else writeable)

    def reshape(self, *shape) -> CudaArray:
        """A view when contiguous, else a reshaped contiguous copy (NumPy's rule)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = _resolve_shape(tuple(int(s) for s in shape), self.size)
        src = self if self.is_contiguous() else self.copy()
        return src.view_as(shape, contiguous_strides(shape), src.offset)

    def permuted(self, dims: tuple[int, ...]) -> CudaArray:
        return self.view_as(tuple(self.shape[d] for d in dims),
                            tuple(self.strides[d] for d in dims), self.offset)

    def broadcast_to(self, shape: tuple[int, ...]) -> CudaArray:
        """A read-only view with stride 0 along broadcast dimensions."""
        shape = tuple(int(s) for s in shape)
        lead = len(shape) - self.ndim
        if lead < 0:
            raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        strides = [0] * lead
        for i, (s, st) in enumerate(zip(self.shape, self.strides, strict=True)):
            want = shape[lead + i]
            if s == want:
                strides.append(st)
            elif s == 1:
                strides.append(0)
            else:
                raise ValueError(f"cannot broadcast {self.shape} to {shape}")
        if shape == self.shape:
            return self.view_as(shape, tuple(strides), self.offset)
        return self.view_as(shape, tuple(strides), self.offset, writeable=False)

    # ------------------------------------------------------------------ copies
    def copy(self) -> CudaArray:
        """A C-contiguous copy on the device."""
        return self.astype(self.dtype)

    def astype(self, dtype, copy: bool = True) -> CudaArray:
        dtype = np.dtype(dtype)
        if not copy and dtype == self.dtype:
            return self
        out = empty(self.shape, dtype)
        copy_into(out, self)
        return out

    def copy_to_host(self) -> np.ndarray:
        if self.size == 0:
            return np.empty(self.shape, self.dtype)
        src = self
        if not (self.is_contiguous() and self.offset == 0 and self.buf.size == self.size):
            src = self.copy()
        return src.buf.copy_to_host().reshape(self.shape)

    def min(self):  # noqa: A003 - NumPy's name
        """The smallest element, as a host scalar (a device reduction, then a copy)."""
        return self._extreme(K.MIN, "minimum")

    def max(self):  # noqa: A003 - NumPy's name
        """The largest element, as a host scalar (a device reduction, then a copy)."""
        return self._extreme(K.MAX, "maximum")

    def _extreme(self, op: int, name: str):
        if self.size == 0:
            raise ValueError(f"zero-size array to reduction operation {name} which has no "
                             "identity")
        from .compute import reduce
        out = reduce(self, tuple(range(self.ndim)), (), op, self.dtype)
        return out.copy_to_host()[()]

    # ------------------------------------------------------------------ NumPy protocol
    def __array__(self, dtype=None, copy=None):
        raise TypeError("a CUDA tensor's data cannot be converted to a NumPy array "
                        "implicitly; use .cpu() or .numpy()")

    def __array_function__(self, func, types, args, kwargs):
        handler = _HANDLED.get(func)
        if handler is None:
            raise TypeError(f"numpy.{func.__name__} is not supported on CUDA data; "
                            "move the tensor with .cpu() first")
        return handler(*args, **kwargs)


def _resolve_shape(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    if shape.count(-1) > 1:
        raise ValueError("can only specify one unknown dimension")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    if math.prod(shape) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
    return shape


# ---------------------------------------------------------------------- allocation
def empty(shape: tuple[int, ...], dtype) -> CudaArray:
    """An uninitialised C-contiguous array (at least one element is allocated)."""
    shape = tuple(int(s) for s in shape)
    return CudaArray(device_buffer(math.prod(shape), dtype), shape)


def full(shape: tuple[int, ...], value, dtype) -> CudaArray:
    out = empty(shape, dtype)
    n = out.size
    if n:
        blocks, threads = grid_1d(n)
        run_kernel(K.fill, blocks, threads, out.buf, n, value)
    return out


def zeros(shape: tuple[int, ...], dtype) -> CudaArray:
    return full(shape, 0, dtype)


def from_host(array: np.ndarray) -> CudaArray:
    """Copy a host array to the device (C order)."""
    arr = np.asarray(array)
    if not arr.flags.c_contiguous:  # (np.ascontiguousarray would make a 0-d array 1-d)
        arr = np.array(arr, order="C")
    flat = arr.reshape(-1) if arr.size else np.zeros(1, arr.dtype)
    return CudaArray(cuda.to_device(flat), arr.shape)


_CONSTANTS: dict = {}


def as_cuda(value, dtype=None) -> CudaArray:
    """``value`` as a CudaArray (uploading host arrays and scalars).

    Read-only 0-d host arrays (the constants nbgrad makes for Python scalar operands)
    are uploaded once and cached as read-only device arrays.
    """
    if isinstance(value, CudaArray):
        return value if dtype is None else value.astype(dtype, copy=False)
    arr = np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)
    if arr.ndim == 0 and not arr.flags.writeable:
        key = (arr.dtype.str, arr.tobytes())
        out = _CONSTANTS.get(key)
        if out is None:
            out = from_host(arr)
            out.writeable = False
            if len(_CONSTANTS) < 1024:
                _CONSTANTS[key] = out
        return out
    return from_host(arr)


# ---------------------------------------------------------------------- strided copies
def collapse(shape: tuple[int, ...], *strides: tuple[int, ...]
             ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent dimensions that every operand walks contiguously; drop size-1 ones.

    Returns at least one dimension, so kernels can always index ``shape[-1]``.
    """
    dims = [i for i, s in enumerate(shape) if s != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for i in dims:
        if out_shape and all(st[i] * shape[i] == o[-1]
                             for st, o in zip(strides, out_strides, strict=True)):
            out_shape[-1] *= shape[i]
            for st, o in zip(strides, out_strides, strict=True):
                o[-1] = st[i]
            continue
        out_shape.append(shape[i])
        for st, o in zip(strides, out_strides, strict=True):
            o.append(st[i])
    if not out_shape:
        return (1,), [(0,) for _ in strides]
    return tuple(out_shape), [tuple(o) for o in out_strides]


def copy_into(dst: CudaArray, src) -> None:
    """``dst[...] = src`` with broadcasting and dtype conversion (both on the device)."""
    if not isinstance(src, CudaArray):
        src = as_cuda(np.asarray(src))
    if src.shape != dst.shape:
        src = src.broadcast_to(dst.shape)
    n = dst.size
    if n == 0:
        return
    shape, (ds, ss) = collapse(dst.shape, dst.strides, src.strides)
    blocks, threads = grid_1d(n)
    run_kernel(K.copy_strided, blocks, threads, dst.buf, dst.offset, ds, src.buf, src.offset, ss,
               shape, n)


# ---------------------------------------------------------------------- NumPy functions
def _copyto(dst, src, casting: str = "same_kind", where: Any = True) -> None:
    if where is not True:
        raise TypeError("numpy.copyto(where=...) is not supported on CUDA data")
    if not isinstance(dst, CudaArray):
        raise TypeError("numpy.copyto: cannot copy CUDA data into a host array; use .cpu()")
    src_dtype = src.dtype if isinstance(src, CudaArray) else np.asarray(src).dtype
    if not np.can_cast(src_dtype, dst.dtype, casting=casting):
        raise TypeError(f"Cannot cast array data from {src_dtype} to {dst.dtype} according "
                        f"to the rule {casting!r}")
    copy_into(dst, src)


def _may_share_memory(a, b, max_work=None) -> bool:
    if isinstance(a, CudaArray) and isinstance(b, CudaArray):
        return a.buf is b.buf or a.root is b.root
    return False


_HANDLED = {
    np.copyto: _copyto,
    np.may_share_memory: _may_share_memory,
    np.shares_memory: _may_share_memory,
}
