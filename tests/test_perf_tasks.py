"""CI-sized checks of the research-task suite (perf/tasks/, ``python -m perf --suite tasks``).

Tiny sizes: each task's hand-derived NumPy reference against finite differences, and each
implementation (nbgrad; JAX and PyTorch when installed) against it, for one evaluation
and for the whole computation (``total``), the way the benchmark's worker checks them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from perf import tasks  # noqa: E402
from perf.core import TOLERANCES, Mismatch, as_output, compare  # noqa: E402
from perf.tasks.common import time_to_result  # noqa: E402

TASK_IDS = list(tasks.MODULES)


@pytest.mark.parametrize("tid", TASK_IDS)
def test_reference_gradients_match_finite_differences(tid):
    mod = tasks.get(tid)
    p = mod.SIZES["tiny"]
    inp = mod.make_inputs(p, seed=3)
    fn = mod.numpy_fn(inp, p)
    args = [inp[k] for k in mod.GRAD_INPUTS]
    value, grads = fn(*args)
    ref = mod.reference(inp, p)
    assert ref.loss == value
    rng = np.random.default_rng(7)
    h = 1e-6
    if tid == "T3":  # HMC: the "gradients" are the end point; check dH = H(end) - H(start)
        assert np.isfinite(value) and abs(value) < 1.0
        return
    if tid == "T5":  # the outputs are the gradient and the Hessian: check both by differences
        (x,) = args
        d = rng.standard_normal(x.shape)
        fp, (gp, _) = fn(x + h * d)
        fm, (gm, _) = fn(x - h * d)
        assert abs((fp - fm) / (2 * h) - grads[0] @ d) <= 1e-6 * max(1.0, abs(grads[0] @ d))
        np.testing.assert_allclose((gp - gm) / (2 * h), grads[1] @ d, rtol=1e-5, atol=1e-6)
        return
    for i, g in enumerate(grads):
        d = rng.standard_normal(args[i].shape)
        plus = [a + h * d if j == i else a for j, a in enumerate(args)]
        minus = [a - h * d if j == i else a for j, a in enumerate(args)]
        fd = (fn(*plus)[0] - fn(*minus)[0]) / (2 * h)
        assert abs(fd - float(np.sum(g * d))) <= 1e-5 * max(1.0, abs(fd)), (tid, i)


def _configure(framework):
    if framework == "jax":
        jax = pytest.importorskip("jax")
        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_platforms", "cpu")
    elif framework == "torch":
        pytest.importorskip("torch")


@pytest.mark.parametrize("framework", ["nbgrad", pytest.param("jax", marks=pytest.mark.slow),
                                       pytest.param("torch", marks=pytest.mark.slow)])
@pytest.mark.parametrize("tid", TASK_IDS)
def test_implementations_agree_with_numpy(tid, framework):
    """One evaluation and the whole computation, as ``perf.worker`` checks them."""
    _configure(framework)
    mod = tasks.get(tid)
    p = mod.SIZES["tiny"]
    inp = mod.make_inputs(p)
    (impl,) = [i for i in mod.IMPLS if i.framework == framework and i.default]
    step = impl.build(inp, p)
    out = time_to_result(mod, step, inp, p)  # raises Mismatch when the totals disagree
    assert out["total"]["error"] <= mod.TOTAL_TOL
    assert out["total"]["evaluations"] >= 1 and out["total_s"] >= out["first_call_s"] > 0
    err = compare(as_output(step()), mod.reference(inp, p))
    assert err["max"] <= TOLERANCES[mod.DTYPE], err


def test_total_check_catches_a_wrong_result():
    """A total that drifts from NumPy's is reported, not timed."""
    mod = tasks.get("T5")
    p = mod.SIZES["tiny"]
    inp = mod.make_inputs(p)
    fn = mod.numpy_fn(inp, p)

    def off(x):  # a gradient 1e-3 off moves Newton's minimiser
        v, (g, h) = fn(x)
        return v, (g + 1e-3, h)
    off.fn = off
    with pytest.raises(Mismatch, match="T5 total"):
        time_to_result(mod, off, inp, p)


def test_ids_and_suites():
    assert tasks.lookup("t2").ID == "T2" and tasks.lookup("W4").ID == "W4"
    assert tasks.parse(None) == TASK_IDS and tasks.parse("T1,t5") == ["T1", "T5"]
    assert tasks.suite_of("T1,T3") == "tasks" and tasks.suite_of("W1") == "workloads"
    with pytest.raises(ValueError, match="unknown task"):
        tasks.parse("T9")
    with pytest.raises(ValueError, match="mixes"):
        tasks.suite_of("W1,T1")


def _row(impl, first, median, total):
    fw, _, variant = impl.partition(":")
    return {"impl": impl, "framework": fw, "variant": variant, "label": impl, "status": "ok",
            "threads": 1, "first_call_s": first, "median_s": median, "total_s": total}


def test_task_table_ratios():
    """Each task row is put over JAX jit's and PyTorch eager's rows of the same case."""
    from perf import report

    case = {"workload": "T1", "name": "L-BFGS-B", "title": "T1", "size": "full",
            "params": {"d": 100}, "dtype": "float64", "total": "L-BFGS-B to convergence",
            "rows": [_row("nbgrad:jit", 1.0, 1e-3, 2.0), _row("jax:jit", 2.0, 5e-4, 8.0),
                     _row("torch:eager", 0.01, 4e-3, 4.0)]}
    md = report.render_markdown({"cases": [case]})
    line = next(ln for ln in md.splitlines() if "| nbgrad:jit |" in ln)
    assert "| 0.50x / 2.00x / 0.25x | 100x / 0.25x / 0.50x |" in line, line
    assert "Research tasks" in md and "Steady-state median per call" not in md


def test_cli_runs_the_task_suite(tmp_path):
    """``python -m perf --suite tasks`` end to end at the tiny size (nbgrad only)."""
    import json
    import subprocess

    cmd = [sys.executable, "-m", "perf", "-w", "T5", "-f", "nbgrad", "--size", "tiny",
           "--rounds", "1", "--min-samples", "1", "--min-time", "0.01", "--no-probe",
           "--out-dir", str(tmp_path), "-q"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (path,) = tmp_path.glob("*-tasks.json")
    (row,) = json.loads(path.read_text())["cases"][0]["rows"]
    assert row["status"] == "ok" and 0 < row["first_call_s"] <= row["total_s"], row
    assert row["total"]["error"] <= tasks.get("T5").TOTAL_TOL
    assert "T5 Hessian [tiny] (Newton's method to convergence)" in proc.stdout
    table = subprocess.run([sys.executable, "-m", "perf", "table", "--suite", "tasks",
                            "--out-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert table.returncode == 0 and "nbgrad jit (hessian)" in table.stdout, table.stderr
