"""Forward-mode differentiation: tangents pushed through every op as it runs.

A *dual level* (:func:`dual_level`) maps tensors to tangents. While one is open,
:func:`nbgrad.ops.dispatch.apply` calls :func:`push_tangents` after every op; for each open
level at which some input has a tangent, the outputs' tangents come from, in order:

1. the entry's forward formula in ``formulas/derivatives.yaml`` (``result:``, over the
   inputs, their tangents ``<name>_t`` and ``result``), as PyTorch's table writes them;
2. a rule of the op's kind (``result: auto_element_wise`` / ``auto_linear`` in the table
   choose one explicitly): an elementwise op's Jacobian is diagonal, so its backward formula
   with the tangent in place of ``grad`` is the forward derivative; a linear op (views,
   permutations, broadcasts, data movement, joins, sums, index scatters, casts) applied to
   the tangents is its own; a product follows the product rule;
3. otherwise the transpose of the backward formulas: ``J t = d/du <J^T u, t>``, exact for
   every table op (two small reverse passes over this one op).

The tangent computations are ordinary op calls, so an enclosing level differentiates them
(nested ``jvp``), the autograd recorder records them (reverse over forward) and the
``nbgrad.jit`` tracer traces them (one graph). Levels nest as JAX's: the computations of
an inner level are seen by the outer ones, never the reverse.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from .. import ops as _ops
from ..grad_mode import STATE as GRAD_STATE
from ..grad_mode import enable_grad
from ..ops import dispatch
from ..ops.traits import (
    Broadcast,
    Cast,
    IndexScatter,
    Join,
    Matmul,
    Move,
    Permute,
    Reduction,
    View,
)
from ..table.formula import Formula
from ..tensor import Tensor
from . import node
from .run import grad as _grad

if TYPE_CHECKING:
    from ..ops.registry import OpDef

__all__ = ["DualLevel", "by_transpose", "dual_level", "push_function_tangents", "push_tangents",
           "transfer_tangent"]

#: kinds whose op is linear in its differentiable tensor inputs (``auto_linear``)
LINEAR_KINDS = (View, Permute, Broadcast, Move, Join, Reduction, IndexScatter, Cast)


class DualLevel:
    """The tangents of one forward-mode level, held as long as their tensors live."""

    __slots__ = ("_tangents", "_by_data", "__weakref__")

    def __init__(self) -> None:
        self._tangents: dict[int, tuple[weakref.ref, Tensor]] = {}
        # the same tangents by data array: a saved output rebuilt for backward
        # (autograd.node.SavedOutput) wraps its output's array in a new tensor
        self._by_data: dict[int, tuple[weakref.ref, Tensor]] = {}

    def get(self, t: Tensor) -> Tensor | None:
        entry = self._tangents.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1]

    def get_by_data(self, data: np.ndarray) -> Tensor | None:
        entry = self._by_data.get(id(data))
        if entry is None or entry[0]() is not data:
            return None
        return entry[1]

    def set(self, t: Tensor, tangent: Tensor) -> None:
        """Make ``tangent`` (same shape as ``t``) the tangent of ``t`` at this level."""
        if tangent.shape != t.shape:
            raise RuntimeError(f"forward mode: a tangent of shape {tuple(tangent.shape)} for "
                               f"a tensor of shape {tuple(t.shape)}")
        if tangent.dtype != t.dtype:
            tangent = _ops.to_dtype(tangent, t.dtype)
        self._tangents[id(t)] = (weakref.ref(t, _forget(self._tangents, id(t))), tangent)
        data = t._data
        self._by_data[id(data)] = (weakref.ref(data, _forget(self._by_data, id(data))),
                                   tangent)


def _forget(table: dict, key: int):
    def drop(ref: weakref.ref) -> None:
        entry = table.get(key)
        if entry is not None and entry[0] is ref:
            del table[key]
    return drop


class _State(threading.local):
    def __init__(self) -> None:
        #: the levels whose tangents the next op computes (outermost first)
        self.active: tuple[DualLevel, ...] = ()


STATE = _State()
_open_lock = threading.Lock()
_open_count = 0  # levels open in any thread: the dispatch hook is installed while > 0


@contextmanager
def dual_level() -> Iterator[DualLevel]:
    """Open a forward-mode level (innermost of those open in this thread)."""
    global _open_count
    level = DualLevel()
    outer = STATE.active
    STATE.active = outer + (level,)
    with _open_lock:
        _open_count += 1
        dispatch.set_forward(push_tangents, transfer_tangent)
        node.ON_UNPACK_OUTPUT = transfer_saved_output
    try:
        yield level
    finally:
        STATE.active = outer
        with _open_lock:
            _open_count -= 1
            if _open_count == 0:
                dispatch.set_forward(None)
                node.ON_UNPACK_OUTPUT = None


@contextmanager
def suspended() -> Iterator[None]:
    """No level sees the ops run inside (a custom Function's forward)."""
    outer = STATE.active
    STATE.active = ()
    try:
        yield
    finally:
        STATE.active = outer


def active() -> bool:
    """Whether a forward-mode level is open in this thread."""
    return bool(STATE.active)


def transfer_tangent(src: Tensor, dst: Tensor, replace: bool = False) -> None:
    """Give ``dst`` the tangents of ``src`` at every open level (``dst`` stands for ``src``:
    a fresh input of a transform, the old value of a tensor changed in place). With
    ``replace`` (``dst`` now holds ``src``'s value), a tangent ``dst`` had and ``src``
    lacks becomes zeros."""
    for level in STATE.active:
        tan = level.get(src)
        if tan is None and replace and level.get(dst) is not None:
            tan = _ops.zeros_like(dst)
        if tan is not None:
            if replace and dst._base is not None:
                raise RuntimeError("forward mode: changing a view in place while computing "
                                   "a jvp is not supported (its base's tangent would go "
                                   "stale); use an out-of-place op")
            level.set(dst, tan)


def transfer_saved_output(data: np.ndarray, dst: Tensor) -> None:
    """Give a saved output rebuilt around ``data`` the tangents its output had."""
    for level in STATE.active:
        tan = level.get_by_data(data)
        if tan is not None:
            level.set(dst, tan)


def has_tangent(tensors) -> bool:
    """Whether any of ``tensors`` has a tangent at an open level."""
    return any(level.get(t) is not None for level in STATE.active for t in tensors
               if isinstance(t, Tensor))


# ------------------------------------------------------------------ the dispatch hook
def push_tangents(op: OpDef, args: tuple, outputs: list[Tensor]) -> None:
    """Compute the tangents of ``outputs`` at every open level (dispatch's forward hook)."""
    levels = STATE.active
    if not levels or not op.differentiable or op.entry.zero_derivative:
        return  # a zero derivative: no tangent (a symbolic zero)
    for depth in range(len(levels)):  # outermost first: inner rules read its tangents
        level = levels[depth]
        tangents = _input_tangents(op, args, level)
        if tangents is None:
            continue
        STATE.active = levels[:depth]  # what this level computes, the outer ones see
        try:
            out_tangents = _tangents(op, args, outputs, tangents)
        finally:
            STATE.active = levels
        out_diff = op.out_diff
        for k, (out, tan) in enumerate(zip(outputs, out_tangents, strict=False)):
            if tan is None or out.dtype.kind != "f":
                continue
            if not (out_diff[k] if k < len(out_diff) else out_diff[-1]):
                continue
            if not isinstance(tan, Tensor):
                tan = Tensor._make(np.asarray(tan, dtype=out.dtype))
            if tan.shape != out.shape:
                tan = _ops.expand(tan, *out.shape)
            level.set(out, tan)


def push_function_tangents(cls: type, ctx, args: tuple, kwargs: dict,
                           outputs: list, rerun) -> None:
    """The tangents of a custom Function's outputs: its ``jvp(ctx, *tangents)`` when it
    defines one, else the transpose of its backward (``rerun(args)`` runs it again)."""
    levels = STATE.active
    for depth in range(len(levels)):  # outermost first: inner rules read its tangents
        level = levels[depth]
        tans = [level.get(a) if isinstance(a, Tensor) else None for a in args]
        if all(t is None for t in tans):
            continue
        STATE.active = levels[:depth]
        try:
            jvp = getattr(cls, "jvp", None)
            if jvp is not None:
                full = [t if t is not None else
                        (_zeros_for(a) if isinstance(a, Tensor) else None)
                        for a, t in zip(args, tans, strict=True)]
                out_t = jvp(ctx, *full)
                out_t = list(out_t) if isinstance(out_t, (tuple, list)) else [out_t]
            else:
                slots = [(i, None, t) for i, t in enumerate(tans) if t is not None]
                out_t = by_transpose(rerun, args, slots, len(outputs), cls.__name__)
        finally:
            STATE.active = levels
        for out, tan in zip(outputs, out_t, strict=False):
            if isinstance(out, Tensor) and isinstance(tan, Tensor) and out.dtype.kind == "f":
                level.set(out, tan if tan.shape == out.shape else _ops.expand(tan, *out.shape))


def _input_tangents(op: OpDef, args: tuple, level: DualLevel) -> dict | None:
    """The tangents of the op's differentiable inputs by name (None: none has one)."""
    found: dict = {}
    any_tangent = False
    for i, name, is_list, has_formula in op.record_plan:
        if not has_formula:
            continue
        if is_list:
            tans = [None if t is None else level.get(t) for t in args[i]]
            any_tangent = any_tangent or any(t is not None for t in tans)
            found[name] = tans
        else:
            t = args[i]
            tan = None if t is None else level.get(t)
            any_tangent = any_tangent or tan is not None
            found[name] = tan
    return found if any_tangent else None


def _zeros_for(t: Tensor) -> Tensor:
    return _ops.zeros_like(t)


def _env(op: OpDef, args: tuple, outputs: list[Tensor]) -> dict:
    env = {p.name: args[i] for i, p in enumerate(op.params)}
    env["result"] = outputs[0] if outputs else None
    for k, out in enumerate(outputs):
        env[f"result{k}"] = out
    for k, name in enumerate(op.entry.schema.returns):
        if name and name not in env:
            env[name] = outputs[k]
    return env


def rule_of(op: OpDef) -> str:
    """Which way ``op``'s tangents are computed: ``"formula"`` (the table's ``result:``),
    ``"kind"`` (a rule of its kind or an ``auto_*`` marker) or ``"transpose"``."""
    forward = op.entry.forward
    if isinstance(forward, Formula):
        return "formula"
    if forward is not None or isinstance(op.kind, (*LINEAR_KINDS, Matmul)) or \
            op.kind.label == "elementwise":
        return "kind"
    return "transpose"


def _tangents(op: OpDef, args: tuple, outputs: list[Tensor], tangents: dict) -> list:
    forward = op.entry.forward
    if isinstance(forward, Formula):
        return _by_formula(op, forward, args, outputs, tangents)
    if forward == "auto_element_wise":
        return _auto_element_wise(op, args, outputs, tangents)
    if forward == "auto_linear":
        return _auto_linear(op, args, tangents)
    kind = op.kind
    if kind.label == "elementwise" and len(outputs) == 1:
        return _auto_element_wise(op, args, outputs, tangents)
    if isinstance(kind, LINEAR_KINDS):
        return _auto_linear(op, args, tangents)
    if isinstance(kind, Matmul):
        return _product_rule(op, kind, args, outputs, tangents)
    return _transpose_of_backward(op, args, outputs, tangents)


def _by_formula(op: OpDef, formula: Formula, args: tuple, outputs: list[Tensor],
                tangents: dict) -> list:
    env = _env(op, args, outputs)
    for i, name, is_list, _ in op.record_plan:
        if is_list:
            env[f"{name}_t"] = [t if t is not None else _zeros_for(a)
                                for a, t in zip(args[i], tangents.get(name) or
                                                [None] * len(args[i]), strict=True)]
        elif args[i] is not None:
            tan = tangents.get(name)
            env[f"{name}_t"] = tan if tan is not None else _zeros_for(args[i])
        else:
            env[f"{name}_t"] = None
    value = formula.func(*[env[n] for n in formula.arg_names])
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _auto_element_wise(op: OpDef, args: tuple, outputs: list[Tensor], tangents: dict) -> list:
    """Elementwise: the Jacobian is diagonal (symmetric), so ``J t = J^T t``: the backward
    formula of each input with its (broadcast) tangent as ``grad``, summed."""
    out = outputs[0]
    env = _env(op, args, outputs)
    env["grad_input_mask"] = [True] * len(op.record_plan)
    total = None
    for name, tan in tangents.items():
        if tan is None:
            continue
        if tan.dtype != out.dtype:
            tan = _ops.to_dtype(tan, out.dtype)
        seed = tan if tan.shape == out.shape else _ops.expand(tan, *out.shape)
        env["grad"], env["grads"] = seed, [seed]
        formula = op.entry.formulas[name]
        term = formula.func(*[env[n] for n in formula.arg_names])
        if not isinstance(term, Tensor):
            term = Tensor._make(np.asarray(term, dtype=out.dtype))
        total = term if total is None else _ops.add(total, term)
    return [total]


def _auto_linear(op: OpDef, args: tuple, tangents: dict) -> list:
    """A linear op: the op itself, on the tangents (zeros for inputs without one)."""
    call = list(args)
    for i, name, is_list, has_formula in op.record_plan:
        if not has_formula:
            continue  # indices and masks stay as they are
        if is_list:
            tans = tangents.get(name) or [None] * len(args[i])
            call[i] = [t if t is not None else _zeros_for(a)
                       for a, t in zip(args[i], tans, strict=True)]
        elif args[i] is not None:
            tan = tangents.get(name)
            call[i] = tan if tan is not None else _zeros_for(args[i])
    result = dispatch.apply(op, tuple(call))
    return list(result) if isinstance(result, tuple) else [result]


def _product_rule(op: OpDef, kind: Matmul, args: tuple, outputs: list[Tensor],
                  tangents: dict) -> list:
    """A product (bilinear; plus a bias, which is linear): one term per input's tangent."""
    out = outputs[0]
    total = None
    for i, name, _is_list, has_formula in op.record_plan:
        tan = tangents.get(name) if has_formula else None
        if tan is None:
            continue
        if i == kind.bias:
            term = tan if tan.shape == out.shape else _ops.expand(tan, *out.shape)
        else:
            call = list(args)
            call[i] = tan
            if kind.bias is not None:
                call[kind.bias] = None
            term = dispatch.apply(op, tuple(call))
        total = term if total is None else _ops.add(total, term)
    return [total]


def _transpose_of_backward(op: OpDef, args: tuple, outputs: list[Tensor],
                           tangents: dict) -> list:
    if any(p.name == "generator" for p in op.params):  # running it again draws anew
        raise NotImplementedError(f"forward mode: {op.name} draws random numbers and has no "
                                  "forward formula ('result:' in derivatives.yaml)")
    slots = []
    for i, name, is_list, has_formula in op.record_plan:
        if not has_formula:
            continue
        if is_list:
            tans = tangents.get(name) or []
            slots += [(i, k, t) for k, t in enumerate(tans) if t is not None]
        elif tangents.get(name) is not None and args[i] is not None:
            slots.append((i, None, tangents[name]))
    return by_transpose(lambda call: dispatch.apply(op, call), args, slots, len(outputs))


def by_transpose(rerun, args: tuple, slots: list, n_outputs: int,
                 function: str | None = None) -> list:
    """``J t`` as the vjp, with cotangent ``t``, of the (linear) map ``u -> J^T u``.

    ``rerun(args)`` runs the op again; ``slots`` are ``(position, index in a list or None,
    tangent)`` of the inputs that have tangents. For a custom Function (``function``: its
    name) a gradient that does not depend on ``u`` means a backward nbgrad cannot
    differentiate (NumPy inside): that raises rather than give a zero tangent.
    """
    call = list(args)
    for i in {i for i, k, _ in slots if k is not None}:
        call[i] = list(call[i])
    inputs, seeds = [], []
    with enable_grad():
        for i, k, tan in slots:
            if k is None:
                call[i] = _stand_in(args[i])
                inputs.append(call[i])
            else:
                call[i][k] = _stand_in(args[i][k])
                inputs.append(call[i][k])
            seeds.append(tan)
        again = rerun(tuple(call))
        again = list(again) if isinstance(again, (tuple, list)) else [again]
        live = [k for k, o in enumerate(again) if isinstance(o, Tensor) and o.requires_grad
                and o.dtype.kind == "f"]
        if not live:
            return [None] * n_outputs
        us = [Tensor._make(np.zeros(again[k].shape, again[k].dtype), requires_grad=True)
              for k in live]
        vjps = _grad([again[k] for k in live], inputs, us, create_graph=True,
                     allow_unused=True)
        if function is not None and any(g is not None and not g.requires_grad
                                        for g in vjps):
            raise RuntimeError(
                f"forward mode (jvp, jacfwd, hvp) through the custom Function {function}: "
                "its backward is not differentiable by nbgrad (is it written with NumPy?); "
                "give the Function a jvp(ctx, *tangents) static method, or write its "
                "backward with nbgrad ops")
        pairs = [(g, t) for g, t in zip(vjps, seeds, strict=True)
                 if g is not None and g.requires_grad]
        if not pairs:
            return [None] * n_outputs
        keep = GRAD_STATE.grad_enabled and _needs_graph(args, seeds)
        found = _grad([g for g, _ in pairs], us, [t for _, t in pairs], create_graph=keep,
                      allow_unused=True)
    result: list = [None] * n_outputs
    for k, g in zip(live, found, strict=True):
        result[k] = g
    return result


def _stand_in(t: Tensor) -> Tensor:
    """``t`` as an input to differentiate with respect to, still joined to its graph."""
    if t._requires_grad:
        return _ops.view(t, *t.shape) if t._data.flags.c_contiguous else _ops.clone(t)
    out = Tensor._make(t._data, requires_grad=True, device=t._device)
    transfer_tangent(t, out)  # the tangents of enclosing levels (nested forward mode)
    return out


def _needs_graph(args: tuple, seeds: list) -> bool:
    for a in list(args) + seeds:
        if isinstance(a, Tensor) and a._requires_grad:
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(x, Tensor) and x._requires_grad
                                                for x in a):
            return True
    return False
