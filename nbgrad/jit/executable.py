"""The executable base: what every tier's compiled form of a graph is.

An :class:`Executable` maps input arrays to fresh output arrays. The base replays the
graph with eager ops (:mod:`nbgrad.jit.reference`); tier 1 (:mod:`nbgrad.jit.tier1.tape`),
tier 2 (:mod:`nbgrad.jit.tier2.codegen`) and the CUDA tier subclass it. Which one runs a
graph is :mod:`nbgrad.jit.program`'s choice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..backends import is_cuda_array
from .reference import replay_arrays
from .trace.ir import Graph, format_graph


class Executable:
    """Runs one graph: ``run(arrays) -> arrays`` (outputs never alias the inputs)."""

    tier = "reference"
    #: how many native calls one ``run`` makes (0 for the reference executor)
    native_calls = 0

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        outs = replay_arrays(self.graph, arrays)
        ins = {id(a) for a in arrays}
        return [(o.copy() if is_cuda_array(o) else np.array(o, copy=True))
                if id(o) in ins or not o.flags.writeable or o.base is not None else o
                for o in outs]

    def source(self) -> str:
        return "# reference executor: the graph replayed with eager ops\n" + \
            format_graph(self.graph)
