"""NumPy interop (NEP 13 ``__array_ufunc__``, NEP 18 ``__array_function__``).

A NumPy ufunc or function applied to a :class:`~nbgrad.Tensor` runs the nbgrad op that
computes it, so existing NumPy code differentiates unchanged, eagerly and under
``nbgrad.jit`` (which records the op like any other). :data:`UFUNCS`,
:data:`UFUNC_METHODS` and :data:`FUNCTIONS` are the one place that says which NumPy
callable is which nbgrad op.

NumPy callables that nbgrad does not cover (or arguments it does not take, such as
``out=`` or ``where=``) would compute on the values and silently drop the gradient.
They raise a ``TypeError`` naming the function (and the nbgrad alternative, if any)
when a tensor argument requires grad (with grad mode on) or while ``nbgrad.jit``
traces; otherwise they run NumPy on the values and return what NumPy returns.
``np.asarray(t)`` stays the explicit way to take the values out.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.special as sp

from . import dtypes, linalg, ops, special
from .grad_mode import STATE
from .ops.dispatch import as_tensor
from .tensor import STATE_TRACE, Tensor

__all__ = ["ALTERNATIVES", "FUNCTIONS", "UFUNCS", "UFUNC_METHODS", "array_function",
           "array_ufunc"]

_NOVALUE = np._NoValue


class Unsupported(Exception):
    """An argument the nbgrad implementation does not take (the message names it)."""


# ------------------------------------------------------------------ ufuncs
#: NumPy ufunc -> the nbgrad function computing ``ufunc(*inputs)``
UFUNCS: dict[np.ufunc, Callable] = {
    np.add: ops.add, np.subtract: ops.sub, np.multiply: ops.mul, np.divide: ops.div,
    np.power: ops.pow, np.negative: ops.neg, np.positive: ops.clone,
    np.absolute: ops.abs, np.sign: ops.sign, np.square: ops.square,
    np.sqrt: ops.sqrt, np.reciprocal: ops.reciprocal,
    np.exp: ops.exp, np.expm1: ops.expm1, np.log: ops.log, np.log1p: ops.log1p,
    np.log2: ops.log2, np.log10: ops.log10,
    np.sin: ops.sin, np.cos: ops.cos, np.tan: ops.tan, np.arcsin: ops.asin,
    np.arccos: ops.acos, np.arctan: ops.atan, np.arctan2: ops.atan2, np.hypot: ops.hypot,
    np.sinh: ops.sinh, np.cosh: ops.cosh, np.tanh: ops.tanh, np.arcsinh: ops.asinh,
    np.arccosh: ops.acosh, np.arctanh: ops.atanh,
    np.floor: ops.floor, np.ceil: ops.ceil, np.trunc: ops.trunc, np.rint: ops.round,
    np.maximum: ops.maximum, np.minimum: ops.minimum,
    np.floor_divide: ops.floor_divide, np.remainder: ops.remainder, np.fmod: ops.fmod,
    np.equal: ops.eq, np.not_equal: ops.ne, np.less: ops.lt, np.less_equal: ops.le,
    np.greater: ops.gt, np.greater_equal: ops.ge,
    np.logical_and: ops.logical_and, np.logical_or: ops.logical_or,
    np.logical_xor: ops.logical_xor, np.logical_not: ops.logical_not,
    np.matmul: ops.matmul, np.isnan: ops.isnan, np.isfinite: ops.isfinite,
    np.isinf: ops.isinf,
    np.logaddexp: ops.logaddexp, np.logaddexp2: ops.logaddexp2, np.exp2: ops.exp2,
    np.fmax: ops.fmax, np.fmin: ops.fmin, np.heaviside: ops.heaviside,
    np.float_power: ops.float_power, np.copysign: ops.copysign,
}


def _scipy_ufuncs() -> dict:
    """SciPy's special functions that are ufuncs nbgrad has ops for."""
    return {sp.erf: ops.erf, sp.erfc: ops.erfc, sp.gammaln: ops.lgamma,
            sp.psi: ops.digamma, sp.expit: ops.sigmoid, sp.logit: ops.logit,
            sp.xlogy: ops.xlogy, sp.xlog1py: ops.xlog1py, sp.exp2: ops.exp2,
            sp.erfinv: ops.erfinv, sp.erfcx: ops.erfcx, sp.ndtr: special.ndtr,
            sp.ndtri: ops.ndtri, sp.log_ndtr: ops.log_ndtr, sp.i0: ops.i0,
            sp.i0e: ops.i0e, sp.i1: ops.i1, sp.i1e: ops.i1e, sp.entr: special.entr,
            sp.betaln: special.betaln}


UFUNCS.update(_scipy_ufuncs())


def _reduction(fn: Callable) -> Callable:
    """``ufunc.reduce(a, axis=0, dtype=None, out=None, keepdims=False)`` as ``fn``."""
    def reduce(a, axis=0, dtype=None, out=None, keepdims=False, initial=_NOVALUE,
               where=_NOVALUE):
        _plain(out=out, initial=initial, where=where)
        kw = {} if dtype is None else {"dtype": dtype}
        return fn(_t(a), axis=axis, keepdim=bool(keepdims), **kw)
    return reduce


def _scan(fn: Callable) -> Callable:
    """``ufunc.accumulate(a, axis=0, dtype=None, out=None)`` as ``fn``."""
    def accumulate(array, axis=0, dtype=None, out=None):
        _plain(out=out)
        kw = {} if dtype is None else {"dtype": dtype}
        return fn(_t(array), axis=axis, **kw)
    return accumulate


#: (ufunc, method) -> nbgrad function, for ufunc methods other than ``__call__``
UFUNC_METHODS: dict[tuple[np.ufunc, str], Callable] = {
    (np.add, "reduce"): _reduction(ops.sum),
    (np.multiply, "reduce"): _reduction(ops.prod),
    (np.maximum, "reduce"): _reduction(ops.amax),
    (np.minimum, "reduce"): _reduction(ops.amin),
    (np.add, "accumulate"): _scan(ops.cumsum),
    (np.multiply, "accumulate"): _scan(ops.cumprod),
}


def _ufunc_outer(fn: Callable) -> Callable:
    """``ufunc.outer(a, b)``: ``fn`` of every pair, shape ``a.shape + b.shape``."""
    def outer(a, b):
        a, b = _t(a), _t(b)
        return fn(ops.reshape(a, a.shape + (1,) * b.ndim), b)
    return outer


# ------------------------------------------------------------------ functions
#: NumPy function -> an nbgrad implementation taking NumPy's arguments
FUNCTIONS: dict[Callable, Callable] = {}

#: hints for NumPy callables nbgrad does not implement (named in the TypeError)
ALTERNATIVES: dict[str, str] = {
    "numpy.fabs": "nbgrad.abs",
    "numpy.repeat": "nbgrad.index with repeated indices",
    "numpy.add.at": "Tensor.index_put_(..., accumulate=True) or nbgrad.scatter_add",
    "numpy.linalg.eigh": "nbgrad.linalg.eigh",
    "numpy.linalg.svd": "nbgrad.linalg.svd (full_matrices=True, as NumPy's default)",
    "numpy.linalg.pinv": "nbgrad.linalg.pinv",
    "numpy.tensordot": "nbgrad.tensordot", "numpy.inner": "nbgrad.inner",
    "numpy.vdot": "nbgrad.dot on flattened tensors",
    "numpy.isclose": "nbgrad.abs(a - b) <= atol + rtol * nbgrad.abs(b)",
    "numpy.allclose": "np.allclose(np.asarray(t.detach()), ...)",
}


def implements(*numpy_functions: Callable) -> Callable:
    """Register the decorated function as nbgrad's version of ``numpy_functions``."""
    def register(fn: Callable) -> Callable:
        for f in numpy_functions:
            FUNCTIONS[f] = fn
        return fn
    return register


def _plain(out=None, **given) -> None:
    """Raise :class:`Unsupported` for ``out=`` or any other given NumPy-only keyword."""
    if out is not None and not (isinstance(out, tuple) and all(o is None for o in out)):
        raise Unsupported("out=")
    for key, value in given.items():
        if value is not _NOVALUE and value is not None:
            raise Unsupported(f"{key}=")


def _t(a) -> Tensor:
    return a if isinstance(a, Tensor) else as_tensor(a)


def _floating(a) -> Tensor:
    """NumPy's statistics of integer arrays are float64."""
    t = _t(a)
    return t if dtypes.is_floating(t.dtype) else ops.to_dtype(t, dtypes.float64)


def _keep(keepdims) -> bool:
    return False if keepdims is _NOVALUE else bool(keepdims)


def _norm_axis(axis: int, ndim: int) -> int:
    return operator.index(axis) % ndim if ndim else 0


@implements(np.sum)
def _sum(a, axis=None, dtype=None, out=None, keepdims=_NOVALUE, initial=_NOVALUE,
         where=_NOVALUE):
    _plain(out=out, initial=initial, where=where)
    return ops.sum(_t(a), axis=axis, keepdim=_keep(keepdims), dtype=dtype)


@implements(np.prod)
def _prod(a, axis=None, dtype=None, out=None, keepdims=_NOVALUE, initial=_NOVALUE,
          where=_NOVALUE):
    _plain(out=out, initial=initial, where=where)
    return ops.prod(_t(a), axis=axis, keepdim=_keep(keepdims), dtype=dtype)


@implements(np.mean)
def _mean(a, axis=None, dtype=None, out=None, keepdims=_NOVALUE, *, where=_NOVALUE):
    _plain(out=out, where=where)
    t = _floating(a) if dtype is None else ops.to_dtype(_t(a), dtype)
    return ops.mean(t, axis=axis, keepdim=_keep(keepdims))


def _moment(fn: Callable) -> Callable:
    def moment(a, axis=None, dtype=None, out=None, ddof=0, keepdims=_NOVALUE, *,
               where=_NOVALUE, mean=_NOVALUE, correction=_NOVALUE):
        _plain(out=out, where=where, mean=mean)
        if correction is not _NOVALUE:
            if ddof != 0:
                raise ValueError("ddof and correction can't be provided simultaneously.")
            ddof = correction
        t = _floating(a) if dtype is None else ops.to_dtype(_t(a), dtype)
        return fn(t, axis=axis, correction=ddof, keepdim=_keep(keepdims))
    return moment


FUNCTIONS[np.std] = _moment(ops.std)
FUNCTIONS[np.var] = _moment(ops.var)


def _extremum(fn: Callable) -> Callable:
    def extremum(a, axis=None, out=None, keepdims=_NOVALUE, initial=_NOVALUE,
                 where=_NOVALUE):
        _plain(out=out, initial=initial, where=where)
        return fn(_t(a), axis=axis, keepdim=_keep(keepdims))
    return extremum


FUNCTIONS[np.max] = FUNCTIONS[np.amax] = _extremum(ops.amax)
FUNCTIONS[np.min] = FUNCTIONS[np.amin] = _extremum(ops.amin)


def _arg_extremum(fn: Callable) -> Callable:
    def arg_extremum(a, axis=None, out=None, *, keepdims=_NOVALUE):
        _plain(out=out)
        return fn(_t(a), axis=axis, keepdim=_keep(keepdims))
    return arg_extremum


FUNCTIONS[np.argmax] = _arg_extremum(ops.argmax)
FUNCTIONS[np.argmin] = _arg_extremum(ops.argmin)


@implements(np.dot)
def _dot(a, b, out=None):
    _plain(out=out)
    a, b = _t(a), _t(b)
    if a.ndim == 0 or b.ndim == 0:
        return ops.mul(a, b)
    if a.ndim > 2 or b.ndim > 2:
        raise Unsupported(f"N-d operands (shapes {a.shape} and {b.shape}; nbgrad.matmul "
                          "broadcasts batches instead)")
    return ops.matmul(a, b)


@implements(np.outer)
def _outer(a, b, out=None):
    _plain(out=out)
    return ops.outer(ops.reshape(_t(a), -1), ops.reshape(_t(b), -1))


@implements(np.einsum)
def _einsum(*operands, out=None, optimize=False, **kwargs):
    _plain(out=out, **kwargs)
    if not operands or not isinstance(operands[0], str):
        raise Unsupported("the interleaved (operand, sublist) form")
    return ops.einsum(operands[0], *[_t(o) for o in operands[1:]])


@implements(np.where)
def _where(condition, x=None, y=None):
    if x is None or y is None:
        raise Unsupported("the one-argument form (indices of nonzero elements)")
    return ops.where(_t(condition), x, y)


@implements(np.clip)
def _clip(a, a_min=_NOVALUE, a_max=_NOVALUE, out=None, *, min=_NOVALUE,  # noqa: A002
          max=_NOVALUE, **kwargs):  # noqa: A002
    _plain(out=out, **kwargs)
    lo = None if a_min is _NOVALUE else a_min
    hi = None if a_max is _NOVALUE else a_max
    lo = lo if min is _NOVALUE else min
    hi = hi if max is _NOVALUE else max
    t = _t(a)
    if all(v is None or isinstance(v, (int, float, np.number)) for v in (lo, hi)):
        return t if lo is None and hi is None else ops.clip(t, lo, hi)
    if lo is not None:
        t = ops.maximum(t, lo)
    return t if hi is None else ops.minimum(t, hi)


def _joined(fn: Callable) -> Callable:
    def join(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
        _plain(out=out)
        ts = [_t(a) for a in arrays]
        if axis is None:
            ts, axis = [ops.reshape(t, -1) for t in ts], 0
        if dtype is not None:
            ts = [ops.to_dtype(t, dtype) for t in ts]
        return fn(ts, axis=axis)
    return join


FUNCTIONS[np.concatenate] = _joined(ops.cat)
FUNCTIONS[np.stack] = _joined(ops.stack)


@implements(np.hstack)
def _hstack(tup, *, dtype=None, casting="same_kind"):
    out = ops.hstack([_t(a) for a in tup])
    return out if dtype is None else ops.to_dtype(out, dtype)


@implements(np.vstack)
def _vstack(tup, *, dtype=None, casting="same_kind"):
    out = ops.vstack([_t(a) for a in tup])
    return out if dtype is None else ops.to_dtype(out, dtype)


@implements(np.reshape)
def _reshape(a, /, shape=None, order="C", *, copy=None):
    if order != "C":
        raise Unsupported(f"order={order!r}")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return ops.reshape(_t(a), shape)


@implements(np.ravel)
def _ravel(a, order="C"):
    if order != "C":
        raise Unsupported(f"order={order!r}")
    return ops.reshape(_t(a), -1)


@implements(np.transpose)
def _transpose(a, axes=None):
    t = _t(a)
    axes = tuple(range(t.ndim - 1, -1, -1)) if axes is None else tuple(axes)
    return ops.permute(t, axes)


@implements(np.moveaxis)
def _moveaxis(a, source, destination):
    return ops.movedim(_t(a), source, destination)


@implements(np.swapaxes)
def _swapaxes(a, axis1, axis2):
    return ops.swapaxes(_t(a), axis1, axis2)


@implements(np.squeeze)
def _squeeze(a, axis=None):
    t = _t(a)
    if axis is None:
        return ops.squeeze(t)
    axes = tuple(_norm_axis(x, t.ndim) for x in np.atleast_1d(axis))
    for x in axes:
        if t.shape[x] != 1:
            raise ValueError("cannot select an axis to squeeze out which has size not "
                             "equal to one")
    return ops.squeeze(t, dim=axes)


@implements(np.expand_dims)
def _expand_dims(a, axis):
    t = _t(a)
    ndim = t.ndim + len(np.atleast_1d(axis))
    for x in sorted(_norm_axis(x, ndim) for x in np.atleast_1d(axis)):
        t = ops.unsqueeze(t, x)
    return t


@implements(np.broadcast_to)
def _broadcast_to(array, shape, subok=False):
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return ops.broadcast_to(_t(array), shape)


def _scan_function(fn: Callable) -> Callable:
    def scan(a, axis=None, dtype=None, out=None):
        _plain(out=out)
        t = _t(a)
        if axis is None:
            t, axis = ops.reshape(t, -1), 0
        kw = {} if dtype is None else {"dtype": dtype}
        return fn(t, axis=axis, **kw)
    return scan


FUNCTIONS[np.cumsum] = _scan_function(ops.cumsum)
FUNCTIONS[np.isposinf] = lambda x, out=None: ops.isposinf(_t(x)) if out is None else \
    _plain(out=out)
FUNCTIONS[np.isneginf] = lambda x, out=None: ops.isneginf(_t(x)) if out is None else \
    _plain(out=out)
FUNCTIONS[np.cumprod] = _scan_function(ops.cumprod)


def _sorted(a, axis, kind, order):
    if order is not None:
        raise Unsupported("order=")
    t = _t(a)
    if axis is None:
        t, axis = ops.reshape(t, -1), -1
    return ops.sort(t, axis, stable=kind == "stable")


@implements(np.sort)
def _sort(a, axis=-1, kind=None, order=None, *, stable=None):
    return _sorted(a, axis, "stable" if stable else kind, order).values


@implements(np.argsort)
def _argsort(a, axis=-1, kind=None, order=None, *, stable=None):
    return _sorted(a, axis, "stable" if stable else kind, order).indices


@implements(np.i0)
def _i0(x):
    return ops.i0(_t(x))


@implements(np.trace)
def _trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    _plain(out=out, dtype=dtype)
    return ops.sum(ops.diagonal(_t(a), offset, axis1, axis2), axis=-1)


@implements(np.diagonal)
def _diagonal(a, offset=0, axis1=0, axis2=1):
    return ops.diagonal(_t(a), offset, axis1, axis2)


@implements(np.diag)
def _diag(v, k=0):
    return ops.diag(_t(v), k)


@implements(np.tril)
def _tril(m, k=0):
    return ops.tril(_t(m), k)


@implements(np.triu)
def _triu(m, k=0):
    return ops.triu(_t(m), k)


@implements(np.flip)
def _flip(m, axis=None):
    t = _t(m)
    axes = tuple(range(t.ndim)) if axis is None else tuple(np.atleast_1d(axis))
    return ops.flip(t, *axes)


@implements(np.roll)
def _roll(a, shift, axis=None):
    return ops.roll(_t(a), shift, axis)


@implements(np.tile)
def _tile(A, reps):  # noqa: N803 - NumPy's name
    reps = (reps,) if isinstance(reps, (int, np.integer)) else tuple(reps)
    return ops.tile(_t(A), *reps)


@implements(np.take)
def _take(a, indices, axis=None, out=None, mode="raise"):
    _plain(out=out)
    if mode != "raise":
        raise Unsupported(f"mode={mode!r}")
    t, idx = _t(a), _t(indices)
    if axis is None:
        return ops.take(t, idx)
    return t[(slice(None),) * _norm_axis(axis, t.ndim) + (idx,)]


@implements(np.split)
def _split(ary, indices_or_sections, axis=0):
    t = _t(ary)
    n = t.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        if n % indices_or_sections:
            raise ValueError("array split does not result in an equal division")
        return list(ops.split(t, n // int(indices_or_sections), axis))
    edges = [min(max(int(i) if i >= 0 else n + int(i), 0), n) for i in indices_or_sections]
    lead = (slice(None),) * _norm_axis(axis, t.ndim)
    return [t[lead + (slice(lo, max(hi, lo)),)]
            for lo, hi in zip([0, *edges], [*edges, n], strict=True)]


@implements(np.diff)
def _diff(a, n=1, axis=-1, prepend=_NOVALUE, append=_NOVALUE):
    return ops.diff(_t(a), n, axis, None if prepend is _NOVALUE else prepend,
                    None if append is _NOVALUE else append)


@implements(np.round, np.around)
def _round(a, decimals=0, out=None):
    _plain(out=out)
    return ops.round(_t(a), decimals)


@implements(np.copy)
def _copy(a, order="K", subok=False):
    return ops.clone(_t(a))


def _like(fn: Callable) -> Callable:
    def like(a, dtype=None, order="K", subok=True, shape=None, *, device=None):
        if shape is not None:
            raise Unsupported("shape=")
        return fn(_t(a), dtype=dtype)
    return like


FUNCTIONS[np.zeros_like] = _like(ops.zeros_like)
FUNCTIONS[np.ones_like] = _like(ops.ones_like)


@implements(np.shape)
def _shape(a):
    return _t(a).shape


@implements(np.ndim)
def _ndim(a):
    return _t(a).ndim


@implements(np.size)
def _size(a, axis=None):
    t = _t(a)
    return t.size if axis is None else t.shape[axis]


@implements(np.result_type)
def _result_type(*arrays_and_dtypes):
    return np.result_type(*[a.dtype if isinstance(a, Tensor) else a
                            for a in arrays_and_dtypes])


@implements(np.linalg.solve)
def _solve(a, b):
    a, b = _t(a), _t(b)
    if b.ndim >= 2 and b.shape == a.shape[:-1]:
        raise Unsupported(f"b of shape {b.shape} (NumPy reads it as a stack of matrices, "
                          "nbgrad.linalg.solve as a stack of vectors: add the last axis)")
    return linalg.solve(a, b)


FUNCTIONS[np.linalg.inv] = lambda a: linalg.inv(_t(a))
FUNCTIONS[np.linalg.det] = lambda a: linalg.det(_t(a))
FUNCTIONS[np.linalg.slogdet] = lambda a: linalg.slogdet(_t(a))
FUNCTIONS[np.linalg.matmul] = lambda x1, x2, /: ops.matmul(x1, x2)


@implements(np.linalg.cholesky)
def _cholesky(a, /, *, upper=False):
    return linalg.cholesky(_t(a), upper=upper)


@implements(np.linalg.norm)
def _norm(x, ord=None, axis=None, keepdims=False):  # noqa: A002
    t = _floating(x)
    if axis is None and t.ndim == 2 and ord is not None or \
            isinstance(axis, tuple) and len(axis) == 2:
        if ord not in (None, "fro"):
            raise Unsupported(f"the matrix norm ord={ord!r}")
        return ops.norm(t, 2.0, dim=axis, keepdim=keepdims)
    if isinstance(ord, str):
        raise ValueError(f"Invalid norm order '{ord}' for vectors")
    if axis is None and ord is not None and t.ndim != 1:
        raise ValueError("Improper number of dimensions to norm.")
    return ops.norm(t, 2.0 if ord is None else float(ord), dim=axis, keepdim=keepdims)


# ------------------------------------------------------------------ the protocols
def _ufunc_name(ufunc: np.ufunc, method: str) -> str:
    base = f"numpy.{ufunc.__name__}" if getattr(np, ufunc.__name__, None) is ufunc \
        else f"ufunc {ufunc.__name__!r}"
    return base if method == "__call__" else f"{base}.{method}"


def _function_name(func: Callable) -> str:
    return f"{getattr(func, '__module__', None) or 'numpy'}.{func.__name__}"


def _tensors(value: Any, found: list, depth: int = 0) -> list:
    """Every tensor in ``value`` (looking into lists, tuples and dicts)."""
    if isinstance(value, Tensor):
        found.append(value)
    elif depth < 4 and isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, found, depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for v in value.values():
            _tensors(v, found, depth + 1)
    return found


def _values(value: Any, depth: int = 0) -> Any:
    """``value`` with every tensor replaced by a read-only view of its values (a NumPy
    function writing into it would bypass the tensor's version counter)."""
    if isinstance(value, Tensor):
        arr = np.asarray(value).view()
        arr.flags.writeable = False
        return arr
    if depth < 4 and isinstance(value, (list, tuple)):
        return type(value)(_values(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return {k: _values(v, depth + 1) for k, v in value.items()}
    return value


def _fallback(name: str, reason: str, numpy_call: Callable, args: tuple, kwargs: dict,
              alternative: str | None) -> Any:
    """Run NumPy on the values, unless that would silently drop a gradient or a trace."""
    tensors = _tensors((args, kwargs), [])
    tracing = STATE_TRACE.tracer is not None
    if tracing or (STATE.grad_enabled and any(t._requires_grad for t in tensors)):
        where = "inside nbgrad.jit (the result would be a constant of the trace)" \
            if tracing else "on a tensor that requires grad (the gradient would be dropped)"
        hint = f"; nbgrad alternative: {alternative}" if alternative else ""
        raise TypeError(f"{name}{reason} is not supported by nbgrad {where}{hint}. To "
                        "compute on the values on purpose, convert explicitly: "
                        "np.asarray(t.detach())")
    try:
        return numpy_call(*_values(args), **_values(kwargs))
    except ValueError as exc:
        if "read-only" not in str(exc):
            raise
        raise TypeError(f"{name} would modify a nbgrad Tensor in place behind autograd's "
                        "back; use nbgrad's in-place ops or index assignment "
                        "(t[...] = value)") from None


def array_ufunc(ufunc: np.ufunc, method: str, inputs: tuple, kwargs: dict) -> Any:
    """``Tensor.__array_ufunc__``: run the nbgrad op of ``ufunc`` (NEP 13)."""
    name = _ufunc_name(ufunc, method)
    out = kwargs.get("out")
    if out is not None and any(isinstance(o, Tensor) for o in _tensors(out, [])):
        raise TypeError(f"{name}: out= cannot be a nbgrad Tensor (NumPy would write its "
                        "memory behind autograd's back); assign the result instead, e.g. "
                        "t[...] = result")
    if method == "at" and isinstance(inputs[0], Tensor):
        raise TypeError(f"{name} would modify a nbgrad Tensor behind autograd's back; "
                        f"nbgrad alternative: {ALTERNATIVES['numpy.add.at']}")
    if method == "__call__":
        impl = UFUNCS.get(ufunc)
    elif method == "outer" and ufunc.nin == 2 and ufunc in UFUNCS:
        impl = _ufunc_outer(UFUNCS[ufunc])
    else:
        impl = UFUNC_METHODS.get((ufunc, method))
    if impl is not None:
        try:
            if method == "__call__":
                _plain(**kwargs)
                return impl(*inputs)
            return impl(*inputs, **kwargs)
        except Unsupported as exc:
            return _fallback(name, f" with {exc}", getattr(ufunc, method), inputs, kwargs,
                             "the same call without it")
    return _fallback(name, " (no nbgrad op)", getattr(ufunc, method), inputs, kwargs,
                     ALTERNATIVES.get(name))


def array_function(func: Callable, types: tuple, args: tuple, kwargs: dict) -> Any:
    """``Tensor.__array_function__``: run nbgrad's version of ``func`` (NEP 18)."""
    if not all(issubclass(t, (Tensor, np.ndarray)) for t in types):
        return NotImplemented
    name = _function_name(func)
    impl = FUNCTIONS.get(func)
    if impl is not None:
        try:
            return impl(*args, **kwargs)
        except Unsupported as exc:
            return _fallback(name, f" with {exc}", func, args, kwargs,
                             "the same call without it")
    return _fallback(name, " (no nbgrad implementation)", func, args, kwargs,
                     ALTERNATIVES.get(name))
