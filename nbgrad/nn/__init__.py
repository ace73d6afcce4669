"""Neural networks: ``nbgrad.nn.functional`` and the ``Module`` layer over it.

``Module`` and ``Parameter`` (:mod:`~nbgrad.nn.module`), the layers
(:mod:`~nbgrad.nn.layers`), and :func:`save`/:func:`load` of state dicts as NumPy
``.npz`` files (:mod:`~nbgrad.nn.serialization`).
"""

from . import functional
from .layers import *  # noqa: F403
from .layers import __all__ as _layers
from .module import Module, ModuleDict, ModuleList, Parameter, Sequential
from .serialization import load, save

__all__ = ["Module", "ModuleDict", "ModuleList", "Parameter", "Sequential", "functional",
           "load", "save", *_layers]
