"""Tier-1 lowering rules, one per op kind (:mod:`nbgrad.ops.traits`): each emits
interpreter instructions for one node through the
:class:`~nbgrad.jit.tier1.lowering.Lowering`, reading the kind's parameters (never the
op's name), or raises :class:`~nbgrad.jit.tier1.operands.Unsupported` (the node then
runs as an eager step)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ...kernels import elementwise as ew
from ...ops.registry import REGISTRY
from ...ops.traits import (
    Broadcast,
    Cast,
    Elementwise,
    Fill,
    IndexScatter,
    Join,
    Kind,
    Matmul,
    Move,
    Permute,
    Reduction,
    View,
)
from ..trace.ir import Node, Var, node_args
from . import interpreter as I
from .operands import (
    Instr,
    Loc,
    Unsupported,
    _bstrides,
    _c_strides,
    _collapse,
    _size,
    _strided_pattern,
)

if TYPE_CHECKING:
    from .lowering import Lowering

#: the conversion to bool (a :class:`Cast` to bool) and the addition of a bias
_TO_BOOL = ew.CASTS["to_bool"]
_ADD = ew.BINARY["add"]
#: the names of the operands of the interpreter's scalar functions, per operand count
_OPERANDS = {1: ("x",), 2: ("a", "b"), 3: ("a", "b", "c")}


def _param_values(node: Node, kind: Elementwise) -> tuple[float, float]:
    """``p0, p1`` of a unary node: its attributes named by the scalar op's ``params``
    (through the kind's ``encode`` when declared)."""
    values = [node.attrs[p] for p in kind.spec.params]
    if any(v is None for v in values):
        raise Unsupported(f"{node.op} with an absent parameter")
    if kind.encode is not None:
        values = list(kind.encode(*values))
    if len(values) > 2:
        raise Unsupported(f"{node.op}: more than two parameters")
    floats = [float(v) for v in values] + [0.0] * (2 - len(values))
    return floats[0], floats[1]


def _elementwise(lw: Lowering, node: Node, kind: Elementwise) -> None:
    """The scalar op ``kind.spec`` over the node's 1, 2 or 3 tensor operands."""
    spec = kind.spec
    count = len(node.inputs)
    if I.SCALAR_OPS.get(count, {}).get(spec.name) != spec:  # cold, or not the tape's
        raise Unsupported(f"{node.op}: the interpreter has no loop for it")
    if any(v is None for v in node.inputs) or len(node.outputs) != 1:
        raise Unsupported(node.op)
    y = node.outputs[0]
    if spec.kind == "bool":
        if y.dtype != np.bool_:
            raise Unsupported(node.op)
    elif y.dtype != lw.dtype or any(v.dtype not in (lw.dtype, np.bool_)
                                    for v in node.inputs):
        raise Unsupported(node.op)
    operands = dict(zip(kind.operand_names(count), node.inputs, strict=True))
    if set(operands) != set(_OPERANDS[count]):
        raise Unsupported(f"{node.op}: operands named {sorted(operands)}")
    if count == 1:
        _unary(lw, node, spec, operands["x"], kind)
    elif spec.params:
        raise Unsupported(f"{node.op}: parameters of a {count}-operand op")
    elif count == 2:
        _binary(lw, node, spec, operands["a"], operands["b"])
    else:
        _ternary(lw, node, spec, operands["a"], operands["b"], operands["c"])


def _unary(lw: Lowering, node: Node, spec: ew.ScalarOp, x: Var, kind: Elementwise) -> None:
    y = node.outputs[0]
    p0, p1 = _param_values(node, kind)
    a = lw.get(x)
    o = lw.out(y)
    if spec.name in I.UNARY_CODE:
        ins = Instr(I.UNARY_CODE[spec.name], o=o, a=a, n=y.size, fp=(p0, p1))
    else:
        ins = Instr(I.OP_UGEN, o=o, a=a, n=y.size, k=I.UNARY_SUB[spec.name], fp=(p0, p1),
                    text=node.op)
    ins.inplace = spec.name not in I.HOT_APART
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


def _binary(lw: Lowering, node: Node, spec: ew.ScalarOp, a: Var, b: Var) -> None:
    y = node.outputs[0]
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
    code = I.BINARY_CODE.get(spec.name, I.OP_BGEN)
    o = lw.out(y)
    ins = Instr(code, o=o, a=locs[0], b=locs[1], n=n, m=m, f=mode, g=outer[0], h=outer[1],
                k=I.BINARY_SUB[spec.name], text=node.op)
    ins.inplace = m == 1 and mode == 0
    lw.emit(ins)


def _ternary(lw: Lowering, node: Node, spec: ew.ScalarOp, a: Var, b: Var, c: Var) -> None:
    """``tscalar(c, a, b)``: operands by their names in the scalar expression."""
    y = node.outputs[0]
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
                k=I.TERNARY_SUB[spec.name], text=node.op)
    ins.inplace = flags == 0
    lw.emit(ins)


def _to_dtype(lw: Lowering, node: Node, kind: Cast) -> None:
    x = node.inputs[0]
    y = node.outputs[0]
    loc = lw.get(x)
    if y.dtype == lw.dtype and (x.dtype == np.bool_ or x.dtype == lw.dtype
                                 or x.dtype.kind in "iu"):
        lw.bind(y, loc)  # the pool already holds the value as a float
        return
    if y.dtype == np.bool_:
        o = lw.out(y)
        lw.emit(Instr(I.OP_UGEN, o=o, a=loc, n=y.size, k=I.UNARY_SUB[_TO_BOOL.name],
                      fp=(0, 0), text=_TO_BOOL.name))
        return
    raise Unsupported(node.op)


def _fill(lw: Lowering, node: Node, kind: Fill) -> None:
    y = node.outputs[0]
    lw.emit(Instr(I.OP_FILL, o=lw.out(y), n=y.size, fp=(kind.value,)))


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


def _reduction(lw: Lowering, node: Node, kind: Reduction) -> None:
    """A sum (or mean) over ``kind.dims``; over no dims the output is the input (a float
    input plus 0.0, as eager's sum starts from 0: ``-0.0`` sums to ``+0.0``)."""
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise Unsupported(node.op)
    x = node.inputs[0]
    y = node.outputs[0]
    dims = tuple(kind.dims(node.attrs, x.shape))
    if not dims and y.dtype == x.dtype and y.size == x.size and x.dtype.kind not in "fc":
        lw.bind(y, lw.get(x))  # (a float is summed below, one element at a time)
        return
    if x.dtype != lw.dtype or y.dtype != lw.dtype:  # e.g. sum's dtype=
        raise Unsupported(node.op)
    loc = lw.get(x)
    perm, A, R, B = _reduce_dims(x.shape, dims)
    if perm is not None:
        src = _c_strides(x.shape)
        loc = lw.strided_copy(loc, [x.shape[d] for d in perm], [src[d] for d in perm])
    o = lw.out(y)
    if R == 0:
        lw.emit(Instr(I.OP_FILL, o=o, n=y.size, fp=(np.nan if kind.mean else 0.0,)))
        return
    lw.emit(Instr(I.OP_SUM, o=o, a=loc, n=A, m=R, k=B, f=1 if kind.mean else 0,
                  text="mean" if kind.mean else "sum"))


def _positions_of(node: Node, x: Var) -> list[np.ndarray]:
    """Run the op's kernel on the positions of ``x``: output -> source positions."""
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


def _move(lw: Lowering, node: Node, kind: Kind) -> None:
    """:class:`Move`, :class:`Permute`, :class:`Broadcast`: each output element is one
    input element, found by running the op's kernel on the input's positions."""
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


def _view(lw: Lowering, node: Node, kind: View) -> None:
    """The input's elements in the same order: an alias."""
    x = node.inputs[0]
    if len(node.inputs) != 1 or len(node.outputs) != 1 or x is None:
        raise Unsupported(node.op)
    y = node.outputs[0]
    if y.size != x.size or y.dtype != x.dtype:
        raise Unsupported(node.op)
    lw.bind(y, lw.get(x))


def _join(lw: Lowering, node: Node, kind: Join) -> None:
    """``cat`` and ``stack``: each input is scattered into the output."""
    y = node.outputs[0]
    ins = [v for v in node.inputs]
    if any(v is None or v.dtype != y.dtype for v in ins):
        raise Unsupported(node.op)
    op = REGISTRY[node.op]
    base = 0
    arrays = []
    for v in ins:
        arrays.append(np.arange(base, base + v.size, dtype=np.int64).reshape(v.shape))
        base += v.size
    out = np.asarray(op.kernel_for("cpu")(*node_args(node, arrays))).reshape(-1)
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


def _index_positions(shape: tuple[int, ...], node: Node) -> np.ndarray:
    """The flat positions ``arange(shape)[indices]`` the index selects."""
    pos = np.arange(_size(shape), dtype=np.int64).reshape(shape)
    return np.asarray(pos[node.attrs["indices"]])


def _index_scatter(lw: Lowering, node: Node, kind: IndexScatter) -> None:
    if len(node.inputs) != (2 if kind.put else 1) or None in node.inputs:
        raise Unsupported(node.op)
    if kind.put:
        _index_put(lw, node)
    else:
        _index_backward(lw, node)


def _index_backward(lw: Lowering, node: Node) -> None:
    g = node.inputs[0]
    y = node.outputs[0]
    if g.dtype != lw.dtype:
        raise Unsupported(node.op)
    sel = _index_positions(tuple(node.attrs["sizes"]), node)
    src = lw.get(g)
    if sel.shape != g.shape:
        src = lw.strided_copy(src, sel.shape, _bstrides(g.shape, sel.shape))
    o = lw.out(y)
    lw.emit(Instr(I.OP_SCATTER_ADD, o=o, a=src, n=sel.size, m=y.size, f=1,
                  ia=sel.reshape(-1).astype(np.int64)))


def _index_put(lw: Lowering, node: Node) -> None:
    x, values = node.inputs
    y = node.outputs[0]
    if x.dtype != lw.dtype or values.dtype != lw.dtype:
        raise Unsupported(node.op)
    sel = _index_positions(x.shape, node)
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


# ------------------------------------------------------------------ matrix products
def _bias_input(node: Node, kind: Matmul) -> int | None:
    """The position in ``node.inputs`` of the declared bias argument (None: none)."""
    if kind.bias is None:
        return None
    return sum(1 for p in REGISTRY[node.op].params[:kind.bias] if p.is_tensor)


def _matmul_shapes(A: Var, B: Var, kind: Matmul
                   ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The operands as (batch..., rows, cols) matrices: ``A`` (n, k), ``B`` (k, m)."""
    if kind.outer:
        if A.ndim != 1 or B.ndim != 1:
            raise Unsupported("outer of operands that are not vectors")
        return (A.shape[0], 1), (1, B.shape[0])
    if A.ndim == 0 or B.ndim < (2 if kind.transpose_b else 1):
        raise Unsupported("operands of these ranks")
    a_shape = (1,) + A.shape if A.ndim == 1 else A.shape
    if kind.transpose_b:
        b_shape = B.shape[:-2] + (B.shape[-1], B.shape[-2])
    else:
        b_shape = B.shape + (1,) if B.ndim == 1 else B.shape
    return a_shape, b_shape


def _matmul(lw: Lowering, node: Node, kind: Matmul) -> None:
    """``C = A @ B`` (``B`` used transposed for ``transpose_b``, the ``outer`` product),
    plus the bias on every row of ``C``."""
    if len(node.inputs) < 2 or len(node.outputs) != 1:
        raise Unsupported(node.op)
    A, B = node.inputs[0], node.inputs[1]
    bias_at = _bias_input(node, kind)
    bias = node.inputs[bias_at] if bias_at is not None and bias_at < len(node.inputs) \
        else None
    if any(v is not None for k, v in enumerate(node.inputs) if k > 1 and k != bias_at):
        raise Unsupported(node.op)
    C = node.outputs[0]
    if A is None or B is None or not (A.dtype == B.dtype == C.dtype == lw.dtype):
        raise Unsupported(node.op)
    a_shape, b_shape = _matmul_shapes(A, B, kind)
    n, k = a_shape[-2], a_shape[-1]
    m = b_shape[-1]
    if b_shape[-2] != k:
        raise Unsupported("operands of these shapes")
    try:
        batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    except ValueError:
        raise Unsupported("operands of these shapes") from None
    nb = _size(batch)
    if C.size != nb * n * m:
        raise Unsupported("operands of these shapes")
    if bias is not None and (bias.dtype != lw.dtype or bias.shape != (m,)):
        raise Unsupported(f"{node.op} with a bias of shape {bias.shape}")

    def operand(v: Var, shape: tuple[int, ...], rows: int, cols: int, swapped: bool):
        """(loc, batch stride, stride over rows, stride over cols) of the (rows, cols)
        matrices of ``v``; ``swapped``: ``v`` holds them transposed (row-major)."""
        tr = lw.transposed.get(id(v))
        if tr is not None and id(v) not in lw.loc:
            loc = tr[1]  # v is the lazy transpose of the value at tr[1]
            swapped = not swapped
        else:
            loc = lw.get(v)
        rs, cs = (1, rows) if swapped else (cols, 1)
        vb = shape[:-2]
        if _size(vb) == nb:
            return loc, (rows * cols if nb > 1 else 0), rs, cs
        if _size(vb) == 1:
            return loc, 0, rs, cs
        # broadcast batch dims: materialise the operand to the full batch
        held = _c_strides(vb + ((cols, rows) if swapped else (rows, cols)))
        lead = len(batch) - len(vb)
        strides = [0 if d < lead or vb[d - lead] == 1 else held[d - lead]
                   for d in range(len(batch))] + [rs, cs]
        new = lw.strided_copy(loc, tuple(batch) + (rows, cols), strides)
        return new, rows * cols, cols, 1

    a_loc, sa, ai, at = operand(A, a_shape, n, k, False)
    b_loc, sb, bt, bj = operand(B, b_shape, k, m, kind.transpose_b)
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
    else:
        lw.emit(Instr(I.OP_MATMUL, o=o, a=a_loc, b=b_loc, n=n, m=m, k=k, g=nb,
                      f=0 if loops else 1, ia=np.array([sa, sb, ai, at, bt, bj], np.int64),
                      text=node.op))
    if bias is not None:  # C[r, :] += bias for every row r
        rows = C.size // m
        lw.emit(Instr(I.BINARY_CODE.get(_ADD.name, I.OP_BGEN), o=o, a=o, b=lw.get(bias),
                      n=m, m=rows, g=m, h=0, k=I.BINARY_SUB[_ADD.name], text="bias"))


RULES: dict[type[Kind], Callable[..., None]] = {
    Elementwise: _elementwise,
    Fill: _fill,
    Cast: _to_dtype,
    View: _view,
    Permute: _move,
    Broadcast: _move,
    Move: _move,
    Reduction: _reduction,
    Matmul: _matmul,
    Join: _join,
    IndexScatter: _index_scatter,
}
"""The rule of each op kind (:mod:`nbgrad.ops.traits`): ``rule(lowering, node, kind)``.
An :class:`~nbgrad.ops.traits.Opaque` op has none: it runs as an eager step."""
