"""What the task modules share: evaluation steps, total time to result, its check."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import scipy.optimize  # imported with the task, not inside its timed total

from ..core import Impl, Mismatch, relative_error


def bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    """The timed step of a task row: ``fn(*args)``, with ``fn`` kept as ``step.fn``.

    ``fn`` takes and returns NumPy values (``(value, grads)``), as a SciPy optimiser or
    a NumPy sampler calls it, so conversions to and from the framework are timed too.
    """
    def step():
        return fn(*args)
    step.fn = fn
    return step


class _FirstCall:
    """Wraps an evaluation: counts calls and times the first one."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.calls, self.first_s = fn, 0, None

    def __call__(self, *args: Any) -> Any:
        if self.calls:
            self.calls += 1
            return self.fn(*args)
        t0 = time.perf_counter()
        out = self.fn(*args)
        self.first_s = time.perf_counter() - t0
        self.calls = 1
        return out


def result_error(got: dict, want: dict) -> float:
    """The largest normwise relative error over a total's named results."""
    if set(got) != set(want):
        return float("inf")
    return max(relative_error(got[k], want[k]) for k in want)


def time_to_result(mod: ModuleType, step: Callable[[], Any], inputs: dict,
                   params: dict) -> dict:
    """Run a task's whole computation with a fresh step (the process's first evaluation
    happens inside it): ``first_call_s``, ``total_s`` and the result's check against
    the NumPy evaluation's. Raises :class:`Mismatch` when the results disagree."""
    timed = _FirstCall(step.fn)
    t0 = time.perf_counter()
    got = mod.total(timed, inputs, params)
    total_s = time.perf_counter() - t0
    want = mod.total(mod.numpy_fn(inputs, params), inputs, params)
    err = result_error(got, want)
    out = {"first_call_s": timed.first_s, "total_s": total_s,
           "total": {"what": mod.TOTAL.format(**params), "evaluations": timed.calls, "error": err,
                     "tol": mod.TOTAL_TOL,
                     "result": {k: _summary(v) for k, v in got.items()}}}
    if not err <= mod.TOTAL_TOL:
        raise Mismatch(f"{mod.ID} total: result differs from NumPy's by {err:.3g} "
                       f"(> {mod.TOTAL_TOL:g}): {out['total']['result']}")
    return out


def _summary(value: Any) -> Any:
    """A result for the JSON file: a number, or a short array's first entries."""
    a = np.asarray(value, dtype=np.float64)
    if a.size == 1:
        return float(a.reshape(()))
    return [float(v) for v in a.ravel()[:4]]


def minimize(fn: Callable[..., Any], x0: np.ndarray, **options: Any) -> Any:
    """SciPy's L-BFGS-B on ``fn(x) -> (value, (grad,))`` (``jac=True``)."""
    def value_and_grad(x):
        v, (g,) = fn(x)
        return float(v), np.asarray(g, dtype=np.float64)
    return scipy.optimize.minimize(value_and_grad, x0, jac=True, method="L-BFGS-B",
                                   options=options or None)



def nbgrad_value_and_grad(loss: Callable[[Any], Any], x0: np.ndarray,
                          jit: bool = True) -> Callable[[], Any]:
    """The nbgrad row of a value-and-gradient task: ``nbgrad.value_and_grad(loss)``,
    jitted unless not ``jit``, at ``x0``, NumPy in and out."""
    import nbgrad as nb

    vg = nb.value_and_grad(loss)
    vg = nb.jit(vg) if jit else vg

    def fn(x):
        v, g = vg(nb.tensor(x))
        return v.item(), (g.numpy(),)
    return bind(fn, x0)


def jax_value_and_grad(loss: Callable[[Any], Any], x0: np.ndarray) -> Callable[[], Any]:
    """The JAX jit row of a value-and-gradient task: ``jax.jit(jax.value_and_grad(loss))``
    at ``x0``, NumPy in and out (float64 is enabled by the worker)."""
    import jax

    vg = jax.jit(jax.value_and_grad(loss))

    def fn(x):
        v, g = vg(x)
        return float(v), (np.asarray(g),)
    return bind(fn, x0)


def value_and_grad_impls(build_nbgrad: Callable, build_torch: Callable,
                         build_jax: Callable) -> list[Impl]:
    """The rows of a value-and-gradient task: nbgrad jit (and eager, opt-in), PyTorch
    eager and JAX jit; ``build_nbgrad(inp, p, jit=...)`` builds both nbgrad rows."""
    return [
        Impl("nbgrad", "jit", "nbgrad jit (value_and_grad)", build_nbgrad),
        Impl("nbgrad", "eager", "nbgrad eager (value_and_grad)",
             lambda inp, p: build_nbgrad(inp, p, jit=False), default=False),
        Impl("torch", "eager", "PyTorch eager", build_torch),
        Impl("jax", "jit", "JAX jit (value_and_grad)", build_jax),
    ]
