"""``linalg.qr`` and ``linalg.matrix_exp``: table ops with ``@njit`` natives
(:mod:`nbgrad.kernels.lapack`) over stacks of matrices; gradients (PyTorch's
``linalg_qr_backward`` and the block-matrix differential of ``matrix_exp``) are table
expressions in :mod:`nbgrad.ops.spectral_backward`, so they differentiate again.
``linalg.lstsq`` is a composite over ``pinv`` and ``svdvals``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..factories import empty
from ..kernels import lapack
from ..kernels.layout import call_native
from ..tensor import Tensor
from .decomp import _check_batches, _float, _square, _stack_shape, _where
from .dispatch import apply, promote_operands
from .linalg import matmul
from .reduction import amax, sum
from .registry import formula_helper, get, kernel, op_function
from .shape import squeeze, unsqueeze
from .spectral import _matrix, pinv, svdvals
from .traits import NativePlan, Opaque, batching

__all__ = ["matrix_exp"]  # nbgrad.matrix_exp, Tensor.matrix_exp; the rest: nbgrad.linalg


class QRResult(NamedTuple):
    """``(Q, R)`` of :func:`qr`."""

    Q: Tensor
    R: Tensor


_QR_MODES = ("reduced", "complete", "r")


def _qr_static(attrs: dict, shapes: tuple) -> NativePlan:
    shape = tuple(shapes[0])
    m, n = shape[-2:]
    mode = attrs["mode"]
    kq = m if mode == "complete" else min(m, n)
    batch = shape[:-2]
    q_shape = (0,) if mode == "r" else batch + (m, kq)
    return NativePlan((_stack_shape(shape), mode == "complete", mode != "r",
                       *_where("linalg.qr", shape)), (q_shape, batch + (kq, n)))


_QR = Opaque(native=lapack.qr_native, static=_qr_static)


@formula_helper
def qr_differentiable(mode: str, q_shape: tuple, r_shape: tuple) -> tuple[int, int]:
    """``(m, n)`` of a QR factorization that has a derivative, else a RuntimeError (as
    PyTorch: not for ``mode='r'``, nor ``'complete'`` with ``m > n``)."""
    if mode == "r":
        raise RuntimeError("linalg.qr: the derivative of linalg.qr depends on Q, which is not "
                           "computed when mode='r'; use mode='reduced' to differentiate")
    m, n = q_shape[-2], r_shape[-1]
    if mode == "complete" and m > n:
        raise RuntimeError(f"linalg.qr: the QR decomposition is not differentiable when "
                           f"mode='complete' and nrows > ncols (A of {m} x {n})")
    return m, n


@kernel("linalg.qr", kind=_QR, batch=batching("leading"))
def _qr_kernel(A, mode):
    return call_native(_QR, (A,), {"mode": mode})


@op_function("linalg.qr")
def qr(A: Tensor, mode: str = "reduced") -> QRResult:
    """``A = Q @ R`` (Householder, as LAPACK/NumPy/PyTorch) for a matrix or stack
    ``(..., m, n)``: ``mode='reduced'`` (Q ``(m, k)``, R ``(k, n)``, ``k = min(m, n)``),
    ``'complete'`` (Q ``(m, m)``, R ``(m, n)``) or ``'r'`` (R only, Q empty; not
    differentiable). As PyTorch, ``'complete'`` with ``m > n`` is not differentiable."""
    if mode not in _QR_MODES:
        raise RuntimeError(f"linalg.qr: mode must be 'reduced', 'complete' or 'r', got "
                           f"{mode!r}")
    A = _float("linalg.qr", A)
    _matrix("linalg.qr", A)
    Q, R = apply(get("linalg.qr"), (A, mode))
    return QRResult(Q, R)


_MATRIX_EXP = Opaque(native=lapack.matrix_exp_native, static=lambda attrs, shapes: NativePlan(
    (_stack_shape(shapes[0]),), (tuple(shapes[0]),)))


@kernel("linalg.matrix_exp", kind=_MATRIX_EXP, batch=batching("leading"))
def _matrix_exp_kernel(A):
    return call_native(_MATRIX_EXP, (A,), {})


@op_function("linalg.matrix_exp")
def linalg_matrix_exp(A: Tensor) -> Tensor:
    """The matrix exponential of a square matrix or stack ``(..., n, n)`` (scaling and
    squaring with a degree-13 Padé approximant, in float64). The gradient is the top-right
    block of ``matrix_exp([[A^T, G], [0, A^T]])``, so it differentiates again."""
    A = _float("linalg.matrix_exp", A)
    _square("linalg.matrix_exp", A)
    return apply(get("linalg.matrix_exp"), (A,))


def matrix_exp(self: Tensor) -> Tensor:
    """``torch.matrix_exp``: :func:`nbgrad.linalg.matrix_exp` of ``self``."""
    return linalg_matrix_exp(self)


# ------------------------------------------------------------------ lstsq (composite)
class LstsqResult(NamedTuple):
    """``(solution, residuals, rank, singular_values)`` of :func:`lstsq`."""

    solution: Tensor
    residuals: Tensor
    rank: Tensor
    singular_values: Tensor


_DRIVERS = (None, "gels", "gelsy", "gelsd", "gelss")


def lstsq(A: Tensor, B: Tensor, rcond: float | None = None, *,
          driver: str | None = None) -> LstsqResult:
    """The least-squares solution ``X = pinv(A) @ B`` of ``A X ~= B`` for ``A (..., m, n)``
    and ``B (..., m, k)`` (or ``(m,)``), as ``torch.linalg.lstsq``: singular values at most
    ``rcond * largest`` count as zero (``rcond`` defaults to ``eps * max(m, n)``); ``rank``
    (int64) for every driver but ``'gels'``; ``singular_values`` for ``'gelsd'`` and
    ``'gelss'``; ``residuals`` (squared, per column) for ``m > n`` and a driver other than
    the default ``'gelsy'`` (PyTorch leaves them empty for a rank-deficient ``A``; here they
    are computed anyway). Differentiable in ``A`` (where its rank is locally constant, e.g.
    full rank) and ``B``."""
    if driver not in _DRIVERS:
        raise RuntimeError(f"linalg.lstsq: driver must be one of {_DRIVERS[1:]} or None, got "
                           f"{driver!r}")
    A, B = promote_operands(A, B)
    A, B = _float("linalg.lstsq", A), _float("linalg.lstsq", B)
    _matrix("linalg.lstsq", A)
    vector = B.ndim == 1
    Bm = unsqueeze(B, -1) if vector else B
    m, n = A.shape[-2:]
    if Bm.ndim < 2 or Bm.shape[-2] != m:
        raise RuntimeError(f"linalg.lstsq: A of shape {tuple(A.shape)} and B of shape "
                           f"{tuple(B.shape)} do not fit (B needs m = {m} rows)")
    _check_batches("linalg.lstsq", A, B, Bm.shape[:-2])
    if rcond is None:
        rcond = float(np.finfo(A.dtype).eps) * max(m, n)
    X = matmul(pinv(A, rtol=float(rcond)), Bm)
    nothing = empty(0, dtype=A.dtype)
    S = svdvals(A) if driver != "gels" else None
    if S is None or min(m, n) == 0:
        rank = empty(0, dtype="int64") if S is None else sum(S, -1, dtype="int64") * 0
    else:
        rank = sum(S > unsqueeze(amax(S, -1), -1) * rcond, -1, dtype="int64")
    residuals = nothing
    if m > n and driver not in (None, "gelsy"):
        residuals = sum((matmul(A, X) - Bm) ** 2, -2)
        residuals = squeeze(residuals, -1) if vector else residuals
    values = S if driver in ("gelsd", "gelss") else nothing
    return LstsqResult(squeeze(X, -1) if vector else X, residuals, rank, values)
