"""Matplotlib figures of results files (used by perf/notebooks/comparison.ipynb).

Each function takes a loaded results dict (:func:`perf.report.load_results`) and
returns a ``matplotlib.figure.Figure``; :func:`save` writes it as a PNG beside the
results file (or into a given folder).
"""

from __future__ import annotations

from pathlib import Path

from .core import FRAMEWORKS
from .report import floor_median, fmt_ratio, ok_rows

#: One colour per framework, so a framework looks the same in every plot.
COLORS = {"numba": "#555555", "nbgrad": "#d62728", "torch": "#ee7f0e", "jax": "#1f77b4",
          "autograd": "#2ca02c"}
_ORDER = list(FRAMEWORKS)


def _pyplot():
    import matplotlib.pyplot as plt  # imported on use: the runner never needs matplotlib

    return plt


def _sorted_rows(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (_ORDER.index(r["framework"]), r["variant"]))


def plot_ratios(results: dict):
    """One panel per workload: each implementation's median over the floor's (log scale)."""
    plt = _pyplot()
    cases = [c for c in results["cases"] if floor_median(c) and ok_rows(c)]
    if not cases:
        raise ValueError("no workload has a measured floor and timed rows to plot")
    ncol = min(3, len(cases))
    nrow = -(-len(cases) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.4 * nrow), squeeze=False)
    for ax, case in zip(axes.flat, cases, strict=False):
        fl = floor_median(case)
        rows = _sorted_rows(ok_rows(case))
        labels = [r["label"].replace(" (", "\n(") for r in rows]
        vals = [r["median_s"] / fl for r in rows]
        ypos = range(len(rows))
        ax.barh(ypos, vals, color=[COLORS[r["framework"]] for r in rows])
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_yticks(list(ypos), labels, fontsize=7)
        ax.invert_yaxis()
        for y, v in zip(ypos, vals, strict=True):
            ax.text(v, y, " " + fmt_ratio(v), va="center", fontsize=7)
        ax.set_title(f"{case['workload']} {case['name']} (floor {fl * 1e3:.3g} ms)",
                     fontsize=9)
        ax.set_xlabel("median time / hand-written floor (log)", fontsize=8)
        ax.set_xlim(right=max(vals) * 6)
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    fig.suptitle(f"Steady state relative to the hand-written Numba floor "
                 f"({results.get('machine', '?')}, {results.get('created', '')[:10]})",
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_first_call(results: dict):
    """First call (compile included, import excluded) per workload and implementation."""
    plt = _pyplot()
    cases = [c for c in results["cases"] if any(r.get("first_call_s") for r in c["rows"])]
    if not cases:
        raise ValueError("no first-call times to plot")
    impls: list[tuple[str, str]] = []
    for c in cases:
        for r in _sorted_rows([r for r in c["rows"] if r.get("first_call_s")]):
            key = (r["impl"], r["framework"])
            if key not in impls:
                impls.append(key)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(cases) * len(impls) / 3), 3.8))
    width = 0.8 / len(impls)
    for k, (impl_id, fw) in enumerate(impls):
        xs, ys = [], []
        for i, c in enumerate(cases):
            row = next((r for r in c["rows"] if r["impl"] == impl_id), None)
            if row and row.get("first_call_s"):
                xs.append(i - 0.4 + width * (k + 0.5))
                ys.append(row["first_call_s"])
        shade = 0.55 + 0.45 * (k % 2)
        ax.bar(xs, ys, width, label=f"{impl_id}", color=COLORS[fw], alpha=shade)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)), [f"{c['workload']} {c['name']}" for c in cases])
    ax.set_ylabel("first call, s (log)")
    ax.set_title("First call in a fresh process (compile included)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def plot_scaling(scaling: dict, workload: str):
    """Median time against the varied parameter (log-log) for one workload of a scaling run."""
    plt = _pyplot()
    cases = [c for c in scaling["cases"] if c["workload"] == workload]
    if not cases:
        raise ValueError(f"the scaling results have no {workload} cases")
    from . import workloads

    param = workloads.get(workload).SCALING_PARAM
    series: dict[str, tuple[str, str, list, list]] = {}
    for c in cases:
        for r in ok_rows(c):
            s = series.setdefault(r["impl"], (r["framework"], r["label"], [], []))
            s[2].append(c["params"][param])
            s[3].append(r["median_s"])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for impl_id in sorted(series, key=lambda i: _ORDER.index(series[i][0])):
        fw, label, xs, ys = series[impl_id]
        pts = sorted(zip(xs, ys, strict=True))
        ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], marker="o",
                color=COLORS[fw], label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel({"n": "array size", "steps": "Euler steps"}.get(param, param))
    ax.set_ylabel("median ms per call (log)")
    ax.set_title(f"{cases[0]['title'].split(' (')[0]}: scaling "
                 f"({scaling.get('machine', '?')})", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def save(fig, results: dict, name: str, out_dir: Path | str | None = None) -> Path:
    """Save a figure as ``<results stem>-<name>.png`` beside the results (or in out_dir)."""
    src = Path(results["_path"])
    folder = Path(out_dir) if out_dir else src.parent
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{src.stem}-{name}.png"
    fig.savefig(path, dpi=110)
    return path
