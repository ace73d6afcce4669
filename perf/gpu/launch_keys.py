"""Which kernels launch directly (:mod:`nbgrad.cuda.launch`) in W2's and W3's eager
steps: for each kernel, its argument keys kept with a compiled kernel and those that
go through Numba's dispatcher. Needs a GPU.

    python perf/gpu/launch_keys.py
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from perf.gpu import bench_gpu as B  # noqa: E402


def main() -> int:
    from numba.cuda.dispatcher import CUDADispatcher
    x = np.random.default_rng(0).standard_normal(100_000)
    inp = B.w2_mlp.make_inputs(B.w2_mlp.SIZES["full"])
    for build, arg in ((B.w3_nbgrad, x), (B.w2_nbgrad, inp), (B.w2_nbgrad_jit, inp)):
        step, sync, _ = build(arg)
        for _ in range(3):
            step()
        sync()
    for d in gc.get_objects():
        if isinstance(d, CUDADispatcher) and "_nbgrad_launch" in d.__dict__:
            kept = d.__dict__["_nbgrad_launch"]
            direct = sum(v is not None for v in kept.values())
            print(f"{d.py_func.__name__:<28} direct {direct}  via the dispatcher "
                  f"{len(kept) - direct}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
