"""Generated functions name their locals so that Numba's frontend gives every load its
own temporary (:mod:`nbgrad.jit.local_names`).

Numba names the temporary of a load ``"$" + name + offset``: ``v14`` loaded at offset
18166 and ``v141`` at 8166 shared one, and a batch of six fuzz programs (seeds
680036-680041) failed to compile in tier 2 with ``Undecided type``. The checks here run
Numba's own flow analysis over the code tier 2 generates for fuzz graphs, and the fuzzer
runs the same check on every graph it compiles.
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from nbgrad import jit
from nbgrad.jit.local_names import (
    digit_extended_locals,
    function_codes,
    shared_temporaries,
    unambiguous_locals,
)
from nbgrad.jit.tier1 import interpreter
from nbgrad.jit.tier2.codegen import generate
from nbgrad.kernels import elementwise
from nbgrad.testing.fuzz import differential as diff
from nbgrad.testing.fuzz.generate import generate as generate_program


def _locals_ending_in_digits(source: str) -> list[str]:
    return sorted(n for c in function_codes(source) for n in c.co_varnames if n[-1].isdigit())


def test_locals_that_end_in_digits_are_renamed_and_the_function_computes_the_same():
    source = textwrap.dedent("""\
        def f(v1, v12, v3_in):
            v1_ = 2.0  # a name the renaming must not take
            v121 = v12 * v1 + v3_in
            for i0 in range(3):
                v121 += i0 * v1_
            return v121, v1_, 'v12 in a string'
        """)
    renamed = unambiguous_locals(source)
    before, after = {}, {}
    exec(source, before)
    exec(renamed, after)
    assert after["f"](1.5, 2.0, 3.0) == before["f"](1.5, 2.0, 3.0)
    assert _locals_ending_in_digits(source) == ["i0", "v1", "v12", "v121"]
    assert _locals_ending_in_digits(renamed) == []
    # the fuzzer's quick check: locals that are other locals plus digits
    assert digit_extended_locals(source) == [("v1", "v12"), ("v12", "v121"), ("v1", "v121")]
    assert digit_extended_locals(renamed) == []
    assert "def f(v1__, v12_, v3_in):" in renamed  # v1_ was taken
    assert "'v12 in a string'" in renamed


def test_objmode_keywords_are_renamed_with_the_locals_they_name():
    source = textwrap.dedent("""\
        def f(a0):
            with objmode(v5='float64[:]', v6_out='float64[:]'):
                v5, v6_out = g(a0)
            return v5, v6_out
        """)
    call = next(n for n in ast.walk(ast.parse(unambiguous_locals(source)))
                if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "objmode")
    assert [k.arg for k in call.keywords] == ["v5_", "v6_out"]


def _two_loads(odd: int, pad: int) -> str:
    """``v12`` loaded at an offset ``o`` and ``v1`` further on, each first in its block;
    ``pad`` statements of 4 bytes and ``odd`` of 6 move ``v1``'s load."""
    return ("def f(c, v1, v12):\n    s = 1.0\n"
            "    if c:\n        t = v12[0]\n    else:\n        t = 0.0\n"
            + "    z = -c\n" * odd + "    u = 1.0\n" * pad
            + "    if c:\n        w = v1[0]\n    else:\n        w = 0.0\n"
            "    return t, u, w\n")


def test_the_check_finds_two_loads_that_share_a_temporary():
    # where v1's offset is "2" followed by v12's, both loads are named "$v12<o>.0"
    sources = [_two_loads(odd, pad) for odd in (0, 1) for pad in range(30, 80)]
    meeting = [s for s in sources if shared_temporaries(s)]
    assert meeting, "no padding made the two loads meet"
    for source in meeting:
        assert list(shared_temporaries(source).values()) == [{"v1", "v12"}]
        assert shared_temporaries(unambiguous_locals(source)) == {}
    assert len(meeting) < len(sources)  # the others load into temporaries of their own


def _tier2_sources(seeds: range) -> list[str]:
    """Tier 2's code for the graphs of one jitted function of the programs of ``seeds``
    (forward and backward), with every region blocked as the fuzzer's ``blocked``
    executor blocks it (the parallel entry is the one that failed)."""
    programs = [generate_program(s, max_steps=6) for s in seeds]
    jitted = jit(diff.batch_function(programs), mode="interpret")
    diff._run(jitted, programs, [diff.inputs(p, 1) for p in programs])
    graphs = [x.graph for e in jitted._cache.values()
              for x in e.program.executables().values()]
    with diff.blocked_everywhere(2):
        return [generate(g).source for g in graphs]


@pytest.mark.parametrize("seeds", [range(680036, 680042), range(5006, 5012),
                                   range(5012, 5018)], ids=str)
def test_tier2_code_of_fuzz_graphs_gives_every_load_its_own_temporary(seeds):
    sources = _tier2_sources(seeds)
    assert any("_parallel(" in s for s in sources)  # blocked: the parallel entry is there
    for source in sources:
        assert _locals_ending_in_digits(source) == []
        assert digit_extended_locals(source) == []
        assert shared_temporaries(source) == {}


def test_the_other_generated_modules_give_every_load_its_own_temporary():
    # the tier-1 interpreter and the eager elementwise kernels are generated too
    assert shared_temporaries(interpreter.source()) == {}
    assert shared_temporaries(elementwise.kernel_source()) == {}
