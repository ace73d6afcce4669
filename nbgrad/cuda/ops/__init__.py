"""The CUDA kernels of the table's ops, by area as in :mod:`nbgrad.ops`.

Every module registers its kernels with the op registry's
``@kernel(name, target="cuda")``, as :mod:`nbgrad.ops` registers the CPU ones: they
land in ``OpDef.kernels["cuda"]``, the only place dispatch, CUDA fusion and
``nbgrad ops`` read. A kernel has the signature of the op's CPU kernel (table order,
arrays in place of tensors) but receives and returns
:class:`~nbgrad.cuda.array.CudaArray` values; shape checks raise the same errors as on
the CPU.

Importing this package imports ``numba.cuda`` (slow), so nothing imports it before a
CUDA tensor is made: :func:`nbgrad.cuda.register` does.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

import numpy as np

from ...ops.registry import ADAPTERS, OpDef
from ..array import as_cuda


def accepting_host_data(op: OpDef, fn: Callable) -> Callable:
    """``fn``, uploading NumPy arguments in the op's tensor positions first.

    Tensors on the CUDA device normally hold CUDA data, but the constants made for
    Python scalar operands (``x * 2``) and 0-d CPU tensors joining CUDA ones are host
    arrays; they are uploaded (see :func:`nbgrad.cuda.array.as_cuda`).
    """

    @wraps(fn)
    def kernel(*args):
        positions, list_positions = op.tensor_pos, op.list_pos
        if any(isinstance(args[i], np.ndarray) for i in positions) or any(
                isinstance(t, np.ndarray) for i in list_positions for t in args[i]):
            args = list(args)
            for i in positions:
                if isinstance(args[i], np.ndarray):
                    args[i] = as_cuda(args[i])
            for i in list_positions:
                args[i] = [as_cuda(t) if isinstance(t, np.ndarray) else t for t in args[i]]
        return fn(*args)

    return kernel


ADAPTERS["cuda"] = accepting_host_data

from . import (  # noqa: E402 - after the adapter, which every kernel registers through
    convert,
    elementwise,
    indexing,
    linalg,
    nn,
    reduction,
    shape,
)

__all__ = ["accepting_host_data", "convert", "elementwise", "indexing", "linalg", "nn",
           "reduction", "shape"]
