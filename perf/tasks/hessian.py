"""T5 Hessian: the full 50 x 50 Hessian of a scalar function (with its value and
gradient), from each framework's Hessian transform.

``f(x) = logsumexp(A x) + x^T Q x / 2 - c^T x``, A of 200 x 50, Q symmetric positive definite:
``grad = A^T s + Q x - c`` and ``H = A^T (diag(s) - s s^T) A + Q`` with ``s = softmax(A x)``.
Rows: ``nbgrad.jit`` of ``nbgrad.hessian``, ``jax.jit`` of ``jax.hessian``, PyTorch eager
``torch.autograd.functional.hessian`` (each with ``grad`` for the gradient). Steady state:
value, gradient and Hessian at a fixed point; total: Newton's method from 0 to
``|grad| < 1e-10`` (a handful of Hessians).
"""

from __future__ import annotations

import numpy as np

from ..core import Impl, Output
from .common import bind

ID = "T5"
NAME = "Hessian"
DTYPE = "float64"
TITLE = "T5 Hessian (50 x 50, logsumexp plus a quadratic form)"
SIZES = {"tiny": {"m": 12, "d": 5}, "small": {"m": 60, "d": 20}, "full": {"m": 200, "d": 50}}
GRAD_INPUTS = ("x",)
TOTAL = "Newton's method to convergence"
TOTAL_TOL = 1e-8
NEWTON_MAX = 30


def make_inputs(p: dict, seed: int = 0) -> dict:
    """A, Q (well conditioned) and the point of the timed step."""
    rng = np.random.default_rng(seed)
    m, d = p["m"], p["d"]
    b = rng.standard_normal((d, d)) / np.sqrt(d)
    return {"A": rng.standard_normal((m, d)) / np.sqrt(d), "Q": b @ b.T + np.eye(d),
            "c": rng.standard_normal(d), "x": rng.standard_normal(d) / 5}


def objective(lse, A, Q, c):
    """``f(x) = logsumexp(A x) + x^T Q x / 2 - c^T x`` given a framework's logsumexp."""
    def f(x):
        return lse(A @ x) + 0.5 * (x * (Q @ x)).sum() - (c * x).sum()
    return f


def numpy_fn(inp: dict, p: dict):
    """Value, gradient and Hessian derived by hand."""
    A, Q, c = inp["A"], inp["Q"], inp["c"]

    def fn(x):
        z = A @ x
        zmax = z.max()
        e = np.exp(z - zmax)
        s = e / e.sum()
        value = zmax + np.log(e.sum()) + 0.5 * x @ Q @ x - c @ x
        hess = A.T @ (s[:, None] * A) - np.outer(A.T @ s, A.T @ s) + Q
        return float(value), (A.T @ s + Q @ x - c, hess)
    return fn


def reference(inp: dict, p: dict) -> Output:
    """Value, gradient and Hessian at the point."""
    return Output(*numpy_fn(inp, p)(inp["x"]))


def total(fn, inp: dict, p: dict) -> dict:
    """The minimiser from Newton's method started at 0, and the value there."""
    x = np.zeros_like(inp["x"])
    for _ in range(NEWTON_MAX):
        v, (g, h) = fn(x)
        if np.max(np.abs(g)) < 1e-10:
            break
        x = x - np.linalg.solve(np.asarray(h), np.asarray(g))
    return {"x": x, "f": np.array(v)}


def _build_nbgrad(inp, p):
    import nbgrad as nb

    f = objective(lambda z: nb.logsumexp(z, 0), *(nb.tensor(inp[k]) for k in "AQc"))
    vgh = nb.jit(lambda x: (f(x), nb.grad(f)(x), nb.hessian(f)(x)))

    def fn(x):
        v, g, h = vgh(nb.tensor(x))
        return v.item(), (g.numpy(), h.numpy())
    return bind(fn, inp["x"])


def _build_torch(inp, p):
    import torch

    f = objective(lambda z: torch.logsumexp(z, 0), *(torch.tensor(inp[k]) for k in "AQc"))

    def fn(x):
        t = torch.tensor(x, requires_grad=True)
        v = f(t)
        (g,) = torch.autograd.grad(v, t)
        h = torch.autograd.functional.hessian(f, t.detach())
        return v.item(), (g.numpy(), h.numpy())
    return bind(fn, inp["x"])


def _build_jax(inp, p):
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    f = objective(logsumexp, *(jnp.asarray(inp[k]) for k in "AQc"))
    vgh = jax.jit(lambda x: (f(x), jax.grad(f)(x), jax.hessian(f)(x)))

    def fn(x):
        v, g, h = vgh(x)
        return float(v), (np.asarray(g), np.asarray(h))
    return bind(fn, inp["x"])


IMPLS = [
    Impl("nbgrad", "jit", "nbgrad jit (hessian)", _build_nbgrad),
    Impl("torch", "eager", "PyTorch eager (autograd.functional.hessian)", _build_torch),
    Impl("jax", "jit", "JAX jit (hessian)", _build_jax),
]
