"""When large CPU loops run on several threads, and how their work is cut.

Large work is cut into blocks of :data:`BLOCK` elements, a fixed size: which element
lands in which block, and so every result and every partial sum, does not depend on the
thread count, and each block is the serial, vectorised loop (blocks start at multiples
of the vector width, so parallel and serial results agree bit for bit).

- Eager elementwise kernels (:mod:`nbgrad.kernels.elementwise`, compiled ``nogil``) run
  their blocks on a small pool of Python threads (:func:`run_blocks`): no second
  compiled variant, so no extra compile time.
- Tier-2 fused loops (:mod:`nbgrad.jit.tier2`) run their blocks with Numba's ``prange``
  in a parallel variant of the graph function, compiled only for graphs with a loop of
  at least :data:`MIN_SIZE` elements, and only when ``NUMBA_NUM_THREADS > 1``.

Work of fewer than :data:`MIN_SIZE` elements always runs serially, so small arrays keep
their latency. The thread count is Numba's: ``NUMBA_NUM_THREADS`` (the pool's size) and
``numba.set_num_threads``; with ``NUMBA_NUM_THREADS=1`` nothing here starts a thread.
``NBGRAD_PARALLEL_MIN`` sets :data:`MIN_SIZE` (tests use a small one); assigning the
module attribute works too. Reductions of eager mode stay serial.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numba

#: elements per block (fixed: results do not depend on the thread count)
BLOCK = 1 << 16
#: work of fewer elements always runs serially
MIN_SIZE = int(os.environ.get("NBGRAD_PARALLEL_MIN", 1 << 18))
#: ``parallel=`` of tier 2's parallel variants: only explicit ``prange`` loops run in
#: parallel (Numba's other rewrites would make reductions depend on the thread count)
OPTIONS = {"prange": True, "comprehension": False, "setitem": False, "reduction": False,
           "numpy": False, "stencil": False, "fusion": False, "inplace_binop": False}

_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None
_POOL_PID: int | None = None  # the process the pool's threads belong to
_NUMBA_PID: int | None = None  # the process that first asked Numba for its thread count


def pool_size() -> int:
    """``NUMBA_NUM_THREADS``: the most threads parallel work can ever use."""
    return numba.config.NUMBA_NUM_THREADS


def threads(size: int) -> int:
    """How many threads work over ``size`` elements should use now (1: serial)."""
    if size < MIN_SIZE or numba.config.NUMBA_NUM_THREADS <= 1:
        return 1
    global _NUMBA_PID
    if _NUMBA_PID is None:
        _NUMBA_PID = os.getpid()
    return numba.get_num_threads()  # numba.set_num_threads (per thread) or the pool size


def numba_pool_usable() -> bool:
    """Whether a ``prange`` loop may run on Numba's threads now: not in a child forked
    after the GNU OpenMP layer started, nor off the main thread with the workqueue layer
    (Numba would abort the process: GNU OpenMP is not fork-safe, the workqueue does not
    take concurrent launches)."""
    global _NUMBA_PID
    try:
        layer = numba.threading_layer()
    except ValueError:  # not started yet: nothing to inherit, the first launch picks it
        if _NUMBA_PID is None:
            _NUMBA_PID = os.getpid()
        return True
    if layer == "omp" and _NUMBA_PID is not None and _NUMBA_PID != os.getpid():
        return False
    return layer != "workqueue" or threading.current_thread() is threading.main_thread()


def cuts(size: int, parts: int) -> list[tuple[int, int]]:
    """``size`` elements cut into at most ``parts`` ranges of whole blocks (the last one
    ends at ``size``)."""
    nblocks = -(-size // BLOCK)
    per = -(-nblocks // max(1, parts))
    return [(lo * BLOCK, min((lo + per) * BLOCK, size)) for lo in range(0, nblocks, per)]


def _pool() -> ThreadPoolExecutor:
    """The block pool: up to ``NUMBA_NUM_THREADS - 1`` workers, started as needed."""
    global _POOL, _POOL_PID
    if _POOL_PID != os.getpid():  # a forked child inherits the pool but not its threads
        with _LOCK:
            if _POOL_PID != os.getpid():
                _POOL = ThreadPoolExecutor(max(1, pool_size() - 1),
                                           thread_name_prefix="nbgrad-block")
                _POOL_PID = os.getpid()
    return _POOL


def run_blocks(part: Callable[[int, int], None], size: int, nthreads: int) -> None:
    """``part(lo, hi)`` over :func:`cuts` of ``size`` elements, on ``nthreads`` threads
    (this one included); returns when every part is done, raising the first error."""
    ranges = cuts(size, nthreads)
    pool = _pool()
    futures = [pool.submit(part, lo, hi) for lo, hi in ranges[1:]]
    try:
        part(*ranges[0])
    finally:
        for f in futures:  # every part finishes before the caller sees the output
            f.exception()
    for f in futures:
        f.result()
