"""Compile every nbgrad CUDA kernel to PTX for a real GPU, without a GPU.

The simulator runs kernels as Python, so it cannot catch code that Numba's CUDA
target refuses (a NumPy function with no CUDA lowering, a bad shared-array type...).
This script types and compiles each kernel with ``numba.cuda.compile_ptx`` for the
dtypes nbgrad launches it with. It needs NVVM and NVRTC but no driver or GPU:

    pip install "numba-cuda[cu13]"        # or: pip install "cuda-toolkit[nvvm,nvrtc]==13.*"
    python perf/gpu/ptx_check.py [--cc 9.0]

Exit status 1 if any kernel fails to compile.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types as pytypes

os.environ.pop("NUMBA_ENABLE_CUDASIM", None)

from numba import cuda, types  # noqa: E402
from numba.cuda import dispatcher as _dispatcher  # noqa: E402

from nbgrad.cuda import elementwise as cew  # noqa: E402
from nbgrad.cuda import kernels as K  # noqa: E402
from nbgrad.cuda import rows as R  # noqa: E402
from nbgrad.kernels import elementwise as ew  # noqa: E402

i64, f64, f32, b1 = types.int64, types.float64, types.float32, types.boolean


def arr(dt):
    return types.Array(dt, 1, "C")


def tup(n: int):
    return types.UniTuple(i64, n)


def signatures() -> list[tuple[str, object, tuple]]:
    """(label, dispatcher, argument types) for each kernel and dtype nbgrad uses."""
    out = []
    for dt in (f64, f32, i64, b1):
        out.append((f"fill[{dt}]", K.fill, (arr(dt), i64, i64 if dt in (i64, b1) else f64)))
    for src in (f64, f32, i64, b1):
        for dst in (f64, f32, i64, b1):
            out.append((f"copy_strided[{src}->{dst}]", K.copy_strided,
                        (arr(dst), i64, tup(2), arr(src), i64, tup(2), tup(2), i64)))
    for dt in (f64, f32, i64):
        out.append((f"gather[{dt}]", K.gather, (arr(dt), i64, arr(i64), arr(dt), i64, tup(2),
                                                tup(2), i64)))
        out.append((f"scatter_set[{dt}]", K.scatter_set,
                    (arr(dt), i64, arr(i64), arr(dt), i64, tup(1), tup(1), i64)))
        out.append((f"gather_dim[{dt}]", K.gather_dim,
                    (arr(dt), i64, tup(2), arr(i64), i64, tup(2), arr(dt), i64, tup(2), i64)))
        out.append((f"scatter_dim[{dt}]", K.scatter_dim,
                    (arr(dt), i64, tup(2), arr(i64), i64, tup(2), arr(dt), i64, tup(2),
                     tup(2), i64, i64, b1)))
    for dt in (f64, f32):
        out.append((f"scatter_add[{dt}]", K.scatter_add,
                    (arr(dt), i64, arr(i64), arr(dt), i64, tup(2), tup(2), i64)))
        out.append((f"matmul_tiled[{dt}]", K.matmul_tiled,
                    (arr(dt), arr(dt), i64, tup(3), arr(dt), i64, tup(3), i64, i64, i64, i64)))
    for src, dst in ((f64, f64), (f32, f32), (i64, i64), (b1, i64), (f64, f64)):
        for kern in (K.reduce_rows_block, K.reduce_rows_thread):
            out.append((f"{kern.__name__}[{src}->{dst}]", kern,
                        (arr(dst), arr(src), i64, tup(2), tup(2), i64, i64, i64, f64)))
    out.append(("reduce_rows_block[partial]", K.reduce_rows_block,
                (arr(f64), arr(f64), i64, tup(1), tup(1), i64, i64, i64, f64)))
    for dt in (f64, f32):
        a = arr(dt)
        out += [
            (f"extreme_rows[{dt}]", R.extreme_rows, (a, i64, i64, i64, a, arr(i64), b1)),
            (f"logsumexp_rows[{dt}]", R.logsumexp_rows, (a, i64, i64, i64, a)),
            (f"var_rows[{dt}]", R.var_rows, (a, i64, i64, i64, f64, a)),
            (f"norm_rows[{dt}]", R.norm_rows, (a, i64, i64, i64, f64, a)),
            (f"prod_rows[{dt}]", R.prod_rows, (a, i64, i64, i64, a)),
            (f"cumsum_rows[{dt}]", R.cumsum_rows, (a, i64, i64, i64, arr(f64), a)),
            (f"cumprod_rows[{dt}]", R.cumprod_rows, (a, i64, i64, i64, arr(f64), a)),
            (f"scan_rows[{dt}]", R.scan_rows, (a, a, i64, i64, i64, b1, a, a)),
            (f"softmax_rows[{dt}]", R.softmax_rows, (a, i64, i64, i64, b1, a)),
            (f"cross_entropy_rows[{dt}]", R.cross_entropy_rows,
             (a, arr(i64), arr(f64), i64, i64, i64, i64, f64, arr(f64), arr(f64))),
            (f"nll_rows[{dt}]", R.nll_rows,
             (a, arr(i64), arr(f64), i64, i64, i64, i64, f64, arr(f64), arr(f64))),
            (f"nll_backward_rows[{dt}]", R.nll_backward_rows,
             (arr(f64), arr(i64), arr(f64), i64, i64, i64, i64, f64, a)),
            (f"layer_norm_rows[{dt}]", R.layer_norm_rows, (a, i64, i64, a, a, b1, b1, f64, a)),
        ]
    out.append(("extreme_rows[int64]", R.extreme_rows,
                (arr(i64), i64, i64, i64, arr(i64), arr(i64), b1)))
    out.append(("cumsum_rows[int64]", R.cumsum_rows,
                (arr(i64), i64, i64, i64, arr(i64), arr(i64))))
    mod = cew.kernels()
    for spec in ew.UNARY.values():
        for dt in ((f64, f32, i64) if spec.kind == "same" else
                   (b1,) if spec.kind == "bool" else (f64, f32)):
            res = b1 if spec.kind == "bool" else dt
            out.append((f"unary_{spec.name}[{dt}]", getattr(mod, f"unary_{spec.name}"),
                        (arr(res), i64, tup(2), arr(dt), i64, tup(2), f64, f64)))
    for spec in ew.BINARY.values():
        for dt in ((f64, f32, i64) if spec.kind != "float" else (f64, f32)):
            if spec.kind == "bool" and spec.name.startswith("logical"):
                dt = b1
            res = b1 if spec.kind == "bool" else dt
            out.append((f"binary_{spec.name}[{dt}]", getattr(mod, f"binary_{spec.name}"),
                        (arr(res), i64, tup(2), arr(dt), i64, tup(2), arr(dt), i64, tup(2))))
    for spec in ew.TERNARY.values():
        for dt in (f64, f32):
            c = b1 if spec.name == "where" else dt
            out.append((f"ternary_{spec.name}[{dt}]", getattr(mod, f"ternary_{spec.name}"),
                        (arr(dt), i64, tup(2), arr(c), i64, tup(2), arr(dt), i64, tup(2),
                         arr(dt), i64, tup(2))))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="8.0", help="compute capability (default 8.0)")
    args = parser.parse_args(argv)
    cc = tuple(int(p) for p in args.cc.split("."))
    # device functions ask the current device for its compute capability: answer for it
    _dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=cc)
    failures = 0
    start = time.perf_counter()
    sigs = signatures()
    for label, kern, argtys in sigs:
        try:
            cuda.compile_ptx(kern.py_func, argtys, cc=cc)
        except Exception as exc:  # noqa: BLE001 - report every failure, then exit 1
            failures += 1
            first = str(exc).strip().splitlines()
            print(f"FAIL {label}: {type(exc).__name__}: {first[0] if first else ''}")
    took = time.perf_counter() - start
    print(f"{len(sigs) - failures} passed, {failures} failed "
          f"(PTX for sm_{cc[0]}{cc[1]}, {took:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
