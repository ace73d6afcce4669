"""Large fused regions as blocked loops that a parallel variant runs with ``prange``.

A top-level region of at least :data:`nbgrad.kernels.parallel.MIN_SIZE` elements is
written as a loop over fixed blocks of its first dimension (about
:data:`~nbgrad.kernels.parallel.BLOCK` elements each), the block a loop over sliced
views (so indices stay provably non-negative and the loop vectorises). Sums over the
first dimension keep one partial per block, added in block order after the loop: the
result does not depend on the thread count. The block loop is ``prange``, a plain
``range`` in the serial entry; the parallel entry (``parallel=`` :data:`OPTIONS
<nbgrad.kernels.parallel.OPTIONS>`) runs blocks on Numba's threads.

A region is left as the plain nest (serial in both entries) when anything in it would
be shared between blocks: a value indexed by the first loop variable other than as the
first index of an array, an array sum over the first dimension, or a scalar assigned
per element.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...kernels import parallel
from .store import empty, literal

_FIRST_INDEX = re.compile(r"\b(\w+)\[i0\b(?=\s*[,\]])")
_ASSIGNED_SCALAR = re.compile(r"^\s*(v\d+)\s*=(?!=)")


@dataclass
class RegionSums:
    """What a region's reductions need from blocking (filled by the emitter)."""

    #: ``(accumulator, dtype, its initialising line in pre[0])`` of sums over dimension 0
    partial: list[tuple[str, np.dtype, str]] = field(default_factory=list)
    #: an array accumulated across dimension 0: blocks would share it
    shared: bool = False


class _Shared(Exception):
    """A line of the region would share something between blocks."""


def write(em, shape: Sequence[int], code: list[list[str]], pre: list[list[str]],
          post: list[list[str]], sums: RegionSums, big: str | None) -> bool:
    """Write the region as a blocked loop if it is large and safe; False if not."""
    nd = len(shape)
    size = math.prod(shape)
    if nd == 0 or em.loop_depth or sums.shared or size < max(parallel.MIN_SIZE, 1):
        return False
    inner = size // shape[0]
    rows = max(1, parallel.BLOCK // max(inner, 1))
    nblocks = -(-shape[0] // rows)
    if nblocks < 2:
        return False
    views: dict[str, str] = {}

    def rewrite(text: str) -> str:
        if _ASSIGNED_SCALAR.match(text):
            raise _Shared  # a scalar written per element
        new = _FIRST_INDEX.sub(lambda m: _view(em, views, m.group(1)) + "[i0", text)
        if re.search(r"\bi0\b", _FIRST_INDEX.sub("", new)):
            raise _Shared  # i0 used otherwise: the block's views cannot express it
        return new

    try:
        # depth 0 runs once, outside the blocks
        body = [[]] + [[rewrite(t) for t in code[d] + pre[d]] for d in range(1, nd + 1)]
        tail = [[]] + [[rewrite(t) for t in post[d]] for d in range(1, nd)]
    except _Shared:
        return False
    partial_inits = {line for _, _, line in sums.partial}
    head = [t for t in code[0] if t != f"{big} = 0"] + \
        [t for t in pre[0] if t not in partial_inits]
    b, lo, hi = em.fresh_name("blk"), em.fresh_name("lo"), em.fresh_name("hi")
    counters = [(acc, dt) for acc, dt, _ in sums.partial] + \
        ([(big, np.dtype(np.int64))] if big else [])
    parts = {acc: em.fresh_name(f"{acc}_part") for acc, _ in counters}
    em.blocked += 1
    for text in head:
        em.line(text)
    for acc, dt in counters:
        em.line(f"{parts[acc]} = {empty(nblocks, dt)}")
    em.line(f"# {nblocks} blocks of {rows} rows (prange: in parallel in the parallel entry)")
    em.line(f"for {b} in prange({nblocks}):")
    em.line(f"{lo} = {b} * {rows}", 1)
    # a conditional, not min(): Numba compiles min's overload once per process
    em.line(f"{hi} = {lo} + {rows} if {lo} + {rows} < {shape[0]} else {shape[0]}", 1)
    for name, view in views.items():
        em.line(f"{view} = {name}[{lo}:{hi}]", 1)
    for acc, dt in counters:
        em.line(f"{acc} = {literal(0, dt)}", 1)
    em.line(f"for i0 in range({hi} - {lo}):", 1)
    for d in range(1, nd):
        for text in body[d]:
            em.line(text, d + 1)
        em.line(f"for i{d} in range({shape[d]}):", d + 1)
    for text in body[nd]:
        em.line(text, nd + 1)
    for d in range(nd - 1, 0, -1):
        for text in tail[d]:
            em.line(text, d + 1)
    for acc, _ in counters:
        em.line(f"{parts[acc]}[{b}] = {acc}", 1)
    for acc, dt in counters:  # partials added in block order: no thread-count dependence
        em.line(f"{acc} = {literal(0, dt)}")
        em.line(f"for {b} in range({nblocks}):")
        em.line(f"{acc} += {parts[acc]}[{b}]", 1)
    for text in post[0]:
        em.line(text)
    return True


def _view(em, views: dict[str, str], name: str) -> str:
    if name not in views:
        views[name] = em.fresh_name(f"{name}_b")
    return views[name]
