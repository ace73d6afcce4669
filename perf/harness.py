"""The runner: fresh processes, one thread, interleaved rounds, results to JSON and markdown.

For each case (a workload at one size), the runner starts one worker process per
selected implementation, one after another (so import and first-call times are not
measured while another process compiles), lets each check its loss and gradients
against the workload's NumPy reference, then runs ``rounds`` rounds; in each round
the live workers take turns in a shuffled order, each timing blocks of calls. The
statistics pool every block of every round. Workers for frameworks that are not
installed are never started; those rows say so.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import random
import re
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import workloads
from .core import FRAMEWORKS, parse_selection, selected
from .tasks import lookup
from .threads import THREAD_VARS, XLA_ONE_THREAD, XLA_THREADS

PERF_DIR = Path(__file__).resolve().parent
REPO_ROOT = PERF_DIR.parent
RESULTS_DIR = PERF_DIR / "results"
SCHEMA = 1

#: The environment every worker gets: one thread everywhere.
THREAD_ENV = {**dict.fromkeys(THREAD_VARS, "1"), "XLA_FLAGS": XLA_ONE_THREAD,
              "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}


@dataclass
class Settings:
    """How to measure. Totals are per row, pooled over all rounds."""

    rounds: int = 5
    min_samples: int = 20       # timed blocks per row, at least (over all rounds)
    min_time: float = 1.0       # seconds of timed calls per row, at least
    max_round_time: float = 3.0  # stop a row's round after this long (>= 1 block)
    start_timeout: float = 900.0  # import + build + first call of one worker
    command_timeout: float = 600.0
    cold: bool = False          # empty Numba/nbgrad caches: first calls include compiling
    probe: bool = True          # time a new graph's first call in the warm process
    seed: int = 0
    #: thread counts: each implementation runs once per count (rows of counts other
    #: than 1 get the id suffix ``@<n>t``), side by side in the same rounds
    threads: tuple[int, ...] = (1,)


@dataclass
class Case:
    """A workload at one size (named size or explicit parameters)."""

    workload: str
    size: str
    params: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- machine

def machine_info() -> dict:
    """CPU model, core count, memory, OS and host, for the results file."""
    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": platform.processor() or platform.machine(),
    }
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        if m:
            info["cpu_model"] = m.group(1).strip()
        flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
        if flags:
            fl = flags.group(1).split()
            info["simd"] = [f for f in ("avx2", "avx512f", "fma") if f in fl]
    except OSError:
        pass
    try:
        mem = re.search(r"MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text())
        if mem:
            info["mem_gib"] = round(int(mem.group(1)) / 2**20, 1)
    except OSError:
        pass
    return info


def machine_slug(info: dict) -> str:
    """A file-name-safe machine name: CPU model and core count, e.g. ``amd-epyc-2c``."""
    model = re.sub(r"\(r\)|\(tm\)|cpu|processor|@.*$", "", info.get("cpu_model", ""), flags=re.I)
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "unknown"
    return f"{slug[:40]}-{info.get('cpu_count') or 0}c"


def versions() -> dict:
    """Installed versions of everything measured (from package metadata, no imports)."""
    out = {"python": platform.python_version()}
    for dist in ("numpy", "numba", "llvmlite", "nbgrad", "torch", "jax", "jaxlib",
                 "autograd", "scipy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    try:
        rev = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain",
                                "--", "nbgrad", "formulas"],
                               capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            out["nbgrad_git"] = rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def framework_available(framework: str) -> bool:
    """Whether a framework's module can be imported (checked without importing it)."""
    return importlib.util.find_spec(FRAMEWORKS[framework]) is not None


# --------------------------------------------------------------------------- workers

class WorkerError(RuntimeError):
    """A worker died, timed out or broke the protocol."""


class WorkerProc:
    """A running ``perf.worker`` process and its line protocol."""

    def __init__(self, spec: dict, env: dict, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "perf.worker", json.dumps(spec)],
            cwd=str(REPO_ROOT), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, text=True, bufsize=1)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)

    def read(self, timeout: float) -> dict:
        """The next protocol message; raises :class:`WorkerError` on timeout or exit."""
        if not self._sel.select(timeout):
            self.kill()
            raise WorkerError(f"timed out after {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            raise WorkerError(f"worker exited with code {self.proc.returncode}: "
                              f"{self.log_tail(3)}")
        return json.loads(line)

    def request(self, msg: dict, timeout: float) -> dict:
        """Send one command and wait for its answer."""
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise WorkerError(f"worker is gone: {self.log_tail(3)}") from exc
        reply = self.read(timeout)
        if reply.get("status") == "error":
            raise WorkerError(reply.get("note", "error"))
        return reply

    def log_tail(self, n: int = 5) -> str:
        """The last ``n`` non-empty lines the worker wrote to stderr."""
        self._log.flush()
        try:
            lines = [ln for ln in self.log_path.read_text().splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-n:])

    def kill(self) -> None:
        """Stop this worker (only this process, by its own handle)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def close(self) -> None:
        """Wait for a normal exit (killing it if it hangs) and close the log."""
        try:
            if self.proc.stdin and not self.proc.stdin.closed:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        self._sel.close()
        self._log.close()


def worker_cpus(threads: int) -> list[int]:
    """The CPUs a worker of ``threads`` threads is pinned to (the last ones this process
    may use; every worker the same ones: they take turns), or [] where affinity is not
    available. Thread settings alone do not hold every framework to its count: JAX's
    XLA used about 1.9 cores on W2 with its Eigen threads off."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[-threads:] if len(cpus) > threads else []


def worker_env(settings: Settings, scratch: Path, tag: str, threads: int = 1) -> dict:
    """The environment of one worker: thread pinning, repo on the path, caches."""
    env = dict(os.environ)
    env.update(THREAD_ENV)
    if threads != 1:
        for var in THREAD_VARS:
            env[var] = str(threads)
        env["XLA_FLAGS"] = XLA_THREADS  # as many as the CPUs the worker is pinned to
    env["PERF_THREADS"] = str(threads)
    env["PERF_CPUS"] = ",".join(str(c) for c in worker_cpus(threads))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if settings.cold:
        cache = scratch / f"cache-{tag}"
        cache.mkdir(parents=True, exist_ok=True)
        env["NUMBA_CACHE_DIR"] = str(cache / "numba")
        env["NBGRAD_CACHE_DIR"] = str(cache / "nbgrad")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "torchinductor")  # torch.compile's
    return env


# --------------------------------------------------------------------------- statistics

def _percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    pos = (len(sorted_vals) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def summarize(times: list[float]) -> dict:
    """Median, min and quartiles of per-call times (seconds)."""
    s = sorted(times)
    return {"median_s": _percentile(s, 0.5), "min_s": s[0] if s else float("nan"),
            "p25_s": _percentile(s, 0.25), "p75_s": _percentile(s, 0.75)}


# --------------------------------------------------------------------------- running

Progress = Callable[[str], None]


def _row_base(impl, case: Case) -> dict:
    return {"impl": impl.id, "framework": impl.framework, "variant": impl.variant,
            "label": impl.label, "status": None, "note": ""}


def run_case(case: Case, selection: list[str] | None, settings: Settings, scratch: Path,
             progress: Progress) -> dict:
    """Measure every selected implementation of one case; returns the case's record."""
    mod = lookup(case.workload)
    params = dict(case.params or mod.SIZES[case.size])
    record = {"workload": mod.ID, "name": mod.NAME, "title": mod.TITLE, "size": case.size,
              "params": params, "dtype": mod.DTYPE, "rows": []}
    if hasattr(mod, "TOTAL"):
        record["total"] = mod.TOTAL.format(**params)
    if hasattr(mod, "ops_per_call"):
        record["ops_per_call"] = mod.ops_per_call(params)
    live: list[tuple[dict, WorkerProc]] = []
    for impl, threads in ((i, t) for i in mod.IMPLS for t in settings.threads):
        if not selected(impl, selection):
            continue
        row = _row_base(impl, case)
        if threads != 1:
            row.update(impl=f"{impl.id}@{threads}t", label=f"{impl.label} ({threads} threads)")
        row["threads"] = threads
        record["rows"].append(row)
        if not framework_available(impl.framework):
            row.update(status="skipped",
                       note=f"{impl.label}: {FRAMEWORKS[impl.framework]} not installed")
            progress(f"  {row['impl']:22s} skipped: not installed")
            continue
        tag = f"{mod.ID}-{impl.framework}-{impl.variant}-{threads}t-{case.size}-" \
              f"{len(os.listdir(scratch))}"
        spec = {"workload": mod.ID, "impl": impl.id, "framework": impl.framework,
                "params": params, "seed": settings.seed}
        w = WorkerProc(spec, worker_env(settings, scratch, tag, threads),
                       scratch / f"{tag}.log")
        try:
            msg = w.read(settings.start_timeout)
        except WorkerError as exc:
            row.update(status="error", note=str(exc))
            w.close()
            progress(f"  {row['impl']:22s} error: {exc}")
            continue
        status = msg.pop("status")
        note = msg.pop("note", "")
        tb = msg.pop("traceback", None)
        row.update(msg)
        row["status"] = status
        if note:
            row["note"] = note
        if status != "ready":
            if tb:
                row["traceback_tail"] = tb[-1500:]
            w.close()
            progress(f"  {row['impl']:22s} {status}: {note}")
            continue
        try:
            cal = w.request({"cmd": "calibrate"}, settings.command_timeout)
            row["calls_per_block"] = cal["calls_per_block"]
            if not cal.get("settled", True):
                row["note"] = " ".join(filter(None, (row.get("note"), (
                    "nbgrad.jit had not settled its tier after the warm-up "
                    "(perf/worker.py SETTLE_S): timed before its steady state"))))
        except WorkerError as exc:
            row.update(status="error", note=f"warm-up: {exc}")
            w.close()
            progress(f"  {row['impl']:22s} error in warm-up: {exc}")
            continue
        err = row["agreement"]["max"]
        progress(f"  {row['impl']:22s} ready: import {row['import_s']:.2f} s, first call "
                 f"{row['first_call_s']:.3f} s, agreement {err:.1e}")
        row["_times"] = []
        live.append((row, w))

    rng = random.Random(f"{settings.seed}-{mod.ID}-{case.size}-{json.dumps(params)}")
    rounds = max(1, settings.rounds)
    per_round_blocks = math.ceil(settings.min_samples / rounds)
    per_round_time = settings.min_time / rounds
    for r in range(rounds):
        order = list(live)
        rng.shuffle(order)
        for row, w in order:
            if row["status"] != "ready":
                continue
            try:
                reply = w.request({"cmd": "round", "min_blocks": per_round_blocks,
                                   "min_time": per_round_time,
                                   "max_time": settings.max_round_time},
                                  settings.command_timeout)
                row["_times"].extend(reply["times"])
                row.setdefault("round_medians_s", []).append(summarize(reply["times"])["median_s"])
            except WorkerError as exc:
                row.update(status="error", note=f"round {r + 1}: {exc}")
        progress(f"  round {r + 1}/{rounds} done")

    for row, w in live:
        if row["status"] == "ready":
            try:
                row.update(w.request({"cmd": "finish", "probe": settings.probe},
                                     settings.command_timeout))
                row["status"] = "ok"
            except WorkerError as exc:
                row.update(status="error", note=f"finish: {exc}")
        w.close()
        times = row.pop("_times")
        if times:
            row.update(summarize(times))
            row["blocks"] = len(times)
            row["calls"] = len(times) * row.get("calls_per_block", 1)
            row["timed_s"] = sum(times) * row.get("calls_per_block", 1)
            if record.get("ops_per_call"):
                row["us_per_op"] = row["median_s"] * 1e6 / record["ops_per_call"]
    return record


def _result_path(out_dir: Path, date: str, slug: str, suffix: str = "") -> Path:
    stem = f"{date}-{slug}{suffix}"
    path = out_dir / f"{stem}.json"
    k = 2
    while path.exists():
        path = out_dir / f"{stem}-{k}.json"
        k += 1
    return path


def run(cases: Iterable[Case], selection: list[str] | None = None,
        settings: Settings | None = None, out_dir: Path | str | None = None,
        kind: str = "benchmark", command: str | None = None,
        progress: Progress | None = None) -> tuple[dict, Path]:
    """Run cases, write ``<date>-<machine>[-scaling].json`` and ``.md``; return (results, path)."""
    settings = settings or Settings()
    progress = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    out_dir = Path(out_dir) if out_dir else RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    now = _dt.datetime.now().astimezone()
    results = {
        "schema": SCHEMA, "kind": kind, "created": now.isoformat(timespec="seconds"),
        "machine": machine_slug(info), "machine_info": info, "versions": versions(),
        "command": command or "python -m perf " + " ".join(sys.argv[1:]),
        "settings": {**settings.__dict__, "threads": list(settings.threads), "env": THREAD_ENV,
                     "selection": selection},
        "loadavg_start": list(os.getloadavg()), "cases": [],
    }
    scratch = Path(tempfile.mkdtemp(prefix="nbgrad-perf-"))
    t0 = time.perf_counter()
    try:
        for case in cases:
            progress(f"{case.workload} ({case.size})")
            results["cases"].append(run_case(case, selection, settings, scratch, progress))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results["loadavg_end"] = list(os.getloadavg())
    results["wall_s"] = time.perf_counter() - t0
    suffix = {"scaling": "-scaling", "tasks": "-tasks"}.get(kind, "")
    path = _result_path(out_dir, now.strftime("%Y-%m-%d"), results["machine"], suffix)
    path.write_text(json.dumps(results, indent=1, default=float) + "\n")
    from .report import render_markdown

    path.with_suffix(".md").write_text(render_markdown(results) + "\n")
    return results, path


def benchmark_cases(workload_ids: list[str], size: str) -> list[Case]:
    """One case per workload at a named size."""
    return [Case(w, size) for w in workload_ids]


def scaling_cases(w3_sizes: Iterable[int], w1_steps: Iterable[int]) -> list[Case]:
    """W3 over array sizes and W1 over step counts (other parameters at full size)."""
    w3, w1 = workloads.get("W3"), workloads.get("W1")
    cases = [Case("W3", f"n={n}", {**w3.SIZES["full"], "n": int(n)}) for n in w3_sizes]
    cases += [Case("W1", f"steps={t}", {**w1.SIZES["full"], "steps": int(t)})
              for t in w1_steps]
    return cases


def run_benchmarks(workloads_text: str | None = None, frameworks: str | None = None,
                   size: str = "full", out_dir: Path | str | None = None,
                   progress: Progress | None = None, **settings) -> tuple[dict, Path]:
    """The library entry point behind ``python -m perf`` (and ``nbgrad bench``)."""
    ids = workloads.parse(workloads_text)
    return run(benchmark_cases(ids, size), parse_selection(frameworks), Settings(**settings),
               out_dir, progress=progress)
