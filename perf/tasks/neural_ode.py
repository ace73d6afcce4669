"""T4 neural ODE: RK4 through an MLP vector field, the gradient of the final state's
loss with respect to the weights (issue 15 item 3; ``python -m perf.neural_ode`` times
the same functions written four ways).

``f(x) = tanh(x W1^T + b1) W2^T + b2``, an MLP 16-64-16 with a batch of 32 states;
``steps`` = 200 RK4 steps of ``DT`` = 0.01; loss ``sum(x_T ** 2)``; value and gradient with
respect to ``W1, b1, W2, b2``. Rows: nbgrad and JAX jit with the steps as a
``fori_loop``, PyTorch eager with a Python loop. Steady state: one value and gradient;
total: ``train`` steps of gradient descent on the weights (driven by NumPy).
"""

from __future__ import annotations

import numpy as np

from ..core import Impl, Output
from .common import bind

ID = "T4"
NAME = "neural ODE"
DTYPE = "float64"
TITLE = "T4 neural ODE (MLP 16-64-16, batch 32, RK4 200 steps)"
SIZES = {"tiny": {"dim": 3, "hidden": 5, "batch": 2, "steps": 4, "train": 3},
         "small": {"dim": 16, "hidden": 64, "batch": 32, "steps": 50, "train": 10},
         "full": {"dim": 16, "hidden": 64, "batch": 32, "steps": 200, "train": 20}}
GRAD_INPUTS = ("w1", "b1", "w2", "b2")
TOTAL = "{train} gradient-descent steps"
TOTAL_TOL = 1e-8
DT = 0.01
LEARNING_RATE = 1e-3


def arrays(p: dict | None = None, seed: int = 0) -> list[np.ndarray]:
    """``W1, b1, W2, b2, x0`` (at full size, the arrays ``perf.neural_ode`` has always used)."""
    p = p or SIZES["full"]
    rng = np.random.default_rng(seed)
    d, h = p["dim"], p["hidden"]
    return [rng.normal(size=(h, d)) / 4, rng.normal(size=h) / 10,
            rng.normal(size=(d, h)) / 8, rng.normal(size=d) / 10,
            rng.normal(size=(p["batch"], d))]


def make_inputs(p: dict, seed: int = 0) -> dict:
    """The weights and the initial states."""
    return dict(zip((*GRAD_INPUTS, "x0"), arrays(p, seed), strict=True))


def rk4(f, x, params):
    """One RK4 step of ``dx/dt = f(x, *params)``, for any framework's arrays."""
    k1 = f(x, *params)
    k2 = f(x + 0.5 * DT * k1, *params)
    k3 = f(x + 0.5 * DT * k2, *params)
    k4 = f(x + DT * k3, *params)
    return x + (DT / 6) * (k1 + 2 * k2 + 2 * k3 + k4)


def _mlp_vjp(x, w1, b1, w2, c, acc):
    """The cotangent of ``x`` for the MLP at ``x`` and output cotangent ``c``; adds the
    weights' cotangents to ``acc``."""
    h = np.tanh(x @ w1.T + b1)
    acc[2] += c.T @ h
    acc[3] += c.sum(0)
    da = (c @ w2) * (1.0 - h * h)
    acc[0] += da.T @ x
    acc[1] += da.sum(0)
    return da @ w1


def numpy_value_and_grad(w1, b1, w2, b2, x0, steps):
    """Loss and weight gradients in NumPy, backpropagated through RK4 by hand."""
    def f(x):
        return np.tanh(x @ w1.T + b1) @ w2.T + b2

    tape, x = [], x0
    for _ in range(steps):
        k1 = f(x)
        x2 = x + 0.5 * DT * k1
        k2 = f(x2)
        x3 = x + 0.5 * DT * k2
        k3 = f(x3)
        x4 = x + DT * k3
        tape.append((x, x2, x3, x4))
        x = x + (DT / 6) * (k1 + 2 * k2 + 2 * k3 + f(x4))
    loss = float((x * x).sum())
    acc = [np.zeros_like(a) for a in (w1, b1, w2, b2)]
    cx = 2.0 * x
    for x, x2, x3, x4 in reversed(tape):
        ck1, ck2, ck3, ck4 = (DT / 6) * cx, (DT / 3) * cx, (DT / 3) * cx, (DT / 6) * cx
        c4 = _mlp_vjp(x4, w1, b1, w2, ck4, acc)
        ck3 = ck3 + DT * c4
        c3 = _mlp_vjp(x3, w1, b1, w2, ck3, acc)
        ck2 = ck2 + 0.5 * DT * c3
        c2 = _mlp_vjp(x2, w1, b1, w2, ck2, acc)
        ck1 = ck1 + 0.5 * DT * c2
        cx = cx + c4 + c3 + c2 + _mlp_vjp(x, w1, b1, w2, ck1, acc)
    return loss, tuple(acc)


def numpy_fn(inp: dict, p: dict):
    """The evaluation in NumPy."""
    return lambda *w: numpy_value_and_grad(*w, inp["x0"], p["steps"])


def reference(inp: dict, p: dict) -> Output:
    """Loss and weight gradients at the initial weights."""
    return Output(*numpy_fn(inp, p)(*(inp[k] for k in GRAD_INPUTS)))


def total(fn, inp: dict, p: dict) -> dict:
    """``p["train"]`` steps of gradient descent: the weights and the loss at the end."""
    w = [inp[k] for k in GRAD_INPUTS]
    for _ in range(p["train"]):
        loss, grads = fn(*w)
        w = [a - LEARNING_RATE * np.asarray(g) for a, g in zip(w, grads, strict=True)]
    return {"loss": np.array(loss), **dict(zip(GRAD_INPUTS, w, strict=True))}


# ---------------------------------------------------------------- framework losses

def nbgrad_loss(steps: int, loop: str = "fori_loop", linear: str = "@"):
    """``loss(w1, b1, w2, b2, x)`` with nbgrad: the steps as ``nbgrad.fori_loop``
    (``loop="fori_loop"``) or a Python loop (``"python loop"``), the layers as
    ``x @ w.T + b`` (``linear="@"``) or ``F.linear``."""
    import nbgrad as nb
    import nbgrad.nn.functional as F

    lin = F.linear if linear == "F.linear" else (lambda x, w, b: x @ w.T + b)

    def f(x, w1, b1, w2, b2):
        return lin(nb.tanh(lin(x, w1, b1)), w2, b2)

    def loss(w1, b1, w2, b2, x):
        p = (w1, b1, w2, b2)
        if loop == "fori_loop":
            x = nb.fori_loop(0, steps, lambda i, x: rk4(f, x, p), x)
        elif loop == "python loop":
            for _ in range(steps):
                x = rk4(f, x, p)
        else:
            raise ValueError(f"nbgrad_loss: loop must be 'fori_loop' or 'python loop', "
                             f"got {loop!r}")
        return (x * x).sum()
    return loss


def jax_loss(steps: int):
    """``loss(w1, b1, w2, b2, x)`` with JAX, the steps as ``lax.fori_loop``."""
    import jax
    import jax.numpy as jnp

    def f(x, w1, b1, w2, b2):
        return jnp.tanh(x @ w1.T + b1) @ w2.T + b2

    def loss(w1, b1, w2, b2, x):
        p = (w1, b1, w2, b2)
        x = jax.lax.fori_loop(0, steps, lambda i, x: rk4(f, x, p), x)
        return (x * x).sum()
    return loss


def _build_nbgrad(inp, p):
    import nbgrad as nb

    vg = nb.jit(nb.value_and_grad(nbgrad_loss(p["steps"]), argnums=(0, 1, 2, 3)))
    x0 = nb.tensor(inp["x0"])

    def fn(*w):
        v, g = vg(*(nb.tensor(a) for a in w), x0)
        return v.item(), tuple(t.numpy() for t in g)
    return bind(fn, *(inp[k] for k in GRAD_INPUTS))


def _build_torch(inp, p):
    import torch

    x0, steps = torch.tensor(inp["x0"]), p["steps"]

    def f(x, w1, b1, w2, b2):
        return torch.tanh(x @ w1.T + b1) @ w2.T + b2

    def fn(*w):
        params = [torch.tensor(a, requires_grad=True) for a in w]
        x = x0
        for _ in range(steps):
            x = rk4(f, x, params)
        loss = (x * x).sum()
        grads = torch.autograd.grad(loss, params)
        return loss.item(), tuple(g.numpy() for g in grads)
    return bind(fn, *(inp[k] for k in GRAD_INPUTS))


def _build_jax(inp, p):
    import jax

    vg = jax.jit(jax.value_and_grad(jax_loss(p["steps"]), argnums=(0, 1, 2, 3)))
    x0 = inp["x0"]

    def fn(*w):
        v, g = vg(*w, x0)
        return float(v), tuple(np.asarray(t) for t in g)
    return bind(fn, *(inp[k] for k in GRAD_INPUTS))


IMPLS = [
    Impl("nbgrad", "jit", "nbgrad jit (fori_loop)", _build_nbgrad),
    Impl("torch", "eager", "PyTorch eager (Python loop)", _build_torch),
    Impl("jax", "jit", "JAX jit (fori_loop)", _build_jax),
]
