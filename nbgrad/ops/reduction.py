"""Reductions: ``sum``, ``mean`` and the backward helpers ``sum_to`` / ``sum_backward``."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..kernels import reduction as rk
from ..kernels.layout import c_contiguous
from ..tensor import Tensor
from .dispatch import apply, as_tensor
from .registry import formula_helper, get, kernel, op_function

__all__ = ["mean", "sum", "sum_backward", "sum_to"]


_SUM = get("sum")
_MEAN = get("mean")
_SUM_TO = get("sum_to")
_SUM_BACKWARD = get("sum_backward")


def _dims_arg(dim, axis):
    if axis is not None:
        if dim is not None:
            raise TypeError("give dim or axis, not both")
        return axis
    return dim


def _norm_dim_attr(dim):
    if dim is None:
        return None
    if isinstance(dim, (int, np.integer)):
        return int(dim)
    return tuple(int(d) for d in dim)


def _sum_dtype(dtype: np.dtype) -> np.dtype:
    return dtypes.int64 if dtype.kind in "biu" else dtype


def reduce_sum(x: np.ndarray, dim, keepdim: bool, op: str = "sum") -> np.ndarray:
    dims = rk.normalize_dims(dim, x.ndim, op)
    flat, A, R, B, kept = rk.arb_view(x, dims)
    out_dtype = _sum_dtype(x.dtype)
    out = np.empty(A * B, out_dtype)
    if flat.dtype.kind in "biu":
        flat = flat.astype(np.int64)
    rk.sum_arb(flat, A, R, B, out)
    return out.reshape(rk.keep_shape(x.shape, dims, keepdim, kept))


@formula_helper
def reduced_count(shape, dim) -> int:
    """How many elements each output of a reduction over ``dim`` combines."""
    dims = rk.normalize_dims(dim, len(shape), "mean")
    return int(np.prod([shape[d] for d in dims])) if shape else 1


@kernel("sum")
def _sum_kernel(x, dim, keepdim, dtype):
    out = reduce_sum(x, dim, keepdim)
    return out if dtype is None else out.astype(dtype)


@op_function("sum")
def sum(self: Tensor, dim=None, keepdim: bool = False, dtype=None, *, axis=None) -> Tensor:  # noqa: A001
    """Sum over ``dim`` (int, tuple or None for all)."""
    self = as_tensor(self)
    dt = dtypes.as_dtype(dtype) if dtype is not None else None
    return apply(_SUM, (self, _norm_dim_attr(_dims_arg(dim, axis)), bool(keepdim), dt))


@kernel("mean")
def _mean_kernel(x, dim, keepdim):
    total = reduce_sum(x, dim, keepdim, "mean")
    count = reduced_count(x.shape, dim)
    return (total / count).astype(x.dtype, copy=False)


@op_function("mean")
def mean(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """Arithmetic mean over ``dim``."""
    self = as_tensor(self)
    if self.dtype.kind != "f":
        raise TypeError(f"mean: needs a floating tensor, got {self.dtype}")
    return apply(_MEAN, (self, _norm_dim_attr(_dims_arg(dim, axis)), bool(keepdim)))


@kernel("sum_to")
def _sum_to_kernel(x, size):
    size = tuple(size)
    lead = x.ndim - len(size)
    if lead < 0:
        raise RuntimeError(f"sum_to: cannot reduce shape {x.shape} to {size}")
    dims = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(size) if s == 1 and x.shape[lead + i] != 1
    )
    out = reduce_sum(x, dims, True, "sum_to") if dims else x
    return out.reshape(size).astype(x.dtype, copy=False)


@op_function("sum_to")
def sum_to(self: Tensor, size) -> Tensor:
    """Sum the broadcast dimensions of ``self`` away so that it has shape ``size``."""
    size = tuple(int(s) for s in size)
    if self.shape == size:
        return self
    return apply(_SUM_TO, (self, size))


@kernel("sum_backward")
def _sum_backward_kernel(g, sizes, dim, keepdim):
    sizes = tuple(sizes)
    dims = rk.normalize_dims(dim, len(sizes), "sum_backward")
    if not keepdim:
        g = np.expand_dims(g, dims) if dims else g
    return c_contiguous(np.broadcast_to(g, sizes))


@op_function("sum_backward")
def sum_backward(self: Tensor, sizes, dim=None, keepdim: bool = False) -> Tensor:
    """Broadcast the gradient of a reduction over ``dim`` back to shape ``sizes``."""
    return apply(_SUM_BACKWARD, (self, tuple(int(s) for s in sizes), dim, bool(keepdim)))
