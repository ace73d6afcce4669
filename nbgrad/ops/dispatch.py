"""Eager dispatch: run an op's kernel, wrap the outputs, record the backward node.

:func:`apply` is the one path every op takes. It checks devices, calls the kernel
for the tensors' device, and when gradients are needed creates an
:class:`~nbgrad.autograd.node.OpNode` that saves what the op's formulas read.
:func:`run_formulas` is that node's backward: it evaluates the table's formulas and
then, once for every op, sums broadcast gradients back to each input's shape and
casts them to the input's dtype.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..autograd.anomaly import ANOMALY, check_forward, user_frame
from ..autograd.node import OpNode, SavedMeta, SavedOutput, SavedTensor, gradient_edge
from ..device import Device, cpu_device
from ..grad_mode import STATE
from ..tensor import STATE_TRACE, Tensor
from .registry import OpDef


def reset_caches() -> None:
    """Called when the table is (re)bound."""


def _device_of(op: OpDef, tensors: list[Tensor]) -> Device:
    device = cpu_device
    first = None
    for t in tensors:
        d = t._device
        if first is None:
            first, device = t, d
        elif d != device:
            raise RuntimeError(f"{op.name}: expected all tensors on the same device, but "
                               f"found at least two devices, {device} and {d}")
    return device


def _flat_tensors(op: OpDef, args: tuple) -> list[Tensor | None]:
    """The op's tensor inputs in order (lists flattened), ``None`` for absent optionals."""
    if not op.has_lists:
        return [args[i] for i in op.tensor_pos]
    out: list[Tensor | None] = []
    for i, p in enumerate(op.params):
        if p.is_tensor:
            out.append(args[i])
        elif p.is_tensor_list:
            out.extend(args[i])
    return out


def _kernel_args(op: OpDef, args: tuple) -> list:
    call = list(args)
    for i in op.tensor_pos:
        t = call[i]
        if t is not None:
            call[i] = t._data
    for i in op.list_pos:
        call[i] = [t._data for t in call[i]]
    return call


def apply(op: OpDef, args: tuple):
    """Run ``op`` on ``args`` (table order; tensors already converted) and record it."""
    flat = _flat_tensors(op, args)
    present = [t for t in flat if t is not None]
    device = _device_of(op, present) if len(present) > 1 else (
        present[0]._device if present else cpu_device)
    out = op.kernel_for(device.type)(*_kernel_args(op, args))
    single = not isinstance(out, (tuple, list))
    arrays = (out,) if single else tuple(out)
    needs_grad = (op.differentiable and STATE.grad_enabled
                  and any(t is not None and t._requires_grad for t in flat))
    base = args[op.view_of] if op.view_of is not None else None
    outputs = []
    for k, arr in enumerate(arrays):
        if base is not None and np.may_share_memory(arr, base._data):
            t = Tensor._make(arr, device=device, version_box=base._version_box,
                             base=base if base._base is None else base._base)
        else:
            t = Tensor._make(arr, device=device)
        t._output_nr = k
        outputs.append(t)
    if needs_grad:
        _record(op, args, flat, outputs)
    if STATE_TRACE.tracer is not None:
        STATE_TRACE.tracer.record(op, args, outputs)
    if ANOMALY.enabled:
        site = user_frame()
        if outputs and outputs[0].grad_fn is not None:
            outputs[0].grad_fn.anomaly_trace = site
        check_forward(op.name, outputs, site)
    return outputs[0] if single else tuple(outputs)


def _record(op: OpDef, args: tuple, flat: list, outputs: list[Tensor]) -> None:
    entry = op.entry
    diff_names = entry.formulas
    edges = []
    slots: dict[str, list[int]] = {}
    meta = []
    k = 0
    for i, p in enumerate(op.params):
        if p.is_tensor:
            group = [args[i]]
        elif p.is_tensor_list:
            group = list(args[i])
        else:
            continue
        idx = []
        for t in group:
            if t is not None and t._requires_grad and p.name in diff_names:
                edges.append(gradient_edge(t))
            else:
                edges.append(None)
            meta.append((t._data.shape, t._data.dtype) if t is not None else None)
            idx.append(k)
            k += 1
        if p.name in diff_names:
            slots[p.name] = idx
    node = OpNode(op, edges)
    node.input_slots = slots
    node.input_meta = meta
    node.output_meta = [(o._data.shape, o._data.dtype) for o in outputs]
    node.attrs = {op.params[i].name: args[i] for i in op.attr_pos}
    saved = {}
    for i, name, need_value in op.save_plan:
        value = args[i]
        if isinstance(value, (list, tuple)):
            saved[name] = [_save(t, name, need_value) for t in value]
        elif value is not None:
            saved[name] = _save(value, name, need_value)
        else:
            saved[name] = None
    for k, out in enumerate(outputs):
        rg = op.out_diff[k] if k < len(op.out_diff) else op.out_diff[-1]
        if rg:
            out._requires_grad = True
            out.grad_fn = node
    for k, name in op.save_outputs:
        saved[name] = SavedOutput(outputs[k], name)
    node.saved = saved


def _save(t: Tensor, name: str, need_value: bool):
    return SavedTensor(t, name) if need_value else SavedMeta(t)


def _unpack(node: OpNode) -> dict:
    env = dict(node.attrs)
    for name, saved in node.saved.items():
        if isinstance(saved, list):
            env[name] = [s.unpack(node) for s in saved]
        elif saved is not None:
            env[name] = saved.unpack(node)
        else:
            env[name] = None
    return env


def run_formulas(node: OpNode, grads: list) -> list:
    """Backward of a table op: evaluate its formulas, then reduce and cast each gradient."""
    from . import to_dtype, zeros
    op = node.op
    entry = op.entry
    env = _unpack(node)
    full = []
    for k, (shape, dtype) in enumerate(node.output_meta):
        g = grads[k] if k < len(grads) else None
        if g is None and op.out_diff[k if k < len(op.out_diff) else -1]:
            g = zeros(shape, dtype=dtype)
        full.append(g)
    env["grads"] = full
    env["grad"] = full[0] if full else None
    if "result" not in env and len(node.output_meta) == 1 and "result0" in env:
        env["result"] = env["result0"]
    env["grad_input_mask"] = [e is not None for e in node.next_edges]
    results: list = [None] * len(node.next_edges)
    for name, idx in node.input_slots.items():
        if all(node.next_edges[s] is None for s in idx):
            continue
        formula = entry.formulas[name]
        value = formula.func(*[env[n] for n in formula.arg_names])
        values = list(value) if name in op.list_names else [value]
        for s, g in zip(idx, values, strict=True):
            if node.next_edges[s] is None or g is None:
                continue
            if not isinstance(g, Tensor):
                g = Tensor._make(np.asarray(g, dtype=node.input_meta[s][1]))
            shape, dtype = node.input_meta[s]
            if g._data.shape != shape:
                g = _fit_shape(op, name, g, shape)
            if g._data.dtype != dtype:
                g = to_dtype(g, dtype)
            results[s] = g
    return results


def _fit_shape(op: OpDef, name: str, g: Tensor, shape: tuple) -> Tensor:
    """Sum a broadcast gradient back to the input's shape (or expand a smaller one)."""
    from . import expand, sum_to
    try:
        common = np.broadcast_shapes(shape, g._data.shape)
    except ValueError:
        raise RuntimeError(f"{op.name}: the formula for {name!r} returned a gradient of shape "
                           f"{g._data.shape}, which does not broadcast with the input's shape "
                           f"{shape}") from None
    if common != g._data.shape:
        g = expand(g, common)
    return g if common == shape else sum_to(g, shape)


# -------------------------------------------------------------------- argument helpers
def scalar_tensor(value, dtype: np.dtype, device: Device = cpu_device) -> Tensor:
    """A 0-d constant for a Python scalar operand."""
    return Tensor._make(np.asarray(value, dtype=dtype), device=device)


def as_tensor(value, dtype=None) -> Tensor:
    if isinstance(value, Tensor):
        return value
    from ..factories import tensor
    return tensor(value, dtype=dtype)


def promote_operands(*values) -> list[Tensor]:
    """Convert operands to tensors of one dtype: NumPy promotion, Python scalars weak."""
    tensors = [v for v in values if isinstance(v, Tensor)]
    if not tensors:
        tensors = [as_tensor(values[0])]
        values = (tensors[0],) + values[1:]
    dts = [t._data.dtype for t in tensors]
    dtype = dts[0] if all(d == dts[0] for d in dts) else dtypes.promote(*dts)
    for v in values:
        if not isinstance(v, Tensor):
            if isinstance(v, (bool, int, float, np.number, np.bool_)):
                dtype = dtypes.as_dtype(np.result_type(dtype, v))
            else:
                dtype = dtypes.promote(dtype, as_tensor(v)._data.dtype)
    device = tensors[0]._device
    out = []
    for v in values:
        if isinstance(v, Tensor):
            out.append(v if v._data.dtype == dtype else _cast(v, dtype))
        elif isinstance(v, (bool, int, float, np.number, np.bool_)):
            out.append(scalar_tensor(v, dtype, device))
        else:
            out.append(_cast(as_tensor(v), dtype))
    return out


def _cast(t: Tensor, dtype: np.dtype) -> Tensor:
    from . import to_dtype
    return to_dtype(t, dtype)
