"""The Tensor: an array, its autograd metadata and its version counter."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes
from .backends import to_device, to_host
from .device import Device, cpu_device

# The layers above install what tensors need from them when they are imported; this
# module imports none of them (tensor -> ops -> autograd is a one-way chain).
_OPS: Any = None  # the nbgrad.ops package: operators, .T, .to() (see install_ops)
_BACKWARD: Callable | None = None  # nbgrad.autograd's backward (see install_autograd)
_RETAIN_GRAD: Callable | None = None  # keeps a non-leaf's .grad (nbgrad.autograd.node)


class _NotLean:
    """The operators' op before :mod:`nbgrad.ops.elementwise` installs it: no lean path."""

    @staticmethod
    def lean_apply(*args) -> None:
        return None

    lean_reflected = lean_apply


#: the ops of ``+ - * / ** -``, whose lean paths (``OpDef.lean_apply``, and
#: ``lean_reflected`` for ``scalar op tensor``) the operators try first; each answers
#: None outside its common case (see install_lean)
_LEAN_OPS: dict[str, Any] = dict.fromkeys(("add", "sub", "mul", "div", "pow", "neg"), _NotLean)


def install_ops(ops: Any) -> None:
    """Called by :mod:`nbgrad.ops` at import: the namespace the operators dispatch to."""
    global _OPS
    _OPS = ops


def install_lean(ops: dict[str, Any]) -> None:
    """Called by :mod:`nbgrad.ops.elementwise` at import: the ops of the operators, whose
    lean paths they try first (the ops' public functions, which try them too, take every
    other case)."""
    _LEAN_OPS.update(ops)


def install_autograd(backward: Callable, retain_grad: Callable) -> None:
    """Called by :mod:`nbgrad.autograd` at import: ``Tensor.backward`` and ``retain_grad``."""
    global _BACKWARD, _RETAIN_GRAD
    _BACKWARD = backward
    _RETAIN_GRAD = retain_grad


class RemovableHandle:
    """Returned by ``register_hook``; ``remove()`` takes the hook away again."""

    __slots__ = ("_hooks", "_key")

    def __init__(self, hooks: dict, key: int) -> None:
        self._hooks = hooks
        self._key = key

    def remove(self) -> None:
        self._hooks.pop(self._key, None)


_hook_ids = iter(range(1, 1 << 62))


def to_array(data: Any, dtype: Any = None) -> np.ndarray:
    """A C-contiguous array of a supported dtype holding a copy of ``data``."""
    if isinstance(data, Tensor):
        data = data.numpy()
    if data is None:
        raise TypeError("nbgrad.tensor(): data must be a number, a nested list or an array, "
                        "not None")
    if isinstance(data, str):
        raise TypeError(f"nbgrad.tensor(): cannot make a tensor from the string {data!r}")
    if not isinstance(data, (np.ndarray, np.generic, list, tuple, int, float, complex)):
        data = _array_protocol(data)
    try:
        arr = np.array(data, copy=True, order="C")
    except (ValueError, TypeError) as exc:
        raise TypeError(f"nbgrad.tensor(): cannot make a tensor from {type(data).__name__}: "
                        f"{exc}") from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise TypeError(f"nbgrad.tensor(): data of kind {arr.dtype} (e.g. strings or mixed "
                        "types) cannot be a tensor")
    target = dtypes.as_dtype(dtype if dtype is not None else arr.dtype)
    if arr.dtype != target:
        arr = arr.astype(target)
    return arr


def _array_protocol(data: Any) -> Any:
    """An array from an object with ``__array__`` (called without the ``copy`` keyword,
    which older implementations lack) or, failing that, ``__dlpack__``; else ``data``."""
    if hasattr(data, "__array__"):
        try:
            return np.asarray(data.__array__())
        except TypeError:
            return data
    if hasattr(data, "__dlpack__"):
        return np.from_dlpack(data)
    return data


class Tensor:
    """An n-dimensional array that can record the operations applied to it."""

    __slots__ = ("_data", "_requires_grad", "grad", "grad_fn", "_output_nr", "_version_box",
                 "_base", "_accumulator", "_retains_grad", "_hooks", "_device", "__weakref__")
    __array_priority__ = 1000  # NumPy defers to our operators (and __array_ufunc__)

    def __init__(self, data: Any, dtype: Any = None, requires_grad: bool = False,
                 device: Any = "cpu") -> None:
        self._init_from(to_array(data, dtype), requires_grad, Device.of(device))

    def _init_from(self, array, requires_grad: bool, device: Device) -> None:
        self._data = array
        self.grad = None
        self.grad_fn = None
        self._output_nr = 0
        self._version_box = [0]
        self._base = None
        self._accumulator = None
        self._retains_grad = False
        self._hooks = None
        self._device = device
        self._requires_grad = False
        if device.type != "cpu":
            self._data = to_device(array, device)
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _make(cls, data, requires_grad: bool = False, grad_fn=None, output_nr: int = 0,
              device: Device = cpu_device, version_box: list | None = None,
              base: Tensor | None = None) -> Tensor:
        """Wrap an array without checks (the fast path used by the ops; with only
        ``data``, :func:`wrap_array` does the same faster: keep the two in step)."""
        t = object.__new__(cls)
        t._data = data
        t._requires_grad = requires_grad
        t.grad = None
        t.grad_fn = grad_fn
        t._output_nr = output_nr
        t._version_box = [0] if version_box is None else version_box
        t._base = base
        t._accumulator = None
        t._retains_grad = False
        t._hooks = None
        t._device = device
        return t

    # ------------------------------------------------------------------ attributes
    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def size(self) -> int:
        """Number of elements (NumPy's ``size``)."""
        return self._data.size

    def numel(self) -> int:
        return self._data.size

    def dim(self) -> int:
        return self._data.ndim

    @property
    def device(self) -> Device:
        return self._device

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self.requires_grad_(flag)

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def output_nr(self) -> int:
        return self._output_nr

    @property
    def _version(self) -> int:
        return self._version_box[0]

    @property
    def data(self) -> Tensor:
        return self.detach()

    @property
    def T(self) -> Tensor:  # noqa: N802 - the conventional name
        return _OPS.permute(self, tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self) -> Tensor:  # noqa: N802
        return _OPS.transpose(self, -2, -1)

    @property
    def H(self) -> Tensor:  # noqa: N802 - the conjugate transpose (of a real matrix: T)
        if self.ndim > 2:
            raise RuntimeError(f"H: needs a matrix or a vector, got shape {self.shape}")
        return self.T

    @property
    def mH(self) -> Tensor:  # noqa: N802
        return self.mT

    @property
    def is_cuda(self) -> bool:
        return self._device.type == "cuda"

    # ------------------------------------------------------------------ conversion
    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (shares memory on the CPU)."""
        _check_concrete(self, "numpy()")
        if self._device.type != "cpu":
            return to_host(self._data)
        return self._data

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        arr = self.numpy()
        if dtype is not None and arr.dtype != dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """NumPy ufuncs on tensors run nbgrad ops (:mod:`nbgrad.numpy_interop`)."""
        return _interop().array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        """NumPy functions on tensors run nbgrad ops (:mod:`nbgrad.numpy_interop`)."""
        return _interop().array_function(func, types, args, kwargs)

    def item(self) -> float | int | bool:
        _check_concrete(self, "item()")
        if self.size != 1:
            raise RuntimeError(f"item(): a tensor with {self.size} elements cannot be "
                               "converted to a Python scalar")
        return self.numpy().reshape(()).item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu" or self.size != 1:
            raise TypeError("only integer tensors of one element can be used as an index")
        return int(self.item())

    def __bool__(self) -> bool:
        _check_concrete(self, "a branch on a tensor's value (bool())")
        if self.size != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.size} elements is "
                               "ambiguous; use .any() or .all()")
        return bool(self.item())

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        extras = []
        if self._device.type != "cpu":
            extras.append(f"device='{self._device}'")
        if self.dtype not in (dtypes.float64, dtypes.int64, dtypes.bool_):
            extras.append(f"dtype={self.dtype.name}")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{self.grad_fn.name()}>")
        elif self._requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + ", ".join([body, *extras]) + ")"

    def __dlpack__(self, *args, **kwargs):
        """Export the data without a copy (``torch.from_dlpack(t)``, ``np.from_dlpack(t)``,
        ``jax.dlpack.from_dlpack(t)``); the importer shares this tensor's memory."""
        return self.numpy().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.numpy().__dlpack_device__()

    # ------------------------------------------------------------------ autograd
    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if requires_grad and not dtypes.is_floating(self.dtype):
            raise TypeError(f"only floating-point tensors can require gradients; "
                            f"this one is {self.dtype}")
        if not self.is_leaf:
            if not requires_grad:
                raise RuntimeError("you can only change requires_grad flags of leaf tensors; "
                                   "use detach() for a non-leaf tensor")
            return self
        self._requires_grad = bool(requires_grad)
        return self

    def detach(self) -> Tensor:
        """A tensor sharing this one's data (and version counter), outside the graph."""
        tracer = STATE_TRACE.tracer
        if tracer is not None:  # nbgrad.jit: a StopGradient marker where a gradient flows
            t = tracer.detach(self)
            if t is not None:
                return t
        return Tensor._make(self._data, device=self._device, version_box=self._version_box,
                            base=self)

    def detach_(self) -> Tensor:
        self.grad_fn = None
        self._requires_grad = False
        return self

    def retain_grad(self) -> None:
        """Keep ``.grad`` for this non-leaf tensor after backward."""
        if self.is_leaf:
            return
        if not self._requires_grad:
            raise RuntimeError("retain_grad() on a tensor that does not require grad")
        if self._retains_grad:
            return
        self._retains_grad = True
        _RETAIN_GRAD(self)

    def register_hook(self, hook: Callable[[Tensor], Tensor | None]) -> RemovableHandle:
        """Call ``hook(grad)`` when this tensor's gradient is computed; it may return a new one."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that does not require grad")
        key = next(_hook_ids)
        if self.grad_fn is None:
            if self._hooks is None:
                self._hooks = {}
            hooks = self._hooks
        else:
            hooks = self.grad_fn.tensor_pre_hooks(self._output_nr)
        hooks[key] = hook
        return RemovableHandle(hooks, key)

    def backward(self, gradient: Tensor | None = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs=None) -> None:
        _BACKWARD(self, gradient, retain_graph=retain_graph, create_graph=create_graph,
                  inputs=inputs)

    # ------------------------------------------------------------------ devices
    def to(self, *args, **kwargs) -> Tensor:
        """``to(device)``, ``to(dtype)`` or ``to(device, dtype)``."""
        return _OPS.to(self, *args, **kwargs)

    def cpu(self) -> Tensor:
        return self.to("cpu")

    def cuda(self) -> Tensor:
        return self.to("cuda")

    def float(self, memory_format=None) -> Tensor:
        return self.to(dtypes.float32)

    def double(self, memory_format=None) -> Tensor:
        return self.to(dtypes.float64)

    def long(self, memory_format=None) -> Tensor:
        return self.to(dtypes.int64)

    def int(self, memory_format=None) -> Tensor:
        return self.to(dtypes.int32)

    def bool(self, memory_format=None) -> Tensor:
        return self.to(dtypes.bool_)

    def type_as(self, other: Tensor) -> Tensor:
        return self.to(other.dtype)

    # ------------------------------------------------------------------ operators
    def __add__(self, other):
        out = _LEAN_OPS["add"].lean_apply(self, other)
        if out is None and getattr(other, "is_complex_tensor", False):
            return NotImplemented  # ComplexTensor's reflected operator
        return _OPS.add(self, other) if out is None else out

    def __radd__(self, other):
        out = _LEAN_OPS["add"].lean_reflected(self, other)
        return _OPS.add(other, self) if out is None else out

    def __sub__(self, other):
        out = _LEAN_OPS["sub"].lean_apply(self, other)
        if out is None and getattr(other, "is_complex_tensor", False):
            return NotImplemented  # ComplexTensor's reflected operator
        return _OPS.sub(self, other) if out is None else out

    def __rsub__(self, other):
        out = _LEAN_OPS["sub"].lean_reflected(self, other)
        return _OPS.sub(other, self) if out is None else out

    def __mul__(self, other):
        out = _LEAN_OPS["mul"].lean_apply(self, other)
        if out is None and getattr(other, "is_complex_tensor", False):
            return NotImplemented  # ComplexTensor's reflected operator
        return _OPS.mul(self, other) if out is None else out

    def __rmul__(self, other):
        out = _LEAN_OPS["mul"].lean_reflected(self, other)
        return _OPS.mul(other, self) if out is None else out

    def __truediv__(self, other):
        out = _LEAN_OPS["div"].lean_apply(self, other)
        if out is None and getattr(other, "is_complex_tensor", False):
            return NotImplemented  # ComplexTensor's reflected operator
        return _OPS.div(self, other) if out is None else out

    def __rtruediv__(self, other):
        out = _LEAN_OPS["div"].lean_reflected(self, other)
        return _OPS.div(other, self) if out is None else out

    __rdiv__ = __rtruediv__  # the Python 2 name, still called by PyTorch-style code

    def __pow__(self, other):
        out = _LEAN_OPS["pow"].lean_apply(self, other)
        return _OPS.pow(self, other) if out is None else out

    def __rpow__(self, other):
        return _OPS.pow(other, self)

    def __matmul__(self, other):
        return _OPS.matmul(self, other)

    def __rmatmul__(self, other):
        return _OPS.matmul(other, self)

    def __floordiv__(self, other):
        return _OPS.floor_divide(self, other)

    def __rfloordiv__(self, other):
        return _OPS.floor_divide(other, self)

    def __mod__(self, other):
        return _OPS.remainder(self, other)

    def __rmod__(self, other):
        return _OPS.remainder(other, self)

    def __neg__(self):
        out = _LEAN_OPS["neg"].lean_apply(self)
        return _OPS.neg(self) if out is None else out

    def __pos__(self):
        return self

    def __abs__(self):
        return _OPS.abs(self)

    # & | ^ ~ are bitwise, as in NumPy and PyTorch (logical on bools; floats refused)
    def __invert__(self):
        return _OPS.bitwise_not(self)

    def __and__(self, other):
        return _OPS.bitwise_and(self, other)

    def __or__(self, other):
        return _OPS.bitwise_or(self, other)

    def __xor__(self, other):
        return _OPS.bitwise_xor(self, other)

    def __lshift__(self, other):
        return _OPS.bitwise_left_shift(self, other)

    def __rshift__(self, other):
        return _OPS.bitwise_right_shift(self, other)

    def __rand__(self, other):  # True & t
        return _OPS.bitwise_and(other, self)

    def __ror__(self, other):
        return _OPS.bitwise_or(other, self)

    def __rxor__(self, other):
        return _OPS.bitwise_xor(other, self)

    def __rlshift__(self, other):
        return _OPS.bitwise_left_shift(other, self)

    def __rrshift__(self, other):
        return _OPS.bitwise_right_shift(other, self)

    def __eq__(self, other):  # type: ignore[override]
        return _OPS.eq(self, other)

    def __ne__(self, other):  # type: ignore[override]
        return _OPS.ne(self, other)

    def __lt__(self, other):
        return _OPS.lt(self, other)

    def __le__(self, other):
        return _OPS.le(self, other)

    def __gt__(self, other):
        return _OPS.gt(self, other)

    def __ge__(self, other):
        return _OPS.ge(self, other)

    def __getitem__(self, index):
        return _OPS.index(self, index)

    @property
    def at(self) -> Any:
        """JAX's functional updates: ``x.at[idx].set(v)``, ``.add(v)``, ``.multiply(v)``,
        ``.min(v)``, ``.max(v)``, ``.get()`` return new tensors (:mod:`nbgrad.ops.at`)."""
        return _OPS.AtIndexer(self)

    def __setitem__(self, index, value) -> None:
        _OPS.index_put_(self, index, value)

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)


_INTEROP = None


def _interop():
    """The NumPy protocol module, imported on first use (it loads scipy.special)."""
    global _INTEROP
    if _INTEROP is None:
        from . import numpy_interop
        _INTEROP = numpy_interop
    return _INTEROP


def _check_concrete(t: Tensor, what: str) -> None:
    """Raise under ``nbgrad.jit`` tracing, where a tensor's value is not known yet."""
    tracer = STATE_TRACE.tracer
    if tracer is not None and tracer.is_traced(t):
        tracer.refuse(what)


class _TraceState(threading.local):
    tracer = None  # set by nbgrad.jit while it traces this thread's function


STATE_TRACE = _TraceState()


class _Tracers:
    """How many tracers are installed, over all threads (:func:`tracer_installed` and
    :func:`tracer_removed`): while none is, no thread's ``STATE_TRACE.tracer`` is set,
    and the lean dispatch path skips reading that thread-local (a tenth of a small op)."""

    active = 0
    lock = threading.Lock()


TRACERS = _Tracers


def tracer_installed() -> None:
    """Count a tracer in (``Tracer.__enter__``, before it sets ``STATE_TRACE.tracer``)."""
    with _Tracers.lock:
        _Tracers.active += 1


def tracer_removed() -> None:
    """Count a tracer out (``Tracer.__exit__``, after it has restored the previous one)."""
    with _Tracers.lock:
        _Tracers.active -= 1


def wrap_array(data: np.ndarray) -> Tensor:
    """``Tensor._make(data)``, a CPU tensor without history around ``data``, with less
    call overhead (the lean dispatch path makes one per op)."""
    t = _new(Tensor)
    t._data = data
    t._requires_grad = False
    t.grad = None
    t.grad_fn = None
    t._output_nr = 0
    t._version_box = [0]
    t._base = None
    t._accumulator = None
    t._retains_grad = False
    t._hooks = None
    t._device = cpu_device
    return t


_new = object.__new__
