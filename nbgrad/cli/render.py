"""Rich tables and progress bars of the command line (stdout for results, stderr for
progress and warnings)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from .opcheck import ERROR, FAIL, NA, PASS


def stdout_console() -> Console:
    """Results go to stdout; wide when piped, so logs keep one row per line."""
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


@contextmanager
def progress_bar(total: int, what: str, enabled: bool) -> Iterator[Callable[[int, str], None]]:
    """``advance(n, label)`` for a rich progress bar on stderr (shown on terminals only)."""
    console = stderr_console()
    progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.fields[label]}"), console=console, transient=True,
                        disable=not (enabled and console.is_terminal))
    with progress:
        task = progress.add_task(what, total=total, label="")

        def advance(n: int, label: str) -> None:
            progress.update(task, advance=n, label=label)

        yield advance


def _order_cell(result: dict) -> str:
    status = result["status"]
    if status == PASS:
        return f"[green]pass[/] {result['passed']}/{result['total']}"
    if status == NA:
        return f"[dim]n/a ({escape(result['note'])})[/]" if result["note"] else "[dim]n/a[/]"
    word = "FAIL" if status == FAIL else "ERROR"
    return f"[bold red]{word}[/] {result['passed']}/{result['total']}"


def _status_cell(result: dict) -> str:
    """A user-function result (one check, no sample counts)."""
    status = result["status"]
    if status == PASS:
        return "[green]pass[/]"
    if status == NA:
        return f"[dim]n/a ({escape(result['note'])})[/]" if result["note"] else "[dim]n/a[/]"
    return "[bold red]FAIL[/]" if status == FAIL else "[bold red]ERROR[/]"


def check_table(rows: list[dict]) -> Table:
    table = Table(title="nbgrad check", show_lines=False)
    for name, kw in (("op", {"style": "bold"}), ("samples", {"justify": "right"}),
                     ("first order", {}), ("second order", {}), ("mode", {}),
                     ("time", {"justify": "right"})):
        table.add_column(name, **kw)
    for row in rows:
        samples = str(row["samples"]) if row["samples"] else "-"
        if row["skipped_samples"]:
            samples += f" (+{row['skipped_samples']} skipped)"
        table.add_row(row["op"], samples, _order_cell(row["first_order"]),
                      _order_cell(row["second_order"]), row["mode"], f"{row['time_s']:.2f} s")
    return table


def failure_lines(rows: list[dict]) -> list[str]:
    """Plain-text details of every failed sample (printed below the table)."""
    lines = []
    for row in rows:
        for order in ("first_order", "second_order"):
            result = row[order]
            if result["status"] not in (FAIL, ERROR):
                continue
            label = order.replace("_", " ")
            for f in result["failures"]:
                head = (f"{row['op']} [{row['mode']}, {label}] sample {f['sample']}"
                        f"{' (' + f['note'] + ')' if f['note'] else ''}: {f['status']}")
                lines.append(head)
                lines.extend("    " + line for line in f["message"].splitlines()[:14])
    return lines


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def user_report_lines(report: dict, console: Console) -> None:
    """Print a user-function report: a status per mode and order, then each failing
    Jacobian block with its worst entries and the likely cause."""
    tol = report["tolerances"]
    shapes = ", ".join(str(tuple(s)) for s in report["shapes"])
    console.print(f"nbgrad check {escape(report['target'])}: inputs of shape {shapes}, "
                  f"{report['dtype']}, domain {', '.join(report['domains'])}, seed "
                  f"{report['seed']}, eps={tol['eps']:g}, atol={tol['atol']:g}, "
                  f"rtol={tol['rtol']:g}", soft_wrap=True)
    for row in report["results"]:
        for order in ("first_order", "second_order"):
            result = row[order]
            label = order.replace("_", " ")
            console.print(f"  {row['mode']:5s} {label:12s} {_status_cell(result)}",
                          soft_wrap=True)
            if result.get("note") and result["status"] != NA:
                console.print(f"    note: {escape(result['note'])}", soft_wrap=True)
            if result.get("message"):
                console.print(f"    {escape(result['message'])}", soft_wrap=True)
            for block in result.get("blocks", []):
                console.print(
                    f"    {block['input_label']} (shape {tuple(block['input_shape'])}) -> "
                    f"output {block['output']} (shape {tuple(block['output_shape'])}): "
                    f"{block['mismatched']} of {block['entries']} Jacobian entries differ",
                    soft_wrap=True)
                table = Table(box=None, padding=(0, 2), show_edge=False)
                for name in ("out_index", "in_index", "analytic", "numeric", "difference"):
                    table.add_column(name, justify="right")
                for e in block["worst"]:
                    table.add_row(str(tuple(e["out_index"])), str(tuple(e["in_index"])),
                                  _fmt(e["analytic"]), _fmt(e["numeric"]),
                                  _fmt(e["difference"]))
                console.print(table)
                console.print(f"    likely cause: {escape(block['diagnosis'])}",
                              soft_wrap=True)


def ops_table(rows: list[dict]) -> Table:
    table = Table(title="the derivative table (formulas/derivatives.yaml)")
    table.add_column("op", style="bold")
    table.add_column("kind")
    table.add_column("differentiable inputs")
    table.add_column("formula")
    table.add_column("double backward")
    table.add_column("CUDA")
    for row in rows:
        if not row["differentiable"]:
            inputs, formula = "-", "[dim]not differentiable[/]"
        else:
            inputs = ", ".join(row["differentiable_inputs"]) or "-"
            parts = [f"{k}: {escape(v)}" for k, v in row["formulas"].items()]
            parts += [f"{k}: [dim]non_differentiable[/]"
                      for k in row["non_differentiable_inputs"]]
            formula = "\n".join(parts)
        double = {"yes": "[green]yes[/]", "no": "[yellow]no[/]"}.get(row["double_backward"],
                                                                       row["double_backward"])
        table.add_row(row["op"], row["kind"], inputs, formula, double,
                      "[green]yes[/]" if row["cuda"] else "no")
    return table
