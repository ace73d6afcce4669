"""Optimizers: ``SGD``, ``Adam``, ``AdamW``, each step one fused Numba kernel per
parameter group (:mod:`nbgrad.optim.optimizer`)."""

from .algorithms import SGD, Adam, AdamW
from .optimizer import Optimizer

__all__ = ["SGD", "Adam", "AdamW", "Optimizer"]
