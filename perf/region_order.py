"""The order of tier 2's regions (issue 15 item 4): W2's jitted SGD step as generated code
with its regions in traced order and with each region right after the opaque node whose
result makes it ready (``nbgrad.jit.tier2.fusion.PRODUCER_FIRST``), one thread.

    python -m perf.region_order               # 12 interleaved rounds
    python -m perf.region_order --rounds 30

Both modules are generated from the same traced graph in one process and called on the
same arrays; their outputs must be equal bit for bit. Compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import os
import statistics

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
             "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from .core import interleaved  # noqa: E402
from .workloads import w2_mlp  # noqa: E402


def steps() -> dict:
    """``{order: call}``: W2's generated step in each order, on W2's inputs."""
    from nbgrad.jit.api import Jitted
    from nbgrad.jit.tier2 import codegen, fusion

    p = w2_mlp.SIZES["full"]
    inp = w2_mlp.make_inputs(p)
    step = w2_mlp._build_nbgrad_jit(inp, p, "compile")
    for _ in range(3):  # trace, compile (mode="compile": tier 2 from the first call)
        step()
    jitted = next(c.cell_contents for c in step.__closure__
                  if isinstance(c.cell_contents, Jitted))
    graph = next(iter(jitted._cache.values())).program._exe["main"].generated.graph
    arrays = [inp[k] for k in w2_mlp.PARAMS] + [inp["X"], inp["y"]]
    rows, saved = {}, fusion.PRODUCER_FIRST
    try:
        for name, first in (("traced order", False), ("producer first", True)):
            fusion.PRODUCER_FIRST = first
            compiled = codegen.compile_graph(graph, strict=True)
            rows[name] = (compiled.entry, compiled.source())
    finally:
        fusion.PRODUCER_FIRST = saved
    (a, src_a), (b, src_b) = rows.values()
    if src_a == src_b:
        raise SystemExit("both orders generated the same code")
    for x, y in zip(a(*arrays), b(*arrays), strict=True):
        if not np.array_equal(x, y):
            raise SystemExit("the two orders disagree")
    return {name: (lambda f=f: f(*arrays)) for name, (f, _) in rows.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args(argv)
    rows = steps()
    times = interleaved(rows, args.rounds, min_seconds=0.2)
    med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    for name, us in med.items():
        print(f"{name:16s} {us:9.1f} us")
    print(f"producer first / traced order: {med['producer first'] / med['traced order']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
