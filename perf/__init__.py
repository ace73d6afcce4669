"""nbgrad's benchmark suite: workloads W1-W6 against PyTorch, JAX, HIPS autograd and Numba.

Run it with ``python -m perf`` (see ``python -m perf --help``). The library interface,
for ``nbgrad bench`` and the notebook:

- :func:`main` (argv) -> exit status: the command line itself;
- :func:`run_benchmarks` (workloads, frameworks, size, ...) -> (results, path);
- :func:`print_table` prints the markdown table of the latest (or a given) results file;
- :func:`latest_results`, :func:`load_results`, :func:`render_markdown`.

Importing this package imports no framework: every measurement runs in a child process.
"""

from __future__ import annotations

from .cli import main, print_table
from .harness import RESULTS_DIR, Settings, run, run_benchmarks
from .report import latest_results, load_results, render_markdown

__all__ = ["RESULTS_DIR", "Settings", "latest_results", "load_results", "main", "print_table",
           "render_markdown", "run", "run_benchmarks"]
