"""``nbgrad.jit``: trace a function of tensors into a graph and run it natively.

- :mod:`.ir`: the graph IR (printable, checked, hashable);
- :mod:`.tracer`: concrete tracing through the eager dispatch hook;
- :mod:`.autodiff`: reverse mode on the IR from the derivative table;
- :mod:`.loops`: ``fori_loop``/``scan`` and the ``loop`` node (never unrolled);
- :mod:`.reroll`: turns repeated stretches of a trace (unrolled Python loops) back
  into ``loop`` nodes;
- :mod:`.passes`: dead code, common subexpressions, constant folding, hoisting;
- :mod:`.interpreter` and :mod:`.lowering`: tier 1, one precompiled ``@njit`` tape
  interpreter and the graph-to-tape lowering;
- :mod:`.api`: ``nbgrad.jit`` itself (signature cache, autograd node);
- :mod:`.verify`: generated code's first result is checked against tier 1.
"""

from __future__ import annotations

from ..errors import TracerError
from .api import Jitted, jit
from .loops import fori_loop, scan
from .verify import PromotionMismatchWarning
from .verify import set_enabled as set_promotion_check

__all__ = ["Jitted", "PromotionMismatchWarning", "TracerError", "fori_loop", "jit", "scan",
           "set_promotion_check"]


class _CallableModule(__import__("types").ModuleType):
    """Lets ``nbgrad.jit(f)`` call :func:`~nbgrad.jit.api.jit` while ``nbgrad.jit.ir`` etc.
    stay reachable as submodules."""

    def __call__(self, *args, **kwargs):
        return jit(*args, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
