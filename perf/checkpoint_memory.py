"""Memory-bounded loop gradients (issue 16 item 4): peak memory and time of the gradient of
W1 (``x <- x + 0.01 tanh(W x + b) - 0.001 x``, loss ``|x_T|^2``, gradient w.r.t. W and b)
with and without ``fori_loop(checkpoint=...)`` (``"sqrt"`` and ``"log"``), against JAX
(``lax.scan`` plain, and segments of ``sqrt(T)`` steps under ``jax.checkpoint``), float64,
one thread.

    python -m perf.checkpoint_memory                  # the default grid
    python -m perf.checkpoint_memory --grid 16:1000,16:100000
    python -m perf.checkpoint_memory --grid 4096:10000 --schedules none,sqrt

Each configuration runs in a fresh process: peak memory is the growth of the process's
maximum resident set over the first call of ``jit(value_and_grad(loss))`` (nbgrad tier
1, ``mode="interpret"``, unless ``--mode compile``; ``jax.jit``), trace and compile
included, measured after the inputs exist. Times: that first call, and a second (steady)
call. Compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

DEFAULT_GRID = "16:1000,16:10000,16:100000,4096:1000"


def _child(framework: str, n: int, steps: int, checkpoint: str | None,
           mode: str = "interpret") -> dict:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"
    import resource
    import time

    import numpy as np
    rng = np.random.default_rng(0)
    W0 = rng.standard_normal((n, n)) / math.sqrt(n)
    b0, x0 = rng.standard_normal(n) * 0.1, rng.standard_normal(n)
    if framework == "nbgrad":
        import nbgrad as nb
        W, b, x = nb.tensor(W0), nb.tensor(b0), nb.tensor(x0)

        def loss(W, b):
            body = lambda i, x: x + 0.01 * nb.tanh(W @ x + b) - 0.001 * x  # noqa: E731
            return (nb.fori_loop(0, steps, body, x, checkpoint=checkpoint) ** 2).sum()

        step = nb.jit(nb.value_and_grad(loss, argnums=(0, 1)), mode=mode)
        run = lambda: float(step(W, b)[0])  # noqa: E731
    else:
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        W, b, x = jnp.asarray(W0), jnp.asarray(b0), jnp.asarray(x0)

        def loss(W, b):
            def body(x, _):
                return x + 0.01 * jnp.tanh(W @ x + b) - 0.001 * x, None
            if not checkpoint:
                return (jax.lax.scan(body, x, None, length=steps)[0] ** 2).sum()
            size = math.isqrt(steps - 1) + 1
            full, rest = divmod(steps, size)

            @jax.checkpoint
            def segment(x, _):
                return jax.lax.scan(body, x, None, length=size)[0], None
            x_end = jax.lax.scan(segment, x, None, length=full)[0]
            return (jax.lax.scan(body, x_end, None, length=rest)[0] ** 2).sum()

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        run = lambda: float(jax.block_until_ready(step(W, b))[0])  # noqa: E731
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    value = run()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    run()
    steady = time.perf_counter() - start
    return {"mb": (peak - before) / 1024, "seconds": seconds, "steady": steady,
            "value": value}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", default=DEFAULT_GRID, help="state:steps pairs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--schedules", default="none,sqrt,log",
                        help="checkpoint schedules: none, sqrt, log (log: nbgrad only)")
    parser.add_argument("--mode", default="interpret", choices=("interpret", "compile"),
                        help="nbgrad.jit mode of the nbgrad rows")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    if args.child:
        fw, n, steps, ck = args.child.split(":")
        print(json.dumps(_child(fw, int(n), int(steps), None if ck == "none" else ck,
                                args.mode)))
        return 0
    rows = []
    print(f"{'framework':10s} {'state':>6s} {'steps':>7s} {'checkpoint':>10s} "
          f"{'peak MB':>9s} {'first call s':>13s} {'second call s':>14s}")
    for pair in args.grid.split(","):
        n, steps = (int(v) for v in pair.split(":"))
        for fw in ("nbgrad", "jax"):
            for ck in args.schedules.split(","):
                if fw == "jax" and ck == "log":
                    continue
                proc = subprocess.run([sys.executable, "-m", "perf.checkpoint_memory",
                                       "--child", f"{fw}:{n}:{steps}:{ck}",
                                       "--mode", args.mode],
                                      capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    print(f"{fw:10s} {n:6d} {steps:7d} {ck:>10s} failed: "
                          f"{proc.stderr.strip().splitlines()[-1:]}")
                    continue
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                row.update(framework=fw, state=n, steps=steps, checkpoint=ck)
                rows.append(row)
                print(f"{fw:10s} {n:6d} {steps:7d} {ck:>10s} {row['mb']:9.1f} "
                      f"{row['seconds']:13.2f} {row['steady']:14.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
