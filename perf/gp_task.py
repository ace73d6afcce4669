"""The GP research task (issue 15 item 6): the negative log marginal likelihood of a
Gaussian process and its gradient with respect to the hyperparameters, float64, one
thread; plus a micro-benchmark of one triangular solve against SciPy's. The task itself
(data, NumPy reference, each framework's NLL) is :mod:`perf.tasks.gp`, which
``python -m perf --suite tasks`` runs as T2; this script adds rows and the micro line.

    python -m perf.gp_task                      # 15 interleaved rounds
    python -m perf.gp_task --rounds 30 --n 500

Task: an RBF kernel ``K = s2 exp(-|xi - xj|^2 / (2 l^2)) + noise I`` over ``n`` = 300
points in 2-D with learnable log-lengthscale, log-variance and log-noise;
``NLL = 0.5 y^T K^-1 y + sum log diag L + n/2 log 2 pi`` with ``L = cholesky(K)`` and
``K^-1 y`` through one triangular solve (``|L^-1 y|^2``). Rows:
``nbgrad.jit(nbgrad.value_and_grad(f))`` in the default mode (timed once its promotion to
tier 2 has finished: a background compile would share the CPU), the same with
``mode="interpret"`` (tier 1), nbgrad eager (``nbgrad.value_and_grad``), PyTorch eager and
``jax.jit(jax.value_and_grad(f))``. Every row is checked against NumPy/SciPy's value and
its gradient (derived by hand) before timing. Printed: the first call of each row in
this process, in that order (compiles and disk-cache loads included, so later rows reuse
kernels that earlier ones loaded), then steady-state medians (and minima: on a busy machine the
least disturbed block) of interleaved rounds in a shuffled order, and their ratios to
``jax.jit``. The micro line times ``solve_triangular``
of a 300 x 300 lower factor and one right-hand side (nbgrad eager on tensors, no graph)
against ``scipy.linalg.solve_triangular`` (which checks finiteness). Compare numbers from
one run only.
"""

from __future__ import annotations

from .threads import one_thread

one_thread()  # before any framework is imported

import argparse  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from .core import interleaved  # noqa: E402
from .tasks.gp import (  # noqa: E402
    THETA,
    data,
    jax_nll,
    nbgrad_nll,
    nll_and_grad,
    sqdist,
    torch_value_and_grad,
)


def nbgrad_rows(d2: np.ndarray, y: np.ndarray) -> dict[str, Callable]:
    import nbgrad as nb
    theta = nb.tensor(THETA)
    nll = nbgrad_nll(d2, y)

    def run(fn):
        v, g = fn(theta)
        return float(v.item()), g.numpy()

    rows = {}
    for name, mode in (("nbgrad.jit", "auto"), ("nbgrad.jit interpret", "interpret")):
        row = functools.partial(run, nb.jit(nb.value_and_grad(nll), mode=mode))
        row.jitted = row.args[0]
        rows[name] = row
    rows["nbgrad eager"] = functools.partial(run, nb.value_and_grad(nll))
    return rows


def settle(fn: Callable, seconds: float = 300.0) -> str:
    """Call an ``nbgrad.jit`` row for a second, then until no live graph may still move to
    another tier (:func:`nbgrad.jit.program.unsettled`: a ``mode="auto"`` graph not yet
    promoted, or tier 2 not yet measured), as perf's workers wait; a promotion's compile
    is waited for without calls (they would share the CPU with it). At most ``seconds``;
    returns the row's tiers. (Tiers that stay the same for a few calls are not enough: a
    45 ms graph whose compile is estimated at seconds stays in tier 1 for seconds of
    calls before its promotion starts.)"""
    from nbgrad.jit import program
    start = time.perf_counter()
    while True:
        fn()
        elapsed = time.perf_counter() - start
        if elapsed > seconds:
            break
        if not program.wait_for_promotions(0):
            program.wait_for_promotions(max(seconds - elapsed, 0.0))
        elif elapsed > 1.0 and not program.unsettled():
            break
    tiers = {e.tier for e in fn.jitted._cache.values()}
    return ", ".join(sorted(tiers)) + f" after {elapsed:.1f} s"


def torch_rows(d2: np.ndarray, y: np.ndarray) -> dict[str, Callable]:
    import torch
    torch.set_num_threads(1)
    return {"torch eager": functools.partial(torch_value_and_grad(d2, y), THETA)}


def jax_rows(d2: np.ndarray, y: np.ndarray) -> dict[str, Callable]:
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
    import jax.numpy as jnp
    theta = jnp.asarray(THETA)
    fn = jax.jit(jax.value_and_grad(jax_nll(d2, y)))

    def run():
        v, g = jax.block_until_ready(fn(theta))
        return float(v), np.asarray(g)
    return {"jax.jit": run}


def _check(name: str, got, d2: np.ndarray, y: np.ndarray) -> None:
    value, grad = got
    want, want_grad = nll_and_grad(THETA, d2, y)
    if not (math.isclose(value, want, rel_tol=1e-10)
            and np.allclose(grad, want_grad, rtol=1e-8, atol=1e-10)):
        raise SystemExit(f"{name} disagrees with NumPy: {value} {grad} vs {want} {want_grad}")


def micro(n: int, rounds: int) -> None:
    """One triangular solve, one right-hand side: nbgrad eager against SciPy."""
    import scipy.linalg

    import nbgrad as nb
    rng = np.random.default_rng(1)
    m = rng.standard_normal((n, n))
    low = np.linalg.cholesky(m @ m.T / n + np.eye(n))
    b = rng.standard_normal(n)
    L, B = nb.tensor(low), nb.tensor(b)
    rows = {"nbgrad solve_triangular": lambda: nb.linalg.solve_triangular(L, B, lower=True),
            "scipy solve_triangular": lambda: scipy.linalg.solve_triangular(low, b, lower=True)}
    if not np.allclose(rows["nbgrad solve_triangular"]().numpy(),
                       rows["scipy solve_triangular"](), rtol=1e-10, atol=1e-10):
        raise SystemExit("nbgrad's solve_triangular disagrees with SciPy's")
    times = interleaved(rows, rounds, 0.02)
    base = statistics.median(times["scipy solve_triangular"])
    print(f"\nsolve_triangular, {n} x {n} lower, one right-hand side")
    for k in rows:
        med = statistics.median(times[k])
        print(f"{k:28s} {med * 1e6:10.1f} us {med / base:8.2f} x scipy")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args(argv)
    x, y = data(args.n)
    d2 = sqdist(x)
    rows: dict[str, Callable] = {}
    for make in (nbgrad_rows, torch_rows, jax_rows):
        try:
            rows.update(make(d2, y))
        except ImportError as exc:
            print(f"not installed: {exc.name}; left out")
    first: dict[str, float] = {}
    for name, fn in rows.items():
        start = time.perf_counter()
        got = fn()
        first[name] = time.perf_counter() - start
        _check(name, got, d2, y)
        for _ in range(3):
            fn()
        if hasattr(fn, "jitted"):
            print(f"{name}: tier {settle(fn)}")
        _check(name, fn(), d2, y)
    times = interleaved(rows, args.rounds)
    jax = times.get("jax.jit")
    print(f"GP NLL + gradient, n = {args.n}, float64, one thread, {args.rounds} rounds")
    print(f"{'row':21s} {'first call s':>13s} {'median ms':>10s} {'/ jax.jit':>10s} "
          f"{'min ms':>8s} {'/ jax.jit':>10s}")
    for name in rows:
        med, low = statistics.median(times[name]), min(times[name])
        ratios = ((f"{med / statistics.median(jax):10.2f}", f"{low / min(jax):10.2f}") if jax
                  else (f"{'-':>10s}",) * 2)
        print(f"{name:21s} {first[name]:13.3f} {med * 1e3:10.3f} {ratios[0]} {low * 1e3:8.3f} "
              f"{ratios[1]}")
    micro(args.n, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
