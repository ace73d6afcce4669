"""Figures for ``nbgrad.jit`` (tier 1): start-up costs and W1 steady state.

Run ``python perf/jit_figures.py`` (``--quick`` for fewer rounds, ``--json PATH`` to
save the numbers). One thread throughout. It measures, each in fresh processes where
it matters:

1. ``import nbgrad`` (median of fresh interpreters);
2. the one-time compile of the tier-1 interpreter (an empty ``NBGRAD_CACHE_DIR``; CPU
   and wall seconds of the first native call; the float32 variant compiles on the
   first float32 graph);
3. the first result of a new W1 graph in a warm process (after another W1 graph ran),
   both forms: ``fori_loop`` and the unrolled Python loop;
4. W1 steady state (1,000 steps, float64, value and gradients w.r.t. W and b): the
   ``fori_loop`` form and the unrolled Python loop in tier 1 (and tier 2 when the code
   generator is installed), against the hand-written Numba floor
   (``perf/workloads/floors.py``), interleaved over rounds; median and best.

The machine may be shared and noisy: compare ratios within one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONE_THREAD = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}
os.environ.update(ONE_THREAD)


def _child(code: str, env: dict | None = None) -> dict:
    full = dict(os.environ, **ONE_THREAD, **(env or {}))
    full["PYTHONPATH"] = ROOT + os.pathsep + full.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def import_time(reps: int) -> dict:
    code = """
        import json, time
        t = time.perf_counter()
        import nbgrad
        print(json.dumps({"s": time.perf_counter() - t}))
    """
    times = [_child(code)["s"] for _ in range(reps)]
    return {"median_s": statistics.median(times), "min_s": min(times)}


def interpreter_compile() -> dict:
    code = """
        import json, time
        import numpy as np
        import nbgrad
        from nbgrad.jit.tier1 import interpreter as I
        ins = np.zeros((1, I.WIDTH), np.int64)
        ins[0, 0] = I.OP_LOOP
        c, w = time.process_time(), time.perf_counter()
        I.run_function()(ins, 0, 1, np.zeros(4), np.zeros(2), np.zeros(1, np.int64))
        c, w = time.process_time() - c, time.perf_counter() - w
        print(json.dumps({"cpu_s": c, "wall_s": w}))
    """
    with tempfile.TemporaryDirectory() as tmp:
        cold = _child(code, {"NBGRAD_CACHE_DIR": tmp})
        warm = _child(code, {"NBGRAD_CACHE_DIR": tmp})
    return {"compile_cpu_s": cold["cpu_s"], "compile_wall_s": cold["wall_s"],
            "cached_load_wall_s": warm["wall_s"]}


# ------------------------------------------------------------------ W1
def _w1_inputs(n: int, seed: int):
    import numpy as np
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, n)) / np.sqrt(n), rng.standard_normal(n) * 0.1,
            rng.standard_normal(n))


def _w1(steps: int, form: str, mode: str):
    import nbgrad as nb

    def loss(W, b, x0):
        if form == "fori_loop":
            x = nb.fori_loop(0, steps, lambda i, x: x + 0.01 * nb.tanh(W @ x + b)
                             - 0.01 * 0.1 * x, x0)
        else:
            x = x0
            for _ in range(steps):
                x = x + 0.01 * nb.tanh(W @ x + b) - 0.01 * 0.1 * x
        return (x * x).sum()

    return nb.jit(nb.value_and_grad(loss, argnums=(0, 1)), mode=mode)


def first_result(forms: list[str]) -> dict:
    import nbgrad as nb
    out = {}
    for form in forms:
        warm = _w1(1000 if form == "fori_loop" else 200, form, "interpret")
        args = [nb.tensor(a) for a in _w1_inputs(16, 0)]
        warm(*args)
        warm(*args)
        rows = []
        for n, steps in ((16, 999), (32, 500), (8, 2000)):
            if form != "fori_loop":
                steps = steps // 5  # the unrolled trace runs every step eagerly
            f = _w1(steps, form, "interpret")
            args = [nb.tensor(a) for a in _w1_inputs(n, 1)]
            t = time.perf_counter()
            f(*args)
            t1 = time.perf_counter()
            f(*args)
            t2 = time.perf_counter()
            rows.append({"n": n, "steps": steps, "first_ms": 1e3 * (t1 - t),
                         "second_ms": 1e3 * (t2 - t1)})
        out[form] = rows
    return out


def steady(rounds: int, calls: int) -> dict:
    import numpy as np

    import nbgrad as nb
    from nbgrad.jit.program import tier2
    sys.path.insert(0, ROOT)
    from perf.workloads import floors
    W, b, x0 = _w1_inputs(16, 0)
    args = [nb.tensor(a) for a in (W, b, x0)]
    cands = {"floor (hand-written Numba)": lambda: floors.w1_rollout(W, b, x0, 1000, 0.01)}
    modes = ["interpret"] + (["compile"] if tier2() is not None else [])
    for mode in modes:
        for form in ("fori_loop", "unrolled"):
            f = _w1(1000, form, mode)
            f(*args)
            f(*args)
            cands[f"{form}, {'tier 1' if mode == 'interpret' else 'tier 2'}"] = \
                (lambda f=f: f(*args))
    times: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(rounds):  # interleaved
        for name, fn in cands.items():
            fn()
            for _ in range(calls):
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    floor = statistics.median(times["floor (hand-written Numba)"])
    return {name: {"median_ms": 1e3 * statistics.median(ts), "best_ms": 1e3 * min(ts),
                   "ratio_to_floor": statistics.median(ts) / floor,
                   "spread": float(np.percentile(ts, 90) / np.percentile(ts, 10))}
            for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--json", help="write the figures to this file")
    opts = ap.parse_args()
    reps = 3 if opts.quick else 7
    res = {"machine": os.uname().machine, "cpus": os.cpu_count(),
           "load_avg_at_start": os.getloadavg()}
    res["import_nbgrad"] = import_time(reps)
    res["interpreter_compile"] = interpreter_compile()
    res["first_result_new_w1_graph"] = first_result(["fori_loop", "unrolled"])
    res["w1_steady"] = steady(rounds=3 if opts.quick else 8, calls=10 if opts.quick else 25)
    res["load_avg_at_end"] = os.getloadavg()
    print(json.dumps(res, indent=1))
    print()
    print(f"import nbgrad: {res['import_nbgrad']['median_s']:.3f} s (median)")
    ic = res["interpreter_compile"]
    print(f"tier-1 interpreter compile (once per install): {ic['compile_cpu_s']:.2f} s CPU, "
          f"{ic['compile_wall_s']:.2f} s wall; cached load {ic['cached_load_wall_s']:.2f} s")
    for form, rows in res["first_result_new_w1_graph"].items():
        for r in rows:
            print(f"first result of a new W1 graph ({form}, n={r['n']}, steps={r['steps']}): "
                  f"{r['first_ms']:.1f} ms (second call {r['second_ms']:.1f} ms)")
    print("| W1 steady state | median ms | best ms | x floor |")
    print("|---|---|---|---|")
    for name, r in res["w1_steady"].items():
        print(f"| {name} | {r['median_ms']:.3f} | {r['best_ms']:.3f} | "
              f"{r['ratio_to_floor']:.2f} |")
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
