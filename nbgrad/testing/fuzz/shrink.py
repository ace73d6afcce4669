"""Smaller reproducers: cut a failing program after an earlier value, or drop values no
step reads, as long as the same executor still fails on it."""

from __future__ import annotations

from dataclasses import replace

from .differential import Mismatch, check_programs
from .program import Leaf, Program, Step


def _drop(program: Program, j: int) -> Program:
    """``program`` without node ``j`` (which no step reads); leaves keep their values."""
    nodes = []
    k = 0
    for i, node in enumerate(program.nodes):
        if isinstance(node, Leaf):
            if node.key is None:
                node = replace(node, key=k)
            k += 1
        if i == j:
            continue
        if isinstance(node, Step):
            node = replace(node, inputs=tuple(x - (x > j) for x in node.inputs))
        nodes.append(node)
    return Program(tuple(nodes), program.seed, program.dtype)


def _candidates(program: Program) -> list[Program]:
    nodes = program.nodes
    out = [program.output(k) for k in range(len(nodes) - 1)
           if isinstance(nodes[k], Step)]
    read = {i for n in nodes if isinstance(n, Step) for i in n.inputs}
    out += [_drop(program, j) for j in range(len(nodes) - 1) if j not in read]
    return [p for p in out if any(isinstance(n, Step) for n in p.nodes)]


def shrink(mismatch: Mismatch, budget: int = 12) -> Mismatch:
    """A mismatch of the same executor on a smaller program (at most ``budget`` runs);
    ``mismatch`` itself when nothing smaller fails."""
    best = mismatch
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        for candidate in sorted(_candidates(best.program), key=lambda p: len(p.nodes)):
            if tries >= budget:
                break
            tries += 1
            found = [m for m in check_programs([candidate], (best.executor,))
                     if m.executor == best.executor]
            if found:
                best, improved = found[0], True
                break
    if best is not mismatch:
        best.shrunk_from = len(mismatch.program.nodes)
    return best
