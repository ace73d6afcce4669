"""``nbgrad.linalg``: matrix functions under PyTorch's ``torch.linalg`` names.

``inv``, ``det``, ``slogdet``, ``solve``, ``cholesky`` and ``solve_triangular`` take a
matrix or a stack of matrices ``(..., n, n)`` and are differentiable to any order. They
are implemented in :mod:`nbgrad.ops.decomp` (kernels and table entries); ``eigh``,
``eigvalsh``, ``svd``, ``svdvals`` and ``pinv`` in :mod:`nbgrad.ops.spectral`; ``qr``,
``matrix_exp`` and ``lstsq`` in :mod:`nbgrad.ops.orthogonal`; ``lu_factor`` and ``lu_solve``
in :mod:`nbgrad.ops.lu`; the norms,
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
from .ops.lu import LUFactorResult, lu_factor, lu_solve
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
from .ops.orthogonal import LstsqResult, QRResult, lstsq, qr
from .ops.orthogonal import linalg_matrix_exp as matrix_exp
from .ops.products import cross as _cross
from .ops.products import matrix_power, multi_dot
from .ops.spectral import EighResult, SVDResult, eigh, eigvalsh, pinv, svd, svdvals


def cross(input, other, *, dim: int = -1):  # noqa: A002
    """The cross product along ``dim`` (the last by default, as ``torch.linalg.cross``)."""
    return _cross(input, other, dim)


__all__ = ["EighResult", "LUFactorResult", "LinAlgError", "LstsqResult", "QRResult",
           "SVDResult", "SlogdetResult", "cholesky", "cholesky_ex", "cross", "det", "diagonal",
           "eigh", "eigvalsh", "inv", "inv_ex", "lstsq", "lu_factor", "lu_solve", "matmul",
           "matrix_exp", "matrix_norm", "matrix_power", "multi_dot", "norm", "pinv", "qr",
           "slogdet", "solve", "solve_ex", "solve_triangular", "svd", "svdvals", "vander",
           "vecdot", "vector_norm"]
