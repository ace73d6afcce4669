"""Tier-2 code emission: one ``@njit`` Python function for a whole graph.

:class:`FunctionEmitter` walks a graph's fusion plan (:mod:`nbgrad.jit.fusion`) and
writes readable Python for Numba:

- a fused region becomes one loop nest; operands are loaded once per element (at the
  outermost loop depth where their index is known), each node's scalar expression
  from :mod:`nbgrad.kernels.elementwise` is a local, trailing reductions accumulate
  in the same nest, and only values read elsewhere are stored;
- ``loop`` nodes become native ``for`` loops (never unrolled); carries live in
  buffers that are swapped (or copied) at the end of each step, ``ys`` rows are
  written into their stacks;
- small matrix products are loops, large ones ``np.dot`` into a preallocated buffer;
- shape ops are NumPy views;
- any other op calls its eager CPU kernel through ``numba.objmode`` (correct, with a
  Python round trip per call: it is listed in :attr:`FunctionEmitter.fallbacks`).

Buffers are allocated once at the top of the function (also those of loop bodies)
and reused when their value is dead (liveness per scope, views keep their base
alive); an elementwise region may write over an input that dies in it.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..kernels import elementwise as ew
from . import fusion
from .fusion import Access, Group, Reduction
from .ir import LOOP, Graph, LoopInfo, Node, Var

#: matrix products with at most this many multiply-adds are written as loops
SMALL_MATMUL = 32768
#: a graph needing more separate loop nests than this stays in tier 1: Numba's compile
#: time grows faster than linearly with the function's size (an unrolled trace that was
#: not re-rolled into a loop would take minutes)
MAX_GROUPS = 250
VIEW_OPS = frozenset({"reshape", "view", "flatten", "squeeze", "unsqueeze"})
TRANSPOSES = frozenset({"transpose", "permute"})
MATMULS = frozenset({"matmul", "mm", "dot"})


class Tier2Unsupported(NotImplementedError):
    """Tier 2 cannot compile this graph (the graph stays in tier 1)."""


# ------------------------------------------------------------------ literals and types
def np_type(dtype: np.dtype) -> str:
    """``np.float64``-style name of a dtype in generated code."""
    dtype = np.dtype(dtype)
    return "np.bool_" if dtype == np.bool_ else f"np.{dtype.name}"


def literal(value, dtype: np.dtype) -> str:
    """Source text of a scalar constant of ``dtype`` (exact: floats by ``repr``)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "True" if bool(value) else "False"
    if dtype.kind == "f":
        x = float(value)
        if math.isnan(x):
            text = "math.nan"
        elif math.isinf(x):
            text = "math.inf" if x > 0 else "-math.inf"
        else:
            text = repr(x)
        return text if dtype == np.float64 else f"{np_type(dtype)}({text})"
    if dtype.kind in "iu":
        return f"{np_type(dtype)}({int(value)})"
    raise Tier2Unsupported(f"constants of dtype {dtype} are not supported by tier 2")


def uniform_value(arr: np.ndarray):
    """The one value of an array whose elements are all equal, else None."""
    if arr.size == 0:
        return None
    flat = arr.reshape(-1)
    first = flat[0]
    if arr.size == 1 or bool(np.all(flat == first)):
        return first
    return None


def objmode_type(dtype: np.dtype, ndim: int) -> str:
    """Numba's type string of a C-contiguous array, for ``objmode`` annotations."""
    dtype = np.dtype(dtype)
    name = "boolean" if dtype == np.bool_ else dtype.name
    dims = [":"] * (ndim - 1) + ["::1"]
    return f"{name}[{', '.join(dims)}]"


def _subst(expr: str, names: dict[str, str]) -> str:
    """``expr`` with the names in ``names`` replaced by expressions (via the AST)."""
    tree = ast.parse(expr, mode="eval")
    parsed = {k: ast.parse(v, mode="eval").body for k, v in names.items()}

    class Sub(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return parsed.get(node.id, node)

    return ast.unparse(Sub().visit(tree))


def _param_values(node: Node, spec: ew.ScalarOp) -> dict[str, str]:
    vals: dict[str, str] = {}
    for k, name in enumerate(spec.params):
        value = node.attrs[name]
        if node.op == "gelu":
            value = 0.0 if value == "none" else 1.0
        vals[f"p{k}"] = literal(float(value), np.float64)
    return vals


def cast(expr: str, src: np.dtype, dst: np.dtype) -> str:
    """``expr`` (of dtype ``src``) converted as ``ndarray.astype(dst)`` does."""
    if src == dst:
        return expr
    if dst == np.bool_:
        return f"({expr}) != 0"
    return f"{np_type(dst)}({expr})"


def scalar_expr(node: Node, args: list[str], arg_dtypes: list[np.dtype]) -> str:
    """The scalar expression of elementwise ``node`` over operand expressions ``args``."""
    op = node.op
    out = node.outputs[0].dtype
    if op in fusion.SHAPE_ONLY:
        return literal(1 if op == "ones_like" else 0, out)
    if op == "to_dtype":
        return cast(args[0], arg_dtypes[0], out)
    if op in fusion.BROADCASTS or op == "contiguous":
        return cast(args[0], arg_dtypes[0], out)
    if op in ew.UNARY:
        spec = ew.UNARY[op]
        names = {"x": args[0], **_param_values(node, spec)}
    elif op in ew.BINARY:
        spec = ew.BINARY[op]
        names = {"a": args[0], "b": args[1]}
    elif op == "where":
        spec = ew.TERNARY[op]
        names = {"c": args[0], "a": args[1], "b": args[2]}
    elif op == "lerp":
        spec = ew.TERNARY[op]
        names = {"a": args[0], "b": args[1], "c": args[2]}
    else:  # pragma: no cover - fusion only passes the ops above
        raise Tier2Unsupported(f"no scalar expression for {op}")
    text = _subst(spec.expr, names)
    if spec.kind == "bool":
        return text
    if op == "where":
        arg_dtypes = arg_dtypes[1:]
    if out == np.float64 and all(d == np.float64 for d in arg_dtypes):
        return text
    if out == np.bool_:
        return f"bool({text})"
    return f"{np_type(out)}({text})"


# ------------------------------------------------------------------ storage
@dataclass
class Store:
    """Where a value lives in the generated function.

    ``kind``: "scalar" (a local), "literal" (a constant expression, ``shape`` may be
    non-empty for a uniform constant array) or "array". ``slot``: the pool buffer an
    array lives in (views share their base's slot), None for arrays the pool does not
    own (inputs, constants, loop carries seen from a body). ``fresh``: an array this
    call allocated for exactly this value (may be returned without a copy).
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: np.dtype
    slot: str | None = None
    fresh: bool = False
    layout: str = "C"


class Pool:
    """Named buffers of one scope, reused by (shape, dtype) when their values die."""

    def __init__(self, fn: FunctionEmitter, tag: str) -> None:
        self.fn = fn
        self.tag = tag
        self.free: dict[tuple, list[str]] = {}
        self.refs: dict[str, set[int]] = {}
        self.pinned: set[str] = set()
        self.key_of: dict[str, tuple] = {}

    def alloc(self, var: Var, hint: str, zero: bool = False) -> str:
        key = (var.shape, var.dtype.str)
        free = self.free.get(key)
        if free:
            slot = free.pop()
            if zero:
                self.fn.line(f"{slot}.fill(0)")
        else:
            slot = self.fn.fresh_name(hint)
            maker = "np.zeros" if zero else "np.empty"
            self.fn.prologue.append(f"{slot} = {maker}({var.shape!r}, {np_type(var.dtype)})")
            self.key_of[slot] = key
        self.refs[slot] = {id(var)}
        return slot

    def owns(self, slot: str | None) -> bool:
        return slot is not None and slot in self.refs

    def add_ref(self, slot: str, var: Var) -> None:
        self.refs[slot].add(id(var))

    def release(self, slot: str, var: Var) -> None:
        refs = self.refs.get(slot)
        if refs is None or id(var) not in refs:
            return
        refs.discard(id(var))
        if not refs and slot not in self.pinned:
            del self.refs[slot]
            self.free.setdefault(self.key_of[slot], []).append(slot)


class Scope:
    """The values of one graph (the function or a loop body) and its buffer pool."""

    def __init__(self, fn: FunctionEmitter, graph: Graph, parent: Scope | None) -> None:
        self.fn = fn
        self.graph = graph
        self.parent = parent
        self.stores: dict[int, Store] = {}
        self.pool = Pool(fn, "b")

    def get(self, v: Var) -> Store:
        s = self.stores.get(id(v))
        if s is None:
            raise RuntimeError(f"nbgrad.jit tier 2: value {fn_name(v)} has no storage")
        return s


def fn_name(v: Var) -> str:
    return f"{v.dtype.name}{list(v.shape)}"


# ------------------------------------------------------------------ the emitter
class FunctionEmitter:
    """Writes the entry function of one graph (see the module docstring)."""

    def __init__(self, graph: Graph, numbers: dict[int, int], fastmath) -> None:
        self.graph = graph
        self.numbers = numbers
        self.fastmath = fastmath
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
        self.groups_total = 0

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
                params.append(n + "_")
                self.prologue.append(f"{n} = {n}_[()]")
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
        self.line("return (" + ", ".join(rets) + ("," if len(rets) == 1 else "") + ")")
        return params, ["    " + p for p in self.prologue] + self.lines

    def output_expr(self, s: Store, v: Var, returned: set[str], k: int) -> str:
        if s.kind in ("scalar", "literal") and v.shape == ():
            o = self.fresh_name(f"out{k}")
            self.line(f"{o} = np.empty(1, {np_type(v.dtype)})")
            self.line(f"{o}[0] = {s.name}")
            return o
        if s.kind == "literal":
            return f"np.full({v.shape!r}, {s.name}, {np_type(v.dtype)})"
        if s.fresh and s.name not in returned:
            returned.add(s.name)
            return s.name
        return f"{s.name}.copy()"

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
            return s.name
        if s.kind == "literal":
            n = self.fresh_name(f"k{self.num(v)}")
            self.prologue.append(f"{n} = np.full({v.shape!r}, {s.name}, {np_type(v.dtype)})")
            scope.stores[id(v)] = Store(n, "array", v.shape, v.dtype)
            return n
        raise RuntimeError("a 0-d value has no array form")  # pragma: no cover

    # -------------------------------------------------------------- one scope
    def emit_graph(self, g: Graph, scope: Scope, outputs: Sequence[Var]) -> None:
        plan = fusion.plan(g, outputs)
        groups = plan.groups
        self.groups_total += len(groups)
        if self.groups_total > MAX_GROUPS:
            raise Tier2Unsupported(
                f"the graph needs more than {MAX_GROUPS} separate loop nests after fusion "
                f"({len(self.graph.nodes)} top-level nodes); generated code that large "
                "compiles too slowly (write long Python loops with nbgrad.fori_loop or "
                "nbgrad.scan, or let the tracer re-roll them)")
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

    def release(self, v: Var, scope: Scope) -> None:
        s = scope.stores.get(id(v))
        if s is not None and s.slot is not None:
            scope.pool.release(s.slot, v)

    def store_array(self, v: Var, scope: Scope, zero: bool = False) -> Store:
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
        loads: dict[tuple, tuple[str, int]] = {}
        code: list[list[str]] = [[] for _ in range(nd + 1)]
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
            key = (id(v), acc.dims)
            if key in loads:
                name, d = loads[key]
                return name, d, v.dtype
            if acc.is_identity(shape):
                identity_reads.add(id(v))
            else:
                other_reads.add(id(v))
            used = [d for d in acc.dims if d is not None]
            d = (max(used) + 1) if used else 0
            if nd == 0:
                index = "[()]"
            else:
                index = "[" + ", ".join("0" if x is None else f"i{x}" for x in acc.dims) + "]"
            name = self.fresh_name(f"x{self.num(v)}" + ("" if acc.is_identity(shape)
                                                        else f"_{len(loads)}"))
            loads[key] = (name, d)
            code[d].append(f"{name} = {s.name}{index}")
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
            inside[id(out)] = local
            depth_of[id(out)] = depth
        for red in grp.reductions:
            if id(red.src) not in inside:
                inside[id(red.src)] = operand(Access(red.src, tuple(range(nd))))[0]
        pre: list[list[str]] = [[] for _ in range(nd + 1)]
        post: list[list[str]] = [[] for _ in range(nd + 1)]
        for red in grp.reductions:
            self.emit_reduction(red, grp, scope, inside, code, pre, post)

        # in-place: inputs read only element by element that die here give their buffer
        stores = [v for v in grp.stores if nd > 0]
        for var in grp.reads():
            vid = id(var)
            if vid not in identity_reads or vid in other_reads or last.get(vid) != gi:
                continue
            s = scope.stores[vid]
            if s.slot is not None and scope.pool.owns(s.slot) and \
                    scope.pool.refs.get(s.slot) == {vid} and s.slot not in scope.pool.pinned:
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
        for d in range(nd):
            for text in code[d] + pre[d]:
                self.line(text, d)
            self.line(f"for i{d} in range({shape[d]}):", d)
        for text in code[nd] + pre[nd]:
            self.line(text, nd)
        for d in range(nd - 1, -1, -1):
            for text in post[d]:
                self.line(text, d)

    def emit_reduction(self, red: Reduction, grp: Group, scope: Scope, inside: dict,
                       code: list[list[str]], pre: list[list[str]],
                       post: list[list[str]]) -> None:
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
            # nothing summed: the value itself (per element)
            if out.shape == ():
                s = self.define_scalar(out, scope)
                code[nd].append(f"{s.name} = {finish(val)}  # {comment}")
            else:
                s = self.store_array(out, scope)
                idx = ", ".join("0" if d is None else f"i{d}" for d in red.out_dims)
                code[nd].append(f"{s.name}[{idx}] = {finish(val)}  # {comment}")
            return
        suffix = all(r > k for r in red.reduced for k in kept)
        if suffix:
            p = min(red.reduced)
            acc = self.fresh_name(f"acc{self.num(out)}")
            pre[p].append(f"{acc} = {literal(0, acc_dt)}  # {comment}")
            code[nd].append(f"{acc} += {val}")
            if out.shape == ():
                s = self.define_scalar(out, scope)
                post[p].append(f"{s.name} = {finish(acc)}")
            else:
                s = self.store_array(out, scope)
                idx = ", ".join("0" if d is None else f"i{d}" for d in red.out_dims)
                post[p].append(f"{s.name}[{idx}] = {finish(acc)}")
            return
        # reduced dimensions between kept ones: accumulate into a zeroed array (the
        # output itself when it has the accumulator's dtype)
        s = self.store_array(out, scope)
        direct = out.dtype == acc_dt and red.count is None
        tmp = Var(out.shape, acc_dt)
        acc = s.name if direct else scope.pool.alloc(tmp, f"acc{self.num(out)}")
        pre[0].append(f"{acc}.fill(0)  # {comment}")
        idx = ", ".join("0" if d is None else f"i{d}" for d in red.out_dims)
        code[nd].append(f"{acc}[{idx}] += {val}")
        if not direct:
            src = self.fresh_name(f"accflat{self.num(out)}")
            dst = self.fresh_name(f"flat{self.num(out)}")
            post[0].append(f"{src} = {acc}.reshape({out.size})")
            post[0].append(f"{dst} = {s.name}.reshape({out.size})")
            post[0].append(f"for q in range({out.size}):")
            post[0].append(f"    {dst}[q] = {finish(f'{src}[q]')}")
            scope.pool.release(acc, tmp)

    # -------------------------------------------------------------- opaque nodes
    def emit_node(self, node: Node, scope: Scope, last: dict[int, int], gi: int) -> None:
        if node.op == LOOP:
            self.emit_loop(node, scope)
        elif node.op in VIEW_OPS:
            self.emit_view(node, scope)
        elif node.op in TRANSPOSES:
            self.emit_transpose(node, scope)
        elif node.op in MATMULS and self.matmul_ok(node):
            self.emit_matmul(node, scope)
        else:
            self.emit_fallback(node, scope)

    def emit_view(self, node: Node, scope: Scope) -> None:
        x, out = node.inputs[0], node.outputs[0]
        s = scope.get(x)
        self.line(f"# {self.comment_node(node)}")
        if s.kind == "literal":
            scope.stores[id(out)] = Store(s.name, "literal", out.shape, out.dtype)
            return
        if out.shape == ():
            o = self.define_scalar(out, scope)
            if s.kind == "scalar":
                self.line(f"{o.name} = {s.name}")
            else:
                self.line(f"{o.name} = {s.name}[{', '.join(['0'] * len(x.shape))}]")
            return
        if s.kind == "scalar":
            slot = self.store_array(out, scope)
            self.line(f"{slot.name}.fill({s.name})")
            return
        name = self.fresh_name(f"v{self.num(out)}")
        src = s.name if s.layout == "C" else f"np.ascontiguousarray({s.name})"
        self.line(f"{name} = {src}.reshape({out.shape!r})")
        if s.layout == "C":
            scope.stores[id(out)] = Store(name, "array", out.shape, out.dtype, slot=s.slot)
            if scope.pool.owns(s.slot):
                scope.pool.add_ref(s.slot, out)
        else:
            scope.stores[id(out)] = Store(name, "array", out.shape, out.dtype)

    def emit_transpose(self, node: Node, scope: Scope) -> None:
        x, out = node.inputs[0], node.outputs[0]
        s = scope.get(x)
        nd = len(x.shape)
        if node.op == "transpose":
            perm = list(range(nd))
            if nd:
                d0, d1 = node.attrs["dim0"] % nd, node.attrs["dim1"] % nd
                perm[d0], perm[d1] = perm[d1], perm[d0]
        else:
            perm = [d % nd for d in node.attrs["dims"]] if nd else []
        self.line(f"# {self.comment_node(node)}")
        if s.kind != "array" or perm == list(range(nd)):
            scope.stores[id(out)] = Store(s.name, s.kind, out.shape, out.dtype, slot=s.slot,
                                          layout=s.layout)
            if s.kind == "array" and scope.pool.owns(s.slot):
                scope.pool.add_ref(s.slot, out)
            return
        name = self.fresh_name(f"v{self.num(out)}")
        if nd == 2:
            self.line(f"{name} = {s.name}.T")
            layout = {"C": "F", "F": "C"}.get(s.layout, "A")
        else:
            self.line(f"{name} = np.transpose({s.name}, {tuple(perm)!r})")
            layout = "A"
        scope.stores[id(out)] = Store(name, "array", out.shape, out.dtype, slot=s.slot,
                                      layout=layout)
        if scope.pool.owns(s.slot):
            scope.pool.add_ref(s.slot, out)

    # matrix products
    def matmul_ok(self, node: Node) -> bool:
        a, b = node.inputs
        return (a is not None and b is not None and 1 <= a.ndim <= 2 and 1 <= b.ndim <= 2
                and a.dtype.kind == "f" and a.dtype == b.dtype)

    def emit_matmul(self, node: Node, scope: Scope) -> None:
        a, b = node.inputs
        out = node.outputs[0]
        A, B = self.array_of(a, scope), self.array_of(b, scope)
        sa, sb = scope.get(a), scope.get(b)
        m = a.shape[0] if a.ndim == 2 else 1
        k = a.shape[-1]
        n = b.shape[1] if b.ndim == 2 else 1
        self.line(f"# {self.comment_node(node)}")
        zero = literal(0, out.dtype)
        if out.shape == ():
            o = self.define_scalar(out, scope)
            self.line(f"{o.name} = {zero}")
            self.line(f"for q in range({k}):")
            self.line(f"{o.name} += {A}[q] * {B}[q]", 1)
            return
        acc = self.fresh_name(f"acc{self.num(out)}")
        if m * k * n > SMALL_MATMUL and k > 0:
            A = A if sa.layout in "CF" else f"np.ascontiguousarray({A})"
            B = B if sb.layout in "CF" else f"np.ascontiguousarray({B})"
            s = self.store_array(out, scope)
            self.line(f"np.dot({A}, {B}, {s.name})")
            return
        s = self.store_array(out, scope)
        o = s.name
        if a.ndim == 2 and b.ndim == 1:
            self.line(f"for i in range({m}):")
            self.line(f"{acc} = {zero}", 1)
            self.line(f"for q in range({k}):", 1)
            self.line(f"{acc} += {A}[i, q] * {B}[q]", 2)
            self.line(f"{o}[i] = {acc}", 1)
        elif a.ndim == 1:
            self.line(f"{o}.fill(0)")
            self.line(f"for q in range({k}):")
            self.line(f"{acc} = {A}[q]", 1)
            self.line(f"for j in range({n}):", 1)
            self.line(f"{o}[j] += {acc} * {B}[q, j]", 2)
        else:
            self.line(f"for i in range({m}):")
            self.line(f"for j in range({n}):", 1)
            self.line(f"{o}[i, j] = {zero}", 2)
            self.line(f"for q in range({k}):", 1)
            self.line(f"{acc} = {A}[i, q]", 2)
            self.line(f"for j in range({n}):", 2)
            self.line(f"{o}[i, j] += {acc} * {B}[q, j]", 3)

    # fallback through objmode
    def emit_fallback(self, node: Node, scope: Scope) -> None:
        for v in list(node.inputs) + list(node.outputs):
            if v is not None and v.dtype.kind not in "biuf":
                raise Tier2Unsupported(f"{node.op}: dtype {v.dtype} is not supported by tier 2")
        key = len(self.fallbacks)
        self.fallbacks.append((key, node))
        args = []
        for v in node.inputs:
            if v is None:
                continue
            s = scope.get(v)
            args.append(s.name)
        names = [self.fresh_name(f"v{self.num(v)}" + ("_" if v.shape == () else ""))
                 for v in node.outputs]
        types = ", ".join(f"{n}='{objmode_type(v.dtype, max(v.ndim, 1))}'"
                          for n, v in zip(names, node.outputs, strict=True))
        self.line(f"# {self.comment_node(node)}  [eager kernel, through objmode]")
        self.line(f"with objmode({types}):")
        call = f"_fallback({key}" + "".join(f", {a}" for a in args) + ")"
        lhs = ", ".join(names) + ("," if len(names) == 1 else "")
        self.line(f"{lhs} = {call}", 1)
        for n, v in zip(names, node.outputs, strict=True):
            if v.shape == ():
                s = self.define_scalar(v, scope)
                self.line(f"{s.name} = {n}[0]")
            else:
                scope.stores[id(v)] = Store(n, "array", v.shape, v.dtype, fresh=True)

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
                self.line(f"{s.name} = {si.name}")
            else:
                s = self.store_array(fin, scope)
                if si.kind == "literal":
                    self.line(f"{s.name}.fill({si.name})")
                else:
                    self.copy(s.name, "", si.name, fin.shape)
            carry_names.append(s.name)
            inner.stores[id(c)] = Store(s.name, s.kind, c.shape, c.dtype)
        # ys stacks: rows never written stay zero
        for y, (_, step, length) in zip(ys, info.ys_index, strict=True):
            covered = info.count == length and abs(step) == 1
            self.store_array(y, scope, zero=not covered)
        for v, outer in zip(inv, invs, strict=True):
            so = scope.get(outer)
            inner.stores[id(v)] = Store(so.name, so.kind, so.shape, so.dtype, layout=so.layout)
        self.bind_consts(body, inner)
        self.line(f"for {j} in range({info.count}):")
        self.indent += 1
        self.loop_depth += 1
        if idx is not None:
            s = self.define_scalar(idx, inner)
            start, step = info.index
            self.line(f"{s.name} = {_affine(start, step, j)}")
        for x, stack, (start, step) in zip(xs, stacks, info.xs_index, strict=True):
            st = scope.get(stack)
            stack_name = self.array_of(stack, scope)
            row = _affine(start, step, j)
            if x.shape == ():
                s = self.define_scalar(x, inner)
                self.line(f"{s.name} = {stack_name}[{row}]")
            else:
                name = self.fresh_name(f"v{self.num(x)}")
                self.line(f"{name} = {stack_name}[{row}]")
                inner.stores[id(x)] = Store(name, "array", x.shape, x.dtype,
                                            layout="C" if st.layout == "C" else "A")
        outs = list(body.outputs)
        self.emit_graph(body, inner, outs)
        new = outs[:nc]
        for y, yv, (start, step, _) in zip(ys, outs[nc:], info.ys_index, strict=True):
            sy = inner.get(yv)
            row = _affine(start, step, j)
            if sy.kind == "array":
                self.copy(scope.get(y).name, f"{row}, " if yv.shape else row, sy.name, yv.shape)
            else:
                self.line(f"{scope.get(y).name}[{row}] = {sy.name}")
        self.update_carries(new, carry_names, inner)
        self.loop_depth -= 1
        self.indent -= 1

    def copy(self, dst: str, prefix: str, src: str, shape: tuple[int, ...]) -> None:
        """``dst[prefix ...] = src`` element by element (Numba compiles an array-valued
        setitem slowly: seconds per statement)."""
        if not shape:
            self.line(f"{dst}[{prefix.rstrip(', ')}] = {src}[()]" if prefix else
                      f"{dst}[()] = {src}[()]")
            return
        nd = len(shape)
        for d, n in enumerate(shape):
            self.line(f"for c{d} in range({n}):", d)
        idx = ", ".join(f"c{d}" for d in range(nd))
        self.line(f"{dst}[{prefix}{idx}] = {src}[{idx}]", nd)

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
                    scalars.append((c, s.name))
                continue
            if s.name == c:
                continue
            if s.kind == "array" and s.fresh and s.slot == s.name and \
                    inner.pool.owns(s.slot) and s.name not in swapped:
                swaps.append((c, s.name))
                swapped.add(s.name)
            else:
                copies.append((c, s))
        # a copy that reads another carry must read its old value
        staged = []
        for c, s in copies:
            if s.kind != "literal" and s.name in cset:
                tmp = self.fresh_name("old")
                self.line(f"{tmp} = {s.name}.copy()")
                staged.append((c, Store(tmp, "array", s.shape, s.dtype)))
            else:
                staged.append((c, s))
        for c, s in staged:
            if s.kind == "literal":
                self.line(f"{c}.fill({s.name})")
            else:
                self.copy(c, "", s.name, s.shape)
        for c, src in swaps:
            self.line(f"{c}, {src} = {src}, {c}")
        if scalars:
            self.line(", ".join(c for c, _ in scalars) + " = " +
                      ", ".join(s for _, s in scalars) + ("," if len(scalars) == 1 else ""))


def _affine(start: int, step: int, j: str) -> str:
    if step == 0:
        return str(start)
    term = j if step == 1 else (f"-{j}" if step == -1 else f"{step} * {j}")
    if start == 0:
        return term
    if term.startswith("-"):
        return f"{start} - {term[1:]}"
    return f"{start} + {term}"


def _short(value) -> str:
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name
    if isinstance(value, Graph):
        return "<graph>"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
