"""The CUDA kernel of every covered table op, keyed by op name (see :data:`KERNELS`).

A kernel has the signature of the op's CPU kernel (table order, arrays in place of
tensors) but receives and returns :class:`~nbgrad.cuda.array.CudaArray` values.
Shape checks raise the same errors as on the CPU. :func:`nbgrad.cuda.register` puts
these into the op registry as the ``"cuda"`` target.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .. import dtypes
from ..device import Device
from ..kernels import elementwise as ew
from ..kernels import reduction as rk
from . import compute as C
from . import elementwise as cew
from . import kernels as K
from . import rows as R_
from .array import CudaArray, copy_into, empty, full, grid_1d

#: op name -> CUDA kernel
KERNELS: dict[str, Callable] = {}


def cuda_kernel(name: str):
    def register(fn: Callable) -> Callable:
        KERNELS[name] = fn
        return fn
    return register


# ---------------------------------------------------------------------- elementwise
def _out_dtype(kind: str, dtype: np.dtype) -> np.dtype:
    return dtypes.bool_ if kind == "bool" else dtype


#: ops whose CPU kernel turns a non-numeric argument into the expression's p0
PARAMS = {"gelu": lambda approximate: (0.0 if approximate == "none" else 1.0,)}


def _unary(spec: ew.ScalarOp) -> Callable:
    name, kind = spec.name, spec.kind
    convert = PARAMS.get(name, lambda *params: tuple(map(float, params)))

    def unary_kernel(x: CudaArray, *params) -> CudaArray:
        return cew.run_unary(name, x, _out_dtype(kind, x.dtype), *convert(*params))

    unary_kernel.__name__ = f"cuda_{name}"
    return unary_kernel


def _binary(spec: ew.ScalarOp) -> Callable:
    name, kind = spec.name, spec.kind

    def binary_kernel(a: CudaArray, b: CudaArray) -> CudaArray:
        return cew.run_binary(name, a, b, _out_dtype(kind, a.dtype))

    binary_kernel.__name__ = f"cuda_{name}"
    return binary_kernel


for _spec in ew.UNARY.values():
    KERNELS[_spec.name] = _unary(_spec)
for _spec in ew.BINARY.values():
    KERNELS[_spec.name] = _binary(_spec)


@cuda_kernel("polygamma")
def _polygamma(n: int, x: CudaArray) -> CudaArray:  # table order: polygamma(int n, Tensor self)
    return cew.run_unary("polygamma", x, x.dtype, float(n))


@cuda_kernel("clamp_tensor")
def _clamp_tensor(x: CudaArray, lo: CudaArray | None, hi: CudaArray | None) -> CudaArray:
    out = x
    if lo is not None:
        out = cew.run_binary("maximum", out, lo, x.dtype)
    if hi is not None:
        out = cew.run_binary("minimum", out, hi, x.dtype)
    return out


@cuda_kernel("where")
def _where(condition: CudaArray, a: CudaArray, b: CudaArray) -> CudaArray:
    return cew.run_ternary("where", condition.astype(np.bool_, copy=False), a, b, a.dtype)


@cuda_kernel("lerp")
def _lerp(a: CudaArray, b: CudaArray, w: CudaArray) -> CudaArray:
    return cew.run_ternary("lerp", w, a, b, a.dtype)


# ---------------------------------------------------------------------- conversion
@cuda_kernel("to_dtype")
def _to_dtype(x: CudaArray, dtype) -> CudaArray:
    return x.astype(dtype)


@cuda_kernel("to_device")
def _to_device(x: CudaArray, device: str):
    return x.copy_to_host() if Device.of(device).type == "cpu" else x.copy()


@cuda_kernel("contiguous")
def _contiguous(x: CudaArray) -> CudaArray:
    return x.copy()


@cuda_kernel("zeros_like")
def _zeros_like(x: CudaArray) -> CudaArray:
    return full(x.shape, 0, x.dtype)


@cuda_kernel("ones_like")
def _ones_like(x: CudaArray) -> CudaArray:
    return full(x.shape, 1, x.dtype)


# ---------------------------------------------------------------------- reductions
def _sum_dtype(dtype: np.dtype) -> np.dtype:
    return dtypes.int64 if dtype.kind in "biu" else dtype


def _reduce(x: CudaArray, dim, keepdim: bool, op_name: str, op: int, out_dtype,
            mean: bool = False) -> CudaArray:
    dims = rk.normalize_dims(dim, x.ndim, op_name)
    dims = tuple(d for d in dims if d < x.ndim)
    kept = tuple(x.shape[d] for d in range(x.ndim) if d not in dims)
    out_shape = rk.keep_shape(x.shape, dims, keepdim, kept)
    count = math.prod(x.shape[d] for d in dims)
    return C.reduce(x, dims, out_shape, op, out_dtype, float(count) if mean else 1.0)


@cuda_kernel("sum")
def _sum(x: CudaArray, dim, keepdim: bool, dtype) -> CudaArray:
    out = _reduce(x, dim, keepdim, "sum", K.SUM, _sum_dtype(x.dtype))
    return out if dtype is None else out.astype(dtype, copy=False)


@cuda_kernel("mean")
def _mean(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _reduce(x, dim, keepdim, "mean", K.SUM, x.dtype, mean=True)


@cuda_kernel("sum_to")
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


@cuda_kernel("sum_backward")
def _sum_backward(g: CudaArray, sizes, dim, keepdim: bool) -> CudaArray:
    sizes = tuple(sizes)
    dims = rk.normalize_dims(dim, len(sizes), "sum_backward")
    if not keepdim and dims:
        g = C.insert_dims(g, dims)
    return g.broadcast_to(sizes).copy()


# ---------------------------------------------------------------------- linear algebra
@cuda_kernel("matmul")
def _matmul(a: CudaArray, b: CudaArray) -> CudaArray:
    return C.matmul_nd(a, b)


@cuda_kernel("mm")
def _mm(a: CudaArray, b: CudaArray) -> CudaArray:
    return C.matmul_nd(a, b)


@cuda_kernel("bmm")
def _bmm(a: CudaArray, b: CudaArray) -> CudaArray:
    return C.matmul3(a, b)


@cuda_kernel("dot")
def _dot(a: CudaArray, b: CudaArray) -> CudaArray:
    return C.matmul_nd(a, b)


@cuda_kernel("outer")
def _outer(a: CudaArray, b: CudaArray) -> CudaArray:
    A = a.view_as((a.shape[0], 1), (a.strides[0], 0), a.offset)
    B = b.view_as((1, b.shape[0]), (0, b.strides[0]), b.offset)
    return C.matmul_nd(A, B)


# ---------------------------------------------------------------------- shape: views
@cuda_kernel("reshape")
def _reshape(x: CudaArray, shape) -> CudaArray:
    try:
        return x.reshape(tuple(shape))
    except ValueError:
        raise RuntimeError(f"reshape: shape {tuple(shape)} is invalid for a tensor of shape "
                           f"{x.shape} ({x.size} elements)") from None


@cuda_kernel("view")
def _view(x: CudaArray, size) -> CudaArray:
    if not x.flags.c_contiguous:
        raise RuntimeError("view: the tensor is not contiguous; use reshape()")
    return _reshape(x, size)


@cuda_kernel("flatten")
def _flatten(x: CudaArray, start_dim: int, end_dim: int) -> CudaArray:
    if x.ndim == 0:
        return x.reshape(1)
    shape = (x.shape[:start_dim] + (math.prod(x.shape[start_dim:end_dim + 1]),)
             + x.shape[end_dim + 1:])
    return x.reshape(shape)


@cuda_kernel("permute")
def _permute(x: CudaArray, dims) -> CudaArray:
    return x.permuted(tuple(dims))


@cuda_kernel("transpose")
def _transpose(x: CudaArray, dim0: int, dim1: int) -> CudaArray:
    dims = list(range(x.ndim))
    if x.ndim:
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
    return x.permuted(tuple(dims))


@cuda_kernel("squeeze")
def _squeeze(x: CudaArray, dim) -> CudaArray:
    dims = tuple(i for i, s in enumerate(x.shape) if s == 1 and (dim is None or i in dim))
    return C.drop_dims(x, dims)


@cuda_kernel("unsqueeze")
def _unsqueeze(x: CudaArray, dim: int) -> CudaArray:
    return C.insert_dims(x, (dim,))


@cuda_kernel("expand")
def _expand(x: CudaArray, size) -> CudaArray:
    try:
        return x.broadcast_to(tuple(size))
    except ValueError:
        raise RuntimeError(f"expand: shape {x.shape} cannot be expanded to {tuple(size)}") \
            from None


@cuda_kernel("broadcast_to")
def _broadcast_to(x: CudaArray, size) -> CudaArray:
    return _expand(x, size)


# ---------------------------------------------------------------------- joins and splits
@cuda_kernel("cat")
def _cat(tensors: list[CudaArray], dim: int) -> CudaArray:
    first = tensors[0]
    if any(t.ndim != first.ndim or t.shape[:dim] + t.shape[dim + 1:] !=
           first.shape[:dim] + first.shape[dim + 1:] for t in tensors):
        shapes = [t.shape for t in tensors]
        raise RuntimeError(f"cat: shapes {shapes} do not match outside dim {dim}")
    total = sum(t.shape[dim] for t in tensors)
    shape = first.shape[:dim] + (total,) + first.shape[dim + 1:]
    out = empty(shape, np.result_type(*[t.dtype for t in tensors]))
    start = 0
    for t in tensors:
        copy_into(C.narrow(out, dim, start, t.shape[dim]), t)
        start += t.shape[dim]
    return out


@cuda_kernel("stack")
def _stack(tensors: list[CudaArray], dim: int) -> CudaArray:
    first = tensors[0]
    if any(t.shape != first.shape for t in tensors):
        shapes = [t.shape for t in tensors]
        raise RuntimeError(f"stack: expects tensors of one shape, got {shapes}")
    shape = first.shape[:dim] + (len(tensors),) + first.shape[dim:]
    out = empty(shape, np.result_type(*[t.dtype for t in tensors]))
    for i, t in enumerate(tensors):
        copy_into(C.select(out, dim, i), t)
    return out


@cuda_kernel("split_with_sizes")
def _split_with_sizes(x: CudaArray, split_sizes, dim: int) -> list[CudaArray]:
    if sum(split_sizes) != x.shape[dim]:
        raise RuntimeError(f"split_with_sizes: sizes {tuple(split_sizes)} do not add up to "
                           f"{x.shape[dim]} (dim {dim} of shape {x.shape})")
    out, start = [], 0
    for s in split_sizes:
        out.append(C.narrow(x, dim, start, int(s)))
        start += int(s)
    return out


@cuda_kernel("split")
def _split(x: CudaArray, split_size_or_sections, dim: int) -> list[CudaArray]:
    n = x.shape[dim]
    if isinstance(split_size_or_sections, (int, np.integer)):
        step = int(split_size_or_sections)
        if step <= 0:
            raise ValueError(f"split: split_size must be positive, got {step}")
        sizes = [step] * (n // step) + ([n % step] if n % step else [])
    else:
        sizes = [int(s) for s in split_size_or_sections]
    return _split_with_sizes(x, sizes, dim)


@cuda_kernel("unbind")
def _unbind(x: CudaArray, dim: int) -> list[CudaArray]:
    return [C.select(x, dim, i) for i in range(x.shape[dim])]


# ---------------------------------------------------------------------- indexing
def _positions(shape: tuple[int, ...], indices) -> np.ndarray:
    from ..ops.indexing import flat_positions
    return flat_positions(shape, indices)


@cuda_kernel("index")
def _index(x: CudaArray, indices) -> CudaArray:
    if indices.is_basic:
        return C.basic_index(x, indices)
    return C.gather(x, _positions(x.shape, indices))


@cuda_kernel("index_backward")
def _index_backward(g: CudaArray, sizes, indices) -> CudaArray:
    out = full(tuple(sizes), 0, g.dtype)
    C.scatter(out, _positions(out.shape, indices), g, add=True)
    return out


def _fit_values(values: CudaArray, target: tuple[int, ...]) -> CudaArray:
    """Drop leading size-1 dimensions that NumPy's assignment would ignore."""
    while values.ndim > len(target) and values.shape[0] == 1:
        values = C.drop_dims(values, (0,))
    return values


@cuda_kernel("index_put")
def _index_put(x: CudaArray, indices, values: CudaArray, accumulate: bool) -> CudaArray:
    out = x.copy()
    vals = values.astype(x.dtype, copy=False)
    if not accumulate and indices.is_basic:
        region = C.basic_index(out, indices)
        copy_into(region, _fit_values(vals, region.shape))
        return out
    positions = _positions(x.shape, indices)
    C.scatter(out, positions, _fit_values(vals, positions.shape), add=bool(accumulate))
    return out


# ---------------------------------------------------------------------- row kernels
def _flat(v: CudaArray):
    """The device buffer of a C-contiguous array, exactly ``v.size`` long."""
    if v.offset == 0 and v.buf.size == v.size:
        return v.buf
    return v.buf[v.offset:v.offset + v.size]


def _rows(x: CudaArray, dims: tuple[int, ...]) -> tuple[CudaArray, int, int, tuple]:
    """``x`` with ``dims`` moved last, C-contiguous: (array, rows M, row length R, kept)."""
    kept = tuple(d for d in range(x.ndim) if d not in dims)
    v = x.permuted(kept + tuple(dims))
    if not v.is_contiguous():
        v = v.copy()
    return v, math.prod(x.shape[d] for d in kept), math.prod(x.shape[d] for d in dims), \
        tuple(x.shape[d] for d in kept)


def _launch(kernel, n: int, *args) -> None:
    if n:
        blocks, threads = grid_1d(n)
        kernel[blocks, threads](*args)


def _row_reduce(x: CudaArray, dim, keepdim: bool, op: str, run, out_dtype=None) -> CudaArray:
    """``run(flat, M, R, out)`` over the rows of ``dim``; the result in the kept shape."""
    dims = rk.normalize_dims(dim, x.ndim, op)
    dims = tuple(d for d in dims if d < x.ndim)
    v, M, R, kept = _rows(x, dims)
    out = empty(rk.keep_shape(x.shape, dims, keepdim, kept), out_dtype or x.dtype)
    if M:
        run(_flat(v), M, R, out.buf)
    return out


def _nonempty(x: CudaArray, dim, op: str) -> None:
    from ..ops.reduction import _nonempty as check
    check(x, rk.normalize_dims(dim, x.ndim, op), op)


def _extreme_values(x: CudaArray, dim, keepdim: bool, op: str, is_max: bool) -> CudaArray:
    return _extreme_dim(x, dim, keepdim, op, is_max)[0]


@cuda_kernel("max")
def _max(x: CudaArray) -> CudaArray:
    return _extreme_values(x, None, False, "max", True)


@cuda_kernel("min")
def _min(x: CudaArray) -> CudaArray:
    return _extreme_values(x, None, False, "min", False)


@cuda_kernel("amax")
def _amax(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _extreme_values(x, dim, keepdim, "amax", True)


@cuda_kernel("amin")
def _amin(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _extreme_values(x, dim, keepdim, "amin", False)


def _extreme_dim(x: CudaArray, dim, keepdim: bool, op: str, is_max: bool):
    """(values, first indices) of the largest (``is_max``) or smallest values over ``dim``."""
    _nonempty(x, dim, op)
    dims = rk.normalize_dims(dim, x.ndim, op)
    kept = tuple(x.shape[d] for d in range(x.ndim) if d not in dims)
    idx = empty(rk.keep_shape(x.shape, dims, keepdim, kept), np.int64)
    values = _row_reduce(x, dim, keepdim, op, lambda f, M, R, o: _launch(
        R_.extreme_rows, M, f, M, R, 1, o, idx.buf, is_max))
    return values, idx


@cuda_kernel("max_dim")
def _max_dim(x: CudaArray, dim: int, keepdim: bool):
    return _extreme_dim(x, dim, keepdim, "max", True)


@cuda_kernel("min_dim")
def _min_dim(x: CudaArray, dim: int, keepdim: bool):
    return _extreme_dim(x, dim, keepdim, "min", False)


def _arg_extreme(x: CudaArray, dim, keepdim: bool, op: str, is_max: bool) -> CudaArray:
    if dim is None:
        _nonempty(x, None, op)
        flat = x.reshape(-1)
        idx = _extreme_dim(flat, 0, False, op, is_max)[1]
        return idx.reshape((1,) * x.ndim if keepdim else ())
    return _extreme_dim(x, dim, keepdim, op, is_max)[1]


@cuda_kernel("argmax")
def _argmax(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _arg_extreme(x, dim, keepdim, "argmax", True)


@cuda_kernel("argmin")
def _argmin(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    return _arg_extreme(x, dim, keepdim, "argmin", False)


@cuda_kernel("prod")
def _prod(x: CudaArray, dim, keepdim: bool, dtype) -> CudaArray:
    out_dtype = dtype if dtype is not None else _sum_dtype(x.dtype)
    x = x.astype(out_dtype, copy=False)
    return _row_reduce(x, dim, keepdim, "prod", lambda f, M, R, o: _launch(
        R_.prod_rows, M, f, M, R, 1, o))


def _variance(x: CudaArray, dim, correction: float, keepdim: bool, op: str) -> CudaArray:
    dims = rk.normalize_dims(dim, x.ndim, op)
    if x.size == 0 or (x.ndim and any(x.shape[d] == 0 for d in dims)):
        kept = tuple(s for d, s in enumerate(x.shape) if d not in dims)
        return full(rk.keep_shape(x.shape, dims, keepdim, kept), math.nan, x.dtype)
    return _row_reduce(x, dims, keepdim, op, lambda f, M, R, o: _launch(
        R_.var_rows, M, f, M, R, 1, float(correction), o))


@cuda_kernel("var")
def _var(x: CudaArray, dim, correction: float, keepdim: bool) -> CudaArray:
    return _variance(x, dim, correction, keepdim, "var")


@cuda_kernel("std")
def _std(x: CudaArray, dim, correction: float, keepdim: bool) -> CudaArray:
    v = _variance(x, dim, correction, keepdim, "std")
    return cew.run_unary("sqrt", v, v.dtype)


@cuda_kernel("logsumexp")
def _logsumexp(x: CudaArray, dim, keepdim: bool) -> CudaArray:
    dims = rk.normalize_dims(dim, x.ndim, "logsumexp")
    if x.ndim and any(x.shape[d] == 0 for d in dims) or x.size == 0:
        kept = tuple(s for d, s in enumerate(x.shape) if d not in dims)
        return full(rk.keep_shape(x.shape, dims, keepdim, kept), -math.inf, x.dtype)
    return _row_reduce(x, dims, keepdim, "logsumexp", lambda f, M, R, o: _launch(
        R_.logsumexp_rows, M, f, M, R, 1, o))


@cuda_kernel("norm")
def _norm(x: CudaArray, p: float, dim, keepdim: bool, dtype) -> CudaArray:
    if dtype is not None:
        x = x.astype(dtype, copy=False)
    dims = rk.normalize_dims(dim, x.ndim, "norm")
    if math.isinf(p) and (x.size == 0 or any(x.shape[d] == 0 for d in dims)):
        raise IndexError(f"norm: the infinity norm of a zero-size reduction is undefined "
                         f"(shape {x.shape}, dims {dims})")
    return _row_reduce(x, dims, keepdim, "norm", lambda f, M, R, o: _launch(
        R_.norm_rows, M, f, M, R, 1, float(p), o))


def _along(x: CudaArray, dim: int, out_dtype, run) -> CudaArray:
    """``run(flat, M, R, out_flat)`` over the lines along ``dim``; the result in x's shape."""
    if x.ndim == 0:
        x1 = x.reshape(1)
        return _along(x1, 0, out_dtype, run).reshape(())
    v, M, R, kept = _rows(x, (dim,))
    out = empty(v.shape, out_dtype)
    if M and R:
        run(_flat(v), M, R, out.buf)
    order = tuple(d for d in range(x.ndim) if d != dim) + (dim,)
    back = tuple(int(i) for i in np.argsort(order))
    res = out.permuted(back)
    return res if res.is_contiguous() else res.copy()


def _scan(x: CudaArray, dim: int, dtype, kernel) -> CudaArray:
    out_dtype = dtype if dtype is not None else _sum_dtype(x.dtype)
    x = x.astype(out_dtype, copy=False)

    def run(f, M, R, o):
        acc = empty((M,), np.float64 if np.dtype(out_dtype).kind == "f" else np.int64)
        _launch(kernel, M, f, M, R, 1, acc.buf, o)

    return _along(x, dim, out_dtype, run)


@cuda_kernel("cumsum")
def _cumsum(x: CudaArray, dim: int, dtype) -> CudaArray:
    return _scan(x, dim, dtype, R_.cumsum_rows)


@cuda_kernel("cumprod")
def _cumprod(x: CudaArray, dim: int, dtype) -> CudaArray:
    return _scan(x, dim, dtype, R_.cumprod_rows)


# ---------------------------------------------------------------------- nn
def _softmax(x: CudaArray, dim: int, dtype, log: bool) -> CudaArray:
    if dtype is not None:
        x = x.astype(dtype, copy=False)
    return _along(x, dim, x.dtype, lambda f, M, R, o: _launch(
        R_.softmax_rows, M, f, M, R, 1, log, o))


@cuda_kernel("softmax")
def _softmax_k(x: CudaArray, dim: int, dtype) -> CudaArray:
    return _softmax(x, dim, dtype, False)


@cuda_kernel("log_softmax")
def _log_softmax_k(x: CudaArray, dim: int, dtype) -> CudaArray:
    return _softmax(x, dim, dtype, True)


def _class_layout(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) == 1:
        return 1, shape[0], 1
    return shape[0], shape[1], math.prod(shape[2:])


def _contiguous_flat(x: CudaArray, dtype=None):
    v = x.astype(dtype, copy=False) if dtype is not None else x
    if not v.is_contiguous():
        v = v.copy()
    return _flat(v)


def _class_weight(weight: CudaArray | None, C: int):
    if weight is None:
        return full((C,), 1.0, np.float64).buf
    return _contiguous_flat(weight, np.float64)


def _loss_from_samples(loss: CudaArray, wt: CudaArray, tshape, reduction: str, dtype):
    loss = loss.astype(dtype, copy=False)
    if reduction == "none":
        return loss.reshape(tshape)
    total = C.reduce(loss, (0,), (), K.SUM, np.float64)
    if reduction == "mean":
        denom = C.reduce(wt, (0,), (), K.SUM, np.float64)
        total = cew.run_binary("div", total, denom, np.dtype(np.float64))
    return total.astype(dtype, copy=False)


def _class_loss(kernel, x: CudaArray, target: CudaArray, weight, ignore_index: int,
                reduction: str, label_smoothing: float, dtype) -> CudaArray:
    A, Cn, B = _class_layout(x.shape)
    loss = empty((A * B,), np.float64)
    wt = empty((A * B,), np.float64)
    if A * B:
        _launch(kernel, A, _contiguous_flat(x), _contiguous_flat(target, np.int64),
                _class_weight(weight, Cn), A, Cn, B, int(ignore_index),
                float(label_smoothing), loss.buf, wt.buf)
    return _loss_from_samples(loss, wt, target.shape, reduction, dtype)


@cuda_kernel("cross_entropy")
def _cross_entropy(x, target, weight, ignore_index, reduction, label_smoothing):
    return _class_loss(R_.cross_entropy_rows, x, target, weight, ignore_index, reduction,
                       label_smoothing, x.dtype)


@cuda_kernel("nll_loss")
def _nll_loss(logp, target, weight, ignore_index, reduction, label_smoothing):
    return _class_loss(R_.nll_rows, logp, target, weight, ignore_index, reduction,
                       label_smoothing, logp.dtype)


@cuda_kernel("nll_loss_backward")
def _nll_loss_backward(g, target, weight, sizes, ignore_index, reduction, label_smoothing):
    sizes = tuple(sizes)
    A, Cn, B = _class_layout(sizes)
    t = _contiguous_flat(target, np.int64)
    w = _class_weight(weight, Cn)
    if reduction == "none":
        gs = _contiguous_flat(g, np.float64)
    else:
        scale = float(g.copy_to_host())
        if reduction == "mean":
            th = target.copy_to_host().reshape(-1).astype(np.int64)
            wh = np.ones(Cn) if weight is None else weight.copy_to_host().astype(np.float64)
            denom = wh[th[th != ignore_index]].sum()
            scale = scale / denom if denom else math.nan
        gs = full((A * B,), scale, np.float64).buf
    out = empty(sizes, g.dtype)
    _launch(R_.nll_backward_rows, A, gs, t, w, A, Cn, B, int(ignore_index),
            float(label_smoothing), out.buf)
    return out


@cuda_kernel("layer_norm")
def _layer_norm(x, normalized_shape, weight, bias, eps):
    D = math.prod(normalized_shape)
    M = x.size // D if D else 0
    out = empty(x.shape, x.dtype)
    dummy = full((1,), 0, x.dtype).buf
    w = dummy if weight is None else _contiguous_flat(weight, x.dtype)
    b = dummy if bias is None else _contiguous_flat(bias, x.dtype)
    _launch(R_.layer_norm_rows, M, _contiguous_flat(x), M, D, w, b, weight is not None,
            bias is not None, float(eps), out.buf)
    return out


def _pointwise_loss(a: CudaArray, b: CudaArray, reduction: str, squared: bool) -> CudaArray:
    d = cew.run_binary("sub", a, b, a.dtype)
    v = cew.run_binary("mul", d, d, a.dtype) if squared else cew.run_unary("abs", d, a.dtype)
    if reduction == "none":
        return v
    count = v.size
    if reduction == "mean" and count == 0:
        return full((), math.nan, a.dtype)
    return C.reduce(v, tuple(range(v.ndim)), (), K.SUM, a.dtype,
                    float(count) if reduction == "mean" else 1.0)


@cuda_kernel("mse_loss")
def _mse_loss(a, b, reduction):
    return _pointwise_loss(a, b, reduction, True)


@cuda_kernel("l1_loss")
def _l1_loss(a, b, reduction):
    return _pointwise_loss(a, b, reduction, False)


@cuda_kernel("linear")
def _linear(x, weight, bias):
    out = C.matmul_nd(x, weight.permuted((1, 0)))
    return out if bias is None else cew.run_binary("add", out, bias, out.dtype)


@cuda_kernel("masked_fill")
def _masked_fill(x, mask, value):
    return cew.run_ternary("where", mask.astype(np.bool_, copy=False),
                           value.astype(x.dtype, copy=False), x, x.dtype)


@cuda_kernel("scan")
def _scan_k(b: CudaArray, a: CudaArray, dim: int, reverse: bool) -> CudaArray:
    shape = cew.broadcast_shape("scan", b.shape, a.shape)
    dtype = np.result_type(b.dtype, a.dtype)
    b = b.astype(dtype, copy=False).broadcast_to(shape)
    a = a.astype(dtype, copy=False).broadcast_to(shape)
    if not shape:
        return b.copy()
    av = _rows(a, (dim,))[0]

    def run(f, M, R, o):
        acc = empty((M,), dtype)
        _launch(R_.scan_rows, M, f, _flat(av), M, R, 1, bool(reverse), acc.buf, o)

    return _along(b, dim, dtype, run)


@cuda_kernel("shift_along")
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


# ---------------------------------------------------------------------- along one dimension
@cuda_kernel("gather")
def _gather(x: CudaArray, dim: int, index: CudaArray) -> CudaArray:
    return C.gather_dim(x, dim, index.astype(np.int64, copy=False))


@cuda_kernel("gather_backward")
def _gather_backward(g: CudaArray, sizes, dim: int, index: CudaArray) -> CudaArray:
    out = full(tuple(sizes), 0, g.dtype)
    C.scatter_dim(out, dim, index.astype(np.int64, copy=False), g, True)
    return out


@cuda_kernel("scatter")
def _scatter(x: CudaArray, dim: int, index: CudaArray, src: CudaArray) -> CudaArray:
    out = x.copy()
    C.scatter_dim(out, dim, index.astype(np.int64, copy=False), src, False)
    return out


@cuda_kernel("scatter_add")
def _scatter_add(x: CudaArray, dim: int, index: CudaArray, src: CudaArray) -> CudaArray:
    out = x.copy()
    C.scatter_dim(out, dim, index.astype(np.int64, copy=False), src, True)
    return out


def _along_dim_index(index: CudaArray, shape: tuple[int, ...], dim: int) -> CudaArray:
    """A 1-D index as a view of ``shape``: it varies along ``dim`` only (stride 0 elsewhere)."""
    idx = index.astype(np.int64, copy=False).reshape(-1)
    strides = tuple(idx.strides[0] if d == dim else 0 for d in range(len(shape)))
    return idx.view_as(shape, strides, idx.offset, writeable=False)


def _selected_shape(shape: tuple[int, ...], dim: int, n: int) -> tuple[int, ...]:
    return shape[:dim] + (n,) + shape[dim + 1:] if shape else (n,)


@cuda_kernel("index_select")
def _index_select(x: CudaArray, dim: int, index: CudaArray) -> CudaArray:
    xs = x.reshape(1) if x.ndim == 0 else x
    shape = _selected_shape(xs.shape, dim, index.size)
    out = C.gather_dim(xs, dim, _along_dim_index(index, shape, dim))
    return out.reshape(_selected_shape(x.shape, dim, index.size)) if x.ndim else out


@cuda_kernel("index_select_backward")
def _index_select_backward(g: CudaArray, sizes, dim: int, index: CudaArray) -> CudaArray:
    sizes = tuple(sizes)
    out = full(sizes if sizes else (1,), 0, g.dtype)
    gs = g.reshape(_selected_shape(out.shape, dim, index.size))
    C.scatter_dim(out, dim, _along_dim_index(index, gs.shape, dim), gs, True)
    return out.reshape(sizes)


@cuda_kernel("take")
def _take(x: CudaArray, index: CudaArray) -> CudaArray:
    pos = _contiguous_flat(index, np.int64)
    return C.gather(x, pos, index.shape)


@cuda_kernel("take_backward")
def _take_backward(g: CudaArray, sizes, index: CudaArray) -> CudaArray:
    out = full(tuple(sizes), 0, g.dtype)
    C.scatter(out, _contiguous_flat(index, np.int64), g, True, index.shape)
    return out


@cuda_kernel("embedding")
def _embedding(indices: CudaArray, weight: CudaArray, padding_idx) -> CudaArray:
    rows = _index_select(weight, 0, indices.reshape(-1))
    return rows.reshape(indices.shape + weight.shape[1:])


@cuda_kernel("embedding_backward")
def _embedding_backward(g: CudaArray, indices: CudaArray, num_weights: int,
                        padding_idx) -> CudaArray:
    dim = g.shape[-1]
    out = full((num_weights, dim), 0, g.dtype)
    g2 = g.reshape(-1, dim)
    idx = _along_dim_index(indices, g2.shape, 0)
    C.scatter_dim(out, 0, idx, g2, True,
                  skip=-(2 ** 62) if padding_idx is None else int(padding_idx))
    return out


# ---------------------------------------------------------------------- more shape ops
@cuda_kernel("flip")
def _flip(x: CudaArray, dims) -> CudaArray:
    shape, strides, offset = x.shape, list(x.strides), x.offset
    for d in dims:
        if shape[d]:
            offset += (shape[d] - 1) * strides[d]
        strides[d] = -strides[d]
    return x.view_as(shape, tuple(strides), offset).copy()


def _roll_one(x: CudaArray, shift: int, dim: int) -> CudaArray:
    n = x.shape[dim]
    out = empty(x.shape, x.dtype)
    s = shift % n if n else 0
    if n == 0 or s == 0:
        copy_into(out, x)
        return out
    copy_into(C.narrow(out, dim, s, n - s), C.narrow(x, dim, 0, n - s))
    copy_into(C.narrow(out, dim, 0, s), C.narrow(x, dim, n - s, s))
    return out


@cuda_kernel("roll")
def _roll(x: CudaArray, shifts, dims) -> CudaArray:
    if dims is None:
        return _roll_one(x.reshape(-1), int(shifts[0]), 0).reshape(x.shape)
    out = x
    for s, d in zip(shifts, dims, strict=True):
        out = _roll_one(out, int(s), d)
    return out if out is not x else x.copy()


def _tri(x: CudaArray, diagonal: int, lower: bool) -> CudaArray:
    out = empty(x.shape, x.dtype)
    n = out.size
    if n:
        blocks, threads = grid_1d(n)
        K.triangle[blocks, threads](out.buf, n, x.shape, x.buf, x.offset, x.strides,
                                    int(diagonal), lower)
    return out


@cuda_kernel("tril")
def _tril(x: CudaArray, diagonal: int) -> CudaArray:
    return _tri(x, diagonal, True)


@cuda_kernel("triu")
def _triu(x: CudaArray, diagonal: int) -> CudaArray:
    return _tri(x, diagonal, False)


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


@cuda_kernel("diagonal")
def _diagonal(x: CudaArray, offset: int, dim1: int, dim2: int) -> CudaArray:
    return _diagonal_view(x, offset, dim1, dim2)


@cuda_kernel("diagonal_backward")
def _diagonal_backward(g: CudaArray, input_sizes, offset: int, dim1: int,
                       dim2: int) -> CudaArray:
    out = full(tuple(input_sizes), 0, g.dtype)
    copy_into(_diagonal_view(out, offset, dim1, dim2), g)
    return out


@cuda_kernel("diag")
def _diag(x: CudaArray, diagonal: int) -> CudaArray:
    if x.ndim == 2:
        return _diagonal_view(x, diagonal, 0, 1).copy()
    n = x.shape[0] + abs(diagonal)
    out = full((n, n), 0, x.dtype)
    copy_into(_diagonal_view(out, diagonal, 0, 1), x)
    return out


@cuda_kernel("trace")
def _trace(x: CudaArray) -> CudaArray:
    d = _diagonal_view(x, 0, 0, 1)
    return C.reduce(d, (0,), (), K.SUM, _sum_dtype(x.dtype))


@cuda_kernel("chunk")
def _chunk(x: CudaArray, chunks: int, dim: int) -> list[CudaArray]:
    n = x.shape[dim]
    if n == 0:
        return [x.view_as(x.shape, x.strides, x.offset)]
    step = -(-n // chunks)
    return _split(x, step, dim)


def _tile(x: CudaArray, reps) -> CudaArray:
    reps = tuple(int(r) for r in reps)
    x = x.reshape((1,) * (len(reps) - x.ndim) + x.shape)
    inter = tuple(v for r, s in zip(reps, x.shape, strict=True) for v in (r, s))
    view = x.view_as(inter, tuple(v for st in x.strides for v in (0, st)), x.offset)
    return view.copy().reshape(tuple(r * s for r, s in zip(reps, x.shape, strict=True)))


@cuda_kernel("repeat")
def _repeat(x: CudaArray, repeats) -> CudaArray:
    return _tile(x, repeats)


@cuda_kernel("tile")
def _tile_k(x: CudaArray, dims) -> CudaArray:
    return _tile(x, dims)


@cuda_kernel("pad")
def _pad(x: CudaArray, pad, mode: str, value) -> CudaArray:
    from ..ops.shape import _pad_pairs
    if mode != "constant":
        raise RuntimeError(f"pad: the kernel only pads in constant mode, got {mode!r}")
    shape = list(x.shape)
    src, dst = x, None
    regions = []
    for d, lo, hi in _pad_pairs(pad, x.ndim):
        n = x.shape[d]
        shape[d] = n + lo + hi
        s0, s1 = max(-lo, 0), n - max(-hi, 0)
        regions.append((d, s0, max(s1 - s0, 0), max(lo, 0)))
    out = full(tuple(shape), 0 if value is None else value, x.dtype)
    dst = out
    for d, s0, length, d0 in regions:
        src = C.narrow(src, d, s0, length)
        dst = C.narrow(dst, d, d0, length)
    copy_into(dst, src)
    return out


@cuda_kernel("one_hot")
def _one_hot(x: CudaArray, num_classes: int) -> CudaArray:
    out = full(x.shape + (int(num_classes),), 0, np.int64)
    idx = x.astype(np.int64, copy=False).reshape(x.shape + (1,))
    C.scatter_dim(out, out.ndim - 1, idx, full((), 1, np.int64), False)
    return out
