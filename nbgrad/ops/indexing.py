"""Indexing: ``t[index]`` (basic and integer/bool-array), ``index_put``, ``gather``,
``scatter``, ``scatter_add``, ``index_select``, ``take``, ``masked_fill`` and their
backward ops.

An index is normalised once into a tuple of ints, slices, ``None``, ``Ellipsis`` and
int64/bool NumPy arrays (:class:`Index`). Gradients go through flat element
positions or scatter-adds, so repeated indices accumulate. Index tensors are checked
against the shapes before any kernel runs (``IndexError`` naming the op).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels import scatter as sk
from ..kernels.layout import c_contiguous, call_native
from ..tensor import Tensor
from .convert import to_dtype
from .dispatch import apply, as_tensor
from .dynamic import dynamic_index, is_dynamic
from .registry import get, kernel, op_function
from .shape import _dim as shape_dim
from .shape import broadcast_to, reshape
from .traits import IndexScatter, Move, NativePlan, Opaque, batching

__all__ = ["Index", "gather", "gather_backward", "index", "index_backward", "index_put",
           "index_select", "index_select_backward", "masked_fill", "normalize_index",
           "scatter", "scatter_add", "take", "take_backward"]


class Index(tuple):
    """A normalised index; hashable by identity of its arrays for the tracer."""

    __slots__ = ()

    @property
    def is_basic(self) -> bool:
        return not any(isinstance(i, np.ndarray) for i in self)

    def __repr__(self) -> str:
        parts = []
        for i in self:
            if isinstance(i, np.ndarray):
                parts.append(f"array{tuple(i.shape)}:{i.dtype}")
            elif i is Ellipsis:
                parts.append("...")
            else:
                parts.append(repr(i))
        return "[" + ", ".join(parts) + "]"


def normalize_index(index, shape: tuple[int, ...], op: str = "index") -> Index:
    items = index if isinstance(index, tuple) else (index,)
    out = []
    for item in items:
        if isinstance(item, Tensor):
            item = item.numpy()
        if isinstance(item, (list, np.ndarray)):
            arr = np.asarray(item)
            if arr.dtype == np.bool_:
                out.append(arr)
            elif arr.dtype.kind in "iu" or arr.size == 0:
                out.append(arr.astype(np.int64))
            else:
                raise IndexError(
                    f"{op}: tensors used as indices must be integer or bool, got {arr.dtype}"
                )
        elif isinstance(item, (bool, np.bool_)):
            out.append(np.asarray(item))
        elif isinstance(item, (int, np.integer)):
            out.append(int(item))
        elif isinstance(item, slice) or item is None or item is Ellipsis:
            out.append(item)
        else:
            raise IndexError(
                f"{op}: index of type {type(item).__name__} is not supported; use "
                "ints, slices, None, ..., or integer/bool arrays"
            )
    idx = Index(out)
    _check_bounds(idx, shape, op)
    return idx


def _check_bounds(idx: Index, shape: tuple[int, ...], op: str = "index") -> None:
    try:
        np.empty(shape, dtype=np.uint8)[idx]  # NumPy's own checks, on a tiny dummy
    except IndexError as exc:
        raise IndexError(
            f"{op}: index {idx!r} is out of range for a tensor of shape {shape}: {exc}"
        ) from None


def flat_positions(shape: tuple[int, ...], idx: Index) -> np.ndarray:
    """The flat element numbers ``idx`` selects in an array of ``shape`` (an array, also
    for an index of integers alone, which selects one element)."""
    return np.asarray(np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)[idx])


@kernel("index", view_of=0, kind=Move())
def _index_kernel(x, indices):
    out = x[indices]
    return out if isinstance(out, np.ndarray) else np.asarray(out)


@op_function("index")
def index(self: Tensor, indices) -> Tensor:
    """``self[indices]`` with NumPy's basic and advanced indexing; a traced integer or
    ``ds`` in a basic index reads a window (:mod:`nbgrad.ops.dynamic`)."""
    if not isinstance(indices, Index) and is_dynamic(indices):
        return dynamic_index(self, indices)
    idx = indices if isinstance(indices, Index) else normalize_index(indices, self.shape)
    return apply(get("index"), (self, idx))


@kernel("index_backward", kind=IndexScatter())
def _index_backward_kernel(g, sizes, indices):
    out = np.zeros(tuple(sizes), g.dtype)
    positions = flat_positions(out.shape, indices)
    values = c_contiguous(np.broadcast_to(g, positions.shape)).reshape(-1)
    sk.scatter_add_flat(out.reshape(-1), positions.reshape(-1), values)
    return out


@op_function("index_backward")
def index_backward(self: Tensor, sizes, indices) -> Tensor:
    """Scatter-add ``self`` into zeros of shape ``sizes`` at ``indices``."""
    return apply(get("index_backward"), (self, tuple(sizes), indices))


@kernel("index_put", kind=IndexScatter(put=True))
def _index_put_kernel(x, indices, values, accumulate):
    out = x.copy()
    if accumulate:
        positions = flat_positions(x.shape, indices)
        vals = c_contiguous(np.broadcast_to(values, positions.shape), x.dtype)
        sk.scatter_add_flat(out.reshape(-1), positions.reshape(-1), vals.reshape(-1))
    else:
        out[indices] = values
    return out


@op_function("index_put")
def index_put(self: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """A copy of ``self`` with ``values`` written (or added, repeats summing) at ``indices``."""
    idx = indices if isinstance(indices, Index) else normalize_index(indices, self.shape,
                                                                     "index_put")
    vals = as_tensor(values, dtype=self.dtype) if not isinstance(values, Tensor) else values
    if vals.dtype != self.dtype:
        vals = to_dtype(vals, self.dtype)
    target = np.empty(self.shape, np.uint8)[idx].shape
    try:
        np.broadcast_shapes(vals.shape, target)
        if len(vals.shape) > len(target) and any(
            s != 1 for s in vals.shape[: -len(target) or None]
        ):
            raise ValueError
    except ValueError:
        raise RuntimeError(
            f"index_put: values of shape {vals.shape} cannot be written to the "
            f"indexed region of shape {target}"
        ) from None
    return apply(get("index_put"), (self, idx, vals, bool(accumulate)))



# ------------------------------------------------------------------ along one dimension
def _dim(d, ndim: int, op: str) -> int:
    return shape_dim(d, ndim, op)


def _index_tensor(index, op: str) -> Tensor:
    t = index if isinstance(index, Tensor) else as_tensor(np.asarray(index))
    if t.dtype.kind not in "iu":
        raise TypeError(f"{op}: index must be an integer tensor, got dtype {t.dtype}")
    return t


def _as3(shape: tuple[int, ...], dim: int) -> tuple[int, int, int]:
    """(before, along, after) sizes of ``shape`` around ``dim`` (0-d counts as (1,))."""
    if not shape:
        return 1, 1, 1
    return (int(np.prod(shape[:dim], dtype=np.int64)), shape[dim],
            int(np.prod(shape[dim + 1:], dtype=np.int64)))


def _range_message(op: str, what: str, shape: tuple, index_shape: tuple) -> tuple[str, str]:
    """The halves of the IndexError message around the bad index (the natives check
    every index: under ``nbgrad.jit`` they run on values the public function never saw)."""
    return (f"{op}: index ", f" is out of range for {what} (self {tuple(shape)}, index "
            f"{tuple(index_shape)})")


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= s
    return tuple(reversed(strides))


def _along_plan(op: str, shape: tuple, dim: int, index_shape: tuple) -> tuple:
    """The constants of the gather and scatter natives (:mod:`nbgrad.kernels.scatter`)
    up to ``accumulate``, and the two halves of the range message."""
    shape, index_shape = tuple(shape), tuple(index_shape)
    n = shape[dim] if shape else 1
    full = _region(index_shape, shape, dim) is None
    plan = (dim, n, full, _as3(shape, dim), _as3(index_shape, dim), index_shape or (1,),
            _c_strides(shape) or (1,))
    return plan, _range_message(op, f"dim {dim} of size {n}", shape, index_shape)


def _region(index_shape, shape, dim: int) -> tuple | None:
    """The block of ``shape`` that an index of ``index_shape`` along ``dim`` touches, or
    None when that is the whole array."""
    if all(k == dim or i == s for k, (i, s) in enumerate(zip(index_shape, shape,
                                                             strict=True))):
        return None
    return tuple(slice(None) if k == dim else slice(0, i) for k, i in enumerate(index_shape))


def _check_along(op: str, self: Tensor, dim, index: Tensor, src: Tensor | None = None
                 ) -> int:
    d = _dim(dim, self.ndim, op)
    shapes = f"(self {tuple(self.shape)}, index {tuple(index.shape)})"
    if index.ndim != self.ndim:
        raise RuntimeError(f"{op}: index must have as many dimensions as self {shapes}")
    for k in range(self.ndim):
        if k != d and index.shape[k] > self.shape[k]:
            raise RuntimeError(f"{op}: index is larger than self in dim {k} {shapes}")
    if src is not None and src.ndim:
        if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape,
                                                               strict=True)):
            raise RuntimeError(f"{op}: index of shape {tuple(index.shape)} does not fit "
                               f"src of shape {tuple(src.shape)}")
    n = self.shape[d] if self.ndim else 1
    idx = index._data
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx.min() if idx.min() < 0 else idx.max()
        raise IndexError(f"{op}: index {int(bad)} is out of range for dim {d} of size {n} "
                         f"{shapes}")
    return d


def _gather_static(attrs: dict, shapes: tuple) -> NativePlan:
    plan, where = _along_plan("gather", shapes[0], attrs["dim"], shapes[1])
    return NativePlan((*plan, *where), (tuple(shapes[1]),))


_GATHER = Opaque(native=sk.gather_native, static=_gather_static)


@kernel("gather", kind=_GATHER, batch=batching("along", together=True))
def _gather_kernel(x, dim, index):
    return call_native(_GATHER, (x, index), {"dim": dim})


@op_function("gather")
def gather(self: Tensor, dim: int, index: Tensor, *, axis=None) -> Tensor:
    """``out[i][j][k] = self[index[i][j][k]][j][k]`` for ``dim=0`` (torch's ``gather``);
    the output has the index's shape."""
    index = _index_tensor(index, "gather")
    if self.ndim + index.ndim == 1:  # torch reads a 0-d self or index as 1-d here

        flat = gather(reshape(self, (-1,)), dim if axis is None else axis, reshape(index, (-1,)))
        return reshape(flat, tuple(index.shape))
    d = _check_along("gather", self, dim if axis is None else axis, index)
    return apply(get("gather"), (self, d, index))


def _gather_backward_static(attrs: dict, shapes: tuple) -> NativePlan:
    sizes = tuple(attrs["sizes"])
    plan, where = _along_plan("gather_backward", sizes, attrs["dim"], shapes[1])
    return NativePlan((math.prod(sizes), *plan, *where), (sizes,))


_GATHER_BACKWARD = Opaque(native=sk.gather_backward_native, static=_gather_backward_static)


@kernel("gather_backward", kind=_GATHER_BACKWARD,
        batch=batching("along", sizes="sizes", together=True))
def _gather_backward_kernel(g, sizes, dim, index):
    return call_native(_GATHER_BACKWARD, (g, index), {"sizes": sizes, "dim": dim})


@op_function("gather_backward")
def gather_backward(self: Tensor, sizes, dim: int, index: Tensor) -> Tensor:
    """Zeros of shape ``sizes`` with ``self`` scatter-added at ``index`` along ``dim`` (the
    backward of ``gather``; repeated indices add up)."""
    sizes = tuple(int(s) for s in sizes)
    return apply(get("gather_backward"), (self, sizes, int(dim) % max(len(sizes), 1), index))


def _number_or_array(op: str, name: str, value) -> None:
    """Refuse a ``value`` that NumPy would turn into NaN (None) or fail on (a string)."""
    if value is None or isinstance(value, str):
        raise TypeError(f"{op}: {name} must be a tensor or a number, not "
                        f"{type(value).__name__}")


def _scatter_args(op: str, self: Tensor, dim, index, src) -> tuple:
    index = _index_tensor(index, op)
    if not isinstance(src, Tensor):
        _number_or_array(op, "src", src)
        src = as_tensor(np.asarray(src, dtype=self.dtype))
    elif src.dtype != self.dtype:
        src = to_dtype(src, self.dtype)
    d = _check_along(op, self, dim, index, src)
    if src.ndim and src.shape != index.shape:
        src = src[tuple(slice(0, i) for i in index.shape)]
    return d, index, src


def _scatter_kind(op: str, accumulate: bool) -> Opaque:
    def static(attrs: dict, shapes: tuple) -> NativePlan:
        plan, where = _along_plan(op, shapes[0], attrs["dim"], shapes[1])
        return NativePlan((*plan, accumulate, *where), (tuple(shapes[0]),))
    return Opaque(native=sk.scatter_native, static=static)


_SCATTER, _SCATTER_ADD = _scatter_kind("scatter", False), _scatter_kind("scatter_add", True)


@kernel("scatter", kind=_SCATTER, batch=batching("scatter"))
def _scatter_kernel(x, dim, index, src):
    return call_native(_SCATTER, (x, index, src), {"dim": dim})


@op_function("scatter")
def scatter(self: Tensor, dim: int, index: Tensor, src=None, *, value=None,
            axis=None) -> Tensor:
    """A copy of ``self`` with ``self[index[i][j]][j] = src[i][j]`` for ``dim=0`` (torch's
    ``scatter``); ``src`` may be a tensor or a number (also as ``value=``). With repeated
    indices the last write wins, and only its ``src`` entry should get a gradient (as in
    PyTorch, the gradient assumes unique indices)."""
    if (src is None) == (value is None):
        raise TypeError("scatter: give exactly one of src and value")
    d, index, src = _scatter_args("scatter", self, dim if axis is None else axis, index,
                                  src if value is None else value)
    return apply(get("scatter"), (self, d, index, src))


@kernel("scatter_add", kind=_SCATTER_ADD, batch=batching("scatter"))
def _scatter_add_kernel(x, dim, index, src):
    return call_native(_SCATTER_ADD, (x, index, src), {"dim": dim})


@op_function("scatter_add")
def scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor, *, axis=None) -> Tensor:
    """A copy of ``self`` with ``src`` added at ``index`` along ``dim`` (repeats add up)."""
    d, index, src = _scatter_args("scatter_add", self, dim if axis is None else axis, index,
                                  src)
    return apply(get("scatter_add"), (self, d, index, src))


# ------------------------------------------------------------------ index_select, take
def _check_vector_index(op: str, self: Tensor, dim, index) -> tuple[int, Tensor]:
    index = _index_tensor(index, op)
    if index.ndim > 1:
        raise RuntimeError(f"{op}: index must be 0-D or 1-D, got shape {tuple(index.shape)}")
    d = _dim(dim, self.ndim, op)
    n = self.shape[d] if self.ndim else 1
    idx = index._data
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx.min() if idx.min() < 0 else idx.max()
        raise IndexError(f"{op}: index {int(bad)} is out of range for dim {d} of size {n} "
                         f"(self {tuple(self.shape)}, index {tuple(index.shape)})")
    return d, index


def _selected_shape(shape, dim: int, m: int) -> tuple[int, ...]:
    return tuple(shape[:dim]) + (m,) + tuple(shape[dim + 1:]) if shape else (m,) * 0


def _select_plan(op: str, shape: tuple, dim: int, index_shape: tuple) -> tuple:
    x3, m = _as3(tuple(shape), dim), int(np.prod(index_shape, dtype=np.int64))
    return x3, _range_message(op, f"dim {dim} of size {x3[1]}", shape, (m,))


def _index_select_static(attrs: dict, shapes: tuple) -> NativePlan:
    x3, where = _select_plan("index_select", shapes[0], attrs["dim"], shapes[1])
    m = int(np.prod(shapes[1], dtype=np.int64))
    return NativePlan((x3, *where), (_selected_shape(tuple(shapes[0]), attrs["dim"], m),))


_INDEX_SELECT = Opaque(native=sk.index_select_native, static=_index_select_static)


@kernel("index_select", kind=_INDEX_SELECT, batch=batching("index_select"))
def _index_select_kernel(x, dim, index):
    return call_native(_INDEX_SELECT, (x, index), {"dim": dim})


@op_function("index_select")
def index_select(self: Tensor, dim: int, index: Tensor, *, axis=None) -> Tensor:
    """The entries at positions ``index`` (a 1-D integer tensor) along ``dim``."""
    d, index = _check_vector_index("index_select", self, dim if axis is None else axis, index)
    return apply(get("index_select"), (self, d, index))


def _index_select_backward_static(attrs: dict, shapes: tuple) -> NativePlan:
    sizes = tuple(attrs["sizes"])
    x3, where = _select_plan("index_select_backward", sizes, attrs["dim"], shapes[1])
    return NativePlan((x3, *where), (sizes,))


_INDEX_SELECT_BACKWARD = Opaque(native=sk.index_select_backward_native,
                                static=_index_select_backward_static)


@kernel("index_select_backward", kind=_INDEX_SELECT_BACKWARD,
        batch=batching("index_select_backward"))
def _index_select_backward_kernel(g, sizes, dim, index):
    return call_native(_INDEX_SELECT_BACKWARD, (g, index), {"sizes": sizes, "dim": dim})


@op_function("index_select_backward")
def index_select_backward(self: Tensor, sizes, dim: int, index: Tensor) -> Tensor:
    """Zeros of shape ``sizes`` with ``self`` added at positions ``index`` along ``dim``
    (the backward of ``index_select``; repeated indices add up)."""
    sizes = tuple(int(s) for s in sizes)
    return apply(get("index_select_backward"),
                 (self, sizes, int(dim) % max(len(sizes), 1), index))


def _take_message(op: str, shape: tuple, index_shape: tuple) -> tuple[str, str]:
    n = int(np.prod(shape, dtype=np.int64))
    return _range_message(op, f"a tensor of {n} elements", shape, index_shape)


_TAKE = Opaque(native=sk.take_native, static=lambda attrs, shapes: NativePlan(
    _take_message("take", shapes[0], shapes[1]), (tuple(shapes[1]),)))


@kernel("take", kind=_TAKE, batch=batching("take"))
def _take_kernel(x, index):
    return call_native(_TAKE, (x, index), {})


@op_function("take")
def take(self: Tensor, index: Tensor) -> Tensor:
    """The entries of the flattened tensor at ``index`` (negative positions count from
    the end); the output has the index's shape."""
    index = _index_tensor(index, "take")
    idx, n = index._data, self.size
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx.min() if idx.min() < -n else idx.max()
        raise IndexError(f"take: index {int(bad)} is out of range for a tensor of "
                         f"{n} elements (self {tuple(self.shape)}, index {tuple(index.shape)})")
    return apply(get("take"), (self, index))


_TAKE_BACKWARD = Opaque(native=sk.take_backward_native, static=lambda attrs, shapes: NativePlan(
    (math.prod(attrs["sizes"]), *_take_message("take_backward", tuple(attrs["sizes"]),
                                               shapes[1])), (tuple(attrs["sizes"]),)))


@kernel("take_backward", kind=_TAKE_BACKWARD, batch=batching("take_backward"))
def _take_backward_kernel(g, sizes, index):
    return call_native(_TAKE_BACKWARD, (g, index), {"sizes": sizes})


@op_function("take_backward")
def take_backward(self: Tensor, sizes, index: Tensor) -> Tensor:
    """Zeros of shape ``sizes`` with ``self`` added at the flat positions ``index`` (the
    backward of ``take``; repeated positions add up)."""
    return apply(get("take_backward"), (self, tuple(int(s) for s in sizes), index))


# ------------------------------------------------------------------ masked_fill
_MASKED_FILL = Opaque(native=sk.masked_fill_native, static=lambda attrs, shapes: NativePlan(
    (tuple(shapes[1]), tuple(shapes[0])), (tuple(shapes[0]),)))


@kernel("masked_fill", kind=_MASKED_FILL, batch=batching("masked_fill"))
def _masked_fill_kernel(x, mask, value):
    return call_native(_MASKED_FILL, (x, mask, value), {})


@op_function("masked_fill")
def masked_fill(self: Tensor, mask: Tensor, value) -> Tensor:
    """A copy of ``self`` with ``value`` (a number or a 0-d tensor) where ``mask`` (a bool
    tensor) is true; ``self`` and ``mask`` broadcast together (as torch's out-of-place
    ``masked_fill``)."""
    mask = as_tensor(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"masked_fill: mask must be a bool tensor, got dtype {mask.dtype}")
    try:
        shape = np.broadcast_shapes(self.shape, mask.shape)
    except ValueError:
        raise RuntimeError(f"masked_fill: mask of shape {tuple(mask.shape)} and self of shape "
                           f"{tuple(self.shape)} do not broadcast together") from None
    if shape != self.shape:
        self = broadcast_to(self, shape)
    if isinstance(value, Tensor):
        if value.ndim:
            raise RuntimeError(f"masked_fill: value must be a number or a 0-d tensor, got "
                               f"shape {tuple(value.shape)}")
        if value.dtype != self.dtype:
            value = to_dtype(value, self.dtype)
    else:
        _number_or_array(op="masked_fill", name="value", value=value)
        value = as_tensor(np.asarray(value, dtype=self.dtype))
    return apply(get("masked_fill"), (self, mask, value))
