"""W4 hvp: Hessian-vector product of L2-regularised logistic regression.

``f(w) = mean(softplus(X@w) - y*(X@w)) + lam/2 * sum(w**2)``, X of 2000 x 100 float64,
labels in {0, 1}, ``lam = 1e-3``. Every implementation returns the loss and ``H v``.
Eager frameworks differentiate twice (``create_graph``); JAX uses ``jvp`` of ``grad``
(forward-over-reverse, its documented way).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..core import Impl, Output, nbgrad_jit, require

ID = "W4"
NAME = "hvp"
DTYPE = "float64"
TITLE = "W4 hvp (logistic regression, X 2000x100 float64)"
SIZES = {
    "tiny": {"n": 50, "d": 8},
    "small": {"n": 500, "d": 50},
    "full": {"n": 2000, "d": 100},
}
LAM = 1e-3
#: The reference returns H v, not a gradient: the tests check v.Hv by finite differences.
GRAD_INPUTS = ()
HVP_INPUTS = ("w", "v")


def make_inputs(p: dict, seed: int = 0) -> dict:
    """X, labels y (0/1, from a planted model), the point w and the direction v."""
    rng = np.random.default_rng(seed)
    n, d = p["n"], p["d"]
    X = rng.standard_normal((n, d)) / np.sqrt(d)
    w_true = rng.standard_normal(d) * 2.0
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-X @ w_true))).astype(np.float64)
    return {"X": X, "y": y, "w": rng.standard_normal(d), "v": rng.standard_normal(d)}


def reference(inp: dict, p: dict) -> Output:
    """``H v = X^T (s (1 - s) * X v) / n + lam v`` with ``s = sigmoid(X w)``."""
    X, y, w, v = inp["X"], inp["y"], inp["w"], inp["v"]
    z = X @ w
    loss = float(np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * LAM * np.dot(w, w))
    s = 1.0 / (1.0 + np.exp(-z))
    hv = X.T @ (s * (1.0 - s) * (X @ v)) / X.shape[0] + LAM * v
    return Output(loss, (hv,))


# ---------------------------------------------------------------- nbgrad

def _nbgrad_loss(nb):
    def f(w, X, y):
        z = X @ w
        return (nb.softplus(z) - y * z).mean() + 0.5 * LAM * (w * w).sum()
    return f


def _build_nbgrad_eager(inp, p):
    import nbgrad as nb

    require(nb, "softplus", what="nbgrad eager")
    X, y, v = nb.tensor(inp["X"]), nb.tensor(inp["y"]), nb.tensor(inp["v"])
    w = nb.tensor(inp["w"], requires_grad=True)
    f = _nbgrad_loss(nb)

    def step():
        loss = f(w, X, y)
        (g,) = nb.autograd.grad(loss, w, create_graph=True)
        (hv,) = nb.autograd.grad((g * v).sum(), w)
        return loss, (hv,)
    return step


def _unpack_hvp(out):
    """``hvp`` returns ``(value, hvp)``, the hvp possibly as a 1-tuple (torch's form)."""
    value, hv = out
    if isinstance(hv, (tuple, list)):
        (hv,) = hv
    return value, (hv,)


def _build_nbgrad_jit(inp, p, mode=None):
    import nbgrad as nb

    (hvp,) = require(nb, "hvp", what="nbgrad jit")
    f = _nbgrad_loss(nb)

    def hvp_fn(w, v, X, y):
        return hvp(lambda w_: f(w_, X, y), (w,), (v,))

    g = nbgrad_jit(hvp_fn, mode, "nbgrad jit")
    args = tuple(nb.tensor(inp[k]) for k in ("w", "v", "X", "y"))
    return lambda: _unpack_hvp(g(*args))


# ---------------------------------------------------------------- peers

def _build_torch(inp, p):
    import torch
    import torch.nn.functional as F

    X, y, v = (torch.tensor(inp[k]) for k in ("X", "y", "v"))
    w = torch.tensor(inp["w"], requires_grad=True)

    def step():
        z = X @ w
        loss = (F.softplus(z) - y * z).mean() + 0.5 * LAM * (w * w).sum()
        (g,) = torch.autograd.grad(loss, w, create_graph=True)
        (hv,) = torch.autograd.grad((g * v).sum(), w)
        return loss, (hv,)
    return step


def _build_torch_compile(inp, p):
    """``torch.compile`` of ``torch.func.jvp`` of ``grad_and_value`` (forward-over-reverse,
    as the JAX row): compiled graphs do not support double backward (``create_graph``)."""
    import torch
    import torch.nn.functional as F

    def f(w, X, y):
        z = X @ w
        return (F.softplus(z) - y * z).mean() + 0.5 * LAM * (w * w).sum()

    @torch.compile
    def hvp(w, v, X, y):
        gv = torch.func.grad_and_value(lambda w_: f(w_, X, y))
        (_, loss), (hv, _) = torch.func.jvp(gv, (w,), (v,))
        return loss, hv

    w, v, X, y = (torch.tensor(inp[k]) for k in ("w", "v", "X", "y"))

    def step():
        loss, hv = hvp(w, v, X, y)
        return loss, (hv,)
    return step


def _build_jax(inp, p):
    import jax
    import jax.numpy as jnp

    def f(w, X, y):
        z = X @ w
        return jnp.mean(jax.nn.softplus(z) - y * z) + 0.5 * LAM * jnp.sum(w * w)

    @jax.jit
    def hvp(w, v, X, y):
        (loss, _), (_, hv) = jax.jvp(jax.value_and_grad(lambda w_: f(w_, X, y)), (w,), (v,))
        return loss, (hv,)

    args = tuple(jnp.asarray(inp[k]) for k in ("w", "v", "X", "y"))
    return lambda: jax.block_until_ready(hvp(*args))


def _build_autograd(inp, p):
    import autograd
    import autograd.numpy as anp

    X, y, w, v = inp["X"], inp["y"], inp["w"], inp["v"]

    def f(w_):
        z = anp.dot(X, w_)
        return anp.mean(anp.logaddexp(0.0, z) - y * z) + 0.5 * LAM * anp.dot(w_, w_)

    vg = autograd.value_and_grad(f)

    def directional(w_):
        loss, g = vg(w_)
        return anp.dot(g, v), loss

    hvp_and_loss = autograd.grad_and_aux(directional)

    def step():
        hv, loss = hvp_and_loss(w)
        return loss, (hv,)
    return step


# ---------------------------------------------------------------- floor

def _build_floor(inp, p):
    from . import floors

    X, y, w, v = inp["X"], inp["y"], inp["w"], inp["v"]

    def step():
        loss, hv = floors.w4_hvp(X, y, w, v, LAM)
        return loss, (hv,)
    return step


IMPLS = [
    Impl("numba", "floor", "hand-written Numba (floor)", _build_floor),
    Impl("nbgrad", "eager", "nbgrad eager (create_graph)", _build_nbgrad_eager),
    Impl("nbgrad", "jit", "nbgrad jit (hvp)", _build_nbgrad_jit),
    Impl("nbgrad", "jit-interpret", "nbgrad jit (hvp, tier 1 interpreter)",
         partial(_build_nbgrad_jit, mode="interpret"), default=False),
    Impl("nbgrad", "jit-compile", "nbgrad jit (hvp, tier 2 compiled)",
         partial(_build_nbgrad_jit, mode="compile"), default=False),
    Impl("torch", "eager", "PyTorch eager (create_graph)", _build_torch),
    Impl("torch", "compile", "torch.compile (torch.func jvp of grad)", _build_torch_compile,
         default=False),
    Impl("jax", "jit", "JAX jit (jvp of grad)", _build_jax),
    Impl("autograd", "eager", "HIPS autograd", _build_autograd),
]
