"""The promotion check run beside the calls: the promotion thread checks the generated
code on a copy of the inputs of a call made while it compiled, before the swap, so that
the first call in tier 2 runs tier 2 alone (nbgrad.jit.program, nbgrad.jit.verify).
Timings come from the fake clock of tests/test_jit_policy.py."""

import numpy as np
import pytest
from test_jit_policy import fake_times  # noqa: F401 - a fixture
from test_jit_program import _graph

from nbgrad.jit import program, verify
from nbgrad.jit.tier1.tape import TapeExecutable
from nbgrad.jit.tier2 import codegen
from nbgrad.jit.tier2.codegen import CompiledGraph


@pytest.fixture
def by_hand(monkeypatch):
    """Promotions start no thread: the test runs the thread's work (``_promote``)."""
    monkeypatch.setattr(program.Program, "promote", lambda self: None)


@pytest.fixture
def seen(monkeypatch):
    """Each check: (run beside the calls?, a copy of the inputs it was given)."""
    calls = []
    real = verify.Checked._check

    def check(self, arrays, beside=False):
        calls.append((beside, [np.array(a, copy=True) for a in arrays]))
        return real(self, arrays, beside)

    monkeypatch.setattr(verify.Checked, "_check", check)
    return calls


def _promoting(rng):
    """A program promoting (no thread yet) after a call in tier 1 and one while
    promoting, which leaves a copy of its inputs."""
    graph_of, arrays = _graph(rng)
    prog = program.Program("auto", False, "test.f")
    prog.run("main", graph_of, arrays)
    prog.start_promotion()
    assert prog.tier == program.PROMOTING
    prog.run("main", graph_of, arrays)
    return prog, graph_of, arrays


@pytest.mark.parametrize("ratio, decided", [(0.1, True), (0.8, False)])
def test_the_promotion_checks_a_copy_of_a_calls_inputs_before_the_swap(
        rng, fake_times, promotion_check, by_hand, seen, ratio, decided):  # noqa: F811
    times, runs = fake_times
    times["compile"] = ratio * times["interpret"]
    prog, graph_of, arrays = _promoting(rng)
    copy = prog._check_inputs["main"]
    assert copy[0] is not arrays[0] and np.array_equal(copy[0], arrays[0])
    arrays[0][0] += 1.0  # the caller's array changes after the call: the copy does not
    prog._promote()  # the promotion thread's work: compile, check, swap
    assert [b for b, _ in seen] == [True] and seen[0][1][0][0] == copy[0][0] != arrays[0][0]
    assert prog.tier == "compile" and isinstance(prog.executables()["main"], CompiledGraph)
    # where tier 2 ran CLEAR_RATIO times faster than tier 1 in the check's pair, that is
    # the measurement; else the measurement goes on from the calls (the pair overlapped
    # the calls in tier 1)
    assert (prog.measured is not None) is decided
    if decided:
        assert prog.measured["kept"] and prog.measured["beside"]
        assert prog.measured["tier1_s"] == pytest.approx(times["interpret"])
    n1, n2 = runs["interpret"], runs["compile"]
    want = TapeExecutable.run(prog._tier1["main"], arrays)
    got = prog.run("main", graph_of, arrays)  # the first call after the swap
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    assert runs["interpret"] == n1 + 1 and runs["compile"] == n2 + 1  # (1: ``want``)
    assert len(seen) == 1


def test_code_that_differs_beside_the_calls_leaves_the_program_in_tier1(
        rng, promotion_check, by_hand, monkeypatch, tmp_path):
    monkeypatch.setattr(verify, "reproducer_root", lambda: tmp_path / "promotion-mismatch")
    real = CompiledGraph.run

    def wrong(self, arrays):
        return [o + 1e-3 for o in real(self, arrays)]

    monkeypatch.setattr(CompiledGraph, "run", wrong)
    prog, graph_of, arrays = _promoting(rng)
    with pytest.warns(verify.PromotionMismatchWarning, match="before its first use"):
        prog._promote()
    assert prog.tier == verify.TIER1_MISMATCH
    assert isinstance(prog.executables()["main"], TapeExecutable)
    want = TapeExecutable.run(prog.executables()["main"], arrays)
    np.testing.assert_array_equal(prog.run("main", graph_of, arrays)[0], want[0])


@pytest.mark.parametrize("why", ["switched off", "objmode", "no call while compiling"])
def test_otherwise_the_first_call_checks(rng, promotion_check, by_hand, seen, monkeypatch,
                                         why):
    """Where the check may not run off the caller's thread (generated code with an
    objmode step runs Python: the user's, or a random draw), is switched off
    (``NBGRAD_CHECK_BACKGROUND=0``), or no call left inputs, the first call checks."""
    if why == "switched off":
        monkeypatch.setattr(verify, "BACKGROUND", False)
    if why == "objmode":
        real = codegen.compile_graph

        def with_objmode(graph, **kwargs):
            exe = real(graph, **kwargs)
            monkeypatch.setattr(exe.generated, "fallbacks", [(0, graph.nodes[0])])
            return exe

        monkeypatch.setattr(codegen, "compile_graph", with_objmode)
    if why == "no call while compiling":
        graph_of, arrays = _graph(rng)
        prog = program.Program("auto", False, "test.f")
        prog.run("main", graph_of, arrays)
        prog.start_promotion()
    else:
        prog, graph_of, arrays = _promoting(rng)
    prog._promote()
    assert seen == [] and prog.tier == "compile"
    assert isinstance(prog.executables()["main"], verify.Checked)
    prog.run("main", graph_of, arrays)
    assert [b for b, _ in seen] == [False]
    assert isinstance(prog.executables()["main"], CompiledGraph)  # agreed: swapped in
