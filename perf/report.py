"""Reading results files and rendering them as markdown tables.

Ratios: ``x floor`` is a row's median over the hand-written Numba floor's median;
``x best peer`` is over the best (lowest) median among PyTorch, JAX and HIPS autograd
in the same case. Research tasks (T1-T5, cases with a ``total``) get their own table:
first call, steady state and total time to result, each over JAX jit's and PyTorch
eager's in the same case. Below 1.00 means faster.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .core import PEERS

NOTE_CHARS = 180  # notes longer than this are cut in tables (the JSON keeps them whole)
STATUS_TEXT = {"skipped": "skipped", "error": "error", "mismatch": "MISMATCH",
               "ready": "unfinished"}


# --------------------------------------------------------------------------- files

def load_results(path: Path | str) -> dict:
    """Read one results JSON file."""
    data = json.loads(Path(path).read_text())
    data["_path"] = str(path)
    return data


def latest_results(directory: Path | str | None = None, kind: str = "benchmark") -> Path:
    """The newest results file of a kind (``benchmark`` or ``scaling``) in a folder."""
    from .harness import RESULTS_DIR

    directory = Path(directory) if directory else RESULTS_DIR
    found = []
    for p in directory.glob("*.json"):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("kind") == kind and "cases" in data:
            found.append((data.get("created", ""), p.name, p))
    if not found:
        command = {"scaling": " scaling", "tasks": " --suite tasks"}.get(kind, "")
        raise FileNotFoundError(f"no {kind} results in {directory}; run `python -m perf"
                                f"{command}` first")
    return max(found)[2]


# --------------------------------------------------------------------------- numbers

def fmt_ms(seconds: float | None) -> str:
    """Milliseconds with 3 significant digits, never in scientific notation."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    ms = seconds * 1e3
    if ms <= 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(ms)))
    return f"{ms:.{digits}f}"


def fmt_s(seconds: float | None) -> str:
    """Seconds, 2 significant digits for small values."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    if seconds >= 10:
        return f"{seconds:.0f}"
    if seconds >= 0.1:
        return f"{seconds:.2f}"
    return f"{seconds:.3f}"


def fmt_ratio(r: float | None) -> str:
    """A ratio like ``1.35x`` (3 significant digits for large ones)."""
    if r is None or not math.isfinite(r):
        return "–"
    if r >= 100:
        return f"{r:.0f}x"
    if r >= 10:
        return f"{r:.1f}x"
    return f"{r:.2f}x"


def ok_rows(case: dict) -> list[dict]:
    """Rows that were timed on one thread (the ones compared across frameworks)."""
    return [r for r in case["rows"] if r.get("status") == "ok" and r.get("median_s")
            and r.get("threads", 1) == 1]


def floor_median(case: dict) -> float | None:
    """The hand-written floor's median in a case, if measured."""
    for r in ok_rows(case):
        if r["framework"] == "numba":
            return r["median_s"]
    return None


def best_peer(case: dict) -> dict | None:
    """The fastest peer row (PyTorch, JAX, HIPS autograd) in a case."""
    peers = [r for r in ok_rows(case) if r["framework"] in PEERS]
    return min(peers, key=lambda r: r["median_s"]) if peers else None


def ratios(case: dict, row: dict) -> tuple[float | None, float | None]:
    """(x floor, x best peer) of one row."""
    if row.get("status") != "ok" or not row.get("median_s"):
        return None, None
    fl = floor_median(case)
    bp = best_peer(case)
    return (row["median_s"] / fl if fl else None,
            row["median_s"] / bp["median_s"] if bp else None)


# --------------------------------------------------------------------------- tables

def _filter(results: dict, workloads: list[str] | None, selection: list[str] | None) -> list:
    cases = []
    for case in results["cases"]:
        if workloads and case["workload"] not in workloads:
            continue
        if selection is not None:
            keep = [r for r in case["rows"] if _row_selected(r, selection)]
            case = {**case, "rows": keep}
        cases.append(case)
    return cases


def _row_selected(row: dict, selection: list[str]) -> bool:
    """A measured row is shown if its framework or its id is selected."""
    return row["framework"] in selection or row["impl"] in selection


def _cell(row: dict | None) -> str:
    if row is None:
        return "–"
    if row.get("status") == "ok":
        return fmt_ms(row.get("median_s"))
    return STATUS_TEXT.get(row.get("status"), str(row.get("status")))


def summary_table(cases: list[dict]) -> str:
    """Workloads as rows, frameworks as columns (medians, ms), nbgrad vs best peer."""
    cols = [("numba:floor", "floor"), ("nbgrad:eager", "nbgrad eager"),
            ("nbgrad:jit", "nbgrad jit"), ("torch:eager", "PyTorch eager"),
            ("jax:jit", "JAX jit"), ("autograd:eager", "HIPS autograd")]
    if any(r["impl"] == "torch:compile" for c in cases for r in c["rows"]):
        cols.insert(4, ("torch:compile", "torch.compile"))
    lines = ["| workload | " + " | ".join(c[1] for c in cols)
             + " | nbgrad best / best peer |",
             "|---|" + "---:|" * len(cols) + "---|"]
    for case in cases:
        by_id = {r["impl"]: r for r in case["rows"]}
        cells = [_cell(by_id.get(c[0])) for c in cols]
        nb = [r for r in ok_rows(case) if r["framework"] == "nbgrad"]
        bp = best_peer(case)
        if nb and bp:
            best = min(nb, key=lambda r: r["median_s"])
            verdict = (f"{fmt_ratio(best['median_s'] / bp['median_s'])} "
                       f"({best['variant']} vs {bp['label'].split(' (')[0]})")
        else:
            verdict = "–"
        size = "" if case.get("size") == "full" else f" [{case.get('size')}]"
        lines.append(f"| {case['workload']} {case['name']}{size} | " + " | ".join(cells)
                     + f" | {verdict} |")
    return "\n".join(lines)


def is_task(case: dict) -> bool:
    """Whether a case is a research task (it records its total time to result)."""
    return "total" in case


#: The peers each task row is compared with: (implementation id, column title).
TASK_PEERS = (("jax:jit", "JAX jit"), ("torch:eager", "PyTorch eager"))
TASK_MEASURES = ("first_call_s", "median_s", "total_s")


def task_ratios(case: dict, row: dict, peer_id: str) -> list[float | None]:
    """First call, steady state and total of a row over a peer row's, in one case."""
    peer = next((r for r in ok_rows(case) if r["impl"] == peer_id), None)
    if peer is None or row.get("status") != "ok":
        return [None] * len(TASK_MEASURES)
    return [row[m] / peer[m] if row.get(m) and peer.get(m) else None for m in TASK_MEASURES]


def task_table(cases: list[dict]) -> str:
    """Research tasks: one line per implementation, first call (s), steady-state median
    (ms), total time to result (s), and those three over JAX jit's and PyTorch eager's."""
    lines = ["| task (total: what) | implementation | first call s | steady ms | total s | "
             + " | ".join(f"x {t} (first / steady / total)" for _, t in TASK_PEERS) + " |",
             "|---|---|---:|---:|---:|" + "---|" * len(TASK_PEERS)]
    for case in cases:
        size = "" if case.get("size") == "full" else f" [{case.get('size')}]"
        name = f"{case['workload']} {case['name']}{size} ({case['total']})"
        for row in case["rows"]:
            if row.get("threads", 1) != 1:
                continue
            if row.get("status") == "ok":
                cells = [fmt_s(row.get("first_call_s")), fmt_ms(row.get("median_s")),
                         fmt_s(row.get("total_s"))]
                cells += [" / ".join(fmt_ratio(r) for r in task_ratios(case, row, pid))
                          for pid, _ in TASK_PEERS]
            else:
                cells = [STATUS_TEXT.get(row["status"], str(row["status"])), "", ""]
                cells += ["–" for _ in TASK_PEERS]
            lines.append(f"| {name} | {row['label']} | " + " | ".join(cells) + " |")
            name = ""
    return "\n".join(lines)


def case_table(case: dict) -> str:
    """One case in detail: every row with medians, ratios, first calls, memory, notes."""
    head = ("| implementation | median ms | min ms | x floor | x best peer | first call s "
            "| new graph s | import s | peak RSS MB | max rel. error | notes |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in case["rows"]:
        xf, xp = ratios(case, row)
        notes = []
        if row.get("status") != "ok":
            notes.append(f"**{STATUS_TEXT.get(row['status'], row['status'])}**")
        if row.get("note"):
            note = " ".join(str(row["note"]).replace("|", "/").split())
            notes.append(note if len(note) <= NOTE_CHARS else note[:NOTE_CHARS - 1] + "…")
        one = next((r for r in ok_rows(case) if r["impl"] == row["impl"].split("@")[0]), None)
        if row.get("threads", 1) != 1 and one and row.get("median_s"):
            notes.append(f"{row['median_s'] / one['median_s']:.2f}x its 1-thread time")
        if row.get("us_per_op") is not None:
            notes.append(f"{row['us_per_op']:.3g} us/op")
        info = row.get("info") or {}
        if info.get("path"):
            notes.append(f"path: {info['path']}")
        total = row.get("total") or {}
        if row.get("total_s") is not None:
            notes.append(f"total {fmt_s(row['total_s'])} s ({total.get('evaluations')} "
                         f"evaluations, result within {total.get('error', 0):.1e} of NumPy's)")
        err = (row.get("agreement") or {}).get("max")
        cells = [row["label"], fmt_ms(row.get("median_s")), fmt_ms(row.get("min_s")),
                 fmt_ratio(xf), fmt_ratio(xp), fmt_s(row.get("first_call_s")),
                 fmt_s(row.get("first_call_warm_s")), fmt_s(row.get("import_s")),
                 f"{row['peak_rss_mb']:.0f}" if row.get("peak_rss_mb") else "–",
                 f"{err:.1e}" if err is not None and math.isfinite(err) else "–",
                 "; ".join(notes)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _threads_text(settings: dict) -> str:
    counts = settings.get("threads") or [1]
    counts = counts if isinstance(counts, list) else [counts]
    if counts == [1]:
        return "one thread per framework"
    return ("thread counts " + ", ".join(map(str, counts))
            + " (rows @<n>t; peer ratios use the 1-thread rows)")


def header(results: dict) -> str:
    """Where and how the results were measured."""
    info = results.get("machine_info", {})
    v = results.get("versions", {})
    s = results.get("settings", {})
    la0 = results.get("loadavg_start") or []
    la1 = results.get("loadavg_end") or []
    vers = ", ".join(f"{k} {v[k]}" for k in ("nbgrad", "numba", "numpy", "torch", "jax",
                                              "autograd") if v.get(k))
    if v.get("nbgrad_git"):
        vers += f" (nbgrad git {v['nbgrad_git']})"
    lines = [
        f"Measured {results.get('created', '?')} on {info.get('cpu_model', '?')}, "
        f"{info.get('cpu_count', '?')} cores ({results.get('machine', '?')}); "
        f"{_threads_text(s)}, each in a fresh process; {s.get('rounds', '?')} "
        f"interleaved rounds; steady-state median over >= {s.get('min_samples', '?')} timed "
        f"blocks and >= {s.get('min_time', '?')} s per row; "
        f"{'cold' if s.get('cold') else 'warm'} compile caches.",
        f"Load average (1 min) {la0[0]:.2f} at start, {la1[0]:.2f} at end." if la0 and la1
        else "",
        f"Versions: {vers}.",
        f"Reproduce: `{results.get('command', 'python -m perf')}`",
    ]
    return "\n".join(ln for ln in lines if ln)


def render_markdown(results: dict, workloads: list[str] | None = None,
                    selection: list[str] | None = None, summary_only: bool = False) -> str:
    """The whole report: header, summary table, and one detailed table per case."""
    cases = _filter(results, workloads, selection)
    parts = [header(results)]
    if [c for c in cases if not is_task(c)]:
        parts += ["", "Steady-state median per call, ms (lower is better):", "",
                  summary_table([c for c in cases if not is_task(c)])]
    if [c for c in cases if is_task(c)]:
        parts += ["", "Research tasks: first call (compile included), steady-state median "
                  "of one evaluation, total time to result (lower is better):", "",
                  task_table([c for c in cases if is_task(c)])]
    if not summary_only:
        for case in cases:
            params = ", ".join(f"{k}={v}" for k, v in case["params"].items())
            parts += ["", f"### {case['title']} [{case['size']}: {params}; {case['dtype']}]",
                      "", case_table(case)]
        parts += ["", "x floor: median over the hand-written Numba floor's; x best peer: "
                  "over the fastest of PyTorch, JAX and HIPS autograd; first call: import "
                  "excluded, compile included; new graph: first call of a freshly built "
                  "step in the warm process; max rel. error: against the NumPy reference "
                  "(normwise), checked before timing."]
        if any(is_task(c) for c in cases):
            parts += ["", "Tasks: first call is the first evaluation inside the total; "
                      "total: the whole computation named in the task's title line, from a "
                      "built step in the fresh process (import excluded), its result checked "
                      "against the same computation driven by NumPy."]
    return "\n".join(parts)
