"""Tier-2 code emission: one ``@njit`` Python function for a whole graph.

:class:`FunctionEmitter` walks a graph's fusion plan (:mod:`nbgrad.jit.tier2.fusion`) and
writes readable Python for Numba:

- a fused region becomes one loop nest; operands are loaded once per element (at the
  outermost loop depth where their index is known), each node's scalar expression
  from :mod:`nbgrad.kernels.elementwise` is a local, trailing reductions accumulate
  in the same nest, and only values read elsewhere are stored;
- ``loop`` nodes become native ``for`` loops (never unrolled); carries live in
  buffers that are swapped (or copied) at the end of each step, ``ys`` rows are
  written into their stacks;
- every other node follows the rule of its op's declared kind (:mod:`nbgrad.ops.traits`,
  never its name): small matrix products are loops, large ones ``np.dot`` into a
  preallocated buffer; views and permutes are NumPy views; moves, joins and index
  scatters are loops over positions found when the code is generated
  (:mod:`nbgrad.jit.tier2.moves`); an opaque op with a ``native`` function calls it;
- any other op calls its eager CPU kernel through ``numba.objmode`` (correct, with a
  Python round trip per call: it is listed in :attr:`FunctionEmitter.fallbacks`, and the
  source says why, from the op's ``why_not_native``).

Buffers are allocated once at the top of the function (also those of loop bodies)
and reused when their value is dead (liveness per scope, views keep their base
alive); an elementwise region may write over an input that dies in it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ...kernels import elementwise as ew
from ...ops.traits import IndexScatter, Join, Kind, Matmul, Move, Opaque, Permute, View
from ..trace.ir import CUSTOM_KINDS, LOOP, Graph, LoopInfo, Node, Var
from . import blocked, fusion
from .fusion import Access, Group, Reduction
from .moves import MovesEmitter, NotNative
from .ops import OpsEmitter
from .store import (
    Pool,
    Scope,
    Store,
    Tier2Unsupported,
    _affine,
    _short,
    cast,
    empty,
    fill,
    literal,
    scalar_expr,
    scratch_slots,
    uniform_value,
)

#: ends the lines that count range-limited arguments (left out of the libm redo)
_FLAG = "  # range check"

__all__ = ["MAX_GROUPS", "FunctionEmitter", "Pool", "Scope", "Store", "Tier2Unsupported"]

#: a graph needing more separate loop nests than this stays in tier 1: Numba's compile
#: time grows faster than linearly with the function's size (an unrolled trace that was
#: not re-rolled into a loop would take minutes)
MAX_GROUPS = 250
#: graphs with more nodes in one scope are refused before fusion planning (an unrolled
#: trace that was not re-rolled: planning it alone would take minutes)
MAX_NODES = 5000


# ------------------------------------------------------------------ the emitter

def scalar_of(s: Store) -> str:
    """The expression of a 0-d value as a scalar (a 0-d array is read at ``[()]``).

    A 0-d value assigned to a scalar local (a loop carry) must be a scalar on every
    path: Numba cannot unify a 0-d array with a scalar.
    """
    return s.name if s.kind in ("scalar", "literal") else s.ref([])


class FunctionEmitter(OpsEmitter, MovesEmitter):
    """Writes the entry function of one graph (see the module docstring)."""

    def __init__(self, graph: Graph, numbers: dict[int, int]) -> None:
        self.graph = graph
        self.numbers = numbers
        self.prologue: list[str] = []
        self.lines: list[str] = []
        self.indent = 1
        self.used_names: set[str] = set()
        self.const_args: list[tuple[str, np.ndarray]] = []
        #: (key, node) of every node run through objmode
        self.fallbacks: list[tuple[int, Node]] = []
        self.loop_depth = 0
        self.regions = 0
        self.fused_nodes = 0
        #: regions written as blocked loops (:mod:`.blocked`): the parallel entry pays
        self.blocked = 0
        self.region_sums = blocked.RegionSums()
        self.groups_total = 0
        #: name of a view made by a shape op -> the name of the array it views
        self.view_base: dict[str, str] = {}
        #: (global name, @njit function) of the native functions the code calls
        self.natives: list[tuple[str, object]] = []
        #: module-level lines (constant index arrays) written before the function
        self.globals_lines: list[str] = []
        #: pool buffer name -> (shape, dtype, its prologue line); carry buffer swaps
        self.allocs: dict[str, tuple] = {}
        self.swaps: list[tuple[str, str]] = []
        #: (shape, dtype) of the scratch parameters (:func:`.store.scratch_slots`), last
        self.scratch: list[tuple[tuple[int, ...], np.dtype]] = []

    # -------------------------------------------------------------- helpers
    def num(self, v: Var) -> str:
        n = self.numbers.get(id(v))
        return "?" if n is None else str(n)

    def fresh_name(self, hint: str) -> str:
        name = hint
        k = 1
        while name in self.used_names:
            k += 1
            name = f"{hint}_{k}"
        self.used_names.add(name)
        return name

    def buffer_of(self, name: str) -> str:
        """The array whose memory the array named ``name`` is (a view's base, recursively)."""
        while name in self.view_base:
            name = self.view_base[name]
        return name

    def line(self, text: str, extra: int = 0) -> None:
        self.lines.append("    " * (self.indent + extra) + text)

    def comment_node(self, node: Node) -> str:
        ins = ", ".join("None" if v is None else f"%{self.num(v)}" for v in node.inputs)
        outs = ", ".join(f"%{self.num(v)}" for v in node.outputs)
        attrs = ", ".join(f"{k}={_short(v)}" for k, v in node.attrs.items()
                          if not k.startswith("#") and k != "body")
        return f"{outs} = {node.op}({ins})" + (f" {{{attrs}}}" if attrs else "")

    # -------------------------------------------------------------- entry
    def emit_entry(self, name: str) -> tuple[list[str], list[str]]:
        """Emit the whole function; returns (parameter names, source lines)."""
        g = self.graph
        top = Scope(self, g, None)
        params: list[str] = []
        for v in g.inputs:
            n = f"v{self.num(v)}"
            self.used_names.add(n)
            if v.shape == ():
                params.append(n + "_in")
                self.prologue.append(f"{n} = {n}_in[()]")
                top.stores[id(v)] = Store(n, "scalar", (), v.dtype)
            else:
                params.append(n)
                top.stores[id(v)] = Store(n, "array", v.shape, v.dtype)
        self.bind_consts(g, top)
        self.emit_graph(g, top, list(g.outputs))
        rets = []
        returned: set[str] = set()
        for k, v in enumerate(g.outputs):
            s = top.get(v)
            rets.append(self.output_expr(s, v, returned, k))
        params += [n for n, _ in self.const_args]
        params += self.scratch_params(top)
        self.line("return (" + ", ".join(rets) + ("," if len(rets) == 1 else "") + ")")
        return params, ["    " + p for p in self.prologue] + self.lines

    def scratch_params(self, top: Scope) -> list[str]:
        """Large internal buffers become parameters the caller keeps between calls
        (:func:`.store.scratch_slots`); none where Python code (objmode) could keep a
        view of one. (A native function's results are not pool buffers: a result that
        is one is copied when returned.)"""
        if self.fallbacks:
            return []
        escaped: set[str] = set()
        for v in self.graph.outputs:
            s = top.get(v)
            escaped.update(n for n in (s.name, s.slot, self.buffer_of(s.name)) if n)
        names = scratch_slots(self.allocs, self.swaps, escaped)
        for n in names:
            shape, dtype, line = self.allocs[n]
            self.prologue.remove(line)
            self.scratch.append((shape, dtype))
        return names

    def output_expr(self, s: Store, v: Var, returned: set[str], k: int) -> str:
        if s.kind in ("scalar", "literal") and v.shape == ():
            o = self.fresh_name(f"out{k}")
            self.line(f"{o} = {empty(1, v.dtype)}")
            self.line(f"{o}[0] = {s.name}")
            return o
        if s.kind == "literal":
            o = self.fresh_name(f"out{k}")
            self.line(f"{o} = {empty(v.shape, v.dtype)}")
            self.line(fill(o, v.shape, s.name))
            return o
        if s.fresh and s.name not in returned:
            returned.add(s.name)
            return s.name
        return f"{s.array}.copy()"

    def bind_consts(self, g: Graph, scope: Scope) -> None:
        for v, arr in g.consts.items():
            u = uniform_value(arr)
            if u is not None:
                scope.stores[id(v)] = Store(literal(u, arr.dtype), "literal", v.shape, v.dtype)
                continue
            n = self.fresh_name(f"k{self.num(v)}")
            self.const_args.append((n, np.ascontiguousarray(arr)))
            scope.stores[id(v)] = Store(n, "array", v.shape, v.dtype)

    def array_of(self, v: Var, scope: Scope) -> str:
        """The value as an array expression (uniform constants are materialised)."""
        s = scope.get(v)
        if s.kind == "array":
            return s.array
        if s.kind == "literal":
            n = self.fresh_name(f"k{self.num(v)}")
            self.prologue += [f"{n} = {empty(v.shape, v.dtype)}", fill(n, v.shape, s.name)]
            scope.stores[id(v)] = Store(n, "array", v.shape, v.dtype)
            return n
        raise RuntimeError("a 0-d value has no array form")  # pragma: no cover

    # -------------------------------------------------------------- one scope
    def emit_graph(self, g: Graph, scope: Scope, outputs: Sequence[Var]) -> None:
        if len(g.nodes) > MAX_NODES:  # planning fusion itself would take minutes
            self.too_large(len(g.nodes))
        opaque = sum(1 for n in g.nodes if n.op == LOOP or not (
            fusion.is_elementwise(n) or fusion.is_reduction(n)))
        if self.groups_total + opaque > MAX_GROUPS:  # known before planning (which is
            self.groups_total += opaque               # slow for an unrolled trace)
            self.too_large(len(g.nodes))
        plan = fusion.plan(g, outputs)
        groups = plan.groups
        self.groups_total += len(groups)
        if self.groups_total > MAX_GROUPS:
            self.too_large(len(g.nodes))
        last: dict[int, int] = {}
        for gi, grp in enumerate(groups):
            for v in grp.reads():
                last[id(v)] = gi
        end = len(groups)
        for v in outputs:
            last[id(v)] = end
        for gi, grp in enumerate(groups):
            if grp.kind == "region":
                self.emit_region(grp, scope, last, gi)
            else:
                self.emit_node(grp.node, scope, last, gi)
            for v in grp.reads():
                if last.get(id(v)) == gi:
                    self.release(v, scope)
            for v in grp.defined():
                if id(v) not in last:
                    self.release(v, scope)
        for v in outputs:
            s = scope.stores.get(id(v))
            if s is not None and s.slot is not None and scope.pool.owns(s.slot):
                scope.pool.pinned.add(s.slot)

    def too_large(self, nodes: int) -> None:
        raise Tier2Unsupported(
            f"the graph needs more than {MAX_GROUPS} separate loop nests after fusion "
            f"({nodes} nodes in one scope); generated code that large compiles too "
            "slowly (write long Python loops with nbgrad.fori_loop or nbgrad.scan, or let "
            "the tracer re-roll them)")

    def release(self, v: Var, scope: Scope) -> None:
        s = scope.stores.get(id(v))
        if s is not None and s.slot is not None:
            scope.pool.release(s.slot, v)

    def store_array(self, v: Var, scope: Scope, zero: bool = False) -> Store:
        dest = scope.dest.pop(id(v), None)
        if dest is not None:
            if zero:
                self.line(fill(dest, v.shape, "0"))
            s = Store(dest, "array", v.shape, v.dtype)
            scope.stores[id(v)] = s
            return s
        slot = scope.pool.alloc(v, f"v{self.num(v)}", zero)
        s = Store(slot, "array", v.shape, v.dtype, slot=slot, fresh=True)
        scope.stores[id(v)] = s
        return s

    def define_scalar(self, v: Var, scope: Scope) -> Store:
        name = f"v{self.num(v)}"
        self.used_names.add(name)
        s = Store(name, "scalar", (), v.dtype)
        scope.stores[id(v)] = s
        return s

    # -------------------------------------------------------------- regions
    def emit_region(self, grp: Group, scope: Scope, last: dict[int, int], gi: int) -> None:
        shape = grp.shape
        nd = len(shape)
        inside: dict[int, str] = {}       # id(var) -> local name of a region value
        depth_of: dict[int, int] = {}     # id(var) -> loop depth where it is known
        loads: dict[str, tuple[str, int]] = {}  # element expression -> (local, depth)
        code: list[list[str]] = [[] for _ in range(nd + 1)]
        pre: list[list[str]] = [[] for _ in range(nd + 1)]
        post: list[list[str]] = [[] for _ in range(nd + 1)]
        big = None  # the counter of sin/cos/tan arguments beyond TRIG_MAX, if any
        identity_reads: set[int] = set()
        other_reads: set[int] = set()
        self.regions += 1
        self.fused_nodes += len(grp.nodes) + len(grp.reductions)

        def operand(acc: Access) -> tuple[str, int, np.dtype]:
            v = acc.var
            if id(v) in inside:
                return inside[id(v)], depth_of[id(v)], v.dtype
            s = scope.get(v)
            if s.kind in ("scalar", "literal"):
                other_reads.add(id(v))
                return s.name, 0, v.dtype
            # one load per element read: keyed by the element expression itself (the
            # buffer and every index), so reads of one buffer at different offsets,
            # steps or through different views never share a load
            element = s.ref([acc.index(k) for k in range(len(acc.dims))])
            if element in loads:
                name, d = loads[element]
                return name, d, v.dtype
            if acc.is_identity(shape):
                identity_reads.add(id(v))
            else:
                other_reads.add(id(v))
            used = [d for d in acc.dims if d is not None]
            d = (max(used) + 1) if used else 0
            name = self.fresh_name(f"x{self.num(v)}" + ("" if acc.is_identity(shape)
                                                        else f"_{len(loads)}"))
            loads[element] = (name, d)
            code[d].append(f"{name} = {element}")
            return name, d, v.dtype

        # the elementwise nodes, each at the outermost depth its operands allow
        for node in grp.nodes:
            out = node.outputs[0]
            args, dts, depth = [], [], 0
            for acc in fusion.operand_accesses(node):
                name, d, dt = operand(acc)
                args.append(name)
                dts.append(dt)
                depth = max(depth, d)
            expr = scalar_expr(node, args, dts)
            local = f"v{self.num(out)}" if nd == 0 else self.fresh_name(f"t{self.num(out)}")
            if nd == 0:
                self.define_scalar(out, scope)
            code[depth].append(f"{local} = {expr}  # {self.comment_node(node)}")
            if ew.range_limited(expr):  # count arguments beyond TRIG_MAX (redone below)
                if len(args) != 1:
                    raise Tier2Unsupported(f"{node.op}: a range-limited function of "
                                           f"{len(args)} operands has no fix-up")
                if big is None:
                    big = self.fresh_name("big")
                    code[0].insert(0, f"{big} = 0")
                code[depth].append(f"{big} += abs({args[0]}) > TRIG_MAX{_FLAG}")
            inside[id(out)] = local
            depth_of[id(out)] = depth
        for red in grp.reductions:
            if id(red.src) not in inside:
                inside[id(red.src)] = operand(Access(red.src, tuple(range(nd))))[0]
        held: list[tuple[str, Var]] = []  # accumulators in use until the nest is written
        self.region_sums = blocked.RegionSums()
        for red in grp.reductions:
            held += self.emit_reduction(red, grp, scope, inside, code, pre, post)

        # in-place: inputs read only element by element that die here give their buffer
        # (only when element k of the value is element k of the buffer: not through a
        # transposed view, not a row of a stack)
        stores = [v for v in grp.stores if nd > 0]
        for var in grp.reads():
            vid = id(var)
            if vid not in identity_reads or vid in other_reads or last.get(vid) != gi or \
                    big is not None:  # a redo reads the inputs again
                continue
            s = scope.stores[vid]
            if s.slot is not None and scope.pool.owns(s.slot) and s.layout == "C" and \
                    not s.prefix and scope.pool.refs.get(s.slot) == {vid} and \
                    s.slot not in scope.pool.pinned:
                scope.pool.release(s.slot, var)
        for v in stores:
            s = self.store_array(v, scope)
            idx = ", ".join(f"i{d}" for d in range(nd))
            code[nd].append(f"{s.name}[{idx}] = {inside[id(v)]}")

        # write the nest
        title = f"fused region over {list(shape)}: " + \
            ", ".join(n.op for n in grp.nodes) + \
            ("" if not grp.reductions else " -> " + ", ".join(r.node.op for r in grp.reductions))
        self.line(f"# {title}")
        if not blocked.write(self, shape, code, pre, post, self.region_sums, big):
            self.write_nest(shape, code, pre, post)
        if big is not None:
            # sin/cos/tan of arguments beyond TRIG_MAX: the whole nest again with libm
            self.line(f"if {big}:")
            self.write_nest(shape, *([[ew.libm_expr(t) for t in lines if not t.endswith(_FLAG)]
                                      for lines in part] for part in (code, pre, post)),
                            extra=1)
        for slot, tmp in held:  # only now: another value of this region must not share one
            scope.pool.release(slot, tmp)

    def write_nest(self, shape, code, pre, post, extra: int = 0) -> None:
        """The loop nest of a region from its per-depth lines."""
        nd = len(shape)
        for d in range(nd):
            for text in code[d] + pre[d]:
                self.line(text, d + extra)
            self.line(f"for i{d} in range({shape[d]}):", d + extra)
        for text in code[nd] + pre[nd]:
            self.line(text, nd + extra)
        for d in range(nd - 1, -1, -1):
            for text in post[d]:
                self.line(text, d + extra)

    def emit_reduction(self, red: Reduction, grp: Group, scope: Scope, inside: dict,
                       code: list[list[str]], pre: list[list[str]],
                       post: list[list[str]]) -> list[tuple[str, Var]]:
        """Write one reduction of a region; returns the pooled accumulators it holds."""
        nd = len(grp.shape)
        out = red.out
        src_dt = red.src.dtype
        acc_dt = np.dtype(np.float64) if src_dt.kind in "fc" else np.dtype(np.int64)
        val = inside[id(red.src)]
        comment = self.comment_node(red.node)
        kept = [d for d in range(nd) if d not in red.reduced]

        def finish(acc: str) -> str:
            if red.count is not None:
                # mean: eager divides the sum (in the output dtype) by the count
                return cast(f"{cast(acc, acc_dt, out.dtype)} / {red.count}", np.float64,
                            out.dtype) if out.dtype != np.float64 else f"{acc} / {red.count}"
            return cast(acc, acc_dt, out.dtype)

        if nd == 0 or not red.reduced:
            # nothing summed: the value itself (per element); a float plus 0.0, as
            # eager's sum starts from 0 (-0.0 sums to +0.0)
            one = f"({val} + 0.0)" if src_dt.kind in "fc" else val
            if out.shape == ():
                s = self.define_scalar(out, scope)
                code[nd].append(f"{s.name} = {finish(one)}  # {comment}")
            else:
                s = self.store_array(out, scope)
                idx = ", ".join("0" if d is None else f"i{d}" for d in red.out_dims)
                code[nd].append(f"{s.name}[{idx}] = {finish(one)}  # {comment}")
            return []
        suffix = all(r > k for r in red.reduced for k in kept)
        if suffix:
            p = min(red.reduced)
            acc = self.fresh_name(f"acc{self.num(out)}")
            pre[p].append(f"{acc} = {literal(0, acc_dt)}  # {comment}")
            if p == 0:  # one partial per block if the region is blocked
                self.region_sums.partial.append((acc, acc_dt, pre[p][-1]))
            # float sums through radd (reassociable): the loop vectorises
            code[nd].append(f"{acc} = radd({acc}, float({val}))" if acc_dt.kind == "f"
                            else f"{acc} += {val}")
            if out.shape == ():
                s = self.define_scalar(out, scope)
                post[p].append(f"{s.name} = {finish(acc)}")
            else:
                s = self.store_array(out, scope)
                idx = ", ".join("0" if d is None else f"i{d}" for d in red.out_dims)
                post[p].append(f"{s.name}[{idx}] = {finish(acc)}")
            return []
        # reduced dimensions between kept ones: accumulate into a zeroed array (the
        # output itself when it has the accumulator's dtype)
        s = self.store_array(out, scope)
        self.region_sums.shared |= 0 in red.reduced
        direct = out.dtype == acc_dt and red.count is None
        tmp = Var(out.shape, acc_dt)
        acc = s.name if direct else scope.pool.alloc(tmp, f"acc{self.num(out)}")
        pre[0].append(f"{fill(acc, out.shape, '0')}  # {comment}")
        idx = ", ".join("0" if d is None else f"i{d}" for d in red.out_dims)
        code[nd].append(f"{acc}[{idx}] += {val}")
        if not direct:
            src = self.fresh_name(f"accflat{self.num(out)}")
            dst = self.fresh_name(f"flat{self.num(out)}")
            post[0].append(f"{src} = {acc}.reshape({out.size})")
            post[0].append(f"{dst} = {s.name}.reshape({out.size})")
            post[0].append(f"for q in range({out.size}):")
            post[0].append(f"    {dst}[q] = {finish(f'{src}[q]')}")
            return [(acc, tmp)]
        return []

    # -------------------------------------------------------------- opaque nodes
    def emit_node(self, node: Node, scope: Scope, last: dict[int, int], gi: int) -> None:
        """One opaque group: the rule of the op's kind, else objmode (with the reason)."""
        if node.op == LOOP:
            self.emit_loop(node, scope)
            return
        mark = len(self.lines), len(self.globals_lines), len(self.const_args)
        try:
            reason = self.emit_by_kind(node, scope, fusion.kind_of(node))
        except NotNative as exc:  # a rule found it cannot write this node: undo its lines
            del self.lines[mark[0]:], self.globals_lines[mark[1]:], self.const_args[mark[2]:]
            reason = str(exc)
        if reason is not None:
            self.emit_fallback(node, scope, reason)

    def emit_by_kind(self, node: Node, scope: Scope, kind: Kind) -> str | None:
        """Write ``node`` by the rule of its kind; returns None, or why it goes through
        objmode (a rule may raise :class:`NotNative` before it defines any value)."""
        if isinstance(kind, View):
            self.emit_view(node, scope)
        elif isinstance(kind, Permute):
            self.emit_transpose(node, scope, list(kind.perm(node.attrs, node.inputs[0].ndim)))
        elif isinstance(kind, Matmul):
            reason = self.matmul_ok(node, kind)
            if reason is not None:
                return f"tier 2 has no native rule for {reason}"
            self.emit_matmul(node, scope, kind)
        elif isinstance(kind, IndexScatter) and not kind.put and fusion.basic_index_map(
                node.outputs[0].shape, node.attrs["indices"], node.inputs[0].ndim):
            self.emit_index_backward(node, scope)
        elif isinstance(kind, IndexScatter):
            self.emit_index_scatter(node, scope, kind.put)
        elif isinstance(kind, Move):
            self.emit_move(node, scope)
        elif isinstance(kind, Join):
            self.emit_join(node, scope)
        elif isinstance(kind, Opaque) and kind.native is not None:
            self.emit_native(node, scope, kind)
        elif node.op in CUSTOM_KINDS:
            return "a custom Function's Python code"
        elif isinstance(kind, Opaque):
            return kind.why_not_native or "the op declares no native function"
        else:
            return f"tier 2 has no rule for a {kind.label} op here"
        return None

    # -------------------------------------------------------------- loops
    def emit_loop(self, node: Node, scope: Scope) -> None:
        info = LoopInfo.of(node)
        body = info.body
        nc, nx = info.n_carry, info.n_xs
        idx, carry, xs, inv = info.body_inputs()
        inits = node.inputs[:nc]
        stacks = node.inputs[nc:nc + nx]
        invs = node.inputs[nc + nx:]
        finals = node.outputs[:nc]
        ys = node.outputs[nc:]
        j = f"j{self.loop_depth}"
        self.line(f"# {self.comment_node(node)}: {info.count} steps, "
                  f"{nc} carries, {nx} xs, {len(ys)} ys")
        inner = Scope(self, body, scope)
        # carries: a private buffer (or local) per carry, holding the current value
        carry_names: list[str] = []
        for c, init, fin in zip(carry, inits, finals, strict=True):
            si = scope.get(init)
            if fin.shape == ():
                s = self.define_scalar(fin, scope)
                self.line(f"{s.name} = {scalar_of(si)}")
            else:
                s = self.store_array(fin, scope)
                if si.kind == "literal":
                    self.line(fill(s.name, fin.shape, si.name))
                else:
                    self.copy(s.name, "", si, fin.shape)
            carry_names.append(s.name)
            inner.stores[id(c)] = Store(s.name, s.kind, c.shape, c.dtype)
        # ys stacks: rows never written stay zero
        for y, (_, step, length) in zip(ys, info.ys_index, strict=True):
            covered = info.count == length and abs(step) == 1
            self.store_array(y, scope, zero=not covered)
        for v, outer in zip(inv, invs, strict=True):
            so = scope.get(outer)
            inner.stores[id(v)] = dataclasses.replace(so, slot=None, fresh=False)
        self.bind_consts(body, inner)
        self.line(f"for {j} in range({info.count}):")
        self.indent += 1
        self.loop_depth += 1
        if idx is not None:
            s = self.define_scalar(idx, inner)
            start, step = info.index
            self.line(f"{s.name} = {_affine(start, step, j)}")
        for x, stack, (start, step) in zip(xs, stacks, info.xs_index, strict=True):
            self.array_of(stack, scope)  # a constant stack becomes an array
            st = scope.get(stack)
            row = _affine(start, step, j)
            if x.shape == ():
                s = self.define_scalar(x, inner)
                self.line(f"{s.name} = {st.ref([row])}")
            elif st.dim_map is None:  # the row is read in place (no view object per step)
                inner.stores[id(x)] = Store(
                    st.name, "array", x.shape, x.dtype, layout="C" if st.layout == "C" else "A",
                    prefix=st.prefix + (row,), view_expr=f"{st.array}[{row}]")
            else:
                name = self.fresh_name(f"v{self.num(x)}")
                self.line(f"{name} = {st.array}[{row}]")
                inner.stores[id(x)] = Store(name, "array", x.shape, x.dtype,
                                            layout="C" if st.layout == "C" else "A")
        outs = list(body.outputs)
        # ys rows computed in the body are written straight into their stack
        defined = {id(v) for n in body.nodes for v in n.outputs}
        rows: dict[int, str] = {}
        for y, yv, (start, step, _) in zip(ys, outs[nc:], info.ys_index, strict=True):
            if yv.shape and id(yv) in defined and outs.count(yv) == 1:
                rv = self.fresh_name(f"row{self.num(y)}")
                self.line(f"{rv} = {scope.get(y).name}[{_affine(start, step, j)}]")
                inner.dest[id(yv)] = rows[id(yv)] = rv
        self.emit_graph(body, inner, outs)
        inner.dest.clear()
        new = outs[:nc]
        for y, yv, (start, step, _) in zip(ys, outs[nc:], info.ys_index, strict=True):
            sy = inner.get(yv)
            row = _affine(start, step, j)
            if sy.name == rows.get(id(yv)):
                continue
            if sy.kind == "array":
                self.copy(scope.get(y).name, f"{row}, " if yv.shape else row, sy, yv.shape)
            else:
                self.line(f"{scope.get(y).name}[{row}] = {sy.name}")
        self.update_carries(new, carry_names, inner)
        self.loop_depth -= 1
        self.indent -= 1

    def copy(self, dst: str, prefix: str, src: Store, shape: tuple[int, ...]) -> None:
        """``dst[prefix ...] = src`` element by element (Numba compiles an array-valued
        setitem slowly: seconds per statement)."""
        if src.kind == "literal":
            self.line(f"{dst}[{prefix.rstrip(', ')}] = {src.name}" if prefix else
                      fill(dst, shape, src.name))
            return
        value = src.name if src.kind == "scalar" else None
        if not shape:
            self.line(f"{dst}[{prefix.rstrip(', ') or '()'}] = {value or src.ref([])}")
            return
        nd = len(shape)
        for d, n in enumerate(shape):
            self.line(f"for c{d} in range({n}):", d)
        idx = [f"c{d}" for d in range(nd)]
        self.line(f"{dst}[{prefix}{', '.join(idx)}] = {value or src.ref(idx)}", nd)

    def update_carries(self, new: list[Var], carry_names: list[str], inner: Scope) -> None:
        scalars: list[tuple[str, str]] = []
        copies: list[tuple[str, str]] = []
        swaps: list[tuple[str, str]] = []
        swapped: set[str] = set()
        cset = set(carry_names)
        for v, c in zip(new, carry_names, strict=True):
            s = inner.get(v)
            if v.shape == ():
                if s.name != c:
                    scalars.append((c, scalar_of(s)))
                continue
            if s.name == c:
                continue
            if s.kind == "array" and s.fresh and s.slot == s.name and \
                    inner.pool.owns(s.slot) and s.name not in swapped:
                swaps.append((c, s.name))
                swapped.add(s.name)
            else:
                copies.append((c, s))
        # a copy that reads another carry (or a view of one) must read its old value
        staged = []
        for c, s in copies:
            if s.kind != "literal" and self.buffer_of(s.name) in cset:
                tmp = self.fresh_name("old")
                self.line(f"{tmp} = {s.array}.copy()")
                staged.append((c, Store(tmp, "array", s.shape, s.dtype)))
            else:
                staged.append((c, s))
        for c, s in staged:
            self.copy(c, "", s, s.shape)
        for c, src in swaps:
            self.line(f"{c}, {src} = {src}, {c}")
            self.swaps.append((c, src))
        if scalars:  # one parallel assignment (a new value may be another carry's old one)
            self.line(", ".join(c for c, _ in scalars) + " = " + ", ".join(s for _, s in scalars))
