"""The suite's own schedule: files marked ``long`` go out to the xdist workers first
(tests/conftest.py), so that no long file starts last while the other worker idles."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[1]
#: the longest files of a cold run (a minute or more each on 2 cores)
LONG = ("test_fuzz.py", "test_fuzz_seeds.py", "test_fuzz_blocked.py",
        "test_cache_security.py", "test_tier2_kinds.py", "test_cli.py")


class _Item:
    def __init__(self, nodeid: str, long: bool) -> None:
        self.nodeid, self.long = nodeid, long

    def get_closest_marker(self, name: str):
        return object() if name == "long" and self.long else None


def test_long_files_first_then_by_falling_test_count_and_files_stay_whole():
    spec = [("a.py", 3, False), ("b.py", 1, True), ("c.py", 5, False), ("d.py", 2, True)]
    items = [_Item(f"{f}::t{k}", long) for f, n, long in spec for k in range(n)]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == (
        ["d.py::t0", "d.py::t1", "b.py::t0"] + [f"c.py::t{k}" for k in range(5)]
        + [f"a.py::t{k}" for k in range(3)])


@pytest.mark.parametrize("name", LONG)
def test_the_long_files_are_marked(name):
    text = (ROOT / "tests" / name).read_text()
    assert "\npytestmark = pytest.mark.long" in text


def test_xdist_keeps_the_order():
    """xdist reorders files by test count unless told not to."""
    text = (ROOT / "pyproject.toml").read_text()
    addopts = next(ln for ln in text.splitlines() if ln.startswith("addopts ="))
    assert "--no-loadscope-reorder" in addopts.split('"')[1].split()
    assert '\n    "long: ' in text
