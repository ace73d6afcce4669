"""Moving arrays between devices. The CUDA side loads lazily (``nbgrad[cuda]``).

CUDA data is a :class:`nbgrad.cuda.array.CudaArray`; the first transfer to the GPU
imports ``numba.cuda`` and registers the CUDA kernels (:func:`nbgrad.cuda.register`).
"""

from __future__ import annotations

from typing import Any

from ..device import Device


def _cuda():
    try:
        from numba import cuda
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("device 'cuda' needs numba's CUDA support: "
                           "pip install 'nbgrad[cuda]'") from exc
    if not cuda.is_available():
        raise RuntimeError("device 'cuda': no CUDA GPU is available (set "
                           "NUMBA_ENABLE_CUDASIM=1 before importing nbgrad to use Numba's "
                           "simulator)")
    return cuda


def is_cuda_array(array: Any) -> bool:
    """Whether ``array`` is CUDA data (without importing numba.cuda)."""
    return type(array).__name__ == "CudaArray" and hasattr(array, "copy_to_host")


def to_device(array, device: Device):
    """``array`` (host or CUDA data) as data on ``device``: a copy unless already there."""
    if device.type == "cpu":
        return to_host(array)
    if device.index:
        raise RuntimeError(f"device {device}: nbgrad uses one GPU, 'cuda' (cuda:0)")
    _cuda()
    from ..cuda import ensure_registered
    from ..cuda.array import as_cuda
    ensure_registered()
    if is_cuda_array(array):
        return array.copy()
    return as_cuda(array)


def to_host(array):
    if hasattr(array, "copy_to_host"):
        return array.copy_to_host()
    return array
