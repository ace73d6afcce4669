"""Array layout helpers shared by the kernels."""

from __future__ import annotations

import numpy as np


def c_contiguous(x: np.ndarray) -> np.ndarray:
    """``x`` itself if C-contiguous, else a C-contiguous copy (0-d stays 0-d, unlike
    ``np.ascontiguousarray``)."""
    return x if x.flags.c_contiguous else np.array(x, order="C", copy=True)
