"""A fuzzed program that never finishes is a failure too (a kernel looping forever on
some input hung a fuzz run once): :func:`watching` stops the run when one program, or
one batch of them, runs longer than :data:`LIMIT_S`, with its seeds, a command that
repeats it and every thread's stack on stderr, instead of leaving CI to its time limit."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

#: seconds one program (for the batched tier-2 executors: one batch) may run before the
#: fuzz run stops (``NBGRAD_FUZZ_WATCHDOG_S``; a cold tier-2 compile takes a minute at most)
LIMIT_S = float(os.environ.get("NBGRAD_FUZZ_WATCHDOG_S", "600"))
#: the exit status of a run the watchdog stopped
EXIT_STATUS = 70


def _stop(seeds: Sequence[int], what: str, limit: float) -> None:
    """Report the hang on stderr and end the process (its threads cannot be interrupted:
    a compiled loop does not return to Python)."""
    sys.stderr.write(
        f"\nnbgrad fuzz: {what} of seed(s) {', '.join(map(str, seeds))} did not finish in "
        f"{limit:g} s: a hang (a kernel looping on some input?). Repeat one program with "
        f"`nbgrad fuzz --seed {seeds[0]} --max-programs 1 --executors <the same>`. "
        f"The stacks of every thread follow.\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(EXIT_STATUS)


@contextmanager
def watching(seeds: Sequence[int], what: str) -> Iterator[None]:
    """Run the block under a watchdog of :data:`LIMIT_S` seconds (a daemon timer, cancelled
    when the block ends: nothing waits for it at exit)."""
    limit = LIMIT_S
    timer = threading.Timer(limit, _stop, (list(seeds), what, limit))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
