"""CUDA elementwise kernels generated from the same scalar expressions as the CPU ones.

:data:`nbgrad.kernels.elementwise.UNARY`, ``BINARY`` and ``TERNARY`` hold each op's
arithmetic as one expression; this module writes one ``@cuda.jit`` kernel per op into
a real file through :func:`nbgrad.codegen.load_module` (so ``cache=True`` works) and
runs it with NumPy broadcasting over strided operands. NumPy functions that CUDA
kernels lack (``np.floor``, ``np.rint``, ...) map to libdevice on a GPU and to NumPy
under the simulator.
"""

from __future__ import annotations

import re

import numpy as np

from .. import codegen
from ..kernels import elementwise as ew
from ..kernels import scalar
from .array import CudaArray, collapse, empty, grid_1d
from .launch import run_kernel

#: NumPy functions the expressions may use, and their libdevice names
NUMPY_FUNCTIONS = {"floor": "floor", "ceil": "ceil", "rint": "rint", "trunc": "trunc",
                   "fmod": "fmod"}

_PRELUDE = '''import math

import numpy as np
from numba import cuda
from numba.cuda.core import config as _config

from nbgrad.cuda.kernels import offset_of
{scalar_import}

if _config.ENABLE_CUDASIM:
{sim_imports}
else:
{gpu_imports}
'''

_UNARY = '''

@cuda.jit(cache=True)
def unary_{name}(out, n, shape, xb, xo, xs, p0, p1):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        x = xb[offset_of(i, shape, xs, xo)]
        out[i] = {expr}
        i += step
'''

_BINARY = '''

@cuda.jit(cache=True)
def binary_{name}(out, n, shape, ab, ao, as_, bb, bo, bs):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        a = ab[offset_of(i, shape, as_, ao)]
        b = bb[offset_of(i, shape, bs, bo)]
        out[i] = {expr}
        i += step
'''

_TERNARY = '''

@cuda.jit(cache=True)
def ternary_{name}(out, n, shape, cb, co, cs, ab, ao, as_, bb, bo, bs):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        c = cb[offset_of(i, shape, cs, co)]
        a = ab[offset_of(i, shape, as_, ao)]
        b = bb[offset_of(i, shape, bs, bo)]
        out[i] = {expr}
        i += step
'''

_NP_CALL = re.compile(r"\bnp\.(\w+)\(")


def cuda_expr(op: ew.ScalarOp) -> str:
    """The op's expression with NumPy calls renamed to the CUDA prelude's functions."""
    def rename(m: re.Match) -> str:
        fn = m.group(1)
        if fn not in NUMPY_FUNCTIONS:
            raise RuntimeError(f"elementwise op {op.name!r}: np.{fn} has no CUDA equivalent; "
                               f"add it to nbgrad.cuda.elementwise.NUMPY_FUNCTIONS")
        return f"np_{fn}("
    return _NP_CALL.sub(rename, op.expr)


def scalar_functions() -> list[str]:
    """The public helpers of :mod:`nbgrad.kernels.scalar` (what expressions may call)."""
    return sorted(n for n, v in vars(scalar).items() if not n.startswith("_") and callable(v)
                  and getattr(v, "__module__", None) == scalar.__name__)


def kernel_source() -> str:
    """The readable source of every CUDA elementwise kernel."""
    sim = "\n".join(f"    np_{k} = np.{k}" for k in NUMPY_FUNCTIONS)
    gpu = "\n".join(f"    from numba.cuda.libdevice import {v} as np_{k}"
                    for k, v in NUMPY_FUNCTIONS.items())
    parts = [_PRELUDE.format(sim_imports=sim, gpu_imports=gpu, scalar_import=ew.SCALAR_IMPORT)]
    parts += [_UNARY.format(name=op.name, expr=cuda_expr(op)) for op in ew.UNARY.values()]
    parts += [_BINARY.format(name=op.name, expr=cuda_expr(op)) for op in ew.BINARY.values()]
    parts += [_TERNARY.format(name=op.name, expr=cuda_expr(op)) for op in ew.TERNARY.values()]
    return "".join(parts)


_MODULE = None


def kernels():
    """The generated kernel module (written to the cache folder on first use)."""
    global _MODULE
    if _MODULE is None:
        _MODULE = codegen.load_module("cuda_elementwise", kernel_source())
    return _MODULE


def broadcast_shape(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy's broadcast of ``shapes``, or a RuntimeError naming the op and the shapes."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listed = " and ".join(str(tuple(s)) for s in shapes)
        raise RuntimeError(f"{op}: shapes {listed} cannot be broadcast together") from None


def run_unary(name: str, x: CudaArray, out_dtype, p0: float = 0.0,
              p1: float = 0.0) -> CudaArray:
    out = empty(x.shape, out_dtype)
    n = out.size
    if n:
        shape, (xs,) = collapse(x.shape, x.strides)
        blocks, threads = grid_1d(n)
        run_kernel(getattr(kernels(), f"unary_{name}"), blocks, threads, out.buf, n, shape, x.buf,
                   x.offset, xs, float(p0), float(p1))
    return out


def run_binary(name: str, a: CudaArray, b: CudaArray, out_dtype) -> CudaArray:
    shape = broadcast_shape(name, a.shape, b.shape)
    out = empty(shape, out_dtype)
    n = out.size
    if n:
        av, bv = a.broadcast_to(shape), b.broadcast_to(shape)
        cshape, (sa, sb) = collapse(shape, av.strides, bv.strides)
        blocks, threads = grid_1d(n)
        run_kernel(getattr(kernels(), f"binary_{name}"), blocks, threads, out.buf, n, cshape, a.buf,
                   a.offset, sa, b.buf, b.offset, sb)
    return out


def run_ternary(name: str, c: CudaArray, a: CudaArray, b: CudaArray, out_dtype) -> CudaArray:
    shape = broadcast_shape(name, c.shape, a.shape, b.shape)
    out = empty(shape, out_dtype)
    n = out.size
    if n:
        cv, av, bv = (v.broadcast_to(shape) for v in (c, a, b))
        cshape, (sc, sa, sb) = collapse(shape, cv.strides, av.strides, bv.strides)
        blocks, threads = grid_1d(n)
        run_kernel(getattr(kernels(), f"ternary_{name}"), blocks, threads, out.buf, n, cshape,
                   c.buf, c.offset, sc, a.buf, a.offset, sa, b.buf, b.offset, sb)
    return out
