"""Array layout helpers shared by the kernels."""

from __future__ import annotations

import numpy as np


def c_contiguous(x: np.ndarray, dtype=None) -> np.ndarray:
    """``x`` (cast to ``dtype`` if given) as a C-contiguous array; copies only when needed.

    Unlike ``np.ascontiguousarray``, a 0-d array stays 0-d.
    """
    if dtype is not None and x.dtype != dtype:
        return np.array(x, dtype=dtype, order="C", copy=True)
    return x if x.flags.c_contiguous else np.array(x, order="C", copy=True)
