"""The fuzzer's watchdog (:mod:`nbgrad.testing.fuzz.watchdog`): a program that never
finishes stops the run with its seed and every thread's stack, instead of hanging CI
(a digamma backward once looped forever on -inf)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import time
    from nbgrad.testing.fuzz import differential, watchdog
    from nbgrad.testing.fuzz.generate import generate

    watchdog.LIMIT_S = 1.0
    def stuck(p):  # stands for a kernel that never returns
        time.sleep(20)
    differential.eager_reference = stuck
    differential.check_programs([generate(4242, 2)], ("eager",))
    print("returned")
""")


def test_a_program_that_never_finishes_stops_the_run_with_its_seed():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 70, (proc.returncode, proc.stderr[-2000:])
    assert "returned" not in proc.stdout
    assert "seed(s) 4242 did not finish in 1 s" in proc.stderr, proc.stderr[-2000:]
    assert "--seed 4242 --max-programs 1" in proc.stderr
    assert "in stuck" in proc.stderr  # the stacks show where it hangs


def test_the_watchdog_is_cancelled_when_the_block_ends():
    import threading

    from nbgrad.testing.fuzz import watchdog

    before = threading.active_count()
    with watchdog.watching([1], "the program"):
        pass
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)
                and t.is_alive() and not t.finished.is_set()]
    assert threading.active_count() <= before + 1
