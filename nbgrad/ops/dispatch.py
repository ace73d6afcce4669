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
from .. import ops as _ops  # noqa: E402 - the package, resolved at call time
from ..autograd.anomaly import ANOMALY, check_forward, user_frame
from ..autograd.node import OpNode, SavedMeta, SavedOutput, SavedTensor, gradient_edge
from ..device import Device, cpu_device
from ..grad_mode import STATE
from ..tensor import STATE_TRACE, Tensor
from .registry import OpDef


def _flat_tensors(op: OpDef, args: tuple) -> list[Tensor | None]:
    """The op's tensor inputs in order (lists flattened), ``None`` for absent optionals."""
    if op.all_tensors:
        return args
    if not op.has_lists:
        return [args[i] for i in op.tensor_pos]
    out: list[Tensor | None] = []
    for i, p in enumerate(op.params):
        if p.is_tensor:
            out.append(args[i])
        elif p.is_tensor_list:
            out.extend(args[i])
    return out


def _mixed_devices(op: OpDef, a: Device, b: Device) -> RuntimeError:
    return RuntimeError(f"{op.name}: expected all tensors on the same device, but found at "
                        f"least two devices, {a} and {b}")


def _common_device(op: OpDef, flat: list) -> Device:
    """The device of an op whose tensors differ in device (the rare path of ``apply``).

    As in PyTorch, 0-d CPU tensors (scalars) may join tensors of another device; any
    other mix raises a RuntimeError naming both devices.
    """
    devices = [t._device for t in flat if t is not None
               and not (t._device.type == "cpu" and t._data.ndim == 0)]
    for d in devices[1:]:
        if d != devices[0]:
            raise _mixed_devices(op, devices[0], d)
    return devices[0] if devices else cpu_device


def apply(op: OpDef, args: tuple):
    """Run ``op`` on ``args`` (table order; tensors already converted) and record it."""
    flat = args if op.all_tensors else _flat_tensors(op, args)
    device = None
    any_grad = False
    for t in flat:
        if t is None:
            continue
        d = t._device
        if device is None:
            device = d
        elif d is not device and d != device:
            device = _common_device(op, flat)
        if t._requires_grad:
            any_grad = True
    if device is None:
        device = cpu_device
    call = list(args)
    for i in op.tensor_pos:
        t = call[i]
        if t is not None:
            call[i] = t._data
    for i in op.list_pos:
        call[i] = [t._data for t in call[i]]
    kernel = op.kernels.get(device.type)
    out = (kernel if kernel is not None else op.kernel_for(device.type))(*call)
    single = not isinstance(out, (tuple, list))
    arrays = (out,) if single else tuple(out)
    base = args[op.view_of] if op.view_of is not None else None
    outputs = []
    for k, arr in enumerate(arrays):
        if isinstance(arr, np.generic):  # a kernel's 0-d result: data is always an array
            arr = np.asarray(arr)
        if base is not None and np.may_share_memory(arr, base._data):
            t = Tensor._make(arr, device=device, version_box=base._version_box,
                             base=base if base._base is None else base._base)
        else:
            t = Tensor._make(arr, device=device)
        t._output_nr = k
        outputs.append(t)
    if any_grad and op.differentiable and STATE.grad_enabled:
        _record(op, args, outputs)
    if STATE_TRACE.tracer is not None:
        STATE_TRACE.tracer.record(op, args, outputs)
    if ANOMALY.enabled:
        site = user_frame()
        if outputs and outputs[0].grad_fn is not None:
            outputs[0].grad_fn.anomaly_trace = site
        check_forward(op.name, outputs, site)
    return outputs[0] if single else tuple(outputs)


def _record(op: OpDef, args: tuple, outputs: list[Tensor]) -> None:
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


# -------------------------------------------------------------------- argument helpers
def as_tensor(value, dtype=None) -> Tensor:
    if isinstance(value, Tensor):
        return value
    from ..factories import tensor
    return tensor(value, dtype=dtype)


_SCALARS: dict = {}
_SCALAR_TYPES = (bool, int, float, np.number, np.bool_)


def scalar_constant(value, dtype: np.dtype) -> np.ndarray:
    """A read-only 0-d array for a Python scalar operand, cached for common values."""
    key = (type(value), value, dtype)
    arr = _SCALARS.get(key)
    if arr is None:
        arr = np.asarray(value, dtype=dtype)
        arr.flags.writeable = False
        if len(_SCALARS) < 1024:
            _SCALARS[key] = arr
    return arr


def promote_operands(*values) -> list[Tensor]:
    """Convert operands to tensors of one dtype: NumPy promotion, Python scalars weak."""
    if len(values) == 2:  # fast paths for the common binary cases
        a, b = values
        ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
        if ta and tb:
            if a._data.dtype == b._data.dtype:
                return [a, b]
        elif ta and type(b) is float and a._data.dtype.kind == "f":
            return [a, Tensor._make(scalar_constant(b, a._data.dtype), device=a._device)]
        elif tb and type(a) is float and b._data.dtype.kind == "f":
            return [Tensor._make(scalar_constant(a, b._data.dtype), device=b._device), b]
    tensors = [v for v in values if isinstance(v, Tensor)]
    if not tensors:
        tensors = [as_tensor(values[0])]
        values = (tensors[0],) + values[1:]
    dts = [t._data.dtype for t in tensors]
    dtype = dts[0] if all(d == dts[0] for d in dts) else dtypes.promote(*dts)
    for v in values:
        if not isinstance(v, Tensor):
            if isinstance(v, _SCALAR_TYPES):
                dtype = dtypes.as_dtype(np.result_type(dtype, v))
            else:
                dtype = dtypes.promote(dtype, as_tensor(v)._data.dtype)
    device = tensors[0]._device
    out = []
    for v in values:
        if isinstance(v, Tensor):
            out.append(v if v._data.dtype == dtype else _cast(v, dtype))
        elif isinstance(v, _SCALAR_TYPES):
            out.append(Tensor._make(scalar_constant(v, dtype), device=device))
        else:
            out.append(_cast(as_tensor(v), dtype))
    return out


def _cast(t: Tensor, dtype: np.dtype) -> Tensor:
    return _ops.to_dtype(t, dtype)
