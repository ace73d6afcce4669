"""Gradient checkpointing: keep a function's inputs, recompute its inside during backward.

``nbgrad.checkpoint(f)`` returns a function that computes ``f`` and records one node
that saved only the inputs: its backward runs ``f`` again (with ``nbgrad.random``'s
generator set back to where it was, so dropout draws the same masks) and propagates the
output gradients through that recomputation. The intermediate values of ``f`` are freed
when it returns, so a chain of checkpointed segments keeps one input per segment instead
of every intermediate value. ``fori_loop``/``scan`` use it with ``checkpoint=``:
:func:`loop_segments` picks the segments (``sqrt``: about ``sqrt(T)`` segments of
``sqrt(T)`` steps, so about ``2 sqrt(T)`` carries live; ``log``: recursive halving, about
``2 log2(T)`` carries live at the price of ``log2(T)`` recomputations of each step).

Tensors ``f`` closes over take part as in eager mode: gradients reach them too. The
recomputation's gradients stop at ``f``'s inputs and at the tensors it closed over; the
engine carries them on from there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from . import pytree
from . import random as nb_random
from .autograd.engine import GraphTask
from .autograd.node import AccumulateGrad, Node, SavedTensor, gradient_edge
from .errors import TracerError
from .grad_mode import STATE, enable_grad
from .ops import clone, view
from .tensor import STATE_TRACE, Tensor

__all__ = ["checkpoint", "loop_segments"]


class _StopAtCaptures(GraphTask):
    """A walk over the recomputed graph only (nodes made from ``first_seq`` on): it
    records the gradients reaching the captured edges and runs nothing beyond them (the
    engine that called the checkpoint node carries on from there)."""

    def __init__(self, first_seq: int, create_graph: bool, capture: list) -> None:
        super().__init__(retain_graph=create_graph, create_graph=create_graph,
                         capture=capture)
        self.first_seq = first_seq

    def execute(self, node: Node, grads: list) -> None:
        captured = False
        for nr, g in enumerate(grads):  # no hooks here: they run when the engine that
            for idx in self.captured.get((node, nr), ()):  # called us delivers these
                self.results[idx] = g
                captured = True
        if captured or node.seq < self.first_seq or isinstance(node, AccumulateGrad):
            return
        super().execute(node, grads)


class CheckpointBackward(Node):
    """Runs the checkpointed function again and propagates through that run."""

    __slots__ = ("fn", "spec", "leaves", "saved", "diff", "outer", "rng_state", "out_meta",
                 "kwargs")

    def name(self) -> str:
        return "CheckpointBackward"

    def release(self) -> None:
        self.saved = None

    def apply(self, grads: list, create_graph: bool) -> list:
        if self.saved is None:
            raise RuntimeError("checkpoint: backward through the same checkpointed call a "
                               "second time; pass retain_graph=True the first time")
        leaves = [s.unpack(self) if isinstance(s, SavedTensor) else s for s in self.saved]
        after = _set_rng(self.rng_state)
        first_seq = Node([]).seq
        try:
            with enable_grad():
                stand_ins = list(leaves)
                for k in self.diff:
                    stand_ins[k] = _stand_in(leaves[k])
                outs = pytree.flatten(self.fn(*pytree.unflatten(self.spec, stand_ins),
                                              **self.kwargs))[0]
        finally:
            _set_rng(after)
        roots = []
        for (k, _), g in zip(self.out_meta, grads, strict=False):
            if g is not None and outs[k].requires_grad:
                roots.append((gradient_edge(outs[k]), g))
        n_in = len(self.diff)
        if not roots:
            return [None] * (n_in + len(self.outer))
        capture = [gradient_edge(stand_ins[k]) for k in self.diff] + list(self.outer)
        task = _StopAtCaptures(first_seq, create_graph, capture)
        return task.run(roots)


def _stand_in(t: Tensor) -> Tensor:
    """A fresh tensor for ``t`` whose graph joins ``t``'s (so double backward works)."""
    return view(t, *t.shape) if t._data.flags.c_contiguous else clone(t)


def _set_rng(state):
    """Put ``nbgrad.random``'s generator at ``state``; return where it was."""
    bit_generator = nb_random._GENERATOR.bit_generator
    before = bit_generator.state
    if state is not None:
        bit_generator.state = state
    return before


def _external_edges(outputs: list[Tensor], inputs: set[int], first_seq: int) -> list:
    """The edges by which ``f``'s graph reaches tensors made before it ran (closed over),
    other than its inputs: ``(node, output_nr)`` of every such first crossing."""
    found: dict = {}
    seen: set[int] = set()
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for edge in node.next_edges:
            if edge is None:
                continue
            nxt = edge[0]
            if isinstance(nxt, AccumulateGrad):
                if id(nxt.variable) not in inputs:
                    found[(id(nxt), edge[1])] = edge
            elif nxt.seq < first_seq:
                found[(id(nxt), edge[1])] = edge
            else:
                stack.append(nxt)
    return list(found.values())


def checkpoint(f: Callable) -> Callable:
    """``f`` that keeps only its inputs for backward and recomputes the rest (JAX's
    ``jax.checkpoint``, PyTorch's ``torch.utils.checkpoint``).

    Arguments are tensors or pytrees of them (other leaves pass through); keyword
    arguments are passed as they are. This is the eager half of ``nbgrad.checkpoint``
    (:mod:`nbgrad.jit.trace.remat`), which also compiles inside ``nbgrad.jit``; called
    directly while tracing, it raises.
    """

    @functools.wraps(f)
    def checkpointed(*args, **kwargs):
        if STATE_TRACE.tracer is not None:
            raise TracerError("nbgrad.recompute.checkpoint is the eager half of "
                              "nbgrad.checkpoint; inside nbgrad.jit use nbgrad.checkpoint")
        if not STATE.grad_enabled:
            return f(*args, **kwargs)
        leaves, spec = pytree.flatten(args)
        diff = tuple(k for k, x in enumerate(leaves) if isinstance(x, Tensor)
                     and x._requires_grad and x.dtype.kind == "f")
        rng_state = _set_rng(None)
        first_seq = Node([]).seq
        stand_ins = list(leaves)
        for k in diff:  # leaves of f's own graph, dropped when f returns
            stand_ins[k] = Tensor._make(leaves[k]._data, requires_grad=True,
                                        device=leaves[k]._device)
        out = f(*pytree.unflatten(spec, stand_ins), **kwargs)
        out_leaves, out_spec = pytree.flatten(out)
        live = [(k, o) for k, o in enumerate(out_leaves)
                if isinstance(o, Tensor) and o._requires_grad]
        if not live:
            return out
        outer = _external_edges([o for _, o in live], {id(stand_ins[k]) for k in diff},
                                first_seq)
        node = CheckpointBackward([gradient_edge(leaves[k]) for k in diff] + outer)
        node.fn, node.spec, node.kwargs, node.diff = f, spec, kwargs, diff
        node.outer = outer
        node.rng_state = rng_state
        node.saved = [SavedTensor(x, "checkpoint input") if isinstance(x, Tensor) else x
                      for x in leaves]
        node.out_meta = [(k, (o.shape, o.dtype)) for k, o in live]
        result = list(out_leaves)
        for nr, (k, o) in enumerate(live):
            result[k] = Tensor._make(o._data, requires_grad=True, grad_fn=node,
                                     output_nr=nr, device=o._device)
        return pytree.unflatten(out_spec, result)

    return checkpointed


def loop_segments(count: int, how: bool | int | str) -> list[tuple[int, int, bool]]:
    """How ``fori_loop``/``scan`` split ``count`` steps for ``checkpoint=how``: a list of
    ``(start, stop, nested)`` segments, each run under :func:`checkpoint`; ``nested``
    segments split again the same way inside (the ``log`` schedule).

    ``True`` or ``"sqrt"``: segments of ``ceil(sqrt(count))`` steps; an int ``k``:
    segments of ``k`` steps; ``"log"``: halves, recursively, down to 2 steps.
    """
    if how is True or how == "sqrt":
        size = max(1, math.isqrt(max(count - 1, 0)) + 1)
    elif how == "log":
        if count <= 2:
            return [(0, count, False)]
        half = count // 2
        return [(0, half, True), (half, count, True)]
    elif isinstance(how, int) and not isinstance(how, bool) and how >= 1:
        size = how
    else:
        raise ValueError(f"checkpoint={how!r}: expected True, 'sqrt', 'log' or a segment "
                         "length >= 1")
    return [(s, min(s + size, count), False) for s in range(0, count, size)]


def checkpointed_steps(step: Callable[[int, Any], Any], count: int, how, carry: Any) -> Any:
    """``carry = step(k, carry)`` for ``k`` in ``range(count)``, in checkpointed segments
    (see :func:`loop_segments`)."""
    if STATE_TRACE.tracer is not None:
        raise TracerError("checkpoint= in fori_loop/scan is not supported inside nbgrad.jit "
                          "yet; use it outside nbgrad.jit")

    def run(start: int, stop: int, nested: bool, c: Any) -> Any:
        if nested and stop - start > 2:
            for s, e, inner in loop_segments(stop - start, how):
                c = checkpoint(functools.partial(run, start + s, start + e, inner))(c)
            return c
        for k in range(start, stop):
            c = step(k, c)
        return c

    for s, e, nested in loop_segments(count, how):
        carry = checkpoint(functools.partial(run, s, e, nested))(carry)
    return carry
