"""Recording table ops: the hook :func:`nbgrad.ops.dispatch.apply` calls to build the graph.

:func:`record` is installed into dispatch when this package is imported (``ops/`` never
imports ``autograd/``). It creates the op's :class:`OpNode` and saves what the op's
formulas read. :func:`run_formulas` is that node's backward: it evaluates the table's
formulas and then, once for every op, sums broadcast gradients back to each input's
shape and casts them to the input's dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import ops as _ops
from ..device import Device, cpu_device
from ..ops import dispatch
from ..tensor import Tensor
from .node import (
    RETAIN_GRAPH_MESSAGE,
    Node,
    SavedMeta,
    SavedOutput,
    SavedTensor,
    gradient_edge,
)

if TYPE_CHECKING:
    from ..ops.registry import OpDef


class OpNode(Node):
    """The backward of one application of a table op: evaluates the table's formulas."""

    __slots__ = ("op", "saved", "attrs", "input_slots", "input_meta", "output_meta",
                 "materialize")

    def __init__(self, op: OpDef, next_edges: list) -> None:
        super().__init__(next_edges)
        self.op = op
        self.saved = None
        self.attrs = None
        self.input_slots = None
        self.input_meta = None
        self.output_meta = None

    def name(self) -> str:
        return f"{self.op.name.title().replace('_', '').replace('.', '')}Backward"

    def release(self) -> None:
        self.saved = None

    def apply(self, grads: list, create_graph: bool) -> list:
        if self.saved is None:
            raise RuntimeError(RETAIN_GRAPH_MESSAGE)
        return run_formulas(self, grads)


def record(op: OpDef, args: tuple, outputs: list[Tensor]) -> None:
    """Make ``op``'s backward node for ``outputs`` (dispatch's recorder hook)."""
    edges: list = []
    meta: list = []
    slots: dict[str, range] = {}
    for i, name, is_list, has_formula in op.record_plan:
        start = len(edges)
        for t in (args[i] if is_list else (args[i],)):
            if t is None:
                edges.append(None)
                meta.append(None)
                continue
            if has_formula and t._requires_grad:
                fn = t.grad_fn
                edges.append((fn, t._output_nr) if fn is not None else gradient_edge(t))
            else:
                edges.append(None)
            data = t._data
            meta.append((data.shape, data.dtype, t._device))
        if has_formula:
            slots[name] = range(start, len(edges))
    node = OpNode(op, edges)
    node.input_slots = slots
    node.input_meta = meta
    node.output_meta = [(o._data.shape, o._data.dtype) for o in outputs]
    node.attrs = {name: args[i] for i, name in op.attr_names}
    saved = {}
    for i, name, need_value in op.save_plan:
        value = args[i]
        if isinstance(value, (list, tuple)):
            saved[name] = [_save(t, name, need_value) for t in value]
        elif value is not None:
            saved[name] = _save(value, name, need_value)
        else:
            saved[name] = None
    out_diff = op.out_diff
    for k, out in enumerate(outputs):
        if out_diff[k] if k < len(out_diff) else out_diff[-1]:
            out._requires_grad = True
            out.grad_fn = node
    for k, name in op.save_outputs:
        saved[name] = SavedOutput(outputs[k], name)
    node.saved = saved


def _save(t: Tensor, name: str, need_value: bool):
    return SavedTensor(t, name) if need_value else SavedMeta(t)


def run_formulas(node: OpNode, grads: list) -> list:
    """Backward of a table op: evaluate its formulas, then reduce and cast each gradient."""
    op = node.op
    env = dict(node.attrs)
    for name, saved in node.saved.items():
        if saved is None:
            env[name] = None
        elif isinstance(saved, list):
            env[name] = [s.unpack(node) for s in saved]
        else:
            env[name] = saved.unpack(node)
    out_meta = node.output_meta
    if len(out_meta) == 1 and grads and grads[0] is not None:
        full = [grads[0]]
    else:
        full = []
        out_diff = op.out_diff
        for k, (shape, dtype) in enumerate(out_meta):
            g = grads[k] if k < len(grads) else None
            if g is None and (out_diff[k] if k < len(out_diff) else out_diff[-1]):
                g = _ops.zeros(shape, dtype=dtype, device=_grads_device(grads))
            full.append(g)
    env["grads"] = full
    env["grad"] = full[0] if full else None
    needs = op.formula_names
    if "result" in needs and "result" not in env and "result0" in env:
        env["result"] = env["result0"]
    if "grad_input_mask" in needs:
        env["grad_input_mask"] = [e is not None for e in node.next_edges]
    formulas = op.entry.formulas
    edges = node.next_edges
    results: list = [None] * len(edges)
    for name, idx in node.input_slots.items():
        if len(idx) == 1:
            if edges[idx[0]] is None:
                continue
        elif all(edges[s] is None for s in idx):
            continue
        formula = formulas[name]
        value = formula.func(*[env[n] for n in formula.arg_names])
        values = list(value) if name in op.list_names else (value,)
        for s, g in zip(idx, values, strict=True):
            if edges[s] is None or g is None:
                continue
            shape, dtype, device = node.input_meta[s]
            if not isinstance(g, Tensor):
                g = Tensor._make(np.asarray(g, dtype=dtype))
            if g._device is not device and g._device != device:  # to_device, CPU scalars
                g = _ops.to_device(g, device)
            data = g._data
            if data.shape != shape:
                g = _fit_shape(op, name, g, shape)
            if g._data.dtype != dtype:
                g = _ops.to_dtype(g, dtype)
            results[s] = g
    return results


def _grads_device(grads: list) -> Device:
    """The device of the gradients that did arrive (for zeros in place of missing ones)."""
    return next((g._device for g in grads if g is not None), cpu_device)


def _fit_shape(op: OpDef, name: str, g: Tensor, shape: tuple) -> Tensor:
    """Sum a gradient that is broadcast wider than its input back to the input's shape."""
    try:
        ok = np.broadcast_shapes(shape, g._data.shape) == g._data.shape
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(f"{op.name}: the formula for {name!r} returned a gradient of shape "
                           f"{g._data.shape}, but the input has shape {shape} (a gradient may "
                           "only be wider than its input by broadcasting)")
    return _ops.sum_to(g, shape)


dispatch.set_recorder(record)
