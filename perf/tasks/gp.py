"""T2 GP: the negative log marginal likelihood of a Gaussian process and its gradient
with respect to the hyperparameters (issue 15 item 6; ``python -m perf.gp_task`` times
the same functions with more rows).

An RBF kernel ``K = s2 exp(-|xi - xj|^2 / (2 l^2)) + noise I`` over ``n`` = 300 points
in 2-D, hyperparameters ``theta = (log l, log s2, log noise)``;
``NLL = 0.5 y^T K^-1 y + sum log diag L + n/2 log 2 pi`` with ``L = cholesky(K)`` and
``K^-1 y`` through one triangular solve (``|L^-1 y|^2``). Steady state: one NLL and
gradient at ``THETA``; total: the hyperparameters fitted by SciPy's L-BFGS-B from there.
"""

from __future__ import annotations

import math

import numpy as np

from ..core import Output
from .common import bind, jax_value_and_grad, minimize, nbgrad_value_and_grad, value_and_grad_impls

ID = "T2"
NAME = "GP"
DTYPE = "float64"
TITLE = "T2 GP (RBF kernel NLL and gradient, 300 points)"
SIZES = {"tiny": {"n": 20}, "small": {"n": 100}, "full": {"n": 300}}
GRAD_INPUTS = ("theta",)
TOTAL = "L-BFGS-B fit of the hyperparameters"
TOTAL_TOL = 1e-3

THETA = np.array([math.log(0.7), math.log(1.3), math.log(0.05)])  # log l, log s2, log noise
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def data(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Points ``x`` (n x 2) and noisy targets ``y``."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (n, 2))
    y = np.sin(x[:, 0]) * np.cos(x[:, 1]) + 0.1 * rng.standard_normal(n)
    return x, y


def sqdist(x: np.ndarray) -> np.ndarray:
    """Squared distances between all pairs of rows."""
    return ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)


def make_inputs(p: dict, seed: int = 0) -> dict:
    """Squared distances, targets and the start ``THETA`` (the data's seed is fixed)."""
    x, y = data(p["n"])
    return {"d2": sqdist(x), "y": y, "theta": THETA.copy()}


def nll_and_grad(theta: np.ndarray, d2: np.ndarray, y: np.ndarray):
    """NLL and its gradient in NumPy/SciPy: ``dNLL/dt = 0.5 tr((K^-1 - a a^T) dK/dt)``."""
    import scipy.linalg

    ls, s2, noise = np.exp(theta)
    n = len(y)
    rbf = s2 * np.exp(-0.5 * d2 / ls ** 2)
    low = np.linalg.cholesky(rbf + noise * np.eye(n))
    a = scipy.linalg.solve_triangular(low, y, lower=True)
    value = 0.5 * a @ a + np.log(np.diag(low)).sum() + n * HALF_LOG_2PI
    alpha = scipy.linalg.cho_solve((low, True), y)
    w = scipy.linalg.cho_solve((low, True), np.eye(n)) - np.outer(alpha, alpha)
    grads = [rbf * d2 / ls ** 2, rbf, noise * np.eye(n)]
    return float(value), np.array([0.5 * np.sum(w * dk) for dk in grads])


def reference(inp: dict, p: dict) -> Output:
    """NLL and gradient at ``THETA``."""
    v, g = nll_and_grad(inp["theta"], inp["d2"], inp["y"])
    return Output(v, (g,))


def numpy_fn(inp: dict, p: dict):
    """The evaluation in NumPy/SciPy."""
    def fn(theta):
        v, g = nll_and_grad(theta, inp["d2"], inp["y"])
        return v, (g,)
    return fn


def total(fn, inp: dict, p: dict) -> dict:
    """The fitted hyperparameters and the NLL there."""
    res = minimize(fn, inp["theta"])
    return {"theta": res.x, "nll": np.array(res.fun)}


def nbgrad_nll(d2: np.ndarray, y: np.ndarray):
    """The NLL of ``theta`` written with nbgrad (the data captured as tensors)."""
    import nbgrad as nb

    n = len(y)
    D2, Y, EYE = nb.tensor(d2), nb.tensor(y), nb.tensor(np.eye(n))

    def nll(t):
        ls, s2, noise = nb.exp(t[0]), nb.exp(t[1]), nb.exp(t[2])
        k = s2 * nb.exp(-0.5 * D2 / (ls * ls)) + noise * EYE
        low = nb.linalg.cholesky(k)
        a = nb.linalg.solve_triangular(low, Y, lower=True)
        return 0.5 * (a * a).sum() + nb.log(nb.diagonal(low)).sum() + n * HALF_LOG_2PI
    return nll


def torch_value_and_grad(d2: np.ndarray, y: np.ndarray):
    """``theta (NumPy) -> (NLL, gradient)`` with PyTorch eager autograd."""
    import torch

    n = len(y)
    D2, Y = torch.tensor(d2), torch.tensor(y)[:, None]
    EYE = torch.eye(n, dtype=torch.float64)

    def value_and_grad(theta):
        t = torch.tensor(theta, requires_grad=True)
        ls, s2, noise = t.exp()
        k = s2 * torch.exp(-0.5 * D2 / (ls * ls)) + noise * EYE
        low = torch.linalg.cholesky(k)
        a = torch.linalg.solve_triangular(low, Y, upper=False)
        v = 0.5 * (a * a).sum() + low.diagonal().log().sum() + n * HALF_LOG_2PI
        (g,) = torch.autograd.grad(v, t)
        return v.item(), g.numpy()
    return value_and_grad


def jax_nll(d2: np.ndarray, y: np.ndarray):
    """The NLL of ``theta`` written with JAX (float64 must be enabled)."""
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl

    n = len(y)
    D2, Y = jnp.asarray(d2), jnp.asarray(y)

    def nll(t):
        ls, s2, noise = jnp.exp(t)
        k = s2 * jnp.exp(-0.5 * D2 / (ls * ls)) + noise * jnp.eye(n)
        low = jnp.linalg.cholesky(k)
        a = jsl.solve_triangular(low, Y, lower=True)
        return 0.5 * a @ a + jnp.log(jnp.diag(low)).sum() + n * HALF_LOG_2PI
    return nll


def _build_nbgrad(inp, p, jit=True):
    return nbgrad_value_and_grad(nbgrad_nll(inp["d2"], inp["y"]), inp["theta"], jit)


def _build_torch(inp, p):
    vg = torch_value_and_grad(inp["d2"], inp["y"])

    def fn(theta):
        v, g = vg(theta)
        return v, (g,)
    return bind(fn, inp["theta"])


def _build_jax(inp, p):
    return jax_value_and_grad(jax_nll(inp["d2"], inp["y"]), inp["theta"])


IMPLS = value_and_grad_impls(_build_nbgrad, _build_torch, _build_jax)
