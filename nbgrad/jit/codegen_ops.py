"""Tier-2 lowering of the nodes that are not fused regions or loops.

Shape ops become views or in-place aliases, transposes NumPy views, matrix products
loops (small) or ``np.dot`` into a preallocated buffer (large), the gradient of a
basic index one loop nest; any other op runs its eager CPU kernel through
``numba.objmode`` (correct, with a Python round trip per call; the emitter lists those
nodes in ``fallbacks``). :class:`OpsEmitter` is a part of
:class:`~nbgrad.jit.codegen_emit.FunctionEmitter`.
"""

from __future__ import annotations

import dataclasses

from . import fusion
from .codegen_store import (
    Scope,
    Store,
    Tier2Unsupported,
    _contiguous,
    _unit_dim_map,
    cast,
    literal,
    objmode_type,
)
from .fusion import Access
from .ir import Node

#: matrix products with at most this many multiply-adds are written as loops
SMALL_MATMUL = 32768
VIEW_OPS = frozenset({"reshape", "view", "flatten", "squeeze", "unsqueeze"})
TRANSPOSES = frozenset({"transpose", "permute"})
MATMULS = frozenset({"matmul", "mm", "dot"})


class OpsEmitter:
    """Opaque-node lowering; relies on the helpers of ``FunctionEmitter``."""

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
                self.line(f"{o.name} = {s.ref(['0'] * len(x.shape))}")
            return
        if s.kind == "scalar":
            slot = self.store_array(out, scope)
            self.line(f"{slot.name}.fill({s.name})")
            return
        unit = _unit_dim_map(x.shape, out.shape)
        if unit is not None:  # only size-1 dimensions change: read the source in place
            if s.dim_map is None:
                dim_map, base_ndim = unit, len(x.shape)
            else:
                dim_map = tuple(None if d is None else s.dim_map[d] for d in unit)
                base_ndim = s.base_ndim
            scope.stores[id(out)] = Store(
                s.name, "array", out.shape, out.dtype, slot=s.slot, layout=s.layout,
                prefix=s.prefix, dim_map=dim_map, base_ndim=base_ndim,
                view_expr=f"{_contiguous(s)}.reshape({out.shape!r})")
            if scope.pool.owns(s.slot):
                scope.pool.add_ref(s.slot, out)
            return
        name = self.fresh_name(f"v{self.num(out)}")
        self.line(f"{name} = {_contiguous(s)}.reshape({out.shape!r})")
        self.view_base[name] = self.buffer_of(s.name)
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
            scope.stores[id(out)] = dataclasses.replace(s, shape=out.shape, fresh=False)
            if s.kind == "array" and scope.pool.owns(s.slot):
                scope.pool.add_ref(s.slot, out)
            return
        name = self.fresh_name(f"v{self.num(out)}")
        self.view_base[name] = self.buffer_of(s.name)
        if nd == 2:
            self.line(f"{name} = {s.array}.T")
            layout = {"C": "F", "F": "C"}.get(s.layout, "A")
        else:
            self.line(f"{name} = np.transpose({s.array}, {tuple(perm)!r})")
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
            self.line(f"{o.name} += {scope.get(a).ref(['q'])} * {scope.get(b).ref(['q'])}", 1)
            return
        acc = self.fresh_name(f"acc{self.num(out)}")
        if m * k * n > SMALL_MATMUL and k > 0:
            A = A if sa.layout in "CF" or sa.kind != "array" else f"np.ascontiguousarray({A})"
            B = B if sb.layout in "CF" or sb.kind != "array" else f"np.ascontiguousarray({B})"
            s = self.store_array(out, scope)
            self.line(f"np.dot({A}, {B}, {s.name})")
            return
        s = self.store_array(out, scope)

        ra = sa if sa.kind == "array" else scope.get(a)
        rb = sb if sb.kind == "array" else scope.get(b)

        def ea(i: str, q: str) -> str:
            return ra.ref([i, q] if a.ndim == 2 else [q])

        def eb(q: str, j: str) -> str:
            return rb.ref([q, j] if b.ndim == 2 else [q])

        def eo(i: str, j: str) -> str:
            idx = ([i] if a.ndim == 2 else []) + ([j] if b.ndim == 2 else [])
            return f"{s.name}[{', '.join(idx)}]"

        if n == 1 and (a.ndim == 1 or sa.layout == "C"):
            # matrix-vector, rows of A contiguous: one dot product per row
            self.line(f"for i in range({m}):")
            self.line(f"{acc} = {zero}", 1)
            self.line(f"for q in range({k}):", 1)
            self.line(f"{acc} += {ea('i', 'q')} * {eb('q', '0')}", 2)
            self.line(f"{eo('i', '0')} = {acc}", 1)
        elif n == 1:
            # matrix-vector, columns of A contiguous (a transposed view): axpy per column
            self.line(f"for i in range({m}):")
            self.line(f"{eo('i', '0')} = {zero}", 1)
            self.line(f"for q in range({k}):")
            self.line(f"{acc} = {eb('q', '0')}", 1)
            self.line(f"for i in range({m}):", 1)
            self.line(f"{eo('i', '0')} += {ea('i', 'q')} * {acc}", 2)
        else:
            # rows of the output accumulate rows of B (the inner loop is contiguous)
            self.line(f"for i in range({m}):")
            self.line(f"for j in range({n}):", 1)
            self.line(f"{eo('i', 'j')} = {zero}", 2)
            self.line(f"for q in range({k}):", 1)
            self.line(f"{acc} = {ea('i', 'q')}", 2)
            self.line(f"for j in range({n}):", 2)
            self.line(f"{eo('i', 'j')} += {acc} * {eb('q', 'j')}", 3)

    def emit_index_backward(self, node: Node, scope: Scope) -> None:
        """``out = zeros(sizes); out[index] = g`` for a basic index, as one loop nest."""
        g, out = node.inputs[0], node.outputs[0]
        dims, offsets = fusion.basic_index_map(out.shape, node.attrs["indices"], g.ndim)
        self.line(f"# {self.comment_node(node)}")
        sg = scope.get(g)
        value = sg.name if sg.kind != "array" else sg.ref([f"i{d}" for d in range(g.ndim)])
        if out.ndim == 0:  # a 0-d value is a scalar local (never a 0-d array: see scalar_of)
            o = self.define_scalar(out, scope)
            self.line(f"{o.name} = {literal(0, out.dtype)}")
            target = o.name
        else:
            s = self.store_array(out, scope, zero=True)
            at = Access(out, dims, offsets)
            target = f"{s.name}[{', '.join(at.index(k) for k in range(out.ndim))}]"
        for d, n in enumerate(g.shape):
            self.line(f"for i{d} in range({n}):", d)
        self.line(f"{target} = {cast(value, g.dtype, out.dtype)}", g.ndim)

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
            # a uniform constant is held as a literal: the kernel needs the whole array
            args.append(self.array_of(v, scope) if s.kind == "literal" else s.array)
        names = [self.fresh_name(f"v{self.num(v)}" + ("_" if v.shape == () else ""))
                 for v in node.outputs]
        types = ", ".join(f"{n}='{objmode_type(v.dtype, max(v.ndim, 1))}'"
                          for n, v in zip(names, node.outputs, strict=True))
        self.line(f"# {self.comment_node(node)}  [eager kernel, through objmode]")
        self.line(f"with objmode({types}):")
        call = f"_fallback({key}" + "".join(f", {a}" for a in args) + ")"
        lhs = ", ".join(names) + ("," if len(names) == 1 else "")
        self.line(f"{lhs} = {call}", 1)
        # Numba needs every annotated output live after the block (e.g. an unused split)
        self.line(f"_outputs_{key} = ({lhs})")
        for n, v in zip(names, node.outputs, strict=True):
            if v.shape == ():
                s = self.define_scalar(v, scope)
                self.line(f"{s.name} = {n}[0]")
            else:
                scope.stores[id(v)] = Store(n, "array", v.shape, v.dtype, fresh=True)
