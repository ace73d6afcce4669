"""One benchmark row in its own fresh process: ``python -m perf.worker '<json spec>'``.

The parent (``perf.harness``) starts one worker per implementation and workload, with
the thread-pinning environment already set. The worker imports its framework (timed),
builds the inputs and the NumPy reference, builds the step, times the first call,
checks the loss and gradients against the reference, and reports ``ready``. It then
answers the parent's commands, one JSON object per line on stdin, with one JSON line
each on its protocol channel (the original stdout; anything the frameworks print goes
to stderr, which the parent logs):

- ``{"cmd": "calibrate"}``: warm-up calls; picks how many calls make one timed block.
- ``{"cmd": "round", "min_blocks": k, "min_time": s, "max_time": s}``: times blocks.
- ``{"cmd": "finish", "probe": true}``: builds the step again and times its first call
  (a new graph in a warm process), reports peak memory, and exits.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import resource
import sys
import time
import traceback

BLOCK_TARGET_S = 5e-3  # a timed block lasts at least this long (many calls if they are short)
#: how long a worker waits, after its warm-up, for nbgrad.jit promotions still compiling
PROMOTION_WAIT_S = 300.0
#: how long a worker's warm-up goes on for ``nbgrad.jit`` to settle its graphs' tiers
SETTLE_S = 120.0


def _rss_mb() -> float:
    """Current resident set size in MiB (Linux /proc; falls back to the peak)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return _peak_rss_mb()


def _peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def _pin() -> None:
    """Pin this process (and every thread it starts later) to ``PERF_CPUS``, before any
    framework starts a thread."""
    cpus = os.environ.get("PERF_CPUS", "")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def _configure(framework: str) -> None:
    """Framework settings that must follow the import: one thread, float64 where asked."""
    if framework == "torch":
        import torch

        torch.set_num_threads(int(os.environ.get("PERF_THREADS", "1")))
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set
            pass
    elif framework == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_platforms", "cpu")


class Worker:
    """Holds one built step and answers the parent's commands."""

    def __init__(self, spec: dict, send) -> None:
        self.spec = spec
        self.send = send
        self.step = None
        self.calls_per_block = 1

    # -- start-up ----------------------------------------------------------------
    def start(self) -> bool:
        """Import, build, first call, agreement check; sends one status message."""
        from .core import FRAMEWORKS, TOLERANCES, Mismatch, Unavailable

        spec = self.spec
        fw = spec["framework"]
        t0 = time.perf_counter()
        importlib.import_module(FRAMEWORKS[fw])
        import_s = time.perf_counter() - t0
        _configure(fw)

        from .core import as_output, compare
        from .tasks import lookup

        mod = lookup(spec["workload"])
        impl = next(i for i in mod.IMPLS if i.id == spec["impl"])
        self.mod, self.impl = mod, impl
        params = spec["params"]
        inputs = mod.make_inputs(params, spec.get("seed", 0))
        want = mod.reference(inputs, params)
        self.inputs, self.params = inputs, params
        msg: dict = {"import_s": import_s, "base_rss_mb": _rss_mb()}

        t0 = time.perf_counter()
        try:
            step = impl.build(inputs, params)
        except Unavailable as exc:
            self.send({"status": "skipped", "note": str(exc), **msg})
            return False
        msg["setup_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        try:
            if hasattr(mod, "TOTAL"):  # a task: its whole computation holds the first call
                from .tasks.common import time_to_result

                msg.update(time_to_result(mod, step, inputs, params))
            raw = step()
        except Mismatch as exc:
            self.send({"status": "mismatch", "note": str(exc), **msg})
            return False
        except Exception as exc:
            note = impl.skip_when(exc) if impl.skip_when else None
            if note is None and isinstance(exc, NotImplementedError):
                note = f"{impl.label}: not implemented: {exc}"
            if note is None:
                raise
            self.send({"status": "skipped", "note": note, **msg})
            return False
        msg.setdefault("first_call_s", time.perf_counter() - t0)

        got = as_output(raw)
        agreement = compare(got, want)
        tol = TOLERANCES[mod.DTYPE]
        agreement["tol"] = tol
        msg["agreement"] = agreement
        if not agreement["max"] <= tol:
            self.send({"status": "mismatch", "note": agreement.get(
                "problem", f"max relative error {agreement['max']:.3g} > {tol:g}"), **msg})
            return False
        if impl.inspect is not None:
            try:
                msg["info"] = impl.inspect(step)
            except Mismatch as exc:
                self.send({"status": "mismatch", "note": str(exc), **msg})
                return False
        self.step = step
        self.send({"status": "ready", **msg})
        return True

    # -- commands ----------------------------------------------------------------
    def calibrate(self, warmup_time: float = 0.3, warmup_cap: float = 3.0) -> dict:
        """Warm-up calls (at least 5, at least ``warmup_time``), then the block size.

        The warm-up goes on until ``nbgrad.jit`` has settled the tier of every graph
        (:meth:`_settle`), so that timing starts in the steady state: ``settled`` in the
        answer says whether it did within :data:`SETTLE_S`.
        """
        times = self._warm(warmup_time, warmup_cap)
        program = sys.modules.get("nbgrad.jit.program")
        settled = True
        if program is not None:
            settled, times = self._settle(program, times, warmup_time, warmup_cap)
        times.sort()
        call_s = times[len(times) // 2]
        self.calls_per_block = max(1, math.ceil(BLOCK_TARGET_S / max(call_s, 1e-9)))
        return {"call_s": call_s, "calls_per_block": self.calls_per_block,
                "warmup_calls": len(times), "settled": settled}

    def _settle(self, program, times: list[float], warmup_time: float,
                warmup_cap: float) -> tuple[bool, list[float]]:
        """More warm-up until no ``nbgrad.jit`` graph can change tier: ``mode="auto"``
        promotes a graph once its tier-1 calls have cost about its compile (on an empty
        cache W2 needs seconds of calls), a promotion still compiling is waited for (timed
        beside it, the calls would share this worker's one CPU with the compiler), then
        tier 2 is measured. Returns whether that happened within :data:`SETTLE_S`, and the
        last warm-up's call times."""
        unsettled = getattr(program, "unsettled", lambda: 0)  # (an older nbgrad: none)
        deadline = time.perf_counter() + SETTLE_S
        while True:
            compiling = not program.wait_for_promotions(0)
            if compiling:
                program.wait_for_promotions(PROMOTION_WAIT_S)
            elif not unsettled() or time.perf_counter() >= deadline:
                return not unsettled(), times
            times = self._warm(warmup_time, warmup_cap)

    def _warm(self, warmup_time: float, warmup_cap: float) -> list[float]:
        """Calls of the step (at least 5 and ``warmup_time``, or 3 and ``warmup_cap``)."""
        step = self.step
        times = []
        t_start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            times.append(t1 - t0)
            elapsed = t1 - t_start
            if len(times) >= 5 and elapsed >= warmup_time:
                break
            if len(times) >= 3 and elapsed >= warmup_cap:
                break
        return times

    def round(self, min_blocks: int, min_time: float, max_time: float) -> dict:
        """Time blocks until both minimums are met, or ``max_time`` has passed."""
        step, k = self.step, self.calls_per_block
        per_call = []
        t_start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            for _ in range(k):
                step()
            t1 = time.perf_counter()
            per_call.append((t1 - t0) / k)
            elapsed = t1 - t_start
            if len(per_call) >= min_blocks and elapsed >= min_time:
                break
            if elapsed >= max_time:
                break
        return {"times": per_call, "calls_per_block": k}

    def finish(self, probe: bool) -> dict:
        """Optionally time the first call of a freshly built step; report memory."""
        out: dict = {}
        if probe:
            step = self.impl.build(self.inputs, self.params)
            t0 = time.perf_counter()
            step()
            out["first_call_warm_s"] = time.perf_counter() - t0
        out["peak_rss_mb"] = _peak_rss_mb()
        return out


def main() -> int:
    """Run one worker; the spec is the JSON in ``sys.argv[1]``."""
    spec = json.loads(sys.argv[1])
    _pin()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the frameworks print goes to stderr, not the protocol

    def send(msg: dict) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    worker = Worker(spec, send)
    try:
        if not worker.start():
            return 0
        for line in sys.stdin:
            cmd = json.loads(line)
            name = cmd.pop("cmd")
            if name == "calibrate":
                send(worker.calibrate())
            elif name == "round":
                send(worker.round(**cmd))
            elif name == "finish":
                send(worker.finish(**cmd))
                return 0
            else:
                send({"status": "error", "note": f"unknown command {name!r}"})
                return 2
    except Exception as exc:  # report any failure to the parent, with its traceback tail
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        send({"status": "error", "note": f"{type(exc).__name__}: {exc}"[:500],
              "traceback": tb[-4000:]})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
