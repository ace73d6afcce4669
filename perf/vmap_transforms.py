"""``jacobian`` and ``hessian`` with their cotangents batched by ``nbgrad.vmap`` against
the row-by-row loop they used before (one vjp per output element), float64, one thread.

    python -m perf.vmap_transforms              # 7 interleaved rounds
    python -m perf.vmap_transforms --rounds 15

Cases: the Jacobian of an MLP layer ``tanh(W x + b)`` (100 -> 100), the Hessian of a
50-d function ``sum(tanh(W x) ** 3) + |x|^2`` and the Jacobian of a 20 -> 20 map (small
outputs, where the loop is cheapest). Both paths are checked to agree (1e-10) first; each
round times both (order alternating, blocks of at least 50 ms); medians are printed with
the ratio loop / vmap. Compare numbers from one run only.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

import nbgrad as nb  # noqa: E402
from nbgrad import functional  # noqa: E402

from .core import block_seconds  # noqa: E402

RNG = np.random.default_rng(0)


def _cases() -> dict[str, Callable[[], object]]:
    w1, b1 = nb.tensor(RNG.standard_normal((100, 100)) / 10), nb.tensor(RNG.standard_normal(100))
    x1 = nb.tensor(RNG.standard_normal(100))
    w2, x2 = nb.tensor(RNG.standard_normal((50, 50)) / 7), nb.tensor(RNG.standard_normal(50))
    w3, x3 = nb.tensor(RNG.standard_normal((20, 20)) / 4), nb.tensor(RNG.standard_normal(20))
    layer = nb.jacobian(lambda x: nb.tanh(w1 @ x + b1))
    hess = nb.hessian(lambda x: nb.sum(nb.tanh(w2 @ x) ** 3) + nb.sum(x * x))
    small = nb.jacobian(lambda x: nb.sin(w3 @ x) * x)
    return {"jacobian, MLP layer 100 -> 100": lambda: layer(x1),
            "hessian, 50-d function": lambda: hess(x2),
            "jacobian, 20 -> 20": lambda: small(x3)}


def _with_loop(fn: Callable[[], object]) -> object:
    saved = functional._VMAP[:]
    functional._VMAP[:] = []
    try:
        return fn()
    finally:
        functional._VMAP[:] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    print(f"{'case':34} {'vmap (ms)':>10} {'loop (ms)':>10} {'loop/vmap':>10}")
    for name, fn in _cases().items():
        fast, slow = fn(), _with_loop(fn)
        np.testing.assert_allclose(fast.numpy(), slow.numpy(), rtol=1e-10, atol=1e-10)
        times: dict[str, list[float]] = {"vmap": [], "loop": []}
        for k in range(rounds):
            order = ["vmap", "loop"] if k % 2 == 0 else ["loop", "vmap"]
            for which in order:
                call = fn if which == "vmap" else (lambda fn=fn: _with_loop(fn))
                times[which].append(block_seconds(call))
        v, s = statistics.median(times["vmap"]), statistics.median(times["loop"])
        print(f"{name:34} {v * 1e3:10.2f} {s * 1e3:10.2f} {s / v:9.1f}x")


if __name__ == "__main__":
    main()
