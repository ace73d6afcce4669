"""The research-task suite T1-T5, beside the workloads W1-W6: one module per task.

A task module has the interface of a workload module (``ID``, ``NAME``, ``TITLE``,
``DTYPE``, ``SIZES``, ``make_inputs``, ``reference``, ``IMPLS``; see :mod:`perf.core`)
plus what makes it a task: ``TOTAL`` (what "the result" is, in words),
``total(fn, inputs, params)`` (the whole computation a user waits for, driven by NumPy
or SciPy around one framework's evaluation ``fn``), ``numpy_fn(inputs, params)`` (the
same evaluation in NumPy, the yardstick of the total) and ``TOTAL_TOL``. Every step an
implementation builds carries its evaluation as ``step.fn`` (:func:`perf.tasks.common.bind`);
the worker times ``total`` in the fresh process, so "total" and "first call" include
compiling (:func:`perf.tasks.common.time_to_result`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .. import workloads

#: Task id -> module name, in table order.
MODULES: dict[str, str] = {
    "T1": "rosenbrock_lbfgs",
    "T2": "gp",
    "T3": "hmc",
    "T4": "neural_ode",
    "T5": "hessian",
}

#: The suites ``python -m perf --suite`` knows.
SUITES = ("workloads", "tasks")


def get(task_id: str) -> ModuleType:
    """The module of a task id such as ``"T2"`` (case-insensitive)."""
    key = task_id.strip().upper()
    if key not in MODULES:
        raise ValueError(f"unknown task {task_id!r}; choose from {', '.join(MODULES)}")
    return importlib.import_module(f"{__name__}.{MODULES[key]}")


def lookup(case_id: str) -> ModuleType:
    """The module of a workload (W1-W6) or task (T1-T5) id."""
    key = case_id.strip().upper()
    return get(key) if key in MODULES else workloads.get(key)


def parse(text: str | None, suite: str = "tasks") -> list[str]:
    """A comma list of ids of one suite (None or "all": the whole suite), validated.

    Ids of the other suite raise :class:`ValueError` (the suites write separate files).
    """
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")
    if suite == "workloads":
        return workloads.parse(text)
    if not text or text.strip().lower() == "all":
        return list(MODULES)
    ids = [t.strip().upper() for t in text.split(",") if t.strip()]
    for i in ids:
        get(i)
    return ids


def suite_of(text: str | None) -> str | None:
    """The suite a comma list of ids belongs to (None when empty); raises when mixed."""
    ids = [t.strip().upper() for t in (text or "").split(",") if t.strip()]
    kinds = {"tasks" if i in MODULES else "workloads" for i in ids if i != "ALL"}
    if len(kinds) > 1:
        raise ValueError(f"--workloads mixes tasks and workloads ({text}); run the suites "
                         "separately")
    return kinds.pop() if kinds else None
