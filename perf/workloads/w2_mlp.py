"""W2 mlp: one SGD step (lr 0.01) of an MLP 784-256-256-10, ReLU, softmax cross-entropy.

Batch 128, float32, mean cross-entropy over the batch. Matmul-bound. Each call of a
step updates the parameters (a training loop); the agreement check uses the
first call, made from the same initial parameters in every implementation, and
compares the loss and the six gradients before the update. The jitted rows (JAX,
``nbgrad:jit``) compile the update with the gradient and return the new parameters;
``nbgrad:jit-grad`` jits only ``value_and_grad`` and updates in place with eager ops.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..core import Impl, Output, nbgrad_jit, require

ID = "W2"
NAME = "mlp"
DTYPE = "float32"
TITLE = "W2 mlp (SGD step, 784-256-256-10, batch 128, float32)"
SIZES = {
    "tiny": {"din": 20, "hidden": 16, "dout": 10, "batch": 8},
    "small": {"din": 784, "hidden": 64, "dout": 10, "batch": 32},
    "full": {"din": 784, "hidden": 256, "dout": 10, "batch": 128},
}
LR = 0.01
PARAMS = ("W1", "b1", "W2", "b2", "W3", "b3")
GRAD_INPUTS = PARAMS


def make_inputs(p: dict, seed: int = 0) -> dict:
    """X (batch x din), integer labels y, and He-initialised weights (x @ W + b layout)."""
    rng = np.random.default_rng(seed)
    dims = [p["din"], p["hidden"], p["hidden"], p["dout"]]
    out = {
        "X": rng.standard_normal((p["batch"], p["din"])).astype(np.float32),
        "y": rng.integers(0, p["dout"], size=p["batch"]).astype(np.int64),
    }
    for k in range(3):
        fan_in, fan_out = dims[k], dims[k + 1]
        out[f"W{k + 1}"] = (rng.standard_normal((fan_in, fan_out))
                            * np.sqrt(2.0 / fan_in)).astype(np.float32)
        out[f"b{k + 1}"] = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
    return out


def reference(inp: dict, p: dict) -> Output:
    """Forward and the hand-derived backward in float64 from the float32 inputs."""
    X = inp["X"].astype(np.float64)
    y = inp["y"]
    W1, b1, W2, b2, W3, b3 = (inp[k].astype(np.float64) for k in PARAMS)
    n = X.shape[0]
    z1 = X @ W1 + b1
    h1 = np.maximum(z1, 0.0)
    z2 = h1 @ W2 + b2
    h2 = np.maximum(z2, 0.0)
    z3 = h2 @ W3 + b3
    m = z3.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(z3 - m).sum(axis=1, keepdims=True))
    logp = z3 - lse
    loss = -float(np.mean(logp[np.arange(n), y]))
    d3 = np.exp(logp)
    d3[np.arange(n), y] -= 1.0
    d3 /= n
    gW3, gb3 = h2.T @ d3, d3.sum(axis=0)
    d2 = (d3 @ W3.T) * (z2 > 0)
    gW2, gb2 = h1.T @ d2, d2.sum(axis=0)
    d1 = (d2 @ W2.T) * (z1 > 0)
    gW1, gb1 = X.T @ d1, d1.sum(axis=0)
    return Output(loss, (gW1, gb1, gW2, gb2, gW3, gb3))


# ---------------------------------------------------------------- nbgrad

def _nbgrad_loss(nb, F):
    def loss(W1, b1, W2, b2, W3, b3, X, y):
        h1 = F.relu(X @ W1 + b1)
        h2 = F.relu(h1 @ W2 + b2)
        return F.cross_entropy(h2 @ W3 + b3, y)
    return loss


def _build_nbgrad_eager(inp, p):
    import nbgrad as nb
    import nbgrad.nn.functional as F

    require(F, "relu", "cross_entropy", what="nbgrad eager")
    params = [nb.tensor(inp[k], requires_grad=True) for k in PARAMS]
    X, y = nb.tensor(inp["X"]), nb.tensor(inp["y"])
    loss_fn = _nbgrad_loss(nb, F)

    def step():
        loss = loss_fn(*params, X, y)
        grads = nb.autograd.grad(loss, params)
        with nb.no_grad():
            for q, g in zip(params, grads, strict=True):
                q.sub_(LR * g)
        return loss, grads
    return step


def _build_nbgrad_jit(inp, p, mode=None):
    """The JAX row's step: gradient and SGD update in one jitted function that returns
    the new parameters (the update fuses into the generated code)."""
    import nbgrad as nb
    import nbgrad.nn.functional as F

    (value_and_grad,) = require(nb, "value_and_grad", what="nbgrad jit")
    require(F, "relu", "cross_entropy", what="nbgrad jit")
    vg = value_and_grad(_nbgrad_loss(nb, F), argnums=(0, 1, 2, 3, 4, 5))

    def train_step(W1, b1, W2, b2, W3, b3, X, y):
        params = (W1, b1, W2, b2, W3, b3)
        value, grads = vg(*params, X, y)
        return value, grads, tuple(q - LR * g for q, g in zip(params, grads, strict=True))

    f = nbgrad_jit(train_step, mode, "nbgrad jit")
    state = {"params": [nb.tensor(inp[k]) for k in PARAMS]}
    X, y = nb.tensor(inp["X"]), nb.tensor(inp["y"])

    def step():
        loss, grads, state["params"] = f(*state["params"], X, y)
        return loss, grads
    return step


def _build_nbgrad_jit_grad(inp, p, mode=None):
    """``nbgrad.jit(value_and_grad(loss))``, the update in place with eager ops."""
    import nbgrad as nb
    import nbgrad.nn.functional as F

    (value_and_grad,) = require(nb, "value_and_grad", what="nbgrad jit")
    require(F, "relu", "cross_entropy", what="nbgrad jit")
    f = nbgrad_jit(value_and_grad(_nbgrad_loss(nb, F), argnums=(0, 1, 2, 3, 4, 5)), mode,
                   "nbgrad jit")
    params = [nb.tensor(inp[k]) for k in PARAMS]
    X, y = nb.tensor(inp["X"]), nb.tensor(inp["y"])

    def step():
        loss, grads = f(*params, X, y)
        with nb.no_grad():
            for q, g in zip(params, grads, strict=True):
                q.sub_(LR * g)
        return loss, grads
    return step


# ---------------------------------------------------------------- peers

def torch_sgd_step(inp, device: str = "cpu"):
    """The PyTorch SGD step of W2 on ``device`` (also used by perf/gpu/bench_gpu.py)."""
    import torch
    import torch.nn.functional as F

    params = [torch.tensor(inp[k], requires_grad=True, device=device) for k in PARAMS]
    X, y = torch.tensor(inp["X"], device=device), torch.tensor(inp["y"], device=device)

    def step():
        W1, b1, W2, b2, W3, b3 = params
        h1 = F.relu(X @ W1 + b1)
        h2 = F.relu(h1 @ W2 + b2)
        loss = F.cross_entropy(h2 @ W3 + b3, y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for q, g in zip(params, grads, strict=True):
                q.add_(g, alpha=-LR)
        return loss, grads
    return step


def _build_torch(inp, p):
    return torch_sgd_step(inp)


def _build_torch_compile(inp, p):
    """``torch.compile`` of the loss (forward, and through AOTAutograd its backward), the
    gradient by ``torch.autograd.grad`` and the SGD update in place, as users compile a
    model and keep their optimiser step."""
    import torch
    import torch.nn.functional as F

    @torch.compile
    def loss_fn(W1, b1, W2, b2, W3, b3, X, y):
        h1 = F.relu(X @ W1 + b1)
        h2 = F.relu(h1 @ W2 + b2)
        return F.cross_entropy(h2 @ W3 + b3, y)

    params = [torch.tensor(inp[k], requires_grad=True) for k in PARAMS]
    X, y = torch.tensor(inp["X"]), torch.tensor(inp["y"])

    def step():
        loss = loss_fn(*params, X, y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for q, g in zip(params, grads, strict=True):
                q.add_(g, alpha=-LR)
        return loss, grads
    return step


def _build_jax(inp, p):
    import jax
    import jax.numpy as jnp

    def loss(params, X, y):
        W1, b1, W2, b2, W3, b3 = params
        h1 = jax.nn.relu(X @ W1 + b1)
        h2 = jax.nn.relu(h1 @ W2 + b2)
        logp = jax.nn.log_softmax(h2 @ W3 + b3, axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def train_step(params, X, y):
        value, grads = jax.value_and_grad(loss)(params, X, y)
        new = tuple(q - LR * g for q, g in zip(params, grads, strict=True))
        return value, grads, new

    state = {"params": tuple(jnp.asarray(inp[k]) for k in PARAMS)}
    X, y = jnp.asarray(inp["X"]), jnp.asarray(inp["y"])

    def step():
        value, grads, state["params"] = jax.block_until_ready(
            train_step(state["params"], X, y))
        return value, grads
    return step


def _build_autograd(inp, p):
    import autograd
    import autograd.numpy as anp
    from autograd.scipy.special import logsumexp

    def loss(W1, b1, W2, b2, W3, b3, X, y):
        h1 = anp.maximum(anp.dot(X, W1) + b1, 0.0)
        h2 = anp.maximum(anp.dot(h1, W2) + b2, 0.0)
        z = anp.dot(h2, W3) + b3
        logp = z - logsumexp(z, axis=1, keepdims=True)
        return -anp.mean(logp[anp.arange(z.shape[0]), y])

    f = autograd.value_and_grad(loss, argnum=(0, 1, 2, 3, 4, 5))
    params = [inp[k].copy() for k in PARAMS]
    X, y = inp["X"], inp["y"]

    def step():
        value, grads = f(*params, X, y)
        for q, g in zip(params, grads, strict=True):
            q -= np.float32(LR) * g
        return value, grads
    return step


# ---------------------------------------------------------------- floor

def _build_floor(inp, p):
    from . import floors

    params = [inp[k].copy() for k in PARAMS]
    X, y = inp["X"], inp["y"]

    def step():
        loss, *grads = floors.w2_sgd_step(*params, X, y, np.float32(LR))
        return loss, tuple(grads)
    return step


IMPLS = [
    Impl("numba", "floor", "hand-written Numba (floor)", _build_floor),
    Impl("nbgrad", "eager", "nbgrad eager", _build_nbgrad_eager),
    Impl("nbgrad", "jit", "nbgrad jit", _build_nbgrad_jit),
    Impl("nbgrad", "jit-grad", "nbgrad jit (value_and_grad only; eager in-place update)",
         _build_nbgrad_jit_grad, default=False),
    Impl("nbgrad", "jit-interpret", "nbgrad jit (tier 1 interpreter)",
         partial(_build_nbgrad_jit, mode="interpret"), default=False),
    Impl("nbgrad", "jit-compile", "nbgrad jit (tier 2 compiled)",
         partial(_build_nbgrad_jit, mode="compile"), default=False),
    Impl("torch", "eager", "PyTorch eager", _build_torch),
    Impl("torch", "compile", "torch.compile (loss; eager grad call and SGD update)",
         _build_torch_compile, default=False),
    Impl("jax", "jit", "JAX jit", _build_jax),
    Impl("autograd", "eager", "HIPS autograd", _build_autograd),
]
