"""Fuzzing many programs: a list of seeds (the test suite) or a time budget
(``nbgrad fuzz``), with progress and a summary."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .differential import BATCH, EXECUTORS, Mismatch, check_programs
from .generate import generate
from .shrink import shrink

#: how many failures of one run get shrunk (:func:`.shrink.shrink`) before reporting
SHRINK_LIMIT = 3


@dataclass
class Summary:
    """What a fuzz run did: graphs tried per executor, rejected programs, failures."""

    seeds: list[int] = field(default_factory=list)
    tried: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    failures: list[Mismatch] = field(default_factory=list)
    seconds: float = 0.0
    clock: dict[str, float] = field(default_factory=dict)
    shrinks: int = 0

    def add(self, seeds: Sequence[int], stats: dict, found: list[Mismatch]) -> None:
        self.seeds += list(seeds)
        for k, v in stats.get("tried", {}).items():
            self.tried[k] = self.tried.get(k, 0) + v
        self.rejected += stats.get("rejected", 0)
        for k, v in stats.get("seconds", {}).items():
            self.clock[k] = self.clock.get(k, 0.0) + v
        seen = {(m.program.seed, m.executor) for m in self.failures}
        for m in found:  # one failure per program and executor
            if (m.program.seed, m.executor) not in seen:
                seen.add((m.program.seed, m.executor))
                self.failures.append(m)

    def text(self, reproducers: bool = True) -> str:
        """The summary (and each failure's reproducer) as text."""
        span = f"seeds {min(self.seeds)}-{max(self.seeds)}" if self.seeds else "no seeds"
        tried = ", ".join(f"{k} {v}" for k, v in self.tried.items())
        lines = [f"{len(self.seeds)} programs ({span}) in {self.seconds:.0f} s; graphs "
                 f"checked per executor: {tried}; {self.rejected} rejected (eager raised)",
                 f"{len(self.failures)} failure(s)"]
        if self.clock:
            lines.insert(1, "time in tier 2: " + ", ".join(f"{k} {v:.0f} s"
                                                           for k, v in self.clock.items()))
        for k, m in enumerate(self.failures, 1):
            lines += ["", f"--- failure {k}"]
            lines += [m.report() if reproducers else m.headline()]
        return "\n".join(lines)


def run_seeds(seeds: Iterable[int], executors: Sequence[str] = EXECUTORS,
              max_steps: int = 4, batch: int = BATCH,
              progress: Callable[[Summary], None] | None = None) -> Summary:
    """Generate and check the program of each seed, ``2 * batch`` seeds at a time."""
    summary = Summary()
    start = time.perf_counter()
    seeds = list(seeds)
    for k in range(0, len(seeds), 2 * batch):
        _chunk(summary, seeds[k:k + 2 * batch], executors, max_steps, batch)
        summary.seconds = time.perf_counter() - start
        if progress is not None:
            progress(summary)
    return summary


def run_for(minutes: float, first_seed: int = 0, executors: Sequence[str] = EXECUTORS,
            max_steps: int = 4, batch: int = BATCH, max_programs: int | None = None,
            progress: Callable[[Summary], None] | None = None) -> Summary:
    """Check programs of consecutive seeds from ``first_seed`` until ``minutes`` have
    passed (or ``max_programs`` were checked)."""
    summary = Summary()
    start = time.perf_counter()
    seed = first_seed
    while time.perf_counter() - start < 60 * minutes:
        n = 2 * batch if max_programs is None else min(2 * batch,
                                                         max_programs - len(summary.seeds))
        if n <= 0:
            break
        _chunk(summary, range(seed, seed + n), executors, max_steps, batch)
        seed += n
        summary.seconds = time.perf_counter() - start
        if progress is not None:
            progress(summary)
    return summary


def _chunk(summary: Summary, seeds: Iterable[int], executors: Sequence[str], max_steps: int,
           batch: int) -> None:
    seeds = list(seeds)
    programs = [generate(s, max_steps) for s in seeds]
    stats: dict = {}
    found = check_programs(programs, executors, batch, stats)
    seen = {(m.program.seed, m.executor) for m in summary.failures}
    out = []
    for m in found:  # shrink the first few (each try may compile with tier 2)
        key = (m.program.seed, m.executor)
        if summary.shrinks < SHRINK_LIMIT and not m.batch and key not in seen:
            seen.add(key)
            m = shrink(m)
            summary.shrinks += 1
        out.append(m)
    summary.add(seeds, stats, out)
