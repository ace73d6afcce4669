"""Tier-2 lowering of the nodes that are not fused regions or loops, by op kind.

Views (:class:`~nbgrad.ops.traits.View`) become NumPy views or in-place aliases,
:class:`~nbgrad.ops.traits.Permute` ops NumPy transposes, matrix products
(:class:`~nbgrad.ops.traits.Matmul`: batched, ``b`` transposed, with a bias) loops
(small) or BLAS into a preallocated buffer (large; :mod:`nbgrad.kernels.gemm`), the
gradient of a basic index one loop nest; data movement and native opaque ops are in
:mod:`nbgrad.jit.tier2.moves`. Any other op runs its eager CPU kernel through
``numba.objmode`` (correct, with a Python round trip per call; the emitter lists those
nodes in ``fallbacks`` and the source shows why). :class:`OpsEmitter` is a part of
:class:`~nbgrad.jit.tier2.emit.FunctionEmitter`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...kernels import gemm
from ...ops.registry import REGISTRY
from ...ops.traits import Matmul
from ..trace.ir import Node, Var
from . import fusion
from .fusion import Access
from .store import (
    PERMUTE,
    Scope,
    Store,
    Tier2Unsupported,
    _contiguous,
    _unit_dim_map,
    cast,
    fill,
    literal,
    objmode_type,
)

#: matrix products with at most this many multiply-adds are written as loops; larger
#: ones call BLAS directly (:mod:`nbgrad.kernels.gemm`: no allocation, no checks), which
#: was 1.0 us against the loops' 5-7 us at 32 x 16 x 64 and already faster from about
#: 256 (0.07 us either way at 4 x 8 x 8; on an AVX-512 Xeon, float32 and float64)
SMALL_MATMUL = 256


def matmul_dims(a: tuple[int, ...], b: tuple[int, ...], transpose_b: bool
                ) -> tuple[int, int, int, tuple[int, ...]]:
    """``(m, k, n, batch)`` of ``a @ b`` (``b`` transposed over its last two dimensions
    with ``transpose_b``); NumPy's rules for 1-d operands and batch broadcasting."""
    if transpose_b:
        b = b[:-2] + (b[-1], b[-2])
    m = a[-2] if len(a) >= 2 else 1
    n = b[-1] if len(b) >= 2 else 1
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    return m, a[-1], n, tuple(batch)


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...], transpose_b: bool
                 ) -> tuple[int, ...]:
    """The shape of ``a @ b`` (see :func:`matmul_dims`)."""
    m, _, n, batch = matmul_dims(a, b, transpose_b)
    return batch + ((m,) if len(a) >= 2 else ()) + ((n,) if len(b) >= 2 else ())


def _sub(array: str, idx: list[str]) -> str:
    return f"{array}[{', '.join(idx)}]" if idx else array


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
            self.line(fill(slot.name, out.shape, s.name))
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

    def emit_transpose(self, node: Node, scope: Scope, perm: list[int]) -> None:
        """A :class:`~nbgrad.ops.traits.Permute` node: a NumPy transpose (a view)."""
        x, out = node.inputs[0], node.outputs[0]
        s = scope.get(x)
        nd = len(x.shape)
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
            self.line(f"{name} = {PERMUTE}({s.array}, {tuple(perm)!r})")
            layout = "A"
        scope.stores[id(out)] = Store(name, "array", out.shape, out.dtype, slot=s.slot,
                                      layout=layout)
        if scope.pool.owns(s.slot):
            scope.pool.add_ref(s.slot, out)

    # matrix products
    def matmul_ok(self, node: Node, kind: Matmul) -> str | None:
        """None when tier 2 writes this product natively, else the reason it does not."""
        a, b = node.inputs[0], node.inputs[1]
        bias = self.bias_of(node, kind)
        out = node.outputs[0]
        if a is None or b is None or a.ndim < 1 or b.ndim < (2 if kind.transpose_b else 1):
            return "operands of these ranks"
        if not (a.dtype.kind == "f" and a.dtype == b.dtype == out.dtype) or (
                bias is not None and (bias.dtype != out.dtype or bias.ndim > 1)):
            return f"a product of {a.dtype} and {b.dtype} operands"
        try:
            shape = matmul_shape(a.shape, b.shape, kind.transpose_b)
        except ValueError:
            shape = None
        inner = b.shape[-1] if kind.transpose_b or b.ndim == 1 else b.shape[-2]
        if shape != out.shape or a.shape[-1] != inner:
            return "operands of these shapes"
        return None

    def bias_of(self, node: Node, kind: Matmul) -> Var | None:
        """The bias input of a product (None: none declared, or absent)."""
        if kind.bias is None:
            return None
        k = sum(1 for p in REGISTRY[node.op].params[:kind.bias] if p.is_tensor)
        return node.inputs[k] if k < len(node.inputs) else None

    def bias_ref(self, bias: Var, scope: Scope, j: str) -> str:
        """The bias element added to output column ``j``."""
        s = scope.get(bias)
        return s.name if s.kind != "array" else s.ref([j] if bias.ndim else [])

    def emit_matmul(self, node: Node, scope: Scope, kind: Matmul) -> None:
        a, b = node.inputs[0], node.inputs[1]
        if kind.transpose_b or self.bias_of(node, kind) is not None or a.ndim > 2 or \
                b.ndim > 2:
            self.emit_matmul_general(node, scope, kind)
            return
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
        if k > 0 and m * k * n > SMALL_MATMUL:
            A = A if sa.layout in "CF" or sa.kind != "array" else f"np.ascontiguousarray({A})"
            B = B if sb.layout in "CF" or sb.kind != "array" else f"np.ascontiguousarray({B})"
            s = self.store_array(out, scope)
            self.line(self.product(A, B, s.name, a.ndim == b.ndim == 2))
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

    def product(self, a: str, b: str, out: str, matrices: bool) -> str:
        """A BLAS product into ``out``: :func:`nbgrad.kernels.gemm.gemm` (NumPy's BLAS,
        operands in place) for two matrices, else ``np.dot``."""
        if not matrices:
            return f"np.dot({a}, {b}, {out})"
        fn = gemm.gemm
        key = next((k for k, f in self.natives if f is fn), None)
        if key is None:
            key = f"_native_{len(self.natives)}"
            self.natives.append((key, fn))
        return f"{key}({a}, {b}, {out})"

    def emit_matmul_general(self, node: Node, scope: Scope, kind: Matmul) -> None:
        """A batched product (broadcast batch dimensions), ``b`` used transposed over
        its last two dimensions (``transpose_b``) and an optional bias added to every
        row: loops (small) or ``np.dot`` per batch (large)."""
        a, b = node.inputs[0], node.inputs[1]
        bias = self.bias_of(node, kind)
        out = node.outputs[0]
        m, k, n, batch = matmul_dims(a.shape, b.shape, kind.transpose_b)
        A, B = self.array_of(a, scope), self.array_of(b, scope)
        ra, rb = scope.get(a), scope.get(b)
        self.line(f"# {self.comment_node(node)}")
        s = self.store_array(out, scope) if out.shape else self.define_scalar(out, scope)
        zero = literal(0, out.dtype)
        nb = len(batch)

        def prefix(v: Var) -> list[str]:
            lead = nb - (v.ndim - 2)
            return ["0" if (size == 1 and batch[lead + d] != 1) else f"b{lead + d}"
                    for d, size in enumerate(v.shape[:-2])]

        pa, pb = prefix(a) if a.ndim > 2 else [], prefix(b) if b.ndim > 2 else []
        po = [f"b{d}" for d in range(nb)]

        def ea(i: str, q: str) -> str:
            return ra.ref(pa + ([i] if a.ndim >= 2 else []) + [q])

        def eb(q: str, j: str) -> str:
            if kind.transpose_b:
                return rb.ref(pb + [j, q])
            return rb.ref(pb + ([q, j] if b.ndim >= 2 else [q]))

        def eo(i: str, j: str) -> str:
            if not out.shape:
                return s.name
            return s.ref(po + ([i] if a.ndim >= 2 else []) + ([j] if b.ndim >= 2 else []))

        for d, size in enumerate(batch):
            self.line(f"for b{d} in range({size}):", d)
        t = nb
        if m * k * n > SMALL_MATMUL and k > 0 and a.ndim >= 2 and out.shape:
            # np.dot needs contiguous matrices (a batch of a non-C array is not)
            ok_a, ok_b = ("C" if pa else "CF"), ("C" if pb else "CF")
            A = A if ra.layout in ok_a or ra.kind != "array" else f"np.ascontiguousarray({A})"
            B = B if rb.layout in ok_b or rb.kind != "array" else f"np.ascontiguousarray({B})"
            Bm = _sub(B, pb) + (".T" if kind.transpose_b else "")
            self.line(self.product(_sub(A, pa), Bm, _sub(s.name, po), b.ndim >= 2), t)
            if bias is not None:
                self.line(f"for i in range({m}):", t)
                self.line(f"for j in range({n}):", t + 1)
                self.line(f"{eo('i', 'j')} += {self.bias_ref(bias, scope, 'j')}", t + 2)
            return
        # one dot product per output element (rows of a and of b.T are contiguous when
        # b is transposed; else rows of b accumulate into a row of the output)
        acc = self.fresh_name(f"acc{self.num(out)}")
        row_dot = kind.transpose_b or b.ndim == 1
        if row_dot:
            self.line(f"for i in range({m}):", t)
            self.line(f"for j in range({n}):", t + 1)
            self.line(f"{acc} = {zero}", t + 2)
            self.line(f"for q in range({k}):", t + 2)
            self.line(f"{acc} += {ea('i', 'q')} * {eb('q', 'j')}", t + 3)
            tail = "" if bias is None else f" + {self.bias_ref(bias, scope, 'j')}"
            self.line(f"{eo('i', 'j')} = {acc}{tail}", t + 2)
            return
        self.line(f"for i in range({m}):", t)
        self.line(f"for j in range({n}):", t + 1)
        self.line(f"{eo('i', 'j')} = {zero}", t + 2)
        self.line(f"for q in range({k}):", t + 1)
        self.line(f"{acc} = {ea('i', 'q')}", t + 2)
        self.line(f"for j in range({n}):", t + 2)
        self.line(f"{eo('i', 'j')} += {acc} * {eb('q', 'j')}", t + 3)
        if bias is not None:
            self.line(f"for j in range({n}):", t + 1)
            self.line(f"{eo('i', 'j')} += {self.bias_ref(bias, scope, 'j')}", t + 2)

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
    def emit_fallback(self, node: Node, scope: Scope, reason: str) -> None:
        """Run the node's eager CPU kernel through ``objmode``; ``reason``: why it does not
        run natively (shown in the generated source)."""
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
        names = [self.fresh_name(f"v{self.num(v)}" + ("_out" if v.shape == () else ""))
                 for v in node.outputs]
        types = ", ".join(f"{n}='{objmode_type(v.dtype, max(v.ndim, 1))}'"
                          for n, v in zip(names, node.outputs, strict=True))
        self.line(f"# {self.comment_node(node)}  [through objmode: {reason}]")
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
