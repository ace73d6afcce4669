"""CUDA kernels of the elementwise ops (as :mod:`nbgrad.ops.elementwise` on the CPU).

Each op's arithmetic is the scalar expression of
:mod:`nbgrad.kernels.elementwise`, run by the generated kernels of
:mod:`nbgrad.cuda.elementwise`. As on the CPU, an op whose arguments do not map to the
expression as ``(x, *floats)`` has its own kernel, registered after the generic one
and replacing it: ``polygamma`` below, ``gelu`` (a string argument) in
:mod:`nbgrad.cuda.ops.nn`.
"""

from __future__ import annotations

import numpy as np

from ... import dtypes
from ...kernels import elementwise as ew
from ...ops.registry import kernel
from .. import elementwise as cew
from ..array import CudaArray


def _out_dtype(kind: str, dtype: np.dtype) -> np.dtype:
    return dtypes.bool_ if kind == "bool" else dtype


def _register_unary(spec: ew.ScalarOp) -> None:
    name, kind = spec.name, spec.kind

    def unary_kernel(x: CudaArray, *params) -> CudaArray:
        return cew.run_unary(name, x, _out_dtype(kind, x.dtype), *map(float, params))

    unary_kernel.__name__ = f"cuda_{name}"
    kernel(name, target="cuda")(unary_kernel)


def _register_binary(spec: ew.ScalarOp) -> None:
    name, kind = spec.name, spec.kind

    def binary_kernel(a: CudaArray, b: CudaArray) -> CudaArray:
        return cew.run_binary(name, a, b, _out_dtype(kind, a.dtype))

    binary_kernel.__name__ = f"cuda_{name}"
    kernel(name, target="cuda")(binary_kernel)


for _spec in ew.UNARY.values():
    _register_unary(_spec)
for _spec in ew.BINARY.values():
    _register_binary(_spec)


@kernel("polygamma", target="cuda")
def _polygamma(n: int, x: CudaArray) -> CudaArray:  # table order: polygamma(int n, Tensor self)
    return cew.run_unary("polygamma", x, x.dtype, float(n))


@kernel("clamp_tensor", target="cuda")
def _clamp_tensor(x: CudaArray, lo: CudaArray | None, hi: CudaArray | None) -> CudaArray:
    out = x
    if lo is not None:
        out = cew.run_binary("maximum", out, lo, x.dtype)
    if hi is not None:
        out = cew.run_binary("minimum", out, hi, x.dtype)
    return out


@kernel("where", target="cuda")
def _where(condition: CudaArray, a: CudaArray, b: CudaArray) -> CudaArray:
    return cew.run_ternary("where", condition.astype(np.bool_, copy=False), a, b, a.dtype)


@kernel("lerp", target="cuda")
def _lerp(a: CudaArray, b: CudaArray, w: CudaArray) -> CudaArray:
    return cew.run_ternary("lerp", w, a, b, a.dtype)
