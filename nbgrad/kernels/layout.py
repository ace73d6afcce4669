"""Array layout helpers shared by the kernels."""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload


def c_contiguous(x: np.ndarray, dtype=None) -> np.ndarray:
    """``x`` (cast to ``dtype`` if given) as a C-contiguous array; copies only when needed.

    Unlike ``np.ascontiguousarray``, a 0-d array stays 0-d.
    """
    if dtype is not None and x.dtype != dtype:
        return np.array(x, dtype=dtype, order="C", copy=True)
    return x if x.flags.c_contiguous else np.array(x, order="C", copy=True)


#: (id of the kind, shapes, attrs) -> the static's constants (a static is a function of
#: attributes and shapes only, so the eager kernels compute each once)
_STATICS: dict = {}


def call_native(kind, arrays: tuple, attrs: dict):
    """Run an op's native (:class:`~nbgrad.ops.traits.Opaque`) as generated code does:
    the arrays C-contiguous (None stays None; read-only ones copied, which would compile
    a second signature), then ``kind.static(attrs, shapes)``."""
    shapes = tuple(None if a is None else a.shape for a in arrays)
    try:
        key = (id(kind), shapes, tuple((k, type(v), v.hex() if type(v) is float else v)
                                       for k, v in attrs.items()))  # -0.0 is not 0.0
        consts = _STATICS.get(key)
    except TypeError:  # an unhashable attribute
        key = consts = None
    if consts is None:
        consts = tuple(kind.static(attrs, shapes))
        if key is not None:
            if len(_STATICS) >= 4096:
                _STATICS.clear()
            _STATICS[key] = consts
    return kind.native(*(None if a is None else a if a.flags.c_contiguous and
                         a.flags.writeable else np.array(a, order="C", copy=True)
                         for a in arrays), *consts)


# ------------------------------------------------------------------ for natives
# Compile-time helpers of the ops' ``@njit`` natives (generated code calls those directly).
def as_dtype(x, dtype):
    """``x`` cast to ``dtype``; as it is when ``dtype`` is None."""


@overload(as_dtype)
def _as_dtype(x, dtype):
    if isinstance(dtype, types.NoneType):
        return lambda x, dtype: x
    return lambda x, dtype: x.astype(dtype)


def as_sum_dtype(x, dtype):
    """``x`` cast to ``dtype``, or when it is None to what sums of ``x`` are (int64 for
    integers and bools)."""


@overload(as_sum_dtype)
def _as_sum_dtype(x, dtype):
    if not isinstance(dtype, types.NoneType):
        return lambda x, dtype: x.astype(dtype)
    if isinstance(x.dtype, (types.Integer, types.Boolean)):
        return lambda x, dtype: x.astype(np.int64)
    return lambda x, dtype: x


def accumulator(out, n):
    """A length-``n`` accumulator for ``out``'s values: float64, or int64 for integers."""


@overload(accumulator)
def _accumulator(out, n):
    if isinstance(out.dtype, types.Float):
        return lambda out, n: np.empty(n, np.float64)
    return lambda out, n: np.empty(n, np.int64)


def ones_or(w, n, like):
    """``w`` flat as ``like``'s dtype, or ``n`` ones of it when ``w`` is None."""


@overload(ones_or)
def _ones_or(w, n, like):
    if isinstance(w, types.NoneType):
        return lambda w, n, like: np.ones(n, like.dtype)
    return lambda w, n, like: w.astype(like.dtype).reshape(-1)


def broadcast_flat(w, shape, like):
    """``w`` broadcast to ``shape`` as a flat C-contiguous array of ``like``'s dtype; ones
    when ``w`` is None."""


@overload(broadcast_flat)
def _broadcast_flat(w, shape, like):
    if isinstance(w, types.NoneType):
        return lambda w, shape, like: np.ones(like.size, like.dtype)
    return lambda w, shape, like: np.ascontiguousarray(
        np.broadcast_to(w.astype(like.dtype), shape)).reshape(-1)


@njit(cache=True, nogil=True)
def check_index(index, low, high, prefix, suffix):
    """IndexError ``prefix + bad + suffix`` unless every entry of ``index`` lies in
    ``[low, high)`` (``bad``: the smallest entry if too small, else the largest)."""
    if index.size:
        lo, hi = index.min(), index.max()
        if lo < low or hi >= high:
            raise IndexError(prefix + str(lo if lo < low else hi) + suffix)
