"""CUDA kernels of the reductions and scans (as :mod:`nbgrad.ops.reduction` on the CPU).

Sums and means run the tree reductions of :func:`nbgrad.cuda.compute.reduce`; the
others move the reduced dimensions last and run one thread per row
(:mod:`nbgrad.cuda.rows`).
"""

from __future__ import annotations

import math

import numpy as np

from ...kernels import reduction as rk
from ...ops.reduction import _nonempty_shape
from ...ops.registry import kernel
from .. import compute as C
from .. import elementwise as cew
from .. import kernels as K
from .. import rows as R_
from ..array import CudaArray, copy_into, empty, full
from ..compute import along, flat, launch, rows_last, sum_dtype


def _reduce(x: CudaArray, dim, keepdim: bool, op_name: str, op: int, out_dtype,
            mean: bool = False) -> CudaArray:
    dims = rk.normalize_dims(dim, x.ndim, op_name)
    dims = tuple(d for d in dims if d < x.ndim)
    kept = tuple(x.shape[d] for d in range(x.ndim) if d not in dims)
    out_shape = rk.keep_shape(x.shape, dims, keepdim, kept)
    count = math.prod(x.shape[d] for d in dims)
    return C.reduce(x, dims, out_shape, op, out_dtype, float(count) if mean else 1.0)


@kernel("sum", target="cuda")
def _sum(x: CudaArray, dim, keepdim: bool, dtype) -> CudaArray:
    out = _reduce(x, dim, keepdim, "sum", K.SUM, sum_dtype(x.dtype))
    return out if dtype is None else out.astype(dtype, copy=False)


@kernel("mean", target="cuda")
def _mean(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _reduce(x, dim, keepdim, "mean", K.SUM, x.dtype, mean=True)


@kernel("sum_to", target="cuda")
def _sum_to(x: CudaArray, size) -> CudaArray:
    size = tuple(size)
    lead = x.ndim - len(size)
    if lead < 0:
        raise RuntimeError(f"sum_to: cannot reduce shape {x.shape} to {size}")
    dims = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(size) if s == 1 and x.shape[lead + i] != 1)
    if not dims:
        return x.reshape(size)
    return _reduce(x, dims, True, "sum_to", K.SUM, x.dtype).reshape(size)


@kernel("sum_backward", target="cuda")
def _sum_backward(g: CudaArray, sizes, dim, keepdim: bool) -> CudaArray:
    dims = rk.restored_dims(dim, tuple(sizes), keepdim, "sum_backward")
    if dims:
        g = C.insert_dims(g, dims)
    return g.broadcast_to(tuple(sizes)).copy()


# ---------------------------------------------------------------------- row kernels
def _row_reduce(x: CudaArray, dim, keepdim: bool, op: str, run, out_dtype=None) -> CudaArray:
    """``run(flat, M, R, out)`` over the rows of ``dim``; the result in the kept shape."""
    dims = rk.normalize_dims(dim, x.ndim, op)
    dims = tuple(d for d in dims if d < x.ndim)
    v, M, R, kept = rows_last(x, dims)
    out = empty(rk.keep_shape(x.shape, dims, keepdim, kept), out_dtype or x.dtype)
    if M:
        run(flat(v), M, R, out.buf)
    return out


def _nonempty(x: CudaArray, dim, op: str) -> None:
    _nonempty_shape(x.shape, rk.normalize_dims(dim, x.ndim, op), op)


def _extreme_values(x: CudaArray, dim, keepdim: bool, op: str, is_max: bool) -> CudaArray:
    return _extreme_dim(x, dim, keepdim, op, is_max)[0]


@kernel("max", target="cuda")
def _max(x: CudaArray) -> CudaArray:
    return _extreme_values(x, None, False, "max", True)


@kernel("min", target="cuda")
def _min(x: CudaArray) -> CudaArray:
    return _extreme_values(x, None, False, "min", False)


@kernel("amax", target="cuda")
def _amax(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _extreme_values(x, dim, keepdim, "amax", True)


@kernel("amin", target="cuda")
def _amin(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _extreme_values(x, dim, keepdim, "amin", False)


def _extreme_dim(x: CudaArray, dim, keepdim: bool, op: str, is_max: bool):
    """(values, first indices) of the largest (``is_max``) or smallest values over ``dim``."""
    _nonempty(x, dim, op)
    dims = rk.normalize_dims(dim, x.ndim, op)
    kept = tuple(x.shape[d] for d in range(x.ndim) if d not in dims)
    idx = empty(rk.keep_shape(x.shape, dims, keepdim, kept), np.int64)
    values = _row_reduce(x, dim, keepdim, op, lambda f, M, R, o: launch(
        R_.extreme_rows, M, f, M, R, 1, o, idx.buf, is_max))
    return values, idx


@kernel("max_dim", target="cuda")
def _max_dim(x: CudaArray, dim: int, keepdim: bool):
    return _extreme_dim(x, dim, keepdim, "max", True)


@kernel("min_dim", target="cuda")
def _min_dim(x: CudaArray, dim: int, keepdim: bool):
    return _extreme_dim(x, dim, keepdim, "min", False)


def _arg_extreme(x: CudaArray, dim, keepdim: bool, op: str, is_max: bool) -> CudaArray:
    if dim is None:
        _nonempty(x, None, op)
        flat_x = x.reshape(-1)
        idx = _extreme_dim(flat_x, 0, False, op, is_max)[1]
        return idx.reshape((1,) * x.ndim if keepdim else ())
    return _extreme_dim(x, dim, keepdim, op, is_max)[1]


@kernel("argmax", target="cuda")
def _argmax(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _arg_extreme(x, dim, keepdim, "argmax", True)


@kernel("argmin", target="cuda")
def _argmin(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _arg_extreme(x, dim, keepdim, "argmin", False)


@kernel("prod", target="cuda")
def _prod(x: CudaArray, dim, keepdim: bool, dtype) -> CudaArray:
    out_dtype = dtype if dtype is not None else sum_dtype(x.dtype)
    x = x.astype(out_dtype, copy=False)
    return _row_reduce(x, dim, keepdim, "prod", lambda f, M, R, o: launch(
        R_.prod_rows, M, f, M, R, 1, o))


def _variance(x: CudaArray, dim, correction: float, keepdim: bool, op: str) -> CudaArray:
    dims = rk.normalize_dims(dim, x.ndim, op)
    if x.size == 0 or (x.ndim and any(x.shape[d] == 0 for d in dims)):
        kept = tuple(s for d, s in enumerate(x.shape) if d not in dims)
        return full(rk.keep_shape(x.shape, dims, keepdim, kept), math.nan, x.dtype)
    return _row_reduce(x, dims, keepdim, op, lambda f, M, R, o: launch(
        R_.var_rows, M, f, M, R, 1, float(correction), o))


@kernel("var", target="cuda")
def _var(x: CudaArray, dim, correction: float, keepdim: bool) -> CudaArray:
    return _variance(x, dim, correction, keepdim, "var")


@kernel("std", target="cuda")
def _std(x: CudaArray, dim, correction: float, keepdim: bool) -> CudaArray:
    v = _variance(x, dim, correction, keepdim, "std")
    return cew.run_unary("sqrt", v, v.dtype)


@kernel("logsumexp", target="cuda")
def _logsumexp(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    dims = rk.normalize_dims(dim, x.ndim, "logsumexp")
    if x.ndim and any(x.shape[d] == 0 for d in dims) or x.size == 0:
        kept = tuple(s for d, s in enumerate(x.shape) if d not in dims)
        return full(rk.keep_shape(x.shape, dims, keepdim, kept), -math.inf, x.dtype)
    return _row_reduce(x, dims, keepdim, "logsumexp", lambda f, M, R, o: launch(
        R_.logsumexp_rows, M, f, M, R, 1, o))


@kernel("norm", target="cuda")
def _norm(x: CudaArray, p: float, dim, keepdim: bool, dtype) -> CudaArray:
    if dtype is not None:
        x = x.astype(dtype, copy=False)
    dims = rk.normalize_dims(dim, x.ndim, "norm")
    if math.isinf(p) and (x.size == 0 or any(x.shape[d] == 0 for d in dims if x.ndim)):
        raise IndexError(f"norm: the infinity norm of a zero-size reduction is undefined "
                         f"(shape {x.shape}, dims {dims})")
    return _row_reduce(x, dims, keepdim, "norm", lambda f, M, R, o: launch(
        R_.norm_rows, M, f, M, R, 1, float(p), o))


# ---------------------------------------------------------------------- scans
def _scan(x: CudaArray, dim: int, dtype, rows_kernel) -> CudaArray:
    out_dtype = dtype if dtype is not None else sum_dtype(x.dtype)
    x = x.astype(out_dtype, copy=False)

    def run(f, M, R, o):
        acc = empty((M,), np.float64 if np.dtype(out_dtype).kind == "f" else np.int64)
        launch(rows_kernel, M, f, M, R, 1, acc.buf, o)

    return along(x, dim, out_dtype, run)


@kernel("cumsum", target="cuda")
def _cumsum(x: CudaArray, dim: int, dtype) -> CudaArray:
    return _scan(x, dim, dtype, R_.cumsum_rows)


@kernel("cumprod", target="cuda")
def _cumprod(x: CudaArray, dim: int, dtype) -> CudaArray:
    return _scan(x, dim, dtype, R_.cumprod_rows)


@kernel("scan", target="cuda")
def _scan_k(b: CudaArray, a: CudaArray, dim: int, reverse: bool) -> CudaArray:
    shape = cew.broadcast_shape("scan", b.shape, a.shape)
    dtype = np.result_type(b.dtype, a.dtype)
    b = b.astype(dtype, copy=False).broadcast_to(shape)
    a = a.astype(dtype, copy=False).broadcast_to(shape)
    if not shape:
        return b.copy()
    av = rows_last(a, (dim,))[0]

    def run(f, M, R, o):
        acc = empty((M,), dtype)
        launch(R_.scan_rows, M, f, flat(av), M, R, 1, bool(reverse), acc.buf, o)

    return along(b, dim, dtype, run)


@kernel("shift_along", target="cuda")
def _shift_along(x: CudaArray, dim: int, offset: int, fill: float) -> CudaArray:
    out = full(x.shape, fill, x.dtype)
    n = x.shape[dim] if x.ndim else 1
    if abs(offset) >= n:
        return out
    if x.ndim == 0:
        return x.copy()
    length = n - abs(offset)
    dst, src = (offset, 0) if offset >= 0 else (0, -offset)
    copy_into(C.narrow(out, dim, dst, length), C.narrow(x, dim, src, length))
    return out
