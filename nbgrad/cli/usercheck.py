"""``nbgrad check MODULE:FUNCTION --shape ...``: gradcheck a user's function.

The module is imported with the current folder on ``sys.path`` (``path/to/file.py``
works too); inputs of the given shapes are drawn from a domain of
:data:`nbgrad.testing.DOMAINS`. A failure is reported per (output, input) block of the
Jacobian: how many entries differ, the worst ones (analytic, numeric, difference) and
the likely cause (:func:`nbgrad.cli.diagnose.diagnose`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

import nbgrad

from ..autograd import grad
from ..autograd.gradcheck import compare_jacobians
from ..ops import ones_like
from ..tensor import Tensor
from ..testing import DOMAINS
from .diagnose import diagnose
from .errors import CliError
from .opcheck import ERROR, FAIL, JIT_MISSING, NA, PASS, CheckOptions, jit_available
from .problems import (
    Tolerances,
    first_order_problem,
    float32_fd_tolerances,
    float64_reference,
)

WORST = 5


def parse_shape(text: str) -> tuple[int, ...]:
    """``"3,4"`` -> (3, 4); ``"5"`` -> (5,); ``""``, ``"()"`` or ``"scalar"`` -> ()."""
    raw = text.strip()
    if raw in ("", "()", "scalar"):
        return ()
    raw = raw.strip("()[]")
    parts = [p.strip() for p in raw.split(",")]
    if parts and parts[-1] == "":
        parts = parts[:-1]  # "3," means (3,)
    shape = []
    for p in parts:
        if not p.isdigit():
            raise CliError(f"bad --shape {text!r}: expected comma-separated non-negative "
                           "integers such as 3,4 (or () for a scalar)")
        shape.append(int(p))
    return tuple(shape)


def load_function(target: str) -> Callable:
    """Import ``MODULE:FUNCTION`` (the function may be dotted, e.g. ``Class.method``)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise CliError(f"bad target {target!r}: expected MODULE:FUNCTION, e.g. "
                       "mymodule:loss")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise CliError(f"cannot import {module_name!r}: no such file")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except CliError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and module_name.split(".")[0] == exc.name.split(".")[0]:
            raise CliError(f"cannot import module {module_name!r}: no such module (looked "
                           f"in the current folder {os.getcwd()} and on sys.path)") from None
        raise CliError(f"importing module {module_name!r} failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - an error in the user's module
        raise CliError(f"importing module {module_name!r} failed: "
                       f"{type(exc).__name__}: {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"module {module_name!r} has no function {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CliError(f"{target} is a {type(obj).__name__}, not a function")
    return obj


def make_inputs(shapes: list[tuple[int, ...]], domains: list[str], dtype: str,
                seed: int) -> tuple[Tensor, ...]:
    rng = np.random.default_rng(seed)
    return tuple(Tensor(np.asarray(DOMAINS[d](rng, s), dtype=np.float64).astype(dtype),
                        requires_grad=True) for s, d in zip(shapes, domains, strict=True))


def _floating_outputs(result) -> list[Tensor]:
    outs = result if isinstance(result, (tuple, list)) else (result,)
    return [o for o in outs if isinstance(o, Tensor) and o.dtype.kind == "f"]


def _connected(fn: Callable, inputs: tuple, diff: list[int]) -> list[list[bool]]:
    """connected[o][k]: does output o reach input diff[k] in the graph?"""
    outs = _floating_outputs(fn(*inputs))
    table = []
    for out in outs:
        if not out.requires_grad:
            table.append([False] * len(diff))
            continue
        gs = grad(out, [inputs[i] for i in diff], ones_like(out), retain_graph=True,
                  allow_unused=True)
        table.append([g is not None for g in gs])
    return table


def _blocks(cmp, connected: list[list[bool]], tol: Tolerances, labels: list[str]) -> list[dict]:
    """One report per (output, input) block of the Jacobian that has mismatches."""
    found = []
    for o, (arow, nrow) in enumerate(zip(cmp.analytic, cmp.numeric, strict=True)):
        for k, (a, n) in enumerate(zip(arow, nrow, strict=True)):
            bad = ~np.isclose(a, n, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
            if not bad.any():
                continue
            i = cmp.diff_inputs[k]
            worst = [m for m in cmp.mismatches if m.output == o and m.input == i][:WORST]
            found.append({
                "output": o, "input": i, "input_label": labels[i],
                "output_shape": list(cmp.out_shapes[o]), "input_shape": list(cmp.in_shapes[k]),
                "mismatched": int(bad.sum()), "entries": int(bad.size),
                "diagnosis": diagnose(a, n, cmp.in_shapes[k], tol.atol, tol.rtol,
                                      connected[o][k]),
                "worst": [{"out_index": [int(j) for j in m.out_index],
                           "in_index": [int(j) for j in m.in_index],
                           "analytic": m.analytic, "numeric": m.numeric,
                           "difference": m.analytic - m.numeric} for m in worst]})
    return found


def _check_order(fn: Callable, inputs: tuple, tol: Tolerances, fast: bool,
                 labels: list[str], seed: int) -> dict:
    result = {"status": PASS, "note": "", "blocks": [], "message": ""}
    single = any(isinstance(t, Tensor) and t.dtype == np.float32 for t in inputs)
    try:
        reference = float64_reference(fn, inputs) if single else None
        if single and reference is None:
            tol = float32_fd_tolerances(tol)
            result["note"] = ("the function gives different values in float64, so finite "
                              f"differences are taken in float32 (eps={tol.eps:g}, "
                              f"atol={tol.atol:g}, rtol={tol.rtol:g})")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cmp = compare_jacobians(fn, inputs, tol.eps, tol.atol, tol.rtol, fast_mode=fast,
                                    numeric_inputs=reference, seed=seed)
            if cmp.ok:
                return result
            if fast:
                result["note"] = "; ".join(filter(None, [
                    result["note"], "fast mode found a mismatch; the full Jacobians were "
                    "computed for this report"]))
                cmp = compare_jacobians(fn, inputs, tol.eps, tol.atol, tol.rtol,
                                        numeric_inputs=reference)
                if cmp.ok:  # the projection disagreed but no single entry does
                    result["status"] = FAIL
                    result["message"] = ("a random projection v^T J u differs, though no "
                                         "single Jacobian entry exceeds the tolerances")
                    return result
            connected = _connected(fn, inputs, cmp.diff_inputs)
    except Exception as exc:  # noqa: BLE001 - the user's backward may raise anything
        result["status"] = ERROR
        result["message"] = f"{type(exc).__name__}: {exc}"
        return result
    result["status"] = FAIL
    result["blocks"] = _blocks(cmp, connected, tol, labels)
    return result


def check_user_function(target: str, fn: Callable, shapes: list[tuple[int, ...]],
                        domains: list[str], opts: CheckOptions) -> dict:
    """Check ``fn`` on random inputs; a JSON-ready report (``ok`` says if all passed)."""
    seed = 0 if opts.seed is None else opts.seed
    tol = Tolerances.choose(None, opts.dtype, opts.eps, opts.atol, opts.rtol)
    inputs = make_inputs(shapes, domains, opts.dtype, seed)
    shape_text = ", ".join(str(s) for s in shapes)
    try:
        result = fn(*inputs)
    except Exception as exc:  # noqa: BLE001 - a function that cannot run on these inputs
        raise CliError(f"{target} raised {type(exc).__name__} when called with inputs of "
                       f"shape {shape_text}: {exc}") from None
    if not _floating_outputs(result):
        raise CliError(f"{target} returned {type(result).__name__}, not a floating-point "
                       "tensor (or a tuple of them); nothing to check")
    report = {"target": target, "dtype": opts.dtype, "shapes": [list(s) for s in shapes],
              "domains": list(domains), "seed": seed, "tolerances": asdict(tol),
              "fast": opts.fast, "results": []}
    labels = [f"input {i}" for i in range(len(inputs))]
    for mode in opts.modes:
        row = {"mode": mode}
        if mode == "jit" and not jit_available():
            row["first_order"] = {"status": NA, "note": JIT_MISSING, "blocks": [],
                                  "message": ""}
            row["second_order"] = dict(row["first_order"])
            report["results"].append(row)
            continue
        run = fn
        if mode == "jit":
            run = nbgrad.jit(fn)
        row["first_order"] = _check_order(run, inputs, tol, opts.fast, labels, seed)
        if opts.second_order:
            try:
                fo, fo_inputs = first_order_problem(run, inputs, seed)
                fo_labels = labels + [f"grad_output {j}" for j in
                                      range(len(fo_inputs) - len(inputs))]
                row["second_order"] = _check_order(fo, fo_inputs, tol, opts.fast, fo_labels,
                                                   seed)
            except Exception as exc:  # noqa: BLE001
                row["second_order"] = {"status": ERROR, "note": "", "blocks": [],
                                       "message": f"{type(exc).__name__}: {exc}"}
        else:
            row["second_order"] = {"status": NA, "note": "not requested", "blocks": [],
                                   "message": ""}
        report["results"].append(row)
    report["ok"] = all(r[k]["status"] in (PASS, NA) for r in report["results"]
                       for k in ("first_order", "second_order"))
    return report
