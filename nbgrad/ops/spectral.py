"""Spectral decompositions, the ops behind :mod:`nbgrad.linalg`: ``eigh``, ``eigvalsh``,
``svd``, ``svdvals`` and ``pinv``, and ``gap_divide``, the checked eigen-gap division of
their gradients.

Each takes a matrix or a stack ``(..., m, n)``; the natives (:mod:`nbgrad.kernels.lapack`)
loop over the stack in ``@njit`` code calling LAPACK. Integer inputs are promoted to
float64. Gradients (PyTorch's formulas) are in ``formulas/derivatives.yaml`` with their
helpers in :mod:`nbgrad.ops.spectral_backward`; they are table expressions, so they
differentiate again and run natively under ``nbgrad.jit``.

**Repeated eigenvalues.** The gradient of eigenvectors (and of singular vectors) divides
by eigenvalue gaps ``L[j] - L[i]`` (``S[j]**2 - S[i]**2``). Where two are equal up to
rounding, :func:`gap_divide` raises :class:`~nbgrad.errors.LinAlgError` naming the op,
unless no gradient reaches the vectors of that eigenspace (a loss of the eigenvalues
alone). Likewise :func:`column_divide` for a zero singular value of a non-square matrix.
Neither returns inf or NaN silently, in eager mode and under ``nbgrad.jit`` alike.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..kernels import lapack
from ..kernels.layout import call_native
from ..tensor import Tensor
from .decomp import _float, _square, _stack_shape, _where
from .dispatch import apply
from .registry import formula_helper, get, kernel, op_function
from .traits import NativePlan, Opaque, batching

__all__ = ["pinverse"]  # nbgrad.pinverse, Tensor.pinverse; the rest: nbgrad.linalg


class EighResult(NamedTuple):
    """``(eigenvalues, eigenvectors)`` of :func:`eigh`."""

    eigenvalues: Tensor
    eigenvectors: Tensor


class SVDResult(NamedTuple):
    """``(U, S, Vh)`` of :func:`svd`."""

    U: Tensor
    S: Tensor
    Vh: Tensor


def _matrix(op: str, A: Tensor) -> None:
    if A.ndim < 2:
        raise RuntimeError(f"{op}: expects a matrix or a stack of them (..., m, n), got "
                           f"shape {tuple(A.shape)}")


def _uplo(op: str, UPLO: str) -> bool:
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"{op}: UPLO must be 'L' or 'U', got {UPLO!r}")
    return UPLO == "U"


@formula_helper
def dtype_eps(dtype) -> float:
    """The machine epsilon of a float dtype."""
    return float(np.finfo(dtype).eps)


@formula_helper
def log_of(x: float) -> float:
    """``log(x)`` of a plain number (a formula's constant)."""
    return float(np.log(x))


# ------------------------------------------------------------------ eigh, eigvalsh
_EIGH = Opaque(native=lapack.eigh_native, static=lambda attrs, shapes: NativePlan(
    (_stack_shape(shapes[0]), attrs["UPLO"] == "U", *_where("linalg.eigh", shapes[0])),
    (tuple(shapes[0][:-1]), tuple(shapes[0]))))
_EIGVALSH = Opaque(native=lapack.eigvalsh_native, static=lambda attrs, shapes: NativePlan(
    (_stack_shape(shapes[0]), attrs["UPLO"] == "U", *_where("linalg.eigvalsh", shapes[0])),
    (tuple(shapes[0][:-1]),)))


@kernel("linalg.eigh", kind=_EIGH, batch=batching("leading"))
def _eigh_kernel(A, UPLO):
    return call_native(_EIGH, (A,), {"UPLO": UPLO})


@op_function("linalg.eigh")
def eigh(A: Tensor, UPLO: str = "L") -> EighResult:
    """Eigenvalues (ascending) and orthonormal eigenvectors (the columns of
    ``eigenvectors``) of a symmetric matrix or stack ``(..., n, n)``, read from its lower
    (``UPLO='L'``) or upper (``'U'``) triangle: ``A = V @ diag(L) @ V.mT``.

    Each eigenvector is defined up to sign (and, for a repeated eigenvalue, the eigenspace
    up to rotation). The gradient of the eigenvectors divides by eigenvalue gaps: on a
    (nearly) repeated eigenvalue it raises :class:`LinAlgError` unless the loss does not
    depend on that eigenspace's basis; the eigenvalues' gradient needs no gap.
    """
    A = _float("linalg.eigh", A)
    _square("linalg.eigh", A)
    _uplo("linalg.eigh", UPLO)
    L, V = apply(get("linalg.eigh"), (A, UPLO))
    return EighResult(L, V)


@kernel("linalg.eigvalsh", kind=_EIGVALSH, batch=batching("leading"))
def _eigvalsh_kernel(A, UPLO):
    return call_native(_EIGVALSH, (A,), {"UPLO": UPLO})


@op_function("linalg.eigvalsh")
def eigvalsh(A: Tensor, UPLO: str = "L") -> Tensor:
    """The eigenvalues (ascending) of a symmetric matrix or stack, read from one triangle
    as :func:`eigh`. Its gradient ``V diag(g) V^T`` needs no eigenvalue gap, so it holds
    on repeated eigenvalues too."""
    A = _float("linalg.eigvalsh", A)
    _square("linalg.eigvalsh", A)
    _uplo("linalg.eigvalsh", UPLO)
    return apply(get("linalg.eigvalsh"), (A, UPLO))


# ------------------------------------------------------------------ gap_divide
def _gap_static(attrs: dict, shapes: tuple) -> NativePlan:
    x = tuple(shapes[0])
    message = (f"{attrs['op']} backward: the eigenvalues (singular values) are repeated, so "
               "the gradient of the eigenvectors (singular vectors) is not defined; use a "
               "loss that does not depend on the basis of a repeated eigenspace (e.g. the "
               "eigenvalues alone, linalg.eigvalsh or linalg.svdvals)")
    return NativePlan((_stack_shape(x), message, f" (matrices of shape {x})"), (x,))


_GAP_DIVIDE = Opaque(native=lapack.gap_divide_native, static=_gap_static)


@kernel("gap_divide", kind=_GAP_DIVIDE, batch=batching("leading", 2, 1))
def _gap_divide_kernel(self, L, op):
    return call_native(_GAP_DIVIDE, (self, L), {"op": op})


@op_function("gap_divide")
def gap_divide(self: Tensor, L: Tensor, op: str) -> Tensor:
    """``self[..., i, j] / (L[..., j] - L[..., i])`` off the diagonal, 0 on it; raises
    LinAlgError (naming ``op``) where a gap is zero up to rounding and the entry is not.
    A backward helper of ``op`` (``linalg.eigh``, ``linalg.svd``)."""
    if self.ndim < 2 or tuple(self.shape[:-1]) != tuple(L.shape) or \
            self.shape[-1] != self.shape[-2]:
        raise RuntimeError(f"gap_divide: expects (..., n, n) and (..., n), got shapes "
                           f"{tuple(self.shape)} and {tuple(L.shape)}")
    return apply(get("gap_divide"), (self, L, op))


def _column_static(attrs: dict, shapes: tuple) -> NativePlan:
    x = tuple(shapes[0])
    message = (f"{attrs['op']} backward: the matrix is rank-deficient (a zero singular "
               "value), where this gradient is not defined (infinite)")
    return NativePlan((_stack_shape(x), message, f" (matrices of shape {x})"), (x,))


_COLUMN_DIVIDE = Opaque(native=lapack.column_divide_native, static=_column_static)


@kernel("column_divide", kind=_COLUMN_DIVIDE, batch=batching("leading", 2, 1))
def _column_divide_kernel(self, d, op):
    return call_native(_COLUMN_DIVIDE, (self, d), {"op": op})


@op_function("column_divide")
def column_divide(self: Tensor, d: Tensor, op: str) -> Tensor:
    """``self[..., i, j] / d[..., j]``; raises LinAlgError (naming ``op``) where ``d[j]``
    is zero up to rounding and column ``j`` is not 0 (a backward helper of ``op``)."""
    if self.ndim < 2 or tuple(self.shape[:-2]) + (self.shape[-1],) != tuple(d.shape):
        raise RuntimeError(f"column_divide: expects (..., m, k) and (..., k), got shapes "
                           f"{tuple(self.shape)} and {tuple(d.shape)}")
    return apply(get("column_divide"), (self, d, op))


# ------------------------------------------------------------------ svd, svdvals
_SVD = Opaque(native=lapack.svd_native, static=lambda attrs, shapes: _svd_plan(
    tuple(shapes[0]), bool(attrs["full_matrices"])))


def _svd_plan(shape: tuple, full: bool) -> NativePlan:
    m, n = shape[-2:]
    k = min(m, n)
    batch = shape[:-2]
    return NativePlan((_stack_shape(shape), full, *_where("linalg.svd", shape)),
                      (batch + (m, m if full else k), batch + (k,),
                       batch + (n if full else k, n)))


_SVDVALS = Opaque(native=lapack.svdvals_native, static=lambda attrs, shapes: NativePlan(
    (_stack_shape(shapes[0]), *_where("linalg.svdvals", shapes[0])),
    (tuple(shapes[0][:-2]) + (min(shapes[0][-2:]),),)))


@kernel("linalg.svd", kind=_SVD, batch=batching("leading"))
def _svd_kernel(A, full_matrices):
    return call_native(_SVD, (A,), {"full_matrices": full_matrices})


@op_function("linalg.svd")
def svd(A: Tensor, full_matrices: bool = True, *, driver: str | None = None) -> SVDResult:
    """``A = U @ diag(S) @ Vh`` for a matrix or stack ``(..., m, n)``, singular values
    descending; ``full_matrices=False`` gives the reduced ``U (m, k)`` and ``Vh (k, n)``
    with ``k = min(m, n)``.

    As PyTorch: the gradient ignores the extra columns of a full ``U`` / rows of ``Vh``;
    singular vectors are defined up to sign, and their gradient divides by gaps between
    singular values (repeated ones raise LinAlgError, see :mod:`nbgrad.ops.spectral`).
    """
    if driver is not None:
        raise RuntimeError("linalg.svd: driver= is only supported for CUDA inputs (cuSOLVER) "
                           f"in PyTorch; nbgrad has none, got {driver!r}")
    A = _float("linalg.svd", A)
    _matrix("linalg.svd", A)
    U, S, Vh = apply(get("linalg.svd"), (A, bool(full_matrices)))
    return SVDResult(U, S, Vh)


@kernel("linalg.svdvals", kind=_SVDVALS, batch=batching("leading"))
def _svdvals_kernel(A):
    return call_native(_SVDVALS, (A,), {})


@op_function("linalg.svdvals")
def svdvals(A: Tensor, *, driver: str | None = None) -> Tensor:
    """The singular values (descending) of a matrix or stack ``(..., m, n)``; the gradient
    ``U diag(g) Vh`` needs no gap between them."""
    if driver is not None:
        raise RuntimeError(f"linalg.svdvals: driver= is not supported, got {driver!r}")
    A = _float("linalg.svdvals", A)
    _matrix("linalg.svdvals", A)
    return apply(get("linalg.svdvals"), (A,))


# ------------------------------------------------------------------ pinv
_PINV = Opaque(native=lapack.pinv_native, static=lambda attrs, shapes: NativePlan(
    (_stack_shape(shapes[0]), float(attrs["atol"]), float(attrs["rtol"]),
     bool(attrs["hermitian"]), *_where("linalg.pinv", shapes[0])),
    (tuple(shapes[0][:-2]) + (shapes[0][-1], shapes[0][-2]),)))


@kernel("linalg.pinv", kind=_PINV, batch=batching("leading"))
def _pinv_kernel(A, atol, rtol, hermitian):
    return call_native(_PINV, (A,), {"atol": atol, "rtol": rtol, "hermitian": hermitian})


def _tolerance(name: str, value) -> float | None:
    if isinstance(value, Tensor) and value.size == 1:
        return float(value.item())  # a 0-d tensor, as PyTorch accepts (eager only)
    if value is not None and not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"linalg.pinv: {name} must be a float, a one-element tensor or None, "
                        f"got {type(value).__name__}")
    return None if value is None else float(value)


@op_function("linalg.pinv")
def pinv(A: Tensor, *, atol: float | None = None, rtol: float | None = None,
         hermitian: bool = False) -> Tensor:
    """The Moore-Penrose pseudo-inverse ``(..., n, m)`` of a matrix or stack
    ``(..., m, n)``. Singular values (eigenvalue moduli when ``hermitian``, which reads the
    lower triangle) at most ``max(atol, rtol * largest)`` are taken as zero; as PyTorch,
    ``rtol`` defaults to ``eps * max(m, n)`` when neither is given, else to 0. The
    gradient is PyTorch's ``pinv_backward`` (exact where the rank is locally constant)."""
    A = _float("linalg.pinv", A)
    _matrix("linalg.pinv", A)
    if hermitian:
        _square("linalg.pinv", A)
    atol, rtol = _tolerance("atol", atol), _tolerance("rtol", rtol)
    if rtol is None:
        rtol = (np.finfo(A.dtype).eps * max(A.shape[-2:])
                if atol is None or atol <= 0 else 0.0)
    return apply(get("linalg.pinv"), (A, float(atol or 0.0), float(rtol), bool(hermitian)))


def pinverse(self: Tensor, rcond: float = 1e-15) -> Tensor:
    """``torch.pinverse``: :func:`pinv` with ``rtol=rcond``."""
    return pinv(self, rtol=rcond)
