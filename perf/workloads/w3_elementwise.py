"""W3 elementwise: value and gradient of ``sum(sin(x)*exp(-x*x) + tanh(x))``, 4e6 float64.

Memory-bound; rewards fusing the forward and backward chains into one pass.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..core import Impl, Output, nbgrad_jit, require

ID = "W3"
NAME = "elementwise"
DTYPE = "float64"
TITLE = "W3 elementwise (value and grad, 4e6 float64)"
SIZES = {
    "tiny": {"n": 1000},
    "small": {"n": 100_000},
    "full": {"n": 4_000_000},
}
SCALING_PARAM = "n"
GRAD_INPUTS = ("x",)


def make_inputs(p: dict, seed: int = 0) -> dict:
    """x ~ N(0, 1.5^2), float64."""
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(p["n"]) * 1.5}


def reference(inp: dict, p: dict) -> Output:
    """``d/dx = exp(-x^2) (cos x - 2 x sin x) + 1 - tanh(x)^2``."""
    x = inp["x"]
    e = np.exp(-x * x)
    t = np.tanh(x)
    loss = float(np.sum(np.sin(x) * e + t))
    return Output(loss, (e * (np.cos(x) - 2.0 * x * np.sin(x)) + 1.0 - t * t,))


def _nbgrad_f(nb):
    def f(x):
        return (nb.sin(x) * nb.exp(-x * x) + nb.tanh(x)).sum()
    return f


def _build_nbgrad_eager(inp, p):
    import nbgrad as nb

    x = nb.tensor(inp["x"], requires_grad=True)
    f = _nbgrad_f(nb)

    def step():
        loss = f(x)
        return loss, nb.autograd.grad(loss, x)
    return step


def _build_nbgrad_jit(inp, p, mode=None):
    import nbgrad as nb

    (value_and_grad,) = require(nb, "value_and_grad", what="nbgrad jit")
    g = nbgrad_jit(value_and_grad(_nbgrad_f(nb)), mode, "nbgrad jit")
    x = nb.tensor(inp["x"])
    return lambda: g(x)


def _build_torch(inp, p):
    import torch

    x = torch.tensor(inp["x"], requires_grad=True)

    def step():
        loss = (torch.sin(x) * torch.exp(-x * x) + torch.tanh(x)).sum()
        return loss, torch.autograd.grad(loss, x)
    return step


def _build_torch_compile(inp, p):
    import torch

    def f(x):
        return (torch.sin(x) * torch.exp(-x * x) + torch.tanh(x)).sum()

    cf = torch.compile(f)
    x = torch.tensor(inp["x"], requires_grad=True)

    def step():
        loss = cf(x)
        return loss, torch.autograd.grad(loss, x)
    return step


def _build_jax(inp, p):
    import jax
    import jax.numpy as jnp

    def f(x):
        return jnp.sum(jnp.sin(x) * jnp.exp(-x * x) + jnp.tanh(x))

    g = jax.jit(jax.value_and_grad(f))
    x = jnp.asarray(inp["x"])
    return lambda: jax.block_until_ready(g(x))


def _build_autograd(inp, p):
    import autograd
    import autograd.numpy as anp

    def f(x):
        return anp.sum(anp.sin(x) * anp.exp(-x * x) + anp.tanh(x))

    g = autograd.value_and_grad(f)
    x = inp["x"]
    return lambda: g(x)


def _build_floor(inp, p):
    from . import floors

    x = inp["x"]

    def step():
        loss, gx = floors.w3_elementwise(x)
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
