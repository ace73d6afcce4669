"""Eager dispatch: run an op's kernel, wrap the outputs, hand them to the recorder.

:func:`apply` is the one path every op takes. It checks devices, calls the kernel
for the tensors' device, and when gradients are needed calls the recorder that
:mod:`nbgrad.autograd` installs at import (:func:`set_recorder`; it builds the
backward node), then the tracer of :mod:`nbgrad.jit`, in anomaly mode the observer
(:func:`set_observer`) and, while a forward-mode level is open, the tangent hook
(:func:`set_forward`). This package never imports ``nbgrad.autograd``.
:func:`lean_path` makes an elementwise op's shortcut (``OpDef.lean_apply``) for the common
case (no hooks, contiguous CPU float tensors of one dtype): the same outputs and record,
less checking.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .. import dtypes
from .. import ops as _ops  # noqa: E402 - the package, resolved at call time
from ..device import Device, cpu_device
from ..factories import tensor as _new_tensor
from ..grad_mode import STATE
from ..kernels import elementwise as ew
from ..tensor import STATE_TRACE, TRACERS, Tensor, wrap_array
from .registry import OpDef


def _no_recorder(op: OpDef, args: tuple, outputs: list) -> None:
    raise RuntimeError(f"{op.name}: gradients are needed but no recorder is installed "
                       "(import nbgrad.autograd)")


#: ``(op, args, outputs)``: builds the backward node; installed by nbgrad.autograd
_recorder: Callable[[OpDef, tuple, list], None] = _no_recorder
#: ``(op, outputs)``: checks every op's outputs; set by anomaly mode, else None
_observer: Callable[[OpDef, list], None] | None = None
#: ``(op, args, outputs)``: pushes tangents through the op while a forward-mode level
#: is open (installed by nbgrad.autograd.forward), else None
_forward: Callable[[OpDef, tuple, list], None] | None = None
#: ``(src, dst)``: gives ``dst`` the tangents of ``src`` (in-place ops), with ``_forward``
_transfer: Callable[[Tensor, Tensor, bool], None] | None = None
#: an observer or a forward hook is installed (the lean path then steps aside)
_hooked = False


def set_recorder(record: Callable[[OpDef, tuple, list], None]) -> None:
    """Install the hook that records an op application for backward (nbgrad.autograd)."""
    global _recorder
    _recorder = record


def set_observer(observe: Callable[[OpDef, list], None] | None) -> None:
    """Install (or with None remove) the hook called with every op's outputs."""
    global _observer, _hooked
    _observer = observe
    _hooked = _observer is not None or _forward is not None


def set_forward(hook: Callable[[OpDef, tuple, list], None] | None,
                transfer: Callable[[Tensor, Tensor, bool], None] | None = None) -> None:
    """Install (or with None remove) the forward-mode hook called after every op, and the
    function that moves a tensor's tangents to the tensor standing for it."""
    global _forward, _transfer, _hooked
    _forward, _transfer = hook, transfer
    _hooked = _observer is not None or _forward is not None


def transfer_tangent(src: Tensor, dst: Tensor, replace: bool = False) -> None:
    """Give ``dst`` the tangents of ``src`` while forward mode is on (else nothing);
    ``replace``: ``dst`` now holds ``src``'s value (an in-place op)."""
    if _transfer is not None:
        _transfer(src, dst, replace)


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
        elif not op.params[i].optional:  # a kernel would read an absent tensor as empty
            raise TypeError(f"{op.name}(): argument '{op.params[i].name}' (position {i + 1}) "
                            "must be a tensor, not None")
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
        _recorder(op, args, outputs)
    if STATE_TRACE.tracer is not None:
        STATE_TRACE.tracer.record(op, args, outputs)
    if _observer is not None:
        _observer(op, outputs)
    if _forward is not None:
        _forward(op, args, outputs)
    return outputs[0] if single else tuple(outputs)


# -------------------------------------------------------------------- the lean path
_F64, _F32 = np.dtype(np.float64), np.dtype(np.float32)
#: per dtype, the 0-d tensors of Python scalar operands on the lean path (read-only) and
#: their data as 1-element arrays (writable copies: kernels then take the signature of
#: two writable arrays, compiled once for all), by value (a zero by its sign): never
#: given to the caller, never written, so shared between ops
_CONSTANTS: dict = {_F64: {}, _F32: {}}
#: ``id(tensor)`` -> ``(tensor, flat data)`` of the cached constants: a formula's 0-d
#: constant operand (``grad * other``) is given to the kernel without a reshape
_FLAT: dict = {}


def _constant(value: float, dt: np.dtype) -> tuple:
    """``(tensor, flat data)`` of the lean path's constant ``value`` of dtype ``dt``."""
    key = value if value else ("zero", math.copysign(1.0, value))
    table = _CONSTANTS[dt]
    pair = table.get(key)
    if pair is None:
        o = Tensor._make(scalar_constant(value, dt))
        pair = (o, np.array(o._data).reshape(1))
        if len(table) < 1024 and value == value:  # a NaN key would never be found again
            table[key] = pair
            _FLAT[id(o)] = pair  # o lives in the table: its id is never reused
    return pair


#: Python ints in this range convert to float64 exactly, so ``float(i)`` rounds to
#: float32 as NumPy's conversion of ``i`` does (wider ints take the general path)
_EXACT_INT = 2 ** 53


def _weak_scalar(other) -> float | None:
    """A Python scalar operand as the float the general path makes of it (NumPy's weak
    promotion keeps a float tensor's dtype for float, int and bool scalars), else None."""
    t = type(other)
    if t is float:
        return other
    if (t is int and -_EXACT_INT <= other <= _EXACT_INT) or t is bool:
        return float(other)
    return None


_NDARRAY = np.ndarray


def lean_path(op: OpDef, ufunc, arity: str) -> Callable:
    """``op``'s lean path (``OpDef.lean_apply``, ``lean_reflected``): what :func:`apply`
    gives in the common case, else None (take the general path). ``arity``: ``"unary"``
    (``apply(self)``), ``"binary"`` (``apply(self, other)``) or ``"reflected"``
    (``apply(self, other)`` for ``other op self``, ``other`` a Python scalar: ``2 * x``).

    The common case: no tracer, anomaly observer or forward-mode level; C-contiguous CPU
    tensors of one float dtype (float64, float32) on plain NumPy arrays; for a binary op
    ``other`` a tensor that broadcasts to ``self``'s shape, or a weak Python scalar (as in
    :func:`promote_operands`; its cached 0-d constant, :func:`_constant`). Small arrays
    run ``ufunc`` (the op's exact ufunc; None where NumPy lacks ``ew.QUIET``'s error
    state) in ``ew.QUIET_RUN``, others the op's lean kernel (``OpDef.lean``). The
    recorder gets exactly what ``apply`` gives it, the constant first for a reflected op.
    """
    kernel, unary, swap = op.lean, arity == "unary", arity == "reflected"
    run, small = ew.QUIET_RUN, ew.UFUNC_MAX

    def apply(self, other=None):
        if (_hooked or (TRACERS.active and STATE_TRACE.tracer is not None)
                or not isinstance(self, Tensor) or self._device is not cpu_device):
            return None
        x = self._data
        dt = x.dtype
        if not ((dt is _F64 or dt is _F32) and type(x) is _NDARRAY and x.flags.c_contiguous):
            return None
        flat = None
        if unary:
            o = y = None
        elif isinstance(other, Tensor):
            y = other._data
            if other is not self and (
                    swap or other._device is not cpu_device or y.dtype is not dt
                    or type(y) is not _NDARRAY or (y.ndim and (not y.flags.c_contiguous or (
                        y.shape != x.shape and not _broadcasts_to(y.shape, x.shape))))):
                return None
            if not y.ndim:
                pair = _FLAT.get(id(other))
                if pair is not None and pair[0] is other:
                    flat = pair[1]
            o = other
        else:  # a Python scalar: its cached constant
            pair = _lean_constant(other, dt)
            if pair is None:
                return None
            o, flat = pair
            y = o._data
        if ufunc is not None and x.size < small and x.ndim:
            try:
                r = run(ufunc, x) if unary else run(ufunc, y, x) if swap else run(ufunc, x, y)
            except RuntimeError:  # another thread is in QUIET_RUN's context: the kernel
                # (on a small array, the same ufunc with the error state set around it)
                r = kernel(x) if unary else kernel(x, y, flat, swap)
        else:
            r = kernel(x) if unary else kernel(x, y, flat, swap)
        out = wrap_array(r)
        if ((self._requires_grad or (o is not None and o._requires_grad))
                and STATE.grad_enabled and op.differentiable):
            (op.run_record or _recorder)(
                op, (self,) if unary else (o, self) if swap else (self, o), [out])
        return out

    apply.__name__ = apply.__qualname__ = f"lean_{op.name}"
    return apply


def _lean_constant(other, dt: np.dtype) -> tuple[Tensor, np.ndarray] | None:
    """The cached 0-d constant of a Python scalar ``other`` in dtype ``dt`` and its flat
    copy (:func:`_constant`), or None where ``other`` is not a weak scalar."""
    t = type(other)
    if t is float or (t is int and -_EXACT_INT <= other <= _EXACT_INT):
        # a nonzero scalar's cached pair without a call (``_constant``'s key; an exact
        # int finds the float equal to it, which is the value it converts to)
        if other:
            pair = _CONSTANTS[dt].get(other)
            if pair is not None:
                return pair
        other = float(other)
    else:
        other = _weak_scalar(other)
        if other is None:
            return None
    return _constant(other, dt)


#: binary op name -> its exact ufunc (``ScalarOp.ufunc``) for :func:`apply_lean_inplace`
_INPLACE_UFUNCS: dict = {}


def apply_lean_inplace(name: str, self, other) -> Tensor | None:
    """``self.<name>_(other)`` in the common case where no gradient is involved (grad
    mode off, or neither operand needs one; no tracer, anomaly observer or forward-mode
    level): the op's exact ufunc writes into ``self``'s memory (one pass, where the
    general path computes a new array and copies it in), and the version counter shared
    with the views goes up. ``self`` a writeable CPU float64/float32 tensor; ``other`` a
    weak Python scalar, or a CPU tensor of ``self``'s dtype that broadcasts to
    ``self``'s shape. Else None: :func:`nbgrad.ops.inplace.apply_inplace` then."""
    if (_hooked or STATE_TRACE.tracer is not None or not isinstance(self, Tensor)
            or self._device is not cpu_device):
        return None
    x = self._data
    dt = x.dtype
    if not (dt is _F64 or dt is _F32) or not x.flags.writeable:
        return None
    grad = STATE.grad_enabled
    if isinstance(other, Tensor):
        y = other._data
        if (other._device is not cpu_device or y.dtype is not dt
                or (grad and (self._requires_grad or other._requires_grad))
                or (y.shape != x.shape and not _broadcasts_to(y.shape, x.shape))):
            return None
    else:
        y = _weak_scalar(other)
        if y is None or (grad and self._requires_grad):
            return None
    ufunc = _INPLACE_UFUNCS.get(name)
    if ufunc is None:  # (none where NumPy lacks the error state ``ew.QUIET`` switches)
        ufunc = ew.exact_ufunc(name) if ew.QUIET is not None else None
        if ufunc is None:
            return None
        _INPLACE_UFUNCS[name] = ufunc
    setvar, reset, quiet = ew.QUIET
    token = setvar(quiet)
    try:
        ufunc(x, dt.type(y) if type(y) is float else y, out=x)
    finally:
        reset(token)
    self._version_box[0] += 1
    return self


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    """Whether an operand of ``shape`` broadcasts to ``target`` (NumPy's rule)."""
    if len(shape) > len(target):
        return False
    return all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(target), strict=False))


# -------------------------------------------------------------------- argument helpers
def as_tensor(value, dtype=None) -> Tensor:
    if isinstance(value, Tensor):
        return value
    return _new_tensor(value, dtype=dtype)


_SCALARS: dict = {}
_SCALAR_TYPES = (bool, int, float, np.number, np.bool_)


def scalar_constant(value, dtype: np.dtype) -> np.ndarray:
    """A read-only 0-d array for a Python scalar operand, cached for common values."""
    key = (type(value), value, dtype)
    if value == 0 and isinstance(value, (float, np.floating)):
        key += (math.copysign(1.0, value),)  # -0.0 == 0.0 (and hashes alike): keep the sign
    arr = _SCALARS.get(key)
    if arr is None:
        arr = np.asarray(value, dtype=dtype)
        arr.flags.writeable = False
        if len(_SCALARS) < 1024 and value == value:  # never found again under a NaN key
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
