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
    _nonempty(x, dim, op)
    return _row_reduce(x, dim, keepdim, op, lambda f, M, R, o: _launch(
        R_.extreme_values_rows, M, f, M, R, 1, is_max, o))


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
    _nonempty(x, dim, op)
    idx_holder = []

    def run(f, M, R, o):
        idx = idx_holder[0]
        _launch(R_.extreme_rows, M, f, M, R, 1, o, idx.buf, is_max)

    dims = rk.normalize_dims(dim, x.ndim, op)
    kept = tuple(x.shape[d] for d in range(x.ndim) if d not in dims)
    idx_holder.append(empty(rk.keep_shape(x.shape, dims, keepdim, kept), np.int64))
    values = _row_reduce(x, dim, keepdim, op, run)
    return values, idx_holder[0]


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
