"""``nbgrad.checkpoint`` eagerly and inside ``nbgrad.jit``.

Eagerly it is :func:`nbgrad.recompute.checkpoint`. Traced, ``f`` becomes a one-step
``scan`` whose row is ``f``'s tensor arguments and whose loop node has
``LoopInfo.remat``: the compiled backward keeps only those arguments (and what ``f``
closes over) and runs ``f``'s forward again before differentiating it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ... import pytree
from ...ops import reshape
from ...recompute import checkpoint as eager_checkpoint
from ...tensor import STATE_TRACE, Tensor
from .loops import scan

__all__ = ["checkpoint"]


def checkpoint(f: Callable) -> Callable:
    """``f`` that keeps only its inputs for backward and recomputes the rest (JAX's
    ``jax.checkpoint``, PyTorch's ``torch.utils.checkpoint``), eagerly and inside
    ``nbgrad.jit``. Arguments are tensors or pytrees of them (other leaves pass
    through); keyword arguments are passed as they are. Inside ``nbgrad.jit``, numbers
    in ``f``'s result come back as 0-d tensors (as under ``jax.checkpoint``)."""
    eager = eager_checkpoint(f)

    @functools.wraps(f)
    def checkpointed(*args, **kwargs):
        if STATE_TRACE.tracer is None:
            return eager(*args, **kwargs)
        return _traced(f, args, kwargs)

    return checkpointed


def _traced(f: Callable, args: tuple, kwargs: dict) -> Any:
    leaves, spec = pytree.flatten(args)
    where = [k for k, x in enumerate(leaves) if isinstance(x, Tensor)]
    rows = [reshape(leaves[k], (1,) + tuple(leaves[k].shape)) for k in where]

    def step(carry, xrows):
        filled = list(leaves)
        for k, r in zip(where, xrows, strict=True):
            filled[k] = r
        return carry, f(*pytree.unflatten(spec, filled), **kwargs)

    _, ys = scan(step, (), rows, length=1, _remat=True)
    return pytree.tree_map(lambda y: reshape(y, tuple(y.shape[1:])), ys)
