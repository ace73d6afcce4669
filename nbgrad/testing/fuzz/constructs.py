"""Constructs beyond single table ops: custom autograd Functions and loop bodies.

Each has a callable and the nbgrad source it stands for (used by reproducers), kept
side by side so that the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ... import ops as nb
from ...autograd import Function
from ...factories import tensor
from ...jit import fori_loop
from ...jit import scan as _scan


class Softclip(Function):
    """softclip(x) = x / (1 + |x|) with a hand-written backward (traceable: native path)."""

    @staticmethod
    def forward(ctx, x):
        d = 1.0 + nb.abs(x)
        ctx.save_for_backward(d)
        return x / d

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        return g / (d * d)


class ScaledMul(Function):
    """``scale * a * b`` for same-shaped ``a`` and ``b``; a Python number on ``ctx``."""

    @staticmethod
    def forward(ctx, a, b, scale):
        ctx.save_for_backward(a, b)
        ctx.scale = scale
        return a * b * scale

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * b * ctx.scale, g * a * ctx.scale, None


class SoftclipNumpy(Function):
    """Softclip written in NumPy on ``x.numpy()``: not traceable (the PythonOp path)."""

    @staticmethod
    def forward(ctx, x):
        a = x.numpy()
        d = 1.0 + np.abs(a)
        ctx.d = d
        return tensor(a / d, device=x.device)

    @staticmethod
    def backward(ctx, g):
        return tensor(g.numpy() / (ctx.d * ctx.d), device=g.device)


class ScaledMulNumpy(Function):
    """``scale * a * b`` written in NumPy (the PythonOp path with two tensor arguments and
    a Python number: the runners' general case); saves its inputs, and its backward
    returns a gradient per argument (None for ``scale``)."""

    @staticmethod
    def forward(ctx, a, b, scale):
        ctx.save_for_backward(a, b)
        ctx.scale = scale
        return tensor(a.numpy() * b.numpy() * scale, device=a.device)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        gs = g.numpy() * ctx.scale
        return (tensor(gs * b.numpy(), device=g.device), tensor(gs * a.numpy(), device=g.device),
                None)


class SinCosNumpy(Function):
    """``(sin x, cos x)`` written in NumPy: a PythonOp with two outputs (its backward gets
    two gradients, zeros for an output nothing reads)."""

    @staticmethod
    def forward(ctx, x):
        a = x.numpy()
        ctx.a = a
        return tensor(np.sin(a), device=x.device), tensor(np.cos(a), device=x.device)

    @staticmethod
    def backward(ctx, gs, gc):
        a = ctx.a
        return tensor(gs.numpy() * np.cos(a) - gc.numpy() * np.sin(a), device=gs.device)

    @staticmethod
    def mix(x, both: bool):
        """``sin x * cos x + 0.5 sin x`` (``both``), else ``0.5 sin x`` (cos unread)."""
        s, c = SinCosNumpy.apply(x)
        return s * c + 0.5 * s if both else 0.5 * s


#: custom Functions by step name: (apply, source of the call with ``{0}``, ``{1}``, ``{p0}``)
FUNCTIONS: dict[str, tuple[Callable, str]] = {
    "fn_softclip": (lambda xs, p: Softclip.apply(xs[0]), "Softclip.apply({0})"),
    "fn_scaled_mul": (lambda xs, p: ScaledMul.apply(xs[0], xs[1], p[0]),
                      "ScaledMul.apply({0}, {1}, {p0!r})"),
    "fn_softclip_numpy": (lambda xs, p: SoftclipNumpy.apply(xs[0]),
                          "SoftclipNumpy.apply({0})"),
    "fn_scaled_mul_numpy": (lambda xs, p: ScaledMulNumpy.apply(xs[0], xs[1], p[0]),
                            "ScaledMulNumpy.apply({0}, {1}, {p0!r})"),
    "fn_sincos_numpy": (lambda xs, p: SinCosNumpy.mix(xs[0], p[0]),
                        "SinCosNumpy.mix({0}, {p0!r})"),
}

#: fori_loop bodies ``(i, c, w) -> c`` (``w``: a value closed over that broadcasts to ``c``)
FORI_BODIES: dict[str, tuple[Callable, str]] = {
    "decay": (lambda i, c, w: 0.5 * c + nb.tanh(w), "0.5 * c + nb.tanh({w})"),
    "index": (lambda i, c, w: 0.8 * c + 0.1 * i + 0.1 * w, "0.8 * c + 0.1 * i + 0.1 * {w}"),
    "index_cast": (lambda i, c, w: 0.8 * c + (0.1 * i).to(c.dtype) + 0.1 * w,
                   "0.8 * c + (0.1 * i).to(c.dtype) + 0.1 * {w}"),
    "gate": (lambda i, c, w: c * nb.sigmoid(w) + 0.1 * nb.sin(c),
             "c * nb.sigmoid({w}) + 0.1 * nb.sin(c)"),
    "quadratic": (lambda i, c, w: c - 0.1 * c * c + 0.2 * w, "c - 0.1 * c * c + 0.2 * {w}"),
    # the counter indexes a closed-over value (dynamic_slice) and updates the carry
    # (dynamic_update_slice through .at)
    "index_read": (lambda i, c, w: 0.7 * c + 0.3 * nb.sin(w.reshape(-1)[i % w.size]),
                   "0.7 * c + 0.3 * nb.sin({w}.reshape(-1)[i % {w}.size])"),
    "index_update": (lambda i, c, w: c.reshape(-1).at[i % c.size].multiply(0.5).reshape(
        c.shape) + 0.1 * w,
        "c.reshape(-1).at[i % c.size].multiply(0.5).reshape(c.shape) + 0.1 * {w}"),
}

#: NumPy's spellings of fori bodies (the same ops, reached through nbgrad.numpy_interop)
FORI_BODIES.update({
    "np_decay": (lambda i, c, w: 0.5 * c + np.tanh(w), "0.5 * c + np.tanh({w})"),
    "np_gate": (lambda i, c, w: np.multiply(c, nb.sigmoid(w)) + 0.1 * np.sin(c),
                "np.multiply(c, nb.sigmoid({w})) + 0.1 * np.sin(c)"),
    "np_quadratic": (lambda i, c, w: np.subtract(c, 0.1 * c * c) + 0.2 * w,
                     "np.subtract(c, 0.1 * c * c) + 0.2 * {w}"),
    "np_index": (lambda i, c, w: np.add(0.8 * c, 0.1 * i) + 0.1 * w,
                 "np.add(0.8 * c, 0.1 * i) + 0.1 * {w}"),
})

#: scan bodies ``(c, x) -> (c, y)``; ``full``: the carry has the shape of ``x``, else 0-d
SCAN_BODIES: dict[str, tuple[Callable, str]] = {
    "accumulate": (lambda c, x: (0.7 * c + nb.sin(x), (0.7 * c + nb.sin(x)) * x),
                   "(0.7 * c + nb.sin(x), (0.7 * c + nb.sin(x)) * x)"),
    "accumulate_0d": (lambda c, x: (0.7 * c + nb.sin(x).sum(), c * x),
                      "(0.7 * c + nb.sin(x).sum(), c * x)"),
    "gate": (lambda c, x: (c * nb.sigmoid(x) + x, nb.tanh(c)),
             "(c * nb.sigmoid(x) + x, nb.tanh(c))"),
    "gate_0d": (lambda c, x: (c * nb.sigmoid(x.sum()) + 0.5 * x.mean(), nb.tanh(c) * x),
                "(c * nb.sigmoid(x.sum()) + 0.5 * x.mean(), nb.tanh(c) * x)"),
}


SCAN_BODIES.update({
    "np_accumulate": (lambda c, x: (0.7 * c + np.sin(x), np.multiply(0.7 * c + np.sin(x), x)),
                      "(0.7 * c + np.sin(x), np.multiply(0.7 * c + np.sin(x), x))"),
    "np_accumulate_0d": (lambda c, x: (0.7 * c + np.sum(np.sin(x)), c * x),
                         "(0.7 * c + np.sum(np.sin(x)), c * x)"),
    "np_gate_0d": (lambda c, x: (c * nb.sigmoid(np.sum(x)) + 0.5 * np.mean(x),
                                 np.tanh(c) * x),
                   "(c * nb.sigmoid(np.sum(x)) + 0.5 * np.mean(x), np.tanh(c) * x)"),
})
#: the fori and the scan bodies with a NumPy spelling: ``name -> np_<name>``
NUMPY_FORI = {k[3:]: k for k in FORI_BODIES if k.startswith("np_")}
NUMPY_SCAN = {k[3:]: k for k in SCAN_BODIES if k.startswith("np_")}


def fori(xs, params):
    """``fori_loop(0, n, body, xs[0])`` closing over ``xs[1]``."""
    n, body = params
    fn = FORI_BODIES[body][0]
    w = xs[1]
    return fori_loop(0, n, lambda i, c: fn(i, c, w), xs[0])


#: bodies of :func:`unrolled` (a Python int counter: not those that need a tensor one)
UNROLLED_BODIES = tuple(k for k in sorted(FORI_BODIES)
                        if k != "index_cast" and not k.startswith("np_"))


def unrolled(xs, params):
    """A plain Python loop of ``n`` steps of a fori body on ``xs[0]`` closing over
    ``xs[1]`` (a trace records it unrolled; :mod:`nbgrad.jit.trace.reroll` rolls it up)."""
    n, body = params
    fn = FORI_BODIES[body][0]
    c, w = xs
    for i in range(n):
        c = fn(i, c, w)
    return c


def scan(xs, params):
    """``scan(body, xs[0], xs[1])``: the final carry or the stacked outputs."""
    body, output, reverse = params
    carry, ys = _scan(SCAN_BODIES[body][0], xs[0], xs[1], reverse=reverse)
    return carry if output == "carry" else ys


def fori_code(args: list[str], params) -> str:
    n, body = params
    expr = FORI_BODIES[body][1].format(w=args[1])
    return f"nb.jit.fori_loop(0, {n}, lambda i, c: {expr}, {args[0]})"


def unrolled_code(args: list[str], params) -> str:
    n, body = params
    expr = FORI_BODIES[body][1].format(w=args[1])
    return f"functools.reduce(lambda c, i: {expr}, range({n}), {args[0]})"


def scan_code(args: list[str], params) -> str:
    body, output, reverse = params
    expr = SCAN_BODIES[body][1]
    pick = "[0]" if output == "carry" else "[1]"
    return f"nb.jit.scan(lambda c, x: {expr}, {args[0]}, {args[1]}, reverse={reverse}){pick}"
