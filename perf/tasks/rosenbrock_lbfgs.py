"""T1 L-BFGS-B: SciPy's L-BFGS-B on the 100-d Rosenbrock function, value and gradient
from each framework (``scipy.optimize.minimize(..., jac=True)``).

``f(x) = sum(100 (x[1:] - x[:-1]**2)**2 + (1 - x[:-1])**2)`` from ``x0 = (-1.2, 1, -1.2,
1, ...)``. Steady state: one value-and-gradient evaluation at ``x0`` (NumPy in, NumPy
out, as SciPy calls it); total: the minimisation to SciPy's default convergence, about
600 evaluations at d = 100.
"""

from __future__ import annotations

import numpy as np

from ..core import Output
from .common import bind, jax_value_and_grad, minimize, nbgrad_value_and_grad, value_and_grad_impls

ID = "T1"
NAME = "L-BFGS-B"
DTYPE = "float64"
TITLE = "T1 L-BFGS-B (SciPy, 100-d Rosenbrock)"
SIZES = {"tiny": {"d": 6}, "small": {"d": 30}, "full": {"d": 100}}
GRAD_INPUTS = ("x",)
TOTAL = "L-BFGS-B to convergence"
TOTAL_TOL = 1e-3  # the minimiser x* = (1, ..., 1), reached to SciPy's default tolerances


def make_inputs(p: dict, seed: int = 0) -> dict:
    """The classic start ``(-1.2, 1, -1.2, 1, ...)`` (the seed is not used)."""
    return {"x": np.resize(np.array([-1.2, 1.0]), p["d"])}


def numpy_fn(inp: dict, p: dict):
    """Value and gradient derived by hand."""
    def fn(x):
        r = x[1:] - x[:-1] ** 2
        g = np.zeros_like(x)
        g[:-1] = -400.0 * x[:-1] * r - 2.0 * (1.0 - x[:-1])
        g[1:] += 200.0 * r
        return float((100.0 * r * r + (1.0 - x[:-1]) ** 2).sum()), (g,)
    return fn


def reference(inp: dict, p: dict) -> Output:
    """Value and gradient at the start."""
    v, g = numpy_fn(inp, p)(inp["x"])
    return Output(v, g)


def total(fn, inp: dict, p: dict) -> dict:
    """The minimiser found by L-BFGS-B (and the value there)."""
    res = minimize(fn, inp["x"])
    return {"x": res.x, "f": np.array(res.fun + 1.0)}  # f* = 0: compare 1 + f


def rosenbrock(x):
    """The function, written once for every framework's arrays."""
    return (100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2).sum()


def _build_nbgrad(inp, p, jit=True):
    return nbgrad_value_and_grad(rosenbrock, inp["x"], jit)


def _build_torch(inp, p):
    import torch

    def fn(x):
        t = torch.tensor(x, requires_grad=True)
        v = rosenbrock(t)
        (g,) = torch.autograd.grad(v, t)
        return v.item(), (g.numpy(),)
    return bind(fn, inp["x"])


def _build_jax(inp, p):
    return jax_value_and_grad(rosenbrock, inp["x"])


IMPLS = value_and_grad_impls(_build_nbgrad, _build_torch, _build_jax)
