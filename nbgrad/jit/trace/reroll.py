"""Re-rolling: repeated stretches of a trace become ``loop`` nodes again.

A Python loop unrolls while it is traced (W1 unrolled: 1,000 copies of the step, and
1,000 of its backward). Compiling or even interpreting that as straight-line code
does not scale (DESIGN-NOTES point 1), so :func:`reroll` finds periodic stretches of
the node list and replaces each by one loop node:

1. every node gets a token (an integer numbering the distinct combinations of op,
   attributes, shapes and dtypes); candidate periods are the distances between equal
   tokens, and a stretch where ``token[i] == token[i + p]`` covers several periods is a
   candidate region. The search and the classification below work on integer arrays
   (NumPy), not per node in Python: a 1,000-step loop and its backward can trace to
   over a hundred thousand nodes;
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

from dataclasses import dataclass, replace

import numpy as np

from ...ops.indexing import Index
from .ir import LOOP, Graph, LoopInfo, Node, Var, exact_key, graph_hash, make_loop

MIN_REPS = 4      # iterations a region needs
MIN_NODES = 8     # nodes a region needs
MAX_PERIOD = 4096
LAGS = 8          # earlier occurrences of a token whose distances are candidate periods


_PLAIN = frozenset({int, float, bool, str, type(None)})


def _freeze(value, cache: dict):
    """A hashable stand-in for an attribute value: equal only for values no op can tell
    apart (floats by their bits: ``-0.0 == 0.0`` in Python, not to ``atan2``)."""
    if isinstance(value, (float, np.floating)):
        return exact_key(value)
    if type(value) in _PLAIN:
        return (type(value).__name__, value)
    if isinstance(value, Graph):
        hit = cache.get(id(value))
        if hit is None or hit[0] is not value:
            hit = cache[id(value)] = (value, graph_hash(value))
        return ("graph", hit[1])
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


class _Tokens:
    """Tokens: small ints numbering the distinct (op, attributes, input and output types)
    of nodes. They are exact (equal tokens mean equal keys, not equal hashes), so a
    stretch of periodic tokens repeats its ops and attributes."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        self._graphs: dict = {}  # id(graph attribute) -> (it, its content hash)

    def __call__(self, nodes: list[Node]) -> list[int]:
        ids, graphs = self._ids, self._graphs
        out = []
        for node in nodes:
            attrs = node.attrs
            key = (node.op,
                   tuple((k, _freeze(v, graphs)) for k, v in attrs.items()) if attrs else (),
                   tuple(None if v is None else (v.dtype, v.shape) for v in node.inputs),
                   tuple((v.dtype, v.shape) for v in node.outputs))
            t = ids.get(key)
            if t is None:
                t = ids[key] = len(ids)
            out.append(t)
        return out


def _candidates(tokens: np.ndarray) -> list[int]:
    """Periods worth trying: frequent distances between equal tokens.

    Distances to the last :data:`LAGS` occurrences count, not only to the previous one:
    a token used several times per iteration (each of an RK4 step's four vector-field
    evaluations repeats one op sequence) is never one period from its previous use.
    The twelve most frequent win; ties go to the distance seen first (scanning the
    nodes in order and, at one node, its earlier occurrences oldest first)."""
    n = len(tokens)
    order = np.argsort(tokens, kind="stable")  # occurrences of each token, in order
    st = tokens[order]
    dists, whens = [], []
    for lag in range(1, min(LAGS, n - 1) + 1):
        same = st[lag:] == st[:-lag]
        later = order[lag:][same]
        d = later - order[:-lag][same]
        keep = d <= MAX_PERIOD
        dists.append(d[keep])
        whens.append(later[keep])
    if not dists:
        return []
    d = np.concatenate(dists)
    if not len(d):
        return []
    when = np.concatenate(whens)
    counts = np.bincount(d, minlength=MAX_PERIOD + 1)
    first = np.full(MAX_PERIOD + 1, n, np.int64)
    np.minimum.at(first, d, when)
    seen = np.flatnonzero(counts)
    best = seen[np.lexsort((-seen, first[seen], -counts[seen]))[:12]]
    return [int(p) for p in best if counts[p] >= MIN_REPS - 1]


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
        for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True):
            length = b - a + p  # tokens[a:b+p] has period p
            count = length // p
            if count >= MIN_REPS and count * p >= MIN_NODES:
                found.append((count * p, a, p, count))
    found.sort(key=lambda t: (-t[0], t[2]))
    return [(a, p, c) for _, a, p, c in found]


class _Index:
    """Who reads what, over a node list, as arrays: input slot ``s`` (the inputs of all
    nodes, flattened in order; node ``i`` has slots ``start[i]:start[i+1]``) reads output
    ``outk[s]`` of node ``prod[s]`` (-1: a graph input or constant, -2: None)."""

    _SHIFT = 32  # a node's output k is coded (node << _SHIFT) | k

    def __init__(self, nodes: list[Node]) -> None:
        shift = self._SHIFT
        #: id(var) -> the code of the node output defining it
        self.code: dict[int, int] = {id(v): (i << shift) | k for i, n in enumerate(nodes)
                                     for k, v in enumerate(n.outputs)}
        self.code[id(None)] = -2
        get = self.code.get
        code = np.array([get(id(v), -1) for n in nodes for v in n.inputs], np.int64)
        made = code >= 0
        self.prod = np.where(made, code >> shift, code)
        self.outk = np.where(made, code & ((1 << shift) - 1), 0)
        self.start = np.zeros(len(nodes) + 1, np.int64)
        np.cumsum([len(n.inputs) for n in nodes], out=self.start[1:])

    def where(self, v: Var) -> tuple[int, int] | None:
        """(node, output) defining ``v``, or None for a graph input or constant."""
        c = self.code.get(id(v), -1)
        return None if c < 0 else (c >> self._SHIFT, c & ((1 << self._SHIFT) - 1))

    def reads(self, lo: int, hi: int, after: int) -> tuple[list, np.ndarray]:
        """The outputs ``(node, k)`` of nodes ``lo:hi`` that nodes from ``after`` on read,
        and the positions of those readers."""
        a = int(self.start[after])
        prod = self.prod[a:]
        m = (prod >= lo) & (prod < hi)
        slots = np.flatnonzero(m)
        pairs = sorted(set(zip(prod[m].tolist(), self.outk[a:][m].tolist(),
                               strict=True)))
        readers = np.unique(np.searchsorted(self.start, slots + a, side="right") - 1)
        return pairs, readers


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
    outputs = list(graph.outputs)
    tried: set[tuple[int, int]] = set()
    tokenize = _Tokens()
    tokens = np.array(tokenize(nodes), dtype=np.int64)
    index: _Index | None = None  # built on first need, again after each roll
    while True:
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
                    if index is None:
                        index = _Index(nodes)
                    res = _roll(nodes, index, outputs, consts, rows, s0, p, c)
                    if res is not None:
                        break
            if res is not None:
                nodes, outputs, (lo, hi, n_new) = res
                # the tail keeps its tokens: renamed inputs keep their shapes and dtypes
                tokens = np.concatenate((tokens[:lo], tokenize(nodes[lo:lo + n_new]),
                                         tokens[hi:])).astype(np.int64)
                index = None
                changed = done = True
                tried.clear()  # regions that failed may work now (their inputs became rows)
                break
        if not done:
            break
    if not changed:
        return graph
    return Graph(list(graph.inputs), consts, nodes, outputs)


def _roll(nodes: list[Node], index: _Index, outputs: list[Var], consts: dict, rows: _Rows,
          start: int, p: int, count: int):
    """Try to make nodes[start : start + p*count] (or a consistent part) one loop: the new
    nodes and outputs, and (first node replaced, end of the replaced nodes, number of new
    nodes there)."""
    pats = _patterns(index, start, p, count)
    if pats is None or len(pats.kind) < MIN_REPS:
        return None
    span = _iterations(pats)
    if span is None:
        return None
    reg = _Region(nodes, start + span[0] * p, p, span[1])
    ins = _classify_inputs(reg, pats, index, consts, rows)
    if ins is None:
        return None
    read, readers = index.reads(reg.s0, reg.end, reg.end)
    used = _uses(reg, index, read, outputs)
    outs_final, outs_stack = _read_outputs(reg, used)
    carry_keys = sorted(ins.carry_init)
    extra_final = [rk for rk in outs_final if rk not in ins.carry_init]
    body = _body(reg, ins, carry_keys, extra_final, outs_stack)
    loop, stack_vars = _loop_node(reg, ins, consts, carry_keys, extra_final, outs_stack, body)
    # rows of stacked values read later: index nodes right after the loop
    rename: dict[int, Var] = {}
    index_nodes = []
    for rk, stack in zip(outs_stack, stack_vars, strict=True):
        for j in used[rk]:
            v = reg.out(j, rk)
            row = v.like()
            index_nodes.append(Node("index", [stack], [row], {"indices": Index((j,))}))
            rows.row_of[id(row)] = (stack, j)
            rename[id(v)] = row
    tail = nodes[reg.end:]
    if rename:
        for i in readers.tolist():
            node = nodes[i]
            if any(v is not None and id(v) in rename for v in node.inputs):
                tail[i - reg.end] = Node(node.op, [None if v is None else rename.get(id(v), v)
                                                   for v in node.inputs],
                                         node.outputs, node.attrs)
    new_outputs = [rename.get(id(v), v) for v in outputs]
    return (nodes[:reg.s0] + [loop] + index_nodes + tail, new_outputs,
            (reg.s0, reg.end, 1 + len(index_nodes)))


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


# the class of an input slot in one iteration
_NONE, _INT, _CARRY, _OUT = 0, 1, 2, 3


@dataclass
class _Patterns:
    """Per iteration (rows) and input slot (columns): the slot's class, and for a value of
    the same iteration (internal) or of the previous one (carry) which node ``key`` of
    that iteration and which output ``outk`` of it (0 otherwise)."""

    kind: np.ndarray
    key: np.ndarray
    outk: np.ndarray


def _patterns(index: _Index, start: int, p: int, count: int) -> _Patterns | None:
    """The classes of every input per iteration (internal, carry, or from outside);
    stops at the first iteration that reads an older iteration."""
    a = int(index.start[start])
    n_slots = int(index.start[start + p]) - a
    if int(index.start[start + p * count]) - a != n_slots * count:
        return None  # (equal tokens have equal input counts)
    r = np.repeat(np.arange(p), np.diff(index.start[start:start + p + 1]))
    prod = index.prod[a:a + n_slots * count].reshape(count, n_slots)
    rel = prod - (start + p * np.arange(count))[:, None]
    made = prod >= 0
    internal = made & (rel >= 0) & (rel <= r)
    carry = made & ~internal & (rel >= -p) & (rel < 0)
    carry[0] = False
    older = made & ~internal & ~carry & (prod >= start) & (rel < -p)
    bad = np.flatnonzero(older.any(axis=1))
    n = int(bad[0]) if len(bad) else count
    internal, carry, rel = internal[:n], carry[:n], rel[:n]
    kind = np.full((n, n_slots), _OUT, np.int8)
    kind[prod[:n] == -2] = _NONE
    kind[carry] = _CARRY
    kind[internal] = _INT
    key = np.where(internal, rel, np.where(carry, rel + p, 0))
    outk = np.where(internal | carry,
                    index.outk[a:a + n_slots * count].reshape(count, n_slots)[:n], 0)
    return _Patterns(kind, key, outk)


def _iterations(pats: _Patterns) -> tuple[int, int] | None:
    """(first iteration, number of iterations) of the run that agrees with iteration 1
    (which sees a previous iteration), or None when it is too short."""
    kind, key, outk = pats.kind, pats.key, pats.outk
    same = ((kind[2:] == kind[1]).all(axis=1) & (key[2:] == key[1]).all(axis=1)
            & (outk[2:] == outk[1]).all(axis=1))
    differ = np.flatnonzero(~same)
    j_end = 1 + (int(differ[0]) if len(differ) else len(kind) - 2)
    # iteration 0 qualifies when its non-carry inputs are classified the same way
    k0, k1 = kind[0], kind[1]
    ok0 = bool(np.all((k0 == k1) | ((k1 == _CARRY) & (k0 == _OUT)))) and bool(np.all(
        (k1 != _INT) | ((key[0] == key[1]) & (outk[0] == outk[1]))))
    first = 0 if ok0 else 1
    n_it = j_end + 1 - first
    if n_it < MIN_REPS:
        return None
    return first, n_it


def _classify_inputs(reg: _Region, pats: _Patterns, index: _Index, consts: dict,
                     rows: _Rows) -> _Inputs | None:
    """The carries, invariants and xs stacks of the region (classified as in iteration 1
    of ``pats``), or None when an input fits none of them."""
    # per input slot read from outside the iteration: its class
    kinds, keys, outks = pats.kind[1].tolist(), pats.key[1].tolist(), pats.outk[1].tolist()
    slots = []  # (r, q, class)
    idx = 0
    for r in range(reg.p):
        node = reg.node(0, r)
        for q in range(len(node.inputs)):
            kind = kinds[idx]
            if kind == _OUT:
                slots.append((r, q, ("out",)))
            elif kind == _CARRY:
                slots.append((r, q, ("carry", keys[idx], outks[idx])))
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
        where = index.where(spec[0])
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


def _uses(reg: _Region, index: _Index, read: list, outputs: list[Var]
          ) -> dict[tuple[int, int], list[int]]:
    """For each body output ``(node, k)`` read after the region (``read``: the ``(node, k)``
    read by later nodes) or a graph output: the iterations whose value is read, in order."""
    pos = set(read)
    for v in outputs:
        w = index.where(v)
        if w is not None and reg.s0 <= w[0] < reg.end:
            pos.add(w)
    used: dict[tuple[int, int], list[int]] = {}
    for i, k in sorted(pos):
        j, r = divmod(i - reg.s0, reg.p)
        used.setdefault((r, k), []).append(j)
    return dict(sorted(used.items()))


def _read_outputs(reg: _Region, used: dict[tuple[int, int], list[int]]
                  ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The body outputs read after the loop: "final" (read from the last iteration only)
    and "stack" (read from other iterations too), as (node, output) positions."""
    outs_final: list[tuple[int, int]] = []
    outs_stack: list[tuple[int, int]] = []
    for rk, js in used.items():
        if js == [reg.n_it - 1]:
            outs_final.append(rk)
        else:
            outs_stack.append(rk)
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
