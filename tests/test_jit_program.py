"""nbgrad.jit.program: tier choice, promotion and fallback through Program's public methods."""

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.jit import program
from nbgrad.jit.tier1.tape import TapeExecutable
from nbgrad.jit.tier2 import codegen


def _graph(rng):
    x = nb.tensor(rng.standard_normal(6))
    jf = nb.jit(lambda t: (nb.sin(t) * 2.0 + t).sum(), mode="interpret")
    jf(x)
    (entry,) = jf._cache.values()
    return (lambda role: entry.graph), [x.numpy()]


@pytest.mark.parametrize("mode, tier", [("auto", "interpret"), ("interpret", "interpret"),
                                        ("compile", "compile"), ("reference", "reference")])
def test_initial_tier_follows_the_mode(mode, tier):
    assert program.initial_tier(mode, False) == tier
    assert program.initial_tier(mode, True) == ("reference" if mode == "reference" else "cuda")


def test_program_promotes_after_enough_calls_and_swaps_in_tier2(rng, monkeypatch):
    graph_of, arrays = _graph(rng)
    monkeypatch.setattr(program, "PROMOTE_AFTER", 3)
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    prog = program.Program("auto", False, "test.f")
    expected = prog.executable("main", graph_of).run(arrays)
    assert isinstance(prog.executable("main", graph_of), TapeExecutable)
    for _ in range(2):
        prog.called(0.0)
    assert prog.tier == "interpret"
    prog.called(0.0)  # the third call starts the promotion
    assert prog.tier in (program.PROMOTING, "compile")
    assert program.wait_for_promotions(timeout=240)
    assert prog.tier == "compile"
    exe = prog.executable("main", graph_of)
    assert exe.tier == "compile"
    np.testing.assert_allclose(exe.run(arrays)[0], expected[0], rtol=1e-12)
    assert set(prog.executables()) == {"main"}


def test_program_stays_in_tier1_when_tier2_refuses(rng, monkeypatch):
    graph_of, arrays = _graph(rng)
    monkeypatch.setattr(codegen, "compile_graph",
                        lambda g, **kw: program.build(g, "interpret"))  # refuses: a tape
    prog = program.Program("auto", False, "test.f")
    prog.executable("main", graph_of)
    prog.promote().join(240)
    assert prog.tier == program.TIER1_FINAL
    assert isinstance(prog.executable("main", graph_of), TapeExecutable)
    monkeypatch.setattr(program, "PROMOTE_AFTER", 1)
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    started = len(program.PROMOTIONS)
    prog.called(1.0)  # no second try
    assert prog.tier == program.TIER1_FINAL and len(program.PROMOTIONS) == started
