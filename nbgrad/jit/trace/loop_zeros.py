"""A loop's reversed loop without the cotangents that stay zero (finding F4).

Eager mode never differentiates what no output with a gradient reads. A loop node's
backward (:class:`~nbgrad.jit.trace.loops.LoopBackward`) runs its reversed loop with a
cotangent carried for every carry that requires grad, and seeds those of the outputs
without a gradient with zeros. A carry that the wanted outputs never read, over all the
steps (``c1' = c1 * x`` beside ``c0' = 2 c0 + x``, only ``c0`` used), keeps a zero
cotangent, and the reversed loop multiplies it by the step's derivative: ``0 * inf`` is
NaN where eager has no term at all (``nbgrad.jit(nbgrad.grad(f))`` at ``x = 1e308``; JAX
drops such carries as well). :func:`without_zero_cotangents` gives the loop's plan with
those cotangents taken out of the reversed loop: each body value that is zero because
of them (``mul`` by one, a sum of them; the rules are the ops' own, declared where they
register: :attr:`ScalarOp.zeros <nbgrad.kernels.elementwise.ScalarOp.zeros>` and the
linear kinds) is dropped, and ``a + 0`` reads ``a``. The reversed loop reads the same
per-step values as before (or fewer), so the forward loop does not change.

A carry that the wanted ones read but whose own final value is unread (``c0' = 2 c0 +
c1``) gets a nonzero cotangent one step in: :func:`peeled_run` runs the reversed loop's
first steps on their own, each without the cotangents still zero there (JAX gives NaN
there), then the rest of the loop. Loops with stacked inputs or outputs of their own
keep the zeros (``docs/reliability.md``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...autograd.forward import LINEAR_KINDS
from ...ops.registry import REGISTRY
from ...ops.traits import Elementwise, Matmul
from .autodiff import consts_for
from .ir import Graph, LoopInfo, Node, Var
from .passes import dce_nodes

__all__ = ["peeled_run", "without_zero_cotangents"]


def _live_carries(plan, wanted: set[int]) -> set[int]:
    """The carries whose values the ``wanted`` outputs read, over all the steps."""
    nc = plan.fwd_info.n_carry
    live = {k for k in wanted if k < nc}
    for k in wanted:
        if k >= nc:  # a stacked output reads carries in its step
            live |= {i for i in plan.step_reach[k] if i < nc}
    stack = list(live)
    while stack:
        for i in plan.step_reach[stack.pop()]:
            if i < nc and i not in live:
                live.add(i)
                stack.append(i)
    return live


def without_zero_cotangents(plan, wanted: set[int]):
    """``plan`` (a :class:`~nbgrad.jit.trace.loops.LoopPlan`) for a backward in which only
    the outputs ``wanted`` have gradients: its reversed loop without the cotangents of
    the carries those outputs never read, or None where there are none or a body value
    they reach is not known to stay zero (the plan is used as it is then)."""
    ct_carries = [i for kind, i in plan.recipe if kind == "ct" and i < plan.fwd_info.n_carry]
    live = _live_carries(plan, wanted)
    dead = tuple(j for j, i in enumerate(ct_carries) if i not in live)
    if not dead:
        return None
    cache = plan.bwd_info.body.cache
    key = ("without zero cotangents", dead)
    if key not in cache:
        cache[key] = _reduced(plan, dead)
    return cache[key]


def _zero_outputs(node: Node, zero: list[bool], known: list[bool]) -> bool | int | None:
    """What ``node`` gives when the inputs flagged in ``zero`` stay zero (``known``: zero
    by those or a zero constant): True (its outputs stay zero), an input position (the
    output is that input), or None (not known: the reduction gives up)."""
    op = REGISTRY.get(node.op)
    kind = None if op is None else op.kind
    if isinstance(kind, Elementwise):
        spec = kind.spec
        for group in spec.zeros:
            if all(known[p] for p in group if p < len(known)) and any(zero[p] for p in group):
                return True
        for p, q in spec.zero_identity:
            if zero[p] and node.inputs[q] is not None and \
                    node.inputs[q].shape == node.outputs[0].shape and \
                    node.inputs[q].dtype == node.outputs[0].dtype:
                return q
        return None
    if isinstance(kind, Matmul):  # zero by either product operand (and a zero bias)
        bias = kind.bias
        if bias is not None and bias < len(known) and node.inputs[bias] is not None \
                and not known[bias]:
            return None
        return True if known[0] or known[1] else None
    if isinstance(kind, LINEAR_KINDS):  # linear in its float inputs: zero by all of them
        floats = [k for k, v in enumerate(node.inputs) if v is not None and v.dtype.kind == "f"]
        return True if all(known[k] for k in floats) else None
    return None


def _simplified(body: Graph, zero_inputs: list[Var]):
    """``body``'s nodes and outputs when the ``zero_inputs`` are zero: ``(nodes, outputs,
    zero)`` with the ids of the values that are zero by them in ``zero``, or None where
    a node they reach has no known rule (``_zero_outputs``)."""
    zero = {id(v) for v in zero_inputs}
    const_zero = {id(v) for v, a in body.consts.items() if a.size and not np.any(a)}
    alias: dict[int, Var] = {}
    nodes: list[Node] = []
    for node in body.nodes:
        ins = tuple(None if v is None else alias.get(id(v), v) for v in node.inputs)
        flags = [v is not None and id(v) in zero for v in ins]
        if not any(flags):
            nodes.append(node if ins == node.inputs else
                         Node.of(node.op, ins, node.outputs, node.attrs))
            continue
        if node.op == "loop" or len(node.outputs) != 1:
            return None
        known = [f or (v is not None and id(v) in const_zero) for f, v in zip(flags, ins,
                                                                              strict=True)]
        what = _zero_outputs(Node.of(node.op, ins, node.outputs, node.attrs), flags, known)
        if what is None:
            return None
        if what is True:
            zero.add(id(node.outputs[0]))
        else:
            alias[id(node.outputs[0])] = ins[what]
    return nodes, [alias.get(id(v), v) for v in body.outputs], zero


def _zero_const(v: Var, consts: dict) -> Var:
    """A new constant of zeros of ``v``'s type, added to ``consts``."""
    z = v.like()
    consts[z] = np.zeros(v.shape, v.dtype)
    return z


def _reduced(plan, dead: tuple[int, ...]):
    """:func:`without_zero_cotangents`' plan, for the reversed loop's carries ``dead``."""
    info = plan.bwd_info
    body = info.body
    off = 1 if info.index is not None else 0
    got = _simplified(body, [body.inputs[off + j] for j in dead])
    if got is None:
        return None
    nodes, outputs, zero = got
    consts = dict(body.consts)
    kept_out = []
    for k, v in enumerate(outputs):
        if k in dead:  # a dropped carry's update (the reversed loop's first carries)
            if id(v) not in zero:
                return None
            continue
        kept_out.append(_zero_const(v, consts) if id(v) in zero else v)
    nodes = dce_nodes(nodes, kept_out)
    return _rebuilt(plan, dead, nodes, kept_out, consts)


def _rebuilt(plan, dead: tuple[int, ...], nodes: list[Node], outputs: list[Var],
             consts: dict):
    """The plan whose reversed loop has the body ``nodes`` -> ``outputs``, without the
    carries ``dead`` and without the stacked and invariant inputs nothing reads."""
    info = plan.bwd_info
    body = info.body
    off = 1 if info.index is not None else 0
    used = {id(v) for n in nodes for v in n.inputs if v is not None}
    used.update(id(v) for v in outputs)
    n_keep_carry = info.n_carry - len(dead)
    inputs = list(body.inputs[:off])
    recipe, xs_index, removed = [], [], set()
    for k, (v, step) in enumerate(zip(body.inputs[off:], plan.recipe, strict=True)):
        is_carry, is_xs = k < info.n_carry, info.n_carry <= k < info.n_carry + info.n_xs
        if (is_carry and k in dead) or (not is_carry and id(v) not in used):
            removed.add(off + k)
            continue
        inputs.append(v)
        recipe.append(step)
        if is_xs:
            xs_index.append(info.xs_index[k - info.n_carry])
    shift = {k: k - sum(1 for r in removed if r < k) for k in range(len(body.inputs))}
    recipe = [(kind, shift[k]) if kind == "zeros" else (kind, k) for kind, k in recipe]
    b_consts = consts_for(Graph(consts=consts), nodes, outputs)
    new_info = LoopInfo(info.count, n_keep_carry, len(xs_index), tuple(xs_index),
                        info.ys_index, info.index, Graph(inputs, b_consts, nodes, outputs))
    kept = [k for k in range(len(body.outputs)) if k not in dead]
    out_pos = {k: j for j, k in enumerate(kept)}
    grad_map = [(i, out_pos[k]) for i, k in plan.grad_map if k in out_pos]
    return replace(plan, bwd_info=new_info, recipe=recipe, grad_map=grad_map)


def _peel_step(plan, zero_pos: tuple[int, ...]) -> LoopInfo | None:
    """One step of ``plan``'s reversed loop with its carries at ``zero_pos`` zero (their
    inputs unread, every output kept), or None where a value they reach has no rule."""
    info = plan.bwd_info
    body = info.body
    key = ("peeled step", zero_pos)
    if key not in body.cache:
        off = 1 if info.index is not None else 0
        got = _simplified(body, [body.inputs[off + p] for p in zero_pos])
        step = None
        if got is not None:
            nodes, outputs, zero = got
            consts = dict(body.consts)
            outputs = [_zero_const(v, consts) if id(v) in zero else v for v in outputs]
            nodes = dce_nodes(nodes, outputs)
            step = replace(info, count=1, body=Graph(
                list(body.inputs), consts_for(Graph(consts=consts), nodes, outputs),
                nodes, outputs))
        body.cache[key] = step
    return body.cache[key]


def _from_step(info: LoopInfo, j: int, count: int) -> LoopInfo:
    """``info`` started ``j`` steps in, for ``count`` steps (its rows and counter moved)."""
    index = None if info.index is None else (info.index[0] + info.index[1] * j, info.index[1])
    return replace(info, count=count, index=index,
                   xs_index=tuple((start + step * j, step) for start, step in info.xs_index))


def peeled_run(plan, wanted: set[int], vals: list, apply_loop) -> list | None:
    """The outputs of ``plan``'s reversed loop on ``vals`` (``apply_loop(plan.bwd_info,
    vals)``), its first steps (the forward's last) run without the cotangents still zero
    there. A carry that only other carries read gets its first nonzero cotangent a step
    in (``c0' = 2 c0 + c1``, only ``c0`` used: ``c1`` from the second step back); eager
    has no term for it before, and a zero times an infinite derivative there is NaN.
    None where every carried cotangent is nonzero from the first step, or for a loop
    with stacked inputs or outputs of its own (the caller runs the loop as it is)."""
    fwd, info = plan.fwd_info, plan.bwd_info
    nc, count = fwd.n_carry, info.count
    cts = [i for kind, i in plan.recipe if kind == "ct"]
    if fwd.n_xs or plan.n_out != nc or info.ys_index or not count or \
            any(i >= nc for i in cts):
        return None
    have = {i for i in cts if i in wanted}
    steps = []
    while have != set(cts) and len(steps) < count:
        grown = have | {k for i in have for k in plan.step_reach[i] if k in cts}
        step = _peel_step(plan, tuple(p for p, i in enumerate(cts) if i not in have))
        if step is None or grown == have:  # (carries that stay zero: the plan keeps them)
            return None
        steps.append(step)
        have = grown
    if not steps:
        return None
    vals = list(vals)
    for j, step in enumerate(steps):
        outs = apply_loop(_from_step(step, j, 1), vals)
        vals[:info.n_carry] = outs[:info.n_carry]
    if len(steps) == count:
        return outs
    return apply_loop(_from_step(info, len(steps), count - len(steps)), vals)
