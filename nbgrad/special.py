"""``scipy.special`` for tensors: special functions under SciPy's names and signatures.

Each is a table op (``erfinv``, ``erfcx``, ``ndtri``, ``log_ndtr``, ``i0``, ``i0e``,
``i1``, ``i1e``, ``erf``, ``lgamma``...: one scalar expression each, in
:mod:`nbgrad.kernels.elementwise`, written with care for the tails) or a few table ops
(``ndtr``, ``betaln``, ``multigammaln``, ``entr``, ``logsumexp``), so every function
differentiates to any order, runs under ``nbgrad.jit`` and on CUDA. Where a branch that
``where`` does not pick could produce ``inf`` or NaN (``x * log(x)`` at 0), its input
is made safe first, so that no NaN reaches a gradient.

``import nbgrad`` does not import this module; ``nbgrad.special`` loads it on first use.
"""

from __future__ import annotations

import math

import numpy as np

from . import dtypes, ops
from .ops.dispatch import as_tensor, promote_operands
from .tensor import Tensor

__all__ = ["betaln", "digamma", "entr", "erf", "erfc", "erfcx", "erfinv", "expit",
           "gammaln", "i0", "i0e", "i1", "i1e", "log_ndtr", "logit", "logsumexp",
           "multigammaln", "ndtr", "ndtri", "polygamma", "psi", "softplus", "xlog1py",
           "xlogy"]

_SQRT1_2 = 0.7071067811865476  # 1 / sqrt(2)

# table ops, under SciPy's names (the same functions as nbgrad.erfinv, nbgrad.i0, ...)
erf = ops.erf
erfc = ops.erfc
erfinv = ops.erfinv
erfcx = ops.erfcx
ndtri = ops.ndtri
log_ndtr = ops.log_ndtr
i0 = ops.i0
i0e = ops.i0e
i1 = ops.i1
i1e = ops.i1e
gammaln = ops.lgamma
digamma = psi = ops.digamma
polygamma = ops.polygamma  # polygamma(n, x): n a non-negative int
expit = ops.sigmoid
logit = ops.logit
xlogy = ops.xlogy
xlog1py = ops.xlog1py


def _float(x) -> Tensor:
    t = as_tensor(x)
    return t if t.dtype.kind == "f" else ops.to_dtype(t, dtypes.float64)


def ndtr(x) -> Tensor:
    """The standard normal CDF ``Phi(x) = erfc(-x / sqrt(2)) / 2`` (relative accuracy
    in the lower tail; :func:`log_ndtr` for its logarithm far below -37)."""
    return ops.erfc(_float(x) * -_SQRT1_2) * 0.5


def betaln(a, b) -> Tensor:
    """``log |B(a, b)| = lgamma(a) + lgamma(b) - lgamma(a + b)`` (this sum loses
    accuracy where ``a + b`` is much larger than the result)."""
    a, b = promote_operands(_float(a), b)
    return ops.lgamma(a) + ops.lgamma(b) - ops.lgamma(a + b)


def multigammaln(a, d: int) -> Tensor:
    """The log of the multivariate gamma function of dimension ``d``:
    ``d (d - 1) / 4 log(pi) + sum_{j < d} lgamma(a - j / 2)``. SciPy raises where
    ``a <= (d - 1) / 2``; here those points get ``lgamma``'s values (the poles +inf)."""
    try:
        ok = not isinstance(d, bool) and float(d).is_integer() and d >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"multigammaln: d must be a positive integer, got {d!r}")
    return ops.mvlgamma(_float(a), int(d))


def entr(x) -> Tensor:
    """Elementwise entropy ``-x log(x)``: 0 at 0, ``-inf`` for ``x < 0`` (as SciPy).
    The gradient is ``-(log(x) + 1)`` for ``x > 0`` and 0 elsewhere."""
    x = _float(x)
    safe = ops.where(x > 0, x, 1.0)  # log sees no 0 or negative: no NaN in the gradient
    return ops.where(x == 0, 0.0, ops.where(x < 0, -math.inf, -x * ops.log(safe)))


def softplus(x) -> Tensor:
    """``log(1 + exp(x))`` computed stably for every ``x`` (SciPy's ``softplus``: no
    linear cut-off, unlike ``nbgrad.nn.functional.softplus``'s ``threshold``)."""
    return ops.softplus(_float(x), 1.0, math.inf)


def logsumexp(a, axis=None, b=None, keepdims: bool = False, return_sign: bool = False):
    """``log(sum(b * exp(a)))`` over ``axis`` (all axes by default), without overflow.

    ``b`` (weights broadcast with ``a``) may be 0, where the term drops out with a finite
    gradient. With ``return_sign``, returns ``(log|s|, sign(s))`` of the sum ``s`` (for
    negative weights); without it a negative sum gives NaN, as SciPy. PyTorch's
    ``logsumexp(x, dim, keepdim)`` is accepted too: a bool in third place is ``keepdims``.
    """
    if isinstance(b, (bool, np.bool_)):  # torch.special.logsumexp(input, dim, keepdim)
        b, keepdims = None, bool(b)
    x = _float(a)
    if b is None and not return_sign:
        return ops.logsumexp(x, axis, bool(keepdims))
    if b is not None:
        x, w = ops.broadcast_tensors(*promote_operands(x, b))
    else:
        w = None
    # the maximum, held constant: log(sum(b exp(x - m))) + m does not depend on m
    m = ops.amax(x.detach(), axis, keepdim=True)
    m = ops.where(ops.isfinite(m), m, 0.0)
    terms = ops.exp(x - m)
    s = ops.sum(terms if w is None else w * terms, axis, bool(keepdims))
    shift = ops.sum(m, axis, bool(keepdims))  # drops the kept axes unless keepdims
    if not return_sign:
        return ops.log(s) + shift
    return ops.log(ops.abs(s)) + shift, ops.sign(s)
