"""Timing of jitted runs, for the tier policy of :mod:`nbgrad.jit.program`.

A run's time leaves out what the thread spent in Numba's compiler (compiling, loading
cached code, or waiting for the compiler lock while a promotion compiles): the first
call after install loads the interpreter and kernels, which says nothing about what the
graph costs. :func:`compile_seconds` is that time so far in this thread, counted by a
Numba event listener (:func:`install`). :data:`clock` is the clock of both (tests
replace it with a fake one). :class:`Samples` keeps, per role, how many runs of one tier
were timed and the fastest (the fastest run is the least disturbed by other load).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from numba.core import event

T = TypeVar("T")

#: the clock runs are timed with (seconds; a test may replace it)
clock = time.perf_counter

_LOCAL = threading.local()
_INSTALLED = False


class _CompileClock(event.Listener):
    """Adds each outermost hold of (or wait for) Numba's compiler lock to its thread's
    total (the lock is re-entrant: nested holds are counted once)."""

    def on_start(self, ev) -> None:
        depth = getattr(_LOCAL, "depth", 0)
        if depth == 0:
            _LOCAL.start = clock()
        _LOCAL.depth = depth + 1

    def on_end(self, ev) -> None:
        depth = getattr(_LOCAL, "depth", 0)
        if depth <= 0:  # the listener was installed while this thread compiled
            return
        _LOCAL.depth = depth - 1
        if depth == 1:
            _LOCAL.total = getattr(_LOCAL, "total", 0.0) + clock() - _LOCAL.start


def install() -> None:
    """Once: start counting compile time (:func:`compile_seconds`)."""
    global _INSTALLED
    if not _INSTALLED:
        _INSTALLED = True
        event.register("numba:compiler_lock", _CompileClock())


def compile_seconds() -> float:
    """Seconds this thread has spent in Numba's compiler since :func:`install`."""
    total = getattr(_LOCAL, "total", 0.0)
    if getattr(_LOCAL, "depth", 0):  # inside a compile now
        total += clock() - _LOCAL.start
    return total


def timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``fn(*args)`` and the seconds it took, without this thread's compile time."""
    install()
    compiling, start = compile_seconds(), clock()
    out = fn(*args)
    return out, max(clock() - start - (compile_seconds() - compiling), 0.0)


class Samples:
    """The timed runs of one tier: per role, how many and the fastest (seconds)."""

    __slots__ = ("count", "best")

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.best: dict[str, float] = {}

    def add(self, role: str, seconds: float) -> None:
        self.count[role] = self.count.get(role, 0) + 1
        self.best[role] = min(self.best.get(role, seconds), seconds)

    def has(self, role: str, runs: int = 1) -> bool:
        return self.count.get(role, 0) >= runs

    def total(self, roles) -> float:
        """The fastest run of each of ``roles``, summed (one call's time)."""
        return sum(self.best[r] for r in roles)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{r}: {self.count[r]} runs, best {self.best[r] * 1e3:.3g} ms"
                               for r in self.count) + "}"
