"""``nbgrad check [OP ...]``: gradcheck every entry of the derivative table.

Each op's record (:mod:`nbgrad.testing.records`) gives its sample inputs (the op's
domain, plain and broadcast shapes, dim variants). For every sample the op is checked
to first order with :func:`nbgrad.autograd.gradcheck` and, when asked, to second
order with :func:`nbgrad.autograd.gradgradcheck`, in eager mode and (where
``nbgrad.jit`` exists) through ``nbgrad.jit``. :func:`check_chunk` is what worker
processes run; everything it returns is plain data (JSON-ready dicts).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass

import numpy as np

import nbgrad

from .. import testing
from ..autograd import gradcheck, gradgradcheck
from ..autograd.gradcheck import GradcheckError, compare_jacobians, describe
from ..jit.tier1 import interpreter
from ..tensor import Tensor
from .problems import (
    Tolerances,
    first_order_problem,
    float32_fd_tolerances,
    float64_reference,
    op_rng,
    record_problem,
)

PASS, FAIL, ERROR, NA = "pass", "fail", "error", "n/a"
JIT_MISSING = "nbgrad.jit not built"


@dataclass(frozen=True)
class CheckOptions:
    """The flags of one ``nbgrad check`` run (picklable, for worker processes)."""

    dtype: str = "float64"
    second_order: bool = False
    seed: int | None = None
    eps: float | None = None
    atol: float | None = None
    rtol: float | None = None
    fast: bool = False
    modes: tuple[str, ...] = ("eager",)


def jit_available() -> bool:
    return hasattr(nbgrad, "jit")


def _order_result(status: str, note: str = "") -> dict:
    return {"status": status, "passed": 0, "total": 0, "note": note, "failures": []}


def _short(message: str, limit: int = 1200) -> str:
    message = message.strip()
    return message if len(message) <= limit else message[:limit] + " ..."


def _mixed_precision_check(fn: Callable, inputs: tuple, tol: Tolerances, fast: bool,
                           seed: int, second: bool) -> None:
    """gradcheck (or gradgradcheck) of float32 inputs against finite differences taken in
    float64 at the same points; raises GradcheckError on a mismatch."""
    if second:
        fn, inputs = first_order_problem(fn, inputs, seed)
    reference = float64_reference(fn, inputs)
    if reference is None:
        tol = float32_fd_tolerances(tol)
        how = "float32 finite differences (the float64 evaluation differs)"
    else:
        how = "float64 finite differences"
    cmp = compare_jacobians(fn, inputs, tol.eps, tol.atol, tol.rtol, fast_mode=fast,
                            numeric_inputs=reference, seed=seed)
    if not cmp.ok:
        raise GradcheckError(f"gradcheck failed (float32 analytic against {how}).\n"
                             + describe(cmp.mismatches))


def _run_one(check: Callable, fn: Callable, inputs: tuple, tol: Tolerances, fast: bool,
             seed: int) -> tuple[str, str]:
    """(status, message) of one gradcheck / gradgradcheck call."""
    second = check.__name__ == "gradgradcheck"
    kwargs = {"eps": tol.eps, "atol": tol.atol, "rtol": tol.rtol, "fast_mode": fast}
    if second:
        kwargs["seed"] = seed
    single = any(isinstance(t, Tensor) and t.dtype == np.float32 for t in inputs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the float32 warning is given once, up front
            if single:
                _mixed_precision_check(fn, inputs, tol, fast, seed, second)
            else:
                check(fn, inputs, **kwargs)
    except GradcheckError as exc:
        return FAIL, _short(str(exc))
    except Exception as exc:  # noqa: BLE001 - any error of the op is a failed check
        return ERROR, _short(f"{type(exc).__name__}: {exc}")
    return PASS, ""


def _wrap(fn: Callable, mode: str) -> Callable:
    if mode == "eager":
        return fn
    # check the tier-1 interpreter itself, never its eager stand-in (which runs while the
    # interpreter builds in the background); this also fills the interpreter's cache
    interpreter.BACKGROUND = False
    return nbgrad.jit(fn)


def check_op(name: str, opts: CheckOptions) -> list[dict]:
    """One result row per mode for op ``name`` (a table entry with a record)."""
    rec = testing.all_records()[name]  # looked up per call (tests replace it)
    dtype = np.dtype(opts.dtype)
    tol = Tolerances.choose(rec, opts.dtype, opts.eps, opts.atol, opts.rtol)
    rows = []
    for mode in opts.modes:
        start = time.perf_counter()
        row = {"op": name, "mode": mode, "samples": 0, "skipped_samples": 0,
               "tolerances": asdict(tol), "first_order": None, "second_order": None}
        second_wanted = opts.second_order
        if not rec.grad:
            row["first_order"] = _order_result(NA, "not differentiable")
            row["second_order"] = _order_result(NA, "not differentiable")
        elif mode == "jit" and not jit_available():
            row["first_order"] = _order_result(NA, JIT_MISSING)
            row["second_order"] = _order_result(NA, JIT_MISSING)
        elif mode == "jit" and not rec.jit:
            row["first_order"] = _order_result(NA, "the op's record excludes jit")
            row["second_order"] = _order_result(NA, "the op's record excludes jit")
        else:
            first = _order_result(PASS)
            if not second_wanted:
                second = _order_result(NA, "not requested")
            elif not rec.second_order:
                second = _order_result(NA, "not covered by the record")
            else:
                second = _order_result(PASS)
            samples = rec.samples(op_rng(name, opts.seed))
            for i, sample in enumerate(samples):
                problem = record_problem(rec, sample, dtype)
                if problem is None:
                    row["skipped_samples"] += 1
                    continue
                row["samples"] += 1
                fn, inputs = problem
                try:
                    fn = _wrap(fn, mode)
                except Exception as exc:  # noqa: BLE001
                    outcome = (ERROR, _short(f"nbgrad.jit: {type(exc).__name__}: {exc}"))
                    checks = [(first, outcome)]
                    if second["status"] != NA:
                        checks.append((second, outcome))
                else:
                    checks = [(first, _run_one(gradcheck, fn, inputs, tol, opts.fast, i))]
                    if second["status"] != NA:
                        checks.append((second, _run_one(gradgradcheck, fn, inputs, tol,
                                                        opts.fast, i)))
                for result, (status, message) in checks:
                    result["total"] += 1
                    if status == PASS:
                        result["passed"] += 1
                        continue
                    if result["status"] != ERROR:
                        result["status"] = status
                    result["failures"].append({"sample": i, "note": sample.note,
                                               "status": status, "message": message})
            if row["samples"] == 0:
                first = _order_result(NA, "no sample has a differentiable input")
                second = _order_result(NA, "no sample has a differentiable input")
            row["first_order"], row["second_order"] = first, second
        row["time_s"] = round(time.perf_counter() - start, 4)
        rows.append(row)
    return rows


def check_chunk(names: list[str], opts: CheckOptions) -> list[dict]:
    """Check several ops (the unit of work of a worker process)."""
    rows = []
    for name in names:
        rows.extend(check_op(name, opts))
    return rows


MAX_AUTO_JOBS = 4  # each worker compiles what it meets: memory grows with the count


def auto_jobs() -> int:
    """Worker processes when ``--jobs`` is not given: the usable CPUs, at most 4.

    The workers share compiled kernels through Numba's on-disk cache, so a cold check
    compiles most kernels once, in whichever worker meets them first.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_AUTO_JOBS))


def _chunks(names: list[str], jobs: int) -> list[list[str]]:
    size = max(1, -(-len(names) // (jobs * 4)))
    return [names[i:i + size] for i in range(0, len(names), size)]


def run_checks(names: list[str], opts: CheckOptions, jobs: int = 1,
               advance: Callable[[int, str], None] | None = None) -> list[dict]:
    """Check ``names`` (in that order in the result), in ``jobs`` processes."""
    advance = advance or (lambda n, name: None)
    if jobs <= 1 or len(names) <= 1:
        rows = []
        for name in names:
            rows.extend(check_op(name, opts))
            advance(1, name)
        return rows
    by_op: dict[str, list[dict]] = {}
    context = multiprocessing.get_context("spawn")  # no fork of a process holding Numba
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(check_chunk, chunk, opts): chunk
                   for chunk in _chunks(names, jobs)}
        for future in as_completed(futures):
            chunk = futures[future]
            for row in future.result():
                by_op.setdefault(row["op"], []).append(row)
            advance(len(chunk), chunk[-1])
    return [row for name in names for row in by_op[name]]


def row_ok(row: dict) -> bool:
    return all(row[k]["status"] in (PASS, NA) for k in ("first_order", "second_order"))
