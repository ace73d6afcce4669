"""Matrix products: ``matmul``, ``mm``, ``bmm``, ``dot``, ``outer``."""

from __future__ import annotations

import numpy as np

from ..kernels import blas
from ..tensor import Tensor
from .dispatch import apply, promote_operands
from .registry import get, kernel, op_function

__all__ = ["bmm", "dot", "matmul", "mm", "outer"]


def _floats(op: str, a, b) -> tuple[Tensor, Tensor]:
    a, b = promote_operands(a, b)
    if a.dtype.kind != "f":
        from .convert import to_dtype

        a, b = to_dtype(a, "float64"), to_dtype(b, "float64")
    return a, b


def _shape_error(op: str, a, b, why: str) -> RuntimeError:
    return RuntimeError(
        f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied ({why})"
    )


@kernel("matmul")
def _matmul_kernel(a, b):
    return blas.matmul_nd(a, b)


@op_function("matmul")
def matmul(self: Tensor, other: Tensor) -> Tensor:
    """NumPy's ``matmul``: 1-D operands are promoted, batch dimensions broadcast."""
    a, b = _floats("matmul", self, other)
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError(
            f"matmul: both operands need at least 1 dimension, got shapes {a.shape} and {b.shape}"
        )
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise _shape_error("matmul", a, b, f"{ka} != {kb}")
    if a.ndim > 2 or b.ndim > 2:
        try:
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise _shape_error("matmul", a, b, "batch dimensions do not broadcast") from None
    return apply(get("matmul"), (a, b))


@kernel("mm")
def _mm_kernel(a, b):
    return blas.matmul2d(a, b)


@op_function("mm")
def mm(self: Tensor, mat2: Tensor) -> Tensor:
    """Product of two matrices."""
    a, b = _floats("mm", self, mat2)
    if a.ndim != 2 or b.ndim != 2:
        raise _shape_error("mm", a, b, "both must be 2-D")
    if a.shape[1] != b.shape[0]:
        raise _shape_error("mm", a, b, f"{a.shape[1]} != {b.shape[0]}")
    return apply(get("mm"), (a, b))


@kernel("bmm")
def _bmm_kernel(a, b):
    return blas.matmul3d(a, b)


@op_function("bmm")
def bmm(self: Tensor, mat2: Tensor) -> Tensor:
    """Batched product of (b, n, m) and (b, m, p) tensors."""
    a, b = _floats("bmm", self, mat2)
    if a.ndim != 3 or b.ndim != 3:
        raise _shape_error("bmm", a, b, "both must be 3-D")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise _shape_error("bmm", a, b, "batch sizes or inner sizes differ")
    return apply(get("bmm"), (a, b))


@kernel("dot")
def _dot_kernel(a, b):
    return blas.matmul_nd(a, b)


@op_function("dot")
def dot(self: Tensor, other: Tensor) -> Tensor:
    """Inner product of two 1-D tensors."""
    a, b = _floats("dot", self, other)
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise _shape_error("dot", a, b, "both must be 1-D of one length")
    return apply(get("dot"), (a, b))


@kernel("outer")
def _outer_kernel(a, b):
    return blas.matmul2d(a.reshape(-1, 1), b.reshape(1, -1))


@op_function("outer")
def outer(self: Tensor, vec2: Tensor) -> Tensor:
    """Outer product of two 1-D tensors."""
    a, b = _floats("outer", self, vec2)
    if a.ndim != 1 or b.ndim != 1:
        raise _shape_error("outer", a, b, "both must be 1-D")
    return apply(get("outer"), (a, b))
