"""CUDA kernels of the conversions (as :mod:`nbgrad.ops.convert` on the CPU)."""

from __future__ import annotations

from ...device import Device
from ...ops.registry import kernel
from ..array import CudaArray


@kernel("to_dtype", target="cuda")
def _to_dtype(x: CudaArray, dtype) -> CudaArray:
    return x.astype(dtype)


@kernel("to_device", target="cuda")
def _to_device(x: CudaArray, device: str):
    return x.copy_to_host() if Device.of(device).type == "cpu" else x.copy()
