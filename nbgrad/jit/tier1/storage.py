"""Tier-1 storage assignment: large inputs and outputs get arrays of their own
(slots), live intervals of the pool storages become offsets (freed blocks are
reused), and the pool's dtype is chosen from the graph."""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from ..trace.ir import Graph
from . import interpreter as I
from .operands import EagerStep, Instr, Loc, Storage


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
    events = sorted((st for st in storages if not st.fixed and not st.slot
                     and st.lo is not None), key=lambda s: (s.lo, s.hi))
    active: list[Storage] = []
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
        if st.offset < 0 or st.slot:  # never touched, or an array of its own
            st.offset = 0
    return max(top, 1)


#: inputs and outputs of at least this many elements live outside the pool (smaller
#: ones are copied in and out: a copy of a few thousand elements costs less than
#: taking an array's address)
OUTSIDE_MIN = 8192


def place_outside(code: list, graph: Graph, in_locs: list, out_locs: list,
                  dtype: np.dtype, minimum: int | None = None) -> tuple[list[int], list[int]]:
    """Gives the storages of large inputs and outputs a slot (numbered from 1) instead
    of a block of the pool; returns the slot of each input and output (0: none).

    An input's slot is the caller's array, read in place: only for an input of the
    pool's dtype that no instruction or eager step writes. An output's slot is a fresh
    array per call, handed to the caller without a copy: only for an output of the
    pool's dtype that fills a storage of its own (no input's, constant's or other
    output's storage; the tape may compute other values in it before). Every other
    input and output is copied into or out of the pool."""
    minimum = max(OUTSIDE_MIN if minimum is None else minimum, 1)
    written: set[int] = set()
    for item in code:
        for loc in (item.outs if isinstance(item, EagerStep) else item.writes):
            if isinstance(loc, Loc):
                written.add(id(loc.st))
    inputs = {id(loc.st) for loc in in_locs if isinstance(loc, Loc)}
    count = 0
    in_slots = []
    for v, loc in zip(graph.inputs, in_locs, strict=True):
        slot = 0
        if isinstance(loc, Loc) and v.dtype == dtype and v.size >= minimum and \
                id(loc.st) not in written and not loc.st.slot and loc.off == 0:
            count += 1
            slot = loc.st.slot = count
        in_slots.append(slot)
    out_slots = []
    for v, loc in zip(graph.outputs, out_locs, strict=True):
        slot = 0
        if isinstance(loc, Loc) and v.dtype == dtype and v.size >= minimum and \
                id(loc.st) not in inputs and not loc.st.slot and not loc.st.fixed and \
                loc.off == 0 and loc.stride == 0 and loc.st.size == v.size:
            count += 1
            slot = loc.st.slot = count
        out_slots.append(slot)
    return in_slots, out_slots


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
    i = bisect.bisect_left(free, [off, 0])
    free.insert(i, [off, size])
    if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
        free[i][1] += free[i + 1][1]
        free.pop(i + 1)
    if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
        free[i - 1][1] += free[i][1]
        free.pop(i)


def pool_dtype(graph: Graph) -> np.dtype:
    counts = {np.dtype(np.float64): 0, np.dtype(np.float32): 0}
    for v in list(graph.inputs) + [o for n in graph.walk() for o in n.outputs]:
        if v.dtype in counts:
            counts[v.dtype] += v.size + 1
    return np.dtype(np.float32) if counts[np.dtype(np.float32)] > counts[
        np.dtype(np.float64)] else np.dtype(np.float64)
