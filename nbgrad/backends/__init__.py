"""Moving arrays between devices. The CUDA side loads lazily (``nbgrad[cuda]``)."""

from __future__ import annotations

from ..device import Device


def _cuda():
    try:
        from numba import cuda
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("device 'cuda' needs numba's CUDA support: "
                           "pip install 'nbgrad[cuda]'") from exc
    if not cuda.is_available():
        raise RuntimeError("device 'cuda': no CUDA GPU is available (set "
                           "NUMBA_ENABLE_CUDASIM=1 to use Numba's simulator)")
    return cuda


def to_device(array, device: Device):
    if device.type == "cpu":
        return to_host(array)
    return _cuda().to_device(array)


def to_host(array):
    if hasattr(array, "copy_to_host"):
        return array.copy_to_host()
    return array
