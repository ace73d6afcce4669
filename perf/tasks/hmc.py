"""T3 HMC: Hamiltonian Monte Carlo on a Bayesian logistic regression, 20 leapfrog steps
per transition, the potential's gradient from each framework.

``U(q) = sum(softplus(X q) - y * X q) + |q|^2 / 2`` (a standard normal prior), X of
500 x 20 with labels from a planted model. One transition: ``(q, p) -> (q', p', dH)``,
20 kick-drift-kick leapfrog steps of size ``EPS`` written as a Python loop (unrolled under
``nbgrad.jit`` and ``jax.jit``), the gradient carried from step to step. The driver
(momenta, the accept test) is NumPy with a fixed seed, so every framework walks the same
chain. Steady state: one transition from a fixed ``(q0, p0)``; total: ``TRANSITIONS``
transitions from ``q = 0``.
"""

from __future__ import annotations

import numpy as np

from ..core import Impl, Output
from .common import bind

ID = "T3"
NAME = "HMC"
DTYPE = "float64"
TITLE = "T3 HMC (logistic regression 500x20, 20 leapfrog steps)"
SIZES = {"tiny": {"n": 40, "d": 4, "transitions": 5},
         "small": {"n": 200, "d": 10, "transitions": 50},
         "full": {"n": 500, "d": 20, "transitions": 100}}
GRAD_INPUTS = ("q", "p")
LEAPFROG = 20
EPS = 0.1
TOTAL = "{transitions} HMC transitions"
TOTAL_TOL = 1e-6


def make_inputs(p: dict, seed: int = 0) -> dict:
    """Data from a planted model, the start ``q0`` and momentum ``p0`` of the timed step."""
    rng = np.random.default_rng(seed)
    n, d = p["n"], p["d"]
    X = rng.standard_normal((n, d)) / np.sqrt(d)
    w_true = rng.standard_normal(d) * 2.0
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-X @ w_true))).astype(np.float64)
    return {"X": X, "y": y, "q": w_true * 0.5, "p": rng.standard_normal(d)}


def leapfrog(value_and_grad, q, p):
    """20 leapfrog steps and the change of energy, for any framework's arrays."""
    u0, g = value_and_grad(q)
    k0 = 0.5 * (p * p).sum()
    for _ in range(LEAPFROG):
        p = p - (0.5 * EPS) * g
        q = q + EPS * p
        u, g = value_and_grad(q)
        p = p - (0.5 * EPS) * g
    return u + 0.5 * (p * p).sum() - u0 - k0, q, p


def numpy_fn(inp: dict, p: dict):
    """One transition in NumPy, the gradient derived by hand."""
    X, y = inp["X"], inp["y"]

    def value_and_grad(q):
        z = X @ q
        return (np.logaddexp(0.0, z) - y * z).sum() + 0.5 * q @ q, \
            X.T @ (1.0 / (1.0 + np.exp(-z)) - y) + q

    def fn(q, mom):
        dh, q, mom = leapfrog(value_and_grad, q, mom)
        return float(dh), (q, mom)
    return fn


def reference(inp: dict, p: dict) -> Output:
    """The change of energy and the end point of one transition."""
    dh, out = numpy_fn(inp, p)(inp["q"], inp["p"])
    return Output(dh, out)


def total(fn, inp: dict, p: dict) -> dict:
    """A chain of ``p["transitions"]`` transitions from 0: its end and acceptances."""
    rng = np.random.default_rng(1)
    d = inp["q"].shape[0]
    q = np.zeros(d)
    accepted = 0
    for _ in range(p["transitions"]):
        mom = rng.standard_normal(d)
        log_u = np.log(rng.random())
        dh, (q_new, _) = fn(q, mom)
        if log_u < -dh:
            q, accepted = np.asarray(q_new), accepted + 1
    return {"q": q, "accepted": np.array(float(accepted))}


def _build_nbgrad(inp, p, jit=True):
    import nbgrad as nb

    X, y = nb.tensor(inp["X"]), nb.tensor(inp["y"])

    def potential(q):
        z = X @ q
        return (nb.softplus(z) - y * z).sum() + 0.5 * (q * q).sum()

    def transition(q, mom):
        return leapfrog(nb.value_and_grad(potential), q, mom)
    transition = nb.jit(transition) if jit else transition

    def fn(q, mom):
        dh, q, mom = transition(nb.tensor(q), nb.tensor(mom))
        return dh.item(), (q.numpy(), mom.numpy())
    return bind(fn, inp["q"], inp["p"])


def _build_torch(inp, p):
    import torch
    import torch.nn.functional as F

    X, y = torch.tensor(inp["X"]), torch.tensor(inp["y"])

    def value_and_grad(q):
        q = q.detach().requires_grad_()
        z = X @ q
        u = (F.softplus(z) - y * z).sum() + 0.5 * (q * q).sum()
        (g,) = torch.autograd.grad(u, q)
        return u.detach(), g

    def fn(q, mom):
        dh, q, mom = leapfrog(value_and_grad, torch.tensor(q), torch.tensor(mom))
        return dh.item(), (q.detach().numpy(), mom.numpy())
    return bind(fn, inp["q"], inp["p"])


def _build_jax(inp, p):
    import jax
    import jax.numpy as jnp

    X, y = jnp.asarray(inp["X"]), jnp.asarray(inp["y"])

    def potential(q):
        z = X @ q
        return (jax.nn.softplus(z) - y * z).sum() + 0.5 * (q * q).sum()

    transition = jax.jit(lambda q, mom: leapfrog(jax.value_and_grad(potential), q, mom))

    def fn(q, mom):
        dh, q, mom = transition(q, mom)
        return float(dh), (np.asarray(q), np.asarray(mom))
    return bind(fn, inp["q"], inp["p"])


IMPLS = [
    Impl("nbgrad", "jit", "nbgrad jit (Python loop)", _build_nbgrad),
    Impl("nbgrad", "eager", "nbgrad eager", lambda inp, p: _build_nbgrad(inp, p, jit=False),
         default=False),
    Impl("torch", "eager", "PyTorch eager", _build_torch),
    Impl("jax", "jit", "JAX jit (Python loop)", _build_jax),
]
