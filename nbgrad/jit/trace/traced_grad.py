"""``autograd.grad`` under a trace, from the re-rolled forward (issue 15 item 3).

Tracing ``nbgrad.jit(nbgrad.grad(f))`` runs ``f`` eagerly, then the eager backward, and
records both: a Python loop of ``T`` steps traces ``T`` copies of the step's forward and
of its (longer) backward, which are then re-rolled. When the forward re-rolls, the
backward need not be traced op by op: :func:`traced_grad` takes the traced forward (the
nodes from the differentiated tensors to the outputs), re-rolls it, differentiates that
graph (:func:`~nbgrad.jit.trace.autodiff.joint_graph`: a loop node's gradient is one
reversed loop node, built from one step) and appends the result to the trace, with its
values (computed natively, as the graph's loops run).

It applies only where that graph's gradient is eager autograd's by construction, and
otherwise declines (returns None: the engine runs as before): the tracer is a jit's own
(top level, marking gradient cuts, no input carrying a gradient of the jit itself), no
``create_graph``, no forward mode or anomaly mode; every autograd node reached from the
outputs is a table op's node or a leaf's accumulator, without hooks; the inputs are
leaves, each its own traced value; and the traced nodes on a differentiable path from the
inputs to the outputs are as many as the autograd nodes on a path from the outputs to
the inputs (eager records a subset of the traced ops, so equal counts mean the same
nodes: a ``detach()``, a ``no_grad()`` block or a custom Function on the way declines);
and the forward re-rolls into at least one loop node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...autograd import forward
from ...autograd.anomaly import ANOMALY
from ...autograd.engine import count_dependencies, nodes_leading_to
from ...autograd.node import AccumulateGrad, gradient_edge
from ...autograd.record import OpNode
from ...ops.registry import REGISTRY
from ...tensor import Tensor
from .autodiff import consts_for, joint_graph
from .ir import CUSTOM_KINDS, LOOP, Graph, Node, Var
from .passes import dce_nodes
from .reroll import reroll
from .tracer import GRAD_FROM_REROLL

#: traced forward nodes below which the eager backward is traced as before
MIN_FORWARD = 64

#: how many times :func:`traced_grad` differentiated a re-rolled forward (for tests)
STATS = {"rerolled": 0}


def traced_grad(tracer, outs: Sequence[Tensor], roots: list, implicit: Sequence[bool],
                ins: Sequence[Tensor], retain_graph: bool) -> list | None:
    """The gradients of ``outs`` (``roots``: their ``(edge, cotangent)`` pairs;
    ``implicit[k]``: cotangent ``k`` is the implicit ``ones``) with respect to ``ins``,
    recorded in ``tracer`` from the re-rolled forward, or None (see the module)."""
    if (tracer.parent is not None or not tracer.cut_gradients or not tracer.implicit_inputs
            or tracer._carry or forward.STATE.active or ANOMALY._enabled):
        return None
    found = _autograd_nodes(roots, ins)
    if found is None:
        return None
    ops, edges = found
    found = _forward_of(tracer, outs, ins, (len(ops), edges))
    if found is None:
        return None
    fwd, leaf_vars, ext_vars, ext_arrays = found
    cts = [np.ones(o.shape, o.dtype) if imp else g._data
           for o, (_, g), imp in zip(outs, roots, implicit, strict=True)]
    try:
        rolled = reroll(fwd)
        if not any(n.op == LOOP for n in rolled.nodes):
            return None
        joint = joint_graph(rolled, [True] * len(ins) + [False] * len(ext_vars),
                            [t._data for t in ins] + ext_arrays, cotangents=cts)
    except Exception:  # noqa: BLE001 - anything this path cannot do, the engine does
        return None
    if joint.diff != list(range(len(outs))) or joint.values is None:
        return None
    # ---- from here on nothing fails: record the gradient in the trace
    ct_vars = [tracer.constant(c) if imp else tracer.var_of(g)
               for c, (_, g), imp in zip(cts, roots, implicit, strict=True)]
    rename = {id(j): v for j, v in zip(joint.inputs, leaf_vars + ext_vars, strict=True)}
    rename.update((id(j), v) for j, v in zip(joint.cts, ct_vars, strict=True))
    want = [g for g in joint.grads if g is not None] + list(joint.outputs)
    jg = joint.graph
    nodes = dce_nodes(jg.nodes, want)
    graph = tracer.graph
    for v, arr in consts_for(jg, nodes, want).items():
        graph.consts[v] = arr
    dyn = tracer._dynamic
    for node in nodes:
        if any(v is not None and id(v) in rename for v in node.inputs):
            node = Node(node.op, [None if v is None else rename.get(id(v), v)
                                  for v in node.inputs], node.outputs, node.attrs)
        graph.nodes.append(node)
        dyn.update(id(v) for v in node.outputs)
    # the outputs now read the re-rolled forward (the unrolled one becomes dead code)
    for o, jv in zip(outs, joint.outputs, strict=True):
        v = rename.get(id(jv), jv)
        tracer.bind(o, v, tracer.is_dynamic(v))
    results: list = []
    for gv, value in zip(joint.grads, joint.values, strict=True):
        if gv is None:
            results.append(None)
            continue
        v = rename.get(id(gv), gv)
        t = Tensor._make(value)
        tracer.bind(t, v, tracer.is_dynamic(v))
        results.append(t)
    if not retain_graph:  # as the engine, which frees the saved values of what it ran
        for node in ops:
            node.saved = None
    STATS["rerolled"] += 1
    return results


def _autograd_nodes(roots: list, ins: Sequence[Tensor]) -> tuple[list, int] | None:
    """The table ops' autograd nodes on a path from the roots to ``ins`` (leaves) and
    how many edges join the nodes on such paths, or None when some node reached is not
    a plain table op's node (or a leaf's accumulator) without hooks."""
    captures = []
    for t in ins:
        if t.grad_fn is not None or not t._requires_grad:
            return None
        captures.append(gradient_edge(t)[0])
    root_nodes = list(dict.fromkeys(edge[0] for edge, _ in roots))
    parents: dict = {}
    deps = count_dependencies(root_nodes, parents)
    for node in list(deps) + root_nodes:
        if node._pre_hooks or node._retain:
            return None
        if type(node) is OpNode:
            if node._post_hooks or node.saved is None:
                return None
        elif type(node) is not AccumulateGrad or node.variable._hooks:
            return None
    needed = nodes_leading_to(root_nodes, set(captures), parents)
    ops = [n for n in needed if type(n) is OpNode]
    edges = sum(e is not None and e[0] in needed for n in ops for e in n.next_edges)
    return ops, edges


def _forward_of(tracer, outs: Sequence[Tensor], ins: Sequence[Tensor],
                counts: tuple[int, int]):
    """(forward graph, its differentiated input vars, its other input vars and their
    values) of the traced nodes from ``ins`` to ``outs``, or None when they are too few,
    or are not eager's graph (``counts``: its nodes and edges; the traced ones are a
    superset, so equal counts mean the same graph), or a value is not at hand."""
    leaf_vars = [tracer.lookup(t) for t in ins]
    out_vars = [tracer.lookup(t) for t in outs]
    if any(v is None or not tracer.is_dynamic(v) for v in leaf_vars + out_vars) \
            or len({id(v) for v in leaf_vars}) != len(leaf_vars):
        return None
    nodes = tracer.graph.nodes
    anydep = {id(v) for v in leaf_vars}  # depends on an input at all
    diffdep = set(anydep)                # through differentiable ops (as autograd records)
    first = None
    for i, node in enumerate(nodes):
        if not any(v is not None and id(v) in anydep for v in node.inputs):
            continue
        if first is None:
            first = i
        anydep.update(id(v) for v in node.outputs)
        if node.op in CUSTOM_KINDS or node.op == LOOP:
            return None  # (autograd has other node types there: declined already)
        op = REGISTRY[node.op]
        if op.differentiable and any(v is not None and id(v) in diffdep for v in node.inputs):
            out_diff = op.out_diff
            diffdep.update(id(v) for k, v in enumerate(node.outputs)
                           if v.dtype.kind == "f"
                           and (out_diff[k] if k < len(out_diff) else out_diff[-1]))
    if first is None or any(id(v) not in diffdep for v in out_vars):
        return None
    # backwards from the outputs: the nodes that depend on the inputs and that the
    # outputs read (the forward), and among them those on a differentiable path
    live = {id(v) for v in out_vars}
    on_path = {id(v) for v in out_vars}
    picked: list[int] = []  # indices of the forward's nodes, last first
    n_path = n_edges = 0
    for i in range(len(nodes) - 1, first - 1, -1):
        node = nodes[i]
        if not any(id(v) in live for v in node.outputs) or \
                not any(id(v) in anydep for v in node.outputs):
            continue
        picked.append(i)
        live.update(id(v) for v in node.inputs if v is not None)
        if any(id(v) in on_path for v in node.outputs) and \
                REGISTRY[node.op].differentiable and \
                any(v is not None and id(v) in diffdep for v in node.inputs):
            n_path += 1
            n_edges += sum(v is not None and id(v) in diffdep for v in node.inputs)
            on_path.update(id(v) for v in node.inputs if v is not None and id(v) in diffdep)
    if (n_path, n_edges) != counts or len(picked) < MIN_FORWARD:
        return None
    # the values the forward reads from outside: constants, recomputed by the nodes
    # that made them from the trace's inputs (so that a step's ``w.T`` stays one value
    # per step for re-rolling), or the arrays the trace holds (inputs, loop outputs)
    consts = tracer.graph.consts
    arrays: dict[int, np.ndarray] | None = None
    made = {id(v) for i in picked for v in nodes[i].outputs} | {id(v) for v in leaf_vars}
    producer: dict[int, int] | None = None
    ext_vars: list[Var] = []
    ext_arrays: list[np.ndarray] = []
    used_consts = {}
    seen: set[int] = set()
    stack = list(picked)
    while stack:
        for v in nodes[stack.pop()].inputs:
            if v is None or id(v) in made or id(v) in seen:
                continue
            seen.add(id(v))
            if v in consts:
                used_consts[v] = consts[v]
                continue
            if producer is None:
                producer = {id(o): k for k, n in enumerate(nodes) for o in n.outputs}
            k = producer.get(id(v))
            if k is not None and nodes[k].op not in CUSTOM_KINDS and nodes[k].op != LOOP:
                picked.append(k)
                made.update(id(o) for o in nodes[k].outputs)
                stack.append(k)
                continue
            if arrays is None:
                arrays = _arrays_of(tracer)
            arr = arrays.get(id(v))
            if arr is None:
                return None
            ext_vars.append(v)
            ext_arrays.append(arr)
    fwd_nodes = [nodes[i] for i in sorted(set(picked))]
    fwd = Graph(leaf_vars + ext_vars, used_consts, fwd_nodes, out_vars)
    return fwd, leaf_vars, ext_vars, ext_arrays


def _arrays_of(tracer) -> dict[int, np.ndarray]:
    """id(var) -> the array bound to it, for the bound arrays alive and unmodified."""
    out = {}
    for ref, box, version, v in tracer._env.values():
        arr = ref()
        if arr is not None and box[0] == version and isinstance(arr, np.ndarray):
            out[id(v)] = arr
    return out


GRAD_FROM_REROLL.append(traced_grad)  # what Tracer.traced_grad calls
