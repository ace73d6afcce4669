"""``Optimizer``: parameter groups kept in flat buffers, updated by one kernel per group.

When an optimizer takes a group, it copies the group's parameters end to end into one
contiguous buffer and points each parameter's data at its segment, so a step is one
Numba call over the buffer (:mod:`nbgrad.optim.kernels`), however many parameters the
group has. The gradients are gathered into a second buffer first. A parameter whose
data was replaced since (``module.to(dtype)``, assigning ``p._data``) is gathered again
at the next step. Parameters keep their identity, so models, ``nbgrad.jit`` functions
and state dicts see the updates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..tensor import Tensor

__all__ = ["Optimizer"]


class _FlatGroup:
    """One group's parameters as segments of flat buffers, with per-segment step counts
    and the optimizer's per-element state buffers (``slots``)."""

    def __init__(self, params: list[Tensor], slots: tuple[str, ...]) -> None:
        self.params = params
        self.slots = slots
        self.dtype = None
        self._build()

    def _build(self) -> None:
        dtypes = {p._data.dtype for p in self.params}
        if len(dtypes) != 1 or next(iter(dtypes)).kind != "f":
            raise TypeError("optimizer: the parameters of one group must share one floating "
                            f"dtype, got {sorted(map(str, dtypes))} (put them in separate "
                            "groups)")
        self.dtype = dtypes.pop()
        sizes = [p._data.size for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        n = int(self.offsets[-1])
        self.flat = np.empty(n, self.dtype)
        self.grad = np.zeros(n, self.dtype)
        self.active = np.zeros(len(self.params), np.uint8)
        previous = getattr(self, "state", None)
        self.state = {slot: np.zeros(n, self.dtype) for slot in self.slots}
        if previous is not None:  # rebuilt (a dtype change): keep the state's values
            for slot, values in previous.items():
                self.state[slot][:] = values
        else:
            self.steps = np.zeros(len(self.params), np.int64)
        for k, p in enumerate(self.params):
            self._adopt(k, p)

    def _segment(self, k: int) -> slice:
        return slice(int(self.offsets[k]), int(self.offsets[k + 1]))

    def _adopt(self, k: int, p: Tensor) -> None:
        view = self.flat[self._segment(k)].reshape(p._data.shape)
        view[...] = p._data
        p._data = view

    def sync(self) -> None:
        """Gather parameters whose data no longer lives in the buffer, and gradients."""
        for k, p in enumerate(self.params):
            if p._data.base is not self.flat:
                if p._data.size != self.offsets[k + 1] - self.offsets[k]:
                    raise RuntimeError(f"optimizer: parameter {k} now has shape "
                                       f"{tuple(p._data.shape)} and a different size; "
                                       "create the optimizer again")
                if p._data.dtype != self.dtype:
                    self._build()  # module.to(dtype): new buffers, the state cast
                    return self.sync()
                self._adopt(k, p)
        for k, p in enumerate(self.params):
            g = p.grad
            self.active[k] = g is not None
            if g is not None:
                if g._data.shape != p._data.shape:
                    raise RuntimeError(f"optimizer: parameter {k} of shape "
                                       f"{tuple(p._data.shape)} has a gradient of shape "
                                       f"{tuple(g._data.shape)}")
                self.grad[self._segment(k)].reshape(p._data.shape)[...] = g._data
        return None

    def bump_versions(self) -> None:
        for k, p in enumerate(self.params):
            if self.active[k]:
                p._version_box[0] += 1


class Optimizer:
    """Base class: ``step()`` updates the parameters from their ``.grad``; ``zero_grad()``
    clears the gradients; ``state_dict()``/``load_state_dict()`` save and restore the
    hyperparameters and per-parameter state (arrays, for :func:`nbgrad.nn.save`)."""

    #: the per-element state buffers of the algorithm (e.g. Adam's ``exp_avg``)
    slots: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], defaults: dict[str, Any]
                 ) -> None:
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        self._flat: list[_FlatGroup] = []
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a group: ``{"params": [...], **hyperparameters overriding the defaults}``."""
        group = dict(group)
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, Tensor) or not p.requires_grad or p.grad_fn is not None:
                what = ("a tensor that is not a leaf requiring grad" if isinstance(p, Tensor)
                        else type(p).__name__)
                raise TypeError(f"{type(self).__name__}: can only optimize leaf tensors that "
                                f"require grad, got {what}")
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: a parameter appears in more than "
                                 "one group")
            seen.add(id(p))
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown hyperparameter(s) {sorted(unknown)}")
        group["params"] = params
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self._check(group)
        self.param_groups.append(group)
        self._flat.append(_FlatGroup(params, self.slots))

    def _check(self, group: dict[str, Any]) -> None:
        """Validate a group's hyperparameters (subclasses)."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad._data[...] = 0

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; ``closure`` (re-evaluating
        the loss, with its backward) runs first when given, and its value is returned."""
        loss = None
        if closure is not None:
            loss = closure()
        for group, flat in zip(self.param_groups, self._flat, strict=True):
            flat.sync()
            if flat.active.any():
                self._update(group, flat)
                flat.bump_versions()
        return loss

    def _update(self, group: dict[str, Any], flat: _FlatGroup) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, np.ndarray]:
        """Hyperparameters as ``param_groups.{g}.{name}`` and per-parameter state as
        ``state.{k}.step`` / ``state.{k}.{slot}`` (``k`` counts parameters across groups)."""
        out: dict[str, np.ndarray] = {}
        k = 0
        for g, (group, flat) in enumerate(zip(self.param_groups, self._flat, strict=True)):
            for key, value in group.items():
                if key != "params":
                    out[f"param_groups.{g}.{key}"] = np.asarray(value)
            for i, p in enumerate(flat.params):
                out[f"state.{k}.step"] = np.asarray(flat.steps[i])
                for slot in flat.slots:
                    out[f"state.{k}.{slot}"] = flat.state[slot][flat._segment(i)].reshape(
                        p._data.shape).copy()
                k += 1
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave (tensors or arrays), for the same
        parameters in the same groups."""
        def value(key):
            if key not in state:
                raise KeyError(f"{type(self).__name__}.load_state_dict: missing {key!r}")
            v = state[key]
            return v._data if isinstance(v, Tensor) else np.asarray(v)

        k = 0
        for g, (group, flat) in enumerate(zip(self.param_groups, self._flat, strict=True)):
            for key in group:
                if key != "params":
                    v = value(f"param_groups.{g}.{key}")
                    group[key] = tuple(v.tolist()) if v.ndim else v.item()
            self._check(group)
            for i, p in enumerate(flat.params):
                flat.steps[i] = int(value(f"state.{k}.step"))
                for slot in flat.slots:
                    v = value(f"state.{k}.{slot}")
                    if v.shape != tuple(p._data.shape):
                        raise ValueError(f"{type(self).__name__}.load_state_dict: state.{k}."
                                         f"{slot} has shape {v.shape}, the parameter "
                                         f"{tuple(p._data.shape)}")
                    flat.state[slot][flat._segment(i)] = v.reshape(-1)
                k += 1

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for g, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {g}")
            lines += [f"    {key}: {value}" for key, value in sorted(group.items())
                      if key != "params"]
        return "\n".join(lines) + "\n)"
