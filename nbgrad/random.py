"""Random tensors from NumPy's ``Generator``: ``nbgrad.random.normal`` and ``uniform``.

Each function takes ``seed=``: an int gives a reproducible result on its own; ``None``
draws from the module's generator, which :func:`seed` resets.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes
from .factories import _shape as _checked_shape
from .factories import tensor
from .tensor import Tensor

_GENERATOR = np.random.default_rng()

__all__ = ["normal", "seed", "uniform"]


def seed(value: int) -> None:
    """Reset the generator used when no ``seed=`` is given."""
    global _GENERATOR
    _GENERATOR = np.random.default_rng(value)


def _generator(seed_value: int | None) -> np.random.Generator:
    return _GENERATOR if seed_value is None else np.random.default_rng(seed_value)


def _shape(shape, op: str) -> tuple[int, ...]:
    return _checked_shape((shape,) if isinstance(shape, (int, np.integer)) else tuple(shape),
                          f"random.{op}")


def normal(shape, mean: float = 0.0, std: float = 1.0, seed: int | None = None,
           dtype: Any = None, requires_grad: bool = False, device: Any = "cpu") -> Tensor:
    """Samples of N(mean, std^2) of the given shape (float64 unless ``dtype`` says otherwise)."""
    values = _generator(seed).normal(mean, std, _shape(shape, "normal"))
    return tensor(values, dtype=dtype or dtypes.float64, requires_grad=requires_grad,
                  device=device)


def uniform(shape, low: float = 0.0, high: float = 1.0, seed: int | None = None,
            dtype: Any = None, requires_grad: bool = False, device: Any = "cpu") -> Tensor:
    """Samples of U[low, high) of the given shape."""
    values = _generator(seed).uniform(low, high, _shape(shape, "uniform"))
    return tensor(values, dtype=dtype or dtypes.float64, requires_grad=requires_grad,
                  device=device)
