"""Shared test configuration."""

import os

# One thread for BLAS and Numba: the suite runs on 2 cores, where threaded OpenBLAS
# on small matrices is slower by orders of magnitude (set before NumPy loads BLAS).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
