"""The backward engine: dependency counting over the graph, no recursion.

A node runs when every node that feeds it a gradient has run; among ready nodes the
most recently created runs first (as in PyTorch). Gradients arriving at one node
output are summed, then that output's tensor hooks run, then the node's backward.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .. import ops as _ops
from ..grad_mode import set_grad_enabled
from ..tensor import Tensor
from .anomaly import ANOMALY, check_gradients
from .node import AccumulateGrad, Node, accumulate_into

Edge = tuple[Node, int]


def count_dependencies(roots: Sequence[Node]) -> dict[Node, int]:
    """Number of incoming gradient edges of every node reachable from ``roots``."""
    deps: dict[Node, int] = {}
    seen = set(roots)
    stack = list(seen)
    while stack:
        node = stack.pop()
        for edge in node.next_edges:
            if edge is None:
                continue
            nxt = edge[0]
            deps[nxt] = deps.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return deps


def nodes_leading_to(roots: Sequence[Node], targets: set[Node]) -> set[Node]:
    """Nodes on some path from ``roots`` to a node of ``targets`` (iterative post-order)."""
    needed: set[Node] = set()
    done: set[Node] = set()
    for root in roots:
        if root in done:
            continue
        stack = [(root, iter(root.next_edges))]
        while stack:
            node, edges = stack[-1]
            child = next((e[0] for e in edges if e is not None and e[0] not in done), None)
            if child is not None:
                stack.append((child, iter(child.next_edges)))
                continue
            stack.pop()
            done.add(node)
            if node in targets or any(e is not None and e[0] in needed
                                      for e in node.next_edges):
                needed.add(node)
    return needed


def _sum(a: Tensor | None, b: Tensor) -> Tensor:
    if a is None:
        return b
    return _ops.add(a, b)


class GraphTask:
    """One call of backward / grad: the buffers and bookkeeping of a single walk."""

    def __init__(self, retain_graph: bool, create_graph: bool,
                 capture: Sequence[Edge] | None = None) -> None:
        self.retain_graph = retain_graph
        self.create_graph = create_graph
        self.accumulate = capture is None
        self.captured: dict[Edge, list[int]] = {}
        for i, edge in enumerate(capture or ()):
            self.captured.setdefault(edge, []).append(i)
        self.results: list = [None] * len(capture or ())
        self.buffers: dict[Node, list] = {}
        self.needed: set[Node] | None = None

    def add_gradient(self, node: Node, nr: int, grad: Tensor) -> None:
        buf = self.buffers.get(node)
        if buf is None:
            buf = self.buffers[node] = []
        if len(buf) <= nr:
            buf.extend([None] * (nr + 1 - len(buf)))
        buf[nr] = _sum(buf[nr], grad)

    def run(self, roots: Sequence[tuple[Edge, Tensor]]) -> list:
        root_nodes = list(dict.fromkeys(edge[0] for edge, _ in roots))
        deps = count_dependencies(root_nodes)
        if not self.accumulate:
            self.needed = nodes_leading_to(root_nodes, {e[0] for e in self.captured})
        for (node, nr), grad in roots:
            self.add_gradient(node, nr, grad)
        ready = [(-n.seq, n) for n in root_nodes if deps.get(n, 0) == 0]
        heapq.heapify(ready)
        with set_grad_enabled(self.create_graph):
            while ready:
                node = heapq.heappop(ready)[1]
                self.execute(node, self.buffers.pop(node, []))
                for edge in node.next_edges:
                    if edge is None:
                        continue
                    nxt = edge[0]
                    deps[nxt] -= 1
                    if deps[nxt] == 0:
                        heapq.heappush(ready, (-nxt.seq, nxt))
        return self.results

    def _prepare(self, node: Node, grads: list) -> None:
        """Run tensor hooks, retain_grad and captures on the summed gradients."""
        leaf_hooks = node.variable._hooks if type(node) is AccumulateGrad else None
        if not (node._pre_hooks or leaf_hooks or node._retain or self.captured):
            return  # the common case: nothing to do
        for nr, g in enumerate(grads):
            if g is None:
                continue
            if node._pre_hooks:
                for hook in list(node._pre_hooks.get(nr, {}).values()):
                    out = hook(g)
                    g = g if out is None else out
            if leaf_hooks:
                for hook in list(leaf_hooks.values()):
                    out = hook(g)
                    g = g if out is None else out
            grads[nr] = g
            if node._retain:
                ref = node._retain.get(nr)
                t = ref() if ref is not None else None
                if t is not None:
                    accumulate_into(t, g, self.create_graph)
            for idx in self.captured.get((node, nr), ()):
                self.results[idx] = g

    def execute(self, node: Node, grads: list) -> None:
        self._prepare(node, grads)
        if self.needed is not None and not any(
                e is not None and e[0] in self.needed for e in node.next_edges):
            return  # autograd.grad: nothing below this node was asked for
        if isinstance(node, AccumulateGrad):
            if self.accumulate and grads:
                accumulate_into(node.variable, grads[0], self.create_graph)
            return
        for g in grads:
            if g is not None:
                break
        else:  # no gradient arrived
            if not self.retain_graph:
                node.release()
            return
        if ANOMALY.enabled:
            with ANOMALY.context(node):
                outs = node.apply(grads, self.create_graph)
                check_gradients(node, outs)
        else:
            outs = node.apply(grads, self.create_graph)
        if node._post_hooks:
            for hook in node._post_hooks:
                hook(outs, grads)
        if not self.retain_graph:
            node.release()
        for edge, grad in zip(node.next_edges, outs, strict=True):
            if edge is not None and grad is not None:
                self.add_gradient(edge[0], edge[1], grad)
