"""``SGD``, ``Adam`` and ``AdamW``, with PyTorch's arguments and defaults."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import kernels
from .optimizer import Optimizer, _FlatGroup

__all__ = ["SGD", "Adam", "AdamW"]


def _nonnegative(name: str, group: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if float(group[key]) < 0.0:
            raise ValueError(f"{name}: {key} must be >= 0, got {group[key]}")


class SGD(Optimizer):
    """Stochastic gradient descent, with momentum (optionally Nesterov's), dampening and
    L2 weight decay, as ``torch.optim.SGD``."""

    slots = ("momentum_buffer",)

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 *, maximize: bool = False) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def _check(self, group: dict[str, Any]) -> None:
        _nonnegative("SGD", group, "lr", "momentum", "weight_decay")
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("SGD: nesterov momentum needs momentum > 0 and dampening 0")

    def _update(self, group: dict[str, Any], flat: _FlatGroup) -> None:
        kernels.sgd_step(flat.flat, flat.grad, flat.state["momentum_buffer"], flat.offsets,
                         flat.active, flat.steps, float(group["lr"]), float(group["momentum"]),
                         float(group["dampening"]), float(group["weight_decay"]),
                         bool(group["nesterov"]), bool(group["maximize"]))


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction, L2 weight decay and AMSGrad, as
    ``torch.optim.Adam``."""

    slots = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    _decoupled = False

    def __init__(self, params: Iterable, lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 maximize: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def _check(self, group: dict[str, Any]) -> None:
        name = type(self).__name__
        _nonnegative(name, group, "lr", "eps", "weight_decay")
        b1, b2 = group["betas"]
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"{name}: betas must be in [0, 1), got {group['betas']}")

    def _update(self, group: dict[str, Any], flat: _FlatGroup) -> None:
        b1, b2 = group["betas"]
        kernels.adam_step(flat.flat, flat.grad, flat.state["exp_avg"], flat.state["exp_avg_sq"],
                          flat.state["max_exp_avg_sq"], flat.offsets, flat.active, flat.steps,
                          float(group["lr"]), float(b1), float(b2), float(group["eps"]),
                          float(group["weight_decay"]), self._decoupled,
                          bool(group["amsgrad"]), bool(group["maximize"]))


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as ``torch.optim.AdamW``:
    the parameter shrinks by ``lr * weight_decay`` before the Adam step."""

    _decoupled = True

    def __init__(self, params: Iterable, lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)
