"""perf/notebooks/comparison.ipynb runs headless on the small results checked into tests/data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "perf" / "notebooks" / "comparison.ipynb"
DATA = ROOT / "tests" / "data"

nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (extra: bench)")
nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (extra: bench)")
pytest.importorskip("matplotlib", reason="matplotlib not installed (extra: bench)")
pytest.importorskip("ipykernel", reason="ipykernel not installed (extra: bench)")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_comparison_notebook_executes(tmp_path, monkeypatch):
    results = DATA / "perf_results_small.json"
    scaling = DATA / "perf_scaling_small.json"
    task_results = DATA / "perf_tasks_tiny.json"
    monkeypatch.setenv("PERF_RESULTS", str(results))
    monkeypatch.setenv("PERF_SCALING", str(scaling))
    monkeypatch.setenv("PERF_TASKS", str(task_results))
    monkeypatch.setenv("PERF_PLOT_DIR", str(tmp_path))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError on any failing cell

    pngs = {p.name: p for p in tmp_path.glob("*.png")}
    stem, sstem = results.stem, scaling.stem
    expected = {f"{stem}-ratios.png", f"{stem}-first-call.png", f"{sstem}-w3.png",
                f"{sstem}-w1.png", f"{task_results.stem}-ratios.png"}
    assert expected <= set(pngs), sorted(pngs)
    for p in pngs.values():
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, p.name

    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "W1 rollout" in text  # the rendered table is in the outputs
    assert "T5 Hessian" in text  # and the research tasks' table
    assert "image/png" in text  # the figures are shown inline
    assert not list(DATA.glob("*.png"))  # nothing written beside the checked-in data
