"""Re-rolling: repeated stretches of a trace become ``loop`` nodes again.

A Python loop unrolls while it is traced (W1 unrolled: 1,000 copies of the step, and
1,000 of its backward). Compiling or even interpreting that as straight-line code
does not scale (DESIGN-NOTES point 1), so :func:`reroll` finds periodic stretches of
the node list and replaces each by one loop node:

1. every node gets a token (op, attributes, shapes and dtypes); candidate periods
   are the distances between equal tokens, and a stretch where ``token[i] ==
   token[i + p]`` covers several periods is a candidate region;
2. the dataflow of each iteration is classified per input: a value of the same
   iteration, of the previous iteration (a carry; the first iteration reads its
   initial value), the same value every time (an invariant), or one row per
   iteration of an earlier loop's stacked output or of a stack of constants (xs,
   walked forwards or backwards). Iterations whose classification agrees form the loop;
3. values of the region read later become final carries (only the last iteration's
   value is read) or stacked outputs (``ys``) whose rows are read through ``index``
   nodes, which a later re-rolled loop reads as an xs stack instead.

Regions are found greedily (largest first) until none is left; loop bodies are
re-rolled recursively. A trace without repetition is returned unchanged.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, replace

import numpy as np

from ...ops.indexing import Index
from .ir import LOOP, Graph, LoopInfo, Node, Var, graph_hash, make_loop

MIN_REPS = 4      # iterations a region needs
MIN_NODES = 8     # nodes a region needs
MAX_PERIOD = 4096
LAGS = 8          # earlier occurrences of a token whose distances are candidate periods


def _freeze(value, cache: dict):
    """A hashable stand-in for an attribute value."""
    if isinstance(value, Graph):
        key = cache.get(id(value))
        if key is None:
            key = cache[id(value)] = graph_hash(value)
        return ("graph", key)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(_freeze(v, cache) for v in value)
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    try:
        hash(value)
    except TypeError:
        return ("repr", repr(value))
    return (type(value).__name__, value)


def _token(node: Node, cache: dict) -> int:
    attrs = tuple((k, _freeze(v, cache)) for k, v in node.attrs.items())
    ins = tuple(None if v is None else (v.dtype.str, v.shape) for v in node.inputs)
    outs = tuple((v.dtype.str, v.shape) for v in node.outputs)
    return hash((node.op, attrs, ins, outs))


def _candidates(tokens: np.ndarray) -> list[int]:
    """Periods worth trying: frequent distances between equal tokens.

    Distances to the last :data:`LAGS` occurrences count, not only to the previous one:
    a token used several times per iteration (each of an RK4 step's four vector-field
    evaluations repeats one op sequence) is never one period from its previous use."""
    last: dict[int, deque[int]] = {}
    dist: Counter = Counter()
    for i, t in enumerate(tokens.tolist()):
        seen = last.get(t)
        if seen is None:
            seen = last[t] = deque(maxlen=LAGS)
        dist.update(i - j for j in seen if i - j <= MAX_PERIOD)
        seen.append(i)
    return [p for p, n in dist.most_common(12) if n >= (MIN_REPS - 1)]


def _regions(tokens: np.ndarray) -> list[tuple[int, int, int]]:
    """(start, period, count) of periodic stretches, best first."""
    found = []
    n = len(tokens)
    for p in _candidates(tokens):
        if p >= n:
            continue
        eq = tokens[:-p] == tokens[p:]
        # runs of True
        padded = np.concatenate(([False], eq, [False]))
        edges = np.flatnonzero(padded[1:] != padded[:-1])
        for a, b in zip(edges[0::2], edges[1::2], strict=True):
            length = b - a + p  # tokens[a:b+p] has period p
            count = length // p
            if count >= MIN_REPS and count * p >= MIN_NODES:
                found.append((count * p, int(a), p, count))
    found.sort(key=lambda t: (-t[0], t[2]))
    return [(a, p, c) for _, a, p, c in found]


class _Rows:
    """Which vars are rows of which stacks (outputs of earlier re-rolled loops)."""

    def __init__(self) -> None:
        self.row_of: dict[int, tuple[Var, int]] = {}


def reroll(graph: Graph) -> Graph:
    """``graph`` with its periodic stretches replaced by loop nodes (recursively)."""
    nodes = list(graph.nodes)
    changed = False
    for k, node in enumerate(nodes):
        if node.op == LOOP:
            info = LoopInfo.of(node)
            body = reroll(info.body)
            if body is not info.body:
                nodes[k] = make_loop(list(node.inputs), list(node.outputs),
                                     replace(info, body=body))
                changed = True
    if len(nodes) < MIN_REPS * 2:
        return graph if not changed else Graph(graph.inputs, graph.consts, nodes,
                                               graph.outputs)
    consts = dict(graph.consts)
    rows = _Rows()
    cache: dict = {}
    outputs = list(graph.outputs)
    tried: set[tuple[int, int]] = set()
    known: dict[int, tuple[Node, int]] = {}  # id(node) -> (node, token)

    def token(n: Node) -> int:
        hit = known.get(id(n))
        if hit is None or hit[0] is not n:
            hit = known[id(n)] = (n, _token(n, cache))
        return hit[1]

    while True:
        tokens = np.array([token(n) for n in nodes], dtype=np.int64)
        done = False
        for start, p, count in _regions(tokens):
            key = (id(nodes[start]), p)
            if key in tried:
                continue
            tried.add(key)
            res = None
            for s0, c in ((start, count), (start, count - 1), (start + p, count - 1),
                          (start + p, count - 2)):
                if c >= MIN_REPS:
                    res = _roll(nodes, outputs, consts, rows, s0, p, c)
                    if res is not None:
                        break
            if res is not None:
                nodes, outputs = res
                changed = done = True
                tried.clear()  # regions that failed may work now (their inputs became rows)
                break
        if not done:
            break
    if not changed:
        return graph
    return Graph(list(graph.inputs), consts, nodes, outputs)


def _roll(nodes: list[Node], outputs: list[Var], consts: dict, rows: _Rows, start: int,
          p: int, count: int):
    """Try to make nodes[start : start + p*count] (or a consistent part) one loop."""
    out_pos = {}
    for i, n in enumerate(nodes):
        for k, v in enumerate(n.outputs):
            out_pos[id(v)] = (i, k)
    pats = _patterns(nodes, out_pos, start, p, count)
    if len(pats) < MIN_REPS:
        return None
    span = _iterations(pats)
    if span is None:
        return None
    reg = _Region(nodes, start + span[0] * p, p, span[1])
    if not _repeats(reg):
        return None
    ins = _classify_inputs(reg, pats[1], out_pos, consts, rows)
    if ins is None:
        return None
    later_reads = _later_reads(reg, out_pos)
    out_ids = {id(v) for v in outputs}
    outs_final, outs_stack = _read_outputs(reg, later_reads, out_ids)
    carry_keys = sorted(ins.carry_init)
    extra_final = [rk for rk in outs_final if rk not in ins.carry_init]
    body = _body(reg, ins, carry_keys, extra_final, outs_stack)
    loop, stack_vars = _loop_node(reg, ins, consts, carry_keys, extra_final, outs_stack, body)
    # rows of stacked values read later: index nodes right after the loop
    rename: dict[int, Var] = {}
    index_nodes = []
    for rk, stack in zip(outs_stack, stack_vars, strict=True):
        for j in range(reg.n_it):
            v = reg.out(j, rk)
            if id(v) in later_reads or id(v) in out_ids:
                row = v.like()
                index_nodes.append(Node("index", [stack], [row], {"indices": Index((j,))}))
                rows.row_of[id(row)] = (stack, j)
                rename[id(v)] = row
    tail = []
    for node in nodes[reg.end:]:
        if any(v is not None and id(v) in rename for v in node.inputs):
            node = Node(node.op, [None if v is None else rename.get(id(v), v)
                                  for v in node.inputs], node.outputs, node.attrs)
        tail.append(node)
    new_outputs = [rename.get(id(v), v) for v in outputs]
    return nodes[:reg.s0] + [loop] + index_nodes + tail, new_outputs


@dataclass
class _Region:
    """A candidate loop: ``n_it`` repetitions of the ``p`` nodes from ``nodes[s0]``."""

    nodes: list[Node]
    s0: int
    p: int
    n_it: int

    @property
    def end(self) -> int:
        return self.s0 + self.n_it * self.p

    def node(self, j: int, r: int) -> Node:
        """Node ``r`` of iteration ``j``."""
        return self.nodes[self.s0 + j * self.p + r]

    def out(self, j: int, rk: tuple[int, int]) -> Var:
        """Output ``rk[1]`` of node ``rk[0]`` of iteration ``j``."""
        return self.node(j, rk[0]).outputs[rk[1]]


@dataclass
class _Inputs:
    """How the body reads each input slot ``(r, q)`` that is not internal."""

    slot_kind: dict[tuple[int, int], tuple]   # ("carry", key) | ("inv", k) | ("xs", k)
    carry_init: dict[tuple[int, int], Var]    # carry key -> its initial value
    inv_vars: list[Var]                       # invariants, in first-use order
    xs_final: list                            # (stack var, start, step, row var), deduped
    remap_xs: dict[int, int]                  # xs slot number -> index in xs_final


def _patterns(nodes: list[Node], out_pos: dict, start: int, p: int, count: int) -> list:
    """Per iteration, the class of every input (internal, carry, or from outside); stops
    at the first iteration that reads an older iteration."""
    def classify(j: int) -> list | None:
        base = start + j * p
        pat = []
        for r in range(p):
            node = nodes[base + r]
            for v in node.inputs:
                if v is None:
                    pat.append(("none",))
                    continue
                where = out_pos.get(id(v))
                if where is not None and base <= where[0] < base + r + 1:
                    pat.append(("int", where[0] - base, where[1]))
                elif where is not None and base - p <= where[0] < base and j > 0:
                    pat.append(("carry", where[0] - base + p, where[1]))
                elif where is not None and where[0] >= start and where[0] < base - p:
                    return None  # reads an older iteration
                else:
                    pat.append(("out", v))
        return pat

    pats = []
    for j in range(count):
        pat = classify(j)
        if pat is None:
            break
        pats.append(pat)
    return pats


def _same(a, b) -> bool:
    for x, y in zip(a, b, strict=True):
        if x[0] != y[0]:
            return False
        if x[0] in ("int", "carry") and x[1:] != y[1:]:
            return False
    return True


def _iterations(pats: list) -> tuple[int, int] | None:
    """(first iteration, number of iterations) of the run that agrees with iteration 1
    (which sees a previous iteration), or None when it is too short."""
    j_end = 1
    while j_end + 1 < len(pats) and _same(pats[j_end + 1], pats[1]):
        j_end += 1
    first = 0
    # iteration 0 qualifies when its non-carry inputs are classified the same way
    ok0 = all(x[0] == y[0] or (y[0] == "carry" and x[0] == "out")
              for x, y in zip(pats[0], pats[1], strict=True)) and all(
        x[1:] == y[1:] for x, y in zip(pats[0], pats[1], strict=True) if y[0] == "int")
    if not ok0:
        first = 1
    n_it = j_end + 1 - first
    if n_it < MIN_REPS:
        return None
    return first, n_it


def _repeats(reg: _Region) -> bool:
    """Tokens are hashes: whether every iteration really repeats the first one."""
    fcache: dict = {}
    for r in range(reg.p):
        t0 = reg.node(0, r)
        key = (t0.op, tuple((k, _freeze(v, fcache)) for k, v in t0.attrs.items()))
        for j in range(1, reg.n_it):
            nj = reg.node(j, r)
            if nj.op != t0.op or nj.attrs.keys() != t0.attrs.keys() or key != (
                    nj.op, tuple((k, _freeze(v, fcache)) for k, v in nj.attrs.items())):
                return False
    return True


def _classify_inputs(reg: _Region, ref: list, out_pos: dict, consts: dict,
                     rows: _Rows) -> _Inputs | None:
    """The carries, invariants and xs stacks of the region (``ref``: the pattern of
    iteration 1), or None when an input fits none of them."""
    # per input slot: the vars read by each iteration (for "out" slots)
    slots = []  # (r, q, class)
    idx = 0
    for r in range(reg.p):
        node = reg.node(0, r)
        for q in range(len(node.inputs)):
            slots.append((r, q, ref[idx]))
            idx += 1
    # out slots: invariant (one var) or xs (rows of a stack, or constants)
    inv_vars: list[Var] = []
    inv_index: dict[int, int] = {}
    xs_specs: list = []  # (stack var, start, step) and the slot list
    slot_kind: dict[tuple[int, int], tuple] = {}
    carry_init: dict[tuple[int, int], Var] = {}
    for r, q, cls in slots:
        if cls[0] != "out" and cls[0] != "carry":
            continue
        vs = [reg.node(j, r).inputs[q] for j in range(reg.n_it)]
        if cls[0] == "carry":
            init = vs[0]
            key = cls[1:]
            prev = carry_init.get(key)
            if prev is not None and prev is not init:
                return None
            carry_init[key] = init
            slot_kind[(r, q)] = ("carry", key)
            continue
        if all(v is vs[0] for v in vs):
            if id(vs[0]) not in inv_index:
                inv_index[id(vs[0])] = len(inv_vars)
                inv_vars.append(vs[0])
            slot_kind[(r, q)] = ("inv", inv_index[id(vs[0])])
            continue
        spec = _stack_of(vs, rows, consts)
        if spec is None:
            return None
        where = out_pos.get(id(spec[0]))
        if spec[0] not in consts and (where is None or where[0] >= reg.s0):
            return None  # a stack that an enclosing region absorbed meanwhile
        xs_specs.append(spec)
        slot_kind[(r, q)] = ("xs", len(xs_specs) - 1)
    # dedupe xs stacks read the same way
    uniq: dict[tuple, int] = {}
    xs_final: list = []
    remap_xs: dict[int, int] = {}
    for i, (stack, st, step, row) in enumerate(xs_specs):
        key = (id(stack), st, step)
        if key not in uniq:
            uniq[key] = len(xs_final)
            xs_final.append((stack, st, step, row))
        remap_xs[i] = uniq[key]
    return _Inputs(slot_kind, carry_init, inv_vars, xs_final, remap_xs)


def _later_reads(reg: _Region, out_pos: dict) -> dict[int, set[int]]:
    """Values of the region read after it: id(var) -> positions of the readers."""
    later_reads: dict[int, set[int]] = {}
    for i in range(reg.end, len(reg.nodes)):
        for v in reg.nodes[i].inputs:
            if v is not None:
                where = out_pos.get(id(v))
                if where is not None and reg.s0 <= where[0] < reg.end:
                    later_reads.setdefault(id(v), set()).add(i)
    return later_reads


def _read_outputs(reg: _Region, later_reads: dict, out_ids: set[int]
                  ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The body outputs read after the loop: "final" (read from the last iteration only)
    and "stack" (read from other iterations too), as (node, output) positions."""
    outs_final: list[tuple[int, int]] = []
    outs_stack: list[tuple[int, int]] = []
    for r in range(reg.p):
        node = reg.node(0, r)
        for k in range(len(node.outputs)):
            used = []
            for j in range(reg.n_it):
                v = reg.out(j, (r, k))
                if id(v) in later_reads or id(v) in out_ids:
                    used.append(j)
            if not used:
                continue
            if used == [reg.n_it - 1]:
                outs_final.append((r, k))
            else:
                outs_stack.append((r, k))
    return outs_final, outs_stack


def _body(reg: _Region, ins: _Inputs, carry_keys: list, extra_final: list,
          outs_stack: list) -> Graph:
    """The loop body, built from the first iteration (and re-rolled in turn)."""
    tmpl = reg.nodes[reg.s0:reg.s0 + reg.p]
    body_map: dict[int, Var] = {}
    b_carry = []
    for key in carry_keys:
        b_carry.append(reg.out(0, key).like())
    for rk in extra_final:  # a value read only after the loop: a carry with a zero init
        b_carry.append(reg.out(0, rk).like())
    b_xs = [ins.xs_final[i][3].like() for i in range(len(ins.xs_final))]
    b_inv = [v.like() for v in ins.inv_vars]
    b_consts: dict = {}
    new_nodes = []
    for r, node in enumerate(tmpl):
        args = []
        for q, v in enumerate(node.inputs):
            if v is None:
                args.append(None)
                continue
            cls = ins.slot_kind.get((r, q))
            if cls is None:  # internal
                args.append(body_map[id(v)])
            elif cls[0] == "carry":
                args.append(b_carry[carry_keys.index(cls[1])])
            elif cls[0] == "inv":
                args.append(b_inv[cls[1]])
            else:
                args.append(b_xs[ins.remap_xs[cls[1]]])
        outs = [v.like() for v in node.outputs]
        for v, o in zip(node.outputs, outs, strict=True):
            body_map[id(v)] = o
        new_nodes.append(Node(node.op, args, outs, node.attrs))
    b_outputs = [body_map[id(reg.out(0, key))] for key in carry_keys]
    b_outputs += [body_map[id(reg.out(0, rk))] for rk in extra_final]
    b_outputs += [body_map[id(reg.out(0, rk))] for rk in outs_stack]
    return reroll(Graph(b_carry + b_xs + b_inv, b_consts, new_nodes, b_outputs))


def _loop_node(reg: _Region, ins: _Inputs, consts: dict, carry_keys: list,
               extra_final: list, outs_stack: list, body: Graph) -> tuple[Node, list[Var]]:
    """The loop node that replaces the region, and its stacked outputs."""
    init_vars = [ins.carry_init[key] for key in carry_keys]
    for rk in extra_final:
        v = reg.out(0, rk)
        z = v.like()
        consts[z] = np.zeros(v.shape, v.dtype)
        init_vars.append(z)
    last = reg.n_it - 1
    final_vars = [reg.out(last, key) for key in carry_keys]
    final_vars += [reg.out(last, rk) for rk in extra_final]
    stack_vars = []
    for rk in outs_stack:
        v = reg.out(0, rk)
        stack_vars.append(Var((reg.n_it,) + v.shape, v.dtype))
    info = LoopInfo(reg.n_it, len(carry_keys) + len(extra_final), len(ins.xs_final),
                    tuple((st, step) for _, st, step, _ in ins.xs_final),
                    tuple((0, 1, reg.n_it) for _ in outs_stack), None, body)
    loop = make_loop(init_vars + [s for s, _, _, _ in ins.xs_final] + ins.inv_vars,
                     final_vars + stack_vars, info)
    return loop, stack_vars


def _stack_of(vs: list[Var], rows: _Rows, consts: dict):
    """(stack var, start, step, row var) when ``vs`` are consecutive rows of one stack,
    or of a new stack of constants; else None."""
    info = [rows.row_of.get(id(v)) for v in vs]
    if all(x is not None for x in info):
        stack = info[0][0]
        if all(x[0] is stack for x in info):
            start = info[0][1]
            step = info[1][1] - start
            if step in (1, -1) and all(x[1] == start + step * j for j, x in enumerate(info)):
                return stack, start, step, vs[0]
        return None
    if all(v in consts for v in vs):
        arr = np.stack([consts[v] for v in vs])
        sv = Var(arr.shape, arr.dtype)
        consts[sv] = arr
        return sv, 0, 1, vs[0]
    return None
