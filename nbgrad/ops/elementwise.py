"""Elementwise ops: unary, binary (with NumPy broadcasting), ``where``, ``lerp``, ``clamp``.

The arithmetic of each op is one scalar expression in
:mod:`nbgrad.kernels.elementwise`; this module registers a CPU kernel and a public
function for each, with NumPy's dtype rules (integer inputs of floating ops become
float64; Python scalars do not promote a float32 tensor).
"""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..kernels import elementwise as ew
from ..kernels import matrix as mk
from ..kernels import parallel
from ..kernels.layout import call_native
from ..tensor import Tensor, install_lean
from .convert import to_dtype
from .dispatch import apply, as_tensor, lean_path, promote_operands
from .registry import get, kernel, op_function
from .traits import Elementwise, NativePlan, Opaque, batching


def _out_dtype(kind: str, dtype: np.dtype) -> np.dtype:
    return dtypes.bool_ if kind == "bool" else dtype


def _prepare(kind: str, t: Tensor) -> Tensor:
    if kind == "float" and t._data.dtype.kind != "f":
        return to_dtype(t, dtypes.float64)
    return t


#: above this many elements (or from ``parallel.MIN_SIZE`` on) the lean kernels call the
#: ops' own kernels, which may run on several threads
LEAN_SIZE = 4096


def _lean_unary(name: str, kind: str):
    """The lean kernel (``OpDef.lean``) of a unary op without parameters: ``run_unary``
    less its checks, for a C-contiguous float array. (Small arrays of an op with an exact
    ufunc run it in :func:`~nbgrad.ops.dispatch.lean_path` itself; here only where NumPy
    lacks the error state ``ew.QUIET`` switches.)"""
    run, fn, to_bool, exact = ew.run_unary, None, kind == "bool", ew.quiet_ufunc(name)

    def lean(x: np.ndarray) -> np.ndarray:
        nonlocal fn
        n = x.size
        if n < ew.UFUNC_MAX and x.ndim and exact is not None:
            return exact(x)
        out_dtype = dtypes.bool_ if to_bool else x.dtype
        if n > LEAN_SIZE or n >= parallel.MIN_SIZE:
            return run(name, x, out_dtype)
        if fn is None:
            fn = ew.kernel_function("unary", name)
        out = np.empty(x.shape, out_dtype)
        if x.ndim == 1:
            fn(x, out, 0.0, 0.0)
        else:
            fn(x.reshape(-1), out.reshape(-1), 0.0, 0.0)
        return out

    return lean


def _lean_binary(name: str, kind: str):
    """The lean kernel (``OpDef.lean``) of a binary op: ``run_binary`` less its checks,
    for C-contiguous arrays ``a``, ``b`` of one float dtype, ``b`` of ``a``'s shape, 0-d
    or broadcasting to it (``run_binary`` then); ``flat``: a 0-d ``b`` as a writable
    1-element 1-d array (a cached constant) or None; ``swap``: ``b`` is the left operand
    (``b op a``, a reflected operator). (Small arrays of an op with an exact ufunc run it
    in :func:`~nbgrad.ops.dispatch.lean_path` itself; here only where NumPy lacks the
    error state ``ew.QUIET`` switches.)"""
    run, fn, empty, to_bool = ew.run_binary, None, ew.EMPTY, kind == "bool"
    exact = ew.quiet_ufunc(name)

    def lean(a: np.ndarray, b: np.ndarray, flat: np.ndarray | None = None,
             swap: bool = False) -> np.ndarray:
        nonlocal fn
        n = a.size
        if n < ew.UFUNC_MAX and a.ndim and exact is not None:
            return exact(b, a) if swap else exact(a, b)
        out_dtype = dtypes.bool_ if to_bool else a.dtype
        if n > LEAN_SIZE or n >= parallel.MIN_SIZE or (b.ndim and b.shape != a.shape):
            return run(name, b, a, out_dtype) if swap else run(name, a, b, out_dtype)
        if fn is None:
            fn = ew.kernel_function("binary", name)
        out = np.empty(a.shape, out_dtype)
        av, ov = (a, out) if a.ndim == 1 else (a.reshape(-1), out.reshape(-1))
        if b.ndim:
            fn(av, b if b.ndim == 1 else b.reshape(-1), ov, 0, empty, empty, empty)
        else:
            bv = flat if flat is not None else b.reshape(1)
            if swap:
                fn(bv, av, ov, 2, empty, empty, empty)
            else:
                fn(av, bv, ov, 1, empty, empty, empty)
        return out

    return lean


def _set_lean(op, name: str, kind: str) -> None:
    """Give ``op`` its lean kernel (``OpDef.lean``) and lean paths (``lean_apply``, and
    ``lean_reflected`` for a binary op): :func:`~nbgrad.ops.dispatch.lean_path` with
    the op's exact ufunc where NumPy has the error state it switches."""
    ufunc = ew.exact_ufunc(name) if ew.QUIET is not None else None
    if name in ew.BINARY:
        op.lean = _lean_binary(name, kind)
        op.lean_apply = lean_path(op, ufunc, "binary")
        op.lean_reflected = lean_path(op, ufunc, "reflected")
    else:
        op.lean = _lean_unary(name, kind)
        op.lean_apply = lean_path(op, ufunc, "unary")


def _lean_op(name: str):
    """The op ``name`` given its lean kernel and paths: for the functions written below
    that take the lean path like the generated ones."""
    spec = ew.BINARY.get(name) or ew.UNARY[name]
    op = get(name)
    _set_lean(op, spec.name, spec.kind)
    return op


def _register_unary(spec: ew.ScalarOp):
    name, kind = spec.name, spec.kind

    if name not in _OWN_KERNEL:
        @kernel(name, kind=Elementwise(spec))
        def unary_kernel(x, *params):
            return ew.run_unary(name, x, _out_dtype(kind, x.dtype), *map(float, params))

    op = get(name)
    if spec.params or name in _EXPLICIT:
        return None  # ops with parameters define their public function below
    _set_lean(op, name, kind)

    def unary(self):
        out = op.lean_apply(self)
        return apply(op, (_prepare(kind, as_tensor(self)),)) if out is None else out

    unary.__name__ = unary.__qualname__ = name
    unary.__doc__ = f"Elementwise ``{spec.expr}``."
    return op_function(name)(unary)


def _apply_binary(op, kind: str, self, other) -> Tensor:
    out = op.lean_apply(self, other)
    if out is not None:
        return out
    a, b = promote_operands(self, other)
    if kind == "float" and a._data.dtype.kind != "f":
        a, b = _prepare(kind, a), _prepare(kind, b)
    return apply(op, (a, b))


def _register_binary(spec: ew.ScalarOp):
    name, kind = spec.name, spec.kind

    run = ew.run_binary
    if kind == "bool":
        @kernel(name, kind=Elementwise(spec))
        def binary_kernel(a, b):
            return run(name, a, b, dtypes.bool_)
    else:
        @kernel(name, kind=Elementwise(spec))
        def binary_kernel(a, b):
            return run(name, a, b, a.dtype)

    op = get(name)
    if name in _EXPLICIT:
        return None
    _set_lean(op, name, kind)

    def binary(self, other):
        out = op.lean_apply(self, other)
        return _apply_binary(op, kind, self, other) if out is None else out

    binary.__name__ = binary.__qualname__ = name
    binary.__doc__ = f"Elementwise ``{spec.expr}`` with NumPy broadcasting."
    return op_function(name)(binary)


#: ops whose public function is written below (other arguments than (self[, other]))
_EXPLICIT = {"pow", "add", "sub", "div", "round", "neg", "bitwise_and", "bitwise_or", "bitwise_xor",
             "bitwise_left_shift", "bitwise_right_shift", "bitwise_not"}
_OWN_KERNEL = {"polygamma"}  # unary ops whose kernel is not (x, *params): defined below
_FUNCTIONS = {}
for _spec in ew.UNARY.values():
    _FUNCTIONS[_spec.name] = _register_unary(_spec)
for _spec in ew.BINARY.values():
    _FUNCTIONS[_spec.name] = _register_binary(_spec)
globals().update({k: v for k, v in _FUNCTIONS.items() if v is not None})
__all__ = sorted([k for k, v in _FUNCTIONS.items() if v is not None]
                 + ["pow", "add", "sub", "div", "round", "neg", "softplus", "clamp", "clamp_tensor",
                    "clip", "polygamma", "where", "lerp", "bitwise_and", "bitwise_or",
                    "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "bitwise_not"])


def _integers(op: str, *tensors: Tensor, bools: bool = True) -> None:
    for t in tensors:
        kind = t._data.dtype.kind
        if kind not in "iu" and not (bools and kind == "b"):
            raise TypeError(f"{op}: needs integer{' or bool' if bools else ''} tensors, got "
                            f"{t._data.dtype} (shape {tuple(t.shape)})")


def _bitwise(name: str, doc: str, bools: bool = True):
    op = get(name)

    def bitwise(self, other) -> Tensor:
        a, b = promote_operands(self, other)
        _integers(name, a, b, bools=bools)
        return apply(op, (a, b))

    bitwise.__name__ = bitwise.__qualname__ = name
    bitwise.__doc__ = doc
    return op_function(name)(bitwise)


bitwise_and = _bitwise("bitwise_and", "``self & other``, bit by bit (integers, bools).")
bitwise_or = _bitwise("bitwise_or", "``self | other``, bit by bit (integers, bools).")
bitwise_xor = _bitwise("bitwise_xor", "``self ^ other``, bit by bit (integers, bools).")
bitwise_left_shift = _bitwise("bitwise_left_shift", "``self << other`` (integers).", False)
bitwise_right_shift = _bitwise("bitwise_right_shift", "``self >> other`` (integers).", False)


@op_function("bitwise_not")
def bitwise_not(self) -> Tensor:
    """``~self``: every bit flipped (integers), or the logical not (bools)."""
    x = as_tensor(self)
    _integers("bitwise_not", x)
    if x._data.dtype.kind == "b":
        return apply(get("logical_not"), (x,))
    return apply(get("bitwise_not"), (x,))


_POW = _lean_op("pow")


@op_function("pow")
def pow(self, exponent) -> Tensor:  # noqa: A001
    """``self ** exponent`` with NumPy broadcasting."""
    return _apply_binary(_POW, "float", self, exponent)


def _scaled(other, alpha):
    """``alpha * other`` (``other`` itself when ``alpha`` is 1)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)):
        raise TypeError(f"alpha must be a number, not {type(alpha).__name__}")
    if alpha == 1:
        return other
    if isinstance(other, Tensor):
        return _apply_binary(get("mul"), "same", other, alpha)
    return as_tensor(other) * alpha if isinstance(other, np.ndarray) else other * alpha


_ADD, _SUB = _lean_op("add"), _lean_op("sub")


@op_function("add")
def add(self, other, *, alpha=1) -> Tensor:
    """``self + alpha * other`` with NumPy broadcasting (``alpha``: torch's scale)."""
    if alpha == 1 and type(alpha) is int:
        out = _ADD.lean_apply(self, other)
        if out is not None:
            return out
    return _apply_binary(_ADD, "same", self, _scaled(other, alpha))


@op_function("sub")
def sub(self, other, *, alpha=1) -> Tensor:
    """``self - alpha * other`` with NumPy broadcasting (``alpha``: torch's scale); two
    bool operands are refused, as NumPy and PyTorch refuse them."""
    if alpha == 1 and type(alpha) is int:
        out = _SUB.lean_apply(self, other)
        if out is not None:
            return out
    a, b = promote_operands(self, _scaled(other, alpha))
    if a._data.dtype.kind == "b" and b._data.dtype.kind == "b":
        raise TypeError("sub: subtracting bool tensors is not supported; use ^ "
                        "(bitwise_xor) or logical_xor")
    return apply(_SUB, (a, b))


_NEG = _lean_op("neg")


@op_function("neg")
def neg(self) -> Tensor:
    """``-self``; a bool tensor is refused (use ~ or logical_not), as NumPy and PyTorch."""
    out = _NEG.lean_apply(self)
    if out is not None:
        return out
    x = as_tensor(self)
    if x._data.dtype.kind == "b":
        raise TypeError("neg: negating a bool tensor is not supported; use ~ "
                        "(bitwise_not) or logical_not")
    return apply(get("neg"), (x,))


_ROUNDING = {"trunc": "trunc", "floor": "floor"}


_DIV = _lean_op("div")


@op_function("div")
def div(self, other, *, rounding_mode: str | None = None) -> Tensor:
    """``self / other`` with NumPy broadcasting; ``rounding_mode`` ``'trunc'`` or
    ``'floor'`` rounds the quotient (as torch: integer inputs then give an integer
    result, and the gradient is zero)."""
    q = _apply_binary(_DIV, "float", self, other)
    if rounding_mode is None:
        return q
    if rounding_mode not in _ROUNDING:
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                         f"{rounding_mode!r}")
    out = apply(get(_ROUNDING[rounding_mode]), (q,))
    a, b = promote_operands(self, other)
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":
        out = to_dtype(out, a.dtype if a.dtype.kind != "b" else dtypes.int64)
    return out


# the operators + - * / ** - of Tensor try the lean path before these functions
install_lean({"add": _ADD, "sub": _SUB, "mul": get("mul"), "div": _DIV, "pow": _POW,
              "neg": _NEG})


@op_function("round")
def round(self, decimals: int = 0) -> Tensor:  # noqa: A001
    """Round half to even to ``decimals`` decimal places (negative: to tens, hundreds...),
    as ``np.round`` and torch: ``round(x * 10**decimals) / 10**decimals``."""
    x = _prepare("float", as_tensor(self))
    if not isinstance(decimals, (int, np.integer)) or isinstance(decimals, bool):
        raise TypeError(f"round: decimals must be an int, not {type(decimals).__name__}")
    if decimals == 0:
        return apply(get("round"), (x,))
    scale = 10.0 ** int(decimals)
    return apply(get("round"), (x * scale,)) / scale


# ------------------------------------------------------------ ops with parameters
_SOFTPLUS = get("softplus")
_CLAMP = get("clamp")
_POLYGAMMA = get("polygamma")


@op_function("softplus")
def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold`` (stable for large x)."""
    return apply(_SOFTPLUS, (_prepare("float", as_tensor(self)), float(beta), float(threshold)))


_CLAMP_TENSOR = get("clamp_tensor")


def _is_bound_tensor(bound) -> bool:
    return isinstance(bound, Tensor) or (isinstance(bound, np.ndarray) and bound.ndim > 0)


@op_function("clamp")
def clamp(self: Tensor, min: float | Tensor | None = None,  # noqa: A002
          max: float | Tensor | None = None) -> Tensor:  # noqa: A002
    """Limit values to ``[min, max]`` (``max`` wins where ``min > max``).

    Bounds are numbers or tensors broadcast with ``self``; tensor bounds get gradients
    as in PyTorch: ``min`` where ``self < min < max``, ``max`` where ``self > max`` or
    ``max < min``, ``self`` where ``min <= self <= max``.
    """
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if _is_bound_tensor(min) or _is_bound_tensor(max):
        return clamp_tensor(self, min, max)
    lo = -math.inf if min is None else float(min)
    hi = math.inf if max is None else float(max)
    return apply(_CLAMP, (as_tensor(self), lo, hi))


def clip(self: Tensor, min: float | Tensor | None = None,  # noqa: A002
         max: float | Tensor | None = None) -> Tensor:  # noqa: A002
    """NumPy's name for :func:`clamp`."""
    return clamp(self, min, max)


def _clamp_static(attrs: dict, shapes: tuple) -> NativePlan:
    shape = ew.broadcast_shape("clamp", *(s for s in shapes if s is not None))
    return NativePlan((*(() if s is None else tuple(s) for s in shapes), tuple(shape)),
                      (tuple(shape),))


_CLAMP_KIND = Opaque(native=mk.clamp_native, static=_clamp_static)


@kernel("clamp_tensor", kind=_CLAMP_KIND, batch=batching("broadcasting"))
def _clamp_tensor_kernel(x, min, max):  # noqa: A002
    return call_native(_CLAMP_KIND, (x, min, max), {})


@op_function("clamp_tensor")
def clamp_tensor(self: Tensor, min: Tensor | None = None,  # noqa: A002
                 max: Tensor | None = None) -> Tensor:  # noqa: A002
    """:func:`clamp` with tensor bounds (broadcast with ``self``; numbers become tensors)."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    present = [t for t in (self, min, max) if t is not None]
    promoted = iter(promote_operands(*present))
    x = next(promoted)
    lo = None if min is None else next(promoted)
    hi = None if max is None else next(promoted)
    # a RuntimeError naming clamp and the shapes where the bounds do not broadcast
    ew.broadcast_shape("clamp", *(t.shape for t in (x, lo, hi) if t is not None))
    return apply(_CLAMP_TENSOR, (x, lo, hi))


@kernel("polygamma", kind=Elementwise(ew.UNARY["polygamma"]))
def _polygamma_kernel(n, x):
    return ew.run_unary("polygamma", x, x.dtype, float(n))


@op_function("polygamma")
def polygamma(n: int, self: Tensor) -> Tensor:
    """The ``n``-th derivative of the digamma function (PyTorch's argument order)."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"polygamma(n, input): n must be a non-negative Python int, got "
                        f"{type(n).__name__}" + (" (the order is polygamma(n, input))"
                                                 if isinstance(n, Tensor) else ""))
    if n < 0:
        raise RuntimeError(f"polygamma(n, input) does not support negative n (got {n})")
    return apply(_POLYGAMMA, (int(n), _prepare("float", as_tensor(self))))


def _polygamma_method(self: Tensor, n: int) -> Tensor:
    """``polygamma(n, self)``, as PyTorch's ``Tensor.polygamma(n)``."""
    return polygamma(n, self)


Tensor.polygamma = _polygamma_method


# ------------------------------------------------------------ three operands
_WHERE = get("where")
_LERP = get("lerp")


@kernel("where", kind=Elementwise(ew.TERNARY["where"]))
def _where_kernel(condition, a, b):
    return ew.run_ternary("where", condition.astype(np.bool_, copy=False), a, b, a.dtype)


@kernel("lerp", kind=Elementwise(ew.TERNARY["lerp"], operands=("a", "b", "c")))
def _lerp_kernel(a, b, w):
    return ew.run_ternary("lerp", w, a, b, a.dtype)


@op_function("where")
def where(condition, self, other) -> Tensor:
    """``self`` where ``condition`` holds, else ``other`` (broadcast together)."""
    cond = as_tensor(condition)
    if cond._data.dtype != dtypes.bool_:
        cond = ne(cond, 0)  # noqa: F821 - registered above
    a, b = promote_operands(self, other)
    return apply(_WHERE, (cond, a, b))


@op_function("lerp")
def lerp(self, end, weight) -> Tensor:
    """``self + weight * (end - self)``."""
    a, b, w = promote_operands(self, end, weight)
    if a._data.dtype.kind != "f":
        a, b, w = (_prepare("float", t) for t in (a, b, w))
    return apply(_LERP, (a, b, w))
