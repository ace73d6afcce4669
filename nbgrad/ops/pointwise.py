"""Elementwise functions written over table ops (as PyTorch's CompositeImplicitAutograd
functions are): predicates, ``logaddexp``, ``xlogy``, ``logit``, ``nan_to_num``...

Each is a few table ops, so it differentiates to any order and runs natively in both jit
tiers with no kernel of its own. Where a branch not taken could produce ``inf`` or NaN
(``x * log(y)`` at ``x = 0``), its input is made safe first, so that no NaN reaches a
gradient through the branch ``where`` does not pick.
"""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..tensor import Tensor
from .convert import to_dtype
from .dispatch import as_tensor, promote_operands
from .elementwise import clamp, clamp_tensor, where
from .reduction import logsumexp
from .shape import broadcast_tensors, stack

_LN2 = math.log(2.0)


def _float(t) -> Tensor:
    t = as_tensor(t)
    return t if t.dtype.kind == "f" else to_dtype(t, dtypes.float64)


# ------------------------------------------------------------------ predicates
def isnan(self: Tensor) -> Tensor:
    """Where ``self`` is NaN (a bool tensor; no gradient)."""
    self = as_tensor(self)
    return self != self


def isinf(self: Tensor) -> Tensor:
    """Where ``self`` is +inf or -inf."""
    self = as_tensor(self)
    if self.dtype.kind != "f":
        return self != self  # all False, in the shape of self
    return abs(self) == math.inf


def isfinite(self: Tensor) -> Tensor:
    """Where ``self`` is neither NaN nor infinite."""
    self = as_tensor(self)
    if self.dtype.kind != "f":
        return self == self
    return abs(self) < math.inf


def isposinf(self: Tensor) -> Tensor:
    """Where ``self`` is +inf."""
    self = as_tensor(self)
    return self == math.inf if self.dtype.kind == "f" else self != self


def isneginf(self: Tensor) -> Tensor:
    """Where ``self`` is -inf."""
    self = as_tensor(self)
    return self == -math.inf if self.dtype.kind == "f" else self != self


def nan_to_num(self: Tensor, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None) -> Tensor:
    """NaN replaced by ``nan``, +inf by ``posinf`` and -inf by ``neginf`` (the dtype's
    largest and lowest finite values by default); the gradient passes where ``self`` is
    finite."""
    self = as_tensor(self)
    if self.dtype.kind != "f":
        return self
    info = np.finfo(self.dtype)
    hi = float(info.max) if posinf is None else float(posinf)
    lo = float(info.min) if neginf is None else float(neginf)
    out = where(self == math.inf, hi, self)
    out = where(self == -math.inf, lo, out)
    return where(isnan(self), float(nan), out)


# ------------------------------------------------------------------ logs and exps
def logaddexp(self: Tensor, other) -> Tensor:
    """``log(exp(self) + exp(other))`` without overflow; the gradient is the softmax of
    the two (0.5 each at a tie)."""
    a, b = broadcast_tensors(*promote_operands(_float(self), other))
    return logsumexp(stack([a, b]), 0)


def logaddexp2(self: Tensor, other) -> Tensor:
    """``log2(2**self + 2**other)`` without overflow."""
    a, b = promote_operands(_float(self), other)
    return logaddexp(a * _LN2, b * _LN2) / _LN2


def xlogy(self, other) -> Tensor:
    """``self * log(other)``, 0 where ``self`` is 0 even where ``other`` is 0 or +inf
    (as SciPy and PyTorch; a NaN in ``other`` gives NaN). The gradient is the calculus
    one, as JAX's: ``log(other)`` for ``self`` also at ``self = 0`` (finite differences
    agree; PyTorch gives 0 there), 0 where the value is the convention's 0."""
    x, y = promote_operands(_float(self), other)
    special = (x == 0) & ((y == 0) | (y == math.inf))  # 0 * log(0) and 0 * log(inf)
    return x * where(special, 1.0, y).log()


def xlog1py(self, other) -> Tensor:
    """``self * log1p(other)``, 0 where ``self`` is 0 even where ``other`` is -1 or +inf
    (gradients as :func:`xlogy`)."""
    x, y = promote_operands(_float(self), other)
    special = (x == 0) & ((y == -1) | (y == math.inf))
    return x * where(special, 0.0, y).log1p()


def logit(self: Tensor, eps: float | None = None) -> Tensor:
    """``log(p / (1 - p))``; with ``eps``, ``p`` is first clamped to ``[eps, 1 - eps]``."""
    p = _float(self)
    if eps is not None:
        p = clamp(p, float(eps), 1.0 - float(eps))
    return p.log() - (-p).log1p()


def exp2(self: Tensor) -> Tensor:
    """``2 ** self``."""
    return (_float(self) * _LN2).exp()


def sinc(self: Tensor) -> Tensor:
    """The normalised sinc ``sin(pi x) / (pi x)``, 1 at 0 (its gradient there is 0; its
    second derivative at exactly 0 is given as 0, as in PyTorch)."""
    x = _float(self)
    zero = x == 0
    safe = where(zero, 1.0, x) * math.pi
    return where(zero, 1.0, safe.sin() / safe)


# ------------------------------------------------------------------ comparisons
def fmax(self, other) -> Tensor:
    """The larger of the two, ignoring a NaN (NaN only where both are)."""
    a, b = promote_operands(self, other)
    return where(isnan(b), a, where(isnan(a), b, a.maximum(b)))


def fmin(self, other) -> Tensor:
    """The smaller of the two, ignoring a NaN (NaN only where both are)."""
    a, b = promote_operands(self, other)
    return where(isnan(b), a, where(isnan(a), b, a.minimum(b)))


def heaviside(self: Tensor, values) -> Tensor:
    """0 where ``self < 0``, 1 where ``self > 0`` and ``values`` where it is 0 (the
    gradient goes to ``values`` there; none to ``self``)."""
    x, v = promote_operands(self, values)
    step = where(x > 0, 1.0, 0.0)
    return where(x == 0, v, to_dtype(step, v.dtype) if step.dtype != v.dtype else step)


def clamp_min(self: Tensor, min) -> Tensor:  # noqa: A002 - torch's name
    """``max(self, min)`` (``min`` a number or a tensor)."""
    return clamp_tensor(self, min=as_tensor(min)) if isinstance(min, Tensor) else \
        clamp(self, min=min)


def clamp_max(self: Tensor, max) -> Tensor:  # noqa: A002 - torch's name
    """``min(self, max)`` (``max`` a number or a tensor)."""
    return clamp_tensor(self, max=as_tensor(max)) if isinstance(max, Tensor) else \
        clamp(self, max=max)


# ------------------------------------------------------------------ arithmetic
def float_power(self, exponent) -> Tensor:
    """``self ** exponent`` in float64 (as torch's ``float_power``)."""
    a = to_dtype(as_tensor(self), dtypes.float64)
    e = exponent if not isinstance(exponent, Tensor) else to_dtype(exponent, dtypes.float64)
    return a ** e


def frac(self: Tensor) -> Tensor:
    """The fractional part ``self - trunc(self)`` (its sign is the sign of ``self``)."""
    x = _float(self)
    return x - x.trunc()


def rsub(self, other, alpha=1) -> Tensor:
    """``other - alpha * self`` (torch's reversed subtraction)."""
    a, b = promote_operands(self, other)
    return b - a * alpha if alpha != 1 else b - a


def addcmul(self: Tensor, tensor1, tensor2, value=1) -> Tensor:
    """``self + value * tensor1 * tensor2``."""
    return self + (tensor1 * tensor2) * value if value != 1 else self + tensor1 * tensor2


def addcdiv(self: Tensor, tensor1, tensor2, value=1) -> Tensor:
    """``self + value * tensor1 / tensor2``."""
    return self + (tensor1 / tensor2) * value if value != 1 else self + tensor1 / tensor2


__all__ = ["addcdiv", "addcmul", "clamp_max", "clamp_min", "exp2", "float_power", "fmax",
           "fmin", "frac", "heaviside", "isfinite", "isinf", "isnan", "isneginf", "isposinf",
           "logaddexp", "logaddexp2", "logit", "nan_to_num", "rsub", "sinc", "xlog1py",
           "xlogy"]
