"""Dtype and device conversion: ``to_dtype`` (a differentiable cast) and ``Tensor.to``."""

from __future__ import annotations

import numpy as np

from .. import backends, dtypes
from ..device import Device
from ..tensor import Tensor
from .dispatch import apply
from .registry import get, kernel, op_function
from .traits import Cast, Opaque, batching

__all__ = ["to", "to_device", "to_dtype"]


_TO_DTYPE = get("to_dtype")
_TO_DEVICE = get("to_device")


@kernel("to_dtype", kind=Cast())
def _to_dtype_kernel(x, dtype):
    return x.astype(dtype)


@op_function("to_dtype")
def to_dtype(self: Tensor, dtype) -> Tensor:
    """Cast to ``dtype``; the gradient is cast back to the input's dtype."""
    dt = dtypes.as_dtype(dtype)
    if self._data.dtype == dt:
        return self
    return apply(_TO_DTYPE, (self, dt))


@kernel("to_device", kind=Opaque(why_not_native=(
    "it copies between devices (host and CUDA memory), which @njit code cannot do")),
        batch=batching("leading"))
def _to_device_kernel(x, device):
    if isinstance(x, np.ndarray):
        return backends.to_device(x, Device.of(device)) if Device.of(device).type != "cpu" \
            else x.copy()
    host = backends.to_host(x)
    return host if Device.of(device).type == "cpu" else backends.to_device(host, Device.of(device))


@op_function("to_device")
def to_device(self: Tensor, device: str) -> Tensor:
    """Copy to ``device``; the gradient is copied back."""
    dev = Device.of(device)
    if self._device == dev:
        return self
    out = apply(_TO_DEVICE, (self, str(dev)))
    out._device = dev
    return out


def to(self: Tensor, *args, **kwargs) -> Tensor:
    """``to(device)``, ``to(dtype)``, ``to(device, dtype)`` or keywords of the same names;
    ``copy=True`` returns a copy even when nothing changes (``non_blocking`` and
    ``memory_format`` are accepted and have no effect)."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    copy = bool(kwargs.pop("copy", False))
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)  # one memory layout here: accepted, no effect
    if kwargs:
        raise TypeError(f"to(): unexpected arguments {sorted(kwargs)}")
    flags = [a for a in args if isinstance(a, (bool, np.bool_))]  # (non_blocking, copy)
    args = tuple(a for a in args if not isinstance(a, (bool, np.bool_)))
    if len(flags) > 1:
        copy = copy or bool(flags[1])
    for a in args:
        if isinstance(a, (Device,)) or (isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda")):
            device = a
        elif isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        else:
            dtype = a
    out = self
    if dtype is not None:
        out = to_dtype(out, dtype)
    if device is not None:
        out = to_device(out, device)
    if copy and out is self:
        out = apply(get("contiguous"), (self,))  # clone: a copy that stays in the graph
    return out
