"""Reverse-mode autodiff on the IR, from the derivative table (no second set of rules).

:func:`joint_graph` replays a graph with eager ops on inputs that require grad and
calls :func:`nbgrad.autograd.grad` on it under a tracer: the table's formulas run as
ordinary ops and are recorded, giving ``J(inputs, cotangents) -> (outputs,
gradients)``. :func:`partial_eval` splits ``J`` into its primal part (what does not
depend on a cotangent; run with the forward) and its tangent part (the backward),
and lists the primal values the tangent part reads (the residuals to save).
:func:`split_vjp` packages that for a whole graph: a forward graph that also returns
the residuals and a backward graph from residuals and cotangents to gradients.
:func:`reached_inputs` says which inputs a set of outputs reaches (as eager autograd
would: the others get no gradient, ``None``), loops counted step by step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ... import autograd
from ...grad_mode import enable_grad
from ...tensor import Tensor
from ..reference import replay
from .ir import LOOP, STOP_GRADIENT, Graph, LoopInfo, Node, Var
from .passes import cse, dce_nodes
from .tracer import Tracer


@dataclass
class Joint:
    """The traced joint graph and where its pieces are."""

    graph: Graph                 # inputs: the original inputs, then the cotangents
    inputs: list[Var]            # J's vars of the original inputs
    outputs: list[Var]           # J's vars of the original outputs
    diff: list[int]              # original outputs that get a cotangent
    cts: list[Var]               # their cotangent inputs
    wrt: list[int]               # original inputs differentiated (in order)
    grads: list[Var | None]      # gradient vars, None where an input was unused
    #: output k -> the inputs its cotangent reaches (:func:`reached_inputs`, cached)
    reach: dict[int, frozenset[int]] | None = field(default=None, repr=False)
    #: the gradients' values (None where unused), when ``cotangents`` were given
    values: list[np.ndarray | None] | None = field(default=None, repr=False)


def _merged(joint: Joint) -> Joint:
    """``joint`` with equal nodes merged (:func:`~nbgrad.jit.trace.passes.cse`) after the
    graph was differentiated (every joint graph: a jit split, a loop body's, a re-rolled
    trace's): a value two uses need is computed and saved once, while
    each use's gradient is still multiplied by its derivative before the sum, as eager
    mode does (merged before, the sum comes first: ``inf * 0`` at overflow, finding F5)."""
    g = joint.graph
    n = len(joint.outputs)
    merged = cse(Graph(list(g.inputs), g.consts, g.nodes,
                       joint.outputs + [v for v in joint.grads if v is not None]))
    rest = iter(merged.outputs[n:])
    grads = [None if v is None else next(rest) for v in joint.grads]
    return replace(joint, graph=merged, outputs=merged.outputs[:n], grads=grads, reach=None)


def joint_graph(graph: Graph, rg: Sequence[bool], example: Sequence[np.ndarray],
                out_mask: Sequence[bool] | None = None,
                cotangents: Sequence[np.ndarray] | None = None) -> Joint:
    """Trace the joint forward/backward graph of ``graph``.

    ``rg[i]``: input ``i`` is differentiated (floating inputs only); ``example``: values
    for the inputs (shapes and dtypes are what matter; values steer nothing);
    ``out_mask[k]``: output ``k`` may receive a cotangent (default: all);
    ``cotangents``: per output, the cotangent's value (then ``Joint.values`` holds the
    gradients' values; default: ones, values not kept).
    """
    tracer = Tracer(implicit_inputs=False, cut_gradients=False)
    leaves = []
    for v, arr, r in zip(graph.inputs, example, rg, strict=True):
        t = Tensor._make(np.array(arr, dtype=v.dtype, copy=True).reshape(v.shape))
        if r and v.dtype.kind == "f":
            t._requires_grad = True
        leaves.append(t)
    with tracer, np.errstate(all="ignore"):
        in_vars = [tracer.add_input(t) for t in leaves]
        with enable_grad():
            outs = replay(graph, leaves)
        diff = [k for k, o in enumerate(outs)
                if o._requires_grad and (out_mask is None or out_mask[k])
                and o.dtype.kind == "f"]
        cts = [Tensor._make(np.ones(outs[k].shape, outs[k].dtype) if cotangents is None
                            else np.array(cotangents[k], dtype=outs[k].dtype, copy=True))
               for k in diff]
        ct_vars = [tracer.add_input(t) for t in cts]
        wrt = [i for i, t in enumerate(leaves) if t._requires_grad]
        if diff and wrt:
            grads = autograd.grad([outs[k] for k in diff], [leaves[i] for i in wrt],
                                  grad_outputs=cts, allow_unused=True)
        else:
            grads = [None] * len(wrt)
        out_vars = [tracer.var_of(o) for o in outs]
        grad_vars = [None if g is None else tracer.var_of(g) for g in grads]
    values = None if cotangents is None else [None if g is None else g._data for g in grads]
    return _merged(Joint(tracer.graph, in_vars, out_vars, diff, ct_vars, wrt, grad_vars,
                         values=values))


def partial_eval(joint: Joint) -> tuple[list[Node], list[Node], list[Var]]:
    """(primal nodes, tangent nodes, residuals): residuals are the non-constant primal
    vars that the tangent part or a gradient output reads, in first-use order."""
    g = joint.graph
    tangent = {id(v) for v in joint.cts}
    tnodes, pnodes = [], []
    for node in g.nodes:
        if any(v is not None and id(v) in tangent for v in node.inputs):
            tnodes.append(node)
            tangent.update(id(v) for v in node.outputs)
        else:
            pnodes.append(node)
    consts = {id(v) for v in g.consts}
    needed: list[Var] = []
    seen: set[int] = set()

    def need(v: Var | None) -> None:
        if v is not None and id(v) not in tangent and id(v) not in consts and id(v) not in seen:
            seen.add(id(v))
            needed.append(v)

    for node in tnodes:
        for v in node.inputs:
            need(v)
    for v in joint.grads:
        need(v)
    return pnodes, tnodes, needed


def consts_for(graph: Graph, nodes: Sequence[Node], outputs: Sequence[Var | None]
               ) -> dict[Var, np.ndarray]:
    """The constants of ``graph`` that ``nodes`` or ``outputs`` read."""
    used = {id(v) for n in nodes for v in n.inputs if v is not None}
    used.update(id(v) for v in outputs if v is not None)
    return {v: a for v, a in graph.consts.items() if id(v) in used}


@dataclass
class VJPSplit:
    """A graph's forward-with-residuals and backward graphs."""

    joint: Joint
    fwd: Graph            # original inputs -> original outputs + residuals
    n_out: int            # original outputs
    bwd: Graph            # residuals, needed inputs, cotangents -> one gradient per wrt
    bwd_inputs: list[tuple[str, int]]  # ("res", r) | ("in", i) | ("ct", k): how to fill bwd


def split_vjp(graph: Graph, rg: Sequence[bool], example: Sequence[np.ndarray]) -> VJPSplit:
    """Forward and backward graphs of ``graph`` for the inputs flagged in ``rg``."""
    joint = joint_graph(graph, rg, example)
    pnodes, tnodes, needed = partial_eval(joint)
    pos = {id(v): i for i, v in enumerate(joint.inputs)}
    residuals = [v for v in needed if id(v) not in pos]
    outputs = joint.outputs + residuals
    f_nodes = dce_nodes(pnodes, outputs)
    fwd = Graph(list(joint.inputs), consts_for(joint.graph, f_nodes, outputs), f_nodes, outputs)
    b_inputs: list[Var] = []
    recipe: list[tuple[str, int]] = []
    for r, v in enumerate(residuals):
        b_inputs.append(v)
        recipe.append(("res", r))
    for v in needed:
        if id(v) in pos:
            b_inputs.append(v)
            recipe.append(("in", pos[id(v)]))
    for k, ct in zip(joint.diff, joint.cts, strict=True):
        b_inputs.append(ct)
        recipe.append(("ct", k))
    extra: dict[Var, np.ndarray] = {}
    b_outputs = []
    for i, gv in zip(joint.wrt, joint.grads, strict=True):
        if gv is None:
            gv = joint.inputs[i].like()
            extra[gv] = np.zeros(gv.shape, gv.dtype)
        b_outputs.append(gv)
    b_nodes = dce_nodes(tnodes, b_outputs)
    consts = consts_for(joint.graph, b_nodes, b_outputs)
    consts.update(extra)
    bwd = Graph(b_inputs, consts, b_nodes, b_outputs)
    return VJPSplit(joint, fwd, len(joint.outputs), bwd, recipe)


# ------------------------------------------------------------------ reachability
def dependents(graph: Graph, seeds: set[int]) -> set[int]:
    """ids of the vars of ``graph`` that a gradient can reach from the vars in ``seeds``
    (a loop output depends only on the loop inputs it reads over its steps:
    :func:`loop_reach`; no gradient crosses a StopGradient marker)."""
    dep = set(seeds)
    for node in graph.nodes:
        if node.op == STOP_GRADIENT:
            continue
        hit = {k for k, v in enumerate(node.inputs) if v is not None and id(v) in dep}
        if not hit:
            continue
        if node.op == LOOP:
            reach = loop_reach(LoopInfo.of(node))
            dep.update(id(v) for v, r in zip(node.outputs, reach, strict=True) if r & hit)
        else:
            dep.update(id(v) for v in node.outputs)
    return dep


def unrolled_reach(count: int, n_carry: int, step: Sequence[frozenset[int]],
                   wanted: set[int]) -> set[int]:
    """The loop inputs (carries, xs, invariants, numbered as the body's inputs without
    the index) that loop outputs ``wanted`` (final carries, then ys) read over ``count``
    steps, when body output ``o`` reads body inputs ``step[o]`` in one step."""
    ys = {o for o in wanted if o >= n_carry}
    live = frozenset(o for o in wanted if o < n_carry)
    other: set[int] = set()
    seq = [live]
    first = {live: 0}
    for t in range(1, count + 1):
        ins = set().union(*(step[o] for o in live | ys))
        other |= {i for i in ins if i >= n_carry}
        live = frozenset(i for i in ins if i < n_carry)
        if live in first:  # the carries read repeat with a period: jump to the end
            m0 = first[live]
            live = seq[m0 + (count - m0) % (t - m0)]
            break
        first[live] = t
        seq.append(live)
    return set(live) | other


def loop_reach(info: LoopInfo) -> list[frozenset[int]]:
    """Per output of a loop node: the positions of the node inputs it depends on."""
    key = ("reach", info.count, info.xs_index, info.ys_index, info.index)
    reach = info.body.cache.get(key)
    if reach is None:
        off = 1 if info.index is not None else 0
        body = info.body
        step: list[set[int]] = [set() for _ in body.outputs]
        for i, v in enumerate(body.inputs[off:]):
            dep = dependents(body, {id(v)})
            for o, out in enumerate(body.outputs):
                if id(out) in dep:
                    step[o].add(i)
        frozen = [frozenset(s) for s in step]
        reach = [frozenset(unrolled_reach(info.count, info.n_carry, frozen, {o}))
                 for o in range(len(body.outputs))]
        info.body.cache[key] = reach
    return reach


def gradient_reach(joint: Joint) -> dict[int, frozenset[int]]:
    """Per differentiated output ``k``: the inputs (indices into the original inputs)
    whose gradient its cotangent reaches. A gradient that reads no cotangent at all
    counts as reached from every output."""
    reach: dict[int, set[int]] = {k: set() for k in joint.diff}
    deps = {k: dependents(joint.graph, {id(ct)}) for k, ct in zip(joint.diff, joint.cts,
                                                                  strict=True)}
    for i, g in zip(joint.wrt, joint.grads, strict=True):
        if g is None:
            continue
        hit = [k for k in joint.diff if id(g) in deps[k]]
        for k in hit or joint.diff:
            reach[k].add(i)
    return {k: frozenset(r) for k, r in reach.items()}


def reached_inputs(joint: Joint, has_grad: Sequence[bool]) -> set[int]:
    """The inputs that outputs with ``has_grad[k]`` (a cotangent given) reach."""
    reach = joint.reach
    if reach is None:
        reach = joint.reach = gradient_reach(joint)
    out: set[int] = set()
    for k, r in reach.items():
        if k < len(has_grad) and has_grad[k]:
            out |= r
    return out
