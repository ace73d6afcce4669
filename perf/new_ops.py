"""Six ops new in issue 14, forward + backward at one realistic size: nbgrad eager and
``nbgrad.jit`` (``mode="compile"``: tier 2, the steady state promotion reaches) against
PyTorch eager and JAX ``jit``, float64, one thread.

    python -m perf.new_ops                  # 15 interleaved rounds
    python -m perf.new_ops --rounds 30 --json out.json

Each step computes ``sum(op(inputs) * cotangent)`` and its gradient for every
differentiable input. Before timing, each framework's value and gradients are compared
with PyTorch's (relative 1e-9); a row that disagrees is reported and not timed. The
steps are then timed in interleaved rounds (the order shuffled each round; a block of
calls lasts at least 20 ms); the medians over all blocks and their ratios are printed.
Frameworks that are not installed are left out. Compare only numbers from one run.
"""

from __future__ import annotations

from .threads import one_thread

one_thread()  # before any framework is imported

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from .core import block_seconds  # noqa: E402

RNG = np.random.default_rng(0)

#: op name -> (input arrays, which are differentiable); the sizes users run
CASES: dict[str, tuple[list[np.ndarray], list[bool]]] = {
    "erfinv": ([RNG.uniform(-0.999, 0.999, 100_000)], [True]),
    "batch_norm": ([RNG.standard_normal((64, 32, 16, 16)), RNG.standard_normal(32),
                    RNG.standard_normal(32)], [True, True, True]),
    "group_norm": ([RNG.standard_normal((16, 32, 16, 16)), RNG.standard_normal(32),
                    RNG.standard_normal(32)], [True, True, True]),
    "scaled_dot_product_attention": ([RNG.standard_normal((8, 128, 64)) for _ in range(3)],
                                     [True, True, True]),
    "interpolate_bilinear": ([RNG.standard_normal((8, 16, 32, 32))], [True]),
    "rfft_power": ([RNG.standard_normal((64, 1024))], [True]),  # |rfft(x)|^2 along rows
}


def _cotangent(shape) -> np.ndarray:
    return np.random.default_rng(1).standard_normal(shape)


# ------------------------------------------------------------------ the four frameworks
def _torch_like_ops(F, erfinv, fft) -> dict[str, Callable]:
    """The six ops through ``torch.nn.functional``- and ``torch.fft``-like modules (nbgrad's
    or torch's)."""
    return {
        "erfinv": erfinv,
        "batch_norm": lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
        "group_norm": lambda x, w, b: F.group_norm(x, 8, w, b),
        "scaled_dot_product_attention": lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True),
        "interpolate_bilinear": lambda x: F.interpolate(x, size=(64, 64), mode="bilinear",
                                                        align_corners=False),
        "rfft_power": lambda x: fft.rfft(x, dim=-1).abs() ** 2,
    }


def nbgrad_fns(jit: bool) -> dict[str, Callable]:
    import nbgrad as nb
    ops = _torch_like_ops(nb.nn.functional, nb.erfinv, nb.fft)
    out = {}
    for name, op in ops.items():
        arrays, diff = CASES[name]
        cot = nb.tensor(_cotangent(op(*[nb.tensor(a) for a in arrays]).shape))

        def loss(*xs, op=op, cot=cot):
            return (op(*xs) * cot).sum()

        argnums = tuple(i for i, d in enumerate(diff) if d)
        step = nb.value_and_grad(loss, argnums=argnums)
        if jit:  # tier 2 from the start: the steady state that promotion reaches
            step = nb.jit(step, mode="compile")
        tensors = [nb.tensor(a) for a in arrays]

        def run(step=step, tensors=tensors):
            value, grads = step(*tensors)
            return float(value), [g.numpy() for g in grads]
        out[name] = run
    return out


def torch_fns() -> dict[str, Callable]:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    ops = _torch_like_ops(F, torch.erfinv, torch.fft)
    out = {}
    for name, op in ops.items():
        arrays, diff = CASES[name]
        tensors = [torch.tensor(a, requires_grad=d) for a, d in zip(arrays, diff, strict=True)]
        cot = torch.tensor(_cotangent(op(*tensors).shape))

        def run(op=op, tensors=tensors, cot=cot):
            for t in tensors:
                t.grad = None
            loss = (op(*tensors) * cot).sum()
            grads = torch.autograd.grad(loss, [t for t in tensors if t.requires_grad])
            return float(loss.detach()), [g.numpy() for g in grads]
        out[name] = run
    return out


def jax_fns() -> dict[str, Callable]:
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.scipy.special import erfinv

    def batch_norm(x, w, b):
        mu = x.mean((0, 2, 3), keepdims=True)
        var = ((x - mu) ** 2).mean((0, 2, 3), keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * w[:, None, None] + b[:, None, None]

    def group_norm(x, w, b):
        g = x.reshape(x.shape[0], 8, -1)
        mu = g.mean(2, keepdims=True)
        var = ((g - mu) ** 2).mean(2, keepdims=True)
        y = ((g - mu) / jnp.sqrt(var + 1e-5)).reshape(x.shape)
        return y * w[:, None, None] + b[:, None, None]

    def attention(q, k, v):
        s = q @ jnp.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
        mask = jnp.tril(jnp.ones((q.shape[-2], k.shape[-2]), bool))
        return jax.nn.softmax(jnp.where(mask, s, -jnp.inf), -1) @ v

    def bilinear(x):
        return jax.image.resize(x, x.shape[:2] + (64, 64), "linear", antialias=False)

    ops = {"erfinv": erfinv, "batch_norm": batch_norm, "group_norm": group_norm,
           "scaled_dot_product_attention": attention, "interpolate_bilinear": bilinear,
           "rfft_power": lambda x: jnp.abs(jnp.fft.rfft(x, axis=-1)) ** 2}
    out = {}
    for name, op in ops.items():
        arrays, diff = CASES[name]
        cot = jnp.asarray(_cotangent(op(*[jnp.asarray(a) for a in arrays]).shape))
        argnums = tuple(i for i, d in enumerate(diff) if d)
        step = jax.jit(jax.value_and_grad(lambda *xs, op=op, cot=cot: (op(*xs) * cot).sum(),
                                          argnums=argnums))
        inputs = [jnp.asarray(a) for a in arrays]

        def run(step=step, inputs=inputs):
            value, grads = step(*inputs)
            jax.block_until_ready(grads)
            return float(value), [np.asarray(g) for g in grads]
        out[name] = run
    return out


# ------------------------------------------------------------------ timing
def _agrees(got, want) -> bool:
    (v, gs), (wv, wgs) = got, want
    if not math.isclose(v, wv, rel_tol=1e-9, abs_tol=1e-9):
        return False
    return all(np.max(np.abs(g - w)) <= 1e-9 * max(1.0, np.max(np.abs(w)))
               for g, w in zip(gs, wgs, strict=True))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="write the medians (seconds) to this file")
    args = parser.parse_args(argv)
    frameworks: dict[str, dict[str, Callable]] = {}
    first: dict[str, dict[str, float]] = {}
    for name, make in (("nbgrad", lambda: nbgrad_fns(False)),
                       ("nbgrad.jit", lambda: nbgrad_fns(True)), ("torch", torch_fns),
                       ("jax.jit", jax_fns)):
        try:
            fns = make()
        except ImportError as exc:
            print(f"{name}: not installed ({exc.name}); left out")
            continue
        frameworks[name] = fns
        first[name] = {}
        for op, fn in fns.items():
            start = time.perf_counter()
            fn()
            first[name][op] = time.perf_counter() - start
    reference = frameworks.get("torch")
    samples = {fw: {op: [] for op in CASES} for fw in frameworks}
    for fw, fns in frameworks.items():
        for op, fn in fns.items():
            for _ in range(3):  # promotion to tier 2 happens in the first calls
                fn()
            if reference is not None and not _agrees(fn(), reference[op]()):
                print(f"{fw} {op}: MISMATCH with PyTorch; not timed")
                samples[fw][op] = None
    for _ in range(args.rounds):
        order = [(fw, op) for fw in frameworks for op in CASES]
        random.shuffle(order)
        for fw, op in order:
            if samples[fw][op] is not None:
                samples[fw][op].append(block_seconds(frameworks[fw][op], 0.02))
    medians = {fw: {op: (statistics.median(s) if s else None) for op, s in ops.items()}
               for fw, ops in samples.items()}
    names = list(frameworks)
    print(f"{'op (fwd+bwd, float64)':32s}" + "".join(f"{n:>14s}" for n in names)
          + "   nbgrad.jit / torch   nbgrad.jit / jax.jit")
    for op in CASES:
        row = "".join(f"{medians[n][op] * 1e3:12.3f}ms" if medians[n][op] else
                      f"{'-':>14s}" for n in names)
        ratios = []
        for peer in ("torch", "jax.jit"):
            a, b = medians.get("nbgrad.jit", {}).get(op), medians.get(peer, {}).get(op)
            ratios.append(f"{a / b:10.2f}" if a and b else f"{'-':>10s}")
        print(f"{op:32s}{row}   {ratios[0]:>18s}   {ratios[1]:>18s}")
    print("first call (s, compile included): " + "; ".join(
        f"{n}: " + ", ".join(f"{op} {t:.2f}" for op, t in first[n].items()) for n in names))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians_s": medians, "first_call_s": first,
                       "rounds": args.rounds}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
