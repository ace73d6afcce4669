"""nbgrad: JIT-compiled automatic differentiation on Numba.

NumPy-native tensors, a PyTorch-style eager autograd engine driven by one derivative
table (``formulas/derivatives.yaml``), JAX-style functional transforms, and a
compiler (``nbgrad.jit``) that runs whole forward and backward graphs natively.
"""

from __future__ import annotations

import importlib

from . import (
    autograd,
    cache_guard,
    dtypes,
    jit,  # noqa: E402 - a callable module: nbgrad.jit(f), nbgrad.jit.trace.ir, ...
    linalg,
    numba_init,
    random,
)
from .batching import vmap
from .complex_tensor import (
    ComplexTensor,
    complex,  # noqa: A004 - torch.complex
    view_as_complex,
    view_as_real,
)
from .device import Device
from .dtypes import bool_, float32, float64, int32, int64
from .errors import TableError, TracerError
from .factories import (
    arange,
    as_tensor,
    empty,
    empty_like,
    eye,
    from_dlpack,
    from_numpy,
    full,
    full_like,
    linspace,
    ones,
    tensor,
    zeros,
)
from .functional import (
    grad,
    hessian,
    hvp,
    jacfwd,
    jacobian,
    jacrev,
    jvp,
    value_and_grad,
    vjp,
)
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .jit import cond, fori_loop, scan, while_loop  # noqa: E402
from .jit.trace.remat import checkpoint  # noqa: E402
from .ops import *  # noqa: F403
from .tensor import Tensor
from .version import __version__

bool = bool_  # noqa: A001 - torch's name for the dtype

cache_guard.install()  # before any kernel loads from Numba's disk cache
numba_init.install()  # Numba's first compile defers rocket-fft (scipy.fft) to an FFT

#: subpackages imported on first use (``nbgrad.nn.functional.pad(...)`` right after
#: ``import nbgrad``), so that ``import nbgrad`` does not pay for them
_LAZY = ("nn", "optim", "special", "fft")


#: namespaces of the spec that do not exist yet, and why
_NOT_YET: dict[str, str] = {}


def __getattr__(name: str):
    if name in _LAZY:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    if name in _NOT_YET:
        raise AttributeError(_NOT_YET[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
