"""Indexing: ``t[index]`` (basic and integer/bool-array), ``index_put``, ``gather``,
``scatter``, ``scatter_add``, ``index_select``, ``take``, ``masked_fill`` and their
backward ops.

An index is normalised once into a tuple of ints, slices, ``None``, ``Ellipsis`` and
int64/bool NumPy arrays (:class:`Index`). Gradients go through flat element
positions or scatter-adds, so repeated indices accumulate. Index tensors are checked
against the shapes before any kernel runs (``IndexError`` naming the op).
"""

from __future__ import annotations

import numpy as np

from ..kernels import scatter as sk
from ..kernels.blas import c_writable
from ..kernels.layout import c_contiguous
from ..tensor import Tensor
from .dispatch import apply, as_tensor
from .registry import get, kernel, op_function

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
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)[idx]


@kernel("index", view_of=0)
def _index_kernel(x, indices):
    out = x[indices]
    return out if isinstance(out, np.ndarray) else np.asarray(out)


@op_function("index")
def index(self: Tensor, indices) -> Tensor:
    """``self[indices]`` with NumPy's basic and advanced indexing."""
    idx = indices if isinstance(indices, Index) else normalize_index(indices, self.shape)
    return apply(get("index"), (self, idx))


@kernel("index_backward")
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


@kernel("index_put")
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
        from .convert import to_dtype

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
    from .shape import _dim as shape_dim

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


def check_index_range(op: str, index: np.ndarray, low: int, high: int, what: str,
                      shapes: str) -> None:
    """IndexError naming ``op``, the first offending value and the size unless every entry
    of ``index`` lies in ``[low, high)``. Kernels call it too: under ``nbgrad.jit`` they
    run on index values the public function never saw."""
    if index.size:
        lo, hi = index.min(), index.max()
        if lo < low or hi >= high:
            bad = lo if lo < low else hi
            raise IndexError(f"{op}: index {int(bad)} is out of range for {what} {shapes}")


def _along_range(op: str, shape: tuple, dim: int, index: np.ndarray) -> None:
    n = shape[dim] if shape else 1
    check_index_range(op, index, 0, n, f"dim {dim} of size {n}",
                      f"(self {tuple(shape)}, index {tuple(index.shape)})")


def _i64(index: np.ndarray) -> np.ndarray:
    return c_writable(index.astype(np.int64, copy=False))


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


@kernel("gather")
def _gather_kernel(x, dim, index):
    _along_range("gather", x.shape, dim, index)
    region = _region(index.shape, x.shape, dim)
    src = c_writable(x if region is None else x[region])
    out = np.empty(index.shape, x.dtype)
    per = _as3(index.shape, dim)  # explicit sizes: -1 is ambiguous for empty arrays
    sk.gather_dim(src.reshape(_as3(src.shape, dim)), _i64(index).reshape(per),
                       out.reshape(per))
    return out


@op_function("gather")
def gather(self: Tensor, dim: int, index: Tensor, *, axis=None) -> Tensor:
    """``out[i][j][k] = self[index[i][j][k]][j][k]`` for ``dim=0`` (torch's ``gather``);
    the output has the index's shape."""
    index = _index_tensor(index, "gather")
    if self.ndim + index.ndim == 1:  # torch reads a 0-d self or index as 1-d here
        from .shape import reshape

        flat = gather(reshape(self, (-1,)), dim if axis is None else axis, reshape(index, (-1,)))
        return reshape(flat, tuple(index.shape))
    d = _check_along("gather", self, dim if axis is None else axis, index)
    return apply(get("gather"), (self, d, index))


def _scatter_into(op: str, out: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray,
                  accumulate: bool) -> None:
    _along_range(op, out.shape, dim, index)
    region = _region(index.shape, out.shape, dim)
    block = out if region is None else c_writable(out[region]).copy()
    if src.shape != index.shape:
        src = np.broadcast_to(src, index.shape)
    src = c_writable(src.astype(out.dtype, copy=False))
    per = _as3(index.shape, dim)  # explicit sizes: -1 is ambiguous for empty arrays
    sk.scatter_dim(block.reshape(_as3(block.shape, dim)), _i64(index).reshape(per),
                        src.reshape(per), accumulate)
    if region is not None:
        out[region] = block


@kernel("gather_backward")
def _gather_backward_kernel(g, sizes, dim, index):
    out = np.zeros(tuple(sizes), g.dtype)
    _scatter_into("gather_backward", out, dim, index, g, True)
    return out


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
        from .convert import to_dtype

        src = to_dtype(src, self.dtype)
    d = _check_along(op, self, dim, index, src)
    if src.ndim and src.shape != index.shape:
        src = src[tuple(slice(0, i) for i in index.shape)]
    return d, index, src


@kernel("scatter")
def _scatter_kernel(x, dim, index, src):
    out = np.array(x, order="C", copy=True)
    _scatter_into("scatter", out, dim, index, src, False)
    return out


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


@kernel("scatter_add")
def _scatter_add_kernel(x, dim, index, src):
    out = np.array(x, order="C", copy=True)
    _scatter_into("scatter_add", out, dim, index, src, True)
    return out


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


@kernel("index_select")
def _index_select_kernel(x, dim, index):
    idx = _i64(index).reshape(-1)
    _along_range("index_select", x.shape, dim, idx)
    a, n, b = _as3(x.shape, dim)
    out = np.empty((a, idx.size, b), x.dtype)
    sk.index_select_dim(c_writable(x).reshape(a, n, b), idx, out)
    return out.reshape(_selected_shape(x.shape, dim, idx.size))


@op_function("index_select")
def index_select(self: Tensor, dim: int, index: Tensor, *, axis=None) -> Tensor:
    """The entries at positions ``index`` (a 1-D integer tensor) along ``dim``."""
    d, index = _check_vector_index("index_select", self, dim if axis is None else axis, index)
    return apply(get("index_select"), (self, d, index))


@kernel("index_select_backward")
def _index_select_backward_kernel(g, sizes, dim, index):
    out = np.zeros(tuple(sizes), g.dtype)
    idx = _i64(index).reshape(-1)
    _along_range("index_select_backward", out.shape, dim, idx)
    a, n, b = _as3(out.shape, dim)
    sk.index_add_dim(out.reshape(a, n, b), idx, c_writable(g).reshape(a, idx.size, b))
    return out


@op_function("index_select_backward")
def index_select_backward(self: Tensor, sizes, dim: int, index: Tensor) -> Tensor:
    """Zeros of shape ``sizes`` with ``self`` added at positions ``index`` along ``dim``
    (the backward of ``index_select``; repeated indices add up)."""
    sizes = tuple(int(s) for s in sizes)
    return apply(get("index_select_backward"),
                 (self, sizes, int(dim) % max(len(sizes), 1), index))


def _take_range(op: str, shape: tuple, index: np.ndarray) -> None:
    n = int(np.prod(shape, dtype=np.int64))
    check_index_range(op, index, -n, n, f"a tensor of {n} elements",
                      f"(self {tuple(shape)}, index {tuple(index.shape)})")


def _flat_positions(index: np.ndarray, numel: int) -> np.ndarray:
    pos = _i64(index).reshape(-1)
    return np.where(pos < 0, pos + numel, pos) if pos.size and pos.min() < 0 else pos


@kernel("take")
def _take_kernel(x, index):
    _take_range("take", x.shape, index)
    out = np.empty(index.shape, x.dtype)
    sk.gather_flat(c_writable(x).reshape(-1), _flat_positions(index, x.size),
                        out.reshape(-1))
    return out


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


@kernel("take_backward")
def _take_backward_kernel(g, sizes, index):
    out = np.zeros(tuple(sizes), g.dtype)
    _take_range("take_backward", out.shape, index)
    sk.scatter_add_flat(out.reshape(-1), _flat_positions(index, out.size),
                             c_writable(g).reshape(-1))
    return out


@op_function("take_backward")
def take_backward(self: Tensor, sizes, index: Tensor) -> Tensor:
    """Zeros of shape ``sizes`` with ``self`` added at the flat positions ``index`` (the
    backward of ``take``; repeated positions add up)."""
    return apply(get("take_backward"), (self, tuple(int(s) for s in sizes), index))


# ------------------------------------------------------------------ masked_fill
@kernel("masked_fill")
def _masked_fill_kernel(x, mask, value):
    out = np.array(x, order="C", copy=True)
    m = c_writable(np.broadcast_to(mask, x.shape))
    sk.masked_fill_flat(out.reshape(-1), m.reshape(-1), x.dtype.type(value[()]))
    return out


@op_function("masked_fill")
def masked_fill(self: Tensor, mask: Tensor, value) -> Tensor:
    """A copy of ``self`` with ``value`` (a number or a 0-d tensor) where ``mask`` (a bool
    tensor broadcastable to ``self``) is true."""
    mask = as_tensor(mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"masked_fill: mask must be a bool tensor, got dtype {mask.dtype}")
    try:
        fits = np.broadcast_shapes(self.shape, mask.shape) == self.shape
    except ValueError:
        fits = False
    if not fits:
        raise RuntimeError(f"masked_fill: mask of shape {tuple(mask.shape)} does not "
                           f"broadcast to self of shape {tuple(self.shape)}")
    if isinstance(value, Tensor):
        if value.ndim:
            raise RuntimeError(f"masked_fill: value must be a number or a 0-d tensor, got "
                               f"shape {tuple(value.shape)}")
        if value.dtype != self.dtype:
            from .convert import to_dtype

            value = to_dtype(value, self.dtype)
    else:
        _number_or_array(op="masked_fill", name="value", value=value)
        value = as_tensor(np.asarray(value, dtype=self.dtype))
    return apply(get("masked_fill"), (self, mask, value))
