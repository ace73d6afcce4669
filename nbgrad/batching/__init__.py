"""``nbgrad.vmap``: vectorising map over the jit tracer's graphs (see :mod:`.api`).

The batching rules live in :mod:`.rules` (one per op kind) and :mod:`.opaque` (one per
``Opaque`` op); :mod:`.interpret` runs a traced graph on batched values with them.
"""

from .. import functional
from .api import vmap
from .core import BatchingError

functional._VMAP[:] = [vmap]  # jacobian and hessian batch their cotangents with it

__all__ = ["BatchingError", "vmap"]
