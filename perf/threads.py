"""One thread for every framework: the settings perf's workers get, and that the standalone
scripts set in their own environment before any framework is imported (this module imports
none)."""

from __future__ import annotations

import os

#: the thread counts of OpenMP, OpenBLAS, MKL and Numba
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "NUMBA_NUM_THREADS")
#: JAX's XLA on one CPU thread (XLA_FLAGS takes only ``--`` flags: a value without one is
#: read as a file name, fatally), and on as many as a worker is pinned to
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"
XLA_THREADS = "--xla_cpu_multi_thread_eigen=true"


def one_thread() -> None:
    """Set this process's environment to one thread for every framework (an XLA_FLAGS
    already set is kept)."""
    for var in THREAD_VARS:
        os.environ[var] = "1"
    os.environ.setdefault("XLA_FLAGS", XLA_ONE_THREAD)
