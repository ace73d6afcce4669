"""The wheel ships the derivative table, and an installed copy loads it from anywhere,
even from the folder that holds a clone named ``nbgrad`` (issue 12, item 9)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHERE = ("import nbgrad; print(nbgrad.__file__); "
         "print(float(nbgrad.tensor([1.0, 2.0]).exp().sum()))")


def _clone_parent(tmp_path: Path) -> Path:
    """A folder holding the checkout under the name a ``git clone`` gives it."""
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "nbgrad").symlink_to(ROOT, target_is_directory=True)
    return parent


def _where(cwd: Path, env: dict | None = None) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", WHERE], cwd=cwd, capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    path, total = out.stdout.split()
    return os.path.realpath(path), total


def test_import_from_the_folder_holding_the_clone_gives_the_real_package(tmp_path):
    """Python looks in the current folder before an editable install's finder: the
    clone's root folder would be imported as an empty namespace package."""
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    env = dict(os.environ, NBGRAD_CACHE_DIR=str(tmp_path / "cache"))
    expected = _where(neutral, env)
    assert _where(_clone_parent(tmp_path), env) == expected
    assert float(expected[1]) == 10.107337927389695
    # under another name (a tool walking up to the root folder) the root file does nothing
    (tmp_path / "parent" / "clone").symlink_to(ROOT, target_is_directory=True)
    code = "import sys, clone; print('nbgrad' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "parent",
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_wheel_contains_the_table_and_imports_from_another_folder(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(dist), str(ROOT)], check=True)
    (wheel,) = dist.glob("nbgrad-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "nbgrad/formulas/derivatives.yaml" in names
    assert "__init__.py" not in names  # the checkout's root shim is not shipped
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import nbgrad, nbgrad.table as t; from nbgrad.ops.registry import table; "
            "print(t.table_path()); print(len(table()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, check=True,
                         capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin",
                              "NBGRAD_CACHE_DIR": str(tmp_path / "cache")})
    path, count = out.stdout.split()
    assert path.startswith(str(target)) and int(count) > 50
    # from the folder holding a clone, the installed copy is still the one imported
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin",
           "NBGRAD_CACHE_DIR": str(tmp_path / "cache")}
    path, _ = _where(_clone_parent(tmp_path), env)
    assert path.startswith(os.path.realpath(target))
