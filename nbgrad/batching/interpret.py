"""Run a traced graph on batched values, every node through the rule of its op kind.

A node whose inputs are all unbatched runs as it was recorded; any other node goes
through :func:`batch_node`: the rule of its kind (:data:`nbgrad.batching.rules.KIND_RULES`)
or, for an ``Opaque`` op, the rule family it declares
(:func:`nbgrad.batching.opaque.rule_for`). A loop node runs as one ``nbgrad.scan`` whose
body runs the loop's body graph batched.
An op without a rule raises :class:`~nbgrad.batching.core.BatchingError` naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..jit.trace.ir import CUSTOM_KINDS, LOOP, MARKERS, Graph, LoopInfo, Node, node_args
from ..jit.trace.loops import apply_loop, scan
from ..jit.trace.pythonop import replay_node
from ..ops import index_backward, index_select, permute
from ..ops.dispatch import apply
from ..ops.indexing import Index
from ..ops.registry import REGISTRY
from ..ops.traits import Opaque
from ..tensor import Tensor
from .core import BatchingError, Call, Value, broadcast_batch
from .opaque import rule_for
from .rules import KIND_RULES


def run_plain(node: Node, values: list) -> list[Tensor]:
    """Run a node as it was recorded (no batched input)."""
    if node.op == LOOP:
        return list(apply_loop(LoopInfo.of(node), values))
    if node.op in CUSTOM_KINDS:
        return list(replay_node(node, values))
    out = apply(REGISTRY[node.op], node_args(node, values))
    return list(out) if isinstance(out, (tuple, list)) else [out]


def batch_node(node: Node, values: list, batched: list[bool], size: int) -> list[Value]:
    """The batched outputs of ``node`` (at least one input is batched)."""
    if node.op == LOOP:
        return _batch_loop(node, values, batched, size)
    if node.op in MARKERS:
        return [(t, True) for t in replay_node(node, values)]
    if node.op in CUSTOM_KINDS:
        raise BatchingError(f"vmap: a custom autograd.Function ({node.op} node) has no "
                            "batching rule; write the function with nbgrad ops, or call it "
                            "in a Python loop")
    op = REGISTRY[node.op]
    rule = rule_for(op.kind.batch) if isinstance(op.kind, Opaque) else \
        KIND_RULES.get(type(op.kind))
    if rule is None:
        raise BatchingError(f"vmap: there is no batching rule for op '{node.op}' "
                            f"(kind {op.kind.label}); call it outside vmap, or in a Python "
                            "loop over the batch")
    outs = rule(Call(node, op, values, batched, size))
    return [(t, True) for t in outs]


def run_batched(graph: Graph, inputs: Sequence[Value], size: int) -> list[Value]:
    """Run ``graph`` with each input a ``(tensor, batched)`` pair; returns the outputs'."""
    env: dict[int, Value] = {id(v): x for v, x in zip(graph.inputs, inputs, strict=True)}
    for v, arr in graph.consts.items():
        env[id(v)] = (Tensor._make(arr), False)
    for node in graph.nodes:
        ins = [None if v is None else env[id(v)] for v in node.inputs]
        values = [None if x is None else x[0] for x in ins]
        batched = [x is not None and x[1] for x in ins]
        if any(batched):
            outs = batch_node(node, values, batched, size)
        else:
            outs = [(t, False) for t in run_plain(node, values)]
        for v, x in zip(node.outputs, outs, strict=True):
            env[id(v)] = x
    return [env[id(v)] for v in graph.outputs]


# ------------------------------------------------------------------ loops
def batched_vars(graph: Graph, flags: Sequence[bool]) -> list[bool]:
    """Which outputs of ``graph`` depend on its inputs flagged ``True``."""
    live = {id(v) for v, f in zip(graph.inputs, flags, strict=True) if f}
    for node in graph.nodes:
        if any(v is not None and id(v) in live for v in node.inputs):
            live.update(id(v) for v in node.outputs)
    return [id(v) in live for v in graph.outputs]


def _batch_loop(node: Node, values: list, batched: list[bool], size: int) -> list[Value]:
    """A loop node with batched inputs: one ``scan`` over its steps, whose body runs the
    body graph batched (carries that become batched are broadcast from the start)."""
    info = LoopInfo.of(node)
    nc, nx = info.n_carry, info.n_xs
    k = 1 if info.index is not None else 0
    carry_b = list(batched[:nc])
    while True:  # a carry is batched once anything batched flows into it
        flags = [False] * k + carry_b + list(batched[nc:])
        new = batched_vars(info.body, flags)[:nc]
        grown = [a or b for a, b in zip(carry_b, new, strict=True)]
        if grown == carry_b:
            break
        carry_b = grown
    carry = [broadcast_batch(t, size) if b and not was else t
             for t, b, was in zip(values[:nc], carry_b, batched[:nc], strict=True)]
    inv = list(zip(values[nc + nx:], batched[nc + nx:], strict=True))
    xs, xs_b = [], []
    steps = np.arange(info.count, dtype=np.int64)
    for t, b, (start, step) in zip(values[nc:nc + nx], batched[nc:nc + nx], info.xs_index,
                                   strict=True):
        rows = Tensor._make(start + step * steps)
        if b:  # (B, L, ...) -> the rows this loop reads, steps first: (count, B, ...)
            t = permute(t, (1, 0) + tuple(range(2, t.ndim)))
        xs.append(index_select(t, 0, rows))
        xs_b.append(b)
    index = Tensor._make(info.index[0] + info.index[1] * steps) if k else None
    y_flags: list[bool] = []

    def body(c, x):
        ins: list[Value] = []
        if k:
            ins.append((x[0], False))
        ins += list(zip(c, carry_b, strict=True))
        ins += list(zip(x[k:], xs_b, strict=True))
        outs = run_batched(info.body, ins + inv, size)
        new_c = [t if b or not want else broadcast_batch(t, size)
                 for (t, b), want in zip(outs[:nc], carry_b, strict=True)]
        y_flags[:] = [b for _, b in outs[nc:]]
        return new_c, [t for t, _ in outs[nc:]]

    final, ys = scan(body, carry, ([index] if k else []) + xs, length=info.count)
    results = [(t, b) for t, b in zip(final, carry_b, strict=True)]
    if not y_flags:  # an empty loop: the body never ran
        y_flags = batched_vars(info.body, [False] * k + carry_b + list(batched[nc:]))[nc:]
    for y, b, (start, step, length), var in zip(ys, y_flags, info.ys_index,
                                                node.outputs[nc:], strict=True):
        pos = start + step * steps
        if start == 0 and step == 1 and length == info.count:  # every row, in order
            if b:
                y = permute(y, (1, 0) + tuple(range(2, y.ndim)))
            results.append((y, b))
            continue
        if b:  # (count, B, ...) -> (B, length, ...)
            y = permute(y, (1, 0) + tuple(range(2, y.ndim)))
            sizes = (size, length) + tuple(var.shape[1:])
            idx = Index((slice(None), pos))
        else:
            sizes = (length,) + tuple(var.shape[1:])
            idx = Index((pos,))
        results.append((index_backward(y, sizes, idx), b))
    return results
