"""Nothing blocks interpreter exit: background compiles are abandoned, cleanly.

Each test runs a fresh process and measures the time from its last line of output to
its end. A tier-2 promotion in flight at exit must not be waited for (it takes many
seconds here), and exit must stay clean: status 0, nothing on stderr, no crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

#: seconds a process may take to end after its last output (interpreter teardown, and at
#: most ``program.EXIT_GRACE_S`` for a promotion thread to stop); generous for a loaded
#: 2-core machine, and far below the compile times the tests start
EXIT_BUDGET_S = 6.0

# A graph whose tier-2 compile takes many seconds: distinct ops on shrinking shapes, so
# that nothing fuses into one loop or re-rolls into a loop node. ``SALT`` makes the graph
# new in every run (never in Numba's disk cache).
PROMOTING_SCRIPT = """
import sys, threading, time
import numpy as np
import nbgrad
from nbgrad.jit import program

OPS = ["sin", "tanh", "exp", "cos", "sigmoid", "softplus", "abs", "sqrt"]
rng = np.random.default_rng(0)
plan = [(OPS[rng.integers(len(OPS))], int(rng.integers(1, 3))) for _ in range(int(sys.argv[2]))]
SALT = float(sys.argv[1])

def f(x):
    y, acc = x, 0.0
    for k, (op, s) in enumerate(plan):
        z = getattr(nbgrad, op)(y[s:, s:] * 0.5)
        acc = acc + z.sum(0).mean() * (k + SALT)
        y = (z @ z * 0.01) if k % 3 == 0 else z
    return acc

x = nbgrad.tensor(rng.random((90, 90)), requires_grad=True)
g = nbgrad.jit(f)
program.PROMOTE_SECONDS = 0.0  # promote by calls alone
for _ in range(program.PROMOTE_AFTER + 1):
    g(x).backward()
if sys.argv[3] == "exit":
    assert any(t.is_alive() for t in program.PROMOTIONS), "no promotion in flight"
else:  # finish the promotion: tier 2 runs (checked against tier 1 first)
    assert program.wait_for_promotions(timeout=600)
    g(x).backward()
    (entry,) = g._cache.values()
    assert entry.tier == "compile", entry.tier
print("ready", flush=True)
"""


@pytest.fixture(scope="module", autouse=True)
def cache_folder(tmp_path_factory):
    """One cache folder for this module's processes (their generated code is not kept)."""
    global _CACHE
    _CACHE = str(tmp_path_factory.mktemp("exit-cache"))
    yield
    _CACHE = None


_CACHE: str | None = None


def _run_until_exit(args: list[str], timeout: float = 600):
    """(seconds from the last stdout line to the process's end, return code, stdout,
    stderr)."""
    env = {**os.environ, "NBGRAD_PROMOTION_CHECK": "1"}
    if _CACHE is not None:
        env["NBGRAD_CACHE_DIR"] = _CACHE
    with tempfile.TemporaryFile("w+") as errfile:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=errfile, text=True,
                                env=env)
        lines = []
        last = time.perf_counter()
        for line in proc.stdout:
            lines.append(line)
            last = time.perf_counter()
        try:
            proc.wait(timeout)
        finally:
            proc.kill()
        end = time.perf_counter()
        errfile.seek(0)
        return end - last, proc.returncode, "".join(lines), errfile.read()


def test_exit_abandons_a_promotion_in_flight():
    """The script's promotion compiles for many seconds (over 20 s on a 2-core machine);
    before the fix, exit joined the compile thread and waited for all of it."""
    salt = f"{time.time_ns() % 10**9}.{os.getpid()}"
    wait, rc, out, err = _run_until_exit([sys.executable, "-c", PROMOTING_SCRIPT, salt, "36",
                                          "exit"])
    assert out.strip().endswith("ready"), (out, err)
    assert rc == 0, err
    assert "Traceback" not in err and "Error" not in err and "Warning" not in err, err
    assert wait < EXIT_BUDGET_S, f"exit took {wait:.1f} s after the last output"


def test_an_abandoned_compile_is_done_again_by_the_next_process():
    """What an abandoned promotion leaves in the cache (the generated module; no Numba
    cache entry) does not hurt the next process: it promotes the same graph and runs it."""
    salt = f"{time.time_ns() % 10**9}.{os.getpid()}"
    for how in ("exit", "finish"):
        wait, rc, out, err = _run_until_exit([sys.executable, "-c", PROMOTING_SCRIPT, salt,
                                              "6", how])
        assert rc == 0 and out.strip().endswith("ready"), (how, out, err)
        assert "Traceback" not in err and "Warning" not in err, (how, err)
        assert wait < EXIT_BUDGET_S


SLOW_CHECK = """
import atexit, sys, time
from nbgrad.jit import program
from nbgrad.jit.tier2 import codegen
atexit.register(lambda: print("promotions started:", len(program.PROMOTIONS), file=sys.stderr))

real = codegen.compile_graph

def slow_compile_graph(graph, **kwargs):  # as a big graph would: 60 s to compile
    time.sleep(60)
    return real(graph, **kwargs)

codegen.compile_graph = slow_compile_graph
program.PROMOTE_SECONDS = 0.0  # the check's graphs are fast: promote by calls alone
from nbgrad.cli import main
main(["check", *sys.argv[1:]])
"""


def test_nbgrad_check_exits_right_after_printing():
    """``nbgrad check softmax`` calls its jitted checks many times, which starts
    promotions; here every tier-2 compile takes 60 s. Before the fix exit waited for
    them (about 35 s after ``OK`` for the whole table, with real compiles)."""
    wait, rc, out, err = _run_until_exit([sys.executable, "-c", SLOW_CHECK, "softmax"])
    assert "OK" in out, (out, err)
    assert rc == 0, err
    assert "Traceback" not in err, err
    assert "promotions started: 0" not in err and "promotions started:" in err, err
    assert wait < EXIT_BUDGET_S, f"nbgrad check took {wait:.1f} s to exit after printing"


def test_nbgrad_check_one_op_exits_promptly():
    """The real command on one op (no patched compile)."""
    wait, rc, out, err = _run_until_exit(["nbgrad", "check", "softmax"]
                                         if _has_console_script() else
                                         [sys.executable, "-m", "nbgrad", "check", "softmax"])
    assert "OK" in out, (out, err)
    assert rc == 0, err
    assert wait < EXIT_BUDGET_S, f"nbgrad check took {wait:.1f} s to exit after printing"


def _has_console_script() -> bool:
    import shutil
    return shutil.which("nbgrad") is not None


def test_exit_with_a_finished_promotion_stays_clean():
    """A promotion that finished (and was checked) leaves nothing to do at exit."""
    script = textwrap.dedent("""
        import numpy as np
        import nbgrad
        from nbgrad.jit import program
        f = nbgrad.jit(lambda x: (nbgrad.sin(x) * 2.0).sum())
        x = nbgrad.tensor(np.ones(8), requires_grad=True)
        program.PROMOTE_SECONDS = 0.0  # promote by calls alone
        for _ in range(program.PROMOTE_AFTER + 1):
            f(x).backward()
        assert program.wait_for_promotions(timeout=300)
        f(x).backward()
        (entry,) = f._cache.values()
        assert entry.tier == "compile", entry.tier
        print("done", flush=True)
    """)
    wait, rc, out, err = _run_until_exit([sys.executable, "-c", script])
    assert rc == 0 and "done" in out, err
    assert "Traceback" not in err and "Warning" not in err, err
    assert wait < EXIT_BUDGET_S
