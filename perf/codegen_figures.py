"""Figures for tier 2 of ``nbgrad.jit`` (generated, fused Numba code).

Measures, on one thread:

- steady state of ``nbgrad.jit(value_and_grad(f), mode="compile")`` against a
  hand-written Numba floor (hand-fused forward and backward loops, written below) for
  W1 (``fori_loop`` and an unrolled Python loop), W3 (4,000,000 float64) and W4;
  implementations are interleaved over rounds and checked against each other first;
- the compile time of each graph with an empty cache (a fresh ``NBGRAD_CACHE_DIR``)
  and with a warm one (a second process on the same folder), each in its own process.

Usage::

    python -m perf.codegen_figures                # everything, full sizes
    python -m perf.codegen_figures --quick        # small sizes (a smoke run)
    python -m perf.codegen_figures --only W3,W4 --rounds 9 --json out.json

The machine this was written on is shared (2 cores, other jobs running): compare
ratios measured in the same run only, and expect 20-40% run-to-run variation.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from perf.workloads.floors import w1_rollout, w4_hvp  # noqa: E402 - the runner's floors

ROOT = Path(__file__).resolve().parents[1]
DT, DECAY, LAM = 0.01, 0.1, 1e-3
SIZES = {
    "full": {"W1": 1000, "W3": 4_000_000, "W4": (2000, 100)},
    "quick": {"W1": 50, "W3": 20_000, "W4": (200, 20)},
}
WORKLOADS = ("W1", "W1u", "W3", "W4")
TITLES = {"W1": "W1 rollout, fori_loop", "W1u": "W1 rollout, unrolled Python loop",
          "W3": "W3 elementwise", "W4": "W4 hvp"}


# ------------------------------------------------------------------ hand-written floors
@njit(cache=True, nogil=True, fastmath=True)
def w3_floor(x):
    """W3 loss and gradient in one loop, with libm ``tanh`` (the math tier 2 emits)."""
    n = x.shape[0]
    g = np.empty(n)
    loss = 0.0
    for i in range(n):
        v = x[i]
        e = np.exp(-v * v)
        s = np.sin(v)
        t = np.tanh(v)
        loss += s * e + t
        g[i] = e * (np.cos(v) - 2.0 * v * s) + 1.0 - t * t
    return loss, g


# ------------------------------------------------------------------ workloads
def inputs(name: str, size: str) -> dict:
    rng = np.random.default_rng(0)
    if name in ("W1", "W1u"):
        n = 16
        return {"W": rng.standard_normal((n, n)) / np.sqrt(n), "b": rng.standard_normal(n) * 0.1,
                "x0": rng.standard_normal(n), "steps": SIZES[size]["W1"]}
    if name == "W3":
        return {"x": rng.standard_normal(SIZES[size]["W3"])}
    n, d = SIZES[size]["W4"]
    X = rng.standard_normal((n, d)) / np.sqrt(d)
    w_true = rng.standard_normal(d) * 2.0
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-X @ w_true))).astype(np.float64)
    return {"X": X, "y": y, "w": rng.standard_normal(d), "v": rng.standard_normal(d)}


def build_tier2(name: str, inp: dict, mode: str = "compile"):
    """(jitted function, call thunk returning NumPy (loss, grads...)) for nbgrad."""
    import nbgrad as nb

    def np_out(out):
        loss, grads = out
        grads = grads if isinstance(grads, (tuple, list)) else (grads,)
        return (float(loss.numpy()),) + tuple(g.numpy() for g in grads)

    if name in ("W1", "W1u"):
        steps = inp["steps"]
        if name == "W1":
            def loss(W, b, x0):
                def body(i, x):
                    return x + DT * nb.tanh(W @ x + b) - DT * DECAY * x
                x = nb.fori_loop(0, steps, body, x0)
                return (x * x).sum()
        else:
            def loss(W, b, x0):
                x = x0
                for _ in range(steps):
                    x = x + DT * nb.tanh(W @ x + b) - DT * DECAY * x
                return (x * x).sum()
        f = nb.jit(nb.value_and_grad(loss, argnums=(0, 1)), mode=mode)
        args = (nb.tensor(inp["W"]), nb.tensor(inp["b"]), nb.tensor(inp["x0"]))
        return f, lambda: np_out(f(*args))
    if name == "W3":
        def loss(x):
            return nb.sum(nb.sin(x) * nb.exp(-x * x) + nb.tanh(x))
        f = nb.jit(nb.value_and_grad(loss), mode=mode)
        x = nb.tensor(inp["x"])
        return f, lambda: np_out(f(x))

    def logistic(w, X, y):
        z = X @ w
        return (nb.softplus(z) - y * z).mean() + 0.5 * LAM * (w * w).sum()

    def hvp_fn(w, v, X, y):
        return nb.hvp(lambda w_: logistic(w_, X, y), (w,), (v,))

    f = nb.jit(hvp_fn, mode=mode)
    args = tuple(nb.tensor(inp[k]) for k in ("w", "v", "X", "y"))
    return f, lambda: np_out(f(*args))


def build_floor(name: str, inp: dict) -> Callable:
    if name in ("W1", "W1u"):
        assert DECAY == 0.1  # the floor's W1 has WORKLOADS.md's fixed decay
        return lambda: w1_rollout(inp["W"], inp["b"], inp["x0"], inp["steps"], DT)
    if name == "W3":
        return lambda: w3_floor(inp["x"])
    return lambda: w4_hvp(inp["X"], inp["y"], inp["w"], inp["v"], LAM)


def build_floor_expm1(inp: dict) -> Callable:
    """W3's floor in perf/ (tanh through expm1, faster than libm tanh)."""
    from perf.workloads.floors import w3_elementwise
    return lambda: w3_elementwise(inp["x"])


def executables(jitted) -> list:
    """The executables a jitted function runs (to read tier-2 statistics)."""
    out = []
    for entry in jitted._cache.values():
        out += list(entry.program.executables().values())
    return out


def tier_info(jitted) -> dict:
    info = {"tiers": sorted({getattr(e, "tier", "?") for e in executables(jitted)})}
    for e in executables(jitted):
        stats = getattr(e, "stats", None)
        if stats:
            info.update({k: stats[k] for k in ("regions", "fused_nodes", "fallbacks",
                                               "compile_s", "cache_hit") if k in stats})
        refused = getattr(e, "tier2_refused", None)
        if refused:
            info["tier2_refused"] = refused
    return info


ARG_ORDER = {"W1": ("W", "b", "x0"), "W1u": ("W", "b", "x0"), "W3": ("x",),
             "W4": ("w", "v", "X", "y")}


def native_call(jitted, name: str, inp: dict) -> Callable | None:
    """``CompiledGraph.run`` of the one tier-2 executable a call runs, if there is one."""
    exes = [e for e in executables(jitted) if getattr(e, "tier", None) == "compile"]
    if len(exes) != 1:
        return None
    exe = exes[0]
    arrays = [np.asarray(inp[k]) for k in ARG_ORDER[name]]
    return lambda: exe.run(arrays)


def agree(a, b, rtol: float = 1e-8) -> bool:
    return all(np.allclose(np.asarray(x), np.asarray(y), rtol=rtol,
                           atol=rtol * float(np.max(np.abs(y)) or 1.0))
               for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------ measurements
def time_calls(fn: Callable, budget: float) -> float:
    """Seconds per call: as many calls as fit in ``budget`` seconds (at least 2)."""
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - t0
        if n >= 2 and elapsed >= budget:
            return elapsed / n


def steady(names: list[str], size: str, rounds: int, budget: float) -> dict:
    results: dict = {}
    for name in names:
        try:
            results[name] = steady_one(name, size, rounds, budget)
        except Exception as exc:  # report and go on with the other workloads
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{TITLES[name]}: failed: {type(exc).__name__}: {exc}", flush=True)
    return results


def steady_one(name: str, size: str, rounds: int, budget: float) -> dict:
    """Steady state of tier 2 and the floor(s) for one workload, interleaved."""
    inp = inputs(name, size)
    jitted, tier2 = build_tier2(name, inp)
    tier2()  # trace
    tier2()  # compile (or load) and run
    floor = build_floor(name, inp)
    impls = {"tier2": tier2, "floor": floor}
    native = native_call(jitted, name, inp)
    if native is not None:  # the generated function alone, without the jit API
        impls["tier2_native"] = native
    if name == "W3":
        impls["floor_expm1"] = build_floor_expm1(inp)
    ref = floor()
    ok = {k: agree(f(), ref) for k, f in impls.items() if k != "tier2_native"}
    times: dict[str, list[float]] = {k: [] for k in impls}
    for _ in range(rounds):  # interleaved
        for k, f in impls.items():
            times[k].append(time_calls(f, budget) * 1e3)
    row = {k: {"median_ms": statistics.median(v), "min_ms": min(v)} for k, v in times.items()}
    row["agree"] = ok
    row["ratio_median"] = row["tier2"]["median_ms"] / row["floor"]["median_ms"]
    row["ratio_min"] = row["tier2"]["min_ms"] / row["floor"]["min_ms"]
    if "tier2_native" in row:
        row["ratio_native_median"] = (row["tier2_native"]["median_ms"]
                                      / row["floor"]["median_ms"])
    row["tier"] = tier_info(jitted)
    native_text = "" if "tier2_native" not in row else (
        f", generated function alone {row['tier2_native']['median_ms']:.3f} ms "
        f"({row['ratio_native_median']:.2f}x)")
    print(f"{TITLES[name]}: tier 2 {row['tier2']['median_ms']:.3f} ms{native_text}, floor "
          f"{row['floor']['median_ms']:.3f} ms -> {row['ratio_median']:.2f}x "
          f"(best of rounds {row['ratio_min']:.2f}x); agree {ok}; {row['tier']}",
          flush=True)
    return row


def child_compile(name: str, size: str) -> dict:
    """One process: time the first call (trace) and the second (tier 2 compile + run)."""
    t0 = time.perf_counter()
    import nbgrad  # noqa: F401
    t_import = time.perf_counter() - t0
    inp = inputs(name, size)
    jitted, call = build_tier2(name, inp)
    t1 = time.perf_counter()
    call()
    t2 = time.perf_counter()
    call()
    t3 = time.perf_counter()
    info = tier_info(jitted)
    return {"import_s": t_import, "first_call_s": t2 - t1, "second_call_s": t3 - t2, **info}


def compile_times(names: list[str], size: str) -> dict:
    out: dict = {}
    for name in names:
        with tempfile.TemporaryDirectory(prefix="nbgrad-figs-") as tmp:
            env = dict(os.environ, NBGRAD_CACHE_DIR=tmp, PYTHONPATH=str(ROOT))
            row = {}
            for label in ("cold", "warm"):
                proc = subprocess.run(
                    [sys.executable, "-m", "perf.codegen_figures", "--child", name,
                     "--size", size], env=env, capture_output=True, text=True, cwd=str(ROOT),
                    timeout=1800)
                if proc.returncode != 0:
                    row[label] = {"error": proc.stderr.strip().splitlines()[-1:]}
                    continue
                row[label] = json.loads(proc.stdout.strip().splitlines()[-1])
            out[name] = row
        c, w = row.get("cold", {}), row.get("warm", {})
        print(f"{TITLES[name]}: tier-2 compile cold {c.get('compile_s', float('nan')):.2f} s "
              f"(second call {c.get('second_call_s', float('nan')):.2f} s), warm "
              f"{w.get('compile_s', float('nan')):.3f} s (cache hit {w.get('cache_hit')}); "
              f"first call (trace) {c.get('first_call_s', float('nan')):.2f} s", flush=True)
    return out


def _fmt(value, places: int) -> str:
    return "n/a" if value is None else f"{value:.{places}f}"


def markdown(res: dict) -> str:
    lines = ["| workload | tier 2 via nbgrad.jit (ms) | generated function alone (ms) "
             "| hand floor (ms) | tier 2 / floor | compile cold (s) | compile warm (s) "
             "| notes |", "|---|---|---|---|---|---|---|---|"]
    for name in res.get("names", []):
        st = res.get("steady", {}).get(name, {})
        ct = res.get("compile", {}).get(name, {})
        cold = ct.get("cold", {}).get("compile_s")
        warm = ct.get("warm", {}).get("compile_s")
        note = []
        tier = st.get("tier", {})
        if tier.get("tier2_refused"):
            note.append("tier 2 refused: " + tier["tier2_refused"][:60])
        if "floor_expm1" in st:
            note.append(f"floor with tanh via expm1: {st['floor_expm1']['median_ms']:.1f} ms")
        lines.append(
            f"| {TITLES[name]} | {_fmt(st.get('tier2', {}).get('median_ms'), 3)} | "
            f"{_fmt(st.get('tier2_native', {}).get('median_ms'), 3)} | "
            f"{_fmt(st.get('floor', {}).get('median_ms'), 3)} | "
            f"{_fmt(st.get('ratio_median'), 2)} | {_fmt(cold, 2)} | {_fmt(warm, 3)} | "
            f"{'; '.join(note)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="W1,W1u,W3,W4")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per timing sample")
    ap.add_argument("--no-compile", action="store_true", help="skip the cold/warm runs")
    ap.add_argument("--no-steady", action="store_true", help="skip the steady state")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--size", default="full", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child_compile(args.child, args.size)))
        return 0
    size = "quick" if args.quick else "full"
    names = [n for n in args.only.split(",") if n in WORKLOADS]
    res: dict = {"names": names, "size": size, "note": "shared, noisy 2-core machine; one "
                 "thread; compare ratios within this run only"}
    if not args.no_steady:
        res["steady"] = steady(names, size, args.rounds, args.budget)
    if not args.no_compile:
        res["compile"] = compile_times(names, size)
    print(markdown(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
