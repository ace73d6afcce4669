"""In-place ops: ``add_, sub_, mul_, div_, zero_, fill_, copy_, clamp_`` and ``t[i] = v``.

Each computes the out-of-place result through the ordinary op (so the table gives
its gradient), writes it into the tensor's memory, bumps the version counter shared
with every view, and makes the tensor the output of the new graph node. A node that
saved the old value then refuses to run backward ("modified by an inplace operation").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..grad_mode import STATE, no_grad
from ..tensor import Tensor
from . import dispatch
from .elementwise import add, clamp, div, mul, sub, where
from .indexing import index_put

__all__ = ["add_", "clamp_", "copy_", "div_", "fill_", "index_put_", "mul_", "sub_", "zero_"]


def _involves_grad(self: Tensor, others) -> bool:
    return STATE.grad_enabled and (
        self._requires_grad or any(isinstance(o, Tensor) and o._requires_grad for o in others)
    )


def apply_inplace(
    self: Tensor, name: str, compute: Callable[[Tensor], Tensor], others=()
) -> Tensor:
    """Run ``compute`` on the current value of ``self`` and store the result in place."""
    if self.grad_fn is None and self._requires_grad and STATE.grad_enabled:
        raise RuntimeError(
            f"{name}: a leaf tensor that requires grad is being used in an "
            "in-place operation (wrap it in nbgrad.no_grad() to change it)"
        )
    if not self._data.flags.writeable:
        raise RuntimeError(
            f"{name}: the tensor is a read-only view (e.g. from expand or "
            "broadcast_to); clone() it first"
        )
    if _involves_grad(self, others):
        if self._base is not None and self._data.base is not None:
            raise RuntimeError(
                f"{name}: in-place modification of a view that takes part in "
                "autograd is not supported; use out-of-place ops or "
                "index_put on the base tensor"
            )
        old = Tensor._make(
            self._data.copy(),
            requires_grad=self._requires_grad,
            grad_fn=self.grad_fn,
            output_nr=self._output_nr,
            device=self._device,
        )
        dispatch.transfer_tangent(self, old)
        new = compute(old)
        _store(self, new, name)
        dispatch.transfer_tangent(new, self, replace=True)
        self.grad_fn = new.grad_fn
        self._output_nr = new._output_nr
        self._requires_grad = new._requires_grad
    else:
        with no_grad():
            new = compute(self)
        _store(self, new, name)
        dispatch.transfer_tangent(new, self, replace=True)
    self._version_box[0] += 1
    return self


def _store(self: Tensor, new: Tensor, name: str) -> None:
    if new.shape != self.shape:
        raise RuntimeError(
            f"{name}: the result has shape {new.shape}, which cannot be stored "
            f"in place into a tensor of shape {self.shape}"
        )
    if not np.can_cast(new.dtype, self.dtype, casting="same_kind"):
        raise RuntimeError(
            f"{name}: result type {new.dtype} can't be cast to the tensor's dtype {self.dtype}"
        )
    np.copyto(self._data, new._data, casting="same_kind")


def add_(self: Tensor, other, alpha: float = 1) -> Tensor:
    value = other if alpha == 1 else mul(other, alpha)
    out = dispatch.apply_lean_inplace("add", self, value)
    return apply_inplace(self, "add_", lambda t: add(t, value), (other,)) if out is None else out


def sub_(self: Tensor, other, alpha: float = 1) -> Tensor:
    value = other if alpha == 1 else mul(other, alpha)
    out = dispatch.apply_lean_inplace("sub", self, value)
    return apply_inplace(self, "sub_", lambda t: sub(t, value), (other,)) if out is None else out


def mul_(self: Tensor, other) -> Tensor:
    out = dispatch.apply_lean_inplace("mul", self, other)
    return apply_inplace(self, "mul_", lambda t: mul(t, other), (other,)) if out is None else out


def div_(self: Tensor, other) -> Tensor:
    out = dispatch.apply_lean_inplace("div", self, other)
    return apply_inplace(self, "div_", lambda t: div(t, other), (other,)) if out is None else out


def clamp_(self: Tensor, min=None, max=None) -> Tensor:  # noqa: A002
    return apply_inplace(self, "clamp_", lambda t: clamp(t, min, max))


def fill_(self: Tensor, value) -> Tensor:
    if isinstance(value, Tensor):
        return apply_inplace(self, "fill_", lambda t: mul(t, 0) + value, (value,))

    def fill(t: Tensor) -> Tensor:
        return Tensor._make(np.full(t.shape, value, t.dtype), device=t._device)

    return apply_inplace(self, "fill_", fill)


def copy_(self: Tensor, src) -> Tensor:
    """Write ``src`` (broadcast to this tensor's shape) into this tensor; the gradient
    flows to ``src``, as PyTorch's ``copy_``."""
    def copy(t: Tensor) -> Tensor:
        keep = Tensor._make(np.zeros((), np.bool_), device=t._device)
        return where(keep, t, src)  # src's values broadcast to t's shape; no 0 * inf

    return apply_inplace(self, "copy_", copy, (src,))


def zero_(self: Tensor) -> Tensor:
    return fill_(self, 0)


def index_put_(self: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """``self[indices] = values`` (or ``+=`` with ``accumulate``), in place."""
    return apply_inplace(
        self, "index_put_", lambda t: index_put(t, indices, values, accumulate), (values,)
    )
