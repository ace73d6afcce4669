"""Tier choice: which executable runs a graph, promotion to tier 2, and the way back.

:func:`build` makes the executable of one graph for a tier: ``"interpret"`` a tier-1 tape
(:mod:`nbgrad.jit.tier1.lowering`, run by the precompiled interpreter of
:mod:`nbgrad.jit.tier1.interpreter`); ``"reference"`` the graph replayed with eager ops;
``"compile"`` tier-2 generated code (:mod:`nbgrad.jit.tier2.codegen`); ``"cuda"`` fused
CUDA kernels (:mod:`nbgrad.jit.cuda.fusion`). Generated code comes wrapped in a
:class:`~nbgrad.jit.verify.Checked`: its first run is checked against tier 1.

:class:`Program` holds the executables of one traced signature by role (``"main"``,
``"fwd"``, ``"bwd"``) and the tier they run in, and owns the policy: the starting tier
(from the jit mode), promotion to tier 2 of a graph that has spent about what compiling
it costs in tier 1 (:data:`PROMOTE_SECONDS`), in a background thread
(:meth:`Program.promote`; tier 1 runs meanwhile), the swap to generated code once its
first result agreed with tier 1, and the fallback to tier 1 for good after a mismatch
(:data:`~nbgrad.jit.verify.TIER1_MISMATCH`) or a graph tier 2 refuses
(:data:`TIER1_FINAL`). Promotion threads are daemons that exit abandons.
"""

from __future__ import annotations

import atexit
import functools
import threading
import time
import warnings
from collections.abc import Callable, Sequence

import numpy as np
from numba.core import event

from .executable import Executable
from .tier1.lowering import build_tape, loop_executable
from .tier2 import codegen
from .trace.function_trace import expand
from .trace.handles import owning
from .trace.ir import Graph, LoopInfo
from .verify import TIER1_MISMATCH, Checked, OnHost, checked

#: calls before ``mode="auto"`` may promote a graph to tier 2 (when tier 2 exists)
PROMOTE_AFTER = 3
#: seconds a graph has run in tier 1 before ``mode="auto"`` promotes it: about what
#: compiling a small graph with tier 2 costs, so a graph is compiled once its calls have
#: cost as much (as in ski rental: never much more than twice the time of the better
#: choice in hindsight). A 50 ms graph is promoted after its third call, a 0.1 ms graph
#: after a few thousand calls, and a graph called a few times is never compiled.
PROMOTE_SECONDS = 0.25
#: the tier of a program while tier 2 compiles it (its executables stay in tier 1)
PROMOTING = "promoting"
#: the tier of a program whose promotion failed (it stays in tier 1 for good)
TIER1_FINAL = "interpret (tier 2 refused)"

_TIER2_WARNED = False


def tier2():
    """The tier-2 code generator module, or None while it is not installed."""
    return codegen if hasattr(codegen, "compile_graph") else None


def build(graph: Graph, tier: str = "interpret") -> Executable:
    """An executable of ``graph`` for ``tier`` ("interpret", "compile", "reference", or
    "cuda" for a graph of CUDA tensors: :class:`nbgrad.jit.cuda.fusion.CudaExecutable`).

    Native custom Function nodes are inlined first; a graph with PythonOps gets an
    executable that owns their context handles (:func:`nbgrad.jit.trace.handles.owning`).
    Generated code (``"compile"``, ``"cuda"``) comes wrapped in a
    :class:`nbgrad.jit.verify.Checked`: its first run is checked against tier 1.
    """
    global _TIER2_WARNED
    graph = expand(graph)
    if tier == "reference":
        return owning(Executable(graph))
    if tier == "cuda":  # a graph of CUDA tensors: fused @cuda.jit kernels
        from .cuda.fusion import CudaExecutable  # optional: needs a CUDA runtime
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
    return owning(build_tape(graph))


def run_loop_native(info: LoopInfo, arrays: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """Run one loop node through a tier-1 tape when the interpreter supports its body."""
    exe = loop_executable(info, arrays)
    if exe is None:
        return None
    return exe.run(arrays)


def initial_tier(mode: str, cuda: bool) -> str:
    """The tier a new program starts in, for a jit ``mode`` ("auto", "interpret",
    "compile", "reference"); a graph of CUDA tensors runs on the CUDA tier."""
    return "reference" if mode == "reference" else "cuda" if cuda else (
        "compile" if mode == "compile" else "interpret")


class Program:
    """The executables of one traced signature, by role, and the tier they run in.

    ``name`` says whose graph it is in warnings. The tier changes only here: on
    promotion (:meth:`promote`), on the verdict of the promotion check, and on fallback.
    """

    def __init__(self, mode: str, cuda: bool, name: str) -> None:
        self.mode = mode
        #: a graph of CUDA tensors (run by nbgrad.jit.cuda.fusion, never promoted to tier 2)
        self.cuda = cuda
        self.name = name
        self.tier = initial_tier(mode, cuda)
        self.calls = 0
        #: seconds spent running calls so far (see :data:`PROMOTE_SECONDS`)
        self.seconds = 0.0
        self._exe: dict[str, Executable] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ executables
    def executable(self, role: str, graph_of: Callable[[str], Graph]) -> Executable:
        """The executable of ``role`` in the current tier, built on first need from
        ``graph_of(role)``."""
        exe = self._exe.get(role)
        if exe is None:
            with self._lock:
                exe = self._exe.get(role)
                if exe is None:
                    graph = graph_of(role)
                    if self.cuda and self.tier == TIER1_MISMATCH:
                        exe = OnHost(build(graph, "interpret"), [True] * len(graph.outputs))
                    else:
                        exe = self.adopt(role, build(graph, self.tier))
                    self._exe[role] = exe
        return owning(exe)  # tier 2 may swap in executables: PythonOp handles need an owner

    def executables(self) -> dict[str, Executable]:
        """The executables built so far, by role (a snapshot)."""
        return dict(self._exe)

    # ------------------------------------------------------------------ promotion check
    def adopt(self, role: str, exe: Executable) -> Executable:
        """``exe`` for ``role``; generated code not yet checked against tier 1
        (:class:`~nbgrad.jit.verify.Checked`) reports its verdict to :meth:`verdict`."""
        if isinstance(exe, Checked):
            exe.name = self.name
            exe.listener = functools.partial(self.verdict, role)
        return exe

    def verdict(self, role: str, checked: Checked, ok: bool) -> None:
        """A checked executable agreed with tier 1 (it replaces its wrapper) or not (the
        program goes back to tier 1 for good: every role is rebuilt in tier 1 on need)."""
        with self._lock:
            if ok:
                if self._exe.get(role) is checked:
                    self._exe[role] = checked.candidate
                return
            self.tier = TIER1_MISMATCH
            for r, exe in list(self._exe.items()):
                if exe is checked:
                    self._exe[r] = checked.fallback
                elif getattr(exe, "tier", None) in ("compile", "cuda"):
                    del self._exe[r]

    # ------------------------------------------------------------------ promotion
    def called(self, seconds: float, count: bool = True) -> None:
        """Count one call (a backward run: ``count=False``) that ran ``seconds``; in
        ``mode="auto"`` a program that has spent :data:`PROMOTE_SECONDS` in tier 1 over
        at least :data:`PROMOTE_AFTER` calls is promoted."""
        self.calls += count
        self.seconds += seconds
        if self.mode == "auto" and self.tier == "interpret" and \
                self.calls >= PROMOTE_AFTER and self.seconds >= PROMOTE_SECONDS and \
                tier2() is not None:
            # tier 2 compiles in a background thread; tier 1 runs until it is ready
            self.tier = PROMOTING
            self.promote()

    def promote(self) -> threading.Thread:
        """Compile the executables this program already uses with tier 2, in a daemon
        thread, and swap them in when ready (each checked against tier 1 on its first
        run); calls keep running in tier 1 meanwhile. The tier becomes ``"compile"``, or
        :data:`TIER1_FINAL` if tier 2 cannot compile a graph (no second try)."""
        _install_exit_hook()
        # a daemon: Python does not join it at exit (an unfinished compile is abandoned)
        thread = threading.Thread(target=self._promote, name="nbgrad-jit-tier2", daemon=True)
        PROMOTIONS.append(thread)
        thread.start()
        return thread

    def _promote(self) -> None:
        _IN_PROMOTION.active = True
        try:
            built: dict[str, Executable] = {}
            for role, exe in list(self._exe.items()):
                if getattr(exe, "tier", None) == "compile":
                    continue
                if _EXITING:  # the interpreter is exiting: abandon the promotion
                    return
                new = build(exe.graph, "compile")
                if getattr(new, "tier", None) != "compile":  # tier 2 refused the graph
                    self.tier = TIER1_FINAL
                    return
                built[role] = new
        except Exception as exc:  # never break a running program: stay in tier 1
            self.tier = TIER1_FINAL
            if _EXITING:  # abandoned at exit (PromotionAbandoned, or a module torn down)
                return
            warnings.warn(f"nbgrad.jit: compiling a hot graph with tier 2 failed "
                          f"({type(exc).__name__}: {exc}); it keeps running in tier 1",
                          RuntimeWarning, stacklevel=1)
            return
        with self._lock:  # each one's first run is checked against tier 1
            for role, new in built.items():
                self._exe[role] = self.adopt(role, new)
            self.tier = "compile"


# ------------------------------------------------------------------ promotion threads
#: promotion threads started by :meth:`Program.promote` (see :func:`wait_for_promotions`)
PROMOTIONS: list[threading.Thread] = []
#: set at interpreter exit: promotions stop (a compile in flight is abandoned)
_EXITING = False
#: how long exit waits for promotion threads to stop at a compiler-pass boundary
EXIT_GRACE_S = 1.0
_IN_PROMOTION = threading.local()
_HOOKED = False


class PromotionAbandoned(Exception):
    """Raised inside a promotion's Numba compile when the interpreter exits."""


def wait_for_promotions(timeout: float | None = None) -> bool:
    """Wait until every promotion started so far has finished; True if all did."""
    for t in list(PROMOTIONS):
        t.join(timeout)
    alive = [t for t in PROMOTIONS if t.is_alive()]
    PROMOTIONS[:] = alive
    return not alive


def _at_exit() -> None:
    """Abandon unfinished promotions: nothing waits for a compile at exit.

    Promotion threads are daemons (Python does not join them). Their Numba compile
    stops at the next compiler pass (:func:`_install_exit_hook`); exit waits at most
    :data:`EXIT_GRACE_S` for that (a thread inside one long LLVM call is left in it;
    teardown may wait for that call to return, never for the rest of the compile). The
    generated module stays on disk: the next process that promotes the graph compiles it
    again (or finds it in Numba's disk cache if it had finished).
    """
    global _EXITING
    _EXITING = True
    deadline = time.monotonic() + EXIT_GRACE_S
    for t in list(PROMOTIONS):
        t.join(max(0.0, deadline - time.monotonic()))


class _Abandon(event.Listener):
    """Aborts a promotion thread's Numba compile at its next pass once exit began."""

    def on_start(self, ev) -> None:
        if _EXITING and getattr(_IN_PROMOTION, "active", False):
            raise PromotionAbandoned("the interpreter is exiting")

    def on_end(self, ev) -> None:
        pass


def _install_exit_hook() -> None:
    """Once: the exit handler, and a Numba compiler-pass listener that aborts a
    promotion thread's compile at the next pass once the interpreter exits."""
    global _HOOKED
    if _HOOKED:
        return
    _HOOKED = True
    event.register("numba:run_pass", _Abandon())
    atexit.register(_at_exit)
