"""Tier-1 lowering: a graph becomes a tape for the precompiled interpreter.

:func:`build_tape` walks the graph in order and emits interpreter instructions (see
:mod:`nbgrad.jit.interpreter`) for the nodes it supports; every other node becomes an
*eager step* (its kernel called from Python between native segments), so any graph
runs, natively where supported. A loop node whose body is fully supported becomes a
LOOP ... ENDLOOP block (never unrolled); otherwise the whole loop is an eager step.

Values live in one buffer pool (float64 or float32, chosen by the graph; booleans as
0/1, a loop counter as a float). Views that keep the element order (reshape,
squeeze, contiguous, a row of a stack...) are aliases; other data movement is a
strided copy or a gather whose positions are found by running the op's own kernel on
an ``arange``. Storage is assigned after emission from live intervals (a value read
in a loop lives for the whole loop), reusing buffers, in place for elementwise ops.

Natively supported: the elementwise table ops (except :data:`~nbgrad.jit.interpreter.COLD`),
``where``, ``lerp``, ``to_dtype`` between pool types, ``sum``/``mean``/``sum_to``,
``matmul``/``mm``/``bmm``/``dot``/``outer``, the view and data-movement ops of
:data:`MOVES`, ``cat``/``stack``, ``index_backward``, ``index_put``,
``zeros_like``/``ones_like`` and ``loop``; see :func:`native_ops`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ..kernels import elementwise as ew
from . import interpreter as I
from .ir import CUSTOM_KINDS, LOOP, Graph, LoopInfo, Node, Var, format_graph, node_args, type_str
from .program import Executable

#: single-input ops where every output element is one input element (found by
#: running the op's kernel on an arange of positions)
MOVES = frozenset({"reshape", "view", "flatten", "squeeze", "unsqueeze", "expand",
                   "broadcast_to", "permute", "transpose", "contiguous", "index", "split",
                   "split_with_sizes", "unbind", "sum_backward", "flip", "roll", "repeat",
                   "tile", "chunk", "diagonal"})
_TRANSPOSES = frozenset({"transpose", "permute"})
_MATMULS = frozenset({"matmul", "mm", "bmm", "dot", "outer"})


def native_ops() -> list[str]:
    """Names of the table ops the tier-1 interpreter runs natively (others run eagerly)."""
    names = [n for n in list(ew.UNARY) + list(ew.BINARY) + list(ew.TERNARY)
             if n not in I.COLD]
    names += ["to_dtype", "sum", "mean", "sum_to", "zeros_like", "ones_like", "cat",
              "stack", "index_backward", "index_put", *sorted(_MATMULS), *sorted(MOVES)]
    return sorted(set(names)) + ["loop"]


class Unsupported(Exception):
    """Raised by a lowering rule: the node runs as an eager step instead."""


# ------------------------------------------------------------------ storage and operands
class Storage:
    """A block of the pool; ``offset`` is assigned after emission."""

    __slots__ = ("size", "offset", "lo", "hi", "fixed", "name")

    def __init__(self, size: int, fixed: bool = False, name: str = "") -> None:
        self.size = max(int(size), 1)
        self.offset = -1
        self.lo = None
        self.hi = None
        self.fixed = fixed
        self.name = name

    def touch(self, pos: float) -> None:
        self.lo = pos if self.lo is None or pos < self.lo else self.lo
        self.hi = pos if self.hi is None or pos > self.hi else self.hi


class Loc:
    """Where a value is: ``storage`` + ``off`` elements, moving ``stride`` per iteration
    of the innermost loop; ``tshape``/``tstrides`` describe a transposed view."""

    __slots__ = ("st", "off", "stride")

    def __init__(self, st: Storage, off: int = 0, stride: int = 0) -> None:
        self.st = st
        self.off = int(off)
        self.stride = int(stride)

    def at(self, extra: int) -> Loc:
        return Loc(self.st, self.off + extra, self.stride)


class Instr:
    __slots__ = ("op", "o", "a", "b", "c", "n", "m", "k", "fp", "ia", "f", "g", "h", "pos",
                 "node", "reads", "writes", "inplace", "text", "target")

    def __init__(self, op: int, o: Loc | None = None, a: Loc | None = None,
                 b: Loc | None = None, c: Loc | None = None, n: int = 0, m: int = 0,
                 k: int = 0, fp: Sequence[float] = (), ia: Sequence[int] | np.ndarray = (),
                 f: int = 0, g: int = 0, h: int = 0, text: str = "") -> None:
        self.op = op
        self.o, self.a, self.b, self.c = o, a, b, c
        self.n, self.m, self.k = int(n), int(m), int(k)
        self.fp = tuple(float(x) for x in fp)
        self.ia = ia
        self.f, self.g, self.h = int(f), int(g), int(h)
        self.pos = 0
        self.node = None
        self.reads: list[Loc] = [x for x in (a, b, c) if x is not None]
        self.writes: list[Loc] = [o] if o is not None else []
        self.inplace = False
        self.text = text
        self.target = None  # LOOP/ENDLOOP partner


EAGER = -1  # pseudo opcode of an eager step


class EagerStep:
    """A node run from Python between native segments."""

    __slots__ = ("node", "ins", "outs", "loop")

    def __init__(self, node: Node, ins: list, outs: list) -> None:
        self.node = node
        self.ins = ins      # per input: Loc, ("side", var) or None
        self.outs = outs    # per output: Loc or ("side", var)
        self.loop = node.op == LOOP


# ------------------------------------------------------------------ positions helpers
def _strided_pattern(pos: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(offset, strides) if ``pos[i0, i1, ...] == offset + sum(i_d * stride_d)``."""
    if pos.size == 0:
        return 0, (0,) * pos.ndim
    off = int(pos.flat[0])
    strides = []
    for d in range(pos.ndim):
        if pos.shape[d] > 1:
            idx = [0] * pos.ndim
            idx[d] = 1
            strides.append(int(pos[tuple(idx)]) - off)
        else:
            strides.append(0)
    expect = np.full(pos.shape, off, np.int64)
    for d, s in enumerate(strides):
        if s:
            shape = [1] * pos.ndim
            shape[d] = pos.shape[d]
            expect = expect + np.arange(pos.shape[d], dtype=np.int64).reshape(shape) * s
    if not np.array_equal(expect, pos):
        return None
    return off, tuple(strides)


def _collapse(shape: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[int]]:
    """Merge adjacent dims that address memory contiguously; drop size-1 dims."""
    dims = [(s, t) for s, t in zip(shape, strides, strict=True) if s != 1]
    out: list[list[int]] = []
    for s, t in dims:
        if out and out[-1][1] == t * s:
            out[-1][0] *= s
            out[-1][1] = t
        else:
            out.append([s, t])
    return [d[0] for d in out], [d[1] for d in out]


def _bstrides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int]:
    return list(ew.broadcast_strides(shape, out_shape)) if out_shape else []


def _size(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


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
            if node.op not in _TRANSPOSES or not self.pooled(node.outputs[0]):
                continue
            v = node.outputs[0]
            src = node.inputs[0]
            if v.ndim < 2 or id(v) in outs or not _swaps_last_two(node, src):
                continue
            rs = readers.get(id(v), [])
            if rs and all(r.op in _MATMULS for r in rs):
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
            rule = RULES.get(node.op)
            if rule is None:
                if node.op in ew.UNARY:
                    rule = _unary
                elif node.op in ew.BINARY:
                    rule = _binary
                elif node.op in MOVES:
                    rule = _move
                else:
                    raise Unsupported(node.op)
            rule(self, node)
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
            # a new carry computed by one instruction after the last read of the old value
            # is written straight into the carry slot (no copy at the end of the body)
            # (not when another new carry is this carry's old value: the copies below read it)
            body_start = self.code.index(head) + 1
            outs = body.outputs[:nc]
            for i, v in enumerate(outs):
                if not any(self.get(w).st is cslots[i].st for j, w in enumerate(outs) if j != i):
                    self._carry_in_place(body_start, cslots[i], self.get(v), v)
            # new carries: values living in a carry slot go through a temporary first
            new_locs = [self.get(v) for v in body.outputs[:nc]]
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


def _c_strides(shape: Sequence[int]) -> list[int]:
    out = [0] * len(shape)
    step = 1
    for d in range(len(shape) - 1, -1, -1):
        out[d] = step
        step *= shape[d]
    return out


def _swaps_last_two(node: Node, src: Var) -> bool:
    nd = src.ndim
    if nd < 2:
        return False
    if node.op == "transpose":
        d0, d1 = node.attrs["dim0"] % nd, node.attrs["dim1"] % nd
        return {d0, d1} == {nd - 1, nd - 2}
    perm = tuple(node.attrs["dims"])
    return perm == tuple(range(nd - 2)) + (nd - 1, nd - 2)


# ------------------------------------------------------------------ rules
def _params(node: Node) -> tuple[float, float]:
    spec = ew.UNARY[node.op]
    vals = [float(node.attrs[p]) if node.attrs.get(p) is not None else 0.0
            for p in spec.params]
    vals += [0.0] * (2 - len(vals))
    return vals[0], vals[1]


def _unary(lw: Lowering, node: Node) -> None:
    name = node.op
    spec = ew.UNARY[name]
    if name in I.COLD:
        raise Unsupported(name)
    x = node.inputs[0]
    y = node.outputs[0]
    if spec.kind == "bool":
        if y.dtype != np.bool_:
            raise Unsupported(name)
    elif x.dtype != lw.dtype or y.dtype != lw.dtype:
        raise Unsupported(name)
    if name == "clamp" and node.attrs.get("min") is None and node.attrs.get("max") is None:
        raise Unsupported(name)
    p0, p1 = _params(node)
    if name == "clamp":
        p0 = -np.inf if node.attrs.get("min") is None else p0
        p1 = np.inf if node.attrs.get("max") is None else p1
    a = lw.get(x)
    o = lw.out(y)
    if name in I.UNARY_CODE:
        ins = Instr(I.UNARY_CODE[name], o=o, a=a, n=y.size, fp=(p0, p1))
    else:
        ins = Instr(I.OP_UGEN, o=o, a=a, n=y.size, k=I.UNARY_SUB[name], fp=(p0, p1),
                    text=name)
    ins.inplace = True
    lw.emit(ins)


def _broadcast_operands(lw: Lowering, out_shape: tuple[int, ...], vars_: list[Var]
                        ) -> tuple[list[Loc], int, int, list[int], list[int]]:
    """Operands of a binary op as (locs, outer count m, inner n, outer steps, inner
    steps), materialising broadcasts that do not fit two levels."""
    n_out = _size(out_shape)
    locs = [lw.get(v) for v in vars_]
    strides = [_bstrides(v.shape, out_shape) for v in vars_]
    cout = _c_strides(out_shape)
    # collapse dims jointly
    dims = [d for d in range(len(out_shape)) if out_shape[d] != 1]
    groups: list[list[int]] = []
    for d in dims:
        if groups:
            prev = groups[-1][-1]
            ok = all(s[prev] == s[d] * out_shape[d] for s in strides + [cout])
            if ok:
                groups[-1].append(d)
                continue
        groups.append([d])
    def gstride(s: list[int], g: list[int]) -> int:
        return s[g[-1]]
    if len(groups) <= 1:
        n = n_out
        inner = [gstride(s, groups[0]) if groups else 0 for s in strides]
        return locs, 1, n, [0] * len(vars_), inner
    if len(groups) == 2:
        n = _size([out_shape[d] for d in groups[1]])
        m = _size([out_shape[d] for d in groups[0]])
        inner = [gstride(s, groups[1]) for s in strides]
        outer = [gstride(s, groups[0]) for s in strides]
        return locs, m, n, outer, inner
    # materialise every operand that is not already the full shape
    new_locs = []
    for v, loc, s in zip(vars_, locs, strides, strict=True):
        if v.shape == out_shape:
            new_locs.append(loc)
        else:
            new_locs.append(lw.strided_copy(loc, out_shape, s))
    return new_locs, 1, n_out, [0] * len(vars_), [1] * len(vars_)


_BOOL_OK = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"}


def _binary(lw: Lowering, node: Node) -> None:
    name = node.op
    spec = ew.BINARY[name]
    if name in I.COLD:
        raise Unsupported(name)
    a, b = node.inputs
    y = node.outputs[0]
    if name in _BOOL_OK:
        if y.dtype != np.bool_:
            raise Unsupported(name)
    elif not (a.dtype == b.dtype == y.dtype == lw.dtype):
        raise Unsupported(name)
    if spec.kind == "bool" and y.dtype != np.bool_:
        raise Unsupported(name)
    locs, m, n, outer, inner = _broadcast_operands(lw, y.shape, [a, b])
    if inner[0] not in (0, 1) or inner[1] not in (0, 1):
        locs = [loc if v.shape == y.shape else lw.strided_copy(
            loc, y.shape, _bstrides(v.shape, y.shape)) for v, loc in zip((a, b), locs,
                                                                        strict=True)]
        m, n, outer, inner = 1, y.size, [0, 0], [1, 1]
    if inner[0] == 0 and inner[1] == 0 and n > 1:
        locs[0] = lw.strided_copy(locs[0], y.shape, _bstrides(a.shape, y.shape))
        m, n, outer, inner = 1, y.size, [0, 0], [1, inner[1]]
        if y.shape != b.shape:
            inner[1] = 0 if b.size == 1 else 1
            if b.size != 1:
                locs[1] = lw.strided_copy(locs[1], y.shape, _bstrides(b.shape, y.shape))
    mode = 0 if inner == [1, 1] else (1 if inner[0] == 1 else 2)
    if n == 1 and m == 1:
        mode = 0
    code = I.BINARY_CODE.get(name, I.OP_BGEN)
    if mode == 2 and code != I.OP_BGEN:
        if name in I.COMMUTATIVE:  # scalar first: swap the operands
            locs = [locs[1], locs[0]]
            outer = [outer[1], outer[0]]
            mode = 1
        else:
            code = I.OP_BGEN
    o = lw.out(y)
    ins = Instr(code, o=o, a=locs[0], b=locs[1], n=n, m=m, f=mode, g=outer[0], h=outer[1],
                k=I.BINARY_SUB[name], text=name)
    ins.inplace = m == 1 and mode == 0
    lw.emit(ins)


def _ternary(lw: Lowering, node: Node) -> None:
    name = node.op
    y = node.outputs[0]
    if name == "where":
        c, a, b = node.inputs
        if c.dtype != np.bool_ or a.dtype != lw.dtype or b.dtype != lw.dtype:
            raise Unsupported(name)
    else:
        a, b, c = node.inputs
        if not (a.dtype == b.dtype == c.dtype == y.dtype == lw.dtype):
            raise Unsupported(name)
    if y.dtype != lw.dtype:
        raise Unsupported(name)
    locs = []
    flags = 0
    for bit, v in ((1, a), (2, b), (4, c)):
        loc = lw.get(v)
        if v.size == 1 and y.size != 1:
            flags |= bit
        elif v.shape != y.shape:
            loc = lw.strided_copy(loc, y.shape, _bstrides(v.shape, y.shape))
        locs.append(loc)
    o = lw.out(y)
    ins = Instr(I.OP_TGEN, o=o, a=locs[0], b=locs[1], c=locs[2], n=y.size, f=flags,
                k=I.TERNARY_SUB[name], text=name)
    ins.inplace = flags == 0
    lw.emit(ins)


def _to_dtype(lw: Lowering, node: Node) -> None:
    x = node.inputs[0]
    y = node.outputs[0]
    loc = lw.get(x)
    if y.dtype == lw.dtype and (x.dtype == np.bool_ or x.dtype == lw.dtype
                                 or x.dtype.kind in "iu"):
        lw.bind(y, loc)  # the pool already holds the value as a float
        return
    if y.dtype == np.bool_:
        o = lw.out(y)
        lw.emit(Instr(I.OP_UGEN, o=o, a=loc, n=y.size, k=I.UNARY_SUB["to_bool"], fp=(0, 0),
                      text="to_bool"))
        return
    raise Unsupported("to_dtype")


def _fill(value: float):
    def rule(lw: Lowering, node: Node) -> None:
        y = node.outputs[0]
        lw.emit(Instr(I.OP_FILL, o=lw.out(y), n=y.size, fp=(value,)))
    return rule


def _reduce_dims(shape: tuple[int, ...], dims: tuple[int, ...]):
    """(permutation or None, A, R, B) so that the reduced dims are one adjacent run."""
    nd = len(shape)
    if not dims:
        return None, _size(shape), 1, 1
    dims = tuple(sorted(dims))
    if dims == tuple(range(dims[0], dims[-1] + 1)):
        A = _size(shape[:dims[0]])
        R = _size(shape[dims[0]:dims[-1] + 1])
        B = _size(shape[dims[-1] + 1:])
        return None, A, R, B
    kept = tuple(d for d in range(nd) if d not in dims)
    return kept + dims, _size([shape[d] for d in kept]), _size([shape[d] for d in dims]), 1


def _sum_like(lw: Lowering, node: Node, dims: tuple[int, ...], mean: bool) -> None:
    x = node.inputs[0]
    y = node.outputs[0]
    if x.dtype != lw.dtype or y.dtype != lw.dtype:
        raise Unsupported(node.op)
    loc = lw.get(x)
    perm, A, R, B = _reduce_dims(x.shape, dims)
    if perm is not None:
        src = _c_strides(x.shape)
        loc = lw.strided_copy(loc, [x.shape[d] for d in perm], [src[d] for d in perm])
    o = lw.out(y)
    if R == 0:
        lw.emit(Instr(I.OP_FILL, o=o, n=y.size, fp=(np.nan if mean else 0.0,)))
        return
    lw.emit(Instr(I.OP_SUM, o=o, a=loc, n=A, m=R, k=B, f=1 if mean else 0,
                  text="mean" if mean else "sum"))


def _sum(lw: Lowering, node: Node) -> None:
    from ..kernels import reduction as rk
    if node.attrs.get("dtype") is not None and np.dtype(node.attrs["dtype"]) != lw.dtype:
        raise Unsupported("sum with a dtype")
    x = node.inputs[0]
    _sum_like(lw, node, rk.normalize_dims(node.attrs["dim"], x.ndim, "sum"), False)


def _mean(lw: Lowering, node: Node) -> None:
    from ..kernels import reduction as rk
    x = node.inputs[0]
    _sum_like(lw, node, rk.normalize_dims(node.attrs["dim"], x.ndim, "mean"), True)


def _sum_to(lw: Lowering, node: Node) -> None:
    x = node.inputs[0]
    size = tuple(node.attrs["size"])
    lead = x.ndim - len(size)
    dims = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(size)
                                      if s == 1 and x.shape[lead + i] != 1)
    if not dims:
        lw.bind(node.outputs[0], lw.get(x))
        return
    _sum_like(lw, node, dims, False)


def _positions_of(node: Node, x: Var) -> list[np.ndarray]:
    """Run the op's kernel on the positions of ``x``: output -> source positions."""
    from ..ops.registry import REGISTRY
    op = REGISTRY[node.op]
    pos = np.arange(x.size, dtype=np.int64).reshape(x.shape)
    out = op.kernel_for("cpu")(*node_args(node, [pos]))
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [np.asarray(o) for o in outs]


def _place(lw: Lowering, src: Loc, pos: np.ndarray, y: Var) -> None:
    """Make ``y`` (whose elements are ``src[pos]``) by alias, strided copy or gather."""
    if pos.shape != y.shape or pos.dtype.kind not in "iu":
        raise Unsupported("movement positions")
    flat = pos.reshape(-1)
    if y.size == 0:
        lw.bind(y, src)
        return
    if flat[0] >= 0 and np.array_equal(flat, np.arange(flat[0], flat[0] + y.size)):
        lw.bind(y, src.at(int(flat[0])))
        return
    pat = _strided_pattern(pos)
    if pat is not None:
        off, strides = pat
        cs, _ = _collapse(y.shape, strides)
        if len(cs) <= 4:
            o = lw.out(y)
            lw.strided_copy(src.at(off), y.shape, strides, dst=o, size=y.size)
            return
    o = lw.out(y)
    lw.emit(Instr(I.OP_GATHER, o=o, a=src, n=y.size, ia=flat.astype(np.int64)))


def _move(lw: Lowering, node: Node) -> None:
    x = node.inputs[0]
    if any(v is not None for v in node.inputs[1:]):
        raise Unsupported(node.op)
    if x.size > 50_000_000:
        raise Unsupported("too large to map")
    src = lw.get(x)
    try:
        positions = _positions_of(node, x)
    except Exception as exc:  # the kernel refused: run it eagerly
        raise Unsupported(str(exc)) from None
    if len(positions) != len(node.outputs):
        raise Unsupported(node.op)
    for pos, y in zip(positions, node.outputs, strict=True):
        _place(lw, src, pos, y)


def _join(lw: Lowering, node: Node) -> None:
    """``cat`` and ``stack``: each input is scattered into the output."""
    from ..ops.registry import REGISTRY
    y = node.outputs[0]
    ins = [v for v in node.inputs]
    if any(v.dtype != y.dtype for v in ins):
        raise Unsupported(node.op)
    op = REGISTRY[node.op]
    base = 0
    arrays = []
    for v in ins:
        arrays.append(np.arange(base, base + v.size, dtype=np.int64).reshape(v.shape))
        base += v.size
    out = np.asarray(op.kernel_for("cpu")(arrays, node.attrs["dim"])).reshape(-1)
    o = lw.out(y)
    order = np.argsort(out, kind="stable")  # order[j]: output index of source element j
    start = 0
    for v in ins:
        positions = order[start:start + v.size]
        start += v.size
        runs = positions.size and np.array_equal(
            positions, np.arange(positions[0], positions[0] + v.size))
        if runs:
            lw.emit(Instr(I.OP_COPY, o=o.at(int(positions[0])), a=lw.get(v), n=v.size))
        else:
            lw.emit(Instr(I.OP_SCATTER_ADD, o=o, a=lw.get(v), n=v.size, m=y.size,
                          f=2, ia=positions.astype(np.int64)))


def _index_backward(lw: Lowering, node: Node) -> None:
    from ..ops.registry import REGISTRY
    g = node.inputs[0]
    y = node.outputs[0]
    if g.dtype != lw.dtype:
        raise Unsupported(node.op)
    sizes = tuple(node.attrs["sizes"])
    pos = np.arange(_size(sizes), dtype=np.int64).reshape(sizes)
    sel = np.asarray(REGISTRY["index"].kernel_for("cpu")(pos, node.attrs["indices"]))
    src = lw.get(g)
    if sel.shape != g.shape:
        src = lw.strided_copy(src, sel.shape, _bstrides(g.shape, sel.shape))
    o = lw.out(y)
    lw.emit(Instr(I.OP_SCATTER_ADD, o=o, a=src, n=sel.size, m=y.size, f=1,
                  ia=sel.reshape(-1).astype(np.int64)))


def _index_put(lw: Lowering, node: Node) -> None:
    from ..ops.registry import REGISTRY
    x, values = node.inputs
    y = node.outputs[0]
    if x.dtype != lw.dtype or values.dtype != lw.dtype:
        raise Unsupported(node.op)
    pos = np.arange(x.size, dtype=np.int64).reshape(x.shape)
    sel = np.asarray(REGISTRY["index"].kernel_for("cpu")(pos, node.attrs["indices"]))
    vloc = lw.get(values)
    if values.shape != sel.shape:
        try:
            strides = _bstrides(values.shape, sel.shape)
        except ValueError:
            raise Unsupported(node.op) from None
        if len(values.shape) > len(sel.shape):
            raise Unsupported(node.op)
        vloc = lw.strided_copy(vloc, sel.shape, strides)
    o = lw.out(y)
    lw.emit(Instr(I.OP_COPY, o=o, a=lw.get(x), n=x.size))
    lw.emit(Instr(I.OP_SCATTER_ADD, o=o, a=vloc, n=sel.size, m=y.size,
                  f=0 if node.attrs.get("accumulate") else 2,
                  ia=sel.reshape(-1).astype(np.int64)))


def _matmul(lw: Lowering, node: Node) -> None:
    A, B = node.inputs
    C = node.outputs[0]
    if not (A.dtype == B.dtype == C.dtype == lw.dtype):
        raise Unsupported(node.op)
    name = node.op
    if name == "outer":
        a_shape, b_shape = (A.shape[0], 1), (1, B.shape[0])
    elif name == "dot":
        a_shape, b_shape = (1, A.shape[0]), (B.shape[0], 1)
    else:
        a_shape = (1,) + A.shape if A.ndim == 1 else A.shape
        b_shape = B.shape + (1,) if B.ndim == 1 else B.shape
    n, k = a_shape[-2], a_shape[-1]
    m = b_shape[-1]
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    nb = _size(batch)

    def operand(v: Var, shape: tuple[int, ...], rows: int, cols: int):
        """(loc, batch stride, stride over rows, stride over cols)."""
        tr = lw.transposed.get(id(v))
        if tr is not None and id(v) not in lw.loc:
            src, sloc = tr
            loc = sloc
            rs, cs = 1, rows  # v[i, t] = src[t, i]: src is (cols, rows) row-major
            bstride = rows * cols
        else:
            loc = lw.get(v)
            rs, cs = cols, 1
            bstride = rows * cols
        vb = shape[:-2]
        if _size(vb) == nb:
            return loc, (bstride if nb > 1 else 0), rs, cs
        if _size(vb) == 1:
            return loc, 0, rs, cs
        # broadcast batch dims: materialise the operand to the full batch
        full = tuple(batch) + shape[-2:]
        strides = _bstrides(shape, full)
        if tr is not None and id(v) not in lw.loc:
            loc = lw.get(v)  # materialise the transpose first
        new = lw.strided_copy(loc, full, strides)
        return new, rows * cols, cols, 1

    a_loc, sa, ai, at = operand(A, a_shape, n, k)
    b_loc, sb, bt, bj = operand(B, b_shape, k, m)
    # a matrix-vector product runs as plain loops (A may be transposed); anything else
    # goes to BLAS (np.dot) on row-major operands
    loops = m == 1 and bt == 1 and (at == 1 or ai == 1)
    if not loops and not (ai == k and at == 1):
        a_loc = lw.strided_copy(a_loc, (nb if sa else 1, n, k), [sa, ai, at])
        sa = n * k if sa else 0
        ai, at = k, 1
    if not loops and not (bt == m and bj == 1):
        b_loc = lw.strided_copy(b_loc, (nb if sb else 1, k, m), [sb, bt, bj])
        sb = k * m if sb else 0
        bt, bj = m, 1
    o = lw.out(C)
    if C.size == 0:
        return
    if k == 0:
        lw.emit(Instr(I.OP_FILL, o=o, n=C.size, fp=(0.0,)))
        return
    lw.emit(Instr(I.OP_MATMUL, o=o, a=a_loc, b=b_loc, n=n, m=m, k=k, g=nb,
                  f=0 if loops else 1, ia=np.array([sa, sb, ai, at, bt, bj], np.int64),
                  text=name))


def _alias(lw: Lowering, node: Node) -> None:
    lw.bind(node.outputs[0], lw.get(node.inputs[0]))


RULES = {
    "where": _ternary, "lerp": _ternary, "to_dtype": _to_dtype,
    "zeros_like": _fill(0.0), "ones_like": _fill(1.0),
    "sum": _sum, "mean": _mean, "sum_to": _sum_to,
    "cat": _join, "stack": _join, "index_backward": _index_backward,
    "index_put": _index_put, "contiguous": _alias,
    **{name: _matmul for name in _MATMULS},
}


# ------------------------------------------------------------------ storage assignment
def _assign(code: list, storages: list[Storage], n_inputs_first: list[Storage],
            keep_alive: list[Storage]) -> int:
    """Live intervals -> offsets (reusing freed blocks); returns the pool size."""
    for p, item in enumerate(code):
        if isinstance(item, EagerStep):
            for loc in item.ins:
                if isinstance(loc, Loc):
                    loc.st.touch(p)
            for loc in item.outs:
                if isinstance(loc, Loc):
                    loc.st.touch(p)
            continue
        item.pos = p
        for loc in item.writes:
            loc.st.touch(p)
        for loc in item.reads:
            loc.st.touch(p - 0.5 if item.inplace and loc.stride == 0 and item.o is not None
                         and item.o.stride == 0 else p)
    end = len(code) + 1
    for st in n_inputs_first:
        st.touch(-1)
    for st in keep_alive:
        st.touch(end)
    # a value touched both inside and outside a loop lives through the whole loop
    loops = [(item.pos, item.target.pos) for item in code
             if isinstance(item, Instr) and item.op == I.OP_LOOP]
    changed = True
    while changed:
        changed = False
        for st in storages:
            if st.lo is None:
                continue
            for lo, hi in loops:
                inside = lo <= st.lo and st.hi <= hi
                overlaps = st.lo <= hi and st.hi >= lo
                if overlaps and not inside and (st.lo > lo or st.hi < hi):
                    st.lo, st.hi = min(st.lo, lo), max(st.hi, hi)
                    changed = True
    # fixed storages (constants) first
    top = 0
    for st in storages:
        if st.fixed:
            st.offset = top
            top += st.size
    free: list[list[int]] = []  # [offset, size], sorted by offset
    events = sorted((st for st in storages if not st.fixed and st.lo is not None),
                    key=lambda s: (s.lo, s.hi))
    active: list[Storage] = []
    import heapq
    heap: list[tuple[float, int, Storage]] = []
    counter = 0
    for st in events:
        while heap and heap[0][0] < st.lo:
            _, _, old = heapq.heappop(heap)
            _release(free, old.offset, old.size)
        off = _take(free, st.size)
        if off is None:
            off = top
            top += st.size
        st.offset = off
        counter += 1
        heapq.heappush(heap, (st.hi, counter, st))
        active.append(st)
    for st in storages:
        if st.offset < 0:  # never touched
            st.offset = 0
    return max(top, 1)


def _take(free: list[list[int]], size: int) -> int | None:
    best = None
    for i, (_, sz) in enumerate(free):
        if sz >= size and (best is None or sz < free[best][1]):
            best = i
            if sz == size:
                break
    if best is None:
        return None
    off, sz = free[best]
    if sz == size:
        free.pop(best)
    else:
        free[best] = [off + size, sz - size]
    return off


def _release(free: list[list[int]], off: int, size: int) -> None:
    import bisect
    i = bisect.bisect_left(free, [off, 0])
    free.insert(i, [off, size])
    if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
        free[i][1] += free[i + 1][1]
        free.pop(i + 1)
    if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
        free[i - 1][1] += free[i][1]
        free.pop(i)


# ------------------------------------------------------------------ the executable
def pool_dtype(graph: Graph) -> np.dtype:
    counts = {np.dtype(np.float64): 0, np.dtype(np.float32): 0}
    for v in list(graph.inputs) + [o for n in graph.walk() for o in n.outputs]:
        if v.dtype in counts:
            counts[v.dtype] += v.size + 1
    return np.dtype(np.float32) if counts[np.dtype(np.float32)] > counts[
        np.dtype(np.float64)] else np.dtype(np.float64)


class TapeExecutable(Executable):
    """A lowered graph: native segments of the interpreter and eager steps."""

    tier = "interpret"

    def __init__(self, graph: Graph, dtype: np.dtype | None = None) -> None:
        super().__init__(graph)
        self.dtype = pool_dtype(graph) if dtype is None else np.dtype(dtype)
        lw = Lowering(graph, self.dtype)
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
        self.lw = lw
        inputs_st = [loc.st for loc in in_locs if isinstance(loc, Loc)]
        outputs_st = [loc.st for loc in out_locs if isinstance(loc, Loc)]
        self.size = _assign(lw.code, lw.storages, inputs_st, outputs_st)
        self._encode(lw.code)
        self.in_locs = in_locs
        self.out_locs = out_locs
        self.side_consts = {id(v): a for v, a in graph.consts.items() if id(v) in lw.side}
        self.template = np.zeros(self.size, self.dtype)
        for st, arr in lw.consts:
            self.template[st.offset:st.offset + arr.size] = arr  # storages hold >= 1
        self._pool = self.template.copy()
        self._lock = threading.Lock()
        self.native_calls = sum(1 for s in self.steps if s[0] == "native")

    def _encode(self, code: list) -> None:
        rows = []
        fp: list[float] = [0.0, 0.0]
        ia: list[np.ndarray] = []
        ia_len = 0
        steps: list = []
        seg_start = 0
        for item in code:
            if isinstance(item, EagerStep):
                if len(rows) > seg_start:
                    steps.append(("native", seg_start, len(rows)))
                steps.append(("eager", item))
                seg_start = len(rows)
                continue
            row = np.zeros(I.WIDTH, np.int64)
            row[I.F_OP] = item.op
            for field, sfield, loc in ((I.F_O, I.F_SO, item.o), (I.F_A, I.F_SA, item.a),
                                       (I.F_B, I.F_SB, item.b), (I.F_C, I.F_SC, item.c)):
                if loc is not None:
                    row[field] = loc.st.offset + loc.off
                    row[sfield] = loc.stride
            row[I.F_N], row[I.F_M], row[I.F_K] = item.n, item.m, item.k
            row[I.F_F], row[I.F_G], row[I.F_H] = item.f, item.g, item.h
            if item.fp:
                row[I.F_P] = len(fp)
                fp.extend(item.fp)
                fp.extend([0.0] * max(0, 2 - len(item.fp)))
            elif len(item.ia):
                row[I.F_P] = ia_len
                arr = np.asarray(item.ia, np.int64)
                ia.append(arr)
                ia_len += arr.size
            item.pos = len(rows)
            rows.append(row)
        if len(rows) > seg_start:
            steps.append(("native", seg_start, len(rows)))
        for item in code:
            if isinstance(item, Instr) and item.op == I.OP_LOOP:
                rows[item.pos][I.F_M] = item.target.pos
            elif isinstance(item, Instr) and item.op == I.OP_ENDLOOP:
                rows[item.pos][I.F_M] = item.target.pos
        self.ins = np.array(rows, np.int64).reshape(-1, I.WIDTH)
        self.fp = np.array(fp, np.float64)
        self.ia = np.concatenate(ia) if ia else np.zeros(1, np.int64)
        self.steps = steps
        self.code = code

    # -------------------------------------------------------------- running
    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self._lock.acquire(blocking=False):
            try:
                return self._run(self._pool, arrays)
            finally:
                self._lock.release()
        return self._run(self.template.copy(), arrays)

    def _run(self, buf: np.ndarray, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        side: dict[int, np.ndarray] = dict(self.side_consts)
        for loc, arr in zip(self.in_locs, arrays, strict=True):
            if isinstance(loc, Loc):
                o = loc.st.offset
                buf[o:o + arr.size] = np.asarray(arr).reshape(-1)
            else:
                side[id(loc[1])] = np.asarray(arr)
        run = I.run_function()
        for step in self.steps:
            if step[0] == "native":
                run(self.ins, step[1], step[2], buf, self.fp, self.ia)
            else:
                self._eager(step[1], buf, side)
        outs = []
        for loc, v in zip(self.out_locs, self.graph.outputs, strict=True):
            if isinstance(loc, Loc):
                o = loc.st.offset + loc.off
                outs.append(buf[o:o + v.size].reshape(v.shape).astype(v.dtype))
            else:
                outs.append(np.array(side[id(v)], copy=True))
        return outs

    def _eager(self, step: EagerStep, buf: np.ndarray, side: dict) -> None:
        from ..ops.registry import REGISTRY
        node = step.node
        vals = []
        for v, loc in zip(node.inputs, step.ins, strict=True):
            if v is None:
                vals.append(None)
            elif isinstance(loc, Loc):
                o = loc.st.offset + loc.off
                arr = buf[o:o + v.size].reshape(v.shape)
                vals.append(arr.astype(v.dtype) if v.dtype != buf.dtype else arr.copy())
            else:
                vals.append(side[id(v)])
        if node.op == LOOP:
            from .loops import execute_loop_eager
            outs = execute_loop_eager(LoopInfo.of(node), vals)
        elif node.op in CUSTOM_KINDS:  # custom Functions: Python code (pythonop.run_node)
            from .pythonop import run_node
            outs = run_node(node, vals)
        else:
            op = REGISTRY[node.op]
            out = op.kernel_for("cpu")(*node_args(node, vals))
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for v, loc, arr in zip(node.outputs, step.outs, outs, strict=True):
            if isinstance(loc, Loc):
                o = loc.st.offset + loc.off
                buf[o:o + v.size] = np.asarray(arr).reshape(-1)
            else:
                side[id(v)] = np.asarray(arr)

    # -------------------------------------------------------------- text
    def source(self) -> str:
        lines = [f"# tier-1 tape: {len(self.ins)} instructions, pool of {self.size} "
                 f"{self.dtype.name}, {self.native_calls} native segment(s), "
                 f"{sum(1 for s in self.steps if s[0] == 'eager')} eager step(s)"]
        depth = 0
        for step in self.steps:
            if step[0] == "eager":
                node = step[1].node
                types = ", ".join(type_str(v) for v in node.inputs if v is not None)
                lines.append(f"  EAGER {node.op}({types})")
                continue
            lines.append(f"  -- native segment [{step[1]}, {step[2]})")
            for pc in range(step[1], step[2]):
                row = self.ins[pc]
                op = int(row[I.F_OP])
                name = I.OP_NAMES.get(op, str(op))
                if op == I.OP_ENDLOOP:
                    depth -= 1
                pad = "  " * depth
                if op == I.OP_LOOP:
                    lines.append(f"  {pc:5d} {pad}LOOP x{row[I.F_N]} (to {row[I.F_M]})")
                    depth += 1
                    continue
                if op == I.OP_ENDLOOP:
                    lines.append(f"  {pc:5d} {pad}ENDLOOP")
                    continue
                ops = []
                for label, f, s in (("o", I.F_O, I.F_SO), ("a", I.F_A, I.F_SA),
                                    ("b", I.F_B, I.F_SB), ("c", I.F_C, I.F_SC)):
                    if row[f] or row[s] or label in ("o",):
                        ops.append(f"{label}=@{row[f]}" + (f"+{row[s]}i" if row[s] else ""))
                sub = ""
                if op == I.OP_UGEN:
                    sub = _name_of(I.UNARY_SUB, row[I.F_K])
                elif op == I.OP_BGEN:
                    sub = _name_of(I.BINARY_SUB, row[I.F_K])
                elif op == I.OP_TGEN:
                    sub = _name_of(I.TERNARY_SUB, row[I.F_K])
                sizes = f"n={row[I.F_N]} m={row[I.F_M]} k={row[I.F_K]} f={row[I.F_F]}"
                lines.append(f"  {pc:5d} {pad}{name}{'.' + sub if sub else ''} "
                             f"{' '.join(ops)} {sizes}")
        return "\n".join(lines)


def _name_of(table: dict, code: int) -> str:
    for k, v in table.items():
        if v == code:
            return k
    return str(code)


def build_tape(graph: Graph) -> TapeExecutable:
    """The tier-1 executable of ``graph``."""
    return TapeExecutable(graph)


def loop_executable(info: LoopInfo, arrays: Sequence[np.ndarray]) -> TapeExecutable | None:
    """A fully native tape for one loop node (None when its body is not supported)."""
    key = ("tape", info.count, info.xs_index, info.ys_index, info.index,
           tuple((a.shape, a.dtype.str) for a in arrays))
    cache = info.body.cache
    if key in cache:
        return cache[key]
    ins = [Var(a.shape, a.dtype) for a in arrays]
    nc = info.n_carry
    outs = [v.like() for v in info.body.outputs[:nc]]
    outs += [Var((length,) + v.shape, v.dtype) for (_, _, length), v in
             zip(info.ys_index, info.body.outputs[nc:], strict=True)]
    from .function_trace import expand  # markers (StopGradient...) are no instructions
    from .ir import make_loop
    g = expand(Graph(ins, {}, [make_loop(ins, outs, info)], outs))
    exe = TapeExecutable(g)
    if any(s[0] == "eager" for s in exe.steps):
        exe = None
    cache[key] = exe
    return exe


def describe(exe: TapeExecutable) -> str:
    return format_graph(exe.graph) + "\n" + exe.source()
