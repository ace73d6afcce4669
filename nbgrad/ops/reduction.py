"""Reductions, scans and sorting.

``sum, mean, prod, max, min, amax, amin, argmax, argmin, var, std, logsumexp, norm``
reduce over ``dim`` (an int, a tuple or None for all; ``axis=`` is an alias);
``cumsum, cumprod`` scan along one dimension; ``sort, topk`` order it. The backward
helpers ``sum_to``, ``sum_backward``, ``scan`` and ``shift_along`` have table entries
of their own, so every gradient here is again differentiable.

The kernels reduce the middle axis of an (A, R, B) view of the input (see
:mod:`nbgrad.kernels.reduction`).
"""

from __future__ import annotations

import builtins
import math
from typing import NamedTuple

import numpy as np

from .. import dtypes
from ..kernels import reduction as rk
from ..kernels.layout import c_contiguous, call_native
from ..tensor import Tensor
from .convert import to_dtype
from .dispatch import apply, as_tensor, promote_operands
from .elementwise import maximum, minimum
from .registry import formula_helper, get, kernel, op_function
from .shape import reshape
from .traits import Broadcast, NativePlan, Opaque, Reduction, batching

__all__ = [
    "amax", "amin", "argmax", "argmin", "cumprod", "cumsum", "logsumexp", "max", "mean",
    "min", "norm", "prod", "sort", "std", "sum", "sum_backward", "sum_to", "topk", "var",
]


_SUM = get("sum")
_MEAN = get("mean")
_SUM_TO = get("sum_to")
_SUM_BACKWARD = get("sum_backward")


class ValuesIndices(NamedTuple):
    """What ``max(x, dim)``, ``min(x, dim)``, ``sort`` and ``topk`` return (as torch)."""

    values: Tensor
    indices: Tensor


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
    dims = tuple(dim)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))
               for d in dims):  # int(1.5) would silently reduce over dim 1
        raise TypeError(f"dim must be an int or a tuple of ints, got {dim!r}")
    return dims


def _one_dim(dim, ndim: int, op: str) -> int:
    """``dim`` as a non-negative int (0-d tensors accept 0 and -1)."""
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{op}: dim must be an int, got {dim!r}")
    return rk.normalize_dims(int(dim), ndim, op)[0]


def _floating(t: Tensor, op: str) -> None:
    if t.dtype.kind != "f":
        raise TypeError(f"{op}: needs a floating tensor, got {t.dtype}")


def _nonempty_shape(shape: tuple[int, ...], dims: tuple[int, ...], op: str) -> None:
    if shape and builtins.any(shape[d] == 0 for d in dims):
        raise IndexError(f"{op}: cannot reduce over a zero-size dimension of a tensor of "
                         f"shape {shape} (dims {dims})")
    if math.prod(shape) == 0 and not dims:
        raise IndexError(f"{op}: cannot reduce an empty tensor of shape {shape}")


def _sum_dtype(dtype: np.dtype) -> np.dtype:
    return dtypes.int64 if dtype.kind in "biu" else dtype


def reduce_sum(x: np.ndarray, dim, keepdim: bool, op: str = "sum") -> np.ndarray:
    if dim is None and not keepdim and x.dtype.kind == "f" and x.flags.c_contiguous:
        out = np.empty(1, x.dtype)  # the whole array: arb_view's plan is A = B = 1
        rk.sum_arb(x.reshape(-1), 1, x.size, 1, out)
        return out.reshape(())
    dims = rk.normalize_dims(dim, x.ndim, op)
    flat, A, R, B, kept = rk.arb_view(x, dims)
    out_dtype = _sum_dtype(x.dtype)
    out = np.empty(A * B, out_dtype)
    if flat.dtype.kind in "biu":
        flat = flat.astype(np.int64)
    rk.sum_arb(flat, A, R, B, out)
    return out.reshape(rk.keep_shape(x.shape, dims, keepdim, kept))


# ------------------------------------------------------------------ metadata helpers
@formula_helper
def reduced_count(shape, dim) -> int:
    """How many elements each output of a reduction over ``dim`` combines."""
    dims = rk.normalize_dims(dim, len(shape), "mean")
    return int(np.prod([shape[d] for d in dims])) if shape else 1


@formula_helper
def var_denom(shape, dim, correction) -> float:
    """The divisor of a variance: the reduced count less ``correction`` (at least 0)."""
    return builtins.max(reduced_count(shape, dim) - float(correction), 0.0)


@formula_helper
def norm_kind(p) -> str:
    """Which gradient formula the p-norm uses: zero, one, two, inf or general."""
    p = float(p)
    if p == 0:
        return "zero"
    if p == 1:
        return "one"
    if p == 2:
        return "two"
    return "inf" if math.isinf(p) else "general"


# ------------------------------------------------------------------ sum, mean
def _sum_dims(attrs: dict, shape: tuple[int, ...]) -> tuple[int, ...]:
    return rk.normalize_dims(attrs["dim"], len(shape), "sum")


def _mean_dims(attrs: dict, shape: tuple[int, ...]) -> tuple[int, ...]:
    return rk.normalize_dims(attrs["dim"], len(shape), "mean")


def _sum_to_dims(attrs: dict, shape: tuple[int, ...]) -> tuple[int, ...]:
    size = tuple(attrs["size"])
    lead = len(shape) - len(size)
    return tuple(range(lead)) + tuple(lead + i for i, s in enumerate(size)
                                      if s == 1 and shape[lead + i] != 1)


def _sum_backward_unsqueeze(attrs: dict, out_ndim: int) -> tuple[int, ...] | None:
    if attrs["keepdim"] or not out_ndim:
        return None
    return rk.normalize_dims(attrs["dim"], out_ndim, "sum_backward")


@kernel("sum", kind=Reduction(_sum_dims))
def _sum_kernel(x, dim, keepdim, dtype):
    out = reduce_sum(x, dim, keepdim)
    return out if dtype is None else out.astype(dtype)


@op_function("sum")
def sum(self: Tensor, dim=None, keepdim: bool = False, dtype=None, *, axis=None) -> Tensor:  # noqa: A001
    """Sum over ``dim`` (int, tuple or None for all)."""
    self = as_tensor(self)
    dt = dtypes.as_dtype(dtype) if dtype is not None else None
    return apply(_SUM, (self, _norm_dim_attr(_dims_arg(dim, axis)), bool(keepdim), dt))


@kernel("mean", kind=Reduction(_mean_dims, mean=True))
def _mean_kernel(x, dim, keepdim):
    total = reduce_sum(x, dim, keepdim, "mean")
    count = reduced_count(x.shape, dim)
    with np.errstate(invalid="ignore", divide="ignore"):  # the mean of nothing is NaN, quietly
        return (total / count).astype(x.dtype, copy=False)


@op_function("mean")
def mean(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """Arithmetic mean over ``dim``."""
    self = as_tensor(self)
    if self.dtype.kind != "f":
        raise TypeError(f"mean: needs a floating tensor, got {self.dtype}")
    return apply(_MEAN, (self, _norm_dim_attr(_dims_arg(dim, axis)), bool(keepdim)))


@kernel("sum_to", kind=Reduction(_sum_to_dims))
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


@kernel("sum_backward", kind=Broadcast(_sum_backward_unsqueeze))
def _sum_backward_kernel(g, sizes, dim, keepdim):
    sizes = tuple(sizes)
    dims = rk.restored_dims(dim, sizes, keepdim, "sum_backward")
    if g.ndim == 0 and len(dims) == len(sizes) and dims:  # the whole input
        return np.full(sizes, g, g.dtype)
    g = np.expand_dims(g, dims) if dims else g
    return c_contiguous(np.broadcast_to(g, sizes))


@op_function("sum_backward")
def sum_backward(self: Tensor, sizes, dim=None, keepdim: bool = False) -> Tensor:
    """Broadcast the gradient of a reduction over ``dim`` back to shape ``sizes``."""
    return apply(_SUM_BACKWARD, (self, tuple(int(s) for s in sizes), dim, bool(keepdim)))


# ------------------------------------------------------------------ prod
_PROD = get("prod")


def _arb(shape: tuple, dims: tuple, keepdim: bool, outputs: int = 1) -> NativePlan:
    """The plan of a reduction native over ``dims`` of ``shape``: ``(shape, perm, A, R,
    B)`` (:func:`~nbgrad.kernels.reduction.arb_plan`), ``outputs`` results."""
    perm, A, R, B, out_shape = rk.arb_plan(shape, dims, keepdim)
    return NativePlan((tuple(shape), perm or (), A, R, B), (out_shape,) * outputs)


def _plan(op: str, nonempty: bool = False, outputs: int = 1):
    """The static of a reduction native: the plan of ``attrs["dim"]`` (all dims for an
    op without one); ``nonempty``: a zero-size reduction raises."""
    def static(attrs: dict, shapes: tuple) -> NativePlan:
        shape = shapes[0]
        dims = rk.normalize_dims(attrs.get("dim"), len(shape), op)
        if nonempty:
            _nonempty_shape(shape, dims, op)
        return _arb(shape, dims, attrs.get("keepdim", False), outputs)
    return static


def _with(static, *names: str, **constants):
    """``static``'s plan with the attributes ``names`` and ``constants`` appended."""
    def plan(attrs: dict, shapes: tuple) -> NativePlan:
        p = static(attrs, shapes)
        return NativePlan((*p.consts, *(attrs[n] for n in names), *constants.values()),
                          p.shapes)
    return plan


_PROD_KIND = Opaque(native=rk.prod_native, static=_with(_plan("prod"), "dtype"))


@kernel("prod", kind=_PROD_KIND, batch=batching("along"))
def _prod_kernel(x, dim, keepdim, dtype):
    return call_native(_PROD_KIND, (x,), {"dim": dim, "keepdim": keepdim, "dtype": dtype})


@op_function("prod")
def prod(self: Tensor, dim=None, keepdim: bool = False, dtype=None, *, axis=None) -> Tensor:
    """Product over ``dim`` (int, tuple or None). Its gradient is exact with zeros in the
    input (exclusive products, never a division by the input)."""
    self = as_tensor(self)
    dim = _norm_dim_attr(_dims_arg(dim, axis))
    dt = dtypes.as_dtype(dtype) if dtype is not None else None
    keepdim = bool(keepdim)
    if isinstance(dim, int):
        return apply(_PROD, (self, _one_dim(dim, self.ndim, "prod"), keepdim, dt))
    if dt is not None and self.dtype != dt:
        self = to_dtype(self, dt)
    dims = rk.normalize_dims(dim, self.ndim, "prod")
    kept = tuple(s for d, s in enumerate(self.shape) if d not in dims)
    if dim is None or len(dims) == self.ndim:
        out = apply(_PROD, (reshape(self, -1), 0, False, None))
    else:
        out = self
        for d in reversed(dims):  # one dimension at a time, each exact
            out = apply(_PROD, (out, d, True, None))
    shape = rk.keep_shape(self.shape, dims, keepdim, kept)
    if out.shape != shape:
        out = reshape(out, shape)
    return out


# ------------------------------------------------------------------ max, min, amax, amin
def _extreme_kind(native, op: str, is_max: bool) -> Opaque:
    outputs = 2 if native is rk.extreme_dim_native else 1
    return Opaque(native=native,
                  static=_with(_plan(op, nonempty=True, outputs=outputs), is_max=is_max))


_EXTREMES = {name: _extreme_kind(native, op, is_max) for name, native, op, is_max in [
    ("max", rk.extreme_values_native, "max", True),
    ("min", rk.extreme_values_native, "min", False),
    ("amax", rk.extreme_values_native, "amax", True),
    ("amin", rk.extreme_values_native, "amin", False),
    ("max_dim", rk.extreme_dim_native, "max", True),
    ("min_dim", rk.extreme_dim_native, "min", False)]}


@kernel("max", kind=_EXTREMES["max"], batch=batching("reduce_all", "max"))
def _max_kernel(x):
    return call_native(_EXTREMES["max"], (x,), {})


@kernel("min", kind=_EXTREMES["min"], batch=batching("reduce_all", "min"))
def _min_kernel(x):
    return call_native(_EXTREMES["min"], (x,), {})


@kernel("amax", kind=_EXTREMES["amax"], batch=batching("along"))
def _amax_kernel(x, dim, keepdim):
    return call_native(_EXTREMES["amax"], (x,), {"dim": dim, "keepdim": keepdim})


@kernel("amin", kind=_EXTREMES["amin"], batch=batching("along"))
def _amin_kernel(x, dim, keepdim):
    return call_native(_EXTREMES["amin"], (x,), {"dim": dim, "keepdim": keepdim})


@kernel("max_dim", kind=_EXTREMES["max_dim"], batch=batching("along"))
def _max_dim_kernel(x, dim, keepdim):
    return call_native(_EXTREMES["max_dim"], (x,), {"dim": dim, "keepdim": keepdim})


@kernel("min_dim", kind=_EXTREMES["min_dim"], batch=batching("along"))
def _min_dim_kernel(x, dim, keepdim):
    return call_native(_EXTREMES["min_dim"], (x,), {"dim": dim, "keepdim": keepdim})


@op_function("max_dim")
def max_dim(self: Tensor, dim: int, keepdim: bool = False) -> ValuesIndices:
    """The largest value along ``dim`` and the index of its first occurrence."""
    self = as_tensor(self)
    return ValuesIndices(*apply(get("max_dim"),
                                (self, _one_dim(dim, self.ndim, "max"), bool(keepdim))))


@op_function("min_dim")
def min_dim(self: Tensor, dim: int, keepdim: bool = False) -> ValuesIndices:
    """The smallest value along ``dim`` and the index of its first occurrence."""
    self = as_tensor(self)
    return ValuesIndices(*apply(get("min_dim"),
                                (self, _one_dim(dim, self.ndim, "min"), bool(keepdim))))


def _max_or_min(name: str, self, dim, keepdim, axis, other) -> Tensor | ValuesIndices:
    self = as_tensor(self)
    dim = _dims_arg(dim, axis)
    if isinstance(dim, Tensor) or other is not None:
        if other is not None and dim is not None:
            raise TypeError(f"{name}: give dim or other, not both")
        return (maximum if name == "max" else minimum)(self, dim if other is None else other)
    if dim is None:
        if keepdim:
            raise TypeError(f"{name}: keepdim needs dim; use amax/amin to keep dimensions")
        return apply(get(name), (self,))
    return (max_dim if name == "max" else min_dim)(self, dim, keepdim)


@op_function("max")
def max(self: Tensor, dim=None, keepdim: bool = False, *, axis=None,  # noqa: A001
        other: Tensor | None = None) -> Tensor | ValuesIndices:
    """``max(x)``: the largest value (its gradient split evenly among ties);
    ``max(x, dim, keepdim=False)``: ``(values, indices)`` along ``dim`` (the gradient
    goes to the returned index); ``max(x, other)``: :func:`maximum`."""
    return _max_or_min("max", self, dim, keepdim, axis, other)


@op_function("min")
def min(self: Tensor, dim=None, keepdim: bool = False, *, axis=None,  # noqa: A001
        other: Tensor | None = None) -> Tensor | ValuesIndices:
    """``min(x)``, ``min(x, dim, keepdim=False) -> (values, indices)`` or ``min(x, other)``
    (:func:`minimum`); see :func:`max`."""
    return _max_or_min("min", self, dim, keepdim, axis, other)


@op_function("amax")
def amax(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """The largest values over ``dim`` (int, tuple or None); ties share the gradient."""
    self = as_tensor(self)
    return apply(get("amax"), (self, _norm_dim_attr(_dims_arg(dim, axis)), bool(keepdim)))


@op_function("amin")
def amin(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """The smallest values over ``dim`` (int, tuple or None); ties share the gradient."""
    self = as_tensor(self)
    return apply(get("amin"), (self, _norm_dim_attr(_dims_arg(dim, axis)), bool(keepdim)))


# ------------------------------------------------------------------ argmax, argmin
def _arg_kind(op: str, is_max: bool) -> Opaque:
    return Opaque(native=rk.arg_extreme_native,
                  static=_with(_plan(op, nonempty=True), is_max=is_max))


_ARGMAX, _ARGMIN = _arg_kind("argmax", True), _arg_kind("argmin", False)


@kernel("argmax", kind=_ARGMAX, batch=batching("along"))
def _argmax_kernel(x, dim, keepdim):
    return call_native(_ARGMAX, (x,), {"dim": dim, "keepdim": keepdim})


@kernel("argmin", kind=_ARGMIN, batch=batching("along"))
def _argmin_kernel(x, dim, keepdim):
    return call_native(_ARGMIN, (x,), {"dim": dim, "keepdim": keepdim})


@op_function("argmax")
def argmax(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """Index of the first largest value along ``dim`` (of the flattened tensor if None)."""
    self = as_tensor(self)
    dim = _dims_arg(dim, axis)
    dim = None if dim is None else _one_dim(dim, self.ndim, "argmax")
    return apply(get("argmax"), (self, dim, bool(keepdim)))


@op_function("argmin")
def argmin(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """Index of the first smallest value along ``dim`` (of the flattened tensor if None)."""
    self = as_tensor(self)
    dim = _dims_arg(dim, axis)
    dim = None if dim is None else _one_dim(dim, self.ndim, "argmin")
    return apply(get("argmin"), (self, dim, bool(keepdim)))


# ------------------------------------------------------------------ var, std
def _variance_kind(op: str, root: bool) -> Opaque:
    plan = _plan(op)
    return Opaque(native=rk.variance_native, static=lambda attrs, shapes: NativePlan(
        (*plan(attrs, shapes).consts, float(attrs["correction"]), root),
        plan(attrs, shapes).shapes))


_VAR, _STD = _variance_kind("var", False), _variance_kind("std", True)


@kernel("var", kind=_VAR, batch=batching("along"))
def _var_kernel(x, dim, correction, keepdim):
    return call_native(_VAR, (x,), {"dim": dim, "correction": correction, "keepdim": keepdim})


@kernel("std", kind=_STD, batch=batching("along"))
def _std_kernel(x, dim, correction, keepdim):
    return call_native(_STD, (x,), {"dim": dim, "correction": correction, "keepdim": keepdim})


def _var_args(op: str, self, dim, correction, keepdim, unbiased, axis):
    self = as_tensor(self)
    _floating(self, op)
    if isinstance(dim, (bool, np.bool_)):  # torch's var(x, unbiased)
        dim, unbiased = None, bool(dim)
    if unbiased is not None:
        correction = 1 if unbiased else 0
    if correction is None:  # torch's spelling of the default
        correction = 1
    if isinstance(correction, (bool, np.bool_)):  # var(x, dim, unbiased, keepdim)
        correction = int(correction)
    return (self, _norm_dim_attr(_dims_arg(dim, axis)), float(correction), bool(keepdim))


@op_function("var")
def var(self: Tensor, dim=None, correction: float = 1, keepdim: bool = False, *,
        unbiased: bool | None = None, axis=None) -> Tensor:
    """Variance over ``dim`` with ``correction`` (1: unbiased, the default; 0: biased).
    ``unbiased=`` is torch's older spelling; a bool in third place means the same."""
    return apply(get("var"), _var_args("var", self, dim, correction, keepdim, unbiased, axis))


@op_function("std")
def std(self: Tensor, dim=None, correction: float = 1, keepdim: bool = False, *,
        unbiased: bool | None = None, axis=None) -> Tensor:
    """Standard deviation over ``dim``; arguments as :func:`var`. Its gradient is 0
    where the deviation is 0 (as torch)."""
    return apply(get("std"), _var_args("std", self, dim, correction, keepdim, unbiased, axis))


# ------------------------------------------------------------------ logsumexp, norm
_LOGSUMEXP = Opaque(native=rk.logsumexp_native, static=_plan("logsumexp"))


@kernel("logsumexp", kind=_LOGSUMEXP, batch=batching("along"))
def _logsumexp_kernel(x, dim, keepdim):
    return call_native(_LOGSUMEXP, (x,), {"dim": dim, "keepdim": keepdim})


@op_function("logsumexp")
def logsumexp(self: Tensor, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """``log(sum(exp(x)))`` over ``dim``, computed stably (the maximum is taken out)."""
    self = as_tensor(self)
    if self.dtype.kind != "f":
        self = to_dtype(self, dtypes.float64)
    return apply(get("logsumexp"), (self, _norm_dim_attr(_dims_arg(dim, axis)),
                                    bool(keepdim)))


def _norm_static(attrs: dict, shapes: tuple) -> tuple:
    shape, p = shapes[0], float(attrs["p"])
    dims = rk.normalize_dims(attrs["dim"], len(shape), "norm")
    if math.isinf(p) and (math.prod(shape) == 0 or builtins.any(shape[d] == 0 for d in dims
                                                                if d < len(shape))):
        raise IndexError(f"norm: the infinity norm of a zero-size reduction is undefined "
                         f"(shape {shape}, dims {dims})")
    plan = _arb(shape, dims, attrs["keepdim"])
    return NativePlan((*plan.consts, p, attrs["dtype"]), plan.shapes)


_NORM = Opaque(native=rk.norm_native, static=_norm_static)


@kernel("norm", kind=_NORM, batch=batching("along"))
def _norm_kernel(x, p, dim, keepdim, dtype):
    return call_native(_NORM, (x,), {"p": p, "dim": dim, "keepdim": keepdim, "dtype": dtype})


@op_function("norm")
def norm(self: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None, *,
         axis=None) -> Tensor:
    """The vector p-norm over ``dim``: ``p`` is a number (2 by default, also 1, 0,
    ``inf``, ``-inf``) or ``'fro'`` (the 2-norm of the entries). At 0 the gradient of
    the 2-norm is 0, as torch."""
    self = as_tensor(self)
    if p is None or p == "fro":
        p = 2.0
    elif isinstance(p, str):
        raise ValueError(f"norm: p={p!r} is not supported; give a number or 'fro'")
    dt = dtypes.as_dtype(dtype) if dtype is not None else None
    if (dt or self.dtype).kind != "f":
        raise TypeError(f"norm: needs a floating tensor or dtype, got {self.dtype}")
    return apply(get("norm"), (self, float(p), _norm_dim_attr(_dims_arg(dim, axis)),
                               bool(keepdim), dt))


# ------------------------------------------------------------------ scans
def _along(attrs: dict, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(A, R, B) of a C-contiguous array of ``shape`` around dimension ``attrs["dim"]``."""
    return rk.arb_plan(shape, (attrs["dim"],) if shape else ())[1:4]


def _cumulative_kind(product: bool) -> Opaque:
    return Opaque(native=rk.cumulative_native, static=lambda attrs, shapes: NativePlan(
        (*_along(attrs, shapes[0]), attrs["dtype"], product), (shapes[0],)))


_CUMSUM, _CUMPROD = _cumulative_kind(False), _cumulative_kind(True)


@kernel("cumsum", kind=_CUMSUM, batch=batching("along"))
def _cumsum_kernel(x, dim, dtype):
    return call_native(_CUMSUM, (x,), {"dim": dim, "dtype": dtype})


@kernel("cumprod", kind=_CUMPROD, batch=batching("along"))
def _cumprod_kernel(x, dim, dtype):
    return call_native(_CUMPROD, (x,), {"dim": dim, "dtype": dtype})


def _scan_dim(op: str, self, dim, axis) -> tuple[Tensor, int]:
    self = as_tensor(self)
    dim = _dims_arg(dim, axis)
    if dim is None:
        raise TypeError(f"{op}: dim is required")
    return self, _one_dim(dim, self.ndim, op)


@op_function("cumsum")
def cumsum(self: Tensor, dim: int | None = None, *, dtype=None, axis=None) -> Tensor:
    """Running sums along ``dim``."""
    self, dim = _scan_dim("cumsum", self, dim, axis)
    return apply(get("cumsum"), (self, dim, dtypes.as_dtype(dtype) if dtype else None))


@op_function("cumprod")
def cumprod(self: Tensor, dim: int | None = None, *, dtype=None, axis=None) -> Tensor:
    """Running products along ``dim``; the gradient is exact with zeros in the input."""
    self, dim = _scan_dim("cumprod", self, dim, axis)
    return apply(get("cumprod"), (self, dim, dtypes.as_dtype(dtype) if dtype else None))


def _scan_static(attrs: dict, shapes: tuple) -> NativePlan:
    shape = np.broadcast_shapes(*shapes)
    return NativePlan((*shapes, shape, *_along(attrs, shape), bool(attrs["reverse"])),
                      (shape,))


_SCAN = Opaque(native=rk.scan_native, static=_scan_static)


@kernel("scan", kind=_SCAN, batch=batching("along", together=True))
def _scan_kernel(b, a, dim, reverse):
    return call_native(_SCAN, (b, a), {"dim": dim, "reverse": reverse})


@op_function("scan")
def scan(self: Tensor, coef: Tensor, dim: int, reverse: bool = False) -> Tensor:
    """The linear recurrence ``h[k] = self[k] + coef[k] * h[k-1]`` along ``dim``
    (reversed: ``h[k] = self[k] + coef[k+1] * h[k+1]``); a backward helper."""
    b, a = promote_operands(self, coef)
    try:
        shape = np.broadcast_shapes(b.shape, a.shape)
    except ValueError:
        raise RuntimeError(f"scan: shapes {b.shape} and {a.shape} cannot be broadcast "
                           "together") from None
    return apply(get("scan"), (b, a, _one_dim(dim, len(shape), "scan"), bool(reverse)))


_SHIFT = Opaque(native=rk.shift_native, static=lambda attrs, shapes: NativePlan(
    (*_along(attrs, shapes[0]), int(attrs["offset"]), float(attrs["fill"])), (shapes[0],)))


@kernel("shift_along", kind=_SHIFT, batch=batching("along"))
def _shift_along_kernel(x, dim, offset, fill):
    return call_native(_SHIFT, (x,), {"dim": dim, "offset": offset, "fill": fill})


@op_function("shift_along")
def shift_along(self: Tensor, dim: int, offset: int, fill: float = 0.0) -> Tensor:
    """``out[k] = self[k - offset]`` along ``dim``, ``fill`` where that is outside;
    a backward helper."""
    self = as_tensor(self)
    return apply(get("shift_along"),
                 (self, _one_dim(dim, self.ndim, "shift_along"), int(offset), float(fill)))


# ------------------------------------------------------------------ sort, topk
def _sorted_kind(op: str) -> Opaque:
    def static(attrs: dict, shapes: tuple) -> NativePlan:
        shape, dim = tuple(shapes[0]), attrs["dim"]
        A, R, B = _along(attrs, shape)
        k = R if op == "sort" or not shape else int(attrs["k"])
        out_shape = shape[:dim] + (k,) + shape[dim + 1:] if shape else ()
        return NativePlan((A, R, B, k, bool(attrs["descending" if op == "sort" else
                                                     "largest"])), (out_shape,) * 2)
    return Opaque(native=rk.sorted_native, static=static)


_SORT, _TOPK = _sorted_kind("sort"), _sorted_kind("topk")


@kernel("sort", kind=_SORT, batch=batching("along"))
def _sort_kernel(x, dim, descending, stable):
    return call_native(_SORT, (x,), {"dim": dim, "descending": descending})


@op_function("sort")
def sort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = False, *,
         axis=None) -> ValuesIndices:
    """``(values, indices)`` sorted along ``dim``. The sort is always stable; NaN counts
    as the largest value. The values' gradient goes back to where each value came from."""
    self = as_tensor(self)
    dim = _one_dim(_dims_arg(dim, axis), self.ndim, "sort")
    return ValuesIndices(*apply(get("sort"), (self, dim, bool(descending), bool(stable))))


@kernel("topk", kind=_TOPK, batch=batching("along"))
def _topk_kernel(x, k, dim, largest, sorted):  # noqa: A002 - torch's name
    return call_native(_TOPK, (x,), {"k": k, "dim": dim, "largest": largest})


@op_function("topk")
def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True,
         sorted: bool = True, *, axis=None) -> ValuesIndices:  # noqa: A002 - torch's name
    """The ``k`` largest (or smallest) values along ``dim`` and their indices, always in
    sorted order; ties keep their original order, NaN counts as the largest value."""
    self = as_tensor(self)
    dim = _one_dim(_dims_arg(dim, axis), self.ndim, "topk")
    n = self.shape[dim] if self.ndim else 1
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"topk: k must be an int, got {k!r}")
    if not 0 <= k <= n:
        raise RuntimeError(f"topk: k={k} is out of range for dim {dim} of size {n} "
                           f"(shape {self.shape})")
    return ValuesIndices(*apply(get("topk"), (self, int(k), dim, bool(largest), bool(sorted))))
