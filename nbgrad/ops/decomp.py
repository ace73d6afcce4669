"""Decompositions and solvers, the ops behind :mod:`nbgrad.linalg`: ``inv``, ``det``,
``slogdet``, ``solve``, ``cholesky`` and ``solve_triangular``.

Every op takes a stack of matrices ``(..., n, n)``; the kernels loop over the stack in
``@njit`` code that calls LAPACK (Numba's ``np.linalg``; ``potrf``) or BLAS (``trsm``,
triangular solves). Integer inputs are promoted to float64. Gradients are in
``formulas/derivatives.yaml`` (and are themselves differentiable).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import LinAlgError  # noqa: F401 - nbgrad.linalg re-exports it from here
from ..kernels import blas
from ..kernels.cholesky_backward import cholesky_backward_native
from ..kernels.layout import call_native
from ..tensor import Tensor
from .convert import to_dtype
from .dispatch import apply, as_tensor, promote_operands
from .registry import formula_helper, get, kernel, op_function
from .shape import squeeze, transpose, unsqueeze
from .traits import NativePlan, Opaque, batching

# nothing at the top level: nbgrad.linalg is the public address; nbgrad.det, .inverse and
# .slogdet (also Tensor methods) are thin wrappers in nbgrad.ops.linalg
__all__: list[str] = ["triangular_matmul"]


class SlogdetResult(NamedTuple):
    """``(sign, logabsdet)`` of :func:`slogdet`."""

    sign: Tensor
    logabsdet: Tensor


def _float(op: str, A) -> Tensor:
    A = as_tensor(A)
    if A.dtype.kind != "f":
        A = to_dtype(A, "float64")
    return A


def _square(op: str, A: Tensor) -> None:
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"{op}: expects a square matrix or a stack of them (..., n, n), "
                           f"got shape {A.shape}")


def _stack_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(batch, rows, cols) of a stack of matrices of ``shape``."""
    return (math.prod(shape[:-2]), *shape[-2:])


def _where(op: str, shape: tuple) -> tuple[str, str]:
    """The halves of a LinAlgError's message around NumPy's words."""
    return f"{op}: ", f" (input of shape {tuple(shape)})"


def _check_batches(op: str, A: Tensor, B: Tensor, b_batch: tuple) -> None:
    """RuntimeError naming ``op`` and both shapes unless the batch dimensions of ``A``
    (all but its last two) and ``b_batch`` (``B``'s) broadcast."""
    try:
        np.broadcast_shapes(A.shape[:-2], b_batch)
    except ValueError:
        raise RuntimeError(f"{op}: batch dimensions of A {tuple(A.shape)} and B "
                           f"{tuple(B.shape)} do not broadcast") from None


def _lapack_kind(op: str, native) -> Opaque:
    return Opaque(native=native, static=lambda attrs, shapes: NativePlan(
        (_stack_shape(shapes[0]), *_where(op, shapes[0])), (tuple(shapes[0]),)))


def _batch_kind(native, outputs: int) -> Opaque:
    return Opaque(native=native, static=lambda attrs, shapes: NativePlan(
        (_stack_shape(shapes[0]),), (tuple(shapes[0][:-2]),) * outputs))


# ------------------------------------------------------------------ inv
_INV = _lapack_kind("linalg.inv", blas.inv_native)


@kernel("linalg.inv", kind=_INV, batch=batching("leading"))
def _inv_kernel(A):
    return call_native(_INV, (A,), {})


@op_function("linalg.inv")
def inv(A: Tensor) -> Tensor:
    """The inverse of a square matrix (or of each matrix of a stack)."""
    A = _float("linalg.inv", A)
    _square("linalg.inv", A)
    return apply(get("linalg.inv"), (A,))


# ------------------------------------------------------------------ det, slogdet
_DET, _SLOGDET = _batch_kind(blas.det_native, 1), _batch_kind(blas.slogdet_native, 2)


@kernel("linalg.det", kind=_DET, batch=batching("leading"))
def _det_kernel(A):
    return call_native(_DET, (A,), {})


@op_function("linalg.det")
def det(A: Tensor) -> Tensor:
    """The determinant of a square matrix (or of each matrix of a stack)."""
    A = _float("linalg.det", A)
    _square("linalg.det", A)
    return apply(get("linalg.det"), (A,))


@kernel("linalg.slogdet", kind=_SLOGDET, batch=batching("leading"))
def _slogdet_kernel(A):
    return call_native(_SLOGDET, (A,), {})


@op_function("linalg.slogdet")
def slogdet(A: Tensor) -> SlogdetResult:
    """``(sign, logabsdet)`` with ``det = sign * exp(logabsdet)``; only ``logabsdet`` has a
    gradient (sign is 0 and logabsdet -inf for a singular matrix)."""
    A = _float("linalg.slogdet", A)
    _square("linalg.slogdet", A)
    sign, logabs = apply(get("linalg.slogdet"), (A,))
    return SlogdetResult(sign, logabs)


# ------------------------------------------------------------------ solve
@formula_helper
def solve_is_vector(A, B) -> bool:
    """Whether ``B`` is a (batch of) vector(s) for ``linalg.solve`` (torch's rule)."""
    return len(B.shape) == 1 or (len(B.shape) == len(A.shape) - 1
                                 and tuple(B.shape) == tuple(A.shape[:-1]))


def _broadcast_plan(a_shape: tuple, b_shape: tuple) -> tuple:
    """The batch-broadcast shapes and stacks of two stacks of matrices."""
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    a_full, b_full = batch + tuple(a_shape[-2:]), batch + tuple(b_shape[-2:])
    return batch, a_full, b_full, _stack_shape(a_full), _stack_shape(b_full)


def _solve_static(attrs: dict, shapes: tuple) -> NativePlan:
    A, B = tuple(shapes[0]), tuple(shapes[1])
    vector = len(B) == 1 or (len(B) == len(A) - 1 and B == A[:-1])  # solve_is_vector
    b_matrix = B + (1,) if vector else B
    batch, *plan = _broadcast_plan(A, b_matrix)
    out_shape = batch + (b_matrix[-2],) if vector else batch + b_matrix[-2:]
    return NativePlan((A, b_matrix, *plan, *_where("linalg.solve", A)), (out_shape,))


_SOLVE = Opaque(native=blas.solve_native, static=_solve_static)


@kernel("linalg.solve", kind=_SOLVE, batch=batching("solve"))
def _solve_kernel(A, B):
    return call_native(_SOLVE, (A, B), {})


@op_function("linalg.solve")
def solve(A: Tensor, B: Tensor, *, left: bool = True) -> Tensor:
    """The solution ``X`` of ``A @ X = B`` (or of ``X @ A = B`` when ``left=False``).

    ``B`` is a vector (or a batch of vectors) when it is 1-D or has the shape
    ``A.shape[:-1]``, else a matrix ``(..., n, k)``; batch dimensions broadcast.
    """
    A, B = promote_operands(A, B)
    A, B = _float("linalg.solve", A), _float("linalg.solve", B)
    _square("linalg.solve", A)
    if not left:
        if B.ndim < 2:
            raise RuntimeError(f"linalg.solve: left=False needs a matrix B, got shape "
                               f"{B.shape}")
        return transpose(solve(transpose(A, -2, -1), transpose(B, -2, -1)), -2, -1)
    vector = solve_is_vector(A, B)
    rows = B.shape[-1] if vector else (B.shape[-2] if B.ndim >= 2 else -1)
    if B.ndim == 0 or rows != A.shape[-1]:
        raise RuntimeError(f"linalg.solve: A of shape {A.shape} and B of shape {B.shape} "
                           "do not fit (B needs n rows)")
    _check_batches("linalg.solve", A, B, B.shape[:-1] if vector else B.shape[:-2])
    return apply(get("linalg.solve"), (A, B))


# ------------------------------------------------------------------ cholesky
_CHOLESKY = _lapack_kind("linalg.cholesky", blas.cholesky_native)


@kernel("linalg.cholesky", kind=_CHOLESKY, batch=batching("leading"))
def _cholesky_kernel(A):
    return call_native(_CHOLESKY, (A,), {})


@op_function("linalg.cholesky")
def cholesky(A: Tensor, *, upper: bool = False) -> Tensor:
    """The Cholesky factor ``L`` (lower, ``A = L @ L.mT``) of a symmetric positive-definite
    matrix, or ``U = L.mT`` when ``upper=True``. Only the lower triangle of ``A`` is read."""
    A = _float("linalg.cholesky", A)
    _square("linalg.cholesky", A)
    L = apply(get("linalg.cholesky"), (A,))
    if upper:
        return transpose(L, -2, -1)
    return L


def _cholesky_backward_static(attrs: dict, shapes: tuple) -> NativePlan:
    G, L = tuple(shapes[0]), tuple(shapes[1])
    batch, *plan = _broadcast_plan(G, L)
    return NativePlan((G, L, *plan), (batch + L[-2:],))


_CHOLESKY_BACKWARD = Opaque(native=cholesky_backward_native, static=_cholesky_backward_static)


@kernel("cholesky_backward", kind=_CHOLESKY_BACKWARD, batch=batching("leading", 2, 2))
def _cholesky_backward_kernel(gL, L):
    return call_native(_CHOLESKY_BACKWARD, (gL, L), {})


@op_function("cholesky_backward")
def cholesky_backward(gL: Tensor, L: Tensor) -> Tensor:
    """The gradient of ``linalg.cholesky`` for its input: ``L^-T Phi L^-1`` with ``Phi =
    sym(tril(L^T gL))`` (diagonal halved), symmetric, from the lower factor ``L`` and the
    gradient ``gL`` of the factor; only their lower triangles are read; batch dimensions
    broadcast. Computed by the blocked reverse of the factorisation (two thirds of the
    flops of one ``n x n`` product, :mod:`nbgrad.kernels.cholesky_backward`)."""
    gL, L = promote_operands(gL, L)
    gL, L = _float("cholesky_backward", gL), _float("cholesky_backward", L)
    _square("cholesky_backward", L)
    if gL.shape[-2:] != L.shape[-2:]:
        raise RuntimeError(f"cholesky_backward: gL of shape {gL.shape} and L of shape "
                           f"{L.shape} do not fit (both (..., n, n))")
    _check_batches("cholesky_backward", L, gL, gL.shape[:-2])
    return apply(get("cholesky_backward"), (gL, L))


# ------------------------------------------------------------------ triangular solve
def _solve_triangular_static(attrs: dict, shapes: tuple) -> NativePlan:
    A, B = tuple(shapes[0]), tuple(shapes[1])
    batch, *plan = _broadcast_plan(A, B)
    return NativePlan((bool(attrs["upper"]), bool(attrs["unitriangular"]), bool(attrs["left"]),
                       A, B, *plan, *_where("linalg.solve_triangular", A)), (batch + B[-2:],))


_SOLVE_TRIANGULAR = Opaque(native=blas.solve_triangular_native,
                           static=_solve_triangular_static)


@kernel("linalg.solve_triangular", kind=_SOLVE_TRIANGULAR, batch=batching("leading", 2, 2))
def _solve_triangular_kernel(A, B, upper, left, unitriangular):
    return call_native(_SOLVE_TRIANGULAR, (A, B), {"upper": upper, "left": left,
                                                   "unitriangular": unitriangular})


@op_function("linalg.solve_triangular")
def solve_triangular(A: Tensor, B: Tensor, *, upper: bool | None = None, left: bool = True,
                     unitriangular: bool = False, lower: bool | None = None) -> Tensor:
    """The solution ``X`` of ``A @ X = B`` (``X @ A = B`` when ``left=False``) for a
    triangular ``A``: only its upper (``upper=True``, or SciPy's and JAX's ``lower=False``)
    or lower triangle is read, and its diagonal is taken as ones when ``unitriangular``.
    ``B`` is a matrix ``(..., n, k)``, or a vector ``(n,)`` (as SciPy and JAX; the result
    is then a vector too). A zero on the diagonal raises LinAlgError (as SciPy)."""
    if (upper is None) == (lower is None):
        raise TypeError("linalg.solve_triangular: give exactly one of upper= (PyTorch) and "
                        "lower= (SciPy, JAX)")
    upper = bool(upper) if upper is not None else not bool(lower)
    A, B = promote_operands(A, B)
    A, B = _float("linalg.solve_triangular", A), _float("linalg.solve_triangular", B)
    _square("linalg.solve_triangular", A)
    if B.ndim == 1:  # a vector: a column (a row for left=False), and back
        as_matrix = unsqueeze(B, -1 if left else 0)
        X = solve_triangular(A, as_matrix, upper=upper, left=left, unitriangular=unitriangular)
        return squeeze(X, -1 if left else -2)
    if B.ndim < 2:
        raise RuntimeError(f"linalg.solve_triangular: B must be a matrix (..., n, k) or a "
                           f"vector (n,), got shape {B.shape}")
    n = B.shape[-2] if left else B.shape[-1]
    if n != A.shape[-1]:
        raise RuntimeError(f"linalg.solve_triangular: A of shape {A.shape} and B of shape "
                           f"{B.shape} do not fit (left={left})")
    _check_batches("linalg.solve_triangular", A, B, B.shape[:-2])
    return apply(get("linalg.solve_triangular"),
                 (A, B, bool(upper), bool(left), bool(unitriangular)))


# ------------------------------------------------------------------ triangular product
def _triangular_matmul_static(attrs: dict, shapes: tuple) -> NativePlan:
    A, B = tuple(shapes[0]), tuple(shapes[1])
    batch, *plan = _broadcast_plan(A, B)
    return NativePlan((bool(attrs["upper"]), bool(attrs["transpose"]), A, B, *plan),
                      (batch + B[-2:],))


_TRIANGULAR_MATMUL = Opaque(native=blas.triangular_matmul_native,
                            static=_triangular_matmul_static)


@kernel("triangular_matmul", kind=_TRIANGULAR_MATMUL, batch=batching("leading", 2, 2))
def _triangular_matmul_kernel(A, B, upper, transpose):
    return call_native(_TRIANGULAR_MATMUL, (A, B), {"upper": upper, "transpose": transpose})


@op_function("triangular_matmul")
def triangular_matmul(A: Tensor, B: Tensor, *, upper: bool, transpose: bool = False
                      ) -> Tensor:
    """``T @ B`` (``T.mT @ B`` when ``transpose``) for ``T`` the upper (``upper=True``) or
    lower triangle of the square ``A``: only that triangle is read (BLAS ``trmm``, half
    the work of ``matmul``). ``B`` is a matrix ``(..., n, k)``; batch dimensions
    broadcast. Cholesky's backward multiplies by its factor with it."""
    A, B = promote_operands(A, B)
    A, B = _float("triangular_matmul", A), _float("triangular_matmul", B)
    _square("triangular_matmul", A)
    if B.ndim < 2 or B.shape[-2] != A.shape[-1]:
        raise RuntimeError(f"triangular_matmul: A of shape {A.shape} and B of shape "
                           f"{B.shape} do not fit (B needs n rows: (..., n, k))")
    _check_batches("triangular_matmul", A, B, B.shape[:-2])
    return apply(get("triangular_matmul"), (A, B, bool(upper), bool(transpose)))
