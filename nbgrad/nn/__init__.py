"""Neural-network helpers: ``nbgrad.nn.functional``."""

from . import functional

__all__ = ["functional"]
