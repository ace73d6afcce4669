"""Custom Function overhead (issue 15 item 7): a custom ``autograd.Function`` against the
same computation in plain ops, nbgrad and PyTorch, float64, one thread.

    python -m perf.custom_function_overhead               # 15 interleaved rounds
    python -m perf.custom_function_overhead --rounds 30

Task: ``y = x * x`` on a 100-element input, then ``y.sum().backward()``; the Function
saves ``x`` and its backward returns ``2 * x * g``. Rows: nbgrad eager, nbgrad under
``nbgrad.jit`` (the Function forced onto the PythonOp path with ``jit_path = "python"``,
and on the native path for reference; the jitted step returns the sum, whose
``backward()`` runs the graph's backward) in ``mode="compile"`` (tier 2, steady state from
the first call) and ``mode="interpret"`` (tier 1), and PyTorch eager (CPU). The PythonOp
runs as a Python call between native segments (:mod:`nbgrad.jit.segments`); the rows
"objmode" and "eager step" run it inside the tier's code instead (the path before, built
with ``segments.ENABLED = False``), for a comparison in one run. The overhead of the
Function is its row minus the plain-ops row of the same framework and mode: the median over
rounds of the two rows' difference in one round (paired: a drift of the machine's load
between rounds reaches both rows), and the difference of their medians beside it. Every row's
gradient is checked against ``2 x`` before timing. Compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
             "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from .core import interleaved  # noqa: E402

N = 100
X = np.random.default_rng(0).standard_normal(N)
#: calls before timing: trace, compile, promote and measure
WARMUP = 30


def nbgrad_rows() -> dict[str, Callable]:
    import nbgrad as nb
    from nbgrad.jit import segments

    class Square(nb.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    class SquarePy(Square):
        jit_path = "python"

    class SquareNative(Square):
        jit_path = "native"

    x = nb.tensor(X, requires_grad=True)

    def step(f):
        def run():
            x.grad = None
            f(x).sum().backward()
            return x.grad.numpy()
        return run

    def jit_step(f, mode, segmented=True):
        jf = nb.jit(lambda t: f(t).sum(), mode=mode)

        def run():
            x.grad = None
            jf(x).backward()
            return x.grad.numpy()
        if not segmented:  # built (trace, compile, measure) with the segmented path off
            saved, segments.ENABLED = segments.ENABLED, False
            try:
                for _ in range(WARMUP):
                    run()
            finally:
                segments.ENABLED = saved
        return run

    return {
        "nbgrad eager, plain ops": step(lambda t: t * t),
        "nbgrad eager, Function": step(Square.apply),
        "nbgrad jit, plain ops": jit_step(lambda t: t * t, "compile"),
        "nbgrad jit, Function (PythonOp)": jit_step(SquarePy.apply, "compile"),
        "nbgrad jit, Function (PythonOp, objmode)": jit_step(SquarePy.apply, "compile",
                                                             segmented=False),
        "nbgrad jit, Function (native)": jit_step(SquareNative.apply, "compile"),
        "nbgrad jit tier 1, plain ops": jit_step(lambda t: t * t, "interpret"),
        "nbgrad jit tier 1, Function (PythonOp)": jit_step(SquarePy.apply, "interpret"),
        "nbgrad jit tier 1, Function (PythonOp, eager step)": jit_step(
            SquarePy.apply, "interpret", segmented=False),
    }


def torch_rows() -> dict[str, Callable]:
    import torch
    torch.set_num_threads(1)

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = torch.tensor(X, requires_grad=True)

    def step(f):
        def run():
            x.grad = None
            f(x).sum().backward()
            return x.grad.numpy()
        return run

    return {"torch eager, plain ops": step(lambda t: t * t),
            "torch eager, Function": step(Square.apply)}


#: (Function row, plain-ops row) pairs whose difference is the Function overhead
PAIRS = (("nbgrad eager, Function", "nbgrad eager, plain ops"),
         ("nbgrad jit, Function (PythonOp)", "nbgrad jit, plain ops"),
         ("nbgrad jit, Function (PythonOp, objmode)", "nbgrad jit, plain ops"),
         ("nbgrad jit, Function (native)", "nbgrad jit, plain ops"),
         ("nbgrad jit tier 1, Function (PythonOp)", "nbgrad jit tier 1, plain ops"),
         ("nbgrad jit tier 1, Function (PythonOp, eager step)", "nbgrad jit tier 1, plain ops"),
         ("torch eager, Function", "torch eager, plain ops"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    rows: dict[str, Callable] = {}
    for make in (nbgrad_rows, torch_rows):
        try:
            rows.update(make())
        except ImportError as exc:
            print(f"not installed: {exc.name}; left out")
    for name, fn in rows.items():
        for _ in range(WARMUP):  # trace, compile, promote
            got = fn()
        if not np.allclose(got, 2 * X, rtol=1e-12, atol=0):
            raise SystemExit(f"{name}: wrong gradient")
    times = interleaved(rows, args.rounds)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{'row (forward + sum().backward(), 100 float64)':52s} {'median us':>10s}")
    for name in rows:
        print(f"{name:52s} {med[name] * 1e6:10.1f}")
    print()
    # per round, the Function's block minus the plain ops' block of the same round: a
    # drift of the machine's load between rounds reaches both (the difference of the
    # two medians, printed beside it, does not pair them)
    paired = {fn_row: statistics.median(f - p for f, p in zip(times[fn_row], times[plain],
                                                               strict=True))
              for fn_row, plain in PAIRS if fn_row in med}
    print(f"{'Function overhead (row - plain ops)':52s} {'us':>10s} {'/ torch':>8s} "
          f"{'medians':>10s}")
    torch_ovh = paired.get(PAIRS[-1][0])
    for fn_row, plain in PAIRS:
        if fn_row not in med:
            continue
        ovh = paired[fn_row]
        ratio = f"{ovh / torch_ovh:8.2f}" if torch_ovh else f"{'-':>8s}"
        print(f"{fn_row:52s} {ovh * 1e6:10.1f} {ratio} {(med[fn_row] - med[plain]) * 1e6:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
