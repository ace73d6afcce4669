"""What every batching rule works with: :class:`Call`, one node being batched.

A value is a pair ``(tensor, batched)``: a batched tensor has the batch axis first (size
``B``) followed by the node's *logical* shape (the shape the graph was traced at); an
unbatched one has the logical shape. Rules call public ops, so autograd, an enclosing
``nbgrad.jit`` tracer and an enclosing ``vmap`` trace record ordinary ops.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..jit.trace.ir import Node, node_args
from ..ops import broadcast_to, reshape
from ..ops.dispatch import apply
from ..ops.registry import OpDef
from ..tensor import Tensor

Value = tuple[Tensor, bool]


class BatchingError(NotImplementedError):
    """``vmap`` cannot batch an op (no batching rule, or a case its rule does not cover)."""


class Call:
    """One node being batched: its op, values, flags and logical shapes, with helpers."""

    __slots__ = ("node", "op", "kind", "values", "batched", "size", "in_shapes",
                 "out_shapes")

    def __init__(self, node: Node, op: OpDef | None, values: list, batched: list[bool],
                 size: int) -> None:
        self.node = node
        self.op = op
        self.kind = op.kind if op is not None else None
        self.values: list[Tensor | None] = values
        self.batched = batched
        self.size = size
        self.in_shapes = [None if v is None else v.shape for v in node.inputs]
        self.out_shapes = [v.shape for v in node.outputs]

    @property
    def attrs(self) -> dict:
        return self.node.attrs

    @property
    def name(self) -> str:
        return self.node.op

    def fail(self, why: str) -> BatchingError:
        shapes = ", ".join(str(s) for s in self.in_shapes)
        return BatchingError(f"vmap: op '{self.name}' cannot be batched: {why} (logical input "
                             f"shapes {shapes}; batched inputs {self.batched})")

    def expanded(self, i: int) -> Tensor:
        """Input ``i`` with a batch axis (an unbatched one broadcast to the batch size)."""
        t = self.values[i]
        if self.batched[i]:
            return t
        return broadcast_batch(t, self.size)

    def aligned(self, i: int, rank: int) -> Tensor:
        """Input ``i`` batched at logical rank ``rank`` (size-1 axes after the batch axis)."""
        t = self.values[i]
        shape = self.in_shapes[i]
        if not self.batched[i] or len(shape) >= rank:
            return t
        return reshape(t, (t.shape[0],) + (1,) * (rank - len(shape)) + tuple(shape))

    def lifted(self, i: int, rank: int) -> Tensor:
        """Input ``i`` with a batch axis and logical rank ``rank`` (size-1 axes inserted
        after the batch axis, an unbatched input broadcast over the batch)."""
        t = self.aligned(i, rank)
        if self.batched[i]:
            return t
        shape = (1,) * (rank - len(self.in_shapes[i])) + tuple(self.in_shapes[i])
        return broadcast_to(reshape(t, shape), (self.size,) + shape)

    def run(self, values: Sequence, **attrs) -> list[Tensor]:
        """Apply the node's op to ``values`` (its tensor inputs) with attributes replaced."""
        node = self.node
        if attrs:
            node = Node(node.op, node.inputs, node.outputs, {**node.attrs, **attrs})
        out = apply(self.op, node_args(node, list(values)))
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def full(self, i: int, shape: tuple[int, ...]) -> Tensor:
        """Input ``i`` broadcast to ``(B,) + shape`` (``shape`` of at least its rank)."""
        return broadcast_to(self.lifted(i, len(shape)), (self.size,) + tuple(shape))

    def finish(self, outs: Sequence[Tensor]) -> list[Tensor]:
        """Outputs reshaped to ``(B,) + logical shape`` where they differ."""
        res = []
        for t, shape in zip(outs, self.out_shapes, strict=True):
            want = (self.size,) + tuple(shape)
            res.append(t if tuple(t.shape) == want else reshape(t, want))
        return res


def broadcast_batch(t: Tensor, size: int) -> Tensor:
    """``t`` broadcast to a leading batch axis of ``size`` (a view)."""
    return broadcast_to(t, (size,) + tuple(t.shape))


