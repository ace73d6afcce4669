"""Executables: what runs a graph (tier 1 tape interpreter, reference replay, tier 2).

An :class:`Executable` maps input arrays to fresh output arrays. :func:`build` picks
the tier: ``"interpret"`` builds a tier-1 tape (:mod:`nbgrad.jit.lowering`, run by the
precompiled interpreter of :mod:`nbgrad.jit.interpreter`); ``"reference"`` replays
the graph with eager ops; ``"compile"`` asks tier 2 (``nbgrad.jit.codegen``, when
installed) for generated code.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from ..backends import is_cuda_array
from .ir import Graph, LoopInfo, format_graph


class Executable:
    """Runs one graph: ``run(arrays) -> arrays`` (outputs never alias the inputs)."""

    tier = "reference"
    #: how many native calls one ``run`` makes (0 for the reference executor)
    native_calls = 0

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        from .reference import replay_arrays
        outs = replay_arrays(self.graph, arrays)
        ins = {id(a) for a in arrays}
        return [(o.copy() if is_cuda_array(o) else np.array(o, copy=True))
                if id(o) in ins or not o.flags.writeable or o.base is not None else o
                for o in outs]

    def source(self) -> str:
        return "# reference executor: the graph replayed with eager ops\n" + \
            format_graph(self.graph)


_TIER2_WARNED = False


def tier2():
    """The tier-2 code generator module, or None while it is not installed."""
    try:
        from . import codegen  # type: ignore[attr-defined]
    except ImportError:
        return None
    return codegen if hasattr(codegen, "compile_graph") else None


def build(graph: Graph, tier: str = "interpret") -> Executable:
    """An executable of ``graph`` for ``tier`` ("interpret", "compile", "reference", or
    "cuda" for a graph of CUDA tensors: :class:`nbgrad.cuda.fusion.CudaExecutable`).

    Native custom Function nodes are inlined first; a graph with PythonOps gets an
    executable that owns their context handles (:func:`nbgrad.jit.pythonop.owning`).
    Generated code (``"compile"``, ``"cuda"``) comes wrapped in a
    :class:`nbgrad.jit.verify.Checked`: its first run is checked against tier 1.
    """
    global _TIER2_WARNED
    from .function_trace import expand
    from .pythonop import owning
    graph = expand(graph)
    if tier == "reference":
        return owning(Executable(graph))
    from .verify import checked  # generated code: its first run is checked against tier 1
    if tier == "cuda":  # a graph of CUDA tensors: fused @cuda.jit kernels
        from ..cuda.fusion import CudaExecutable
        return owning(checked(CudaExecutable(graph)))
    if tier == "compile":
        gen = tier2()
        if gen is not None:
            return owning(checked(gen.compile_graph(graph)))
        if not _TIER2_WARNED:
            _TIER2_WARNED = True
            warnings.warn("nbgrad.jit: tier-2 code generation is not available in this build; "
                          "mode='compile' runs the tier-1 interpreter", RuntimeWarning,
                          stacklevel=4)
    from .lowering import build_tape
    return owning(build_tape(graph))


def run_loop_native(info: LoopInfo, arrays: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """Run one loop node through a tier-1 tape when the interpreter supports its body."""
    from .lowering import loop_executable
    exe = loop_executable(info, arrays)
    if exe is None:
        return None
    return exe.run(arrays)
