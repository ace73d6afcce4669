"""Indexing: ``t[index]`` (basic and integer/bool-array), ``index_put`` and its backward.

An index is normalised once into a tuple of ints, slices, ``None``, ``Ellipsis`` and
int64/bool NumPy arrays (:class:`Index`). Gradients go through flat element
positions, so repeated indices accumulate.
"""

from __future__ import annotations

import numpy as np

from ..kernels import scatter
from ..kernels.layout import c_contiguous
from ..tensor import Tensor
from .dispatch import apply, as_tensor
from .registry import get, kernel, op_function

__all__ = ["Index", "index", "index_backward", "index_put", "normalize_index"]


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


def normalize_index(index, shape: tuple[int, ...]) -> Index:
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
                    f"tensors used as indices must be integer or bool, got {arr.dtype}"
                )
        elif isinstance(item, (bool, np.bool_)):
            out.append(np.asarray(item))
        elif isinstance(item, (int, np.integer)):
            out.append(int(item))
        elif isinstance(item, slice) or item is None or item is Ellipsis:
            out.append(item)
        else:
            raise IndexError(
                f"index of type {type(item).__name__} is not supported; use "
                "ints, slices, None, ..., or integer/bool arrays"
            )
    idx = Index(out)
    _check_bounds(idx, shape)
    return idx


def _check_bounds(idx: Index, shape: tuple[int, ...]) -> None:
    try:
        np.empty(shape, dtype=np.uint8)[idx]  # NumPy's own checks, on a tiny dummy
    except IndexError as exc:
        raise IndexError(
            f"index {idx!r} is out of range for a tensor of shape {shape}: {exc}"
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
    scatter.scatter_add_flat(out.reshape(-1), positions.reshape(-1), values)
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
        scatter.scatter_add_flat(out.reshape(-1), positions.reshape(-1), vals.reshape(-1))
    else:
        out[indices] = values
    return out


@op_function("index_put")
def index_put(self: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """A copy of ``self`` with ``values`` written (or added, repeats summing) at ``indices``."""
    idx = indices if isinstance(indices, Index) else normalize_index(indices, self.shape)
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
