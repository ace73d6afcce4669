"""Where a CUDA step's time goes: W2 and W3 steps of nbgrad on the GPU, profiled.

For each of nbgrad's paths in ``bench_gpu.py`` (eager and jit, W3 at 4e6 and W2), with
the memory pool on and off (:mod:`nbgrad.cuda.memory`), in one process: the median
time of a step (device synchronised) and cProfile's top functions by own time over
``--steps`` steps. Needs a GPU.

    python perf/gpu/profile_steps.py [--steps 20] [--top 12]
    NUMBA_ENABLE_CUDASIM=1 python perf/gpu/profile_steps.py --smoke --steps 1  # no GPU
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from perf.gpu import bench_gpu as B  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (the simulator)")
    args = parser.parse_args(argv)
    from nbgrad.cuda import memory
    x = np.random.default_rng(0).standard_normal(2_000 if args.smoke else 4_000_000)
    inp = B.w2_mlp.make_inputs(B.w2_mlp.SIZES["tiny" if args.smoke else "full"])
    cases = [("W3 eager", B.w3_nbgrad, x), ("W3 jit", B.w3_nbgrad_jit, x),
             ("W2 eager", B.w2_nbgrad, inp), ("W2 jit", B.w2_nbgrad_jit, inp)]
    for pool in (True, False, True):
        memory._ENABLED = pool and not memory._cuda_config.ENABLE_CUDASIM  # (no pool there)
        for name, build, arg in cases:
            step, sync, _ = build(arg)
            for _ in range(1 if args.smoke else 3):
                step()
            sync()
            ms = statistics.median(B.step_times_ms(step, sync, args.steps))
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.steps):
                step()
            sync()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
            body = [ln for ln in out.getvalue().splitlines() if ln.strip()][3:]
            print(f"\n=== {name}, pool {'on' if pool else 'off'}: median {ms:.3f} ms a step; "
                  f"cProfile over {args.steps} steps:", flush=True)
            print("\n".join(body), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
