"""Differential fuzzing of tier 2's blocked loops (:mod:`nbgrad.jit.tier2.blocked`).

Tier 2 writes fused regions of at least ``nbgrad.kernels.parallel.MIN_SIZE`` elements as
loops over blocks, which a parallel entry runs with ``prange``. The fuzzer's graphs are
far smaller, so the ``blocked`` executor lowers the threshold to one element and the
block to a few rows (:func:`~nbgrad.testing.fuzz.differential.blocked_everywhere`): every
region that can be blocked is, with whole and ragged last blocks, and results and
gradients must match eager's. The suite runs with one Numba thread, which compiles only
the serial entry; a child process with two threads checks the ``prange`` entry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nbgrad.kernels import parallel
from nbgrad.testing.fuzz import EXTRA_EXECUTORS
from nbgrad.testing.fuzz import differential as diff_mod
from nbgrad.testing.fuzz.runner import run_seeds

ROOT = Path(__file__).resolve().parents[1]
#: seeds of their own (the main fuzz blocks use 0-311)
SEEDS = range(5000, 5036)


def test_blocked_tier2_agrees_with_eager():
    # batches of two: a graph with a PythonOp (objmode) gets no parallel entry, and a
    # batch of six programs nearly always has one
    summary = run_seeds(SEEDS, ("blocked",))
    assert not summary.failures, summary.text()
    tried = summary.tried
    # most batches really ran blocked loops: a fuzzer that silently stopped blocking
    # would check nothing new
    assert tried.get("blocked on tier 2", 0) >= 0.75 * tried.get("blocked", 1), tried


def test_blocked_everywhere_is_restored_and_documented():
    saved = parallel.MIN_SIZE, parallel.BLOCK
    with diff_mod.blocked_everywhere(3):
        assert (parallel.MIN_SIZE, parallel.BLOCK) == (1, 3)
    assert (parallel.MIN_SIZE, parallel.BLOCK) == saved
    assert EXTRA_EXECUTORS == ("grad", "blocked", "strips", "cuda")


_CHILD = textwrap.dedent('''
    import numba
    from nbgrad.jit.tier2 import codegen
    from nbgrad.testing.fuzz.runner import run_seeds

    assert numba.config.NUMBA_NUM_THREADS == 2
    entries = []
    real = codegen.CompiledGraph.__init__

    def init(self, *args, **kwargs):  # note which entry each compiled graph runs
        real(self, *args, **kwargs)
        entries.append(self.entry is not self.serial_entry)

    codegen.CompiledGraph.__init__ = init
    summary = run_seeds(range({first}, {last}), ("blocked",), batch=2)
    print(summary.text())
    assert not summary.failures
    assert any(entries), "no graph ran its parallel (prange) entry"
    print("ok", sum(entries), "of", len(entries), "graphs ran the prange entry")
''')


@pytest.mark.skipif(not hasattr(os, "fork"), reason="Numba's threads in a child process")
def test_blocked_tier2_on_two_threads_agrees_with_eager():
    env = dict(os.environ, NUMBA_NUM_THREADS="2", PYTHONPATH=str(ROOT))
    code = _CHILD.format(first=5100, last=5110)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=900, cwd=str(ROOT))
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "ok" in out.stdout
