"""JAX's functional updates: ``x.at[idx].set(v)``, ``.add(v)``, ``.multiply(v)`` (also
``.mul``), ``.min(v)``, ``.max(v)``, ``.get()``, each returning a new tensor.

A static index (anything ``x[idx]`` takes: ints, slices, None, ..., integer and bool
arrays) goes through ``index_put``; ``add`` accumulates repeated positions (as JAX's
scatter-add), ``set`` with repeated positions keeps one of the values, and
``multiply``/``min``/``max`` refuse repeated positions. An index holding a traced
integer or a ``ds`` (see :mod:`nbgrad.ops.dynamic`), or any 0-d integer tensor (so that
eager mode and ``nbgrad.jit`` agree), goes through ``dynamic_update_slice``: as in JAX,
an update at such an integer out of range is dropped (``x`` is returned unchanged
there), and a ``ds`` window is clamped to fit.
Every path is differentiable with respect to ``x`` and ``v``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..tensor import Tensor
from . import elementwise as ew
from .convert import to_dtype
from .dispatch import as_tensor
from .dynamic import dynamic_slice, dynamic_update_slice, in_range, is_dynamic, window_of
from .indexing import Index, index, index_put, normalize_index
from .shape import broadcast_to, reshape

__all__ = ["AtIndexer"]


class AtIndexer:
    """``x.at``: index it (``x.at[idx]``) to get the updates of that region."""

    __slots__ = ("_x",)

    def __init__(self, tensor: Tensor) -> None:
        self._x = tensor

    def __getitem__(self, idx) -> AtRef:
        return AtRef(self._x, idx)


class AtRef:
    """The updates of ``x`` at one index (``x.at[idx]``)."""

    __slots__ = ("_x", "_idx")

    def __init__(self, x: Tensor, idx) -> None:
        self._x = x
        self._idx = idx

    def get(self) -> Tensor:
        """``x[idx]``."""
        return self._x[self._idx]

    def set(self, values) -> Tensor:
        """A copy of ``x`` with ``values`` (broadcast to the region) at ``idx``."""
        return self._update("set", values, None)

    def add(self, values) -> Tensor:
        """A copy of ``x`` with ``values`` added at ``idx`` (repeated positions add up)."""
        return self._update("add", values, lambda cur, v: cur + v)

    def multiply(self, values) -> Tensor:
        """A copy of ``x`` with the region at ``idx`` multiplied by ``values``."""
        return self._update("multiply", values, lambda cur, v: cur * v)

    mul = multiply

    def min(self, values) -> Tensor:
        """A copy of ``x`` with the region at ``idx`` replaced by ``minimum(x[idx], values)``."""
        return self._update("min", values, ew.minimum)

    def max(self, values) -> Tensor:
        """A copy of ``x`` with the region at ``idx`` replaced by ``maximum(x[idx], values)``."""
        return self._update("max", values, ew.maximum)

    # -------------------------------------------------------------- paths
    def _values(self, what: str, values, shape: tuple[int, ...]) -> Tensor:
        x = self._x
        v = as_tensor(values) if isinstance(values, Tensor) else as_tensor(
            np.asarray(values, dtype=x.dtype))
        if v.dtype != x.dtype:
            v = to_dtype(v, x.dtype)
        if v.ndim == 0 and v.device != x.device:  # a scalar joins x's device, as in PyTorch
            v = v.to(x.device)
        try:
            np.broadcast_shapes(v.shape, shape)
            ok = len(v.shape) <= len(shape)
        except ValueError:
            ok = False
        if not ok:
            raise RuntimeError(f"at[...].{what}: values of shape {tuple(v.shape)} cannot be "
                               f"written to the indexed region of shape {shape} (x of shape "
                               f"{tuple(x.shape)})")
        return v if v.shape == shape else broadcast_to(v, shape)

    def _update(self, what: str, values, combine: Callable | None) -> Tensor:
        x, idx = self._x, self._idx
        if not isinstance(idx, Index) and is_dynamic(idx, tensors=True):
            return self._dynamic(what, values, combine)
        idx = idx if isinstance(idx, Index) else normalize_index(idx, x.shape, f"at[...].{what}")
        shape = tuple(np.empty(x.shape, np.uint8)[idx].shape)
        v = self._values(what, values, shape)
        if what == "set":
            return index_put(x, idx, v, False)
        if what == "add":
            return index_put(x, idx, v, True)
        if not idx.is_basic:
            pos = np.arange(x.size).reshape(x.shape)[idx]
            if np.unique(pos).size != pos.size:
                raise RuntimeError(f"at[...].{what}: the index repeats positions (x of shape "
                                   f"{tuple(x.shape)}); only set and add take repeats")
        return index_put(x, idx, combine(index(x, idx), v), False)

    def _dynamic(self, what: str, values, combine: Callable | None) -> Tensor:
        x = self._x
        w = window_of(tuple(x.shape), self._idx, f"at[...].{what}", tensors=True)
        starts = list(w.starts)
        v = reshape(self._values(what, values, w.shape), w.sizes)
        if combine is None and not w.checks:
            return dynamic_update_slice(x, v, starts)
        cur = dynamic_slice(x, starts, w.sizes)
        new = v if combine is None else combine(cur, v)
        if w.checks:  # an update at a traced integer out of range is dropped, as in JAX
            new = ew.where(in_range(w), new, cur)
        return dynamic_update_slice(x, new, starts)
