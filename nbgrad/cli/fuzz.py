"""``nbgrad fuzz``: differential fuzzing of random graphs for a time budget."""

from __future__ import annotations

import sys
import time

import click

from .errors import FAILED, CliError


def _executors(text: str) -> tuple[str, ...]:
    from ..testing.fuzz import EXECUTORS, EXTRA_EXECUTORS
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in EXECUTORS + EXTRA_EXECUTORS]
    if unknown or not names:
        raise CliError(f"--executors: unknown executor(s) {', '.join(unknown) or '(none)'}; "
                       f"choose from {','.join(EXECUTORS + EXTRA_EXECUTORS)}")
    return names


@click.command("fuzz", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="How long to fuzz.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="First seed (programs use consecutive seeds; default: from the clock, "
              "printed so that the run can be repeated).")
@click.option("--executors", default="eager,fd,jvp,vmap,reference,interpret,compile,auto",
              show_default=True, metavar="NAMES",
              help="Comma-separated: eager, fd (finite differences), reference (the traced "
              "graph replayed with eager ops), interpret (tier 1), compile (tier 2), auto "
              "(after promotion), grad (jit(value_and_grad(loss)) in tier 1, the re-rolled "
              "forward's gradient also forced on small graphs), blocked (tier 2 with every "
              "region it can block as a "
              "loop over small blocks), strips (tier 1 as for large arrays: chains of "
              "elementwise instructions in strips of a few elements, inputs and outputs "
              "in slots), cuda (eager "
              "and jit on CUDA tensors; under Numba's CUDA simulator where no GPU is "
              "visible).")
@click.option("--max-steps", type=click.IntRange(min=1, max=12), default=4,
              show_default=True, help="Step families drawn per program.")
@click.option("--max-programs", type=click.IntRange(min=1), default=None,
              help="Stop after this many programs.")
def fuzz(minutes: float, seed: int | None, executors: str, max_steps: int,
         max_programs: int | None) -> int:
    """Differential fuzzing: random graphs run eagerly, against finite differences and
    under nbgrad.jit (tier 1, tier 2 and mode="auto" after promotion, each jitted
    function called 3 times), with tier 2's promotion check off.

    Prints progress and a summary with a reproducer for each failure; exits 1 on a
    failure.
    """
    from ..testing.fuzz.runner import run_for
    names = _executors(executors)
    first = int(time.time()) % 1_000_000_000 if seed is None else seed
    click.echo(f"nbgrad fuzz: {minutes:g} min from seed {first}, executors "
               f"{','.join(names)} (repeat with --seed {first})")

    def progress(summary) -> None:
        m, s = divmod(int(summary.seconds), 60)
        click.echo(f"[{m:02d}:{s:02d}] {len(summary.seeds)} programs (to seed "
                   f"{max(summary.seeds)}), {len(summary.failures)} failure(s)", err=True)
        sys.stderr.flush()

    summary = run_for(minutes, first, names, max_steps, max_programs=max_programs,
                      progress=progress)
    click.echo(summary.text())
    click.echo("FAILED" if summary.failures else "OK")
    return FAILED if summary.failures else 0
