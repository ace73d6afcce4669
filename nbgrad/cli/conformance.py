"""Conformance with PyTorch's own op samples (its OpInfo database).

PyTorch ships, for each of its op entries, sample inputs that exercise the op's
arguments (``torch.testing._internal.common_methods_invocations.op_db``). This module
runs nbgrad on them: the op of the same name (``nbgrad.X``, ``nbgrad.nn.functional.X``,
``nbgrad.linalg.X``, ``nbgrad.special.X``, ``nbgrad.fft.X``, or the ``Tensor`` method)
is called with the same arguments, converted, in float64 where the op supports it, and
its values, first-order gradients (a vector-Jacobian product with a random cotangent)
and second-order gradients are compared with PyTorch's. An entry *matches* when every
sample it has agrees.

    python -m nbgrad.cli.conformance [--json FILE] [--write-matches FILE] [NAME ...]

needs torch (``pip install torch==2.13.0``, and ``expecttest``, which its test
utilities import). ``tests/test_opinfo_conformance.py`` runs it and holds the entries
that match to a recorded list, so that none slides back.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.testing._internal.common_methods_invocations import op_db

import nbgrad as nb

__all__ = ["DIFFERENCES", "EntryResult", "check_entry", "entries", "run"]

#: deliberate differences: entry name (or name.variant) -> (the first check that is left
#: out: "values", "grad" or "gradgrad"; why nbgrad differs there)
DIFFERENCES: dict[str, tuple[str, str]] = {
    "cholesky_solve": ("grad", "the gradient for the factor is zero above (below, for "
                       "upper=True) its triangle, which the op never reads; PyTorch "
                       "returns a dense, symmetrised gradient there"),
    "cholesky_inverse": ("grad", "as cholesky_solve: zero gradient outside the factor's "
                         "triangle, where PyTorch's is dense"),
    "linalg.norm.subgradients_at_zero": ("gradgrad", "at a zero vector the second "
                                         "derivative of the 2-norm is taken as 0 "
                                         "(PyTorch gives NaN)"),
    "cov": ("values", "with aweights, PyTorch's result differs from NumPy's np.cov by up to "
            "3e-5 relative (float32-like rounding); nbgrad's agrees with NumPy to 1e-15"),
}
_LEVELS = ("values", "grad", "gradgrad")

#: ops whose values are random or arbitrary: compared on shapes and dtypes only
_RANDOM_WORDS = ("rand", "bernoulli", "dropout", "multinomial", "normal", "uniform",
                 "empty", "poisson", "exponential", "cauchy", "geometric", "log_normal")

_DTYPES = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16,
           torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
           torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_}
#: OpInfo entries whose ``op`` takes its arguments in another order than the function
#: of the same name (PyTorch's entry wraps it in a lambda)
_CALLS: dict[str, Callable] = {
    "where": lambda self, condition, other=None: nb.where(condition, self, other),
    "polygamma": lambda x, n, **kwargs: nb.polygamma(n, x, **kwargs),
    "special.polygamma": lambda x, n, **kwargs: nb.special.polygamma(n, x, **kwargs),
    "zero_": lambda x: x.clone().zero_(),
    "T": lambda x: x.T, "mT": lambda x: x.mT, "H": lambda x: x.H, "mH": lambda x: x.mH,
    "einsum": lambda tensors, equation: nb.einsum(equation, *tensors),
    "nn.functional.embedding": lambda weight, idx, **kwargs: nb.nn.functional.embedding(
        idx, weight, **kwargs),
}
_NAMESPACES = {"nn.functional.": "nn.functional", "linalg.": "linalg",
               "special.": "special", "fft.": "fft"}


@dataclass
class EntryResult:
    """One OpInfo entry's outcome: ``status`` is ``match``, ``missing`` (no nbgrad op),
    ``rejects`` (nbgrad raised on some sample), ``values``, ``grad`` or ``gradgrad`` (the
    first disagreement) or ``skipped`` (no usable samples)."""

    name: str
    variant: str
    status: str
    samples: int = 0
    passed: int = 0
    detail: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.name}.{self.variant}" if self.variant else self.name


def entries(names: list[str] | None = None) -> list:
    """PyTorch's OpInfo entries (all 702, or those named)."""
    if not names:
        return list(op_db)
    wanted = set(names)
    return [op for op in op_db if op.name in wanted
            or f"{op.name}.{op.variant_test_name}" in wanted]


def _resolve(name: str) -> Callable | None:
    """The nbgrad function for an OpInfo name (a Tensor method, unbound, where there is
    no function of that name)."""
    if name in _CALLS:
        return _CALLS[name]
    if name.startswith("__r") and name.endswith("__"):  # reflected operators
        return getattr(nb.Tensor, name, None)
    for prefix, namespace in _NAMESPACES.items():
        if name.startswith(prefix):
            module = nb
            for part in namespace.split("."):
                module = getattr(module, part, None)
                if module is None:
                    return None
            return getattr(module, name[len(prefix):], None)
    fn = getattr(nb, name, None)
    if callable(fn) and not isinstance(fn, type):
        return fn
    method = getattr(nb.Tensor, name, None)
    return method if callable(method) else None


def _dtype_for(op) -> torch.dtype | None:
    supported = op.supported_dtypes("cpu")
    for dtype in (torch.float64, torch.int64, torch.bool, torch.float32):
        if dtype in supported:
            return dtype
    return None


def _to_nb(value: Any, leaves: list) -> Any:
    """Convert a sample's argument: tensors (recording those that require grad)."""
    if isinstance(value, torch.Tensor):
        array = value.detach().resolve_conj().numpy().copy()
        t = nb.tensor(array, requires_grad=bool(value.requires_grad))
        if value.requires_grad:
            leaves.append((value, t))
        return t
    if isinstance(value, torch.dtype):
        return _DTYPES.get(value, value)
    if isinstance(value, torch.Size):
        return tuple(value)
    if isinstance(value, tuple):
        return tuple(_to_nb(v, leaves) for v in value)
    if isinstance(value, list):
        return [_to_nb(v, leaves) for v in value]
    if isinstance(value, dict):
        return {k: _to_nb(v, leaves) for k, v in value.items()}
    return value


def _flat_outputs(out: Any) -> list:
    if isinstance(out, (tuple, list)):
        return [o for item in out for o in _flat_outputs(item)]
    return [out]


def _as_array(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().resolve_conj().numpy(force=True)
    if isinstance(x, (nb.Tensor, nb.ComplexTensor)):
        return x.numpy()
    return np.asarray(x)


def _pairs(x: np.ndarray) -> np.ndarray:
    """A complex array as real pairs (..., 2), as ``view_as_real``."""
    return np.stack([x.real, x.imag], -1)


def _close(got: np.ndarray, want: np.ndarray, what: str) -> str:
    """'' when equal within float64 tolerance, else a description."""
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, PyTorch {want.shape}"
    if want.dtype.kind in "biu" or got.dtype.kind in "biu":
        if want.dtype.kind == "f" or got.dtype.kind == "f":
            pass  # compared as numbers below
        elif not np.array_equal(got, want):
            return f"{what}: values differ"
        else:
            return ""
    if want.dtype.kind == "c" and got.dtype.kind == "c":  # compared as view_as_real
        got, want = _pairs(got), _pairs(want)
    elif want.dtype.kind == "c" or got.dtype.kind == "c":
        return f"{what}: dtype {got.dtype}, PyTorch {want.dtype}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(w[np.isfinite(w)]), initial=0.0)))
    if not np.allclose(g, w, rtol=1e-6, atol=1e-9 * scale, equal_nan=True):
        bad = ~np.isclose(g, w, rtol=1e-6, atol=1e-9 * scale, equal_nan=True)
        return (f"{what}: {int(bad.sum())} of {w.size} values differ (e.g. "
                f"{g[bad].ravel()[0]!r} vs PyTorch {w[bad].ravel()[0]!r})")
    return ""


def _grads(outs_t, outs_n, leaves, rng, create_graph: bool):
    """Vector-Jacobian products of both libraries with one random cotangent."""
    # outputs that nbgrad treats as constants (e.g. slogdet's sign) are left out of both
    # complex outputs: nbgrad's as real pairs (view_as_real), PyTorch's cotangent
    # re + i im for the pairs' (re, im): both are the gradient of sum(re Re y + im Im y)
    pairs = [(o, nb.view_as_real(n) if isinstance(n, nb.ComplexTensor) else n)
             for o, n in zip(outs_t, outs_n, strict=False)
             if isinstance(o, torch.Tensor) and o.requires_grad
             and (o.dtype.is_floating_point or o.dtype.is_complex)
             and isinstance(n, (nb.Tensor, nb.ComplexTensor)) and n.requires_grad]
    if not pairs or not leaves:
        return None
    cot = [rng.standard_normal(n.shape) for _, n in pairs]
    gt = torch.autograd.grad([o for o, _ in pairs], [t for t, _ in leaves],
                             [torch.complex(torch.tensor(c[..., 0]), torch.tensor(c[..., 1]))
                              if o.dtype.is_complex else torch.tensor(c)
                              for (o, _), c in zip(pairs, cot, strict=True)],
                             allow_unused=True, create_graph=create_graph)
    gn = nb.autograd.grad([n for _, n in pairs], [n for _, n in leaves],
                          [nb.tensor(c) for c in cot], allow_unused=True,
                          create_graph=create_graph)
    return gt, gn


def _drops(sample) -> bool:
    """A sample with dropout (``dropout_p`` > 0): its values are random."""
    return float(sample.kwargs.get("dropout_p", 0.0) or 0.0) > 0.0


def _message(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}"


def _check_sample(fn: Callable, op, sample, rng, random_values: bool, skip_from: int) -> str:
    """'' when nbgrad agrees with PyTorch on this sample, else ``status: detail``."""
    leaves: list = []
    args = _to_nb((sample.input, *sample.args), leaves)
    kwargs = _to_nb(dict(sample.kwargs), leaves)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = op(sample.input, *sample.args, **sample.kwargs)
    except Exception:  # noqa: BLE001 - PyTorch refuses its own sample: nothing to compare
        return "skip"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any refusal is a finding
        return f"rejects: {_message(exc)}"
    outs_t, outs_n = _flat_outputs(want), _flat_outputs(got)
    if len(outs_t) != len(outs_n):
        return f"values: {len(outs_n)} outputs, PyTorch {len(outs_t)}"
    for k, (t, n) in enumerate(zip(outs_t, outs_n, strict=True)):
        if not isinstance(t, (torch.Tensor, bool, int, float)):
            continue
        g, w = _as_array(n), _as_array(t)
        if random_values or skip_from == 0:
            if g.shape != w.shape:
                return f"values: output {k} shape {g.shape}, PyTorch {w.shape}"
            continue
        problem = _close(g, w, f"output {k}")
        if problem:
            return "values: " + problem
    if random_values or skip_from <= 1 or not op.supports_autograd:
        return ""
    try:
        grads = _grads(outs_t, outs_n, leaves, rng, create_graph=op.supports_gradgrad)
    except Exception as exc:  # noqa: BLE001
        return f"grad: {_message(exc)}"
    if grads is None:
        return ""
    gt, gn = grads
    for k, (t, n) in enumerate(zip(gt, gn, strict=True)):
        if t is None and n is None:
            continue
        w = np.zeros(leaves[k][0].shape) if t is None else _as_array(t)
        g = np.zeros(leaves[k][0].shape) if n is None else _as_array(n)
        problem = _close(g, w, f"gradient of input {k}")
        if problem:
            return "grad: " + problem
    if skip_from <= 2 or not op.supports_gradgrad:
        return ""
    live = [(k, t, n) for k, (t, n) in enumerate(zip(gt, gn, strict=True))
            if t is not None and n is not None and t.requires_grad]
    if not live:
        return ""
    weights = [rng.standard_normal(t.shape) for _, t, _ in live]
    try:
        st = sum((t * torch.tensor(w)).sum() for (_, t, _), w in zip(live, weights, strict=True))
        ggt = torch.autograd.grad(st, [t for t, _ in leaves], allow_unused=True)
    except Exception:  # noqa: BLE001 - PyTorch has no second derivative here
        return ""
    try:
        sn = sum((n * nb.tensor(w)).sum() for (_, _, n), w in zip(live, weights, strict=True))
        # a first-order gradient that does not depend on the inputs has zero derivative
        ggn = (nb.autograd.grad(sn, [n for _, n in leaves], allow_unused=True)
               if sn.requires_grad else [None] * len(leaves))
    except Exception as exc:  # noqa: BLE001
        return f"gradgrad: {_message(exc)}"
    for k, (t, n) in enumerate(zip(ggt, ggn, strict=True)):
        w = np.zeros(leaves[k][0].shape) if t is None else _as_array(t)
        g = np.zeros(leaves[k][0].shape) if n is None else _as_array(n)
        problem = _close(g, w, f"second-order gradient of input {k}")
        if problem:
            return "gradgrad: " + problem
    return ""


def check_entry(op, max_samples: int = 12) -> EntryResult:
    """Run nbgrad on one OpInfo entry's samples (at most ``max_samples``)."""
    start = time.perf_counter()
    result = EntryResult(op.name, op.variant_test_name, "skipped")
    fn = _resolve(op.name)
    if fn is None:
        result.status = "missing"
        return result
    dtype = _dtype_for(op)
    if dtype is None:
        result.detail = "no float64, int64 or bool samples"
        return result
    rng = np.random.default_rng(0)
    random_values = any(word in op.name for word in _RANDOM_WORDS)
    key = f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
    difference = DIFFERENCES.get(key) or DIFFERENCES.get(op.name)
    skip_from = _LEVELS.index(difference[0]) if difference else 3
    try:
        samples = list(op.sample_inputs("cpu", dtype,
                                        requires_grad=op.supports_autograd
                                        and dtype.is_floating_point))
    except Exception as exc:  # noqa: BLE001
        result.detail = f"PyTorch could not make samples: {exc}"
        return result
    first = ""
    for sample in samples[:max_samples]:
        try:
            outcome = _check_sample(fn, op, sample, rng,
                                random_values or _drops(sample), skip_from)
        except Exception as exc:  # noqa: BLE001 - the comparison itself failed
            outcome = f"error: {_message(exc)}"
        if outcome == "skip":
            continue
        result.samples += 1
        if outcome:
            first = first or outcome
        else:
            result.passed += 1
    if result.samples == 0:
        result.detail = "PyTorch refused every sample"
    elif first:
        result.status, result.detail = first.split(": ", 1)[0], first
    else:
        result.status = "match"
    if difference:
        result.notes.append(difference[1])
    result.seconds = time.perf_counter() - start
    return result


def run(names: list[str] | None = None, progress: bool = False) -> list[EntryResult]:
    """Check every entry (or those named); the results in op_db's order."""
    results = []
    np.seterr(all="ignore")
    torch.set_num_threads(1)
    for op in entries(names):
        results.append(check_entry(op))
        if progress:
            r = results[-1]
            print(f"{r.key:45s} {r.status:8s} {r.passed}/{r.samples} {r.seconds:6.2f}s "
                  f"{r.detail[:110]}", file=sys.stderr)
    return results


def summary(results: list[EntryResult]) -> dict:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    return {"entries": len(results), **dict(sorted(counts.items()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbgrad.cli.conformance",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="OpInfo names (default: all)")
    parser.add_argument("--json", help="write every entry's result to this file")
    parser.add_argument("--write-matches", metavar="FILE",
                        help="write the keys of the entries that match (the list "
                        "tests/test_opinfo_conformance.py holds nbgrad to)")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per entry")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = run(args.names, progress=args.verbose)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ | {"key": r.key} for r in results], f, indent=1)
    counts = summary(results)
    if args.write_matches:
        with open(args.write_matches, "w") as f:
            f.write(f"# OpInfo entries nbgrad matches ({counts.get('match', 0)} of "
                    f"{counts['entries']}, torch {torch.__version__}); written by\n"
                    "# python -m nbgrad.cli.conformance --write-matches FILE\n")
            f.writelines(f"{r.key}\n" for r in results if r.status == "match")
    print(json.dumps(counts), f"in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

