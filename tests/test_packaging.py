"""The wheel ships the derivative table, and an installed copy loads it from anywhere."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_contains_the_table_and_imports_from_another_folder(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(dist), str(ROOT)], check=True)
    (wheel,) = dist.glob("nbgrad-*.whl")
    assert "nbgrad/formulas/derivatives.yaml" in zipfile.ZipFile(wheel).namelist()
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
