"""Elementwise fusion for tier 2: group a graph's nodes into fused regions.

A *region* is a set of elementwise nodes that share one iteration space (the shape
of their outputs), plus *trailing reductions* (``sum``, ``mean``, ``sum_to``) whose
input lies in that space. Tier 2 (:mod:`nbgrad.jit.tier2.codegen`) emits each region as
one loop nest: every operand read once per element, every node's scalar expression
(from :mod:`nbgrad.kernels.elementwise`, the single source of the arithmetic)
inlined as a local, reductions accumulated in the same loop, and only the values
needed outside the region written to memory. So a chain such as
``sum(sin(x) * exp(-x * x) + tanh(x))`` and its whole backward run as a single loop
over ``x`` and allocate no intermediates.

What fuses is decided by the op's declared kind (:mod:`nbgrad.ops.traits`), never by
its name: :class:`~nbgrad.ops.traits.Elementwise`, :class:`~nbgrad.ops.traits.Cast`,
:class:`~nbgrad.ops.traits.Fill` (reads only a shape, so the seed gradient of a loss
does not depend on the loss's value), :class:`~nbgrad.ops.traits.Broadcast` (an
elementwise read with a broadcast access map), a copying
:class:`~nbgrad.ops.traits.View`, an ``outer`` :class:`~nbgrad.ops.traits.Matmul` and a
:class:`~nbgrad.ops.traits.Move` by a basic index; trailing
:class:`~nbgrad.ops.traits.Reduction` nodes join a region. Everything else (matmul,
views, loops, other ops) is an *opaque* group of one node.

:func:`plan` is the analysis; it does not change the graph (fused regions are not IR
nodes, so the tier-1 interpreter and the graph passes never see them).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ...ops.registry import REGISTRY
from ...ops.registry import kind_of as op_kind
from ...ops.traits import Broadcast, Cast, Elementwise, Fill, Kind, Matmul, Move, View
from ...ops.traits import Reduction as ReductionKind
from ..trace.ir import LOOP, Graph, LoopInfo, Node, Var, make_loop
from ..trace.passes import dce


def kind_of(node: Node) -> Kind:
    """The declared kind of ``node``'s op (loops and custom Functions are opaque)."""
    return op_kind(node.op)


def is_copy_view(node: Node) -> bool:
    """A :class:`~nbgrad.ops.traits.View` that copies (``contiguous``) and keeps the shape:
    an elementwise identity (views that share memory become NumPy views instead)."""
    x = node.inputs[0] if node.inputs else None
    return x is not None and REGISTRY[node.op].view_of is None and \
        x.shape == node.outputs[0].shape


def is_elementwise(node: Node) -> bool:
    """Whether ``node`` computes each output element from the same element of its inputs
    (after broadcasting), or from one element chosen by a basic index."""
    kind = kind_of(node)
    if len(node.outputs) != 1:
        return False
    if isinstance(kind, (Elementwise, Fill, Cast, Broadcast)):
        return True
    if isinstance(kind, View):
        return is_copy_view(node)
    if isinstance(kind, Matmul):
        return kind.outer
    if isinstance(kind, Move):
        return basic_index_access(node) is not None
    return False


def basic_index_access(node: Node) -> Access | None:
    """The access of ``x[index]`` when the node's ``indices`` attribute is a basic index
    (only ints, slices, None and ``...``)."""
    x = node.inputs[0] if node.inputs else None
    if x is None or any(v is not None for v in node.inputs[1:]):
        return None
    found = basic_index_map(x.shape, node.attrs.get("indices"), node.outputs[0].ndim)
    return None if found is None else Access(x, *found)


def basic_index_map(shape: tuple[int, ...], idx, out_ndim: int):
    """``(dims, offsets)`` of :class:`Access` for ``array_of_shape[idx]`` (a basic index
    giving ``out_ndim`` dimensions), or None for any other index."""
    ndim = len(shape)
    if not isinstance(idx, tuple) or not all(
            i is None or i is Ellipsis or isinstance(i, slice)
            or (isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)))
            for i in idx):
        return None
    consumed = sum(1 for i in idx if i is not None and i is not Ellipsis)
    if consumed > ndim or sum(1 for i in idx if i is Ellipsis) > 1:
        return None
    items: list = []
    for i in idx:
        items += [slice(None)] * (ndim - consumed) if i is Ellipsis else [i]
    items += [slice(None)] * (ndim - sum(1 for i in items if i is not None))
    dims: list[int | None] = []
    offsets: list[tuple[int, int]] = []
    out_dim = 0
    for it in items:
        if it is None:
            out_dim += 1
            continue
        size = shape[len(dims)]
        if isinstance(it, slice):
            start, _, step = it.indices(size)
            dims.append(out_dim)
            offsets.append((start, step))
            out_dim += 1
        else:
            i = int(it) + size if int(it) < 0 else int(it)
            if not 0 <= i < size:
                return None
            dims.append(None)
            offsets.append((i, 0))
    if out_dim != out_ndim:
        return None
    return tuple(dims), tuple(offsets)


def is_reduction(node: Node) -> bool:
    """A :class:`~nbgrad.ops.traits.Reduction` of one input (see :func:`reduction_of`)."""
    if not (isinstance(kind_of(node), ReductionKind) and len(node.inputs) == 1 and
            node.inputs[0] is not None and len(node.outputs) == 1):
        return False
    src, out = node.inputs[0], node.outputs[0]
    dims = _reduced(node)
    drop = src.ndim - out.ndim
    kept = tuple(1 if d in dims else n for d, n in enumerate(src.shape)
                 if d not in dims[:max(drop, 0)])
    return 0 <= drop <= len(dims) and kept == out.shape


@dataclass(frozen=True)
class Access:
    """How a region reads an operand: ``dims[k]`` is the iteration dimension indexing the
    operand's dimension ``k``, or ``None`` for a broadcast dimension (index 0).

    ``offsets[k] = (start, step)`` makes the index ``start + step * i`` (a basic slice),
    or the constant ``start`` where ``dims[k]`` is None (an integer index).
    """

    var: Var
    dims: tuple[int | None, ...]
    offsets: tuple[tuple[int, int], ...] | None = None

    def is_identity(self, shape: tuple[int, ...]) -> bool:
        return self.var.shape == shape and self.dims == tuple(range(len(shape))) and \
            self.offsets is None

    def index(self, k: int) -> str:
        """The index expression of operand dimension ``k`` (loop variables ``i0, i1...``)."""
        d = self.dims[k]
        start, step = self.offsets[k] if self.offsets is not None else (0, 1)
        if d is None:
            return str(start)
        if (start, step) == (0, 1):
            return f"i{d}"
        term = f"i{d}" if step == 1 else f"{step} * i{d}"
        return term if start == 0 else f"{start} + {term}"


def broadcast_access(var: Var, shape: tuple[int, ...]) -> Access:
    """NumPy broadcasting of ``var`` against the iteration ``shape``."""
    nd, nv = len(shape), len(var.shape)
    dims: list[int | None] = []
    for k, s in enumerate(var.shape):
        d = nd - nv + k
        dims.append(None if (s == 1 and shape[d] != 1) else d)
    return Access(var, tuple(dims))


def operand_accesses(node: Node) -> list[Access]:
    """The accesses of an elementwise node's data operands (a fill has none)."""
    out = node.outputs[0].shape
    kind = kind_of(node)
    if isinstance(kind, Fill):
        return []
    if isinstance(kind, Move):
        return [basic_index_access(node)]
    if isinstance(kind, Matmul):  # outer: out[i, j] = a[i] * b[j]
        return [Access(node.inputs[0], (0,)), Access(node.inputs[1], (1,))]
    if isinstance(kind, Broadcast) and kind.unsqueeze is not None:
        g = node.inputs[0]
        dims = kind.unsqueeze(node.attrs, len(out)) or ()
        if dims and len(g.shape) != len(out):  # g's dims are the output's others
            kept = [d for d in range(len(out)) if d not in dims]
            return [Access(g, tuple(None if (n == 1 and out[d] != 1) else d
                                    for n, d in zip(g.shape, kept, strict=True)))]
    return [broadcast_access(v, out) for v in node.inputs if v is not None]


@dataclass(frozen=True)
class Reduction:
    """A trailing reduction of a region: ``out[index] (+)= src`` over the region's loop.

    ``out_dims[k]`` is the iteration dimension of output dimension ``k`` (``None``: a
    kept size-1 dimension); ``reduced`` are the iteration dimensions summed over;
    ``count`` divides the sum for ``mean``.
    """

    node: Node
    src: Var
    out: Var
    out_dims: tuple[int | None, ...]
    reduced: tuple[int, ...]
    count: int | None


def _reduced(node: Node) -> tuple[int, ...]:
    """The dimensions a :class:`~nbgrad.ops.traits.Reduction` node sums over (sorted)."""
    shape = node.inputs[0].shape
    dims = kind_of(node).dims(node.attrs, shape)
    return tuple(sorted({int(d) for d in dims if 0 <= int(d) < len(shape)}))


def reduction_of(node: Node) -> Reduction:
    """Describe a :class:`~nbgrad.ops.traits.Reduction` node as a :class:`Reduction`: the
    output drops the first reduced dimensions (as many as it has fewer dimensions than
    the input) and keeps the others as size 1."""
    src, out = node.inputs[0], node.outputs[0]
    shape = src.shape
    dims = _reduced(node)
    dropped = set(dims[:len(shape) - out.ndim])
    out_dims = [None if d in dims else d for d in range(len(shape)) if d not in dropped]
    count = None
    if kind_of(node).mean:
        count = 1
        for d in dims:
            count *= shape[d]
    return Reduction(node, src, out, tuple(out_dims), dims, count)


# ------------------------------------------------------------------ groups
@dataclass
class Group:
    """One unit of generated code: a fused region (``kind == "region"``) or one opaque node."""

    kind: str                         # "region" or "node"
    shape: tuple[int, ...]            # the iteration space of a region
    nodes: list[Node] = field(default_factory=list)       # elementwise nodes, in order
    reductions: list[Reduction] = field(default_factory=list)
    first: int = 0                    # position of its first node (for a stable order)
    #: vars defined here that must be written to memory (read elsewhere or outputs)
    stores: list[Var] = field(default_factory=list)

    @property
    def node(self) -> Node:
        return self.nodes[0]

    def defined(self) -> list[Var]:
        out = [v for n in self.nodes for v in n.outputs]
        out += [r.out for r in self.reductions]
        return out

    def reads(self) -> list[Var]:
        """The vars this group reads from elsewhere (each once, in order)."""
        inside = {id(v) for v in self.defined()}
        seen: set[int] = set()
        out: list[Var] = []
        for v in _data_inputs(self):
            if v is not None and id(v) not in inside and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out


def _data_inputs(group: Group) -> list[Var]:
    out: list[Var] = []
    for n in group.nodes:
        if group.kind == "region" and isinstance(kind_of(n), Fill):
            continue
        out.extend(v for v in n.inputs if v is not None)
    for r in group.reductions:
        out.append(r.src)
    return out


def _node_reads(node: Node) -> list[Var]:
    if isinstance(kind_of(node), Fill):
        return []
    return [v for v in node.inputs if v is not None]


@dataclass
class Plan:
    """The groups of one graph (or loop body) in execution order."""

    groups: list[Group]
    #: number of fused regions that contain more than one node
    fused: int = 0

    def describe(self) -> str:
        lines = []
        for g in self.groups:
            if g.kind == "region":
                ops = [n.op for n in g.nodes] + [r.node.op for r in g.reductions]
                lines.append(f"region{list(g.shape)}: {' '.join(ops)}")
            else:
                lines.append(f"node: {g.node.op}")
        return "\n".join(lines)


class _UnionFind:
    def __init__(self) -> None:
        self.parent: list[int] = []

    def add(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, i: int) -> int:
        p = self.parent
        while p[i] != i:
            p[i] = p[p[i]]
            i = p[i]
        return i


def _fusable(others: list[int], groups: dict[int, Group], shape: tuple[int, ...],
             my_late: set) -> list[int]:
    """The groups among ``others`` an elementwise node of ``shape`` may join: regions of
    its shape whose values it reads in the same pass (no reduction result)."""
    cands: list[int] = []
    for g in others:
        if groups[g].kind == "region" and groups[g].shape == shape \
                and g not in my_late and g not in cands:
            cands.append(g)
    return cands


def plan(graph: Graph, outputs: Sequence[Var] | None = None) -> Plan:
    """Group ``graph``'s top-level nodes into fused regions and opaque nodes.

    ``outputs`` (default ``graph.outputs``) are the values that must be written to
    memory in addition to those read by another group. Loop bodies are planned
    separately by the code generator.
    """
    uf = _UnionFind()
    groups: dict[int, Group] = {}
    deps: dict[int, set[int]] = {}       # group -> groups it reads from (may be stale ids)
    late: dict[int, set[int]] = {}       # group -> ids of its reduction outputs
    late_deps: dict[int, set[int]] = {}  # group -> groups whose reduction outputs it reads
    producer: dict[int, int] = {}        # id(var) -> group id (at creation)

    def gof(v: Var | None) -> int | None:
        if v is None:
            return None
        g = producer.get(id(v))
        return None if g is None else uf.find(g)

    def new_group(kind: str, shape: tuple[int, ...], pos: int) -> int:
        gid = uf.add()
        groups[gid] = Group(kind, shape, first=pos)
        deps[gid] = set()
        late[gid] = set()
        late_deps[gid] = set()
        return gid

    def creates_cycle(cands: set[int], start: list[int]) -> bool:
        """Whether a path leaves ``cands`` and comes back (through ``start`` groups)."""
        seen: set[tuple[int, bool]] = set()
        stack = [(g, g not in cands) for g in start]
        while stack:
            g, out = stack.pop()
            if (g, out) in seen:
                continue
            seen.add((g, out))
            for d in deps[g]:
                d = uf.find(d)
                if d == g:
                    continue
                inside = d in cands
                if inside and out:
                    return True
                stack.append((d, out or not inside))
        return False

    def merge(into: int, other: int) -> int:
        a, b = uf.find(into), uf.find(other)
        if a == b:
            return a
        ga, gb = groups.pop(a), groups.pop(b)
        keep = a if ga.first <= gb.first else b
        uf.parent[a if keep == b else b] = keep
        g = Group("region", ga.shape, first=min(ga.first, gb.first))
        g.nodes = sorted(ga.nodes + gb.nodes, key=lambda n: pos_of[id(n)])
        g.reductions = sorted(ga.reductions + gb.reductions, key=lambda r: pos_of[id(r.node)])
        groups[keep] = g
        deps[keep] = deps.pop(a) | deps.pop(b)
        late[keep] = late.pop(a) | late.pop(b)
        late_deps[keep] = late_deps.pop(a) | late_deps.pop(b)
        return keep

    pos_of: dict[int, int] = {}
    for pos, node in enumerate(graph.nodes):
        pos_of[id(node)] = pos
        reads = _node_reads(node)
        if node.op != LOOP and is_elementwise(node):
            shape = node.outputs[0].shape
            others = [g for g in (gof(v) for v in reads) if g is not None]
            my_late = {gof(v) for v in reads if gof(v) is not None and id(v) in late[gof(v)]}
            # a value read at another element (``y[::-1]``) comes from memory: not fused
            my_late.update(gof(a.var) for a in operand_accesses(node)
                           if gof(a.var) is not None and not a.is_identity(shape))
            cands = _fusable(others, groups, shape, my_late)
            chosen = _acyclic_choice(cands, others, late_deps, uf, creates_cycle)
            if chosen:
                gid = chosen[0]
                for g in chosen[1:]:
                    gid = merge(gid, g)
                gid = uf.find(gid)
            else:
                gid = new_group("region", shape, pos)
            groups[gid].nodes.append(node)
            deps[gid].update(g for g in others if g != gid)
            late_deps[gid].update(my_late)
            producer[id(node.outputs[0])] = gid
            continue
        if node.op != LOOP and is_reduction(node):
            red = reduction_of(node)
            g = gof(red.src)
            if g is not None and groups[g].kind == "region" and \
                    groups[g].shape == red.src.shape and id(red.src) not in late[g]:
                gid = g
            else:
                gid = new_group("region", red.src.shape, pos)
                if g is not None:
                    deps[gid].add(g)
                    if id(red.src) in late[g]:
                        late_deps[gid].add(g)
            groups[gid].reductions.append(red)
            late[gid].add(id(red.out))
            producer[id(red.out)] = gid
            continue
        gid = new_group("node", (), pos)
        groups[gid].nodes.append(node)
        deps[gid].update(g for g in (gof(v) for v in reads) if g is not None)
        for v in node.outputs:
            producer[id(v)] = gid
    ordered = merge_adjacent(_toposort(groups, deps, uf), shared_only=True)
    _mark_stores(ordered, graph.outputs if outputs is None else outputs)
    fused = sum(1 for g in ordered if g.kind == "region"
                and len(g.nodes) + len(g.reductions) > 1)
    return Plan(ordered, fused)


def _acyclic_choice(cands: list[int], others: list[int], late_deps: dict[int, set[int]],
                    uf: _UnionFind, creates_cycle) -> list[int]:
    """Greedily, each candidate region that keeps the graph acyclic when merged."""
    chosen: list[int] = []
    for g in cands:
        trial = set(chosen) | {g}
        if any({uf.find(d) for d in late_deps[c]} & trial for c in trial):
            continue
        if not creates_cycle(trial, others):
            chosen.append(g)
    return chosen


#: whether the regions an opaque node makes ready run right after it (:func:`_toposort`;
#: False: in traced order, for comparisons such as ``python -m perf.region_order``)
PRODUCER_FIRST = True


def _toposort(groups: dict[int, Group], deps: dict[int, set[int]], uf: _UnionFind) -> list[Group]:
    """Groups in dependency order: ties by the position of their first node, except that
    the regions an opaque node's results make ready run right after it, while those
    results are in cache (``W - lr * (X.T @ g)`` after its product, not at the end of the
    step where it was traced). Regions are pure loops, so only their place changes;
    opaque nodes (Python calls among them) keep their order."""
    ids = list(groups)
    real = {g: {uf.find(d) for d in deps[g]} - {g} for g in ids}
    users: dict[int, list[int]] = {g: [] for g in ids}
    indeg = {g: 0 for g in ids}
    for g, ds in real.items():
        for d in ds:
            users[d].append(g)
            indeg[g] += 1
    heap = [(groups[g].first, g) for g in ids if indeg[g] == 0]
    heapq.heapify(heap)
    hot: list[tuple[int, int]] = []  # a heap too: the regions the last opaque node readied
    out: list[Group] = []
    while heap or hot:
        _, g = heapq.heappop(hot or heap)
        out.append(groups[g])
        opaque = PRODUCER_FIRST and groups[g].kind == "node"
        for u in users[g]:
            indeg[u] -= 1
            if indeg[u] == 0:
                hot_u = opaque and groups[u].kind == "region"
                heapq.heappush(hot if hot_u else heap, (groups[u].first, u))
    if len(out) != len(ids):  # pragma: no cover - the merge rule keeps groups acyclic
        raise RuntimeError("nbgrad.jit fusion: grouping produced a cycle")
    return out


def merge_adjacent(groups: list[Group], shared_only: bool = False) -> list[Group]:
    """Merge each region into the region just before it when they share the iteration
    space and the later one reads neither the earlier one's reduction results nor its
    values at other elements (siblings, such as the several ``sum_to`` of one gradient,
    then run as one loop). With ``shared_only``, only regions that read a value in
    common, or the later one a value of the earlier one, are merged (one pass over that
    value instead of two; unrelated loops stay apart).

    Groups are in a valid execution order, so everything the later region reads is
    defined before the earlier one or (per element) inside it: the merged region is
    still in a valid order.
    """
    out: list[Group] = []
    for g in groups:
        prev = out[-1] if out else None
        if prev is not None and g.kind == "region" and prev.kind == "region" and \
                g.shape == prev.shape:
            late = {id(r.out) for r in prev.reductions}
            mine = {id(n.outputs[0]) for n in prev.nodes}
            # values of ``prev`` read at another element (``y[::-1]``) need memory
            shifted = any(id(a.var) in mine and not a.is_identity(g.shape)
                          for n in g.nodes for a in operand_accesses(n))
            reads = {id(v) for v in g.reads()}
            shared = not shared_only or bool(
                reads & (mine | {id(v) for v in prev.reads()}))
            if shared and not shifted and not reads & late:
                out[-1] = Group("region", prev.shape, prev.nodes + g.nodes,
                                prev.reductions + g.reductions, prev.first)
                continue
        out.append(g)
    return out


def _mark_stores(groups: list[Group], outputs: Sequence[Var]) -> None:
    """Mark the region values that another group or the scope's outputs read."""
    needed = {id(v) for v in outputs}
    for g in groups:
        for v in g.reads():
            needed.add(id(v))
    for g in groups:
        if g.kind != "region":
            continue
        g.stores = [n.outputs[0] for n in g.nodes if id(n.outputs[0]) in needed]


# ------------------------------------------------------------------ loop clean-up
def unstack_invariants(graph: Graph) -> Graph:
    """Stop stacking loop invariants per step (a graph pass, ``Graph -> Graph``).

    The gradient of a loop stacks the per-step values its backward reads; when such a
    value turns out to be loop-invariant (e.g. ``transpose(W)`` once hoisted out of the
    body), every row of its stack is the same array. A loop that reads that stack row
    by row (as ``xs``) then reads the invariant itself instead, and the stack, if
    nothing else reads it, is dropped by dead-code elimination. Bodies are cleaned
    recursively.
    """

    changed = False
    nodes: list[Node] = []
    same_rows: dict[int, Var] = {}   # id(stack var) -> the invariant every row equals
    for node in graph.nodes:
        if node.op != LOOP:
            nodes.append(node)
            continue
        info = LoopInfo.of(node)
        body = unstack_invariants(info.body)
        nc, nx = info.n_carry, info.n_xs
        idx, carry, xs, inv = replace(info, body=body).body_inputs()
        # xs read from a stack whose rows all equal an invariant: read the invariant
        stacks = list(node.inputs[nc:nc + nx])
        move = [k for k, s in enumerate(stacks) if id(s) in same_rows]
        if move or body is not info.body:
            changed = True
            keep = [k for k in range(nx) if k not in move]
            b_inputs = ([idx] if idx is not None else []) + carry + [xs[k] for k in keep] + \
                inv + [xs[k] for k in move]
            body = Graph(b_inputs, body.consts, body.nodes, body.outputs)
            info = replace(info, n_carry=nc, n_xs=len(keep),
                           xs_index=tuple(info.xs_index[k] for k in keep), body=body)
            ins = list(node.inputs[:nc]) + [stacks[k] for k in keep] + \
                list(node.inputs[nc + nx:]) + [same_rows[id(stacks[k])] for k in move]
            node = make_loop(ins, list(node.outputs), info)
            idx, carry, xs, inv = info.body_inputs()
        outer_of = dict(zip((id(v) for v in inv), node.inputs[nc + info.n_xs:], strict=True))
        for k, (y, (_, step, length)) in enumerate(zip(body.outputs[nc:], info.ys_index,
                                                       strict=True)):
            if id(y) in outer_of and info.count == length and abs(step) == 1 and length:
                same_rows[id(node.outputs[nc + k])] = outer_of[id(y)]
        nodes.append(node)
    if not changed:
        return graph
    return dce(Graph(list(graph.inputs), dict(graph.consts), nodes, list(graph.outputs)))
