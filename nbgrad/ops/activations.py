"""Activations, normalisations and losses of ``torch.nn.functional`` written over table
ops (PyTorch implements them as composites too): each differentiates to any order and
runs natively in both jit tiers with no kernel of its own.

Branches that could overflow where ``where`` does not pick them read a clamped input,
so no ``inf * 0`` NaN reaches a gradient.
"""

from __future__ import annotations

import math

from ..tensor import Tensor
from .dispatch import as_tensor, promote_operands
from .elementwise import clamp, softplus, where
from .nn import elu, softmax
from .pointwise import xlogy
from .reduction import mean, norm, sum
from .shape import broadcast_tensors, chunk

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946
_REDUCTIONS = ("none", "mean", "sum")


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return sum(loss)
    raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


# ------------------------------------------------------------------ activations
def logsigmoid(self: Tensor) -> Tensor:
    """``log(sigmoid(x)) = -softplus(-x)``, stable for large ``|x|``."""
    return -softplus(-as_tensor(self))


def relu6(self: Tensor) -> Tensor:
    """``min(max(x, 0), 6)``."""
    return clamp(self, 0.0, 6.0)


def hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """``x`` clamped to ``[min_val, max_val]``."""
    return clamp(self, float(min_val), float(max_val))


def selu(self: Tensor) -> Tensor:
    """``scale * elu(x, alpha)`` with the self-normalising constants."""
    return elu(self, _SELU_ALPHA) * _SELU_SCALE


def celu(self: Tensor, alpha: float = 1.0) -> Tensor:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``."""
    x = as_tensor(self)
    alpha = float(alpha)
    return x.maximum(0.0) + ((x.minimum(0.0) / alpha).expm1() * alpha)


def mish(self: Tensor) -> Tensor:
    """``x * tanh(softplus(x))``."""
    x = as_tensor(self)
    return x * softplus(x).tanh()


def softmin(self: Tensor, dim: int, dtype=None) -> Tensor:
    """``softmax(-x)`` over ``dim``."""
    return softmax(-as_tensor(self), dim, dtype)


def glu(self: Tensor, dim: int = -1) -> Tensor:
    """The gated linear unit: the first half of ``dim`` times the sigmoid of the second."""
    x = as_tensor(self)
    if x.ndim == 0 or x.shape[dim] % 2:
        raise RuntimeError(f"glu: dim {dim} of shape {tuple(x.shape)} must have an even size")
    a, b = chunk(x, 2, dim)
    return a * b.sigmoid()


def hardshrink(self: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0."""
    x = as_tensor(self)
    return where(abs(x) > float(lambd), x, 0.0)


def softshrink(self: Tensor, lambd: float = 0.5) -> Tensor:
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0."""
    x, lambd = as_tensor(self), float(lambd)
    return where(x > lambd, x - lambd, where(x < -lambd, x + lambd, 0.0))


def threshold(self: Tensor, threshold: float, value: float) -> Tensor:
    """``x`` where ``x > threshold``, else ``value``."""
    x = as_tensor(self)
    return where(x > float(threshold), x, float(value))


def hardsigmoid(self: Tensor) -> Tensor:
    """``relu6(x + 3) / 6``."""
    return clamp(as_tensor(self) + 3.0, 0.0, 6.0) / 6.0


def hardswish(self: Tensor) -> Tensor:
    """``x * relu6(x + 3) / 6``."""
    x = as_tensor(self)
    return x * clamp(x + 3.0, 0.0, 6.0) / 6.0


def softsign(self: Tensor) -> Tensor:
    """``x / (1 + |x|)``."""
    x = as_tensor(self)
    return x / (abs(x) + 1.0)


def tanhshrink(self: Tensor) -> Tensor:
    """``x - tanh(x)``."""
    x = as_tensor(self)
    return x - x.tanh()


def prelu(self: Tensor, weight: Tensor) -> Tensor:
    """``x`` where positive, else ``weight * x``; ``weight`` has one value or one per
    channel (dimension 1)."""
    x, w = as_tensor(self), as_tensor(weight)
    if w.numel() != 1:
        if x.ndim < 2 or w.ndim != 1 or w.shape[0] != x.shape[1]:
            raise RuntimeError(f"prelu: weight of shape {tuple(w.shape)} must have 1 element "
                               f"or one per channel of the input {tuple(x.shape)}")
        w = w.reshape((1, -1) + (1,) * (x.ndim - 2))
    elif w.ndim:
        w = w.reshape(())
    return where(x > 0, x, w * x)


def rrelu(self: Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3,
          training: bool = False) -> Tensor:
    """Leaky relu with slope ``(lower + upper) / 2`` (outside training; in training the
    slopes are random, which is refused here)."""
    if training:
        raise NotImplementedError("rrelu: training=True (random slopes) is not supported; "
                                  "use leaky_relu, or training=False")
    x = as_tensor(self)
    return where(x >= 0, x, x * ((float(lower) + float(upper)) / 2))


# ------------------------------------------------------------------ normalisation
def normalize(self: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """``x / max(||x||_p, eps)`` over ``dim``."""
    x = as_tensor(self)
    return x / clamp(norm(x, p, dim, keepdim=True), min=float(eps))


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """The cosine of the angle between ``x1`` and ``x2`` along ``dim`` (each normalised
    by ``max(||x||, eps)``, as current PyTorch), after broadcasting them together."""
    a, b = broadcast_tensors(*promote_operands(x1, x2))
    a = a / clamp(norm(a, 2.0, dim, keepdim=True), min=float(eps))
    b = b / clamp(norm(b, 2.0, dim, keepdim=True), min=float(eps))
    return sum(a * b, dim)


# ------------------------------------------------------------------ losses
def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean",  # noqa: A002
               delta: float = 1.0) -> Tensor:
    """``0.5 d**2`` where ``|d| < delta``, else ``delta * (|d| - 0.5 delta)``."""
    d = abs(input - target)
    delta = float(delta)
    loss = where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta)
    return _reduce(loss, reduction, "huber_loss")


def smooth_l1_loss(input: Tensor, target: Tensor, reduction: str = "mean",  # noqa: A002
                   beta: float = 1.0) -> Tensor:
    """``0.5 d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta`` (L1 for beta 0)."""
    d = abs(input - target)
    beta = float(beta)
    loss = d if beta == 0 else where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta)
    return _reduce(loss, reduction, "smooth_l1_loss")


def kl_div(input: Tensor, target: Tensor, reduction: str = "mean",  # noqa: A002
           log_target: bool = False) -> Tensor:
    """``target * (log(target) - input)`` for log-probabilities ``input`` (``target`` as
    log-probabilities too when ``log_target``); ``'batchmean'`` divides the sum by the
    batch size."""
    x, t = promote_operands(input, target)
    loss = t.exp() * (t - x) if log_target else xlogy(t, t) - t * x
    if reduction == "batchmean":
        return sum(loss) / (x.shape[0] if x.ndim else 1)
    return _reduce(loss, reduction, "kl_div")


def gaussian_nll_loss(input: Tensor, target: Tensor, var, full: bool = False,  # noqa: A002
                      eps: float = 1e-6, reduction: str = "mean") -> Tensor:
    """``0.5 * (log(var) + (input - target)**2 / var)`` with ``var`` clamped at ``eps``
    (plus ``0.5 log(2 pi)`` when ``full``)."""
    var = clamp(as_tensor(var), min=float(eps))
    loss = (var.log() + (input - target) ** 2 / var) * 0.5
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return _reduce(loss, reduction, "gaussian_nll_loss")


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True,  # noqa: A002
                     full: bool = False, eps: float = 1e-8,
                     reduction: str = "mean") -> Tensor:
    """``exp(input) - target * input`` (``log_input``) or ``input - target * log(input +
    eps)``; ``full`` adds Stirling's term ``t log t - t + 0.5 log(2 pi t)`` where t > 1."""
    x, t = promote_operands(input, target)
    loss = x.exp() - t * x if log_input else x - t * (x + float(eps)).log()
    if full:
        safe = where(t > 1, t, 2.0)
        stirling = safe * safe.log() - safe + 0.5 * (2 * math.pi * safe).log()
        loss = loss + where(t > 1, stirling, 0.0)
    return _reduce(loss, reduction, "poisson_nll_loss")


__all__ = ["celu", "cosine_similarity", "gaussian_nll_loss", "glu", "hardshrink",
           "hardsigmoid", "hardswish", "hardtanh", "huber_loss", "kl_div", "logsigmoid", "mish",
           "normalize", "poisson_nll_loss", "prelu", "relu6", "rrelu", "selu", "smooth_l1_loss",
           "softmin", "softshrink", "softsign", "tanhshrink", "threshold"]
