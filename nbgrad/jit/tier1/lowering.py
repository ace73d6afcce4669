"""Tier-1 lowering: a graph becomes a tape for the precompiled interpreter.

:func:`build_tape` walks the graph in order and emits interpreter instructions (see
:mod:`nbgrad.jit.tier1.interpreter`) for the nodes it supports; every other node becomes an
*eager step* (its kernel called from Python between native segments), so any graph
runs, natively where supported. A loop node whose body is fully supported becomes a
LOOP ... ENDLOOP block (never unrolled); otherwise the whole loop is an eager step.

Values live in one buffer pool (float64 or float32, chosen by the graph; booleans as
0/1, a loop counter as a float). Views that keep the element order (reshape,
squeeze, contiguous, a row of a stack...) are aliases; other data movement is a
strided copy or a gather whose positions are found by running the op's own kernel on
an ``arange``. Storage is assigned after emission from live intervals (a value read
in a loop lives for the whole loop), reusing buffers, in place for elementwise ops.

Nodes lower by their op's declared kind (:mod:`nbgrad.ops.traits`), never by name:
each kind has one rule in :data:`~nbgrad.jit.tier1.rules.RULES` reading the kind's
parameters. Natively supported: the elementwise ops (but those whose scalar op is
``cold``), casts between pool types, fills, reductions, matrix products (with a bias),
views, permutes, broadcasts and moves, joins, index scatters and loops; an opaque op
runs as an eager step. :func:`native_ops` lists the table ops this covers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...ops.registry import kind_of, table
from ...ops.traits import Elementwise, Matmul, Permute
from ..trace.function_trace import expand
from ..trace.ir import LOOP, Graph, LoopInfo, Node, Var, make_loop, type_str
from . import interpreter as I
from .operands import (
    EagerStep,
    Instr,
    Loc,
    Storage,
    Unsupported,
    _c_strides,
    _collapse,
    _size,
    _swaps_last_two,
)
from .rules import RULES
from .storage import pool_dtype
from .tape import TapeExecutable


def native_ops() -> list[str]:
    """Names of the table ops the tier-1 interpreter runs natively (others run eagerly):
    those of a kind with a rule (an elementwise op's scalar op in the interpreter)."""
    names = []
    for name in table():
        kind = kind_of(name)
        if type(kind) not in RULES:
            continue
        if isinstance(kind, Elementwise) and not any(
                ops.get(kind.spec.name) == kind.spec for ops in I.SCALAR_OPS.values()):
            continue
        names.append(name)
    return sorted(names) + ["loop"]


# ------------------------------------------------------------------ the lowering
class Lowering:
    """Emits instructions for one graph (and, recursively, its loop bodies)."""

    def __init__(self, graph: Graph, dtype: np.dtype) -> None:
        self.graph = graph
        self.dtype = np.dtype(dtype)
        self.code: list = []          # Instr | EagerStep in execution order
        self.loc: dict[int, Loc] = {}  # id(var) -> Loc
        self.side: set[int] = set()   # ids of vars kept outside the pool
        self.storages: list[Storage] = []
        self.consts: list[tuple[Storage, np.ndarray]] = []
        self.preset: dict[int, Loc] = {}   # ys outputs placed before their node runs
        self.transposed: dict[int, tuple[Var, Loc]] = {}  # var -> (source var, loc)
        self.uses: dict[int, int] = {}
        self.loop_depth = 0

    # -------------------------------------------------------------- helpers
    def pooled(self, v: Var) -> bool:
        return v.dtype == self.dtype or v.dtype == np.bool_

    def new(self, size: int, name: str = "") -> Storage:
        st = Storage(size, name=name)
        self.storages.append(st)
        return st

    def emit(self, ins: Instr) -> Instr:
        self.code.append(ins)
        return ins

    def get(self, v: Var) -> Loc:
        loc = self.loc.get(id(v))
        if loc is None:
            if id(v) in self.transposed:
                src, sloc = self.transposed.pop(id(v))
                loc = self._materialize_transpose(v, src, sloc)
                return loc
            raise Unsupported(f"value {type_str(v)} is not in the pool")
        return loc

    def out(self, v: Var) -> Loc:
        """A fresh location for a node output (or its preset ys slot)."""
        pre = self.preset.get(id(v))
        if pre is not None:
            self.loc[id(v)] = pre
            return pre
        loc = Loc(self.new(v.size, type_str(v)))
        self.loc[id(v)] = loc
        return loc

    def bind(self, v: Var, loc: Loc) -> None:
        """``v`` is ``loc`` (an alias); copies into a preset slot when there is one."""
        pre = self.preset.get(id(v))
        if pre is not None and not (pre.st is loc.st and pre.off == loc.off
                                    and pre.stride == loc.stride):
            self.emit(Instr(I.OP_COPY, o=pre, a=loc, n=v.size))
            loc = pre
        self.loc[id(v)] = loc

    def contiguous(self, v: Var) -> Loc:
        """``v`` as a plain (unshifted or shifted, but contiguous) location."""
        return self.get(v)

    def strided_copy(self, src: Loc, shape: Sequence[int], strides: Sequence[int],
                     dst: Loc | None = None, size: int | None = None) -> Loc:
        cs, ct = _collapse(shape, strides)
        n = _size(shape) if size is None else size
        if dst is None:
            dst = Loc(self.new(n, "tmp"))
        if not cs:
            self.emit(Instr(I.OP_COPY, o=dst, a=src, n=max(n, 1) if n else 0))
            return dst
        if len(cs) == 1 and ct[0] == 1:
            self.emit(Instr(I.OP_COPY, o=dst, a=src, n=cs[0]))
            return dst
        if len(cs) > 4:
            raise Unsupported("a copy with more than 4 strided dimensions")
        pad = 4 - len(cs)
        shp = [1] * pad + cs
        st = [0] * pad + ct
        self.emit(Instr(I.OP_STRIDED, o=dst, a=src, n=n, ia=np.array(shp + st, np.int64)))
        return dst

    def _materialize_transpose(self, v: Var, src: Var, sloc: Loc) -> Loc:
        shape, strides = self._transpose_layout(v, src)
        loc = self.strided_copy(sloc, shape, strides)
        self.loc[id(v)] = loc
        return loc

    @staticmethod
    def _transpose_layout(v: Var, src: Var) -> tuple[tuple[int, ...], list[int]]:
        # v has src's dims with the last two swapped
        base = _c_strides(src.shape)
        strides = base[:-2] + [base[-1], base[-2]]
        return v.shape, strides

    # -------------------------------------------------------------- driver
    def lower_graph(self, graph: Graph, inputs: list[Loc | None] | None = None) -> None:
        for v, arr in graph.consts.items():
            if self.pooled(v):
                st = Storage(v.size, fixed=True, name="const")
                self.storages.append(st)
                self.consts.append((st, np.asarray(arr, dtype=self.dtype).reshape(-1)
                                    if arr.dtype != self.dtype else arr.reshape(-1)))
                self.loc[id(v)] = Loc(st)
            else:
                self.side.add(id(v))
        for node in graph.nodes:
            for v in node.inputs:
                if v is not None:
                    self.uses[id(v)] = self.uses.get(id(v), 0) + 1
        for v in graph.outputs:
            self.uses[id(v)] = self.uses.get(id(v), 0) + 1
        self._mark_transposes(graph)
        for node in graph.nodes:
            self.lower_node(node)

    def _mark_transposes(self, graph: Graph) -> None:
        """Transposes read only by matrix products are not materialised."""
        readers: dict[int, list[Node]] = {}
        for node in graph.nodes:
            for v in node.inputs:
                if v is not None:
                    readers.setdefault(id(v), []).append(node)
        outs = {id(v) for v in graph.outputs}
        self._lazy_t = set()
        for node in graph.nodes:
            kind = kind_of(node.op)
            if not isinstance(kind, Permute) or not self.pooled(node.outputs[0]):
                continue
            v = node.outputs[0]
            src = node.inputs[0]
            if v.ndim < 2 or id(v) in outs or not _swaps_last_two(node, src, kind):
                continue
            rs = readers.get(id(v), [])
            if rs and all(isinstance(kind_of(r.op), Matmul) for r in rs):
                self._lazy_t.add(id(node))

    def lower_node(self, node: Node) -> None:
        if node.op == LOOP:
            if self.lower_loop(node):
                return
            self.eager(node)
            return
        if id(node) in getattr(self, "_lazy_t", ()):
            src = node.inputs[0]
            if id(src) in self.loc:
                self.transposed[id(node.outputs[0])] = (src, self.loc[id(src)])
                return
        mark = len(self.code)
        nst = len(self.storages)
        saved = dict(self.loc)
        try:
            if not all(v is None or id(v) not in self.side for v in node.inputs) or \
                    not all(self.pooled(v) for v in node.outputs):
                raise Unsupported("a value outside the pool")
            kind = kind_of(node.op)
            rule = RULES.get(type(kind))
            if rule is None:
                raise Unsupported(node.op)
            rule(self, node, kind)
        except Unsupported:
            del self.code[mark:]
            del self.storages[nst:]
            self.loc = saved
            self.eager(node)

    def eager(self, node: Node) -> None:
        if self.loop_depth:
            raise Unsupported(f"{node.op} inside a loop body")
        ins = []
        for v in node.inputs:
            if v is None:
                ins.append(None)
            elif id(v) in self.side:
                ins.append(("side", v))
            else:
                ins.append(self.get(v))
        outs = []
        for v in node.outputs:
            if self.pooled(v):
                outs.append(self.out(v))
            else:
                self.side.add(id(v))
                outs.append(("side", v))
        step = EagerStep(node, ins, outs)
        self.code.append(step)

    # -------------------------------------------------------------- loops
    def lower_loop(self, node: Node) -> bool:
        info = LoopInfo.of(node)
        body = info.body
        if any(not self.pooled(v) and not (v is body.inputs[0] and info.index is not None)
               for v in body.inputs) or any(not self.pooled(v) for v in node.outputs):
            return False
        if any(v is not None and id(v) in self.side for v in node.inputs):
            return False
        mark = len(self.code)
        nst = len(self.storages)
        ncs = len(self.consts)
        saved = dict(self.loc)
        saved_pre = dict(self.preset)
        try:
            self._lower_loop(node, info)
            return True
        except Unsupported:
            del self.code[mark:]
            del self.storages[nst:]
            del self.consts[ncs:]
            self.loc = saved
            self.preset = saved_pre
            return False

    def _fixed(self, v: Var) -> Loc:
        """``v`` at a location that does not move with the current loop counter."""
        loc = self.get(v)
        if loc.stride == 0:
            return loc
        dst = Loc(self.new(v.size, "fixed"))
        self.emit(Instr(I.OP_COPY, o=dst, a=loc, n=v.size))
        return dst

    def _carry_in_place(self, start: int, slot: Loc, loc: Loc, v: Var) -> None:
        """Retarget the instruction computing a new carry to the carry's own slot when
        that is safe: it is the only write of its fresh block, at this loop's level, and
        nothing after it reads the old carry (an elementwise instruction may read it)."""
        st = loc.st
        if st is slot.st or loc.off or loc.stride or st.fixed or st.size != slot.st.size:
            return
        body = self.code[start:]
        writer = None
        depth = 0
        for k, ins in enumerate(body):
            if isinstance(ins, EagerStep):
                return
            if ins.op == I.OP_LOOP:
                depth += 1
            elif ins.op == I.OP_ENDLOOP:
                depth -= 1
            if any(w.st is st for w in ins.writes):
                if writer is not None or depth:
                    return
                writer = k
            if any(r.st is st for r in ins.reads) and writer is None:
                return
        if writer is None:
            return
        w = body[writer]
        for r in w.reads:
            if r.st is slot.st and not (w.inplace and r.off == 0 and r.stride == 0):
                return
        for ins in body[writer + 1:]:
            if any(r.st is slot.st for r in ins.reads) or \
                    any(x.st is slot.st for x in ins.writes):
                return
        for ins in body:
            for loc_ in (ins.o, ins.a, ins.b, ins.c):
                if loc_ is not None and loc_.st is st:
                    loc_.st = slot.st
        for loc_ in self.loc.values():
            if loc_.st is st:
                loc_.st = slot.st

    def _lower_loop(self, node: Node, info: LoopInfo) -> None:
        body = info.body
        nc, nx = info.n_carry, info.n_xs
        idx, carry, xs, inv = info.body_inputs()
        # operands
        init_locs = [self.get(v) for v in node.inputs[:nc]]
        stack_locs = [self._fixed(v) for v in node.inputs[nc:nc + nx]]
        inv_locs = [self._fixed(v) for v in node.inputs[nc + nx:]]
        cslots = [Loc(self.new(v.size, "carry")) for v in carry]
        for c, init, v in zip(cslots, init_locs, carry, strict=True):
            self.emit(Instr(I.OP_COPY, o=c, a=init, n=v.size))
        ys_vars = body.outputs[nc:]
        yslots = []
        for (start, step, length), outv in zip(info.ys_index, node.outputs[nc:],
                                                strict=True):
            st = self.new(outv.size, "ys")
            yslots.append(st)
            rows = {start + step * j for j in range(info.count)} if length <= 4096 else None
            if length > info.count or (rows is not None and len(rows) < length):
                self.emit(Instr(I.OP_FILL, o=Loc(st), n=outv.size, fp=(0.0,)))
        # body scope
        outer_loc = self.loc
        self.loc = dict(outer_loc)
        outer_pre = self.preset
        self.preset = dict(outer_pre)
        if idx is not None:
            iloc = Loc(self.new(1, "index"))
            self.loc[id(idx)] = iloc
        for v, c in zip(carry, cslots, strict=True):
            self.loc[id(v)] = c
        for v, sl, (start, step) in zip(xs, stack_locs, info.xs_index, strict=True):
            self.loc[id(v)] = Loc(sl.st, sl.off + start * v.size, step * v.size)
        for v, il in zip(inv, inv_locs, strict=True):
            self.loc[id(v)] = il
        produced = {id(o) for n in body.nodes if n.op != LOOP for o in n.outputs}
        placed: set[int] = set()
        late_ys = []
        for v, st, (start, step, _) in zip(ys_vars, yslots, info.ys_index, strict=True):
            slot = Loc(st, start * v.size, step * v.size)
            if id(v) in produced and id(v) not in placed and id(v) not in self.preset:
                self.preset[id(v)] = slot
                placed.add(id(v))
            else:
                late_ys.append((v, slot))
        head = self.emit(Instr(I.OP_LOOP, n=info.count))
        if idx is not None:
            self.emit(Instr(I.OP_SETITER, o=iloc, n=info.index[0], m=info.index[1]))
        self.loop_depth += 1
        try:
            sub_consts = {v: a for v, a in body.consts.items()}
            for v, arr in sub_consts.items():
                if self.pooled(v):
                    st = Storage(v.size, fixed=True, name="const")
                    self.storages.append(st)
                    self.consts.append((st, np.asarray(arr, self.dtype).reshape(-1)))
                    self.loc[id(v)] = Loc(st)
                else:
                    raise Unsupported("a non-pool constant in a loop body")
            saved_lazy = getattr(self, "_lazy_t", set())
            self._mark_transposes(body)
            self._lazy_t |= saved_lazy
            b_inputs = {id(v) for v in body.inputs}
            for v, slot in late_ys:  # rows that are inputs: stacked before anything runs
                if id(v) in b_inputs or id(v) in self.loc and v in body.consts:
                    self.emit(Instr(I.OP_COPY, o=slot, a=self.get(v), n=v.size))
            for n in body.nodes:
                self.lower_node(n)
            for v, slot in late_ys:
                if not (id(v) in b_inputs or id(v) in self.loc and v in body.consts):
                    self.emit(Instr(I.OP_COPY, o=slot, a=self.get(v), n=v.size))
            self._write_carries(head, body.outputs[:nc], carry, cslots)
        finally:
            self.loop_depth -= 1
        tail = self.emit(Instr(I.OP_ENDLOOP))
        head.target = tail
        tail.target = head
        self.loc = outer_loc
        self.preset = outer_pre
        for v, c in zip(node.outputs[:nc], cslots, strict=True):
            self.bind(v, c)
        for v, st in zip(node.outputs[nc:], yslots, strict=True):
            self.bind(v, Loc(st))


    def _write_carries(self, head: Instr, outs: list[Var], carry: list[Var],
                       cslots: list[Loc]) -> None:
        """At the end of a loop body: the new carries ``outs`` go to the carry slots."""
        # a new carry computed by one instruction after the last read of the old value
        # is written straight into the carry slot (no copy at the end of the body)
        # (not when another new carry is this carry's old value: the copies below read it)
        body_start = self.code.index(head) + 1
        for i, v in enumerate(outs):
            if not any(self.get(w).st is cslots[i].st for j, w in enumerate(outs) if j != i):
                self._carry_in_place(body_start, cslots[i], self.get(v), v)
        # new carries: values living in a carry slot go through a temporary first
        new_locs = [self.get(v) for v in outs]
        carry_st = {id(c.st) for c in cslots}
        staged = []
        for i, (loc, v) in enumerate(zip(new_locs, carry, strict=True)):
            if loc.st is cslots[i].st and loc.off == 0 and loc.stride == 0:
                staged.append(None)
                continue
            if id(loc.st) in carry_st:
                tmp = Loc(self.new(v.size, "stage"))
                self.emit(Instr(I.OP_COPY, o=tmp, a=loc, n=v.size))
                loc = tmp
            staged.append(loc)
        for i, loc in enumerate(staged):
            if loc is not None:
                self.emit(Instr(I.OP_COPY, o=cslots[i], a=loc, n=carry[i].size))


def lower(graph: Graph, dtype: np.dtype) -> tuple[Lowering, list, list]:
    """Emits the code of ``graph``; returns the lowering and its input and output places."""
    lw = Lowering(graph, dtype)
    in_locs: list = []
    for v in graph.inputs:
        if lw.pooled(v):
            st = lw.new(v.size, "input")
            lw.loc[id(v)] = Loc(st)
            in_locs.append(Loc(st))
        else:
            lw.side.add(id(v))
            in_locs.append(("side", v))
    lw.lower_graph(graph)
    out_locs = []
    for v in graph.outputs:
        out_locs.append(("side", v) if id(v) in lw.side else lw.get(v))
    return lw, in_locs, out_locs


def build_tape(graph: Graph) -> TapeExecutable:
    """The tier-1 executable of ``graph``."""
    dtype = pool_dtype(graph)
    return TapeExecutable(graph, dtype, *lower(graph, dtype))


def loop_executable(info: LoopInfo, arrays: Sequence[np.ndarray]) -> TapeExecutable | None:
    """A fully native tape for one loop node (None when its body is not supported, or
    the interpreter is not built yet)."""
    key = ("tape", info.count, info.xs_index, info.ys_index, info.index,
           tuple((a.shape, a.dtype.str) for a in arrays))
    cache = info.body.cache
    if key in cache:
        exe = cache[key]
        return exe if exe is None or exe.native_ready() else None
    ins = [Var(a.shape, a.dtype) for a in arrays]
    nc = info.n_carry
    outs = [v.like() for v in info.body.outputs[:nc]]
    outs += [Var((length,) + v.shape, v.dtype) for (_, _, length), v in
             zip(info.ys_index, info.body.outputs[nc:], strict=True)]
    # markers (StopGradient...) are no instructions
    g = expand(Graph(ins, {}, [make_loop(ins, outs, info)], outs))
    exe = build_tape(g)
    if any(s[0] == "eager" for s in exe.steps):
        exe = None
    else:  # run while graphs are traced: its pool is not kept between runs
        exe.keep_pool = False
    cache[key] = exe
    # while the interpreter is not built, the loop runs with eager ops (never waits)
    return exe if exe is None or exe.native_ready() else None
