"""Windows at run-time positions: ``dynamic_slice``, ``dynamic_update_slice`` (with
``jax.lax``'s semantics), ``ds``, and indexing with a traced integer.

Under ``nbgrad.jit`` (and in ``fori_loop``/``scan`` bodies traced by it) an index may
hold a *traced* integer: a 0-d integer tensor whose value is only known at run time,
such as the loop counter. ``M[i]``, ``M[i, :]``, ``M[:, i]``, ``M[i, j]``,
``x[i:i + k]`` (``k`` a Python int: the stop is recognised as ``i + k`` in the graph)
and ``x[ds(i, k)]`` become one ``dynamic_slice`` and a reshape, differentiable like
any op. Out of range, the window's start is *clamped* so that the window fits (as
JAX does: ``M[n + 3]`` reads row ``n - 1``, ``M[-n - 3]`` row 0); a negative traced
integer counts from the end, as in Python. Nothing is ever read out of bounds.
Eagerly (an eager ``fori_loop`` passes a concrete counter) an index is an ordinary
one: an int out of range raises ``IndexError`` and a slice past the end is shorter;
``ds(i, k)`` clamps in both, so it is the spelling to use for windows that may run
past the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..kernels import window as wk
from ..kernels.layout import call_native
from ..tensor import STATE_TRACE, Tensor
from .convert import to_dtype
from .dispatch import apply, as_tensor
from .registry import get, kernel, op_function
from .shape import reshape, stack
from .traits import NativePlan, Opaque, batching

__all__ = ["DynamicSlice", "ds", "dynamic_slice", "dynamic_slice_backward",
           "dynamic_update_slice"]


# ------------------------------------------------------------------ the table ops
def _window_plan(shape, sizes) -> tuple:
    return (tuple(int(s) for s in shape), tuple(int(s) for s in sizes))


_DYNAMIC_SLICE = Opaque(native=wk.dynamic_slice_native, static=lambda attrs, shapes: NativePlan(
    _window_plan(shapes[0], attrs["sizes"]), (tuple(attrs["sizes"]),)))
_DYNAMIC_SLICE_BACKWARD = Opaque(
    native=wk.dynamic_slice_backward_native, static=lambda attrs, shapes: NativePlan(
        _window_plan(attrs["sizes"], shapes[0]), (tuple(attrs["sizes"]),)))
_DYNAMIC_UPDATE_SLICE = Opaque(
    native=wk.dynamic_update_slice_native, static=lambda attrs, shapes: NativePlan(
        _window_plan(shapes[0], shapes[1]), (tuple(shapes[0]),)))


@kernel("dynamic_slice", kind=_DYNAMIC_SLICE, batch=batching("dynamic_slice"))
def _dynamic_slice_kernel(x, start_indices, sizes):
    return call_native(_DYNAMIC_SLICE, (x, start_indices), {"sizes": sizes})


@kernel("dynamic_slice_backward", kind=_DYNAMIC_SLICE_BACKWARD,
        batch=batching("dynamic_slice_backward"))
def _dynamic_slice_backward_kernel(g, sizes, start_indices):
    return call_native(_DYNAMIC_SLICE_BACKWARD, (g, start_indices), {"sizes": sizes})


@kernel("dynamic_update_slice", kind=_DYNAMIC_UPDATE_SLICE, batch=batching("dynamic_update_slice"))
def _dynamic_update_slice_kernel(x, update, start_indices):
    return call_native(_DYNAMIC_UPDATE_SLICE, (x, update, start_indices), {})


def _start_tensor(op: str, start_indices, ndim: int, device=None) -> Tensor:
    """``start_indices`` (a 1-D integer tensor, or a sequence of ints and 0-d integer
    tensors) as a 1-D int64 tensor of ``ndim`` entries (on ``device``, if given)."""
    if isinstance(start_indices, Tensor):
        t = start_indices
    elif isinstance(start_indices, (list, tuple)):
        parts = [s if isinstance(s, Tensor) else None for s in start_indices]
        if all(p is None for p in parts):
            t = as_tensor(np.asarray([int(s) for s in start_indices], np.int64).reshape(-1))
        else:
            t = stack([_int64(op, reshape(s, ()) if isinstance(s, Tensor) else
                              as_tensor(np.asarray(int(s), np.int64)))
                       for s in start_indices]) if start_indices else None
    else:
        raise TypeError(f"{op}: start_indices must be a 1-D integer tensor or a sequence of "
                        f"ints, got {type(start_indices).__name__}")
    if t is None:
        t = as_tensor(np.zeros(0, np.int64))
    if t.dtype.kind not in "iu" or t.ndim != 1 or t.shape[0] != ndim:
        raise TypeError(f"{op}: start_indices must hold one integer per dimension of self "
                        f"({ndim}), got {t.dtype} of shape {tuple(t.shape)}")
    t = _int64(op, t)
    # positions made on the host (an eager loop's counter) join a tensor on another device
    return t if device is None or t.device == device else t.to(device)


def _int64(op: str, t: Tensor) -> Tensor:
    if t.dtype.kind not in "iu":
        raise TypeError(f"{op}: an index must be an integer tensor, got {t.dtype}")
    return t if t.dtype == np.int64 else to_dtype(t, np.dtype(np.int64))


@op_function("dynamic_slice")
def dynamic_slice(self: Tensor, start_indices, sizes) -> Tensor:
    """The window of shape ``sizes`` starting at ``start_indices`` (one integer per
    dimension; run-time values under ``nbgrad.jit``), as ``jax.lax.dynamic_slice``: a
    negative start counts from the end, then each start is clamped to
    ``[0, self.shape[d] - sizes[d]]`` so that the window fits."""
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) != self.ndim or any(s < 0 or s > n for s, n in zip(sizes, self.shape,
                                                                       strict=True)):
        raise TypeError(f"dynamic_slice: sizes {sizes} do not fit self of shape "
                        f"{tuple(self.shape)} (one size per dimension, 0 <= size <= dim)")
    starts = _start_tensor("dynamic_slice", start_indices, self.ndim, self.device)
    return apply(get("dynamic_slice"), (self, starts, sizes))


@op_function("dynamic_slice_backward")
def dynamic_slice_backward(self: Tensor, sizes, start_indices) -> Tensor:
    """Zeros of shape ``sizes`` with ``self`` written at the clamped ``start_indices``
    (the backward of ``dynamic_slice``)."""
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) != self.ndim or any(s > n for s, n in zip(self.shape, sizes, strict=True)):
        raise TypeError(f"dynamic_slice_backward: self of shape {tuple(self.shape)} does not "
                        f"fit in sizes {sizes}")
    starts = _start_tensor("dynamic_slice_backward", start_indices, len(sizes), self.device)
    return apply(get("dynamic_slice_backward"), (self, sizes, starts))


@op_function("dynamic_update_slice")
def dynamic_update_slice(self: Tensor, update, start_indices) -> Tensor:
    """A copy of ``self`` with ``update`` written at ``start_indices`` (negative ones
    counting from the end, then clamped so that it fits), as
    ``jax.lax.dynamic_update_slice``; ``update`` is cast to self's dtype."""
    update = as_tensor(update)
    if update.dtype != self.dtype:
        update = to_dtype(update, self.dtype)
    if update.ndim != self.ndim or any(u > n for u, n in zip(update.shape, self.shape,
                                                             strict=True)):
        raise TypeError(f"dynamic_update_slice: update of shape {tuple(update.shape)} does "
                        f"not fit in self of shape {tuple(self.shape)}")
    starts = _start_tensor("dynamic_update_slice", start_indices, self.ndim, self.device)
    return apply(get("dynamic_update_slice"), (self, update, starts))


# ------------------------------------------------------------------ traced indices
@dataclass(frozen=True)
class DynamicSlice:
    """``ds(start, size)``: the ``size`` entries from ``start`` along one dimension (a
    run-time ``start`` under ``nbgrad.jit``; clamped so that the window fits). Not a
    tuple, so that ``x[ds(i, k)]`` is one index item."""

    start: Any
    size: int


def ds(start, size: int) -> DynamicSlice:
    """An index item for ``x[ds(i, k)]`` = ``x[i:i + k]`` with a static length ``k``
    and a start that may be traced (clamped so that the window fits, as JAX's ``ds``)."""
    if isinstance(size, Tensor) or isinstance(size, (bool, np.bool_)) or \
            not isinstance(size, (int, np.integer)) or size < 0:
        raise TypeError(f"ds: size must be a non-negative Python int, got {size!r}")
    return DynamicSlice(start, int(size))


def _traced(t: Any) -> bool:
    tracer = STATE_TRACE.tracer
    return isinstance(t, Tensor) and tracer is not None and tracer.is_traced(t)


def is_dynamic(indices, tensors: bool = False) -> bool:
    """Whether an index holds a ``ds`` or a traced integer (see the module doc);
    ``tensors``: or any 0-d integer tensor."""
    items = indices if isinstance(indices, tuple) else (indices,)
    return any(isinstance(it, DynamicSlice) or _traced(it) or (
        tensors and isinstance(it, Tensor) and it.ndim == 0 and it.dtype.kind in "iu") or (
        isinstance(it, slice) and (_traced(it.start) or _traced(it.stop)))
        for it in items)


class Window(NamedTuple):
    """A traced index as a window: per dimension of self its start (an int or a 0-d int64
    tensor) and size, which dimensions the result keeps, and the result's shape."""

    starts: tuple
    sizes: tuple[int, ...]
    shape: tuple[int, ...]
    checks: tuple  # (0-d int64 tensor, dim size) of traced integers (for .at's drop)


def in_range(w: Window) -> Tensor | None:
    """A 0-d bool tensor: every traced integer of the window lies in ``[-n, n)`` (None
    when the window has none)."""
    ok = None
    for i, n in w.checks:
        inside = (i >= -n).logical_and(i < n)
        ok = inside if ok is None else ok.logical_and(inside)
    return ok


def _slice_length(op: str, sl: slice) -> tuple[Any, int]:
    """(start, static length) of a slice with traced bounds ``i:i + k``."""
    if sl.step not in (None, 1):
        raise IndexError(f"{op}: a slice with traced bounds must have step 1")
    start, stop = sl.start, sl.stop
    if _traced(start) and _traced(stop):
        k = _offset_of(start, stop)
        if k is not None:
            return start, k
    raise IndexError(
        f"{op}: a slice with a traced bound needs a static length: write x[i:i + k] with a "
        "Python int k (the stop computed from the same traced i), or x[nbgrad.ds(i, k)]")


def _offset_of(start: Tensor, stop: Tensor) -> int | None:
    """``k`` when the graph computes ``stop`` as ``start + k`` (k a constant)."""
    tracer = STATE_TRACE.tracer
    a, b = tracer.lookup(start), tracer.lookup(stop)
    if a is None or b is None:
        return None
    consts = tracer.graph.consts
    for node in reversed(tracer.graph.nodes):
        if any(o is b for o in node.outputs):
            if node.op != "add" or len(node.inputs) != 2:
                return None
            x, y = node.inputs
            other = y if x is a else x if y is a else None
            if other is None or other not in consts or consts[other].size != 1 or \
                    consts[other].dtype.kind not in "iu":
                return None
            return int(consts[other].reshape(-1)[0])
    return None


def _item(op: str, it, n: int, d: int, tensors: bool) -> tuple[Any, int, bool, tuple | None]:
    """(start, size, kept, check) of one index item along a dimension of size ``n``
    (``tensors``: a 0-d integer tensor is a run-time value even when not traced)."""
    if isinstance(it, DynamicSlice):
        if it.size > n:
            raise IndexError(f"{op}: ds(..., {it.size}) is longer than dim {d} of size {n}")
        start = _int64(op, reshape(it.start, ())) if isinstance(it.start, Tensor) \
            else int(it.start)
        return start, it.size, True, None
    if isinstance(it, Tensor):
        if it.ndim != 0 or it.dtype.kind not in "iu":
            raise IndexError(f"{op}: a traced index must be a 0-d integer tensor, got "
                             f"{it.dtype} of shape {tuple(it.shape)} (array indices that "
                             "depend on traced values are not supported)")
        if not (tensors or _traced(it)):
            return _item(op, int(it.item()), n, d, tensors)
        i = _int64(op, it)  # the kernels count a negative i from the end, then clamp
        return i, 1, False, (i, n)
    if isinstance(it, slice):
        bounds = (it.start, it.stop, it.step)
        if any(isinstance(b, Tensor) for b in bounds) and not any(map(_traced, bounds)):
            it = slice(*(int(b.item()) if isinstance(b, Tensor) else b for b in bounds))
        elif any(isinstance(b, Tensor) for b in bounds):
            start, k = _slice_length(op, it)
            if k < 0 or k > n:
                raise IndexError(f"{op}: the slice length {k} does not fit dim {d} of size {n}")
            return _int64(op, start), k, True, None
        lo, hi, step = it.indices(n)
        if step != 1:
            raise IndexError(f"{op}: a slice with a step cannot be combined with a traced "
                             "index; index in two steps")
        return lo, max(hi - lo, 0), True, None
    if isinstance(it, (int, np.integer)) and not isinstance(it, (bool, np.bool_)):
        if not -n <= int(it) < n:
            raise IndexError(f"{op}: index {int(it)} is out of range for dim {d} of size {n}")
        return int(it) % n, 1, False, None
    raise IndexError(f"{op}: an index of type {type(it).__name__} cannot be combined with a "
                     "traced index (use ints, slices, None, ... and 0-d integer tensors)")


def window_of(shape: tuple[int, ...], indices, op: str = "index",
              tensors: bool = False) -> Window:
    """The window a traced basic index selects in a tensor of ``shape`` (``tensors``:
    every 0-d integer tensor is a run-time value)."""
    items = indices if isinstance(indices, tuple) else (indices,)
    used = sum(1 for it in items if it is not None and it is not Ellipsis)
    if used > len(shape):
        raise IndexError(f"{op}: too many indices for a tensor of shape {tuple(shape)}")
    if sum(1 for it in items if it is Ellipsis) > 1:
        raise IndexError(f"{op}: an index can only have a single ellipsis")
    starts: list = []
    sizes: list[int] = []
    out: list[int] = []
    checks: list = []
    d = 0
    has_ellipsis = any(it is Ellipsis for it in items)
    for it in items + (Ellipsis,) * (not has_ellipsis):
        if it is None:
            out.append(1)
            continue
        count = len(shape) - used if it is Ellipsis else 1
        for _ in range(count):
            start, size, kept, check = _item(op, slice(None) if it is Ellipsis else it,
                                             shape[d], d, tensors)
            starts.append(start)
            sizes.append(size)
            if kept:
                out.append(size)
            if check is not None:
                checks.append(check)
            d += 1
    return Window(tuple(starts), tuple(sizes), tuple(out), tuple(checks))


def dynamic_index(self: Tensor, indices) -> Tensor:
    """``self[indices]`` for an index holding a traced integer or a ``ds``."""
    w = window_of(tuple(self.shape), indices)
    return reshape(dynamic_slice(self, list(w.starts), w.sizes), w.shape)
