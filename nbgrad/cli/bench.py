"""``nbgrad bench``: run the perf/ benchmark runner (``python -m perf``) of a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbgrad

from .errors import FAILED, CliError


def find_perf(candidates: list[Path] | None = None) -> Path:
    """The folder holding ``perf/`` with its runner: the current folder, or the checkout
    nbgrad was installed from (editable installs)."""
    if candidates is None:
        candidates = [Path.cwd(), Path(nbgrad.__file__).resolve().parent.parent]
    looked = []
    for root in dict.fromkeys(candidates):
        perf = root / "perf"
        looked.append(str(perf))
        if (perf / "__main__.py").is_file():
            return root
    present = [p for p in looked if Path(p).is_dir()]
    if present:
        raise CliError(f"the benchmark runner is missing: {present[0]} exists but has no "
                       "__main__.py (the 'python -m perf' runner), so there is nothing to run "
                       "yet", FAILED)
    raise CliError("the benchmarks are missing: no perf/ folder in "
                   f"{' or '.join(looked)}; 'nbgrad bench' runs 'python -m perf' from a "
                   "source checkout of nbgrad", FAILED)


def run_bench(workloads: str | None, frameworks: str | None, rounds: int | None,
              extra: tuple[str, ...]) -> int:
    """Run the runner in a child process with the given selections; its exit status."""
    root = find_perf()
    args = [sys.executable, "-m", "perf"]
    if workloads:
        args += ["--workloads", workloads]
    if frameworks:
        args += ["--frameworks", frameworks]
    if rounds is not None:
        args += ["--rounds", str(rounds)]
    args += list(extra)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return subprocess.run(args, cwd=root, env=env, check=False).returncode
