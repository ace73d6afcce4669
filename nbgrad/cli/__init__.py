"""The ``nbgrad`` command line: ``check``, ``ops``, ``bench`` and ``fuzz``.

Exit status: 0 when everything checked passes, 1 when a check fails (or ``bench``
cannot run), 2 on usage errors (unknown op, bad flag, bad shape, missing module).
User errors print one line on stderr, never a traceback.
"""

from __future__ import annotations

import difflib
import json
import sys
import time

import click

from .. import testing
from ..ops.registry import table
from ..testing import DOMAINS
from ..version import __version__
from .bench import run_bench
from .errors import FAILED, USAGE, CliError
from .inventory import composite_functions, table_rows
from .opcheck import MAX_AUTO_JOBS, NA, CheckOptions, auto_jobs, jit_available, row_ok, run_checks
from .problems import FLOAT32_FLOORS
from .usercheck import check_user_function, load_function, parse_shape

__all__ = ["cli", "main"]

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="nbgrad", prog_name="nbgrad")
def cli() -> None:
    """nbgrad: gradient checks for the derivative table and for your own functions."""


# ------------------------------------------------------------------ check
@cli.command("check", context_settings=CONTEXT)
@click.argument("targets", nargs=-1, metavar="[OP ...] | MODULE:FUNCTION")
@click.option("--dtype", type=click.Choice(["float64", "float32"]), default="float64",
              show_default=True, help="Precision of the inputs (float32 scales tolerances "
              "up and warns).")
@click.option("--second-order", is_flag=True, help="Also check second derivatives "
              "(gradgradcheck).")
@click.option("--seed", type=int, default=None, help="Seed for the random inputs (default: "
              "the seeds of the generated tests; 0 for MODULE:FUNCTION).")
@click.option("--eps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Finite-difference step (default: per op; 1e-6 for a function).")
@click.option("--atol", type=click.FloatRange(min=0), default=None,
              help="Absolute tolerance (default: per op; 1e-5 for a function).")
@click.option("--rtol", type=click.FloatRange(min=0), default=None,
              help="Relative tolerance (default: per op; 1e-3 for a function).")
@click.option("--fast", is_flag=True, help="Compare random projections v^T J u instead of "
              "whole Jacobians (PyTorch's fast mode).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON only.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Worker processes for table checks.  [default: the CPU count, at most "
              f"{MAX_AUTO_JOBS}]")
@click.option("--mode", type=click.Choice(["eager", "jit", "both"]), default="both",
              show_default=True, help="Run eagerly, through nbgrad.jit, or both.")
@click.option("--shape", "shapes", multiple=True, metavar="DIMS",
              help="Shape of one argument of MODULE:FUNCTION, e.g. 3,4 (repeat once per "
              "argument; () for a scalar).")
@click.option("--domain", "domains", multiple=True, metavar="NAME",
              help="Where MODULE:FUNCTION inputs are drawn from: a name of "
              "nbgrad.testing.DOMAINS (real, positive, unit, gt1, nonzero, nonint); once "
              "for all arguments or once per --shape.  [default: real]")
def check(targets: tuple[str, ...], dtype: str, second_order: bool, seed: int | None,
          eps: float | None, atol: float | None, rtol: float | None, fast: bool,
          as_json: bool, jobs: int | None, mode: str, shapes: tuple[str, ...],
          domains: tuple[str, ...]) -> int:
    """Gradcheck ops of the derivative table, or a function of yours.

    \b
    nbgrad check                       every table entry, first order
    nbgrad check mul exp --second-order
    nbgrad check mymodule:loss --shape 3,4 --shape 4 --domain positive

    Exits 0 when all checks pass, 1 when any fails, 2 on usage errors.
    """
    modes = ("eager", "jit") if mode == "both" else (mode,)
    jobs = jobs or auto_jobs()
    if mode == "jit" and not jit_available():
        raise CliError("--mode jit: this nbgrad has no nbgrad.jit yet, so nothing can be "
                       "checked in jit mode (use --mode eager)")
    opts = CheckOptions(dtype=dtype, second_order=second_order, seed=seed, eps=eps, atol=atol,
                        rtol=rtol, fast=fast, modes=modes)
    user_targets = [t for t in targets if ":" in t]
    if user_targets:
        if len(targets) != 1:
            raise CliError("give either op names or one MODULE:FUNCTION target, not "
                           f"{' '.join(targets)}")
        return _check_user(targets[0], shapes, domains, opts, as_json)
    if shapes or domains:
        raise CliError("--shape and --domain apply to a MODULE:FUNCTION target only")
    return _check_table(list(targets), opts, jobs, as_json)


def _float32_warning(opts) -> None:
    if opts.dtype == "float32":
        floors = ", ".join(f"{k}={v:g}" for k, v in FLOAT32_FLOORS.items())
        click.echo("warning: checking in float32: float32 analytic gradients are compared "
                   "with finite differences taken in float64 at the same points, with "
                   f"tolerances raised to at least {floors} (explicit --atol/--rtol win)",
                   err=True)


def _resolve_ops(names: list[str]) -> list[str]:
    entries = list(table())
    records = testing.all_records()  # looked up per call (tests replace it)
    if not names:
        return [n for n in entries if n in records]
    known = set(entries)
    out = []
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, entries, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise CliError(f"unknown op {name!r}: not an entry of the derivative table "
                           f"('nbgrad ops' lists them){hint}")
        if name not in records:
            raise CliError(f"op {name!r} has no op record in nbgrad.testing.records, so "
                           "there are no sample inputs to check it with", FAILED)
        if name not in out:
            out.append(name)
    return out


def _check_table(names: list[str], opts, jobs: int, as_json: bool) -> int:
    render = _render()
    ops = _resolve_ops(names)
    _float32_warning(opts)
    start = time.perf_counter()
    with render.progress_bar(len(ops), "checking ops", not as_json) as advance:
        rows = run_checks(ops, opts, jobs=jobs, advance=advance)
    wall = time.perf_counter() - start
    ok = all(row_ok(r) for r in rows)
    summary = {"ops": len(ops), "rows": len(rows), "wall_s": round(wall, 3), "jobs": jobs}
    for order in ("first_order", "second_order"):
        counts = {"pass": 0, "fail": 0, "error": 0, NA: 0}
        for r in rows:
            counts[r[order]["status"]] += 1
        summary[order] = counts
    if as_json:
        click.echo(json.dumps({
            "command": "check", "nbgrad": __version__, "ok": ok,
            "jit_built": jit_available(), "options": {
                "dtype": opts.dtype, "second_order": opts.second_order, "seed": opts.seed,
                "eps": opts.eps, "atol": opts.atol, "rtol": opts.rtol, "fast": opts.fast,
                "modes": list(opts.modes), "jobs": jobs},
            "summary": summary, "results": rows}, indent=1))
        return 0 if ok else FAILED
    console = render.stdout_console()
    console.print(render.check_table(rows))
    for line in render.failure_lines(rows):
        click.echo(line)
    parts = []
    for order in ("first_order", "second_order"):
        c = summary[order]
        bad = c["fail"] + c["error"]
        parts.append(f"{order.replace('_', ' ')}: {c['pass']} pass, {bad} fail, "
                     f"{c[NA]} n/a")
    click.echo(f"{len(ops)} op(s), mode {'+'.join(opts.modes)}, {opts.dtype}: "
               f"{'; '.join(parts)}; {wall:.1f} s with {jobs} job(s)")
    if "jit" in opts.modes and not jit_available():
        click.echo("note: jit mode shows n/a because nbgrad.jit is not built in this "
                   "nbgrad; only eager mode was checked")
    click.echo("OK" if ok else "FAILED")
    return 0 if ok else FAILED


def _check_user(target: str, shapes: tuple[str, ...], domains: tuple[str, ...], opts,
                as_json: bool) -> int:
    if not shapes:
        raise CliError(f"{target}: give the shape of each argument with --shape, e.g. "
                       "--shape 3,4 --shape 4")
    parsed = [parse_shape(s) for s in shapes]
    for d in domains:
        if d not in DOMAINS:
            raise CliError(f"unknown --domain {d!r}; choose from {', '.join(DOMAINS)}")
    if not domains:
        domains = ("real",)
    if len(domains) == 1:
        domains = domains * len(parsed)
    elif len(domains) != len(parsed):
        raise CliError(f"got {len(domains)} --domain values for {len(parsed)} --shape "
                       "values: give one for all arguments or one per argument")
    fn = load_function(target)
    _float32_warning(opts)
    report = check_user_function(target, fn, parsed, list(domains), opts)
    if as_json:
        click.echo(json.dumps({"command": "check", **report}, indent=1))
    else:
        render = _render()
        console = render.stdout_console()
        render.user_report_lines(report, console)
        if "jit" in opts.modes and not any(r["mode"] == "jit" and
                                           r["first_order"]["status"] != "n/a"
                                           for r in report["results"]):
            click.echo("note: jit mode shows n/a because nbgrad.jit is not built in this "
                       "nbgrad; only eager mode was checked")
        click.echo("OK" if report["ok"] else "FAILED")
    return 0 if report["ok"] else FAILED


# ------------------------------------------------------------------ ops
@cli.command("ops", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON only.")
def ops(as_json: bool) -> int:
    """List the derivative table: op, its kind, differentiable inputs, formulas, double
    backward coverage (a record runs gradgradcheck on it) and whether a CUDA kernel exists."""
    rows = table_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return 0
    render = _render()
    console = render.stdout_console()
    console.print(render.ops_table(rows))
    diff = sum(r["differentiable"] for r in rows)
    double = sum(r["double_backward"] == "yes" for r in rows)
    cuda = sum(r["cuda"] for r in rows)
    native = sum(r["jit_native"] for r in rows)
    click.echo(f"{len(rows)} entries: {diff} differentiable, {double} with double backward "
               f"covered by a record, {cuda} with a CUDA kernel, {native} native in both jit "
               f"tiers; {len(composite_functions())} more public functions are composites "
               "of them")
    return 0


# ------------------------------------------------------------------ bench
@cli.command("bench", context_settings={**CONTEXT, "ignore_unknown_options": True})
@click.option("--workloads", default=None, metavar="W1,W3",
              help="Comma-separated workload ids (default: all).")
@click.option("--frameworks", default=None, metavar="NAMES",
              help="Comma-separated frameworks (default: all that are installed).")
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help="Interleaved rounds (default: the runner's).")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[RUNNER ARGS]")
def bench(workloads: str | None, frameworks: str | None, rounds: int | None,
          extra: tuple[str, ...]) -> int:
    """Run the perf/ benchmarks (python -m perf) and print the comparison table.

    Other options (e.g. --size tiny) go to the runner unchanged; see
    'python -m perf --help'. Needs a source checkout with perf/.
    """
    return run_bench(workloads, frameworks, rounds, extra)


# ------------------------------------------------------------------ fuzz
from .fuzz import fuzz  # noqa: E402

cli.add_command(fuzz)


# ------------------------------------------------------------------ entry point
def _render():
    """The rich-based output module, imported on first use (``nbgrad --help`` stays quick)."""
    from . import render
    return render


def _fail(ctx_path: str, message: str, code: int) -> None:
    click.echo(f"{ctx_path}: error: {' '.join(message.split())}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``nbgrad`` and ``python -m nbgrad``)."""
    try:
        code = cli.main(args=argv, prog_name="nbgrad", standalone_mode=False)
    except click.UsageError as exc:  # bad flags, bad choices, missing values
        path = exc.ctx.command_path if exc.ctx is not None else "nbgrad"
        _fail(path, f"{exc.format_message()} (see '{path} --help')", USAGE)
    except CliError as exc:
        _fail(_command_path(argv), exc.message, exc.code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _command_path(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    sub = next((a for a in args if not a.startswith("-")), None)
    return f"nbgrad {sub}" if sub in cli.commands else "nbgrad"
