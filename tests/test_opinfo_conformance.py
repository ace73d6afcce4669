"""Conformance with PyTorch's own op samples (issue 14 item 6), where torch is installed.

Every OpInfo entry listed in ``opinfo_matches.txt`` matched PyTorch when the list was
written (values, first- and second-order gradients, float64; see
:mod:`nbgrad.cli.conformance`), and must keep matching. Regenerate the list after
adding ops with ``python -m nbgrad.cli.conformance --write-matches
tests/opinfo_matches.txt``; an entry may leave it only with a reason in
``conformance.DIFFERENCES``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # PyTorch's test utilities import it

MATCHES = Path(__file__).with_name("opinfo_matches.txt")
LISTED = [line.split()[0] for line in MATCHES.read_text().splitlines()
          if line.strip() and not line.startswith("#")]


@functools.cache
def by_key() -> dict:
    """PyTorch's OpInfo entries by name, loaded on first use: importing its op list
    takes seconds, which every xdist worker would pay while collecting."""
    from nbgrad.cli import conformance
    return {(f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name): op
            for op in conformance.entries()}


@pytest.mark.parametrize("key", LISTED)
def test_entry_still_matches_pytorch(key):
    from nbgrad.cli import conformance
    result = conformance.check_entry(by_key()[key])
    assert result.status == "match", f"{key}: {result.detail}"


def test_the_list_of_differences_is_short_and_names_real_entries():
    from nbgrad.cli import conformance
    names = {op.name for op in by_key().values()} | set(by_key())
    assert len(conformance.DIFFERENCES) <= 10
    for name, (level, why) in conformance.DIFFERENCES.items():
        assert name in names and level in ("values", "grad", "gradgrad") and len(why) > 20


def test_a_wrong_gradient_is_caught(monkeypatch):
    """The harness fails an entry whose gradient is off (here: ``sin``'s, doubled)."""
    import nbgrad as nb
    from nbgrad.cli import conformance

    sin = nb.sin

    def doubled(x):
        return sin(x) + (sin(x) - sin(x).detach())
    monkeypatch.setattr(nb, "sin", doubled)
    result = conformance.check_entry(by_key()["sin"])
    assert result.status == "grad", result.detail
