"""A damaged, truncated or read-only compile cache: nbgrad recompiles, warns once, and
its results do not change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import warnings
warnings.simplefilter("always")
import nbgrad as nb
x = nb.tensor([1.0, 2.0], requires_grad=True)
(x.exp() * x + 1.0).sum().backward()
print("RESULT", *x.grad.tolist())
"""


def run(cache: Path, script: str = SCRIPT) -> subprocess.CompletedProcess:
    env = dict(os.environ, NBGRAD_CACHE_DIR=str(cache))
    env.pop("NUMBA_CACHE_DIR", None)  # Numba must cache next to the generated code
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)


def result(proc: subprocess.CompletedProcess) -> list[float]:
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return [float(v) for v in line.split()[1:]]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    first = run(cache)
    return cache, result(first)


def _files(cache: Path, pattern: str) -> list[Path]:
    return sorted(cache.glob(f"*/{pattern}"))


def test_corrupt_index_and_data_files_recompile_with_one_warning(warm_cache):
    cache, expected = warm_cache
    for f in _files(cache, "__pycache__/*.nbi"):
        f.write_bytes(b"garbage")
    for f in _files(cache, "__pycache__/*.nbc"):
        f.write_bytes(f.read_bytes()[:50])
    proc = run(cache)
    assert result(proc) == expected
    assert proc.stderr.count("compile cache") == 1 and "damaged" in proc.stderr
    assert "compile cache" not in run(cache).stderr  # repaired


def test_truncated_generated_source_is_regenerated(warm_cache):
    cache, expected = warm_cache
    (source,) = _files(cache, "elementwise_*.py")
    source.write_text(source.read_text()[:200])
    proc = run(cache)
    assert result(proc) == expected
    assert "damaged" in proc.stderr and "regenerated" in proc.stderr


def test_unwritable_cache_folder_still_works(warm_cache, tmp_path):
    _, expected = warm_cache
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")  # nothing can be created below a file, even as root
    proc = run(blocker / "cache")
    assert result(proc) == expected
    assert proc.stderr.count("not writable") == 1


def test_unusable_numba_cache_folder_still_works(warm_cache):
    cache, expected = warm_cache
    pycache = next(cache.glob("*/__pycache__"))
    for f in pycache.iterdir():
        f.unlink()
    pycache.rmdir()
    pycache.write_text("numba cannot write here")
    try:
        assert result(run(cache)) == expected
    finally:
        pycache.unlink()


def test_a_cache_written_by_an_older_version_is_not_used(warm_cache, tmp_path):
    _, expected = warm_cache
    cache = tmp_path / "cache"
    old = cache / "nbgrad-0.0.1-numba-0.50.0-py311"  # what an older nbgrad left behind
    old.mkdir(parents=True)
    for name in ("elementwise_0000000000000000.py", "formulas_0000000000000000.py"):
        (old / name).write_text("raise RuntimeError('an old module was imported')\n")
    (old / "__pycache__").mkdir()
    (old / "__pycache__" / "elementwise_x.binary_mul-1.py311.nbi").write_bytes(b"old")
    proc = run(cache)
    assert result(proc) == expected
    assert "compile cache" not in proc.stderr and "damaged" not in proc.stderr
    current = [p.name for p in cache.iterdir() if p != old]
    assert current and all(name.startswith("nbgrad-0.1.0-") for name in current)


#: counts the refreshes of Numba's CPU target context (imports and installs of every
#: lowering registry) in the process, then runs SCRIPT; ``{lean}`` sets
#: ``cache_guard.LOAD_WITHOUT_REFRESH``
COUNTED = """
from numba.core.cpu import CPUContext
refreshes = []
_refresh = CPUContext.refresh
def counted(self):
    refreshes.append(1)
    return _refresh(self)
CPUContext.refresh = counted
import nbgrad.cache_guard
nbgrad.cache_guard.LOAD_WITHOUT_REFRESH = {lean}
""" + SCRIPT + """
print("REFRESHES", len(refreshes))
import numba
@numba.njit(cache=False)
def fresh(a):  # compiled after the loads: the compiler refreshes the context itself
    return a.sum() * 2.0
import numpy as np
print("FRESH", fresh(np.arange(4.0)))
"""


def _count(proc: subprocess.CompletedProcess, key: str) -> float:
    return float(next(ln for ln in proc.stdout.splitlines() if ln.startswith(key)).split()[1])


def test_cached_kernels_load_without_the_context_refresh(warm_cache):
    """Numba refreshes its CPU context (100-150 ms of imports) before every cache load;
    nbgrad's kernels load without it, and code compiled afterwards still compiles."""
    cache, expected = warm_cache
    assert result(run(cache)) == expected  # (earlier tests may have emptied the cache)
    lean = run(cache, COUNTED.format(lean=True))
    assert result(lean) == expected
    assert _count(lean, "REFRESHES") == 0
    assert _count(lean, "FRESH") == 12.0
    full = run(cache, COUNTED.format(lean=False))  # Numba's own load_overload
    assert result(full) == expected
    assert _count(full, "REFRESHES") >= 1
