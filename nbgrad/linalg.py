"""``nbgrad.linalg``: matrix functions under PyTorch's ``torch.linalg`` names.

``inv``, ``det``, ``slogdet``, ``solve``, ``cholesky`` and ``solve_triangular`` take a
matrix or a stack of matrices ``(..., n, n)`` and are differentiable to any order. They
are implemented in :mod:`nbgrad.ops.decomp` (kernels and table entries).
"""

from __future__ import annotations

from .ops.decomp import (
    LinAlgError,
    SlogdetResult,
    cholesky,
    det,
    inv,
    slogdet,
    solve,
    solve_triangular,
)
from .ops.linalg import diagonal, matmul

__all__ = ["LinAlgError", "SlogdetResult", "cholesky", "det", "diagonal", "inv", "matmul",
           "slogdet", "solve", "solve_triangular"]
