"""All ops. Importing this package registers every kernel and binds the derivative table.

Every module of this package is imported (in name order); each lists its public
functions in ``__all__``, which this package re-exports. Ops whose first argument is
the tensor (``self``) also become ``Tensor`` methods. Adding an op therefore means:
a kernel and a function in some module here, and an entry in the table.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys

from ..factories import zeros as _zeros
from ..tensor import Tensor, install_ops
from .registry import bind_table

_INTERNAL = {"registry", "dispatch"}
MODULES = [importlib.import_module(f"{__name__}.{m.name}")
           for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
           if m.name not in _INTERNAL and not m.name.startswith("_")]

__all__: list[str] = []
for _module in MODULES:
    for _name in getattr(_module, "__all__", ()):
        globals()[_name] = getattr(_module, _name)
        __all__.append(_name)

TABLE = bind_table()

#: names that are functions of several tensors, never methods
_NOT_METHODS = {"where", "cat", "stack", "concatenate", "broadcast_tensors", "einsum",
                "zeros_like", "ones_like"}


def _install_methods() -> None:
    """Make ``t.op(...)`` call ``op(t, ...)`` for every op taking the tensor first."""
    for name in __all__:
        fn = globals()[name]
        if name in _NOT_METHODS or hasattr(Tensor, name) or not callable(fn):
            continue
        params = list(inspect.signature(fn).parameters)
        if params and params[0] == "self":
            setattr(Tensor, name, fn)


_install_methods()
install_ops(sys.modules[__name__])  # Tensor's operators call the ops through this package


def zeros(*size, dtype=None, device="cpu"):
    """Zeros (used when a missing output gradient must be materialised)."""
    return _zeros(*size, dtype=dtype, device=device)


__all__ = sorted(set(__all__))
