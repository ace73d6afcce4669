"""The neural-ODE research task (issue 15 item 3): RK4 through an MLP vector field, and the
gradient of the final state's loss with respect to the weights, float64, one thread.

    python -m perf.neural_ode                   # 10 interleaved rounds
    python -m perf.neural_ode --rounds 20 --steps 200
    python -m perf.neural_ode --rows jax --rows "python loop, @" --rounds 3  # some rows

Task: ``f(x) = tanh(x W1^T + b1) W2^T + b2``, an MLP 16-64-16 with a batch of 32 states;
``steps`` = 200 RK4 steps of ``dt`` = 0.01; loss ``sum(x_T ** 2)``; gradient with respect
to ``W1, b1, W2, b2``. nbgrad rows: ``nbgrad.jit(nbgrad.grad(loss))`` in the default
mode, with the steps written as ``nbgrad.fori_loop`` or as a Python loop (unrolled
while traced, re-rolled into a loop node), and the layers written with ``@`` or with
``F.linear`` (``--modes auto,interpret`` adds tier-1 rows). Peer:
``jax.jit(jax.grad(loss))`` with ``lax.fori_loop``. Printed per row: the first and the
second call (trace, compile, disk-cache loads; later rows reuse kernels that earlier
ones loaded, so run it twice for warm figures) and the graph's tier, then steady-state
medians of interleaved rounds and ratios to JAX. Every row is checked against JAX's
gradient first. Compare numbers from one run only. The task itself (weights, NumPy
reference, the losses) is :mod:`perf.tasks.neural_ode`, which ``python -m perf --suite
tasks`` runs as T4 (the fori_loop, ``@`` row against JAX and PyTorch eager).
"""

from __future__ import annotations

from .threads import one_thread

one_thread()  # before any framework is imported

import argparse  # noqa: E402
import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from .core import interleaved  # noqa: E402
from .tasks.neural_ode import arrays as _params  # noqa: E402
from .tasks.neural_ode import jax_loss, nbgrad_loss  # noqa: E402


def nbgrad_rows(arrays: list[np.ndarray], steps: int,
                modes: tuple[str, ...] = ("auto",)) -> dict[str, Callable]:
    import nbgrad as nb
    *params, x0 = [nb.tensor(a) for a in arrays]

    rows = {}
    for mode in modes:
        for loop_name in ("fori_loop", "python loop"):
            for lin_name in ("@", "F.linear"):
                loss = nbgrad_loss(steps, loop_name, lin_name)
                jitted = nb.jit(nb.grad(loss, argnums=(0, 1, 2, 3)), mode=mode)

                def row(jitted=jitted):
                    return [g.numpy() for g in jitted(*params, x0)]
                row.jitted = jitted
                suffix = "" if mode == "auto" else f" ({mode})"
                rows[f"nbgrad {loop_name}, {lin_name}{suffix}"] = row
    return rows


def jax_rows(arrays: list[np.ndarray], steps: int) -> dict[str, Callable]:
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
    import jax.numpy as jnp
    *params, x0 = [jnp.asarray(a) for a in arrays]
    fn = jax.jit(jax.grad(jax_loss(steps), argnums=(0, 1, 2, 3)))

    def row():
        return [np.asarray(g) for g in jax.block_until_ready(fn(*params, x0))]
    return {"jax.jit fori_loop": row}


def describe(row: Callable) -> str:
    """The tiers of a jitted row's graphs."""
    return ", ".join(sorted({e.tier for e in row.jitted._cache.values()}))


def main(argv=None) -> int:
    from .gp_task import settle
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--modes", default="auto",
                        help="comma list of nbgrad.jit modes to time (auto, interpret, compile)")
    parser.add_argument("--rows", action="append", default=[],
                        help="only the rows whose name contains this (repeatable); "
                             "default: all")
    args = parser.parse_args(argv)
    modes = tuple(args.modes.split(","))
    arrays = _params()
    rows: dict[str, Callable] = {}
    for make in (jax_rows, functools.partial(nbgrad_rows, modes=modes)):
        try:
            rows.update(make(arrays, args.steps))
        except ImportError as exc:
            print(f"not installed: {exc.name}; left out")
    if args.rows:
        rows = {k: v for k, v in rows.items() if any(w in k for w in args.rows)}
    firsts: dict[str, tuple[float, float]] = {}
    want = None
    for name, fn in rows.items():
        t0 = time.perf_counter()
        got = fn()
        t1 = time.perf_counter()
        fn()
        firsts[name] = (t1 - t0, time.perf_counter() - t1)
        want = got if want is None else want
        for g, w in zip(got, want, strict=True):
            if not np.allclose(g, w, rtol=1e-9, atol=1e-12):
                raise SystemExit(f"{name} disagrees with {next(iter(rows))}")
        if hasattr(fn, "jitted"):
            print(f"{name}: tier {settle(fn)}", flush=True)
    times = interleaved(rows, args.rounds)
    base = statistics.median(times[next(iter(rows))]) if "jax.jit fori_loop" in rows else None
    print(f"neural ODE: MLP 16-64-16 tanh, batch 32, RK4 {args.steps} steps, gradient "
          f"w.r.t. the weights; float64, one thread, {args.rounds} rounds")
    print(f"{'row':28s} {'1st call s':>10s} {'2nd call s':>10s} {'median ms':>10s} "
          f"{'/ jax':>7s}")
    for name, fn in rows.items():
        med = statistics.median(times[name])
        ratio = f"{med / base:7.2f}" if base else f"{'-':>7s}"
        print(f"{name:28s} {firsts[name][0]:10.3f} {firsts[name][1]:10.3f} "
              f"{med * 1e3:10.3f} {ratio}"
              + (f"   [{describe(fn)}]" if hasattr(fn, "jitted") else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
