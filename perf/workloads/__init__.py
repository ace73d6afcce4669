"""The workloads W1-W6 of WORKLOADS.md, one module each (floors.py holds the Numba floor)."""

from __future__ import annotations

import importlib
from types import ModuleType

#: Workload id -> module name, in table order.
MODULES: dict[str, str] = {
    "W1": "w1_rollout",
    "W2": "w2_mlp",
    "W3": "w3_elementwise",
    "W4": "w4_hvp",
    "W5": "w5_custom",
    "W6": "w6_tiny_ops",
}


def get(workload_id: str) -> ModuleType:
    """The module of a workload id such as ``"W3"`` (case-insensitive)."""
    key = workload_id.strip().upper()
    if key not in MODULES:
        raise ValueError(f"unknown workload {workload_id!r}; choose from {', '.join(MODULES)}")
    return importlib.import_module(f"{__name__}.{MODULES[key]}")


def parse(text: str | None) -> list[str]:
    """A comma list of workload ids (None or "all": every workload), validated."""
    if not text or text.strip().lower() == "all":
        return list(MODULES)
    ids = [t.strip().upper() for t in text.split(",") if t.strip()]
    for i in ids:
        get(i)
    return ids
