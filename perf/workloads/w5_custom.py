"""W5 custom: 50 steps of ``x = 0.9*x + 0.1*softclip(x)`` over 100,000 float64.

``softclip(x) = x / (1 + |x|)`` is a custom Function with a hand-written backward
(``g / (1 + |x|)^2``) in every framework: ``nbgrad.autograd.Function``,
``torch.autograd.Function``, ``jax.custom_vjp``, an ``autograd`` primitive. Loss
``sum(x)``; gradient w.r.t. the initial x. Under ``nbgrad.jit`` two rows: the native
path (the Function's forward and backward use nbgrad ops, so the compiler can inline
them) and the PythonOp path (a Function written in NumPy, which the compiler must call
back into Python for); each row checks from the traced graph that it took its path.
"""

from __future__ import annotations

import contextlib
import io
from functools import partial

import numpy as np

from ..core import Impl, Mismatch, Output, nbgrad_jit, require

ID = "W5"
NAME = "custom"
DTYPE = "float64"
TITLE = "W5 custom Function (50 steps of softclip, 1e5 float64)"
SIZES = {
    "tiny": {"n": 1000, "steps": 5},
    "small": {"n": 10_000, "steps": 50},
    "full": {"n": 100_000, "steps": 50},
}
GRAD_INPUTS = ("x",)


def make_inputs(p: dict, seed: int = 0) -> dict:
    """x0 ~ N(0, 2^2), float64."""
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(p["n"]) * 2.0}


def reference(inp: dict, p: dict) -> Output:
    """Elementwise chain: the gradient is the product of ``0.9 + 0.1/(1+|x_t|)^2``."""
    x = inp["x"].copy()
    g = np.ones_like(x)
    for _ in range(p["steps"]):
        d = 1.0 + np.abs(x)
        g *= 0.9 + 0.1 / (d * d)
        x = 0.9 * x + 0.1 * (x / d)
    return Output(float(np.sum(x)), (g,))


# ---------------------------------------------------------------- nbgrad

def _nbgrad_functions():
    import nbgrad as nb

    class SoftClip(nb.autograd.Function):
        """softclip in nbgrad ops: eligible for the native path under jit."""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x / (1.0 + x.abs())

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            d = 1.0 + x.abs()
            return g / (d * d)

    class SoftClipNumPy(nb.autograd.Function):
        """softclip in NumPy: needs concrete arrays, so jit must use a PythonOp node."""

        @staticmethod
        def forward(ctx, x):
            a = np.asarray(x)
            ctx.save_for_backward(x)
            return nb.tensor(a / (1.0 + np.abs(a)))

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            d = 1.0 + np.abs(np.asarray(x))
            return nb.tensor(np.asarray(g) / (d * d))

    return SoftClip, SoftClipNumPy


def _build_nbgrad_eager(inp, p):
    import nbgrad as nb

    softclip = _nbgrad_functions()[0].apply
    x0 = nb.tensor(inp["x"], requires_grad=True)
    steps = p["steps"]

    def step():
        x = x0
        for _ in range(steps):
            x = 0.9 * x + 0.1 * softclip(x)
        loss = x.sum()
        return loss, nb.autograd.grad(loss, x0)
    return step


def _make_nbgrad_jit(inp, p, which: int, what: str, mode: str | None = None):
    import nbgrad as nb

    value_and_grad, fori_loop = require(nb, "value_and_grad", "fori_loop", what=what)
    softclip = _nbgrad_functions()[which].apply
    steps = p["steps"]

    def loss(x0):
        x = fori_loop(0, steps, lambda i, x: 0.9 * x + 0.1 * softclip(x), x0)
        return x.sum()

    f = nbgrad_jit(value_and_grad(loss), mode, what)
    x0 = nb.tensor(inp["x"])

    def step():
        return f(x0)
    step.compiled, step.args = f, (x0,)
    return step


def _graph_text(step) -> str | None:
    graph = getattr(step.compiled, "graph", None)
    if graph is None:
        return None
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        shown = graph(*step.args)
    return (str(shown) if shown is not None else "") + buf.getvalue()


def _inspect_native(step) -> dict:
    text = _graph_text(step)
    if text is None:
        return {"path": "unverified (no compiled.graph)"}
    if "PythonOp" in text:
        raise Mismatch("the native row's graph contains a PythonOp node")
    return {"path": "native"}


def _inspect_pythonop(step) -> dict:
    text = _graph_text(step)
    if text is None:
        return {"path": "unverified (no compiled.graph)"}
    if "PythonOp" not in text:
        raise Mismatch("the PythonOp row's graph has no PythonOp node")
    return {"path": "PythonOp"}


def _function_unsupported(exc: BaseException) -> str | None:
    """Skip (not fail) while nbgrad.jit says custom Functions are not supported yet."""
    msg = str(exc)
    if type(exc).__name__ == "TracerError" and "Function" in msg and "not supported" in msg:
        return f"nbgrad jit: custom autograd.Function under nbgrad.jit not supported yet ({msg})"
    return None


def _build_nbgrad_jit_native(inp, p, mode=None):
    return _make_nbgrad_jit(inp, p, 0, "nbgrad jit (native custom Function)", mode)


def _build_nbgrad_jit_pythonop(inp, p):
    return _make_nbgrad_jit(inp, p, 1, "nbgrad jit (PythonOp custom Function)")


# ---------------------------------------------------------------- peers

def _torch_softclip():
    import torch

    class SoftClip(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x / (1.0 + x.abs())

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            d = 1.0 + x.abs()
            return g / (d * d)

    return SoftClip


def _build_torch(inp, p, compile_: bool = False):
    """PyTorch eager; with ``compile_``, ``torch.compile`` of ONE step, called ``steps``
    times from Python (as users do: compiling the whole 50-step loop was still in its
    first call after 11 minutes on a 2-core machine)."""
    import torch

    softclip = _torch_softclip().apply
    steps = p["steps"]

    def one_step(x):
        return 0.9 * x + 0.1 * softclip(x)

    if compile_:
        one_step = torch.compile(one_step)
    x0 = torch.tensor(inp["x"], requires_grad=True)

    def step():
        x = x0
        for _ in range(steps):
            x = one_step(x)
        loss = x.sum()
        return loss, torch.autograd.grad(loss, x0)
    return step


def _build_jax(inp, p):
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def softclip(x):
        return x / (1.0 + jnp.abs(x))

    def fwd(x):
        return softclip(x), x

    def bwd(x, g):
        d = 1.0 + jnp.abs(x)
        return (g / (d * d),)

    softclip.defvjp(fwd, bwd)
    steps = p["steps"]

    def loss(x0):
        x = jax.lax.fori_loop(0, steps, lambda i, x: 0.9 * x + 0.1 * softclip(x), x0)
        return jnp.sum(x)

    f = jax.jit(jax.value_and_grad(loss))
    x0 = jnp.asarray(inp["x"])
    return lambda: jax.block_until_ready(f(x0))


def _build_autograd(inp, p):
    import autograd
    import autograd.numpy as anp
    from autograd.extend import defvjp, primitive

    @primitive
    def softclip(x):
        return x / (1.0 + np.abs(x))

    def softclip_vjp(ans, x):
        d = 1.0 + np.abs(x)
        return lambda g: g / (d * d)

    defvjp(softclip, softclip_vjp)
    steps = p["steps"]

    def loss(x):
        for _ in range(steps):
            x = 0.9 * x + 0.1 * softclip(x)
        return anp.sum(x)

    f = autograd.value_and_grad(loss)
    x0 = inp["x"]
    return lambda: f(x0)


# ---------------------------------------------------------------- floor

def _build_floor(inp, p):
    from . import floors

    x0 = inp["x"]
    steps = p["steps"]

    def step():
        loss, g = floors.w5_softclip(x0, steps)
        return loss, (g,)
    return step


IMPLS = [
    Impl("numba", "floor", "hand-written Numba (floor)", _build_floor),
    Impl("nbgrad", "eager", "nbgrad eager (Function)", _build_nbgrad_eager),
    Impl("nbgrad", "jit", "nbgrad jit (native Function, fori_loop)", _build_nbgrad_jit_native,
         inspect=_inspect_native, skip_when=_function_unsupported),
    Impl("nbgrad", "jit-interpret", "nbgrad jit (native Function, tier 1 interpreter)",
         partial(_build_nbgrad_jit_native, mode="interpret"), inspect=_inspect_native,
         skip_when=_function_unsupported, default=False),
    Impl("nbgrad", "jit-compile", "nbgrad jit (native Function, tier 2 compiled)",
         partial(_build_nbgrad_jit_native, mode="compile"), inspect=_inspect_native,
         skip_when=_function_unsupported, default=False),
    Impl("nbgrad", "jit-pythonop", "nbgrad jit (PythonOp Function, fori_loop)",
         _build_nbgrad_jit_pythonop, inspect=_inspect_pythonop,
         skip_when=_function_unsupported),
    Impl("torch", "eager", "PyTorch eager (autograd.Function)", _build_torch),
    Impl("torch", "compile", "torch.compile (autograd.Function; one step compiled, Python loop)",
         partial(_build_torch, compile_=True), default=False),
    Impl("jax", "jit", "JAX jit (custom_vjp, fori_loop)", _build_jax),
    Impl("autograd", "eager", "HIPS autograd (primitive)", _build_autograd),
]
