"""The ``cuda`` executor: each program's eager ops and its ``nbgrad.jit`` (the fused CUDA
kernels of :mod:`nbgrad.jit.cuda`) on CUDA tensors, against eager on the CPU.

On a machine without a GPU it runs under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``
before ``numba.cuda`` is first imported; :func:`nbgrad.cuda.use_simulator_if_no_gpu`),
which runs one Python thread per CUDA thread: slow, so the test suite gives it few
programs, and ``nbgrad fuzz --executors cuda`` on a real GPU gives it many.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from ... import jit
from ...cuda import use_simulator_if_no_gpu
from .differential import (
    CALLS,
    DEVICE_RUNS,
    Mismatch,
    Result,
    _compare,
    _raised,
    _run,
    batch_function,
    executable_tiers,
)
from .differential import inputs as call_inputs
from .program import Program

#: how each program runs on the device: eager ops, and jitted (the CUDA tier)
PATHS = ("eager", "jit")


def run_on_device(program: Program, refs: Sequence[Result], device: str = "cuda"
                  ) -> tuple[list[Mismatch], bool]:
    """``program`` eagerly and jitted on ``device``, :data:`CALLS` calls each, against
    the CPU's eager results ``refs``; (mismatches, whether the jitted calls ran fused
    device kernels). An op with no kernel on the device is a refusal, not a mismatch."""
    if device == "cuda":
        use_simulator_if_no_gpu()  # no GPU: Numba's simulator (before numba.cuda loads)
    found: list[Mismatch] = []
    fused = False
    for path in PATHS:
        fn = batch_function([program])
        if path == "jit":
            fn = jit(fn)
        executor = f"{device}-{path}"
        call = 0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for call in range(1, CALLS + 1):
                    (got,) = _run(fn, [program], [call_inputs(program, call)],
                                  device=device)
                    found += _compare(got, refs[call - 1], program, executor, call)
                    if found:
                        break
        except RuntimeError as exc:
            if "has no CUDA kernel" in str(exc):  # a clear refusal
                return [], False
            found.append(_raised(exc, program, executor, call))
        except Exception as exc:
            found.append(_raised(exc, program, executor, call))
        if found:
            break
        if path == "jit":
            fused = device in executable_tiers(fn)
    return found, fused


DEVICE_RUNS["cuda"] = run_on_device
