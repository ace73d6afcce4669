"""Device memory of CUDA tensors: a caching pool over ``cuMemAlloc``, as PyTorch keeps.

Numba's ``cuda.device_array`` calls ``cuMemAlloc`` for every array, and frees through a
queue that calls ``cuMemFree`` (which waits for the device) every ten frees. An eager
CUDA step allocates an array per op, so those driver calls were most of its time. The
pool keeps a freed block under its rounded size and gives it to the next array of that
size. nbgrad launches every kernel on the default stream, so the kernels that write a
reused block run after those that read it before.

Only nbgrad's arrays come from the pool; Numba arrays that user code makes do not.
``NBGRAD_CUDA_POOL=0`` turns it off (each array then comes from ``cuda.device_array``),
:func:`empty_cache` gives the cached blocks back to the driver, and an allocation that
finds the device full empties the cache and tries once more. The simulator
(``NUMBA_ENABLE_CUDASIM=1``) has no driver, so it always uses ``cuda.device_array``.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda
from numba.cuda.core import config as _cuda_config

if not _cuda_config.ENABLE_CUDASIM:  # (the simulator has no driver)
    from numba.cuda.cudadrv import driver as _drv
    from numba.cuda.cudadrv.devicearray import DeviceNDArray as _DeviceNDArray

__all__ = ["BlockPool", "device_buffer", "empty_cache", "memory_stats", "rounded_size"]

_SMALL = 1 << 20  # below 1 MiB, sizes round up to 512 bytes


def rounded_size(nbytes: int) -> int:
    """The size of the block that holds ``nbytes``: a multiple of 512 below 1 MiB, above
    it one of eight steps per power of two (at most 12.5% more than asked)."""
    nbytes = max(int(nbytes), 1)
    if nbytes < _SMALL:
        return -(-nbytes // 512) * 512
    step = 1 << (nbytes.bit_length() - 1 - 3)  # an eighth of the power of two below
    return -(-nbytes // step) * step


class BlockPool:
    """Free blocks by size over an ``alloc(size) -> block`` and a ``free(block)``.

    ``take`` reuses a cached block of the same rounded size or allocates one; if
    ``alloc`` raises an error that ``is_oom`` accepts, the cache is emptied and ``alloc``
    tried again. ``give`` caches a block for reuse.
    """

    def __init__(self, alloc: Callable[[int], Any], free: Callable[[Any], None],
                 is_oom: Callable[[BaseException], bool] = lambda exc: False) -> None:
        self._alloc, self._free, self._is_oom = alloc, free, is_oom
        self._cached: dict[int, list[Any]] = {}
        self._lock = threading.Lock()
        self.cached_bytes = 0
        self.in_use_bytes = 0

    def take(self, size: int) -> Any:
        with self._lock:
            blocks = self._cached.get(size)
            if blocks:
                self.cached_bytes -= size
                self.in_use_bytes += size
                return blocks.pop()
        try:
            block = self._alloc(size)
        except Exception as exc:
            if not self._is_oom(exc):
                raise
            self.release()
            block = self._alloc(size)
        with self._lock:
            self.in_use_bytes += size
        return block

    def give(self, size: int, block: Any) -> None:
        with self._lock:
            self._cached.setdefault(size, []).append(block)
            self.cached_bytes += size
            self.in_use_bytes -= size

    def release(self) -> None:
        """Free every cached block."""
        with self._lock:
            blocks = [b for bs in self._cached.values() for b in bs]
            self._cached.clear()
            self.cached_bytes = 0
        for b in blocks:
            self._free(b)


class _DevicePool:
    """The pool of one CUDA context, and the owners Numba's device arrays point to."""

    def __init__(self, ctx) -> None:
        self._ctx = weakref.proxy(ctx)
        self._live: dict[int, Any] = {}  # pointer -> its AutoFreePointer, while in use

        def free(ptr) -> None:
            ctx.synchronize()  # (cuMemFree waits too; a block may still be read)
            _drv.driver.cuMemFree(ptr)

        oom = _drv.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY

        def is_oom(exc: BaseException) -> bool:
            if isinstance(exc, _drv.CudaAPIError) and exc.code == oom:
                ctx.deallocations.clear()  # Numba's own queued frees, too
                return True
            return False

        self.blocks = BlockPool(_drv.driver.cuMemAlloc, free, is_oom)

    def buffer(self, n: int, dtype: np.dtype):
        size = rounded_size(n * dtype.itemsize)
        ptr = self.blocks.take(size)
        key = int(ptr)
        live, blocks = self._live, self.blocks

        def back() -> None:
            live.pop(key, None)
            blocks.give(size, ptr)

        mem = _drv.AutoFreePointer(self._ctx, ptr, size, finalizer=back)
        live[key] = mem
        return _DeviceNDArray((n,), (dtype.itemsize,), dtype, gpu_data=mem.own())


_POOLS: dict[int, _DevicePool] = {}
_ENABLED = (not _cuda_config.ENABLE_CUDASIM
            and os.environ.get("NBGRAD_CUDA_POOL", "1") not in ("0", ""))
#: why the pool is off although asked for (a Numba without the internals it uses)
UNAVAILABLE: str | None = None


def _pool() -> _DevicePool | None:
    global _ENABLED, UNAVAILABLE
    if not _ENABLED:
        return None
    ctx = cuda.current_context()
    pool = _POOLS.get(id(ctx))
    if pool is None:
        try:
            pool = _POOLS[id(ctx)] = _DevicePool(ctx)
        except AttributeError as exc:  # another numba-cuda's internals
            _ENABLED, UNAVAILABLE = False, f"{type(exc).__name__}: {exc}"
            return None
    return pool


def device_buffer(n: int, dtype) -> Any:
    """A flat device array of ``n`` (at least 1) elements of ``dtype``, from the pool."""
    dtype = np.dtype(dtype)
    n = max(int(n), 1)
    pool = _pool()
    if pool is None:
        return cuda.device_array(n, dtype)
    return pool.buffer(n, dtype)


def empty_cache() -> None:
    """Give the cached free blocks of every context back to the driver (PyTorch's
    ``torch.cuda.empty_cache``). Blocks in use stay."""
    for pool in _POOLS.values():
        pool.blocks.release()


def memory_stats() -> dict[str, Any]:
    """Bytes in the pool: ``in_use`` by live arrays and ``cached`` free blocks, and
    whether the pool is ``enabled``."""
    return {"enabled": _ENABLED,
            "in_use": sum(p.blocks.in_use_bytes for p in _POOLS.values()),
            "cached": sum(p.blocks.cached_bytes for p in _POOLS.values())}
