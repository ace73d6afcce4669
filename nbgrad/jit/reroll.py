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

from collections import Counter

import numpy as np

from .ir import LOOP, Graph, LoopInfo, Node, Var, graph_hash, make_loop

MIN_REPS = 4      # iterations a region needs
MIN_NODES = 8     # nodes a region needs
MAX_PERIOD = 4096


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
    """Periods worth trying: frequent distances between equal tokens."""
    last: dict[int, int] = {}
    dist: Counter = Counter()
    for i, t in enumerate(tokens.tolist()):
        j = last.get(t)
        if j is not None and i - j <= MAX_PERIOD:
            dist[i - j] += 1
        last[t] = i
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
                nodes[k] = make_loop(list(node.inputs), list(node.outputs), LoopInfo(
                    info.count, info.n_carry, info.n_xs, info.xs_index, info.ys_index,
                    info.index, body))
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
    if len(pats) < MIN_REPS:
        return None

    def same(a, b) -> bool:
        for x, y in zip(a, b, strict=True):
            if x[0] != y[0]:
                return False
            if x[0] in ("int", "carry") and x[1:] != y[1:]:
                return False
        return True

    # the run of iterations agreeing with iteration 1 (which sees a previous iteration)
    j_end = 1
    while j_end + 1 < len(pats) and same(pats[j_end + 1], pats[1]):
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
    s0 = start + first * p
    # tokens are hashes: check that every iteration really repeats the first one
    fcache: dict = {}
    for r in range(p):
        t0 = nodes[s0 + r]
        key = (t0.op, tuple((k, _freeze(v, fcache)) for k, v in t0.attrs.items()))
        for j in range(1, n_it):
            nj = nodes[s0 + j * p + r]
            if nj.op != t0.op or nj.attrs.keys() != t0.attrs.keys() or key != (
                    nj.op, tuple((k, _freeze(v, fcache)) for k, v in nj.attrs.items())):
                return None
    # per input slot: the vars read by each iteration (for "out" slots)
    slots = []  # (r, q, class)
    idx = 0
    ref = pats[1]
    for r in range(p):
        node = nodes[s0 + r]
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
        vs = [nodes[s0 + j * p + r].inputs[q] for j in range(n_it)]
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
        if spec[0] not in consts and (where is None or where[0] >= s0):
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
    # values of the region read after it
    region_end = s0 + n_it * p
    later_reads: dict[int, set[int]] = {}
    for i in range(region_end, len(nodes)):
        for v in nodes[i].inputs:
            if v is not None:
                where = out_pos.get(id(v))
                if where is not None and s0 <= where[0] < region_end:
                    later_reads.setdefault(id(v), set()).add(i)
    out_ids = {id(v) for v in outputs}
    carry_keys = sorted(carry_init)
    # outputs: (rel, k) -> "final" (last iteration only) or "stack"
    outs_final: list[tuple[int, int]] = []
    outs_stack: list[tuple[int, int]] = []
    for r in range(p):
        node = nodes[s0 + r]
        for k in range(len(node.outputs)):
            used = []
            for j in range(n_it):
                v = nodes[s0 + j * p + r].outputs[k]
                if id(v) in later_reads or id(v) in out_ids:
                    used.append(j)
            if not used:
                continue
            if used == [n_it - 1]:
                outs_final.append((r, k))
            else:
                outs_stack.append((r, k))
    # build the body from the first iteration
    tmpl = nodes[s0:s0 + p]
    body_map: dict[int, Var] = {}
    b_carry = []
    for key in carry_keys:
        v = nodes[s0 + key[0]].outputs[key[1]]
        b_carry.append(v.like())
    extra_final = [rk for rk in outs_final if rk not in carry_init]
    for rk in extra_final:  # a value read only after the loop: a carry with a zero init
        v = nodes[s0 + rk[0]].outputs[rk[1]]
        b_carry.append(v.like())
    b_xs = [xs_final[i][3].like() for i in range(len(xs_final))]
    b_inv = [v.like() for v in inv_vars]
    b_consts: dict = {}
    new_nodes = []
    for r, node in enumerate(tmpl):
        ins = []
        for q, v in enumerate(node.inputs):
            if v is None:
                ins.append(None)
                continue
            cls = slot_kind.get((r, q))
            if cls is None:  # internal
                ins.append(body_map[id(v)])
            elif cls[0] == "carry":
                ins.append(b_carry[carry_keys.index(cls[1])])
            elif cls[0] == "inv":
                ins.append(b_inv[cls[1]])
            else:
                ins.append(b_xs[remap_xs[cls[1]]])
        outs = [v.like() for v in node.outputs]
        for v, o in zip(node.outputs, outs, strict=True):
            body_map[id(v)] = o
        new_nodes.append(Node(node.op, ins, outs, node.attrs))
    b_outputs = [body_map[id(nodes[s0 + key[0]].outputs[key[1]])] for key in carry_keys]
    b_outputs += [body_map[id(nodes[s0 + rk[0]].outputs[rk[1]])] for rk in extra_final]
    b_outputs += [body_map[id(nodes[s0 + rk[0]].outputs[rk[1]])] for rk in outs_stack]
    body = reroll(Graph(b_carry + b_xs + b_inv, b_consts, new_nodes, b_outputs))
    # the loop node
    init_vars = [carry_init[key] for key in carry_keys]
    for rk in extra_final:
        v = nodes[s0 + rk[0]].outputs[rk[1]]
        z = v.like()
        consts[z] = np.zeros(v.shape, v.dtype)
        init_vars.append(z)
    final_vars = [nodes[region_end - p + key[0]].outputs[key[1]] for key in carry_keys]
    final_vars += [nodes[region_end - p + rk[0]].outputs[rk[1]] for rk in extra_final]
    stack_vars = []
    for rk in outs_stack:
        v = nodes[s0 + rk[0]].outputs[rk[1]]
        stack_vars.append(Var((n_it,) + v.shape, v.dtype))
    info = LoopInfo(n_it, len(b_carry), len(xs_final),
                    tuple((st, step) for _, st, step, _ in xs_final),
                    tuple((0, 1, n_it) for _ in outs_stack), None, body)
    loop = make_loop(init_vars + [s for s, _, _, _ in xs_final] + inv_vars,
                     final_vars + stack_vars, info)
    # rows of stacked values read later: index nodes right after the loop
    from ..ops.indexing import Index
    rename: dict[int, Var] = {}
    index_nodes = []
    for rk, stack in zip(outs_stack, stack_vars, strict=True):
        for j in range(n_it):
            v = nodes[s0 + j * p + rk[0]].outputs[rk[1]]
            if id(v) in later_reads or id(v) in out_ids:
                row = v.like()
                index_nodes.append(Node("index", [stack], [row], {"indices": Index((j,))}))
                rows.row_of[id(row)] = (stack, j)
                rename[id(v)] = row
    tail = []
    for node in nodes[region_end:]:
        if any(v is not None and id(v) in rename for v in node.inputs):
            node = Node(node.op, [None if v is None else rename.get(id(v), v)
                                  for v in node.inputs], node.outputs, node.attrs)
        tail.append(node)
    new_outputs = [rename.get(id(v), v) for v in outputs]
    return nodes[:s0] + [loop] + index_nodes + tail, new_outputs


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
