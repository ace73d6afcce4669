"""State dicts to and from NumPy ``.npz`` files: ``nbgrad.nn.save`` and ``load``."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import numpy as np

from ..tensor import Tensor

__all__ = ["load", "save"]


def save(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``state`` (tensors, arrays or numbers by name, e.g. ``model.state_dict()``
    or ``optimizer.state_dict()``) to ``path`` as an uncompressed ``.npz``."""
    arrays = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"save: keys must be strings, got {key!r}")
        arrays[key] = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
        if arrays[key].dtype == object:
            raise TypeError(f"save: {key!r} is not numeric ({type(value).__name__})")
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load(path: str | os.PathLike) -> OrderedDict[str, Tensor]:
    """Read a file written by :func:`save`: tensors by name, in the saved order."""
    with np.load(path, allow_pickle=False) as data:
        return OrderedDict((key, Tensor(data[key])) for key in data.files)
