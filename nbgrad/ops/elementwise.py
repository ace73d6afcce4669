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
from ..tensor import Tensor
from .dispatch import apply, as_tensor, promote_operands
from .registry import get, kernel, op_function


def _out_dtype(kind: str, dtype: np.dtype) -> np.dtype:
    return dtypes.bool_ if kind == "bool" else dtype


def _prepare(kind: str, t: Tensor) -> Tensor:
    if kind == "float" and t._data.dtype.kind != "f":
        from .convert import to_dtype
        return to_dtype(t, dtypes.float64)
    return t


def _register_unary(spec: ew.ScalarOp):
    name, kind = spec.name, spec.kind

    @kernel(name)
    def unary_kernel(x, *params):
        return ew.run_unary(name, x, _out_dtype(kind, x.dtype), *map(float, params))

    op = get(name)
    if spec.params:
        return None  # ops with parameters define their public function below

    def unary(self):
        return apply(op, (_prepare(kind, as_tensor(self)),))

    unary.__name__ = unary.__qualname__ = name
    unary.__doc__ = f"Elementwise ``{spec.expr}``."
    return op_function(name)(unary)


def _apply_binary(op, kind: str, self, other) -> Tensor:
    a, b = promote_operands(self, other)
    if kind == "float" and a._data.dtype.kind != "f":
        a, b = _prepare(kind, a), _prepare(kind, b)
    return apply(op, (a, b))


def _register_binary(spec: ew.ScalarOp):
    name, kind = spec.name, spec.kind

    run = ew.run_binary
    if kind == "bool":
        @kernel(name)
        def binary_kernel(a, b):
            return run(name, a, b, dtypes.bool_)
    else:
        @kernel(name)
        def binary_kernel(a, b):
            return run(name, a, b, a.dtype)

    op = get(name)
    if name in _EXPLICIT:
        return None

    def binary(self, other):
        return _apply_binary(op, kind, self, other)

    binary.__name__ = binary.__qualname__ = name
    binary.__doc__ = f"Elementwise ``{spec.expr}`` with NumPy broadcasting."
    return op_function(name)(binary)


_EXPLICIT = {"pow"}  # binary ops whose arguments are not named (self, other)
_FUNCTIONS = {}
for _spec in ew.UNARY.values():
    _FUNCTIONS[_spec.name] = _register_unary(_spec)
for _spec in ew.BINARY.values():
    _FUNCTIONS[_spec.name] = _register_binary(_spec)
globals().update({k: v for k, v in _FUNCTIONS.items() if v is not None})
__all__ = sorted([k for k, v in _FUNCTIONS.items() if v is not None]
                 + ["pow", "softplus", "clamp", "clip", "polygamma", "where", "lerp"])


@op_function("pow")
def pow(self, exponent) -> Tensor:  # noqa: A001
    """``self ** exponent`` with NumPy broadcasting."""
    return _apply_binary(get("pow"), "float", self, exponent)


# ------------------------------------------------------------ ops with parameters
_SOFTPLUS = get("softplus")
_CLAMP = get("clamp")
_POLYGAMMA = get("polygamma")


@op_function("softplus")
def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold`` (stable for large x)."""
    return apply(_SOFTPLUS, (_prepare("float", as_tensor(self)), float(beta), float(threshold)))


@op_function("clamp")
def clamp(self: Tensor, min: float | None = None, max: float | None = None) -> Tensor:  # noqa: A002
    """Limit values to ``[min, max]``; the gradient passes where ``min <= x <= max``."""
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    lo = -math.inf if min is None else float(min)
    hi = math.inf if max is None else float(max)
    return apply(_CLAMP, (as_tensor(self), lo, hi))


def clip(self: Tensor, min: float | None = None, max: float | None = None) -> Tensor:  # noqa: A002
    """NumPy's name for :func:`clamp`."""
    return clamp(self, min, max)


@op_function("polygamma")
def polygamma(self: Tensor, n: int) -> Tensor:
    """The ``n``-th derivative of the digamma function."""
    return apply(_POLYGAMMA, (_prepare("float", as_tensor(self)), int(n)))


# ------------------------------------------------------------ three operands
_WHERE = get("where")
_LERP = get("lerp")


@kernel("where")
def _where_kernel(condition, a, b):
    return ew.run_ternary("where", condition.astype(np.bool_, copy=False), a, b, a.dtype)


@kernel("lerp")
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
