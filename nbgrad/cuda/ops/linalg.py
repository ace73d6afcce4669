"""CUDA kernels of the linear-algebra ops (as :mod:`nbgrad.ops.linalg` on the CPU):
matrix products and diagonals."""

from __future__ import annotations

from ...ops.registry import kernel
from .. import compute as C
from .. import kernels as K
from ..array import CudaArray, copy_into, full


@kernel("matmul", target="cuda")
@kernel("mm", target="cuda")
@kernel("dot", target="cuda")
def _matmul(a: CudaArray, b: CudaArray) -> CudaArray:
    return C.matmul_nd(a, b)


@kernel("bmm", target="cuda")
def _bmm(a: CudaArray, b: CudaArray) -> CudaArray:
    return C.matmul3(a, b)


@kernel("outer", target="cuda")
def _outer(a: CudaArray, b: CudaArray) -> CudaArray:
    A = a.view_as((a.shape[0], 1), (a.strides[0], 0), a.offset)
    B = b.view_as((1, b.shape[0]), (0, b.strides[0]), b.offset)
    return C.matmul_nd(A, B)


# ---------------------------------------------------------------------- diagonals
def _diagonal_view(x: CudaArray, offset: int, dim1: int, dim2: int) -> CudaArray:
    """NumPy's ``diagonal`` as a view: the other dimensions, then the diagonal."""
    n1, n2 = x.shape[dim1], x.shape[dim2]
    s1, s2 = x.strides[dim1], x.strides[dim2]
    if offset >= 0:
        length, start = max(0, min(n1, n2 - offset)), offset * s2
    else:
        length, start = max(0, min(n1 + offset, n2)), -offset * s1
    keep = [d for d in range(x.ndim) if d not in (dim1, dim2)]
    return x.view_as(tuple(x.shape[d] for d in keep) + (length,),
                     tuple(x.strides[d] for d in keep) + (s1 + s2,),
                     x.offset + (start if length else 0))


@kernel("diagonal", target="cuda")
def _diagonal(x: CudaArray, offset: int, dim1: int, dim2: int) -> CudaArray:
    return _diagonal_view(x, offset, dim1, dim2)


@kernel("diagonal_backward", target="cuda")
def _diagonal_backward(g: CudaArray, input_sizes, offset: int, dim1: int,
                       dim2: int) -> CudaArray:
    out = full(tuple(input_sizes), 0, g.dtype)
    copy_into(_diagonal_view(out, offset, dim1, dim2), g)
    return out


@kernel("diag", target="cuda")
def _diag(x: CudaArray, diagonal: int) -> CudaArray:
    if x.ndim == 2:
        return _diagonal_view(x, diagonal, 0, 1).copy()
    n = x.shape[0] + abs(diagonal)
    out = full((n, n), 0, x.dtype)
    copy_into(_diagonal_view(out, diagonal, 0, 1), x)
    return out


@kernel("trace", target="cuda")
def _trace(x: CudaArray) -> CudaArray:
    d = _diagonal_view(x, 0, 0, 1)
    return C.reduce(d, (0,), (), K.SUM, C.sum_dtype(x.dtype))
