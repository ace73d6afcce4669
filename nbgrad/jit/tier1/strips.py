"""Tier-1 strips: a chain of elementwise instructions over a large array runs strip by
strip, so its intermediates stay in cache.

Run one instruction at a time, a chain of elementwise ops over N elements moves
every intermediate through memory (W5's step, six ops over 1e5 float64, spends most
of its time there). Wrapped in STRIP ... ENDSTRIP, the interpreter runs the whole
chain over the first :data:`STRIP` elements of its arrays, then over the next
:data:`STRIP`, and so on: what one instruction writes, the next reads from cache. A
value that lives only inside the chain is *scratch*: a block of :data:`STRIP`
elements, rewritten by every strip, instead of N.

Within each strip the instructions run in their order, so the chain computes what it
computed unstripped as long as every instruction touches, in each array, only the
strip's elements at the same positions. :func:`strip_chains` strips a chain only
where that holds: every operand is a whole array of N elements or a scalar, a
storage the chain writes is one array there (one offset and per-iteration stride),
and no scalar operand is written inside the chain. The storages a chain touches
(but scratch) are kept alive through the whole chain, so the pool never places two
of them partly over one another (:func:`nbgrad.jit.tier1.storage._assign`).
"""

from __future__ import annotations

from . import interpreter as I
from .operands import EagerStep, Instr, Loc

#: elements per strip (float64: 64 KiB per array, so a chain's few arrays stay in L2)
STRIP = 8192
#: chains over fewer elements run unstripped
MIN_ELEMENTS = 2 * STRIP

_UNARY = frozenset(I.UNARY_CODE.values()) | {I.OP_UGEN, I.OP_COPY}
_BINARY = frozenset(I.BINARY_CODE.values()) | {I.OP_BGEN}
_BITS = (I.T_A, I.T_B, I.T_C)


def _inputs(ins: Instr) -> list[tuple[Loc, int, bool]] | None:
    """Per input of an elementwise instruction: (location, its ``F_T`` bit, whether it
    is an array); None for an instruction that is no elementwise one."""
    op = ins.op
    if op in _UNARY:
        vector = (True,)
    elif op in _BINARY and ins.m == 1:
        vector = (ins.f != 2, ins.f != 1)
    elif op == I.OP_TGEN:
        vector = (not ins.f & 1, not ins.f & 2, not ins.f & 4)
    elif op == I.OP_FILL:
        vector = ()
    else:
        return None
    locs = (ins.a, ins.b, ins.c)[:len(vector)]
    if ins.o is None or any(loc is None for loc in locs):
        return None
    return list(zip(locs, _BITS, vector, strict=False))


def _operands(ins: Instr) -> list[tuple[Loc, int, bool]]:
    """:func:`_inputs` and the output, for an elementwise instruction."""
    return _inputs(ins) + [(ins.o, I.T_O, True)]


def _length(item: object) -> int:
    """The element count of an elementwise instruction worth stripping; 0 otherwise."""
    if isinstance(item, Instr) and item.n >= MIN_ELEMENTS and _inputs(item) is not None:
        return item.n
    return 0


def _safe(chain: list[Instr]) -> bool:
    """Whether running ``chain`` strip by strip computes what it computes unstripped:
    a storage written in the chain is read and written there as one array only (one
    offset and per-iteration stride), never as a scalar."""
    arrays: dict[int, set[tuple[int, int]]] = {}
    scalars: set[int] = set()
    written: set[int] = set()
    for ins in chain:
        for loc, _, vector in _operands(ins):
            if vector:
                arrays.setdefault(id(loc.st), set()).add((loc.off, loc.stride))
            else:
                scalars.add(id(loc.st))
        written.add(id(ins.o.st))
    return not scalars & written and all(len(arrays[key]) == 1 for key in written)


def _scratch(chain: list[Instr], n: int, inside: range, where: dict[int, list[int]],
             external: set[int]) -> set[int]:
    """Ids of the storages that live only inside ``chain`` (positions ``inside``),
    written before they are read, as one whole array of ``n`` elements."""
    first: dict[int, bool] = {}   # id -> whether its first touch writes it
    for ins in chain:
        reads = [loc for loc, _, _ in _inputs(ins)]
        for loc in reads:
            first.setdefault(id(loc.st), False)
        first.setdefault(id(ins.o.st), True)
        for loc in reads + [ins.o]:
            st = loc.st
            if loc.off or loc.stride or st.size != n or st.fixed or st.slot:
                first[id(st)] = False
    return {key for key, writes in first.items() if writes and key not in external
            and all(p in inside for p in where[key])}


def strip_chains(code: list, external: set[int]) -> list:
    """``code`` with each chain of elementwise instructions over one large length that
    is safe to strip (:func:`_safe`) in a STRIP ... ENDSTRIP block; scratch storages
    shrink to a strip and every other storage of a chain is touched at the block's
    both ends. ``external``: ids of the storages of inputs and outputs."""
    where: dict[int, list[int]] = {}
    for p, item in enumerate(code):
        locs = item.ins + item.outs if isinstance(item, EagerStep) else \
            item.reads + item.writes
        for loc in locs:
            if isinstance(loc, Loc):
                where.setdefault(id(loc.st), []).append(p)
    out: list = []
    p = 0
    while p < len(code):
        n = _length(code[p])
        q = p + 1
        while n and q < len(code) and _length(code[q]) == n:
            q += 1
        chain = code[p:q]
        if len(chain) < 2 or not _safe(chain):
            out.extend(chain)
            p = q
            continue
        scratch = _scratch(chain, n, range(p, q), where, external)
        head = Instr(I.OP_STRIP, n=n, k=STRIP)
        tail = Instr(I.OP_ENDSTRIP)
        head.target, tail.target = tail, head
        start = len(out)
        out.append(head)
        for ins in chain:
            ins.strip = I.T_N
            # a scratch block is small: its own block each keeps the loops vectorised
            ins.inplace = False
            for loc, bit, vector in _operands(ins):
                if vector and id(loc.st) not in scratch:
                    ins.strip |= bit
            out.append(ins)
        out.append(tail)
        for ins in chain:
            for loc in ins.reads + ins.writes:
                if id(loc.st) in scratch:
                    loc.st.size = min(loc.st.size, STRIP)
                else:
                    loc.st.touch(start)
                    loc.st.touch(len(out) - 1)
        p = q
    return out
