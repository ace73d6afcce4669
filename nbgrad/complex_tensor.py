"""Complex values for :mod:`nbgrad.fft`: :class:`ComplexTensor`, a thin wrapper of a real
float tensor of *pairs* (shape ``S + (2,)``: real, imaginary), ``torch.view_as_real``'s
layout. nbgrad has no complex dtype; every operation here is a real table op on the pairs,
so it differentiates to any order and runs natively under ``nbgrad.jit``.

Gradients follow PyTorch's convention: ``z.grad = dL/dRe(z) + i dL/dIm(z)`` for a real
loss ``L``. Operations not defined here raise a ``TypeError`` naming them; nothing drops
an imaginary part silently.
"""

from __future__ import annotations

import builtins
import numbers
from typing import Any

import numpy as np

from . import factories, ops, pytree
from .grad_mode import STATE
from .tensor import STATE_TRACE, Tensor

__all__ = ["ComplexTensor", "complex", "view_as_complex", "view_as_real"]

_HINT = "use .real/.imag/abs() or view_as_real"


def _unsupported(op: str) -> TypeError:
    return TypeError(f"nbgrad: {op} does not take complex tensors; {_HINT}")


class ComplexTensor:
    """A complex tensor of shape ``S``, held as real pairs ``(S..., 2)`` (see the module)."""

    is_complex_tensor = True  # read by Tensor's operators and the argument checks
    __array_priority__ = 1001  # above Tensor's: NumPy and Tensor defer to our operators
    __slots__ = ("_pairs",)

    def __init__(self, pairs: Tensor) -> None:
        if not isinstance(pairs, Tensor) or pairs.dtype.kind != "f" or pairs.ndim < 1 \
                or pairs.shape[-1] != 2:
            got = f"shape {tuple(pairs.shape)} {pairs.dtype}" if isinstance(pairs, Tensor) \
                else type(pairs).__name__
            raise TypeError(f"view_as_complex: expects a float tensor of shape (..., 2), got "
                            f"{got}")
        self._pairs = pairs

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._pairs.shape[:-1])

    @property
    def ndim(self) -> int:
        return self._pairs.ndim - 1

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.complex64 if self._pairs.dtype == np.float32 else np.complex128)

    @property
    def size(self) -> int:
        return self._pairs.size // 2

    def numel(self) -> int:
        return self.size

    def dim(self) -> int:
        return self.ndim

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d complex tensor")
        return self.shape[0]

    @property
    def device(self):
        return self._pairs.device

    def is_complex(self) -> bool:
        return True

    # ------------------------------------------------------------------ autograd
    @property
    def requires_grad(self) -> bool:
        return self._pairs.requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._pairs.requires_grad = value

    def requires_grad_(self, value: bool = True) -> ComplexTensor:
        self._pairs.requires_grad_(value)
        return self

    @property
    def is_leaf(self) -> bool:
        return self._pairs.is_leaf

    @property
    def grad(self) -> ComplexTensor | None:
        """``dL/dRe + i dL/dIm`` (PyTorch's convention), or None."""
        g = self._pairs.grad
        return None if g is None else ComplexTensor(g)

    @grad.setter
    def grad(self, value) -> None:
        self._pairs.grad = None if value is None else _pairs_of(value, "grad")

    def detach(self) -> ComplexTensor:
        return ComplexTensor(self._pairs.detach())

    def backward(self, *args, **kwargs) -> None:
        raise RuntimeError("backward: grad can be implicitly created only for real scalar "
                           "outputs; reduce the complex result to a real one first (e.g. "
                           ".abs().sum(), .real.sum())")

    # ------------------------------------------------------------------ values
    def numpy(self) -> np.ndarray:
        p = self._pairs.numpy()
        return (p[..., 0] + 1j * p[..., 1]).astype(self.dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def item(self) -> builtins.complex:
        if self.size != 1:
            raise RuntimeError(f"item(): a complex tensor with {self.size} elements cannot be "
                               "converted to a Python scalar")
        return builtins.complex(self.numpy().reshape(-1)[0])

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"complex_tensor({np.array2string(self.numpy(), separator=', ')}{grad})"

    # ------------------------------------------------------------------ parts
    @property
    def real(self) -> Tensor:
        """The real part (a differentiable real tensor)."""
        return ops.select(self._pairs, -1, 0)

    @property
    def imag(self) -> Tensor:
        """The imaginary part (a differentiable real tensor)."""
        return ops.select(self._pairs, -1, 1)

    def abs(self) -> Tensor:
        """``|z|``; its gradient is 0 where ``z`` is 0, as PyTorch's."""
        return ops.norm(self._pairs, 2, dim=-1)

    __abs__ = abs

    def angle(self) -> Tensor:
        """``atan2(imag, real)``."""
        return ops.atan2(self.imag, self.real)

    def conj(self) -> ComplexTensor:
        return ComplexTensor(ops.stack([self.real, ops.neg(self.imag)], -1))

    conj_physical = conj

    # ------------------------------------------------------------------ arithmetic
    def __neg__(self) -> ComplexTensor:
        return ComplexTensor(ops.neg(self._pairs))

    def __pos__(self) -> ComplexTensor:
        return self

    def __add__(self, other) -> ComplexTensor:
        return ComplexTensor(ops.add(self._pairs, _pairs_of(other, "add", self._pairs.dtype)))

    def __radd__(self, other) -> ComplexTensor:
        return ComplexTensor(ops.add(_pairs_of(other, "add", self._pairs.dtype), self._pairs))

    def __sub__(self, other) -> ComplexTensor:
        return ComplexTensor(ops.sub(self._pairs, _pairs_of(other, "sub", self._pairs.dtype)))

    def __rsub__(self, other) -> ComplexTensor:
        return ComplexTensor(ops.sub(_pairs_of(other, "sub", self._pairs.dtype), self._pairs))

    def __mul__(self, other) -> ComplexTensor:
        if _is_real(other):  # a real factor scales both parts
            return ComplexTensor(ops.mul(self._pairs, _real_factor(other)))
        return _product(self, ComplexTensor(_pairs_of(other, "mul", self._pairs.dtype)))

    def __rmul__(self, other) -> ComplexTensor:
        return self.__mul__(other)

    def __truediv__(self, other) -> ComplexTensor:
        if _is_real(other):
            return ComplexTensor(ops.div(self._pairs, _real_factor(other)))
        return _quotient(self, ComplexTensor(_pairs_of(other, "div", self._pairs.dtype)))

    def __rtruediv__(self, other) -> ComplexTensor:
        return _quotient(ComplexTensor(_pairs_of(other, "div", self._pairs.dtype)), self)

    def __eq__(self, other) -> Tensor:  # type: ignore[override]
        """Elementwise equality of both parts (a bool tensor)."""
        return ops.all(ops.eq(self._pairs, _pairs_of(other, "eq", self._pairs.dtype)), -1)

    def __ne__(self, other) -> Tensor:  # type: ignore[override]
        return ops.logical_not(self.__eq__(other))

    __hash__ = object.__hash__

    def __pow__(self, other):
        raise _unsupported("pow")

    def __matmul__(self, other):
        raise _unsupported("matmul")

    __rpow__ = __pow__
    __rmatmul__ = __matmul__

    # ------------------------------------------------------------------ reductions, shape
    def sum(self, dim=None, keepdim: bool = False, *, axis=None) -> ComplexTensor:
        return ComplexTensor(ops.sum(self._pairs, self._dims(dim, axis, "sum"), keepdim))

    def mean(self, dim=None, keepdim: bool = False, *, axis=None) -> ComplexTensor:
        return ComplexTensor(ops.mean(self._pairs, self._dims(dim, axis, "mean"), keepdim))

    def _dims(self, dim, axis, op: str) -> tuple[int, ...]:
        dim = axis if dim is None else dim
        if dim is None:
            return tuple(range(self.ndim))
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        out = []
        for d in dims:
            if not -self.ndim <= d < self.ndim:
                raise IndexError(f"{op}: dim {d} out of range for a complex tensor of shape "
                                 f"{self.shape}")
            out.append(int(d) % self.ndim)
        return tuple(out)

    def reshape(self, *shape) -> ComplexTensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return ComplexTensor(ops.reshape(self._pairs, tuple(shape) + (2,)))

    view = reshape

    def flatten(self) -> ComplexTensor:
        return self.reshape(-1)

    def __getitem__(self, key) -> ComplexTensor:
        """Indexing on the complex dims (the pair dim stays last)."""
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            key = key + (slice(None),)
        return ComplexTensor(self._pairs[key])

    def __getattr__(self, name: str):
        if hasattr(Tensor, name) and not name.startswith("_"):
            raise _unsupported(name)
        raise AttributeError(f"'ComplexTensor' object has no attribute {name!r}")

    def __bool__(self) -> bool:
        raise _unsupported("bool()")

    # ------------------------------------------------------------------ NumPy
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        impl = _UFUNCS.get(ufunc) if method == "__call__" and not kwargs else None
        if impl is not None:
            return impl(*inputs)
        return _numpy_fallback(f"numpy.{ufunc.__name__}", getattr(ufunc, method), inputs,
                               kwargs)

    def __array_function__(self, func, types, args, kwargs):
        impl = _FUNCTIONS.get(func)
        if impl is not None:
            return impl(*args, **kwargs)
        return _numpy_fallback(f"numpy.{func.__name__}", func, args, kwargs)


# ------------------------------------------------------------------ helpers
def _is_real(x) -> bool:
    if isinstance(x, Tensor):
        return True
    if isinstance(x, np.ndarray):
        return x.dtype.kind != "c"
    return isinstance(x, numbers.Real)


def _real_factor(x) -> Tensor | float:
    """A real operand of ``*``/``/`` broadcasting against the pairs (a trailing 1)."""
    if isinstance(x, numbers.Real) and not isinstance(x, np.ndarray):
        return x
    t = x if isinstance(x, Tensor) else factories.tensor(x)
    return ops.unsqueeze(t, -1)


def _pairs_of(x, op: str, like: np.dtype | None = None) -> Tensor:
    """The pairs of a complex or real operand (real: imaginary part 0); a Python number
    takes the dtype ``like`` (weak, as in NumPy and PyTorch)."""
    if isinstance(x, ComplexTensor):
        return x._pairs
    if isinstance(x, Tensor):
        return ops.stack([x, ops.zeros_like(x)], -1)
    if isinstance(x, (numbers.Number, np.ndarray, np.generic, list)):
        arr = np.asarray(x)
        if arr.dtype.kind not in "biufc":
            raise TypeError(f"{op}: cannot combine a complex tensor with {type(x).__name__}")
        weak = like is not None and isinstance(x, (int, float, builtins.complex))
        real = arr.real.astype(like if weak else np.float32 if arr.dtype in
                               (np.complex64, np.float32) else np.float64)
        return factories.tensor(np.stack([real, np.asarray(arr.imag, real.dtype)], -1))
    raise TypeError(f"{op}: cannot combine a complex tensor with {type(x).__name__}")


def _product(a: ComplexTensor, b: ComplexTensor) -> ComplexTensor:
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    return ComplexTensor(ops.stack(list(ops.broadcast_tensors(ar * br - ai * bi,
                                                              ar * bi + ai * br)), -1))


def _quotient(a: ComplexTensor, b: ComplexTensor) -> ComplexTensor:
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    d = br * br + bi * bi
    return ComplexTensor(ops.stack(list(ops.broadcast_tensors((ar * br + ai * bi) / d,
                                                              (ai * br - ar * bi) / d)), -1))


def _numpy_fallback(name: str, call, args: tuple, kwargs: dict) -> Any:
    """NumPy on the values, unless that would drop a gradient or a trace (as for Tensor)."""
    found = [a for a in (*args, *kwargs.values()) if isinstance(a, (ComplexTensor, Tensor))]
    if STATE_TRACE.tracer is not None or (STATE.grad_enabled and
                                          any(t.requires_grad for t in found)):
        raise TypeError(f"{name} is not supported on a complex tensor that requires grad or "
                        f"inside nbgrad.jit; {_HINT}, or convert explicitly: "
                        "z.detach().numpy()")
    plain = [np.asarray(a) if isinstance(a, (ComplexTensor, Tensor)) else a for a in args]
    return call(*plain, **{k: np.asarray(v) if isinstance(v, (ComplexTensor, Tensor)) else v
                           for k, v in kwargs.items()})


def _as_complex(x) -> ComplexTensor:
    return x if isinstance(x, ComplexTensor) else ComplexTensor(_pairs_of(x, "numpy"))


_UFUNCS = {
    np.add: lambda a, b: _as_complex(a) + b, np.subtract: lambda a, b: _as_complex(a) - b,
    np.multiply: lambda a, b: _as_complex(a) * b,
    np.divide: lambda a, b: _as_complex(a) / b, np.negative: lambda a: -a,
    np.conjugate: lambda a: a.conj(), np.absolute: lambda a: a.abs(),
}
_FUNCTIONS = {
    np.real: lambda a: a.real, np.imag: lambda a: a.imag, np.angle: lambda z, deg=False:
    z.angle() * (180 / np.pi) if deg else z.angle(), np.conj: lambda a: a.conj(),
    np.sum: lambda a, axis=None, keepdims=False: a.sum(axis, keepdims),
    np.mean: lambda a, axis=None, keepdims=False: a.mean(axis, keepdims),
    np.reshape: lambda a, shape: a.reshape(shape), np.shape: lambda a: a.shape,
    np.ndim: lambda a: a.ndim, np.size: lambda a: a.size,
}


# ------------------------------------------------------------------ constructors
def view_as_real(z: ComplexTensor) -> Tensor:
    """The pairs ``(..., 2)`` of a complex tensor (the same tensor, as PyTorch's view)."""
    if not isinstance(z, ComplexTensor):
        raise TypeError(f"view_as_real: expects a complex tensor, got {type(z).__name__}")
    return z._pairs


def view_as_complex(t: Tensor) -> ComplexTensor:
    """The complex tensor whose pairs ``(..., 2)`` are ``t`` (float32 or float64)."""
    return ComplexTensor(t)


def complex(real: Tensor, imag: Tensor) -> ComplexTensor:  # noqa: A001 - torch's name
    """``real + i imag`` (broadcast; both real float tensors of one dtype)."""
    real, imag = factories.as_tensor(real), factories.as_tensor(imag)
    if real.dtype.kind != "f" or real.dtype != imag.dtype:
        raise TypeError(f"complex: expects real and imag of one float dtype, got {real.dtype} "
                        f"and {imag.dtype}")
    return ComplexTensor(ops.stack(list(ops.broadcast_tensors(real, imag)), -1))


def _from_data(data: Any, dtype: Any, requires_grad: bool) -> ComplexTensor | None:
    """``nbgrad.tensor`` of complex data (or a complex ``dtype``); None if neither."""
    try:
        want = None if dtype is None else np.dtype(dtype)
        arr = np.asarray(data.numpy() if isinstance(data, ComplexTensor) else data)
    except (TypeError, ValueError):
        return None  # the real path's error stands
    if arr.dtype.kind != "c" and (want is None or want.kind != "c"):
        return None
    for dt in (arr.dtype, want):  # no silent precision loss (as float128 raises)
        if dt is not None and dt.kind == "c" and dt not in (np.complex64, np.complex128):
            raise TypeError(f"nbgrad: dtype {dt} is not supported (use complex64 or "
                            "complex128)")
    arr = arr.astype(want if want is not None and want.kind == "c" else
                     (np.complex64 if arr.dtype == np.complex64 else np.complex128))
    real = np.float32 if arr.dtype == np.complex64 else np.float64
    pairs = np.ascontiguousarray(np.stack([arr.real, arr.imag], -1).astype(real))
    return ComplexTensor(factories.tensor(pairs, requires_grad=requires_grad))


factories.COMPLEX_DATA[0] = _from_data
pytree.register_node(ComplexTensor, lambda z: (z._pairs,), lambda kids: ComplexTensor(kids[0]))
