"""W6 tiny ops: x of 8 float64; 100 times ``y = y*1.0001 + 0.001``; loss ``sum(y)``; backward.

Eager per-op latency. The table also gives microseconds per op: the whole call
(forward and backward) divided by the 200 forward ops (a mul and an add per step).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..core import Impl, Output, nbgrad_jit, require

ID = "W6"
NAME = "tiny_ops"
DTYPE = "float64"
TITLE = "W6 tiny ops (200 ops on 8 float64, forward + backward)"
SIZES = {
    "tiny": {"n": 8, "steps": 20},
    "small": {"n": 8, "steps": 100},
    "full": {"n": 8, "steps": 100},
}
GRAD_INPUTS = ("x",)
A = 1.0001
B = 0.001


def ops_per_call(p: dict) -> int:
    """Forward ops counted for the microseconds-per-op figure (a mul and an add a step)."""
    return 2 * p["steps"]


def make_inputs(p: dict, seed: int = 0) -> dict:
    """x ~ N(0, 1), float64."""
    return {"x": np.random.default_rng(seed).standard_normal(p["n"])}


def reference(inp: dict, p: dict) -> Output:
    """The gradient of every element is ``1.0001**steps``."""
    y = inp["x"].copy()
    for _ in range(p["steps"]):
        y = y * A + B
    return Output(float(np.sum(y)), (np.full_like(y, A ** p["steps"]),))


def _build_nbgrad_eager(inp, p):
    import nbgrad as nb

    x = nb.tensor(inp["x"], requires_grad=True)
    steps = p["steps"]

    def step():
        y = x
        for _ in range(steps):
            y = y * A + B
        loss = y.sum()
        return loss, nb.autograd.grad(loss, x)
    return step


def _build_nbgrad_jit(inp, p, mode=None):
    import nbgrad as nb

    (value_and_grad,) = require(nb, "value_and_grad", what="nbgrad jit")
    steps = p["steps"]

    def f(x):
        y = x
        for _ in range(steps):
            y = y * A + B
        return y.sum()

    g = nbgrad_jit(value_and_grad(f), mode, "nbgrad jit")
    x = nb.tensor(inp["x"])
    return lambda: g(x)


def _build_torch(inp, p):
    import torch

    x = torch.tensor(inp["x"], requires_grad=True)
    steps = p["steps"]

    def step():
        y = x
        for _ in range(steps):
            y = y * A + B
        loss = y.sum()
        return loss, torch.autograd.grad(loss, x)
    return step


def _build_torch_compile(inp, p):
    """``torch.compile`` of the whole 100-step function (it compiles in seconds)."""
    import torch

    steps = p["steps"]

    @torch.compile
    def f(x):
        y = x
        for _ in range(steps):
            y = y * A + B
        return y.sum()

    x = torch.tensor(inp["x"], requires_grad=True)

    def step():
        loss = f(x)
        return loss, torch.autograd.grad(loss, x)
    return step


def _build_jax(inp, p):
    import jax
    import jax.numpy as jnp

    steps = p["steps"]

    def f(x):
        y = x
        for _ in range(steps):
            y = y * A + B
        return jnp.sum(y)

    g = jax.jit(jax.value_and_grad(f))
    x = jnp.asarray(inp["x"])
    return lambda: jax.block_until_ready(g(x))


def _build_autograd(inp, p):
    import autograd
    import autograd.numpy as anp

    steps = p["steps"]

    def f(x):
        y = x
        for _ in range(steps):
            y = y * A + B
        return anp.sum(y)

    g = autograd.value_and_grad(f)
    x = inp["x"]
    return lambda: g(x)


def _build_floor(inp, p):
    from . import floors

    x = inp["x"]
    steps = p["steps"]

    def step():
        loss, gx = floors.w6_tiny(x, steps, A, B)
        return loss, (gx,)
    return step


IMPLS = [
    Impl("numba", "floor", "hand-written Numba (floor)", _build_floor),
    Impl("nbgrad", "eager", "nbgrad eager", _build_nbgrad_eager),
    Impl("nbgrad", "jit", "nbgrad jit", _build_nbgrad_jit),
    Impl("nbgrad", "jit-interpret", "nbgrad jit (tier 1 interpreter)",
         partial(_build_nbgrad_jit, mode="interpret"), default=False),
    Impl("nbgrad", "jit-compile", "nbgrad jit (tier 2 compiled)",
         partial(_build_nbgrad_jit, mode="compile"), default=False),
    Impl("torch", "eager", "PyTorch eager", _build_torch),
    Impl("torch", "compile", "torch.compile", _build_torch_compile, default=False),
    Impl("jax", "jit", "JAX jit", _build_jax),
    Impl("autograd", "eager", "HIPS autograd", _build_autograd),
]

