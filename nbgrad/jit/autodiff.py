"""Reverse-mode autodiff on the IR, from the derivative table (no second set of rules).

:func:`joint_graph` replays a graph with eager ops on inputs that require grad and
calls :func:`nbgrad.autograd.grad` on it under a tracer: the table's formulas run as
ordinary ops and are recorded, giving ``J(inputs, cotangents) -> (outputs,
gradients)``. :func:`partial_eval` splits ``J`` into its primal part (what does not
depend on a cotangent; run with the forward) and its tangent part (the backward),
and lists the primal values the tangent part reads (the residuals to save).
:func:`split_vjp` packages that for a whole graph: a forward graph that also returns
the residuals and a backward graph from residuals and cotangents to gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..grad_mode import enable_grad
from ..tensor import Tensor
from .ir import Graph, Node, Var
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


def joint_graph(graph: Graph, rg: Sequence[bool], example: Sequence[np.ndarray],
                out_mask: Sequence[bool] | None = None) -> Joint:
    """Trace the joint forward/backward graph of ``graph``.

    ``rg[i]``: input ``i`` is differentiated (floating inputs only); ``example``: values
    for the inputs (shapes and dtypes are what matter; values steer nothing);
    ``out_mask[k]``: output ``k`` may receive a cotangent (default: all).
    """
    from .. import autograd
    from .reference import replay
    tracer = Tracer(implicit_inputs=False)
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
        cts = [Tensor._make(np.ones(outs[k].shape, outs[k].dtype)) for k in diff]
        ct_vars = [tracer.add_input(t) for t in cts]
        wrt = [i for i, t in enumerate(leaves) if t._requires_grad]
        if diff and wrt:
            grads = autograd.grad([outs[k] for k in diff], [leaves[i] for i in wrt],
                                  grad_outputs=cts, allow_unused=True)
        else:
            grads = [None] * len(wrt)
        out_vars = [tracer.var_of(o) for o in outs]
        grad_vars = [None if g is None else tracer.var_of(g) for g in grads]
    return Joint(tracer.graph, in_vars, out_vars, diff, ct_vars, wrt, grad_vars)


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
    from .passes import dce_nodes
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
