"""The tier policy of nbgrad.jit.program with injected timings (no timed assertions).

Promotion by time spent in tier 1 (a slow graph at once, a fast one once its runs have
cost the expected compile), runs timed without compile time, and the measurement after
promotion: tier 2 stays only where it measured faster, in ``mode="auto"`` and in
``mode="compile"``. Timings come from a fake clock that the executables advance.
"""

import numpy as np
import pytest
from numba.core import event
from test_jit_program import _graph

import nbgrad as nb
from nbgrad.jit import program, timing
from nbgrad.jit.tier1.tape import TapeExecutable
from nbgrad.jit.tier2 import codegen
from nbgrad.jit.tier2.codegen import CompiledGraph


@pytest.fixture
def estimate(monkeypatch):
    """Every graph is expected to take 1 s to compile (none is in the cache folder)."""
    monkeypatch.setattr(program, "PROMOTE_SECONDS", None)
    monkeypatch.setattr(program, "PROMOTE_AFTER", 1)
    monkeypatch.setattr(program, "COMPILE_ESTIMATE", (1.0, 0.0))
    monkeypatch.setattr(program, "HEAVY_FRACTION", 1 / 40)
    monkeypatch.setattr(codegen, "generated_before", lambda g: False)
    started = []
    monkeypatch.setattr(program.Program, "promote", lambda self: started.append(self))
    return started


def _program(graph_of, mode="auto"):
    prog = program.Program(mode, False, "test.f")
    prog.executable("main", graph_of)
    return prog


def test_unsettled_counts_the_live_programs_that_may_change_tier(rng, estimate):
    """``program.unsettled()`` (the benchmarks' steady state waits for 0): a graph of
    ``mode="auto"`` in tier 1 may still be promoted; one of ``mode="interpret"`` may not;
    a program that is gone is not counted."""
    import gc

    gc.collect()
    before = program.unsettled()
    auto = _program(_graph(rng)[0])
    fixed = _program(_graph(rng)[0], mode="interpret")
    assert not auto.settled() and fixed.settled()
    assert program.unsettled() == before + 1
    del auto
    gc.collect()
    assert program.unsettled() == before


def test_a_slow_graph_is_promoted_after_its_second_call_in_tier1(rng, estimate):
    prog = _program(_graph(rng)[0])
    prog.called(0.05)  # 50 ms: over 1/40 of the 1 s compile, but a first run
    assert estimate == [] and prog.tier == "interpret"
    prog.called(0.05)
    assert estimate == [prog] and prog.tier == program.PROMOTING


def test_a_slow_first_run_of_a_fast_graph_does_not_promote_it(rng, estimate):
    """A tape's first run also faults in its pool (W5: 26 ms, then 17.5 ms): the
    fastest of two runs decides whether a call is heavy."""
    prog = _program(_graph(rng)[0])
    prog.called(0.026)  # over 1/40 of the 1 s compile
    prog.called(0.0175)
    prog.called(0.0175)
    assert estimate == [] and prog.tier == "interpret"


def test_a_fast_graph_is_promoted_once_its_runs_cost_the_compile(rng, estimate):
    graph_of, _ = _graph(rng)
    prog = _program(graph_of)
    for _ in range(99):  # 10 ms calls: under 1/40 of the compile, so by time spent
        prog.called(0.01)
    assert estimate == [] and prog.tier == "interpret"
    prog.called(0.01)  # 1 s spent
    assert estimate == [prog]

    tiny = _program(graph_of)
    for _ in range(9_000):  # 0.1 ms calls
        tiny.called(1e-4)
    tiny.called(0.05, count=False)  # its backward runs count too (not as calls)
    assert tiny.calls == 9_000 and estimate == [prog]
    for _ in range(600):  # 1 s spent (and some rounding)
        tiny.called(1e-4)
    assert estimate == [prog, tiny]

    compiled = _program(graph_of, "compile")  # only mode="auto" promotes
    compiled.called(10.0)
    assert estimate == [prog, tiny]


def test_a_graph_in_the_cache_folder_is_promoted_sooner(rng, estimate, monkeypatch):
    graph_of, _ = _graph(rng)
    monkeypatch.setattr(codegen, "generated_before", lambda g: True)
    prog = _program(graph_of)
    assert prog.budget() == program.COMPILE_CACHED_S
    prog.called(program.COMPILE_CACHED_S * program.HEAVY_FRACTION * 2)
    prog.called(program.COMPILE_CACHED_S * program.HEAVY_FRACTION * 2)
    assert estimate == [prog]


def test_compile_time_inside_a_run_is_not_tier1_time(rng, monkeypatch):
    """A run that compiles (the first after install loads the interpreter) is timed
    without the compile, so it does not promote a fast graph."""
    graph_of, arrays = _graph(rng)
    now = [0.0]
    monkeypatch.setattr(timing, "clock", lambda: now[0])
    real = TapeExecutable.run

    def run(self, arrays):
        now[0] += 0.001  # the run itself
        event.start_event("numba:compiler_lock")  # ... and a compile inside it
        now[0] += 3.0
        event.end_event("numba:compiler_lock")
        return real(self, arrays)

    monkeypatch.setattr(TapeExecutable, "run", run)
    prog = program.Program("auto", False, "test.f")
    prog.run("main", graph_of, arrays)
    assert prog.seconds == pytest.approx(0.001)
    assert prog.samples["interpret"].best["main"] == pytest.approx(0.001)


# ------------------------------------------------------------------ the measurement
@pytest.fixture
def fake_times(monkeypatch):
    """Tier-1 and tier-2 runs advance a fake clock by the seconds set in ``times``;
    ``runs`` counts the runs of each tier."""
    now = [0.0]
    times = {"interpret": 0.001, "compile": 0.001}
    runs = {"interpret": 0, "compile": 0}
    monkeypatch.setattr(timing, "clock", lambda: now[0])
    monkeypatch.setattr(program, "MEASURE", True)
    for cls, tier in ((TapeExecutable, "interpret"), (CompiledGraph, "compile")):
        def run(self, arrays, _real=cls.run, _tier=tier):
            now[0] += times[_tier]
            runs[_tier] += 1
            return _real(self, arrays)
        monkeypatch.setattr(cls, "run", run)
    return times, runs


def _f(x):
    return (nb.sin(x) * nb.exp(-x * x) + nb.tanh(x)).sum()


def _calls(f, x, n):
    want_v, want_g = nb.value_and_grad(_f)(x)
    for _ in range(n):
        v, g = f(x)
        np.testing.assert_allclose(v.numpy(), want_v.numpy(), rtol=1e-12)
        np.testing.assert_allclose(g.numpy(), want_g.numpy(), rtol=1e-12)


def test_a_close_slower_measurement_is_confirmed_before_tier1_for_good(fake_times,
                                                                      monkeypatch):
    """Tier 2 measured a little slower (not CLEAR_RATIO) after MEASURE_RUNS runs goes on
    until CONFIRM_RUNS before the program goes back to tier 1 for good: noise in three
    runs must not decide."""
    times, runs = fake_times
    times["compile"] = 0.0012  # 1.2x tier 1's time
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    monkeypatch.setattr(program, "PROMOTE_AFTER", program.TRIAL_RUNS)
    x = nb.tensor(np.linspace(-1.0, 2.5, 64))
    f = nb.jit(nb.value_and_grad(_f))
    # the trace, then timed calls in tier 1 (enough that no trial of tier 1 is needed)
    _calls(f, x, 1 + program.TRIAL_RUNS)
    assert program.wait_for_promotions(timeout=240)
    (entry,) = f._cache.values()
    prog = entry.program
    assert prog.samples["interpret"].has("main", program.TRIAL_RUNS)
    _calls(f, x, 1 + program.MEASURE_RUNS)  # the first run of tier 2 is no sample
    assert prog.measured is None and entry.tier == "compile"
    n2 = runs["compile"]
    _calls(f, x, program.CONFIRM_RUNS - program.MEASURE_RUNS)
    assert runs["compile"] == n2 + program.CONFIRM_RUNS - program.MEASURE_RUNS
    assert prog.measured is not None and not prog.measured["kept"]
    n2 = runs["compile"]
    _calls(f, x, 2)
    assert entry.tier == program.TIER1_SLOWER and runs["compile"] == n2


@pytest.mark.parametrize("slower", [True, False])
def test_auto_keeps_tier2_only_where_it_measured_faster(fake_times, monkeypatch, slower):
    times, runs = fake_times
    times["compile"] = 0.010 if slower else 0.0001
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    monkeypatch.setattr(program, "PROMOTE_AFTER", 1)
    x = nb.tensor(np.linspace(-1.0, 2.5, 64))
    f = nb.jit(nb.value_and_grad(_f))
    _calls(f, x, 2)  # the trace, then one call in tier 1 that promotes
    assert program.wait_for_promotions(timeout=240)
    (entry,) = f._cache.values()
    assert entry.tier == "compile"
    _calls(f, x, 1 + program.MEASURE_RUNS)  # the first run of tier 2 is no sample
    prog = entry.program
    assert prog.measured is not None and prog.measured["kept"] is not slower
    n2 = runs["compile"]
    _calls(f, x, 3)  # correct results in the tier the measurement chose
    if slower:
        assert entry.tier == program.TIER1_SLOWER and runs["compile"] == n2
        assert isinstance(prog.executables()["main"], TapeExecutable)
    else:
        assert entry.tier == "compile" and runs["compile"] == n2 + 3


@pytest.mark.parametrize("slower", [True, False])
def test_compile_mode_times_tier1_and_keeps_the_faster(fake_times, promotion_check, slower):
    times, runs = fake_times
    times["compile"] = 0.010 if slower else 0.0001
    x = nb.tensor(np.linspace(-1.0, 2.5, 64))
    f = nb.jit(nb.value_and_grad(_f), mode="compile")
    # the trace; the checked first run; the first run of tier 2; its timed runs; a trial
    # of tier 1 (stopped early where tier 1 is clearly slower)
    _calls(f, x, 3 + program.MEASURE_RUNS + program.TRIAL_RUNS)
    (entry,) = f._cache.values()
    prog = entry.program
    assert prog.measured is not None and prog.measured["kept"] is not slower
    n1, n2 = runs["interpret"], runs["compile"]
    _calls(f, x, 3)
    if slower:
        assert entry.tier == program.TIER1_SLOWER
        assert runs["compile"] == n2 and runs["interpret"] == n1 + 3
    else:
        assert entry.tier == "compile"
        assert runs["compile"] == n2 + 3 and runs["interpret"] == n1
        assert isinstance(prog.executables()["main"], CompiledGraph)


def test_no_measuring_when_switched_off(fake_times, monkeypatch):
    times, _ = fake_times
    times["compile"] = 0.010
    monkeypatch.setattr(program, "MEASURE", False)
    x = nb.tensor(np.linspace(-1.0, 2.5, 64))
    f = nb.jit(nb.value_and_grad(_f), mode="compile")
    _calls(f, x, 2 + program.MEASURE_RUNS + program.TRIAL_RUNS + 2)
    (entry,) = f._cache.values()
    assert entry.tier == "compile" and entry.program.measured is None


def test_the_call_after_promoting_cached_code_waits_for_it_boundedly(rng, estimate,
                                                                    monkeypatch):
    """Loading code from the cache folder takes less than the tier-1 call it saves: the
    next call waits for it, at most half a tier-1 call (and QUICK_WAIT_S), once."""
    graph_of, arrays = _graph(rng)
    waits = []

    class Thread:
        def join(self, timeout=None):
            waits.append(timeout)

    monkeypatch.setattr(program.Program, "promote", lambda self: Thread())
    monkeypatch.setattr(codegen, "generated_before", lambda g: True)
    prog = _program(graph_of)
    prog.called(0.1)
    prog.called(0.1)  # heavy from its second run
    assert prog.tier == program.PROMOTING and waits == []
    prog.run("main", graph_of, arrays)
    prog.run("main", graph_of, arrays)
    assert waits == [min(program.QUICK_WAIT_S, 0.05)]

    monkeypatch.setattr(codegen, "generated_before", lambda g: False)  # a real compile
    other = _program(graph_of)
    other.called(0.1)
    other.called(0.1)
    other.run("main", graph_of, arrays)
    assert other.tier == program.PROMOTING and len(waits) == 1



# ------------------------------------------------------------------ honest samples
def test_runs_beside_a_background_compile_are_no_samples(rng, monkeypatch):
    """A run that shared the machine with a background compile (in flight at its start,
    or started or ended during it) would make its tier look slower: not a sample."""
    graph_of, arrays = _graph(rng)
    prog = program.Program("auto", False, "test.f")
    with program.compiling():
        prog.run("main", graph_of, arrays)
    real = TapeExecutable.run

    def run(self, arrays):  # a compile starts and ends while this run is timed
        with program.compiling():
            pass
        return real(self, arrays)

    monkeypatch.setattr(TapeExecutable, "run", run)
    prog.run("main", graph_of, arrays)
    assert prog.rough.count["main"] == 2 and not prog.samples["interpret"].has("main")
    monkeypatch.setattr(TapeExecutable, "run", real)
    prog.run("main", graph_of, arrays)
    assert prog.samples["interpret"].count["main"] == 1


def test_the_check_runs_the_programs_tape_and_is_a_tier1_sample(rng, fake_times,
                                                                promotion_check,
                                                                monkeypatch):
    """The promotion check runs the tier-1 tape the program ran (its pool warm), builds
    no other, and its timed tier-1 run counts (the swap waits for the compile)."""
    from nbgrad.jit import verify

    graph_of, arrays = _graph(rng)
    prog = program.Program("auto", False, "test.f")
    prog.run("main", graph_of, arrays)
    tape = prog.executables()["main"]
    built = []
    monkeypatch.setattr(verify, "_tier1", lambda g: built.append(g))
    prog.promote().join(240)
    checked = prog.executables()["main"]
    assert isinstance(checked, verify.Checked) and checked.fallback is tape
    prog.run("main", graph_of, arrays)  # the check
    assert checked.verdict is True and built == []
    assert prog.samples["interpret"].count["main"] == 2
    assert prog.samples["interpret"].best["main"] == pytest.approx(0.001)


def test_a_heavy_trace_promotes_before_the_first_tier1_run(rng, estimate, promotion_check):
    """A trace that cost EARLY_MARGIN times a heavy call (1/40 of the 1 s estimate) at
    1 ms or more per op starts the promotion before the first tier-1 run; a trace whose
    time is the tracer's own (many small ops) or light does not."""
    graph_of, arrays = _graph(rng)
    heavy = program.HEAVY_FRACTION * program.EARLY_MARGIN
    for seconds, nodes, early in ((1.5 * heavy, 10, True), (1.5 * heavy, 1000, False),
                                  (0.5 * heavy, 10, False)):
        prog = program.Program("auto", False, "test.f")
        prog.traced(seconds, nodes)
        prog.run("main", graph_of, arrays)
        assert (estimate[-1:] == [prog]) is early
        assert prog.rough.count == {"main": 1}


@pytest.mark.parametrize("ratio, trial", [(0.8, True), (0.1, False), (3.0, False)])
def test_one_tier1_sample_decides_only_when_clear(fake_times, monkeypatch, ratio, trial):
    """Tier 1 timed once (its other runs overlapped the compile): tier 2 less than
    CLEAR_RATIO apart from it waits for a trial of tier 1 (TRIAL_RUNS runs)."""
    times, runs = fake_times
    times["compile"] = ratio * times["interpret"]
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    monkeypatch.setattr(program, "PROMOTE_AFTER", 1)
    x = nb.tensor(np.linspace(-1.0, 2.5, 64))
    f = nb.jit(nb.value_and_grad(_f))
    _calls(f, x, 2)  # the trace, then one (timed) call in tier 1 that promotes
    assert program.wait_for_promotions(timeout=240)
    (entry,) = f._cache.values()
    _calls(f, x, 1 + program.MEASURE_RUNS)  # the first run of tier 2 is no sample
    prog = entry.program
    assert (prog.measured is None) is trial
    n1, n2 = runs["interpret"], runs["compile"]
    _calls(f, x, 1)  # a trial run of tier 1, or the tier the measurement chose
    assert prog.measured is not None and prog.measured["kept"] is (ratio < 1)
    assert runs["interpret"] == n1 + (trial or ratio > 1) and runs["compile"] == n2 + (
        not trial and ratio < 1)


def test_a_large_pool_is_made_afresh_with_its_constants(rng, monkeypatch):
    """Pools of POOL_AFRESH_BYTES or more are zeroed memory with the constants written
    in, not a copy of the template: the same values."""
    from nbgrad.jit.tier1 import tape as tape_module

    monkeypatch.setattr(tape_module, "POOL_AFRESH_BYTES", 0)
    x = rng.standard_normal((3, 4))
    c = rng.standard_normal(4)
    f = nb.jit(lambda t: (t * nb.tensor(c) + 2.5).exp().sum(0), mode="interpret")
    for _ in range(2):
        np.testing.assert_allclose(f(nb.tensor(x)).numpy(), np.exp(x * c + 2.5).sum(0),
                                   rtol=1e-12)
    (entry,) = f._cache.values()
    exe = entry.program.executables()["main"]
    np.testing.assert_array_equal(exe._new_pool(), exe.template)


# ------------------------------------------------------------------ settled programs
def test_runs_are_timed_only_while_they_can_change_the_tier(rng, monkeypatch):
    """A program that no run can move (tier 1 for good, a mode that never promotes, tier
    2 measured) runs its executable untimed; the others are timed for the policy."""
    graph_of, arrays = _graph(rng)
    clock = []
    monkeypatch.setattr(timing, "clock", lambda: clock.append(1) or 0.0)
    auto = program.Program("auto", False, "test.f")
    want = auto.run("main", graph_of, arrays)
    assert clock and not auto.settled() and auto.calls == 1  # timed: it may be promoted
    for tier in (program.TIER1_SLOWER, program.TIER1_FINAL, program.TIER1_MISMATCH):
        auto.tier = tier
        clock.clear()
        got = auto.run("main", graph_of, arrays)
        assert not clock and auto.settled()
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    fixed = program.Program("interpret", False, "test.f")
    fixed.run("main", graph_of, arrays)
    fixed.run("bwd", graph_of, arrays, count=False)
    assert not clock and fixed.settled() and fixed.calls == 1
    compiled = program.Program("compile", False, "test.f")
    compiled.measuring = True
    assert not compiled.settled()  # its runs are the measurement's samples
    compiled.measured = {"kept": True}
    assert compiled.settled()
    compiled.tier = program.PROMOTING
    assert not compiled.settled()
