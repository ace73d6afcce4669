"""Host time of one CUDA op: Numba's kernel launch against nbgrad's eager op and
PyTorch's, on small arrays (the device is never the bottleneck here).

Each row is the median over ``--rounds`` of the mean time of ``--calls`` back-to-back
calls (the device synchronised once per round), in microseconds. Needs a GPU.

    python perf/gpu/launch_overhead.py [--calls 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from numba import cuda


def _fill_ones(out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = 1.0


def _time(fn, sync, calls: int, rounds: int) -> float:
    fn()
    sync()
    means = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        means.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(means)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    import nbgrad as nb
    from nbgrad.cuda import elementwise as cew
    n = 1000
    one_arg = cuda.jit(_fill_ones)

    a = nb.tensor(np.ones(n), device="cuda")
    b = nb.tensor(np.ones(n), device="cuda")
    out = cuda.device_array(n)
    ad, bd = a._data, b._data
    binary = cew.kernels().binary_add
    rows = {
        "numba: kernel with 1 array argument": lambda: one_arg[4, 256](out),
        "numba: nbgrad's binary kernel (9 arguments)":
            lambda: binary[4, 256](out, n, (n,), ad.buf, 0, (1,), bd.buf, 0, (1,)),
        "nbgrad: CudaArray run_binary (+ allocation)":
            lambda: cew.run_binary("add", ad, bd, np.float64),
        "nbgrad: eager a + b (no grad)": lambda: a + b,
    }
    ag = nb.tensor(np.ones(n), device="cuda", requires_grad=True)
    rows["nbgrad: eager a * a (recorded for grad)"] = lambda: ag * ag
    results = {k: _time(f, cuda.synchronize, args.calls, args.rounds) for k, f in rows.items()}
    try:
        import torch
        ta, tb = (torch.ones(n, device="cuda", dtype=torch.float64) for _ in range(2))
        tg = torch.ones(n, device="cuda", dtype=torch.float64, requires_grad=True)
        results["torch: a + b"] = _time(lambda: ta + tb, torch.cuda.synchronize, args.calls,
                                        args.rounds)
        results["torch: a * a (recorded for grad)"] = _time(lambda: tg * tg,
                                                            torch.cuda.synchronize,
                                                            args.calls, args.rounds)
    except (ImportError, AssertionError, RuntimeError) as exc:  # no torch, or no CUDA build
        print(f"torch: not measured ({type(exc).__name__}: {exc})")
    for k, v in results.items():
        print(f"{k:<48} {v:8.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
