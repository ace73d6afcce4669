"""Start-up figures: `import nbgrad` and the first training step of a small MLP, and the
first result of W1 through `nbgrad.jit`, in a fresh process, with an empty and with a
warm compile cache; and W6 eager per-op latency against PyTorch eager, side by side.

    python perf/startup_figures.py [--repeats 3]

Each start-up run is a new process with one thread. "Cold" points both Numba's cache
(NUMBA_CACHE_DIR) and nbgrad's generated-code folder (NBGRAD_CACHE_DIR) at empty
folders; "warm" reuses the folders the cold run filled.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

STEP = r"""
import time
t0 = time.perf_counter()
import numpy as np
import nbgrad as nb
import nbgrad.nn.functional as F
t1 = time.perf_counter()
rng = np.random.default_rng(0)
x = nb.tensor(rng.standard_normal((128, 64)), dtype=nb.float32)
y = nb.tensor(rng.integers(0, 10, 128))
w1 = nb.tensor(rng.standard_normal((64, 128)) * 0.1, dtype=nb.float32, requires_grad=True)
b1 = nb.zeros(128, dtype=nb.float32, requires_grad=True)
w2 = nb.tensor(rng.standard_normal((128, 10)) * 0.1, dtype=nb.float32, requires_grad=True)
b2 = nb.zeros(10, dtype=nb.float32, requires_grad=True)
loss = F.cross_entropy(F.relu(x @ w1 + b1) @ w2 + b2, y)
loss.backward()
with nb.no_grad():
    for p in (w1, b1, w2, b2):
        p -= 0.01 * p.grad
t2 = time.perf_counter()
print("TIMES", t1 - t0, t2 - t0)
"""

#: W1 (perf/workloads/w1_rollout.py, size "full") through ``nbgrad.jit``: import, then the
#: first result of a new graph (the cold-start target of issue 15, item 8)
W1_JIT = r"""
import time
t0 = time.perf_counter()
import nbgrad
t1 = time.perf_counter()
from perf.workloads import w1_rollout as w
p = w.SIZES["full"]
step = w._build_nbgrad_jit(w.make_inputs(p), p)
step()
t2 = time.perf_counter()
print("TIMES", t1 - t0, t2 - t0)
"""

W6_NBGRAD = r"""
import time, numpy as np, nbgrad as nb
def step():
    x = nb.tensor(np.linspace(0, 1, 8), requires_grad=True)
    y = x
    for _ in range(100):
        y = y * 1.0001 + 0.001
    y.sum().backward()
    return x.grad
"""

W6_TORCH = r"""
import time, numpy as np, torch
torch.set_num_threads(1)
def step():
    x = torch.tensor(np.linspace(0, 1, 8), requires_grad=True)
    y = x
    for _ in range(100):
        y = y * 1.0001 + 0.001
    y.sum().backward()
    return x.grad
"""

W6_TIMER = r"""
for _ in range(50):
    step()
times = []
for _ in range(ROUNDS):
    t = time.perf_counter()
    for _ in range(20):
        step()
    times.append((time.perf_counter() - t) / 20)
print("W6", min(times), sorted(times)[len(times) // 2])
"""

ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                               "NUMBA_NUM_THREADS")}


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, env: dict) -> str:
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **ONE_THREAD, **env},
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout


def startup(repeats: int, code: str = STEP) -> dict:
    """Median seconds of import and of import plus the first result of ``code``."""
    rows = {"cold": [], "warm": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as numba_dir, \
                tempfile.TemporaryDirectory() as nbgrad_dir:
            env = {"NUMBA_CACHE_DIR": numba_dir, "NBGRAD_CACHE_DIR": nbgrad_dir}
            for kind in ("cold", "warm"):
                line = next(ln for ln in _run(code, env).splitlines()
                            if ln.startswith("TIMES"))
                imp, total = map(float, line.split()[1:])
                rows[kind].append({"import_s": imp, "import_and_first_step_s": total})
    return {kind: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            for kind, runs in rows.items()}


def w6(rounds: int = 15) -> dict:
    """W6 (200 tiny ops + backward) per-op latency, interleaving nbgrad and PyTorch."""
    results: dict[str, list] = {"nbgrad": [], "torch": []}
    for _ in range(3):
        for name, code in (("nbgrad", W6_NBGRAD), ("torch", W6_TORCH)):
            try:
                out = _run(code + W6_TIMER.replace("ROUNDS", str(rounds)), {})
            except subprocess.CalledProcessError as exc:
                results[name].append({"error": exc.stderr.strip().splitlines()[-1]})
                continue
            best, median = map(float, out.split()[1:])
            results[name].append({"us_per_op_median": median / 200 * 1e6,
                                  "us_per_op_min": best / 200 * 1e6})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps({"startup": startup(args.repeats),
                      "w1_jit_first": startup(args.repeats, W1_JIT), "w6": w6()}, indent=2))


if __name__ == "__main__":
    main()
