"""Tier choice: which executable runs a graph, promotion to tier 2, and the way back.

:func:`build` makes the executable of one graph for a tier: ``"interpret"`` a tier-1 tape
(:mod:`nbgrad.jit.tier1.lowering`, run by the precompiled interpreter of
:mod:`nbgrad.jit.tier1.interpreter`); ``"reference"`` the graph replayed with eager ops;
``"compile"`` tier-2 generated code (:mod:`nbgrad.jit.tier2.codegen`); ``"cuda"`` fused
CUDA kernels (:mod:`nbgrad.jit.cuda.fusion`). Generated code comes wrapped in a
:class:`~nbgrad.jit.verify.Checked`: its first run is checked against tier 1.

:class:`Program` holds the executables of one traced signature by role (``"main"``,
``"fwd"``, ``"bwd"``) and the tier they run in, and owns the policy: the starting tier
(from the jit mode); in ``mode="auto"`` promotion to tier 2 by time spent in tier 1
(:meth:`Program.hot`: as in ski rental, once the runs have cost about what compiling is
expected to cost, :func:`compile_estimate`; at once for a graph whose one run costs a
noticeable part of that; before the first tier-1 run where the trace was heavy,
:meth:`Program.early`), compiled in a background thread (:meth:`Program.promote`;
tier 1 runs meanwhile); the swap to generated code once its first result agreed with
tier 1 (the check runs the program's tier-1 tape); then the measurement
(:meth:`Program.measure`, on runs no background compile overlapped): tier 2 stays only
if its runs measured faster than tier 1's (a trial times a few more tier-1 runs where
there were too few to tell; ``mode="compile"`` has none), else
the program goes back to tier 1 (:data:`TIER1_SLOWER`). Tier 1 for good also after a
mismatch (:data:`~nbgrad.jit.verify.TIER1_MISMATCH`) or a graph tier 2 refuses
(:data:`TIER1_FINAL`). Runs are timed without the time spent in Numba's compiler
(:mod:`nbgrad.jit.timing`). Promotion threads are daemons that exit abandons.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from numba.core import event

from . import timing
from .executable import Executable
from .segments import SegmentedExecutable, segmented
from .tier1 import interpreter
from .tier1.lowering import build_tape, loop_executable
from .tier2 import codegen
from .trace.function_trace import expand
from .trace.handles import handle_inputs, owning
from .trace.ir import Graph, LoopInfo
from .verify import TIER1_MISMATCH, Checked, OnHost, checked
from .verify import enabled as verify_enabled

#: calls run in tier 1 (the call that traces is not one) before ``mode="auto"`` may
#: promote a graph: a function called once is never compiled
PROMOTE_AFTER = 1
#: the tier-1 time after which ``mode="auto"`` promotes a graph: None for
#: :func:`compile_estimate` (a number replaces it; tests set 0 to promote by calls alone)
PROMOTE_SECONDS: float | None = None
#: expected seconds of compiling a graph with tier 2: ``base + per_node * nodes``
#: (measured on W1-W6: 6-31 nodes took 0.45-1.7 s, W2's BLAS calls 5.8 s, on a warm
#: install), or :data:`COMPILE_CACHED_S` when its generated module is in the cache folder
COMPILE_ESTIMATE = (0.4, 0.04)
COMPILE_CACHED_S = 0.05
#: a graph whose one call in tier 1 costs at least this part of the expected compile is
#: promoted at once (after :data:`PROMOTE_AFTER` calls): the compile runs beside its calls
#: and, measured faster, pays itself back within a few dozen calls (a 50 ms graph is
#: promoted after its second call in tier 1; a 0.1 ms graph once its calls have cost
#: the compile estimate, after about ten thousand calls)
HEAVY_FRACTION = 1 / 40
#: a graph whose trace cost this many times what makes a call heavy (the trace runs
#: eager ops: W3's and W5's traces took 7-9 times a tier-1 call, whose elementwise
#: chains run in strips) is promoted before its first run in tier 1
#: (:meth:`Program.early`), if the trace took at least :data:`EARLY_OP_S` per op it
#: recorded (else its time is the tracer's own: an unrolled Python loop of small ops)
EARLY_MARGIN = 8.0
EARLY_OP_S = 1e-3
#: the longest the call after a promotion waits for it when the generated code is in
#: the cache folder (loading takes tens of ms): at most half of one tier-1 call, once
QUICK_WAIT_S = 0.25
#: timed runs of tier 2 (after its first) that decide whether it stays
MEASURE_RUNS = 3
#: timed runs of tier 1 that decide (``mode="compile"`` has none from before, a heavy
#: graph one or two: a trial of tier 1 times the rest, :meth:`Program.measure`)
TRIAL_RUNS = 2
#: timed runs of tier 2 before a verdict that it is slower where it is not
#: :data:`CLEAR_RATIO` slower and tier-1 runs from before the promotion decide (not a
#: trial, :meth:`Program.measure`): a few runs that noise slowed must not send a graph back to
#: tier 1 for good (a neural ODE whose tier 2 runs 0.75x tier 1's time measured slower
#: once in a run of :data:`MEASURE_RUNS`)
CONFIRM_RUNS = 8
#: a ratio that decides early: tier 2 this much faster than tier 1 stays at once, and
#: fewer tier-1 runs than :data:`TRIAL_RUNS` decide where the two are this far apart
CLEAR_RATIO = 2.0
#: whether tier 2 is kept only where it measured faster (``NBGRAD_TIER_MEASURE=0``: no
#: measuring, tier 2 stays once its first result agreed; the test suite turns it off so
#: that the tier a test runs in does not depend on timing)
MEASURE = os.environ.get("NBGRAD_TIER_MEASURE", "1").strip() != "0"
#: the tier of a program while tier 2 compiles it (its executables stay in tier 1)
PROMOTING = "promoting"
#: the tier of a program whose promotion failed (it stays in tier 1 for good)
TIER1_FINAL = "interpret (tier 2 refused)"
#: the tier of a program whose generated code measured slower than tier 1 (for good)
TIER1_SLOWER = "interpret (tier 2 measured slower)"

#: tiers no run leaves (:meth:`Program.settled`)
_SETTLED = frozenset({TIER1_FINAL, TIER1_SLOWER, TIER1_MISMATCH, "reference", "cuda"})

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
    graph = expand(graph)
    if tier in ("compile", "interpret") and segmented(graph):
        # PythonOps as plain Python calls between native segments of this tier
        return SegmentedExecutable(graph, tier, build)
    # the others may be given PythonOp contexts that are their own handles (a segmented
    # forward's residuals): they get handle arrays
    return handle_inputs(_build_native(graph, tier))


def _build_native(graph: Graph, tier: str) -> Executable:
    """:func:`build` of a graph that does not run segmented."""
    global _TIER2_WARNED
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
                          stacklevel=5)
    return owning(build_tape(graph))


def run_loop_native(info: LoopInfo, arrays: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """Run one loop node through a tier-1 tape when the interpreter supports its body."""
    exe = loop_executable(info, arrays)
    if exe is None:
        return None
    return exe.run(arrays)


def compile_estimate(graphs: Sequence[Graph]) -> float:
    """Expected seconds of compiling ``graphs`` with tier 2 (see :data:`COMPILE_ESTIMATE`)."""
    base, per_node = COMPILE_ESTIMATE
    total = 0.0
    for g in graphs:
        cached = getattr(codegen, "generated_before", None)
        if cached is not None and cached(g):
            total += COMPILE_CACHED_S
        else:
            total += base + per_node * sum(1 for _ in g.walk())
    return total


def run_tier(exe) -> str | None:
    """The tier a run of ``exe`` is timed for ("interpret", "compile"), or None for a run
    that says nothing about either (the promotion check runs both; reference, CUDA)."""
    if isinstance(exe, Checked):
        return None if exe.verdict is None else "compile" if exe.verdict else "interpret"
    tier = getattr(exe, "tier", None)
    if getattr(exe, "fell_back", False):  # a tape run with eager ops (interpreter unbuilt)
        return None
    return tier if tier in ("interpret", "compile") else None


def initial_tier(mode: str, cuda: bool) -> str:
    """The tier a new program starts in, for a jit ``mode`` ("auto", "interpret",
    "compile", "reference"); a graph of CUDA tensors runs on the CUDA tier."""
    return "reference" if mode == "reference" else "cuda" if cuda else (
        "compile" if mode == "compile" else "interpret")


class Program:
    """The executables of one traced signature, by role, and the tier they run in.

    ``name`` says whose graph it is in warnings. The tier changes only here: on
    promotion (:meth:`promote`), on the verdict of the promotion check, on the verdict
    of the measurement (:meth:`measure`), and on fallback. Calls run through
    :meth:`run`, which times them for the policy.
    """

    def __init__(self, mode: str, cuda: bool, name: str) -> None:
        self.mode = mode
        #: a graph of CUDA tensors (run by nbgrad.jit.cuda.fusion, never promoted to tier 2)
        self.cuda = cuda
        self.name = name
        self.tier = initial_tier(mode, cuda)
        self.calls = 0
        #: seconds spent running in tier 1 so far (see :meth:`hot`)
        self.seconds = 0.0
        #: timed runs by tier ("interpret", "compile"): count and fastest, by role, of the
        #: runs that no background compile overlapped (:func:`quiet`), and the check's
        #: run of the tier-1 tape (the swap waits for the compile: it overlaps none)
        self.samples = {"interpret": timing.Samples(), "compile": timing.Samples()}
        #: every timed tier-1 run (for :meth:`hot`: whether a graph is heavy)
        self.rough = timing.Samples()
        #: the measurement's verdict once made: {"tier1_s", "tier2_s", "kept"} (one call's
        #: fastest time in each tier, summed over the roles compared)
        self.measured: dict | None = None
        #: whether this program measures tier 2 against tier 1 (:data:`MEASURE` when made)
        self.measuring = MEASURE
        self._budget: tuple[int, float] | None = None
        #: seconds the trace ran the function (eager ops; see :meth:`traced`)
        self.trace_seconds: float | None = None
        self._exe: dict[str, Executable] = {}
        self._tier1: dict[str, Executable] = {}  # tier-1 executables replaced by tier 2
        self._trial: dict[str, Executable] | None = None  # tier 2's, while tier 1 is timed
        self._warm: set[int] = set()  # ids of tier-2 executables that ran once
        self._quick: threading.Thread | None = None  # a promotion that loads cached code
        self._lock = threading.Lock()
        timing.install()
        _LIVE.add(self)

    # ------------------------------------------------------------------ executables
    def executable(self, role: str, graph_of: Callable[[str], Graph]) -> Executable:
        """The executable of ``role`` in the current tier, built on first need from
        ``graph_of(role)``."""
        return owning(self._get(role, graph_of))  # PythonOp handles need an owner

    def _get(self, role: str, graph_of: Callable[[str], Graph]) -> Executable:
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
        return exe

    def executables(self) -> dict[str, Executable]:
        """The executables built so far, by role (a snapshot)."""
        return dict(self._exe)

    def run(self, role: str, graph_of: Callable[[str], Graph], arrays: Sequence,
            count: bool = True) -> list:
        """Run the executable of ``role`` on ``arrays`` and time it for the policy
        (:meth:`called`); ``count=False`` for a backward run (not a call)."""
        quick = self._quick
        if quick is not None:  # cached code loads in less than the tier-1 call it saves
            self._quick = None
            t1 = self.rough
            quick.join(min(QUICK_WAIT_S, 0.5 * t1.total(t1.best)))
        exe = self._get(role, graph_of)
        if self.settled():  # no run can change the tier now: none is timed
            outs = owning(exe).run(arrays)
            self.calls += count
        else:
            outs = self._timed_run(role, exe, arrays, count)
        if count and interpreter.PENDING:  # after a result: tier 1 ran eager ops for it
            build_interpreter()
        return outs

    def _timed_run(self, role: str, exe: Executable, arrays: Sequence, count: bool) -> list:
        """:meth:`run` of a program whose tier may still change: the run timed for the
        policy (:meth:`called`), the promotion started when it is due."""
        if count and self.trace_seconds is not None and self.early(exe):
            self.start_promotion()
        checks = isinstance(exe, Checked) and exe.verdict is None
        token = quiet()
        compiling = timing.compile_seconds()
        start = timing.clock()
        outs = owning(exe).run(arrays)
        seconds = timing.clock() - start - (timing.compile_seconds() - compiling)
        clean = stayed_quiet(token)
        if checks and clean and exe.verdict and exe.tier1_seconds is not None and \
                exe.fallback is not None and exe.fallback is self._tier1.get(role):
            # the check ran the tape this program ran (warm), after the compile
            self.samples["interpret"].add(role, exe.tier1_seconds)
        self.called(max(seconds, 0.0), count, role, run_tier(exe), exe, clean)
        return outs

    def settled(self) -> bool:
        """Whether no later run can change this program's tier, so that runs need no
        timing (:meth:`called`): tier 2 measured (or not measuring), tier 1 for good (a
        final state, or a mode that never promotes), the reference or CUDA tier."""
        tier = self.tier
        if tier == "compile":
            return self.measured is not None or not self.measuring
        if tier == "interpret":
            return self.mode != "auto"
        return tier in _SETTLED

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
                if checked.fallback is not None:  # the tier-1 tape the check ran
                    self._tier1.setdefault(role, checked.fallback)
                return
            self.tier = TIER1_MISMATCH
            self._trial = None
            for r, exe in list(self._exe.items()):
                if exe is checked:
                    self._exe[r] = checked.fallback
                elif getattr(exe, "tier", None) in ("compile", "cuda"):
                    del self._exe[r]

    # ------------------------------------------------------------------ the policy
    def called(self, seconds: float, count: bool = True, role: str = "main",
               tier: str | None = "interpret", exe: Executable | None = None,
               clean: bool = True) -> None:
        """Count one call (a backward run: ``count=False``) whose run of ``role`` took
        ``seconds`` in ``tier`` (None: a run that times neither tier); then promote
        (:meth:`hot`) or measure (:meth:`measure`) where the policy says so. The first
        run of each tier-2 executable ``exe`` is not a sample (it may load code), nor is
        a run that shared the machine with a background compile (``clean=False``: it
        would make its tier look slower than it is)."""
        self.calls += count
        if tier == "interpret":
            self.seconds += seconds
            self.rough.add(role, seconds)
            if clean:
                self.samples["interpret"].add(role, seconds)
        elif tier == "compile":
            if exe is not None and id(exe) not in self._warm:
                self._warm.add(id(exe))
            elif clean:
                self.samples["compile"].add(role, seconds)
        if self.mode == "auto" and self.tier == "interpret" and \
                self.calls >= PROMOTE_AFTER and tier2() is not None and self.hot():
            self.start_promotion()
        elif self.measuring and self.tier == "compile" and self.measured is None and \
                tier is not None:
            self.measure()

    def start_promotion(self) -> None:
        """Promote now (:meth:`promote`): tier 2 compiles in a background thread, tier 1
        runs until it is ready; code in the cache folder is waited for briefly."""
        with self._lock:
            if self.tier != "interpret":
                return
            self.tier = PROMOTING
        thread = self.promote()
        if PROMOTE_SECONDS is None and self.cached():
            self._quick = thread

    def cached(self) -> bool:
        """Whether the generated code of every role is in the cache folder (by
        :meth:`budget`: a promotion that loads it takes tens of ms)."""
        return self.budget() <= COMPILE_CACHED_S * len(self._exe) + 1e-9

    def budget(self) -> float:
        """The tier-1 seconds after which this program is promoted: :data:`PROMOTE_SECONDS`
        or the :func:`compile_estimate` of its graphs (kept while its roles stay)."""
        if PROMOTE_SECONDS is not None:
            return PROMOTE_SECONDS
        if self._budget is None or self._budget[0] != len(self._exe):  # a role was added
            exes = self.executables()
            self._budget = (len(exes), compile_estimate([e.graph for e in exes.values()]))
        return self._budget[1]

    def traced(self, seconds: float, nodes: int) -> None:
        """The trace recorded ``nodes`` ops, running them with eager ops in ``seconds``
        (compile time left out): a first guess at what one call costs (:meth:`early`)."""
        self.trace_seconds = seconds if seconds >= nodes * EARLY_OP_S else None

    def early(self, exe: Executable) -> bool:
        """Whether to promote at the start of the first call in tier 1, before its run
        (the compile then runs beside it): a trace that cost :data:`EARLY_MARGIN` times
        what makes a call heavy by :meth:`hot`'s rule, of a graph whose generated code
        is not in the cache folder (a load is quick). Only where the interpreter is
        loaded (a compile holds Numba's lock) and the promotion check is on: the
        check's tier-1 run is then the sample the measurement uses, as every other
        tier-1 run of such a program overlaps the compile (see :attr:`samples`)."""
        if self.rough.count:  # decided: tier 1 ran
            self.trace_seconds = None
            return False
        return (self.mode == "auto" and self.tier == "interpret"
                and self.trace_seconds is not None and PROMOTE_SECONDS is None
                and self.calls + 1 >= PROMOTE_AFTER and verify_enabled()
                and tier2() is not None
                and self.trace_seconds >= self.budget() * HEAVY_FRACTION * EARLY_MARGIN
                and not self.cached()
                and bool(getattr(exe, "native_ready", lambda: False)()))

    def hot(self) -> bool:
        """Whether tier 1 has run long enough to promote: the time spent reached the
        :meth:`budget` (ski rental), or one call (the fastest run of each role, once
        each ran twice: a tape's first run also faults in its pool's pages, W5's took
        26 ms and later ones 17.5 ms) costs :data:`HEAVY_FRACTION` of it."""
        budget = self.budget()
        t1 = self.rough
        return self.seconds >= budget or (all(t1.has(r, 2) for r in t1.count) and
                                          t1.total(t1.best) >= budget * HEAVY_FRACTION)

    def measure(self) -> None:
        """Keep tier 2 only where it measured faster than tier 1 (:data:`MEASURE`).

        Compared: the fastest of :data:`MEASURE_RUNS` runs of each role in tier 2 (fewer
        where it is already :data:`CLEAR_RATIO` times faster) against its fastest run in
        tier 1, summed over the roles; only runs that no background compile overlapped
        (:attr:`samples`). Tier-1 runs come from before the promotion and from the
        promotion check; where there are fewer than :data:`TRIAL_RUNS` (``mode="compile"``:
        none) and the two are not :data:`CLEAR_RATIO` apart, the roles run a trial of
        tier 1 (both tiers give the same results) until there are. Slower or as fast: the
        program goes back to tier 1 for good (:data:`TIER1_SLOWER`); where the tier-1 runs
        from before the promotion decide and tier 2 is not clearly slower, only after
        :data:`CONFIRM_RUNS` runs of tier 2 (a trial decides after its tier-1 runs).
        """
        t1, t2 = self.samples["interpret"], self.samples["compile"]
        with self._lock:
            if self.measured is not None or self.tier != "compile":
                return
            if self._trial is not None:  # tier 1 runs the trial's roles now
                roles = list(self._trial)
                if not all(t1.has(r) for r in roles) or (
                        not all(t1.has(r, TRIAL_RUNS) for r in roles) and
                        not self._clear(roles, True) and not self._clear(roles, False)):
                    return
                self._decide(roles, t1.total(roles), t2.total(roles))
                return
            roles = [r for r in t2.count if r in self._exe]
            if not roles or not all(t2.has(r) for r in roles):
                return
            known = [r for r in roles if t1.has(r)]
            if known and self._clear(known, True):
                self._decide(known, t1.total(known), t2.total(known))
            elif all(t2.has(r, MEASURE_RUNS) for r in roles):
                if known and (all(t1.has(r, TRIAL_RUNS) for r in known) or
                              self._clear(known, False)):
                    if not self._unconfirmed(known):
                        self._decide(known, t1.total(known), t2.total(known))
                    return  # (unconfirmed: tier 2 runs on)
                # too few tier-1 runs to tell (mode="compile": none; a heavy graph: its
                # runs overlapped the compile but one): time a few (the same results)
                self._trial = {}
                for r in roles:
                    self._trial[r] = self._exe[r]
                    self._exe[r] = self._tier1.get(r) or build(self._exe[r].graph, "interpret")

    def _clear(self, roles: list[str], faster: bool) -> bool:
        """Whether tier 2 measured :data:`CLEAR_RATIO` times faster (or slower) than
        tier 1 on ``roles``: no more runs could change the verdict."""
        t1 = self.samples["interpret"].total(roles)
        t2 = self.samples["compile"].total(roles)
        return CLEAR_RATIO * t2 <= t1 if faster else CLEAR_RATIO * t1 <= t2

    def _unconfirmed(self, roles: list[str]) -> bool:
        """Whether tier 2 measured slower on ``roles`` (or as fast), but neither
        :data:`CLEAR_RATIO` slower nor yet :data:`CONFIRM_RUNS` runs: too few to send the
        program back to tier 1 for good."""
        t2 = self.samples["compile"]
        return (t2.total(roles) >= self.samples["interpret"].total(roles)
                and not self._clear(roles, False)
                and not all(t2.has(r, CONFIRM_RUNS) for r in roles))

    def _decide(self, roles: list[str], tier1_s: float, tier2_s: float) -> None:
        """The measurement's verdict (called holding the lock)."""
        kept = tier2_s < tier1_s
        self.measured = {"tier1_s": tier1_s, "tier2_s": tier2_s, "kept": kept,
                         "roles": roles}
        trial, self._trial = self._trial, None
        if kept:
            if trial:
                self._exe.update(trial)
            return
        self.tier = TIER1_SLOWER
        for r, exe in list(self._exe.items()):
            if run_tier(exe) != "interpret":
                self._exe[r] = self._tier1.get(r) or build(exe.graph, "interpret")

    # ------------------------------------------------------------------ promotion
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
        with compiling():
            self._promote_now()

    def _promote_now(self) -> None:
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
                old = self._exe.get(role)
                if old is not None and run_tier(old) == "interpret":
                    self._tier1[role] = old  # kept for the way back (measured slower)
                    if isinstance(new, Checked) and new.fallback is None:
                        new.fallback = old  # the check runs the tape that ran (warm)
                self._exe[role] = self.adopt(role, new)
            self.tier = "compile"


#: every live program (:func:`unsettled`)
_LIVE: weakref.WeakSet = weakref.WeakSet()


def unsettled() -> int:
    """How many live programs a later run may still move to another tier
    (:meth:`Program.settled`): a graph of ``mode="auto"`` still in tier 1, or tier 2 not
    yet measured. A benchmark's steady state starts when none is."""
    return sum(not p.settled() for p in list(_LIVE))


# ------------------------------------------------------------------ promotion threads
#: promotion threads started by :meth:`Program.promote` (see :func:`wait_for_promotions`)
PROMOTIONS: list[threading.Thread] = []
#: set at interpreter exit: promotions stop (a compile in flight is abandoned)
_EXITING = False
#: how long exit waits for promotion threads to stop at a compiler-pass boundary
EXIT_GRACE_S = 1.0
_IN_PROMOTION = threading.local()
_HOOKED = False


def build_interpreter() -> threading.Thread:
    """Compile the tier-1 interpreter for its pending pool types
    (:data:`nbgrad.jit.tier1.interpreter.PENDING`) in a daemon thread, one at a time;
    exit abandons it like a promotion. If it fails, tapes compile on their next run
    (which raises the error)."""
    global _INTERPRETER_BUILD
    thread = _INTERPRETER_BUILD
    if thread is not None and thread.is_alive():
        return thread
    _install_exit_hook()

    def work() -> None:
        _IN_PROMOTION.active = True
        try:
            with compiling():
                interpreter.build_pending()
        except Exception:
            if not _EXITING:
                interpreter.PENDING.clear()
                interpreter.BACKGROUND = False

    thread = threading.Thread(target=work, name="nbgrad-jit-tier1", daemon=True)
    _INTERPRETER_BUILD = thread
    PROMOTIONS.append(thread)
    thread.start()
    return thread


_INTERPRETER_BUILD: threading.Thread | None = None

#: [background compiles in flight, compiles started or ended so far] (see :func:`quiet`)
_COMPILES = [0, 0]
_COMPILES_LOCK = threading.Lock()


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Marks a background compile (a promotion, an interpreter build) while inside."""
    with _COMPILES_LOCK:
        _COMPILES[0] += 1
        _COMPILES[1] += 1
    try:
        yield
    finally:
        with _COMPILES_LOCK:
            _COMPILES[0] -= 1
            _COMPILES[1] += 1


def quiet() -> int | None:
    """None while a background compile runs, else a token that :func:`stayed_quiet`
    compares: a run timed between the two shared the CPU (and the GIL) with no compile."""
    return None if _COMPILES[0] else _COMPILES[1]


def stayed_quiet(token: int | None) -> bool:
    """Whether no background compile ran since :func:`quiet` gave ``token``."""
    return token is not None and _COMPILES[0] == 0 and _COMPILES[1] == token


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
