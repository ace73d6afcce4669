"""Graphs with PythonOps run as native segments and plain Python calls.

A graph whose top-level nodes include PythonOp or PythonOpGrad nodes (custom Functions
whose code runs in Python, :mod:`nbgrad.jit.trace.pythonop`) runs as a list of steps:
native segments, subgraphs of the other nodes built for the tier (tier-2 generated code,
a tier-1 tape), and the PythonOp nodes, called directly on the arrays
(``RunPlan.run``, :mod:`nbgrad.jit.trace.pythonop_run`). No ``objmode``
block inside generated code, no eager step inside the tape: between two native calls
a custom Function costs one Python call. Each native node goes to the earliest segment
its inputs allow (a graph with one PythonOp makes at most two native calls); PythonOps
keep their order (their code may have side effects). PythonOps inside loop bodies are
left to the tier (they run once per iteration inside the loop's native code).

The executable is the owner scope of the context handles its PythonOps create, as
:class:`~nbgrad.jit.trace.handles.OwningExecutable` (which it extends), except where each
handle leaves a run only as itself and no native segment reads it (``arrays_own``, the
common case, and every backward): the handle is then the context itself (a
:class:`~nbgrad.jit.trace.handles.SelfHandle`, no table entry), and a run needs no
scope. A PythonOpGrad step takes either kind of handle; native segments that read a
handle input get a handle array (:func:`~nbgrad.jit.trace.handles.as_handle`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from .executable import Executable
from .tier1.tape import TapeExecutable
from .trace import handles
from .trace.handles import HANDLES, OwningExecutable, _release_with, _Scope, settle
from .trace.ir import PYTHON_OP, PYTHON_OP_GRAD, Graph, Node, Var, format_graph
from .trace.pythonop_run import RunPlan
from .verify import Checked

__all__ = ["ENABLED", "SegmentedExecutable", "has_top_level_python_ops", "partition",
           "segmented"]

_PY_KINDS = (PYTHON_OP, PYTHON_OP_GRAD)


#: whether graphs with top-level PythonOps run segmented (False: their PythonOps run
#: inside the tier's code, through objmode or a tape's eager step; for comparisons)
ENABLED = True


def has_top_level_python_ops(graph: Graph) -> bool:
    """Whether ``graph`` has a PythonOp or PythonOpGrad node outside loop bodies."""
    key = ("segments", "top")
    found = graph.cache.get(key)
    if found is None:
        found = graph.cache[key] = any(n.op in _PY_KINDS for n in graph.nodes)
    return found


def segmented(graph: Graph) -> bool:
    """Whether ``graph`` runs as a :class:`SegmentedExecutable` (see :data:`ENABLED`)."""
    return ENABLED and has_top_level_python_ops(graph)


def partition(graph: Graph) -> list[tuple[str, list[Node]]]:
    """The steps of ``graph``: ``("native", nodes)`` and ``("python", [node])`` in run
    order. Native segment ``k`` runs before the PythonOps of stage ``k``; a native node
    goes to the first segment after the stage of every PythonOp it depends on, a PythonOp
    to the first stage after its inputs' segments and the PythonOp before it."""
    ready: dict[int, int] = {}  # id(var) -> first native segment that may read it
    stage_of: dict[int, int] = {}  # id(var) -> the stage after which a PythonOp may read it
    segments: list[list[Node]] = []
    stages: list[list[Node]] = []
    last = 0  # the stage of the previous PythonOp (their order is kept)
    for node in graph.nodes:
        ins = [v for v in node.inputs if v is not None]
        if node.op in _PY_KINDS:
            k = max([last] + [stage_of.get(id(v), 0) for v in ins])
            last = k
            while len(stages) <= k:
                stages.append([])
            stages[k].append(node)
            for v in node.outputs:
                ready[id(v)] = k + 1
                stage_of[id(v)] = k
        else:
            k = max([0] + [ready.get(id(v), 0) for v in ins])
            while len(segments) <= k:
                segments.append([])
            segments[k].append(node)
            for v in node.outputs:
                ready[id(v)] = k
                stage_of[id(v)] = k
    steps: list[tuple[str, list[Node]]] = []
    for k in range(max(len(segments), len(stages))):
        if k < len(segments) and segments[k]:
            steps.append(("native", segments[k]))
        if k < len(stages):
            steps.extend(("python", [n]) for n in stages[k])
    return steps


def _subgraph(graph: Graph, nodes: list[Node], needed: set[int]) -> Graph:
    """The graph of one native segment: its outside inputs (graph inputs, values of
    earlier steps) in first-use order, the constants it reads, and the values it makes
    that ``needed`` (ids read later or returned) names."""
    made = {id(v) for n in nodes for v in n.outputs}
    consts = {id(v): (v, a) for v, a in graph.consts.items()}
    inputs: list[Var] = []
    sub_consts: dict[Var, np.ndarray] = {}
    seen: set[int] = set()
    for n in nodes:
        for v in n.inputs:
            if v is None or id(v) in made or id(v) in seen:
                continue
            seen.add(id(v))
            if id(v) in consts:
                sub_consts[v] = consts[id(v)][1]
            else:
                inputs.append(v)
    outputs = [v for n in nodes for v in n.outputs if id(v) in needed]
    return Graph(inputs, sub_consts, list(nodes), outputs)


class SegmentedExecutable(OwningExecutable):
    """A graph with top-level PythonOps: native segments (each built by
    ``build(subgraph, tier=tier)``, :func:`nbgrad.jit.program.build`; by tier 1 where
    tier 2 fails) and direct Python calls of its PythonOps (see the module doc).

    ``tier``: the tier its segments run in ("compile" only when every one is tier-2
    code). Thread-safe: a run keeps its values in a list of its own.
    """

    def __init__(self, graph: Graph, tier: str, build: Callable[..., Executable]) -> None:
        self.graph = graph
        self.inner = self  # (OwningExecutable's attribute; nothing is wrapped)
        self.mask = handles.handle_mask(graph)
        slot: dict[int, int] = {}

        def slot_of(v: Var | None) -> int:
            if v is None:
                return 0  # slot 0 holds None
            s = slot.get(id(v))
            if s is None:
                s = slot[id(v)] = len(slot) + 1
            return s

        self.in_slots = [slot_of(v) for v in graph.inputs]
        const_slots = [(slot_of(v), a) for v, a in graph.consts.items()]
        parts = partition(graph)
        later: list[set[int]] = []  # per step: ids of values read after it or returned
        read = {id(v) for v in graph.outputs}
        for _, nodes in reversed(parts):
            later.append(set(read))
            read |= {id(v) for n in nodes for v in n.inputs if v is not None}
        later.reverse()
        #: per step: (run, plan, input slots, output slots, what it is): a native
        #: segment's ``run(arrays)`` and None, or the PythonOp's
        #: :class:`~nbgrad.jit.trace.pythonop_run.RunPlan` and its ``run``
        self.steps: list[tuple[Callable, RunPlan | None, list[int], list[int], object]] = []
        self.segments: list[Executable] = []
        nested = False  # whether a native segment may make handles (loop bodies...)
        for (kind, nodes), needed in zip(parts, later, strict=True):
            if kind == "python":
                node = nodes[0]
                plan = RunPlan(node)
                self.steps.append((plan.run, plan, [slot_of(v) for v in node.inputs],
                                   [slot_of(v) for v in node.outputs], node))
                continue
            sub = _subgraph(graph, nodes, needed)
            if not sub.outputs:
                continue  # nothing of it is used (unreachable after the optimizer)
            nested = nested or handles.has_python_ops(sub)
            try:
                exe = build(sub, tier=tier)
            except Exception:  # noqa: BLE001 - tier 1 runs whatever tier 2 cannot
                if tier != "compile":
                    raise
                exe = build(sub, tier="interpret")
            if isinstance(exe, Checked):  # its first run is checked against tier 1
                exe.listener = functools.partial(self._verdict, len(self.steps))
            self.segments.append(exe)
            self.steps.append((exe.run, None, [slot_of(v) for v in sub.inputs],
                               [slot_of(v) for v in sub.outputs], exe))
        self.out_slots = [slot_of(v) for v in graph.outputs]
        # outputs that are graph inputs, constants or repeated get a copy of their own
        fresh = set()
        for _, _, _, outs, _ in self.steps:
            fresh.update(outs)
        seen: set[int] = set()
        self.out_copy = []
        for s in self.out_slots:
            self.out_copy.append(s not in fresh or s in seen)
            seen.add(s)
        self.template: list = [None] * (len(slot) + 1)
        for s, a in const_slots:
            self.template[s] = a
        # the common case of settle(): every PythonOp's handle is an output of its own
        # and no other output may hold one (each handle's owner is then its array)
        py_handles = [slot_of(n.outputs[0]) for _, _, _, _, n in self.steps
                      if isinstance(n, Node) and n.op == PYTHON_OP]
        self.handle_outs = [k for k, s in enumerate(self.out_slots) if s in py_handles]
        self.direct_settle = (
            sorted(self.out_slots[k] for k in self.handle_outs) == sorted(py_handles)
            and len(set(py_handles)) == len(py_handles)
            and [k for k, m in enumerate(self.mask) if m] == self.handle_outs)
        #: whether each handle is its context itself (a SelfHandle), so that a run needs no
        #: owner scope: only this graph's PythonOps make handles, no native segment reads
        #: one, and the outputs that may hold one are those values themselves (not
        #: copies); a context that stays inside the run goes when the run ends
        native_reads = {s for _, plan, ins, _, _ in self.steps if plan is None for s in ins}
        self.arrays_own = not nested and all(
            self.out_slots[k] in py_handles and not self.out_copy[k]
            for k, m in enumerate(self.mask) if m) and not native_reads.intersection(py_handles)
        #: input slots that native segments read and that may be given a context that is
        #: its own handle (:class:`~nbgrad.jit.trace.handles.SelfHandle`): converted to a
        #: handle array on entry
        self.handle_ins = [s for s, v in zip(self.in_slots, graph.inputs, strict=True)
                           if s in native_reads and v.dtype == np.int64 and v.shape == ()]
        for k, (_, plan, ins, outs, node) in enumerate(self.steps):
            if plan is not None and node.op == PYTHON_OP:
                plan.own = self.arrays_own  # (a new plan.run)
                self.steps[k] = (plan.run, plan, ins, outs, node)
        tiers = {getattr(e, "tier", None) for e in self.segments}
        self.tier = tier if not tiers or tiers == {tier} else "interpret"
        self.native_calls = sum(getattr(e, "native_calls", 1) for e in self.segments)
        self._tapes = [e for e in self.segments if isinstance(e, TapeExecutable)]
        #: ``run(arrays) -> arrays`` (see :meth:`_compile`)
        self.run = self._compile()

    def _verdict(self, k: int, checked: Checked, ok: bool) -> None:
        """The check of segment ``k`` is done: it runs unwrapped from now on (its
        generated code, or tier 1 after a mismatch)."""
        _, _, ins, outs, _ = self.steps[k]
        exe = checked.candidate if ok else checked.fallback
        self.steps[k] = (exe.run, None, ins, outs, exe)
        self._ns[f"S{k}"] = exe.run

    @property
    def stats(self) -> dict:
        """Per kind of step: ``segments`` (native), ``python_calls``; and the tier-2
        statistics of the segments summed (``blocked``, ``regions``, ``fused_nodes``,
        ``nodes``; ``fallbacks``: the ops they run through objmode)."""
        out: dict = {"segments": len(self.segments),
                     "python_calls": len(self.steps) - len(self.segments),
                     "blocked": 0, "regions": 0, "fused_nodes": 0, "nodes": 0, "fallbacks": []}
        for _, _, _, _, what in self.steps:
            st = getattr(what, "stats", None) if not isinstance(what, Node) else None
            for key, value in (st or {}).items():
                if key in ("blocked", "regions", "fused_nodes", "nodes", "fallbacks"):
                    out[key] += value
        return out

    @property
    def fell_back(self) -> bool:
        """Whether a tier-1 segment's last run used eager ops (interpreter not built)."""
        return bool(self._tapes) and any(e.fell_back for e in self._tapes)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The outputs for ``arrays`` (instances call the code of :meth:`_compile` directly)."""
        return self.__dict__["run"](arrays)

    def _compile(self) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
        """``run``: the steps as straight-line Python (one local per value), an owner
        scope of the handles they create (``OwningExecutable.run``, ``settle``)."""
        ns: dict = {"_tls": handles._TLS, "_Scope": _Scope, "_release": HANDLES.release,
                    "_release_with": _release_with, "_settle": settle, "_mask": self.mask,
                    "_copy": np.array, "_as_handle": handles.as_handle, "v0": None}
        for k, value in enumerate(self.template):
            if value is not None:
                ns[f"v{k}"] = value  # constants

        def names(slots: list[int]) -> str:
            return "".join(f"v{s}, " for s in slots)

        n = len(self.in_slots)
        lines = ["def run(arrays):",
                 f"    if len(arrays) != {n}:",
                 f"        raise TypeError(f'segmented graph: expected {n} inputs, got "
                 "{len(arrays)}')"]
        if n:
            lines.append(f"    {names(self.in_slots)}= arrays")
        lines += [f"    v{s} = _as_handle(v{s})" for s in dict.fromkeys(self.handle_ins)]
        calls = []
        for k, (run, _, ins, outs, _) in enumerate(self.steps):
            ns[f"S{k}"] = run
            call = f"S{k}([{names(ins)}])"
            calls.append(f"{names(outs)}= {call}" if outs else call)
        result = "[" + ", ".join(f"_copy(v{s}, copy=True)" if c else f"v{s}"
                                 for s, c in zip(self.out_slots, self.out_copy,
                                                 strict=True)) + "]"
        if self.arrays_own:  # (the handles own themselves, or there are none)
            lines += [f"    {c}" for c in calls] + [f"    return {result}"]
            return self._exec(ns, lines)
        lines += ["    parent = getattr(_tls, 'scope', None)",
                  "    scope = _tls.scope = _Scope(parent)",
                  "    try:"]
        lines += [f"        {c}" for c in calls]
        lines += ["    except BaseException:",
                  "        _tls.scope = parent",
                  "        _release(*scope.created)",
                  "        raise",
                  "    _tls.scope = parent",
                  f"    result = {result}"]
        if self.direct_settle:  # settle(), its common case: each array owns its handle
            lines.append(f"    if parent is None and len(scope.created) == "
                         f"{len(self.handle_outs)}:")
            lines += [f"        _release_with(result[{k}], (int(result[{k}]),))"
                      for k in self.handle_outs] or ["        pass"]
            lines.append("    else:")
            lines.append("        _settle(scope, result, _mask)")
        else:
            lines.append("    _settle(scope, result, _mask)")
        lines.append("    return result")
        return self._exec(ns, lines)

    def _exec(self, ns: dict, lines: list[str]) -> Callable:
        exec(compile("\n".join(lines) + "\n", f"<segmented graph {id(self):x}>", "exec"), ns)
        self._ns = ns
        self.text = "\n".join(lines)
        return ns["run"]

    def __getattr__(self, name: str):
        raise AttributeError(name)

    def source(self) -> str:
        lines = [f"# segmented graph ({self.tier}): {len(self.segments)} native segment(s), "
                 f"{len(self.steps) - len(self.segments)} Python call(s) of PythonOps",
                 format_graph(self.graph)]
        for k, (_, _, _, _, what) in enumerate(self.steps):
            if isinstance(what, Node):
                lines.append(f"# step {k}: Python call of {what.op} {what.attrs['name']}")
            else:
                lines.append(f"# step {k}: native segment\n{what.source()}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<segmented {self.tier} executable: {len(self.steps)} steps>"
