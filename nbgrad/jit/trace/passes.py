"""Graph passes: dead code, common subexpressions, constant folding, loop clean-up.

Each pass takes a :class:`~nbgrad.jit.trace.ir.Graph` and returns a new graph (the input
graph is never changed; nodes that stay the same are shared). :func:`optimize` runs
the standard pipeline; :data:`PASSES` lets other tiers add their own (tier 2 appends
its elementwise fusion there): a pass is a function ``Graph -> Graph``.

- :func:`dce`: drops nodes whose outputs are not needed, unused constants, unused
  loop outputs and loop carries nothing reads, inside loop bodies too.
- :func:`cse`: merges nodes with the same op, inputs and attributes.
- :func:`fold_constants`: evaluates nodes whose inputs are all constants (and
  :class:`~nbgrad.ops.traits.Fill` nodes such as ``zeros_like``, which only read a
  shape) into constants.
- :func:`hoist_invariants`: moves loop-body nodes that depend only on loop
  invariants out of the loop.
- :func:`peel_unread_carries`: before a graph is differentiated, takes a loop's last
  steps out of it where a carry nothing reads afterwards feeds the others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from ...ops.registry import kind_of
from ...ops.traits import Fill
from ..reference import replay_arrays
from .ir import IMPURE, LOOP, Graph, LoopInfo, Node, Var, _hash_value, inline_graph, make_loop

GraphPass = Callable[[Graph], Graph]


# ------------------------------------------------------------------ dead code
def dce_nodes(nodes: Sequence[Node], outputs: Sequence[Var | None]) -> list[Node]:
    """The nodes (in order) that some output needs, transitively."""
    live = {id(v) for v in outputs if v is not None}
    keep = []
    for node in reversed(nodes):
        if any(id(v) in live for v in node.outputs):
            keep.append(node)
            live.update(id(v) for v in node.inputs if v is not None)
    keep.reverse()
    return keep


def dce(graph: Graph) -> Graph:
    """Remove dead nodes, constants, loop outputs and loop carries (recursively)."""
    live = {id(v) for v in graph.outputs}
    keep: list[Node] = []
    for node in reversed(graph.nodes):
        if not any(id(v) in live for v in node.outputs):
            continue
        if node.op == LOOP:
            node = _prune_loop(node, live)
        keep.append(node)
        live.update(id(v) for v in node.inputs if v is not None)
    keep.reverse()
    consts = {v: a for v, a in graph.consts.items() if id(v) in live}
    return Graph(list(graph.inputs), consts, keep, list(graph.outputs))


def _prune_loop(node: Node, live: set[int]) -> Node:
    """Drop ys outputs and carries that nothing needs; clean the body."""
    info = LoopInfo.of(node)
    body = dce(info.body)  # inner loops first: an input only they pass on is not read
    nc, nx = info.n_carry, info.n_xs
    idx, carry, xs, inv = info.body_inputs()
    keep_y = [k for k in range(info.n_ys) if id(node.outputs[nc + k]) in live]
    # a carry is live if its result is used, or if the body's work for a live carry or
    # a kept ys reads it (grown to a fixed point: a carry that only feeds itself is dead)
    keep_c = {i for i in range(nc) if id(node.outputs[i]) in live}
    while True:
        outs = [body.outputs[i] for i in sorted(keep_c)] + [body.outputs[nc + k] for k in keep_y]
        nodes = dce_nodes(body.nodes, outs)
        read = {id(v) for n in nodes for v in n.inputs if v is not None}
        read.update(id(v) for v in outs)
        grown = {i for i in range(nc) if i not in keep_c and id(carry[i]) in read}
        if not grown:
            break
        keep_c |= grown
    kc = sorted(keep_c)
    keep_x = [k for k in range(nx) if id(xs[k]) in read]
    keep_i = [k for k in range(len(inv)) if id(inv[k]) in read]
    use_idx = idx is not None and id(idx) in read
    if (len(kc) == nc and len(keep_y) == info.n_ys and len(keep_x) == nx
            and len(keep_i) == len(inv) and use_idx == (idx is not None)
            and len(nodes) == len(body.nodes)):
        if body.nodes == info.body.nodes and len(body.consts) == len(info.body.consts):
            return node
        return make_loop(list(node.inputs), list(node.outputs), replace(info, body=body))
    b_inputs = ([idx] if use_idx else []) + [carry[i] for i in kc] + \
        [xs[k] for k in keep_x] + [inv[k] for k in keep_i]
    b_outputs = [body.outputs[i] for i in kc] + [body.outputs[nc + k] for k in keep_y]
    new_body = dce(Graph(b_inputs, body.consts, body.nodes, b_outputs))
    info2 = replace(info, n_carry=len(kc), n_xs=len(keep_x),
                    xs_index=tuple(info.xs_index[k] for k in keep_x),
                    ys_index=tuple(info.ys_index[k] for k in keep_y),
                    index=info.index if use_idx else None, body=new_body)
    ins = [node.inputs[i] for i in kc] + [node.inputs[nc + k] for k in keep_x] + \
        [node.inputs[nc + nx + k] for k in keep_i]
    outs = [node.outputs[i] for i in kc] + [node.outputs[nc + k] for k in keep_y]
    return make_loop(ins, outs, info2)


# ------------------------------------------------------------------ common subexpressions
def _attr_key(attrs: dict) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for k, v in attrs.items():
        h.update(k.encode() + b"=")
        _hash_value(v, h)
    return h.digest()


def cse(graph: Graph) -> Graph:
    """Merge nodes computing the same op on the same inputs with the same attributes."""
    rename: dict[int, Var] = {}
    seen: dict[tuple, Node] = {}
    # equal small constants become one
    const_key: dict[tuple, Var] = {}
    consts: dict[Var, np.ndarray] = {}
    for v, a in graph.consts.items():
        key = (a.dtype.str, a.shape, a.tobytes()) if a.size <= 64 else ("id", id(a))
        first = const_key.get(key)
        if first is None:
            const_key[key] = v
            consts[v] = a
        else:
            rename[id(v)] = first
    nodes: list[Node] = []
    for node in graph.nodes:
        ins = [None if v is None else rename.get(id(v), v) for v in node.inputs]
        if node.op == LOOP:
            info = LoopInfo.of(node)
            body = cse(info.body)
            info = replace(info, body=body)
            new = make_loop(ins, list(node.outputs), info)
        elif ins != list(node.inputs):
            new = Node(node.op, ins, node.outputs, node.attrs)
        else:
            new = node
        key = (new.op, tuple(id(v) if v is not None else None for v in ins),
               _attr_key(new.attrs),
               tuple((v.shape, v.dtype.str) for v in new.outputs))
        prev = seen.get(key)
        if prev is not None:
            for old, keep in zip(new.outputs, prev.outputs, strict=True):
                rename[id(old)] = keep
            continue
        seen[key] = new
        nodes.append(new)
    outputs = [rename.get(id(v), v) for v in graph.outputs]
    return Graph(list(graph.inputs), consts, nodes, outputs)


# ------------------------------------------------------------------ constant folding
#: constants larger than this stay computed (e.g. ones_like(x) of a big x): folding them
#: would put a large array into the graph, its hash and generated code
FOLD_MAX_ELEMENTS = 4096


def fold_constants(graph: Graph) -> Graph:
    """Evaluate nodes whose values do not depend on the graph's inputs (small ones)."""
    consts = dict(graph.consts)
    known = {id(v) for v in consts}
    nodes = []
    for node in graph.nodes:
        if node.op != LOOP and node.op not in IMPURE and (isinstance(kind_of(node.op), Fill) or all(
                v is None or id(v) in known for v in node.inputs)) and all(
                v.size <= FOLD_MAX_ELEMENTS for v in node.outputs):
            fake_ins = []
            for v in node.inputs:
                if v is None:
                    continue
                fake_ins.append(v)
            sub = Graph(fake_ins, {}, [node], list(node.outputs))
            arrays = [consts[v] if id(v) in known else np.zeros(v.shape, v.dtype)
                      for v in fake_ins]
            try:
                values = replay_arrays(sub, arrays)
            except Exception:  # an op that refuses its constant input: keep the node
                nodes.append(node)
                continue
            for v, a in zip(node.outputs, values, strict=True):
                consts[v] = np.array(a, copy=True)
                known.add(id(v))
            continue
        if node.op == LOOP:
            info = LoopInfo.of(node)
            body = fold_constants(info.body)
            if body is not info.body:
                info = replace(info, body=body)
                node = make_loop(list(node.inputs), list(node.outputs), info)
        nodes.append(node)
    if len(nodes) == len(graph.nodes) and all(a is b for a, b in zip(nodes, graph.nodes,
                                                                       strict=True)):
        return graph
    return Graph(list(graph.inputs), consts, nodes, list(graph.outputs))


# ------------------------------------------------------------------ loop-invariant code
def hoist_invariants(graph: Graph) -> Graph:
    """Move body nodes that read only invariants and constants out of their loop."""
    changed = False
    nodes: list[Node] = []
    consts = dict(graph.consts)
    for node in graph.nodes:
        if node.op != LOOP:
            nodes.append(node)
            continue
        info = LoopInfo.of(node)
        body = hoist_invariants(info.body)
        idx, carry, xs, inv = info.body_inputs()
        outer_of = {id(b): o for b, o in zip(inv, node.inputs[info.n_carry + info.n_xs:],
                                             strict=True)}
        for v in body.consts:
            outer_of.setdefault(id(v), None)
        hoisted: list[Node] = []
        kept: list[Node] = []
        new_inv: list[Var] = []
        new_outer: list[Var] = []
        for n in body.nodes:
            if n.op != LOOP and info.count > 0 and all(
                    v is None or id(v) in outer_of for v in n.inputs):
                outer_ins = []
                for v in n.inputs:
                    if v is None:
                        outer_ins.append(None)
                        continue
                    o = outer_of[id(v)]
                    if o is None:  # a body constant: make it a constant outside too
                        o = v.like()
                        consts[o] = body.consts[v]
                        outer_of[id(v)] = o
                    outer_ins.append(o)
                outs = [v.like() for v in n.outputs]
                hoisted.append(Node(n.op, outer_ins, outs, n.attrs))
                for bv, ov in zip(n.outputs, outs, strict=True):
                    outer_of[id(bv)] = ov
                    new_inv.append(bv)
                    new_outer.append(ov)
            else:
                kept.append(n)
        if not hoisted:
            if body is not info.body:
                info = replace(info, body=body)
                node = make_loop(list(node.inputs), list(node.outputs), info)
                changed = True
            nodes.append(node)
            continue
        changed = True
        nodes.extend(hoisted)
        b_inputs = list(body.inputs) + new_inv
        new_body = dce(Graph(b_inputs, body.consts, kept, list(body.outputs)))
        info = replace(info, body=new_body)
        nodes.append(make_loop(list(node.inputs) + new_outer, list(node.outputs), info))
    if not changed:
        return graph
    return Graph(list(graph.inputs), consts, nodes, list(graph.outputs))


# ------------------------------------------------------------------ last steps of loops
#: most final steps of a loop that :func:`peel_unread_carries` takes out of it
MAX_PEEL = 4


def _carries_read(info: LoopInfo, outs: set[int]) -> set[int]:
    """The carries one step of the loop reads to compute its carry outputs ``outs``."""
    body = info.body
    wanted = [body.outputs[k] for k in sorted(outs)]
    read = {id(v) for n in dce_nodes(body.nodes, wanted) for v in n.inputs if v is not None}
    read.update(id(v) for v in wanted)
    _, carry, _, _ = info.body_inputs()
    return {k for k, v in enumerate(carry) if id(v) in read}


def _steps_to_peel(info: LoopInfo, final: set[int]) -> int:
    """How many last steps to take out of the loop so that every carry the shortened
    loop returns is read after it (all of them for a short loop; 0: none needed, or more
    than :data:`MAX_PEEL`)."""
    now = final
    for t in range(min(MAX_PEEL, info.count) + 1):
        if t == info.count:
            return t  # every step out: no loop is left
        reads = _carries_read(info, now)
        if reads <= now:
            return t
        now = reads
    return 0


def _append_step(info: LoopInfo, j: int, carry: list[Var], inv: list[Var],
                 nodes: list[Node], consts: dict) -> list[Var]:
    """Append the body's nodes for step ``j`` (fresh values; the counter a constant) to
    ``nodes``; the carries after it."""
    body = info.body
    idx, b_carry, _, b_inv = info.body_inputs()
    m: dict[int, Var] = {id(b): v for b, v in zip(b_carry + b_inv, carry + inv, strict=True)}
    if idx is not None:
        start, step = info.index
        c = idx.like()
        consts[c] = np.array(start + step * j, idx.dtype)
        m[id(idx)] = c
    return inline_graph(body, m, nodes, consts)[:info.n_carry]


def peel_unread_carries(graph: Graph) -> Graph:
    """Take a loop's last steps out of it where a carry that nothing reads after the loop
    is read by the other carries' updates (``c0' = 2 c0 + c1``, ``c1' = c1 x``, only ``c0``
    used), before the graph is differentiated.

    Eager mode never differentiates the last updates of such a carry (nothing reads
    them); the loop's backward would give them a zero cotangent and multiply it by their
    derivative, ``0 * inf = NaN`` where that is infinite (finding F4). The loop runs
    ``t`` steps fewer and the body's nodes follow it once per peeled step, until every
    carry the shortened loop returns is read (at most :data:`MAX_PEEL` steps; loops
    with stacked inputs or outputs, or custom Functions, are left as they are); dead-code
    removal then drops the unread updates. Loops that need none are not touched.
    """
    read = {id(v) for n in graph.nodes for v in n.inputs if v is not None}
    read.update(id(v) for v in graph.outputs)
    nodes: list[Node] = []
    consts = dict(graph.consts)
    rename: dict[int, Var] = {}
    for node in graph.nodes:
        if rename:
            ins = [None if v is None else rename.get(id(v), v) for v in node.inputs]
            if any(a is not b for a, b in zip(ins, node.inputs, strict=True)):
                node = Node(node.op, ins, node.outputs, node.attrs)
        info = LoopInfo.of(node) if node.op == LOOP else None
        if info is None or info.n_xs or info.n_ys or \
                any(n.op in IMPURE for n in info.body.walk()):
            nodes.append(node)
            continue
        nc = info.n_carry
        peel = _steps_to_peel(info, {k for k in range(nc) if id(node.outputs[k]) in read})
        if not peel:
            nodes.append(node)
            continue
        carry = list(node.inputs[:nc])  # (every step peeled: the loop is gone)
        if peel < info.count:
            carry = [v.like() for v in node.outputs[:nc]]
            nodes.append(make_loop(list(node.inputs), carry,
                                   replace(info, count=info.count - peel)))
        inv = list(node.inputs[nc:])
        for j in range(info.count - peel, info.count):
            carry = _append_step(info, j, carry, inv, nodes, consts)
        rename.update((id(o), v) for o, v in zip(node.outputs, carry, strict=True))
    if not rename:
        return graph
    outputs = [rename.get(id(v), v) for v in graph.outputs]
    return dce(Graph(list(graph.inputs), consts, nodes, outputs))


#: the standard pipeline; tier 2 may append passes (e.g. elementwise fusion)
PASSES: list[GraphPass] = [fold_constants, cse, hoist_invariants, dce]

#: the passes a graph takes before it is differentiated (``nbgrad.jit``'s split of a
#: forward and a backward graph): not :func:`cse` or :func:`hoist_invariants`, which make
#: the backward sum the gradients of merged or hoisted uses before it multiplies by
#: their derivative, where eager multiplies each use's gradient first (at overflow,
#: ``inf * 0`` where eager has ``0``: finding F5); the split graphs are optimized whole
BEFORE_AUTODIFF: tuple[GraphPass, ...] = (fold_constants, dce, peel_unread_carries)


def optimize(graph: Graph, passes: Sequence[GraphPass] | None = None) -> Graph:
    """Run ``passes`` (default :data:`PASSES`) in order."""
    for p in (PASSES if passes is None else passes):
        graph = p(graph)
    return graph


# ------------------------------------------------------------------ loop gradients
def accumulate_into(nodes: list[Node], consts: dict, grad: Var, acc: Var,
                     outputs: list[Var]) -> bool:
    """When a step's gradient ``grad`` of an invariant is the final accumulator of an
    inner loop's gradient (a carry that starts at a zeros constant and only has terms
    added), start that carry at the outer accumulator ``acc`` instead (replacing the
    node in ``nodes``), so that no zeros and no outer add of the parameter's size are
    needed per step. Returns whether it did."""
    loop = next((n for n in nodes if n.op == LOOP and any(o is grad for o in n.outputs)),
                None)
    if loop is None:
        return False
    info = LoopInfo.of(loop)
    k = next(j for j, o in enumerate(loop.outputs) if o is grad)
    if k >= info.n_carry or loop.inputs[k] not in consts or consts[loop.inputs[k]].any():
        return False
    uses = sum(v is grad for n in nodes for v in n.inputs) + sum(v is grad for v in outputs)
    carry = info.body_inputs()[1][k]
    readers = [n for n in info.body.nodes if any(v is carry for v in n.inputs)]
    if uses or len(readers) != 1 or readers[0].op != "add" or \
            readers[0].outputs[0] is not info.body.outputs[k] or \
            any(v is carry for v in info.body.outputs):
        return False
    inputs = list(loop.inputs)
    inputs[k] = acc
    nodes[nodes.index(loop)] = Node(LOOP, inputs, list(loop.outputs), loop.attrs)
    return True
