"""The cache never runs code it did not write (issue 12, item 10).

Generated modules and Numba's pickled cache files are read only from a folder that no
other user can write to; a module whose text is not the one nbgrad generates is never
run (neither its text nor a ``.pyc`` beside it). Each attack plants code that would
write a marker file, and the marker must stay absent while results stay right.
"""

from __future__ import annotations

import importlib._bootstrap_external as bootstrap
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from nbgrad import cache_guard, codegen

SCRIPT = """
import warnings
warnings.simplefilter("always")
import numpy as np
import nbgrad as nb
x = nb.tensor([1.0, 2.0], requires_grad=True)
(x.exp() * x + 1.0).sum().backward()
f1 = nb.jit(lambda a: nb.tanh(a) * 2.0, mode="interpret")
f2 = nb.jit(lambda a: nb.sin(a) * a + 1.0, mode="compile")
a = nb.tensor(np.arange(3.0))
r1 = [f1(a) for _ in range(3)][-1]  # the first call of a graph runs eagerly
r2 = [f2(a) for _ in range(3)][-1]
print("RESULT", *x.grad.tolist(), *r1.numpy().tolist(), *r2.numpy().tolist())
"""


def run(cache: Path, numba_cache: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, NBGRAD_CACHE_DIR=str(cache))
    env.pop("NUMBA_CACHE_DIR", None)
    if numba_cache is not None:
        env["NUMBA_CACHE_DIR"] = str(numba_cache)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)


def result(proc: subprocess.CompletedProcess) -> list[float]:
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return [float(v) for v in line.split()[1:]]


def payload(marker: Path) -> str:
    return f"with open({str(marker)!r}, 'a') as f:\n    f.write('ran\\n')\n"


class _Planted:
    """A pickle whose loading writes the marker (what a hostile cache file can do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (payload(self.marker),))


def plant_pickles(folder: Path, marker: Path) -> int:
    """Replace every Numba index and data file below ``folder`` by a hostile pickle."""
    files = [*folder.rglob("*.nbi"), *folder.rglob("*.nbc")]
    for f in files:
        f.write_bytes(pickle.dumps(_Planted(marker)))
    return len(files)


def plant_modules(folder: Path, marker: Path) -> int:
    """Replace every generated module below ``folder`` by code that writes the marker."""
    files = list(folder.rglob("*.py"))
    for f in files:
        f.write_text(payload(marker))
    return len(files)


def plant_pycs(folder: Path, marker: Path) -> int:
    """Beside every (intact) generated module, a ``.pyc`` of hostile code whose header
    matches the module's stamp, as Python's own import would accept it."""
    files = list(folder.rglob("*.py"))
    for f in files:
        st = f.stat()
        code = compile(payload(marker), str(f), "exec")
        data = bootstrap._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)
        pyc = Path(bootstrap.cache_from_source(str(f)))
        pyc.parent.mkdir(exist_ok=True)
        pyc.write_bytes(bytes(data))
    return len(files)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache filled by one run (generated modules and Numba's files) and its result."""
    root = tmp_path_factory.mktemp("warm")
    cache, numba_cache = root / "cache", root / "numba"
    numba_cache.mkdir(mode=0o700)
    expected = result(run(cache))
    result(run(root / "cache2", numba_cache))  # Numba's files of nbgrad's package kernels
    return root, expected


def copy_of(warm, tmp_path: Path, name: str = "cache") -> Path:
    src = warm[0] / name
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _folder(cache: Path) -> Path:
    return cache / codegen.versions_tag()


LOOSEN = {
    "cache folder writable by all": lambda c: c.chmod(0o777),
    "module folder writable by all": lambda c: _folder(c).chmod(0o777),
    "numba folder writable by all": lambda c: (_folder(c) / "__pycache__").chmod(0o777),
    "module folder writable by its group": lambda c: _folder(c).chmod(0o775),
}


@pytest.mark.parametrize("how", sorted(LOOSEN))
def test_code_planted_in_a_foreign_writable_cache_never_runs(warm, tmp_path, how):
    cache = copy_of(warm, tmp_path)
    marker = tmp_path / "marker"
    assert plant_pickles(cache, marker) and plant_pycs(cache, marker)
    LOOSEN[how](cache)
    proc = run(cache)
    assert result(proc) == warm[1]
    assert not marker.exists(), "code planted in the cache folder ran"
    warned = [ln for ln in proc.stderr.splitlines() if "is not safe to run code from" in ln]
    assert len(warned) == 1 and str(cache) in warned[0] and "writable by" in warned[0]


def test_the_planted_pickles_are_live_in_a_private_folder(warm, tmp_path):
    """The control of the test above: the same files do run when Numba trusts them."""
    cache = copy_of(warm, tmp_path)
    marker = tmp_path / "marker"
    assert plant_pickles(cache, marker)
    result(run(cache))
    assert marker.exists()


def test_numba_cache_of_package_kernels_in_a_foreign_writable_folder_is_not_loaded(
        warm, tmp_path):
    """``NUMBA_CACHE_DIR`` holds nbgrad's own kernels' pickles: the same check applies."""
    numba_cache = copy_of(warm, tmp_path, "numba")
    marker = tmp_path / "marker"
    assert plant_pickles(numba_cache, marker)
    numba_cache.chmod(0o777)
    proc = run(tmp_path / "cache", numba_cache)
    assert result(proc) == warm[1]
    assert not marker.exists(), "a pickle planted in NUMBA_CACHE_DIR was loaded"
    assert proc.stderr.count("not using Numba's compile cache") == 1
    assert str(numba_cache) in proc.stderr


@pytest.mark.parametrize("which", ["nbi", "nbc"])
def test_a_foreign_writable_cache_file_in_a_private_folder_is_not_loaded(warm, tmp_path,
                                                                          which):
    """The index is checked before it is read, then the data files it names (the data
    files here are planted, their indexes intact, so that each index names one)."""
    cache = copy_of(warm, tmp_path)
    marker = tmp_path / "marker"
    files = list(cache.rglob(f"*.{which}"))
    assert files
    for f in cache.rglob("*.nbc"):
        f.write_bytes(pickle.dumps(_Planted(marker)))
    for f in files:
        f.chmod(0o666)
    proc = run(cache)
    assert result(proc) == warm[1]
    assert not marker.exists(), "a pickle from a file others can write was loaded"
    assert proc.stderr.count("not using Numba's compile cache") == 1
    assert "writable by every user" in proc.stderr


@pytest.mark.parametrize("plant", [plant_modules, plant_pycs], ids=["text", "pyc"])
def test_tampered_modules_in_a_private_cache_never_run(warm, tmp_path, plant):
    cache = copy_of(warm, tmp_path)
    marker = tmp_path / "marker"
    generated = sorted(p.name.rsplit("_", 1)[0] for p in _folder(cache).glob("*.py"))
    assert {"elementwise", "jit_interpreter"} <= set(generated)
    assert any(g.startswith("jit_") and g != "jit_interpreter" for g in generated)  # tier 2
    assert plant(cache, marker) == len(generated)
    proc = run(cache)
    assert result(proc) == warm[1]
    assert not marker.exists(), "a tampered cached module ran"
    if plant is plant_modules:
        assert proc.stderr.count("was damaged or changed") == 1
        for f in _folder(cache).glob("*.py"):
            assert f.read_text().startswith("# Generated by nbgrad")  # rewritten
    assert "ran" not in proc.stdout


# ------------------------------------------------------------------ the folder check
def test_tree_problem_by_mode(tmp_path):
    base = tmp_path / "base"
    leaf = base / "tag"
    leaf.mkdir(parents=True)
    base.chmod(0o755)
    leaf.chmod(0o755)
    assert cache_guard.tree_problem(leaf, mine=base) is None
    leaf.chmod(0o757)
    assert "writable by every user" in cache_guard.tree_problem(leaf, mine=base)
    leaf.chmod(0o755)
    base.chmod(0o1777)  # sticky, but ours: others could still plant folders in it
    assert "writable by every user" in cache_guard.tree_problem(leaf, mine=base)
    assert cache_guard.tree_problem(leaf, mine=leaf) is None  # a sticky folder above
    base.chmod(0o755)
    f = leaf / "file"
    f.write_text("x")
    f.chmod(0o666)
    assert "writable by every user" in cache_guard.tree_problem(f, mine=base)
    leaf.chmod(0o700)  # a private folder above does not excuse it (bind mounts)
    assert "writable by every user" in cache_guard.tree_problem(f, mine=base)
    assert cache_guard.tree_problem(leaf / "missing", mine=base) is None


def test_tree_problem_group_write(tmp_path):
    """A group-writable folder is never trusted (group members can be unknown: LDAP)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o775)
    assert "writable by its group" in cache_guard.tree_problem(folder, mine=folder)
    folder.chmod(0o755)
    assert cache_guard.tree_problem(folder, mine=folder) is None


def test_tree_problem_by_owner(tmp_path, monkeypatch):
    """Another user's folder: the check compares owners with ``os.geteuid()``."""
    base = tmp_path / "base"
    base.mkdir(mode=0o700)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 4242)
    problem = cache_guard.tree_problem(base, mine=base)
    assert "belongs to another user" in problem and str(base) in problem
    if real == 0:  # root's folders above the cache stay trusted
        assert cache_guard.tree_problem(tmp_path) is None


def test_cache_folder_of_another_user_falls_back_to_a_private_one(tmp_path, monkeypatch):
    monkeypatch.setenv("NBGRAD_CACHE_DIR", str(tmp_path / "theirs"))
    monkeypatch.setattr(codegen, "_DIR", None)
    monkeypatch.setattr(codegen, "_PRIVATE", None)
    monkeypatch.setattr(codegen, "_WARNED", set())
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 4242)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        first, second = codegen.cache_dir(), codegen.cache_dir()
    assert first == second == codegen._PRIVATE
    assert not str(first).startswith(str(tmp_path))
    assert (first.stat().st_mode & 0o777) == 0o700
    (msg,) = [str(w.message) for w in rec]
    assert str(tmp_path / "theirs") in msg and "belongs to another user" in msg


def test_private_fallback_folder_is_removed_at_exit(tmp_path):
    code = ("import nbgrad as nb\n"
            "x = nb.tensor([1.0]).exp()\n"
            "from nbgrad import codegen\n"
            "print('DIR', codegen.cache_dir())\n")
    env = dict(os.environ, NBGRAD_CACHE_DIR=str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir(mode=0o777)
    (tmp_path / "cache").chmod(0o777)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    private = Path(proc.stdout.split("DIR", 1)[1].strip())
    assert "not safe to run code from" in proc.stderr
    assert private.name.startswith("nbgrad-cache-") and not private.exists()


CUDA_SCRIPT = """
import os, pickle, sys, warnings
warnings.simplefilter("always")
import nbgrad.cuda.kernels  # numba-cuda's cache is guarded from here on
from nbgrad import codegen
from numba.cuda.dispatcher import CUDACache
cache = CUDACache(codegen.load_module("cuda_probe", "def f(x):\\n    return x\\n").f)
class Planted:
    def __reduce__(self):
        return (exec, ({payload!r},))
with open(cache._cache_file._index_path, "wb") as fh:
    pickle.dump(Planted(), fh)
os.chmod(cache._cache_path, {mode})
class Codegen:
    def magic_tuple(self):
        return ("probe",)
class Context:
    def refresh(self):
        pass
    def codegen(self):
        return Codegen()
try:
    cache.load_overload((), Context())
except Exception:
    pass  # the planted index is no Numba index
"""


@pytest.mark.parametrize("mode", [0o777, 0o700], ids=["writable-by-all", "private-control"])
def test_numba_cuda_cache_is_guarded_too(tmp_path, mode):
    """numba-cuda has its own ``Cache`` class (and pickles): the same check applies. No GPU
    is needed to load an index; 0o700 is the control (the planted file is live)."""
    marker = tmp_path / "marker"
    code = CUDA_SCRIPT.format(payload=payload(marker), mode=oct(mode))
    env = dict(os.environ, NBGRAD_CACHE_DIR=str(tmp_path / "cache"))
    for var in ("NUMBA_CACHE_DIR", "NUMBA_ENABLE_CUDASIM"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert marker.exists() == (mode == 0o700)
    assert ("not using Numba's compile cache" in proc.stderr) == (mode == 0o777)
