"""Tier-1 operands: pool storages, locations, tape instructions, eager steps and the
small shape helpers the lowering and its rules share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...kernels import elementwise as ew
from ...ops.traits import Permute
from ..trace.ir import LOOP, Node, Var


class Unsupported(Exception):
    """Raised by a lowering rule: the node runs as an eager step instead."""


class Storage:
    """A block of the pool; ``offset`` is assigned after emission. A storage with a
    ``slot`` (> 0) is no block of the pool but an array of its own (a large input or
    output, see :func:`nbgrad.jit.tier1.storage.place_outside`), at offset 0."""

    __slots__ = ("size", "offset", "lo", "hi", "fixed", "name", "slot")

    def __init__(self, size: int, fixed: bool = False, name: str = "") -> None:
        self.size = max(int(size), 1)
        self.offset = -1
        self.slot = 0
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
                 "node", "reads", "writes", "inplace", "text", "target", "strip")

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
        self.target = None  # LOOP/ENDLOOP (STRIP/ENDSTRIP) partner
        self.strip = 0  # inside a STRIP block: its F_T bits (see .strips)


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


def _c_strides(shape: Sequence[int]) -> list[int]:
    out = [0] * len(shape)
    step = 1
    for d in range(len(shape) - 1, -1, -1):
        out[d] = step
        step *= shape[d]
    return out


def _swaps_last_two(node: Node, src: Var, kind: Permute) -> bool:
    """The :class:`~nbgrad.ops.traits.Permute` node swaps the last two dimensions only."""
    nd = src.ndim
    if nd < 2:
        return False
    return tuple(kind.perm(node.attrs, nd)) == tuple(range(nd - 2)) + (nd - 1, nd - 2)
