"""The backward engine: dependency counting over the graph, no recursion.

A node runs when every node that feeds it a gradient has run; among ready nodes the
most recently created runs first (as in PyTorch). Gradients arriving at one node
output are summed, then that output's tensor hooks run, then the node's backward.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .. import ops as _ops
from ..grad_mode import STATE
from ..tensor import Tensor
from .anomaly import ANOMALY, check_gradients
from .node import RETAIN_GRAPH_MESSAGE, AccumulateGrad, Node, accumulate_into
from .record import OpNode, compile_backward

Edge = tuple[Node, int]


def count_dependencies(roots: Sequence[Node],
                       parents: dict[Node, Node | list[Node]] | None = None) -> dict[Node, int]:
    """Number of incoming gradient edges of every node reachable from ``roots``; fills
    ``parents``, when given, with the nodes having an edge to each reachable node (one
    node, or a list of them when there are several)."""
    deps: dict[Node, int] = {}
    starts = set(roots)
    stack = list(starts)
    push, pop, get = stack.append, stack.pop, deps.get
    if parents is None:
        node = None
        while stack or node is not None:  # a node is pushed when its first edge is seen
            # (roots at the start); the first new node of a node's edges is walked next
            # without a push (a list that grows and shrinks by one reallocates each time)
            edges = (node if node is not None else pop()).next_edges
            node = None
            for edge in edges:
                if edge is not None:
                    nxt = edge[0]
                    n = get(nxt)
                    if n is None:
                        deps[nxt] = 1
                        if nxt not in starts:
                            if node is None:
                                node = nxt
                            else:
                                push(nxt)
                    else:
                        deps[nxt] = n + 1
        return deps
    while stack:  # the same, filling ``parents``
        node = pop()
        for edge in node.next_edges:
            if edge is None:
                continue
            nxt = edge[0]
            n = get(nxt)
            if n is None:
                deps[nxt] = 1
                parents[nxt] = node
                if nxt not in starts:
                    push(nxt)
                continue
            deps[nxt] = n + 1
            above = parents[nxt]  # set with deps[nxt]
            if type(above) is list:
                above.append(node)
            else:
                parents[nxt] = [above, node]
    return deps


def nodes_leading_to(roots: Sequence[Node], targets: set[Node],
                     parents: dict[Node, Node | list[Node]] | None = None) -> set[Node]:
    """Nodes on some path from ``roots`` to a node of ``targets``: the targets reachable
    from ``roots`` and, following ``parents`` (as :func:`count_dependencies` fills it;
    computed when not given), every node above them."""
    if parents is None:
        parents = {}
        count_dependencies(roots, parents)
    starts = set(roots)
    needed = {t for t in targets if t in parents or t in starts}
    stack = list(needed)
    while stack:
        above = parents.get(stack.pop())
        if above is None:
            continue
        if type(above) is not list:  # the common case: one node above
            if above not in needed:
                needed.add(above)
                stack.append(above)
            continue
        for node in above:
            if node not in needed:
                needed.add(node)
                stack.append(node)
    return needed


def _count_mismatch(node: Node, outs: list) -> RuntimeError:
    """The error of a backward that returned another number of gradients than its node
    has inputs (a bug: every table op's backward returns one per input)."""
    return RuntimeError(f"{node.name()} returned {len(outs)} gradients for "
                        f"{len(node.next_edges)} inputs")


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
        #: the nodes of the captured edges
        self.capture_nodes = {edge[0] for edge in self.captured}
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
        if len(roots) == 1 and self.accumulate and self._into_leaves(roots[0][0][0]):
            return self._run_into_leaves(roots[0])
        root_nodes = list(dict.fromkeys(edge[0] for edge, _ in roots))
        deps = count_dependencies(root_nodes)
        if not self.accumulate and not self._all_lead_to_captures(deps):
            # (a second walk, filling the parents: rarer than grad(loss, x))
            self.needed = nodes_leading_to(root_nodes, self.capture_nodes)
        for (node, nr), grad in roots:
            self.add_gradient(node, nr, grad)
        ready = [(-n.seq, n) for n in root_nodes if deps.get(n, 0) == 0]
        heapq.heapify(ready)
        push, pop = heapq.heappush, heapq.heappop
        buffers = self.buffers
        buffers_pop = buffers.pop
        # the nodes that may take the common case below: with captures (grad(),
        # backward(inputs=...)) those leading to a capture, other than the captured ones
        runnable = None if self.needed is None else self.needed - self.capture_nodes
        if type(self).execute is not GraphTask.execute:  # a subclass decides each node
            runnable = frozenset()
        retain = self.retain_graph
        enabled = STATE.grad_enabled  # set_grad_enabled(create_graph), less its cost
        STATE.grad_enabled = self.create_graph
        try:
            while ready:
                node = pop(ready)[1]
                while node is not None:
                    grads = buffers_pop(node, None)
                    new = None
                    if (grads is not None and type(node) is OpNode
                            and node._pre_hooks is None and node._retain is None
                            and node._post_hooks is None
                            and (runnable is None or node in runnable)
                            and not ANOMALY._enabled):
                        # the common case, ``execute`` inlined: a table op's node without
                        # hooks; its gradients are sent on as deps are counted down
                        if grads[0] is not None or any(g is not None for g in grads):
                            if node.saved is None:
                                raise RuntimeError(RETAIN_GRAPH_MESSAGE)
                            op = node.op
                            outs = (op.run_backward or compile_backward(op))(node, grads)
                        else:  # no gradient arrived
                            outs = [None] * len(node.next_edges)
                        if not retain:
                            node.saved = None
                        edges = node.next_edges
                        if len(outs) != len(edges):  # (zip's strict=True costs 1 us)
                            raise _count_mismatch(node, outs)
                        k = -1
                        for edge in edges:  # (a zip of edges and outs costs 0.3 us)
                            k += 1
                            if edge is None:
                                continue
                            nxt, nr = edge
                            grad = outs[k]
                            if grad is not None:
                                if nr == 0 and nxt not in buffers:  # its first gradient
                                    buffers[nxt] = [grad]
                                else:
                                    self.add_gradient(nxt, nr, grad)
                            left = deps[nxt] - 1
                            deps[nxt] = left
                            if left == 0:
                                if new is None:
                                    new = nxt
                                else:
                                    push(ready, (-nxt.seq, nxt))
                    else:
                        self.execute(node, [] if grads is None else grads)
                        for edge in node.next_edges:
                            if edge is None:
                                continue
                            nxt = edge[0]
                            left = deps[nxt] - 1
                            deps[nxt] = left
                            if left == 0:
                                if new is None:
                                    new = nxt
                                else:
                                    push(ready, (-nxt.seq, nxt))
                    if new is None:
                        node = None
                    elif ready:
                        push(ready, (-new.seq, new))
                        node = None
                    else:  # the only ready node: the heap would give it next
                        node = new
        finally:
            STATE.grad_enabled = enabled
        return self.results

    def _into_leaves(self, node: Node) -> bool:
        """Whether ``backward()`` from ``node`` is its one backward and then leaves'
        accumulations (``loss.backward()`` of a jitted call, or of one op on leaves):
        no hooks, retained gradients or anomaly mode anywhere, no subclass deciding each
        node, every edge to the accumulator of a different leaf or to nothing."""
        if (type(node) is AccumulateGrad or node._pre_hooks or node._post_hooks
                or node._retain or ANOMALY._enabled
                or type(self).execute is not GraphTask.execute):
            return False
        seen = set()
        for edge in node.next_edges:
            if edge is None:
                continue
            leaf = edge[0]
            if (type(leaf) is not AccumulateGrad or edge[1] or leaf._pre_hooks
                    or leaf._retain or leaf.variable._hooks or leaf in seen):
                return False
            seen.add(leaf)
        return True

    def _run_into_leaves(self, root: tuple[Edge, Tensor]) -> list:
        """:meth:`run` where :meth:`_into_leaves` holds: the node's backward, then each
        gradient into its leaf's ``.grad``, as the general walk would (less its
        bookkeeping: dependency counts, buffers, a heap)."""
        (node, nr), grad = root
        grads = [None] * nr + [grad]
        enabled = STATE.grad_enabled
        STATE.grad_enabled = self.create_graph
        try:
            outs = node.apply(grads, self.create_graph)
            if not self.retain_graph:
                node.release()
            for edge, g in zip(node.next_edges, outs, strict=True):
                if edge is not None:
                    accumulate_into(edge[0].variable, g, self.create_graph)
        finally:
            STATE.grad_enabled = enabled
        return self.results

    def _all_lead_to_captures(self, deps: dict) -> bool:
        """Whether every node reached leads to a captured edge, so that ``needed`` would
        hold them all: the captures are leaves' accumulators, and they are all the
        leaves reached (``grad(loss, x)`` where only ``x`` needs a gradient): every
        path ends at a leaf, or at a node without edges, which ``execute`` then skips
        (a table op's node runs no formula there)."""
        captures = self.capture_nodes
        if any(type(n) is not AccumulateGrad for n in captures):
            return False
        leaves = [n for n in deps if type(n) is AccumulateGrad]
        return len(leaves) == len(captures) and all(n in deps for n in captures)

    def _prepare(self, node: Node, grads: list) -> None:
        """Run tensor hooks, retain_grad and captures on the summed gradients."""
        leaf_hooks = node.variable._hooks if type(node) is AccumulateGrad else None
        if not (node._pre_hooks or leaf_hooks or node._retain or node in self.capture_nodes):
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
        """Run ``node`` on its summed gradients and send its gradients on (``run``
        inlines the common case)."""
        if (node._pre_hooks or node._retain or type(node) is AccumulateGrad
                or node in self.capture_nodes):
            self._prepare(node, grads)
        needed = self.needed
        if needed is not None:
            for e in node.next_edges:
                if e is not None and e[0] in needed:
                    break
            else:
                return  # autograd.grad: nothing below this node was asked for
        elif not self.accumulate and all(e is None for e in node.next_edges):
            return  # every node leads to a capture (run): one without edges asked for none
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
        if ANOMALY._enabled:  # the property's field: read once per node
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
        buffers = self.buffers
        if len(outs) != len(node.next_edges):
            raise _count_mismatch(node, outs)
        for edge, grad in zip(node.next_edges, outs, strict=True):
            if edge is not None and grad is not None:
                nxt, nr = edge
                if nr == 0 and nxt not in buffers:  # the first gradient to reach nxt
                    buffers[nxt] = [grad]
                else:
                    self.add_gradient(nxt, nr, grad)
