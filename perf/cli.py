"""Command line of the benchmark suite: ``python -m perf [run|scaling|table] [options]``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from . import tasks, workloads
from .core import parse_selection

DEFAULT_W3_SIZES = "1e3,1e4,1e5,1e6,1e7"
DEFAULT_W1_STEPS = "10,100,1000,10000"
DEFAULT_SCALING_FRAMEWORKS = "numba,nbgrad:jit,torch,jax"


def _int_list(text: str) -> list[int]:
    try:
        return [int(float(t)) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma list of numbers, got {text!r}") \
            from exc


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used by ``nbgrad bench`` to forward options)."""
    p = argparse.ArgumentParser(
        prog="python -m perf",
        description="Benchmarks W1-W6: nbgrad (eager, jit) against PyTorch, JAX, HIPS "
                    "autograd and a hand-written Numba floor; research tasks T1-T5 "
                    "(--suite tasks): nbgrad jit against JAX jit and PyTorch eager, first "
                    "call, steady state and total time to result; one fresh process and "
                    "one thread per implementation, interleaved rounds.",
        epilog="commands: run (default) measures and writes perf/results/<date>-<machine>"
               ".json and .md (the task suite: <date>-<machine>-tasks.json); scaling "
               "measures W3 over array sizes and W1 over steps; "
               "table prints the table of the latest results (same as --table-only). "
               "Exit status 1 if any row failed its agreement check or crashed.")
    p.add_argument("command", nargs="?", default="run", choices=["run", "scaling", "table"])
    p.add_argument("--suite", choices=tasks.SUITES, default=None,
                   help="workloads (W1-W6, the default) or tasks (T1-T5: L-BFGS-B, GP, "
                        "HMC, neural ODE, Hessian); -w with task ids implies tasks")
    p.add_argument("--workloads", "-w", default=None,
                   help="comma list of W1..W6, or of T1..T5 (default: the whole suite)")
    p.add_argument("--frameworks", "-f", default=None,
                   help="comma list of numba (alias floor), nbgrad, torch, jax, autograd, or "
                        "framework:variant ids such as nbgrad:jit (default: all)")
    p.add_argument("--size", choices=["tiny", "small", "full"], default="full",
                   help="problem sizes: full is WORKLOADS.md's (default), small for quick "
                        "looks, tiny for CI")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--min-samples", type=int, default=20,
                   help="timed blocks per row, at least (default 20)")
    p.add_argument("--min-time", type=float, default=1.0,
                   help="seconds of timed calls per row, at least (default 1.0)")
    p.add_argument("--max-round-time", type=float, default=3.0,
                   help="cap on one row's time in one round, seconds (default 3)")
    p.add_argument("--cold", action="store_true",
                   help="empty Numba and nbgrad caches per process: first calls include "
                        "all compiling")
    p.add_argument("--no-probe", action="store_true",
                   help="skip timing a new graph's first call in the warm process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_int_list, default=[1],
                   help="comma list of thread counts (NUMBA_NUM_THREADS, OMP_NUM_THREADS, "
                        "torch); each implementation runs once per count, side by side "
                        "(rows of counts other than 1 get the suffix @<n>t; default 1)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where results go (default perf/results)")
    p.add_argument("--table-only", action="store_true",
                   help="print the markdown table of the latest results and exit")
    p.add_argument("--results", type=Path, default=None,
                   help="with --table-only/table: this results file instead of the latest")
    p.add_argument("--summary-only", action="store_true",
                   help="print only the summary table")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.add_argument("--w3-sizes", type=_int_list, default=_int_list(DEFAULT_W3_SIZES),
                   help=f"scaling: W3 array sizes (default {DEFAULT_W3_SIZES})")
    p.add_argument("--w1-steps", type=_int_list, default=_int_list(DEFAULT_W1_STEPS),
                   help=f"scaling: W1 step counts (default {DEFAULT_W1_STEPS})")
    return p


def suite(args: argparse.Namespace) -> str:
    """The suite a command line selects: ``--suite``, else the one of its ``-w`` ids."""
    implied = tasks.suite_of(args.workloads)
    chosen = args.suite or implied or "workloads"
    if implied and implied != chosen:
        raise ValueError(f"--workloads {args.workloads} is not in --suite {chosen}")
    tasks.parse(args.workloads, chosen)
    return chosen


def print_table(results_path: Path | None = None, workloads_text: str | None = None,
                frameworks: str | None = None, summary_only: bool = False,
                out_dir: Path | None = None, kind: str = "benchmark") -> int:
    """Print the markdown table of a results file (default: the latest); the CLI's --table-only."""
    from .report import latest_results, load_results, render_markdown

    try:
        path = results_path or latest_results(out_dir, kind=kind)
    except FileNotFoundError as exc:
        print(f"perf: {exc}", file=sys.stderr)
        return 2
    results = load_results(path)
    wl = tasks.parse(workloads_text, "tasks" if kind == "tasks" else "workloads") \
        if workloads_text else None
    print(f"Results: {path}\n")
    print(render_markdown(results, wl, parse_selection(frameworks), summary_only))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m perf``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        chosen = suite(args)
        parse_selection(args.frameworks)
        if chosen == "tasks" and args.command == "scaling":
            raise ValueError("scaling measures the workloads W3 and W1, not the tasks")
    except ValueError as exc:
        print(f"perf: {exc}", file=sys.stderr)
        return 2
    kind = "tasks" if chosen == "tasks" else "benchmark"
    if args.table_only or args.command == "table":
        return print_table(args.results, args.workloads, args.frameworks, args.summary_only,
                           args.out_dir, kind)

    from .harness import Settings, benchmark_cases, run, scaling_cases
    from .report import render_markdown

    settings = Settings(rounds=args.rounds, min_samples=args.min_samples,
                        min_time=args.min_time, max_round_time=args.max_round_time,
                        cold=args.cold, probe=not args.no_probe, seed=args.seed,
                        threads=tuple(args.threads))
    command = " ".join(["python -m perf", *(shlex.quote(a) for a in (argv or sys.argv[1:]))])
    progress = (lambda s: None) if args.quiet else None
    if args.command == "scaling":
        cases = scaling_cases(args.w3_sizes, args.w1_steps)
        if args.workloads:
            keep = set(workloads.parse(args.workloads))
            cases = [c for c in cases if c.workload in keep]
        selection = parse_selection(args.frameworks or DEFAULT_SCALING_FRAMEWORKS)
        results, path = run(cases, selection, settings, args.out_dir, kind="scaling",
                            command=command, progress=progress)
    else:
        cases = benchmark_cases(tasks.parse(args.workloads, chosen), args.size)
        results, path = run(cases, parse_selection(args.frameworks), settings, args.out_dir,
                            kind=kind, command=command, progress=progress)
    print(render_markdown(results, summary_only=args.summary_only))
    print(f"\nwrote {path} and {path.with_suffix('.md')}", file=sys.stderr)
    bad = [f"{c['workload']} {r['impl']}: {r['status']}" for c in results["cases"]
           for r in c["rows"] if r["status"] in ("mismatch", "error")]
    if bad:
        print("perf: rows that failed: " + "; ".join(bad), file=sys.stderr)
        return 1
    return 0
