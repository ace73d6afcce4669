"""W1 rollout: 1000 Euler steps of a 16-dim state; loss and gradients w.r.t. W and b.

``x = x + dt*tanh(W@x + b) - dt*0.1*x`` from ``x0``, ``dt = 0.01``; loss ``sum(x**2)``.
Thousands of tiny ops: per-op overhead, and loops kept as loops in compiled code
(``fori_loop``, and an unrolled Python loop under jit as a separate row).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..core import Impl, Output, nbgrad_jit, require

ID = "W1"
NAME = "rollout"
DTYPE = "float64"
TITLE = "W1 rollout (1000 Euler steps, 16-dim state; grad W, b)"
SIZES = {
    "tiny": {"n": 16, "steps": 20},
    "small": {"n": 16, "steps": 100},
    "full": {"n": 16, "steps": 1000},
}
#: The parameter a scaling run varies.
SCALING_PARAM = "steps"
#: Inputs the gradients are taken with respect to, in order.
GRAD_INPUTS = ("W", "b")
DT = 0.01
DECAY = 0.1


def make_inputs(p: dict, seed: int = 0) -> dict:
    """W (n x n), b (n), x0 (n), float64."""
    rng = np.random.default_rng(seed)
    n = p["n"]
    return {
        "W": rng.standard_normal((n, n)) / np.sqrt(n),
        "b": rng.standard_normal(n) * 0.1,
        "x0": rng.standard_normal(n),
    }


def reference(inp: dict, p: dict) -> Output:
    """NumPy forward, then the hand-derived adjoint loop."""
    W, b, x = inp["W"], inp["b"], inp["x0"]
    xs, hs = [x], []
    for _ in range(p["steps"]):
        h = np.tanh(W @ x + b)
        hs.append(h)
        x = x + DT * h - DT * DECAY * x
        xs.append(x)
    loss = float(np.sum(x * x))
    gx = 2.0 * x
    gW = np.zeros_like(W)
    gb = np.zeros_like(b)
    for t in range(p["steps"] - 1, -1, -1):
        ga = gx * DT * (1.0 - hs[t] ** 2)
        gb += ga
        gW += np.outer(ga, xs[t])
        gx = gx * (1.0 - DT * DECAY) + W.T @ ga
    return Output(loss, (gW, gb))


# ---------------------------------------------------------------- nbgrad

def _nbgrad_loss_python_loop(nb, steps):
    def loss(W, b, x0):
        x = x0
        for _ in range(steps):
            x = x + DT * nb.tanh(W @ x + b) - DT * DECAY * x
        return (x * x).sum()
    return loss


def _build_nbgrad_eager(inp, p):
    import nbgrad as nb

    W = nb.tensor(inp["W"], requires_grad=True)
    b = nb.tensor(inp["b"], requires_grad=True)
    x0 = nb.tensor(inp["x0"])
    loss_fn = _nbgrad_loss_python_loop(nb, p["steps"])

    def step():
        loss = loss_fn(W, b, x0)
        return loss, nb.autograd.grad(loss, (W, b))
    return step


def _build_nbgrad_jit(inp, p, mode=None):
    import nbgrad as nb

    value_and_grad, fori_loop = require(nb, "value_and_grad", "fori_loop", what="nbgrad jit")
    steps = p["steps"]

    def loss(W, b, x0):
        def body(i, x):
            return x + DT * nb.tanh(W @ x + b) - DT * DECAY * x
        x = fori_loop(0, steps, body, x0)
        return (x * x).sum()

    f = nbgrad_jit(value_and_grad(loss, argnums=(0, 1)), mode, "nbgrad jit")
    args = (nb.tensor(inp["W"]), nb.tensor(inp["b"]), nb.tensor(inp["x0"]))
    return lambda: f(*args)


def _build_nbgrad_jit_unrolled(inp, p):
    import nbgrad as nb

    (value_and_grad,) = require(nb, "value_and_grad", what="nbgrad jit")
    f = nbgrad_jit(value_and_grad(_nbgrad_loss_python_loop(nb, p["steps"]), argnums=(0, 1)),
                   None, "nbgrad jit")
    args = (nb.tensor(inp["W"]), nb.tensor(inp["b"]), nb.tensor(inp["x0"]))
    return lambda: f(*args)


# ---------------------------------------------------------------- peers

def _build_torch(inp, p, compile_: bool = False):
    """PyTorch eager; with ``compile_``, ``torch.compile`` of ONE Euler step, called
    ``steps`` times from Python, as users do: compiling the whole unrolled loop took 169 s
    for 100 steps on a 2-core machine (so far longer for 1000). The first call compiles
    two graphs: ``x0`` needs no gradient, the later states do."""
    import torch

    def euler_step(x, W, b):
        return x + DT * torch.tanh(W @ x + b) - DT * DECAY * x

    if compile_:
        euler_step = torch.compile(euler_step)
    W = torch.tensor(inp["W"], requires_grad=True)
    b = torch.tensor(inp["b"], requires_grad=True)
    x0 = torch.tensor(inp["x0"])
    steps = p["steps"]

    def step():
        x = x0
        for _ in range(steps):
            x = euler_step(x, W, b)
        loss = (x * x).sum()
        return loss, torch.autograd.grad(loss, (W, b))
    return step


def _build_jax(inp, p):
    import jax
    import jax.numpy as jnp

    steps = p["steps"]

    def loss(W, b, x0):
        def body(i, x):
            return x + DT * jnp.tanh(W @ x + b) - DT * DECAY * x
        x = jax.lax.fori_loop(0, steps, body, x0)
        return jnp.sum(x * x)

    f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    args = tuple(jnp.asarray(inp[k]) for k in ("W", "b", "x0"))
    return lambda: jax.block_until_ready(f(*args))


def _build_autograd(inp, p):
    import autograd
    import autograd.numpy as anp

    steps = p["steps"]

    def loss(W, b, x0):
        x = x0
        for _ in range(steps):
            x = x + DT * anp.tanh(anp.dot(W, x) + b) - DT * DECAY * x
        return anp.sum(x * x)

    f = autograd.value_and_grad(loss, argnum=(0, 1))
    W, b, x0 = inp["W"], inp["b"], inp["x0"]
    return lambda: f(W, b, x0)


# ---------------------------------------------------------------- floor

def _build_floor(inp, p):
    from . import floors

    W, b, x0 = inp["W"], inp["b"], inp["x0"]
    steps = p["steps"]

    def step():
        loss, gW, gb = floors.w1_rollout(W, b, x0, steps, DT)
        return loss, (gW, gb)
    return step


IMPLS = [
    Impl("numba", "floor", "hand-written Numba (floor)", _build_floor),
    Impl("nbgrad", "eager", "nbgrad eager", _build_nbgrad_eager),
    Impl("nbgrad", "jit", "nbgrad jit (fori_loop)", _build_nbgrad_jit),
    Impl("nbgrad", "jit-unrolled", "nbgrad jit (unrolled Python loop)",
         _build_nbgrad_jit_unrolled),
    Impl("nbgrad", "jit-interpret", "nbgrad jit (fori_loop, tier 1 interpreter)",
         partial(_build_nbgrad_jit, mode="interpret"), default=False),
    Impl("nbgrad", "jit-compile", "nbgrad jit (fori_loop, tier 2 compiled)",
         partial(_build_nbgrad_jit, mode="compile"), default=False),
    Impl("torch", "eager", "PyTorch eager", _build_torch),
    Impl("torch", "compile", "torch.compile (one step compiled, Python loop)",
         partial(_build_torch, compile_=True), default=False),
    Impl("jax", "jit", "JAX jit (fori_loop)", _build_jax),
    Impl("autograd", "eager", "HIPS autograd", _build_autograd),
]
