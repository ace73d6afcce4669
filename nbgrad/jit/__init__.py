"""``nbgrad.jit``: trace a function of tensors into a graph and run it natively.

The package is laid out by stage, one room each:

- :mod:`.trace`: tracing to the graph IR, loops, rerolling, autodiff and graph passes;
- :mod:`.tier1`: the precompiled ``@njit`` tape interpreter and the graph-to-tape lowering;
- :mod:`.tier2`: generated, fused ``@njit`` modules compiled in the background;
- :mod:`.cuda`: fused CUDA kernels for graphs whose tensors live on the GPU;
- :mod:`.api`: ``nbgrad.jit`` itself (signature cache, autograd node);
- :mod:`.program`: the executable base and the choice of tier;
- :mod:`.verify`: generated code's first result is checked against tier 1;
- :mod:`.reference`: the eager replay of a graph (the ground truth of every tier).
"""

from __future__ import annotations

from ..errors import TracerError
from .api import Jitted, jit
from .trace.control import cond, while_loop
from .trace.loops import fori_loop, scan
from .verify import PromotionMismatchWarning
from .verify import set_enabled as set_promotion_check

__all__ = ["Jitted", "PromotionMismatchWarning", "TracerError", "cond", "fori_loop", "jit", "scan",
           "set_promotion_check", "while_loop"]


class _CallableModule(__import__("types").ModuleType):
    """Lets ``nbgrad.jit(f)`` call :func:`~nbgrad.jit.api.jit` while ``nbgrad.jit.trace.ir`` etc.
    stay reachable as submodules."""

    def __call__(self, *args, **kwargs):
        return jit(*args, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
