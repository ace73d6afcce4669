"""Forward mode (issue 16 item 2): ``jvp`` and ``hvp`` against the double-vjp construction
they replace and against JAX, float64, one thread.

    python -m perf.forward_mode                 # 15 interleaved rounds
    python -m perf.forward_mode --rounds 30

Tasks: the ``jvp`` of a 3-layer tanh MLP (batch 64, width 128) with respect to its
input, and the Hessian-vector product of the mean squared error of that MLP with respect
to its three weight matrices. Rows: nbgrad ``jvp``/``hvp`` (forward mode; forward over
reverse), nbgrad's earlier constructions (``jvp`` by two reverse passes; ``hvp`` as the
gradient of ``<grad f, t>``, reverse over reverse), the same under ``nbgrad.jit``
(tier 2), and JAX (``jax.jvp``; ``hvp`` as ``jvp(grad f)``), eager and under ``jax.jit``.
Every row is checked against the first before timing. Compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import numpy as np

from .core import interleaved

RNG = np.random.default_rng(0)
WIDTH, BATCH = 128, 64
X = RNG.standard_normal((BATCH, WIDTH))
WS = [RNG.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH) for _ in range(3)]
TX = RNG.standard_normal(X.shape)
TWS = [RNG.standard_normal(w.shape) for w in WS]
Y = RNG.standard_normal((BATCH, WIDTH))


def _mlp(tanh, x, ws):
    for w in ws:
        x = tanh(x @ w)
    return x


def nbgrad_rows(jit: bool) -> dict[str, Callable]:
    import nbgrad as nb
    from nbgrad.functional import jvp_by_double_vjp
    x, tx, y = nb.tensor(X), nb.tensor(TX), nb.tensor(Y)
    ws, tws = tuple(nb.tensor(w) for w in WS), tuple(nb.tensor(t) for t in TWS)

    def f(x):
        return _mlp(nb.tanh, x, ws)

    def loss(*w):
        return ((_mlp(nb.tanh, x, w) - y) ** 2).mean()

    def old_hvp(*w):
        def inner(*w):
            gs = nb.grad(loss, argnums=(0, 1, 2))(*w)
            return sum((g * t).sum() for g, t in zip(gs, tws, strict=True))
        return nb.grad(inner, argnums=(0, 1, 2))(*w)

    steps = {
        "jvp": lambda x, tx: nb.jvp(f, (x,), (tx,))[1],
        "jvp, double vjp": lambda x, tx: jvp_by_double_vjp(f, (x,), (tx,))[1],
        "hvp": lambda *w: nb.hvp(loss, w, tws)[1],
        "hvp, reverse over reverse": old_hvp,
    }
    suffix = " (nbgrad.jit)" if jit else ""
    rows = {}
    for name, step in steps.items():
        fn = nb.jit(step, mode="compile") if jit else step
        args = (x, tx) if name.startswith("jvp") else ws

        def run(fn=fn, args=args):
            out = fn(*args)
            return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
        rows[f"nbgrad {name}{suffix}"] = run
    return rows


def jax_rows(jit: bool) -> dict[str, Callable]:
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    x, tx, y = jnp.asarray(X), jnp.asarray(TX), jnp.asarray(Y)
    ws, tws = tuple(jnp.asarray(w) for w in WS), tuple(jnp.asarray(t) for t in TWS)

    def loss(w):
        return ((_mlp(jnp.tanh, x, w) - y) ** 2).mean()

    def jvp(x, tx):
        return jax.jvp(lambda x: _mlp(jnp.tanh, x, ws), (x,), (tx,))[1]

    def hvp(w):
        return jax.jvp(jax.grad(loss), (w,), (tws,))[1]

    suffix = " (jax.jit)" if jit else ""
    rows = {}
    for name, step, args in (("jvp", jvp, (x, tx)), ("hvp", hvp, (ws,))):
        fn = jax.jit(step) if jit else step

        def run(fn=fn, args=args):
            out = jax.block_until_ready(fn(*args))
            return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]
        rows[f"jax {name}{suffix}"] = run
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    rows: dict[str, Callable] = {}
    for make in (lambda: nbgrad_rows(False), lambda: nbgrad_rows(True),
                 lambda: jax_rows(False), lambda: jax_rows(True)):
        try:
            rows.update(make())
        except ImportError as exc:
            print(f"not installed: {exc.name}; left out")
    reference = {"jvp": rows["nbgrad jvp"](), "hvp": rows["nbgrad hvp"]()}
    for name, fn in rows.items():
        fn()  # compile
        want = reference["jvp" if " jvp" in name else "hvp"]
        got = fn()
        ok = all(np.allclose(g, w, rtol=1e-9, atol=1e-12) for g, w in zip(got, want,
                                                                          strict=True))
        if not ok:
            raise SystemExit(f"{name} disagrees with nbgrad's forward mode")
    times = interleaved(rows, args.rounds)
    base = {"jvp": statistics.median(times["nbgrad jvp"]),
            "hvp": statistics.median(times["nbgrad hvp"])}
    print(f"{'row':44s} {'median ms':>10s} {'/ nbgrad eager':>15s}")
    for name in rows:
        med = statistics.median(times[name])
        task = "jvp" if " jvp" in name else "hvp"
        print(f"{name:44s} {med * 1e3:10.3f} {med / base[task]:15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
