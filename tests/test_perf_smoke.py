"""CI-sized checks of the benchmark suite (perf/): references, implementations, the runner.

Tiny sizes; nbgrad and the hand-written Numba floor only (the other frameworks are
optional extras). The runner is driven in a subprocess exactly as a user runs it.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perf import report, workloads  # noqa: E402
from perf.core import (  # noqa: E402
    TOLERANCES,
    Unavailable,
    as_output,
    compare,
    parse_selection,
    relative_error,
    selected,
)

WORKLOAD_IDS = list(workloads.MODULES)
DATA = ROOT / "tests" / "data"


def _loss(mod, inp, p):
    return mod.reference(inp, p).loss


@pytest.mark.parametrize("wid", WORKLOAD_IDS)
def test_reference_gradients_match_finite_differences(wid):
    """The hand-derived NumPy references are the yardstick: check them numerically."""
    mod = workloads.get(wid)
    p = mod.SIZES["tiny"]
    inp = mod.make_inputs(p, seed=3)
    ref = mod.reference(inp, p)
    rng = np.random.default_rng(7)
    if mod.GRAD_INPUTS:
        assert len(ref.grads) == len(mod.GRAD_INPUTS)
        # float32 data (W2) is differentiated through its float64 reference
        inp = {k: (v.astype(np.float64) if v.dtype.kind == "f" else v) for k, v in inp.items()}
        h = 1e-6
        for name, g in zip(mod.GRAD_INPUTS, ref.grads, strict=True):
            d = rng.standard_normal(inp[name].shape)
            fd = (_loss(mod, {**inp, name: inp[name] + h * d}, p)
                  - _loss(mod, {**inp, name: inp[name] - h * d}, p)) / (2 * h)
            an = float(np.sum(g * d))
            assert abs(fd - an) <= 1e-5 * max(1.0, abs(an)), (wid, name, fd, an)
    else:  # W4: the reference returns H v; check v.Hv = d2/dt2 f(w + t v)
        w_name, v_name = mod.HVP_INPUTS
        v = inp[v_name]
        h = 1e-4
        f0 = _loss(mod, inp, p)
        fp = _loss(mod, {**inp, w_name: inp[w_name] + h * v}, p)
        fm = _loss(mod, {**inp, w_name: inp[w_name] - h * v}, p)
        fd = (fp - 2 * f0 + fm) / h**2
        an = float(v @ ref.grads[0])
        assert abs(fd - an) <= 1e-5 * max(1.0, abs(an)), (wid, fd, an)


def _rows(wid, framework):
    mod = workloads.get(wid)
    return [(mod, impl) for impl in mod.IMPLS if impl.framework == framework]


@pytest.mark.parametrize("wid", WORKLOAD_IDS)
def test_floor_agrees_with_reference(wid):
    (mod, impl), = _rows(wid, "numba")
    p = mod.SIZES["tiny"]
    inp = mod.make_inputs(p)
    step = impl.build(inp, p)
    errs = compare(as_output(step()), mod.reference(inp, p))
    assert errs["max"] <= TOLERANCES[mod.DTYPE] / 100, errs
    # a second call gives the same answer (W2 updates its weights in place; the others
    # are pure), so the timed calls compute what was checked
    if wid != "W2":
        again = compare(as_output(step()), mod.reference(inp, p))
        assert again["max"] <= TOLERANCES[mod.DTYPE] / 100


def _resolves(dotted: str) -> bool:
    """Whether ``nbgrad.a.b`` is a function reachable by attribute access from nbgrad."""
    obj = importlib.import_module("nbgrad")
    for attr in dotted.split(".")[1:]:
        obj = getattr(obj, attr, None)
    return callable(obj)


@pytest.mark.parametrize("wid", WORKLOAD_IDS)
def test_nbgrad_rows_agree_or_name_what_is_missing(wid):
    """Every default nbgrad row either matches the reference or is skipped naming the gap."""
    for mod, impl in _rows(wid, "nbgrad"):
        if not impl.default:
            continue
        p = mod.SIZES["tiny"]
        inp = mod.make_inputs(p)
        try:
            step = impl.build(inp, p)
        except Unavailable as exc:
            # the skip names a missing piece of nbgrad's public API, which really is missing
            m = re.search(r": (nbgrad[\w.]*) not available$", str(exc))
            assert m, exc
            assert not _resolves(m.group(1)), exc
            continue
        try:
            out = step()
        except Exception as exc:  # only a declared "not supported yet" may skip
            if impl.skip_when is None or impl.skip_when(exc) is None:
                raise
            continue
        errs = compare(as_output(out), mod.reference(inp, p))
        assert errs["max"] <= TOLERANCES[mod.DTYPE], (impl.id, errs)


def test_relative_error_and_selection():
    assert relative_error([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert relative_error([1.0, 2.1], [1.0, 2.0]) == pytest.approx(0.05)
    assert relative_error([1.0], [1.0, 2.0]) == float("inf")
    assert relative_error([np.nan], [1.0]) == float("inf")
    sel = parse_selection("floor,nbgrad:jit,PyTorch")
    assert sel == ["numba", "nbgrad:jit", "torch"]
    w1 = workloads.get("W1")
    ids = [i.id for i in w1.IMPLS if selected(i, sel)]
    assert ids == ["numba:floor", "nbgrad:jit", "torch:eager"]
    # opt-in rows run only when named
    assert "nbgrad:jit-compile" not in [i.id for i in w1.IMPLS if selected(i, ["nbgrad"])]
    assert "nbgrad:jit-compile" in [i.id for i in w1.IMPLS
                                    if selected(i, ["nbgrad:jit-compile"])]
    w3 = workloads.get("W3")
    every = parse_selection("all,torch:compile")
    assert [i.id for i in w3.IMPLS if selected(i, every)] == [
        i.id for i in w3.IMPLS if i.default or i.id == "torch:compile"]
    assert "torch:compile" not in [i.id for i in w3.IMPLS if selected(i, None)]
    with pytest.raises(ValueError, match="unknown framework"):
        parse_selection("tensorflow")
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.parse("W9")


def test_every_workload_has_an_opt_in_torch_compile_row():
    """torch.compile is a peer on W1-W6 (``-f torch:compile``), never in a default run:
    declaring the row imports nothing, so this needs no torch (nor compiles anything)."""
    for wid in WORKLOAD_IDS:
        ids = {i.id: i for i in workloads.get(wid).IMPLS}
        assert "torch:compile" in ids, wid
        row = ids["torch:compile"]
        assert not row.default, wid
        assert "torch:compile" not in [i.id for i in ids.values() if selected(i, None)]
        assert "torch:compile" not in [i.id for i in ids.values() if selected(i, ["torch"])]
        assert [i.id for i in ids.values()
                if selected(i, parse_selection("torch:compile"))] == ["torch:compile"]


def test_report_from_checked_in_results():
    results = report.load_results(DATA / "perf_results_small.json")
    md = report.render_markdown(results)
    assert md.count("\n| W") == len(results["cases"])  # one summary line per workload
    for case in results["cases"]:
        assert case["title"] in md
        fl = report.floor_median(case)
        for row in report.ok_rows(case):
            xf, _ = report.ratios(case, row)
            assert xf == pytest.approx(row["median_s"] / fl)
        bp = report.best_peer(case)
        if bp is not None:
            assert report.ratios(case, bp)[1] == pytest.approx(1.0)
    assert report.fmt_ms(0.0000013) == "0.00130"
    assert report.fmt_ms(0.1234) == "123"
    assert report.fmt_ratio(1.234) == "1.23x"


def _run_perf(args, cwd, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "perf", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_runner_smoke(tmp_path):
    """The real runner, tiny sizes: fresh processes, rounds, JSON and markdown out."""
    out = tmp_path / "results"
    proc = _run_perf(["--workloads", "W6", "--frameworks", "nbgrad,numba", "--size", "tiny",
                      "--rounds", "2", "--min-samples", "4", "--min-time", "0.02",
                      "--max-round-time", "0.5", "--no-probe", "--out-dir", str(out)],
                     cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = sorted(out.glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert files[0].with_suffix(".md").exists()
    assert [c["workload"] for c in data["cases"]] == ["W6"]
    assert data["settings"]["env"]["OMP_NUM_THREADS"] == "1"
    for case in data["cases"]:
        by_id = {r["impl"]: r for r in case["rows"]}
        assert {r["framework"] for r in case["rows"]} == {"numba", "nbgrad"}
        for impl_id in ("numba:floor", "nbgrad:eager"):
            row = by_id[impl_id]
            assert row["status"] == "ok", row
            assert row["blocks"] >= 4 and len(row["round_medians_s"]) == 2
            assert 0 < row["min_s"] <= row["median_s"]
            assert row["agreement"]["max"] <= 1e-8
            assert row["peak_rss_mb"] > 10 and row["first_call_s"] > 0
        for row in case["rows"]:
            assert row["status"] in ("ok", "skipped"), row
            if row["status"] == "skipped":
                assert "not available" in row["note"] or "not supported" in row["note"]
    assert data["cases"][0]["rows"][0]["us_per_op"] > 0
    # the table of the latest results, as `nbgrad bench` prints it
    table = _run_perf(["--table-only", "--out-dir", str(out), "--frameworks", "numba"],
                      cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "| W6 tiny_ops [tiny] |" in table.stdout
    assert "hand-written Numba (floor)" in table.stdout
    assert "\n| nbgrad eager |" not in table.stdout  # its detailed row is filtered out


def test_runner_usage_errors(tmp_path):
    proc = _run_perf(["--frameworks", "tensorflow"], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and "unknown framework" in proc.stderr
    proc = _run_perf(["--table-only", "--out-dir", str(tmp_path)], cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and "no benchmark results" in proc.stderr


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_workers_are_pinned_to_as_many_cpus_as_threads(tmp_path):
    from perf import harness

    cpus = sorted(os.sched_getaffinity(0))
    env = harness.worker_env(harness.Settings(), tmp_path, "t", threads=1)
    want = [cpus[-1]] if len(cpus) > 1 else []
    assert env["PERF_CPUS"] == ",".join(map(str, want))
    if want:  # a child pinned so sees one CPU (this process is left as it was)
        code = ("import os; from perf.worker import _pin; _pin(); "
                "print(len(os.sched_getaffinity(0)))")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120, cwd=str(ROOT))
        assert out.stdout.strip() == "1", out.stderr


@pytest.mark.parametrize("threads", [1, 2])
def test_xla_flags_are_flags_at_every_thread_count(tmp_path, threads):
    """XLA reads a value of ``XLA_FLAGS`` that does not start with ``--`` as a file name and
    aborts the worker (JAX's 2-thread row failed so)."""
    from perf import harness

    flags = harness.worker_env(harness.Settings(), tmp_path, "t", threads)["XLA_FLAGS"]
    assert flags.split() and all(f.startswith("--") for f in flags.split()), flags


def test_cold_rows_start_from_empty_compile_caches(tmp_path):
    """``--cold``: Numba's, nbgrad's and torch.compile's caches are new folders per row."""
    from perf import harness

    env = harness.worker_env(harness.Settings(cold=True), tmp_path, "t")
    for var in ("NUMBA_CACHE_DIR", "NBGRAD_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert env[var].startswith(str(tmp_path)), var


def test_calibration_waits_for_a_promotion_still_compiling(monkeypatch):
    """Steady state starts after nbgrad.jit's background compile: the worker waits for
    it and warms up again (the calls made during the compile are not the steady state)."""
    import types

    from perf import worker

    waits = []
    running = [True]

    def wait_for_promotions(timeout=None):
        waits.append(timeout)
        if timeout:  # the worker's real wait: the compile ends
            running[0] = False
        return not running[0]

    monkeypatch.setitem(sys.modules, "nbgrad.jit.program",
                        types.SimpleNamespace(wait_for_promotions=wait_for_promotions))
    calls = []
    w = worker.Worker({}, send=None)
    w.step = lambda: calls.append(running[0])
    out = w.calibrate(warmup_time=0.0)
    assert waits == [0, worker.PROMOTION_WAIT_S, 0]
    assert calls[-out["warmup_calls"]:] == [False] * out["warmup_calls"]
    assert out["settled"]


def test_calibration_warms_up_until_no_graph_can_change_tier(monkeypatch):
    """A graph of ``mode="auto"`` promotes once its tier-1 calls have cost about its
    compile (seconds of W2 calls on an empty cache): the warm-up goes on until
    ``nbgrad.jit.program.unsettled()`` is 0, and says when it gave up (SETTLE_S)."""
    import types

    from perf import worker

    calls = []
    fake = types.SimpleNamespace(wait_for_promotions=lambda timeout=None: True,
                                 unsettled=lambda: max(0, 3 - len(calls) // 5))
    monkeypatch.setitem(sys.modules, "nbgrad.jit.program", fake)
    w = worker.Worker({}, send=None)
    w.step = lambda: calls.append(1)
    out = w.calibrate(warmup_time=0.0)
    assert out["settled"] and len(calls) == 15  # three warm-ups of 5 calls each

    monkeypatch.setattr(worker, "SETTLE_S", 0.0)
    fake.unsettled = lambda: 1  # never settles: one warm-up, then the deadline
    calls.clear()
    out = w.calibrate(warmup_time=0.0)
    assert not out["settled"] and len(calls) == 5


def test_settle_waits_until_no_graph_may_change_tier(monkeypatch):
    """``perf.gp_task.settle`` (used by the neural-ODE and GP scripts) keeps calling a row
    until no live graph may move to another tier (``nbgrad.jit.program.unsettled()``), and
    waits for a promotion's compile without calls. Tiers that stay the same for many calls
    are not enough: a 45 ms neural ODE stayed in tier 1 for seconds before its promotion
    started, and the script timed tier 1."""
    import types

    from nbgrad.jit import program
    from perf import gp_task

    calls, waits = [], []
    entry = types.SimpleNamespace(tier="interpret")
    # calls 1-20: tier 1, promotion not yet due; then a compile (waited for); then tier 2
    # runs until it is measured (call 25)
    def step():
        calls.append(1)
        if len(calls) == 20:
            entry.tier = "promoting"

    def wait_for_promotions(timeout=None):
        if entry.tier == "promoting":
            if timeout:
                waits.append(len(calls))
                entry.tier = "compile"
            return False
        return True

    step.jitted = types.SimpleNamespace(_cache={"k": entry})
    clock = iter(range(1000))
    monkeypatch.setattr(gp_task.time, "perf_counter", lambda: float(next(clock)) * 0.5)
    monkeypatch.setattr(program, "wait_for_promotions", wait_for_promotions)
    monkeypatch.setattr(program, "unsettled", lambda: int(len(calls) < 25))
    assert gp_task.settle(step).startswith("compile")
    assert waits == [20] and len(calls) == 25
