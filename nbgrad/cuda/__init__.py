"""The CUDA backend: ``@cuda.jit`` kernels (numba-cuda, ``pip install 'nbgrad[cuda]'``).

Importing :mod:`nbgrad` does not import this package's kernels (``numba.cuda`` takes
about 0.4 s to import): :func:`register` runs when the first CUDA array is made
(:func:`nbgrad.backends.to_device`) or when coverage is asked for. It adds a
``"cuda"`` kernel to every op of the derivative table that has one in
:mod:`nbgrad.cuda.ops` (registered with ``@kernel(name, target="cuda")``); an op
without one raises a ``RuntimeError`` naming it on CUDA tensors (never a silent
round trip through the CPU).

Without a GPU, set ``NUMBA_ENABLE_CUDASIM=1`` before anything imports
``numba.cuda`` to run the same kernels in Numba's CUDA simulator (slow: one Python
thread per CUDA thread; use small arrays).
"""

from __future__ import annotations

import glob
import importlib
import os
import sys

from ..ops.registry import REGISTRY, table

_REGISTERED = False


def simulated() -> bool:
    """Whether Numba's CUDA simulator is requested (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU device node exists (checked without initialising CUDA)."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/dxg")


def use_simulator_if_no_gpu() -> bool:
    """Turn Numba's CUDA simulator on unless a GPU is visible; returns whether it is on.

    Numba reads ``NUMBA_ENABLE_CUDASIM`` into its config (reloaded here) and
    ``numba.cuda`` picks the simulator or the driver when it is imported: call this
    before that (test suites call it at collection time). A value already in the
    environment is respected. Raises ``RuntimeError`` if ``numba.cuda`` was already
    imported in the other mode.
    """
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_visible():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        if "numba" in sys.modules:  # numba read its environment when it was imported
            from numba.core import config
            config.reload_config()
    if "numba.cuda" in sys.modules:
        from numba.cuda.core import config
        if bool(config.ENABLE_CUDASIM) != simulated():
            raise RuntimeError("numba.cuda was imported before the CUDA simulator could be "
                               "chosen; set NUMBA_ENABLE_CUDASIM=1 in the environment")
    return simulated()


def register() -> list[str]:
    """Register the CUDA kernels (once); returns the covered ops.

    Importing :mod:`nbgrad.cuda.ops` is the registration: its modules register their
    kernels with ``@kernel(name, target="cuda")`` like the CPU ones, in
    ``OpDef.kernels["cuda"]``.
    """
    global _REGISTERED
    importlib.import_module(".ops", __name__)
    _REGISTERED = True
    return sorted(name for name in table() if "cuda" in REGISTRY[name].kernels)


def ensure_registered() -> None:
    """Import the CUDA kernels unless done already (:func:`register`)."""
    if not _REGISTERED:
        register()


def coverage() -> dict[str, bool]:
    """Every table op, and whether it has a CUDA kernel (registers them first).

    Without numba-cuda installed, every op maps to ``False``.
    """
    try:
        ensure_registered()
    except ImportError:
        pass
    return {name: "cuda" in REGISTRY[name].kernels for name in sorted(table())}


def empty_cache() -> None:
    """Give the device memory that nbgrad's pool caches back to the driver (as
    ``torch.cuda.empty_cache``); see :mod:`nbgrad.cuda.memory` (and its
    ``memory_stats()``)."""
    memory = sys.modules.get(__name__ + ".memory")
    if memory is not None:  # (no CUDA array made yet: nothing is cached)
        memory.empty_cache()


def missing() -> list[str]:
    """Table ops without a CUDA kernel."""
    return [name for name, ok in coverage().items() if not ok]


def backward_gaps() -> dict[str, list[str]]:
    """Covered ops whose gradient formulas call ops without a CUDA kernel (and those ops).

    Such an op runs forward on CUDA, but its backward raises the missing op's error.
    """
    cov = coverage()
    gaps = {}
    for name, entry in table().items():
        if not cov[name]:
            continue
        called = set().union(*(f.ops for f in entry.formulas.values()))
        missing_ops = sorted(o for o in called if not cov.get(o, False))
        if missing_ops:
            gaps[name] = missing_ops
    return gaps
