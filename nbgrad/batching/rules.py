"""The batching rule of each op kind (:mod:`nbgrad.ops.traits`), keyed by kind class.

Every rule takes a :class:`~nbgrad.batching.core.Call` (at least one input batched) and
returns the node's outputs, each batched (batch axis first). Rules read only the kind's
parameters, the node's attributes and the logical shapes, never op names:

- ``Elementwise``: batched operands get size-1 axes after the batch axis up to the output's
  logical rank; unbatched ones broadcast as they are.
- ``Fill``, ``Cast``: the op runs on the batched input as is.
- ``View``: a reshape to ``(B,) + output shape``; ``Permute``: the permutation shifted by one.
- ``Broadcast``: size-1 axes inserted as the kind says, then a broadcast to the output.
- ``Reduction``: the reduced dims shifted by one.
- ``Matmul``: NumPy matmul with the batch axis as a leading batch dimension (1-D operands
  made matrices first), ``outer`` as a product of columns and rows, ``bias`` added after.
- ``Join``: unbatched members broadcast, the dim shifted by one.
- ``Move``: a gather of the positions the op's kernel gives on an ``arange`` of the
  logical input; ``IndexScatter``: the same positions per batch row.
"""

from __future__ import annotations

import numpy as np

from ..jit.trace.ir import node_args
from ..ops import (
    add,
    broadcast_to,
    index,
    index_backward,
    index_put,
    matmul,
    mean,
    mul,
    permute,
    reshape,
    to_dtype,
    transpose,
)
from ..ops import sum as sum_
from ..ops.indexing import Index, flat_positions
from ..ops.traits import (
    Broadcast,
    Cast,
    Elementwise,
    Fill,
    IndexScatter,
    Join,
    Matmul,
    Move,
    Permute,
    Reduction,
    View,
)
from ..tensor import Tensor
from .core import Call


def norm_dim(d: int, rank: int) -> int:
    """A logical dim (negative ones counted from ``rank``) as the batched dim (``+1``)."""
    return (d + rank if d < 0 else d) + 1


def elementwise(call: Call) -> list[Tensor]:
    """Batched operands aligned to the output's logical rank, then the op as recorded."""
    rank = len(call.out_shapes[0])
    vals = [None if v is None else call.aligned(i, rank) for i, v in enumerate(call.values)]
    return call.run(vals)


def direct(call: Call) -> list[Tensor]:
    """The op applied to the batched input as is (the output follows its shape)."""
    return call.run(call.values)


def view(call: Call) -> list[Tensor]:
    return [reshape(call.values[0], (call.size,) + tuple(call.out_shapes[0]))]


def permute_rule(call: Call) -> list[Tensor]:
    perm = call.kind.perm(call.attrs, len(call.in_shapes[0]))
    return [permute(call.values[0], (0,) + tuple(p + 1 for p in perm))]


def broadcast(call: Call) -> list[Tensor]:
    out = tuple(call.out_shapes[0])
    shape = list(call.in_shapes[0])
    fn = call.kind.unsqueeze
    for d in sorted(fn(call.attrs, len(out)) or ()) if fn is not None else ():
        shape.insert(d, 1)
    shape = [1] * (len(out) - len(shape)) + shape
    x = reshape(call.values[0], (call.size, *shape))
    return [broadcast_to(x, (call.size,) + out)]


def reduction(call: Call) -> list[Tensor]:
    x = call.values[0]
    shape = tuple(call.in_shapes[0])
    # a 0-d input reduced over "dim 0" (allowed, as NumPy and PyTorch) reduces nothing
    dims = call.kind.dims(call.attrs, shape) if shape else ()
    dtype = call.node.outputs[0].dtype
    if x.dtype != dtype:
        x = to_dtype(x, dtype)
    if dims:
        dims = tuple(d + 1 for d in dims)
        x = mean(x, dims, True) if call.kind.mean else sum_(x, dims, True)
    return call.finish([x])


def _as_matrix(call: Call, i: int, rank: int) -> tuple[Tensor, tuple[int, ...]]:
    """Operand ``i`` of a matmul as a (batched) matrix stack of logical rank ``rank``."""
    t, shape, first = call.values[i], tuple(call.in_shapes[i]), i == 0
    if len(shape) == 1:
        shape = (1, shape[0]) if first else (shape[0], 1)
    if call.batched[i]:
        shape = (1,) * (rank - len(shape)) + shape
        return reshape(t, (call.size,) + shape), shape
    return (t if t.ndim == len(shape) else reshape(t, shape)), shape


def _folded_matmul(call: Call) -> Tensor | None:
    """One 2-D product where only one operand is batched and the batch folds into its
    rows: ``a`` batched against a matrix or vector ``b`` (``(B*...*M, K) @ b``), or a
    batched vector (or one-column matrix) ``b`` against ``a`` (``b (B, K) @ a.T``).
    Its output has the batched output's elements in order (:meth:`Call.finish`
    reshapes it); None where neither applies. A Jacobian or Hessian through ``A @ x``
    then runs one matrix product (BLAS in both tiers), not ``B`` matrix-vector ones."""
    (a, b), (ba, bb) = call.values[:2], call.batched[:2]
    a_shape, b_shape = tuple(call.in_shapes[0]), tuple(call.in_shapes[1])
    if ba == bb or not a_shape or not b_shape or not a_shape[-1]:
        return None
    k = a_shape[-1]
    if ba and len(b_shape) <= 2:
        return matmul(reshape(a, (-1, k)), b)
    if bb and (len(b_shape) == 1 or (len(b_shape) == 2 and b_shape[1] == 1)):
        a2 = a if len(a_shape) == 1 else transpose(reshape(a, (-1, k)), 0, 1)
        return matmul(reshape(b, (call.size, k)), a2)
    return None


def matmul_rule(call: Call) -> list[Tensor]:
    kind: Matmul = call.kind
    a_shape, b_shape = tuple(call.in_shapes[0]), tuple(call.in_shapes[1])
    if kind.outer:
        a = reshape(call.values[0], ((call.size,) if call.batched[0] else ()) + a_shape + (1,))
        b = reshape(call.values[1], ((call.size,) if call.batched[1] else ()) + (1,) + b_shape)
        out = mul(a, b)
    else:
        values = list(call.values)
        if kind.transpose_b and len(b_shape) >= 2:
            values[1] = transpose(values[1], -1, -2)
            call = Call(call.node, call.op, values, call.batched, call.size)
            call.in_shapes[1] = b_shape[:-2] + (b_shape[-1], b_shape[-2])
        out = _folded_matmul(call)
        if out is None:
            rank = max(max(len(s), 2) for s in call.in_shapes[:2])
            a, _ = _as_matrix(call, 0, rank)
            b, _ = _as_matrix(call, 1, rank)
            out = matmul(a, b)
    if not (call.batched[0] or call.batched[1]):  # only the bias is batched
        out = broadcast_to(out, (call.size,) + tuple(out.shape))
    out = call.finish([out])[0]
    if kind.bias is not None and call.values[kind.bias] is not None:
        out = add(out, call.aligned(kind.bias, len(call.out_shapes[0])))
    return [out]


def join(call: Call) -> list[Tensor]:
    dim = call.attrs["dim"]
    vals = [call.expanded(i) for i in range(len(call.values))]
    out = call.run(vals, dim=norm_dim(dim, len(call.out_shapes[0])))
    return out


def _positions(call: Call) -> list[np.ndarray]:
    """Where each output element of a Move op comes from (flat logical positions)."""
    shape = tuple(call.in_shapes[0])
    src = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    with np.errstate(all="ignore"):
        out = call.op.kernel_for("cpu")(*node_args(call.node, [src]))
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [np.asarray(o, dtype=np.int64) for o in outs]


def move(call: Call) -> list[Tensor]:
    flat = reshape(call.values[0], (call.size, -1))
    outs = []
    for pos, shape in zip(_positions(call), call.out_shapes, strict=True):
        got = index(flat, Index((slice(None), pos.reshape(-1))))
        outs.append(reshape(got, (call.size,) + tuple(shape)))
    return outs


def index_scatter(call: Call) -> list[Tensor]:
    kind: IndexScatter = call.kind
    idx = call.attrs["indices"]
    out_shape = tuple(call.out_shapes[0])
    pos = flat_positions(out_shape, idx)
    at = Index((slice(None), pos.reshape(-1)))
    src_i = 1 if kind.put else 0
    if call.batched[src_i]:
        src = broadcast_to(call.aligned(src_i, pos.ndim), (call.size,) + pos.shape)
    else:
        src = broadcast_to(call.values[src_i], (call.size,) + pos.shape)
    src = reshape(src, (call.size, pos.size))
    n = int(np.prod(out_shape))
    if kind.put:
        base = reshape(call.expanded(0), (call.size, n))
        out = index_put(base, at, src, call.attrs["accumulate"])
    else:
        out = index_backward(src, (call.size, n), at)
    return [reshape(out, (call.size,) + out_shape)]


#: kind class -> rule; Opaque ops have per-op rules (:mod:`nbgrad.batching.opaque`)
KIND_RULES = {
    Elementwise: elementwise,
    Fill: direct,
    Cast: direct,
    View: view,
    Permute: permute_rule,
    Broadcast: broadcast,
    Reduction: reduction,
    Matmul: matmul_rule,
    Join: join,
    Move: move,
    IndexScatter: index_scatter,
}
