"""Shared test configuration."""

import os

import numpy as np
import pytest

os.environ.setdefault("NUMBA_NUM_THREADS", "1")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
