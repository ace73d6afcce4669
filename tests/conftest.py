"""Shared test configuration."""

import os
import sys

# One thread for BLAS and Numba: the suite runs on 2 cores, where threaded OpenBLAS
# on small matrices is slower by orders of magnitude (set before NumPy loads BLAS).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per usable core, at most 4 (each holds its own kernels)."""
    from nbgrad.cli.opcheck import auto_jobs
    return auto_jobs()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# Promotion check off for the suite (and the processes its tests start): a wrong tier-2
# or CUDA result must fail the test that meets it, not be caught and replaced by tier 1's
# (nbgrad.jit.verify reads the variable when it is imported). Tests of the check turn it
# on with the ``promotion_check`` fixture.
os.environ["NBGRAD_PROMOTION_CHECK"] = "0"
if "nbgrad.jit.verify" in sys.modules:  # imported already (by a plugin): switch it too
    sys.modules["nbgrad.jit.verify"].set_enabled(False)
# Likewise no measuring of tier 2 against tier 1 after a promotion: a promoted graph stays
# in tier 2 whatever the timings, so the tier a test runs in never depends on the load.
# Tests of the measurement set nbgrad.jit.program.MEASURE themselves.
os.environ["NBGRAD_TIER_MEASURE"] = "0"
# Tier 1 never runs eager ops while its interpreter builds in the background (whether a
# tape runs natively must not depend on timing); tests of that set the flag themselves.
os.environ["NBGRAD_TIER1_BACKGROUND"] = "0"
if "nbgrad.jit.program" in sys.modules:
    sys.modules["nbgrad.jit.program"].MEASURE = False


@pytest.fixture
def promotion_check():
    """Turn the promotion check on for one test."""
    from nbgrad.jit import verify
    previous = verify.set_enabled(True)
    yield
    verify.set_enabled(previous)
