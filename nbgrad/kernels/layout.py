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


#: (id of the kind, shapes, attrs) -> the static's plan (a static is a function of
#: attributes and shapes only, so the eager kernels compute each once)
_PLANS: dict = {}


def _plan(kind, shapes: tuple, attrs: dict):
    try:
        key = (id(kind), shapes, tuple((k, type(v), v.hex() if type(v) is float else v)
                                       for k, v in attrs.items()))  # -0.0 is not 0.0
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable attribute
        key = plan = None
    if plan is None:
        plan = kind.static(attrs, shapes)
        if key is not None:
            if len(_PLANS) >= 4096:
                _PLANS.clear()
            _PLANS[key] = plan
    return plan


def flat(a: np.ndarray) -> np.ndarray:
    """``a`` as a writable 1-D C-order array (a view when it can be; a read-only array
    is copied, as it would compile a second signature)."""
    if a.flags.c_contiguous and a.flags.writeable:
        return a.reshape(-1)
    return np.array(a, order="C", copy=True).reshape(-1)


def native_const(value):
    """A :class:`~nbgrad.ops.traits.NativePlan` constant as the native receives it."""
    return np.asarray(value, np.int64) if isinstance(value, tuple) else value


def call_native(kind, arrays: tuple, attrs: dict):
    """Run an op's native (:class:`~nbgrad.ops.traits.Opaque`) as generated code does,
    with the plan ``kind.static(attrs, shapes)`` (see
    :class:`~nbgrad.ops.traits.NativePlan`): the arrays flat, an absent one empty, the
    results reshaped to the plan's shapes."""
    shapes = tuple(None if a is None else a.shape for a in arrays)
    plan = _plan(kind, shapes, attrs)
    like = next(a for a in arrays if a is not None).dtype
    out = kind.native(*(np.empty(0, like) if a is None else flat(a) for a in arrays),
                      *(native_const(c) for c in plan.consts))
    if len(plan.shapes) == 1:
        return out.reshape(plan.shapes[0])
    return tuple(o.reshape(s) for o, s in zip(out, plan.shapes, strict=True))


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
    """``w`` flat as ``like``'s dtype, or ``n`` ones of it when ``w`` is empty (an absent
    optional tensor, see ``NativePlan``)."""


@overload(ones_or)
def _ones_or(w, n, like):
    def impl(w, n, like):
        if w.size == 0:
            return np.ones(n, like.dtype)
        return w.astype(like.dtype)
    return impl


@njit(cache=True, nogil=True)
def check_index(index, low, high, prefix, suffix):
    """IndexError ``prefix + bad + suffix`` unless every entry of ``index`` lies in
    ``[low, high)`` (``bad``: the smallest entry if too small, else the largest)."""
    if index.size:
        lo, hi = index.min(), index.max()
        if lo < low or hi >= high:
            raise IndexError(prefix + str(lo if lo < low else hi) + suffix)


# ------------------------------------------------------------------ rank-free layouts
# Natives take flat arrays and their shapes as int64 arrays (see NativePlan), so these
# move data by index arithmetic over any number of dimensions.
@njit(cache=True, nogil=True)
def c_strides(shape):
    """The C-order element strides of ``shape`` (an int64 array)."""
    st = np.empty(shape.size, np.int64)
    s = 1
    for d in range(shape.size - 1, -1, -1):
        st[d] = s
        s *= shape[d]
    return st


@njit(cache=True, nogil=True)
def strided_copy(x, shape, strides, out):
    """``out[i] = x[offset(i)]``: ``out`` in C order over ``shape``, reading ``x`` at
    the element ``strides`` (0 for a broadcast dimension)."""
    nd = shape.size
    if out.size == 0:
        return out
    if nd == 0:
        out[0] = x[0]
        return out
    idx = np.zeros(nd, np.int64)
    src = 0
    for i in range(out.size):
        out[i] = x[src]
        d = nd - 1
        while d >= 0:
            idx[d] += 1
            src += strides[d]
            if idx[d] < shape[d]:
                break
            src -= strides[d] * shape[d]
            idx[d] = 0
            d -= 1
    return out


@njit(cache=True, nogil=True)
def view3(x, shape3):
    """Flat ``x`` viewed as the 3-D ``shape3`` (an int64 array of three sizes)."""
    return x.reshape((shape3[0], shape3[1], shape3[2]))


@njit(cache=True, nogil=True)
def permuted(x, shape, perm):
    """Flat ``x`` of ``shape`` transposed by ``perm`` (flat; ``x`` itself when ``perm``
    is empty)."""
    if perm.size == 0:
        return x
    st = c_strides(shape)
    return strided_copy(x, shape[perm], st[perm], np.empty(x.size, x.dtype))


@njit(cache=True, nogil=True)
def broadcast(x, xshape, shape):
    """Flat ``x`` of ``xshape`` broadcast to ``shape`` (NumPy's rules; flat; ``x``
    itself when the shapes are equal)."""
    if xshape.size == shape.size and (xshape == shape).all():
        return x
    n = 1
    for d in range(shape.size):
        n *= shape[d]
    lead = shape.size - xshape.size
    xst = c_strides(xshape)
    st = np.zeros(shape.size, np.int64)
    for d in range(xshape.size):
        if xshape[d] != 1:
            st[lead + d] = xst[d]
    return strided_copy(x, shape, st, np.empty(n, x.dtype))


@njit(cache=True, nogil=True)
def broadcast_or_ones(w, w_shape, shape, like):
    """Flat ``w`` of ``w_shape`` broadcast to ``shape`` in ``like``'s dtype; ones when
    ``w`` is empty (absent)."""
    if w.size == 0:
        return np.ones(like.size, like.dtype)
    return broadcast(w.astype(like.dtype), w_shape, shape)
