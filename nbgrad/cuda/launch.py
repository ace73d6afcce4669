"""Kernel launches: Numba's, without its per-launch bookkeeping once a kernel is known.

``kernel[grid, block](*args)`` makes a launch configuration (a stream object, a
grid-size check), types every argument in Numba's dispatcher and then launches the
compiled kernel. nbgrad launches the same few kernels with the same kinds of argument
over and over, so :func:`run_kernel` keeps, on each dispatcher, the compiled kernel found
for a *key* of the arguments' kinds (each array's dtype, dimensions and strides, each
scalar's Python type, tuples element by element) and launches it directly with
Numba's own ``launch``, which converts the arguments as always. The first launch of a
key, and any argument the key does not cover, goes through Numba's dispatcher, which
compiles what is missing; the kernel is kept only if Numba's typing of the arguments
finds it among the dispatcher's overloads (else the key is remembered as one that
always goes through the dispatcher).

``NBGRAD_CUDA_FAST_LAUNCH=0`` sends every launch through the dispatcher. The simulator
always does (it has no compiled kernels).

Importing this module (with nbgrad's CUDA arrays) also turns off Numba's warning at
every launch of fewer than 128 blocks, unless the environment sets
``NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS``: nbgrad sizes each grid to its data, so a small
tensor's launch printed a hint its user cannot act on (and the check cost time at every
launch). The setting is Numba's, for the whole process.
"""

from __future__ import annotations

import os
from typing import Any

from numba.cuda.core import config as _cuda_config
from numba.cuda.errors import normalize_kernel_dimensions

if not _cuda_config.ENABLE_CUDASIM:  # (the simulator has no driver)
    from numba.cuda.cudadrv import driver as _driver
    from numba.cuda.cudadrv.devicearray import DeviceNDArray as _DeviceNDArray
else:
    _DeviceNDArray = None

__all__ = ["run_kernel"]

if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in os.environ:
    _cuda_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0

_ENABLED = (not _cuda_config.ENABLE_CUDASIM
            and os.environ.get("NBGRAD_CUDA_FAST_LAUNCH", "1") not in ("0", ""))
_INT64 = (-(1 << 63), 1 << 63)
_DIMS: dict[tuple, tuple] = {}
_STREAM: list = []  # the default stream, as Numba's launch takes it (made at the first launch)
_NEW = object()  # a key not seen yet


class _Unkeyed(Exception):
    """An argument whose Numba type the key cannot tell."""


def _key(value: Any) -> Any:
    t = type(value)
    if t is int:
        if not _INT64[0] <= value < _INT64[1]:
            raise _Unkeyed
        return int
    if t is float or t is bool:
        return t
    if t is tuple:
        return tuple(_key(v) for v in value)
    if t is _DeviceNDArray:
        if value.ndim != 1:
            return value._numba_type_
        return (value.dtype, value.strides[0], min(value.shape[0], 2))  # (Numba's layout)
    raise _Unkeyed


def _dims(griddim, blockdim) -> tuple:
    dims = _DIMS.get((griddim, blockdim))
    if dims is None:
        if len(_DIMS) > 4096:
            _DIMS.clear()
        dims = _DIMS[(griddim, blockdim)] = normalize_kernel_dimensions(griddim, blockdim)
    return dims


def run_kernel(kernel, griddim, blockdim, *args) -> None:
    """``kernel[griddim, blockdim](*args)`` on the default stream (see the module doc)."""
    if not _ENABLED:
        kernel[griddim, blockdim](*args)
        return
    if not _STREAM:
        _STREAM.append(_driver._to_core_stream(0))
    try:
        key = tuple(_key(a) for a in args)
    except _Unkeyed:
        kernel[griddim, blockdim](*args)
        return
    known = kernel.__dict__.get("_nbgrad_launch")
    if known is None:
        known = kernel.__dict__["_nbgrad_launch"] = {}
    compiled = known.get(key, _NEW)
    if compiled is _NEW:  # Numba types, compiles and launches; then is the kernel found?
        kernel[griddim, blockdim](*args)
        compiled = kernel.overloads.get(tuple(kernel.typeof_pyval(a) for a in args))
        if getattr(compiled, "launch_config_sensitive", False):
            compiled = None
        known[key] = compiled  # (None: this key always goes through the dispatcher)
    elif compiled is None:
        kernel[griddim, blockdim](*args)
    else:
        compiled.launch(args, *_dims(griddim, blockdim), _STREAM[0], 0)
