"""``nbgrad.linalg``: matrix functions under PyTorch's ``torch.linalg`` names.

``inv``, ``det``, ``slogdet``, ``solve``, ``cholesky`` and ``solve_triangular`` take a
matrix or a stack of matrices ``(..., n, n)`` and are differentiable to any order. They
are implemented in :mod:`nbgrad.ops.decomp` (kernels and table entries); the norms,
``vecdot``, ``vander``, ``cross``, ``multi_dot``, ``matrix_power`` and the ``*_ex``
variants are composites of table ops (:mod:`nbgrad.ops.matrix_functions`,
:mod:`nbgrad.ops.products`).
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
from .ops.matrix_functions import (
    cholesky_ex,
    inv_ex,
    matrix_norm,
    solve_ex,
    vander,
    vecdot,
    vector_norm,
)
from .ops.matrix_functions import linalg_norm as norm
from .ops.products import cross as _cross
from .ops.products import matrix_power, multi_dot


def cross(input, other, *, dim: int = -1):  # noqa: A002
    """The cross product along ``dim`` (the last by default, as ``torch.linalg.cross``)."""
    return _cross(input, other, dim)


__all__ = ["LinAlgError", "SlogdetResult", "cholesky", "cholesky_ex", "cross", "det",
           "diagonal", "inv", "inv_ex", "matmul", "matrix_norm", "matrix_power", "multi_dot",
           "norm", "slogdet", "solve", "solve_ex", "solve_triangular", "vander", "vecdot",
           "vector_norm"]
