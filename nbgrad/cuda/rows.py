"""Row kernels: the CPU's own loops, compiled as CUDA device functions, one thread per row.

The CPU kernels of :mod:`nbgrad.kernels.reduction` and :mod:`nbgrad.kernels.nn` loop
over the rows ``a`` of an (A, R, B) view. Each CUDA kernel here gives every thread
one row (``A = 1`` on a slice of the buffers) and calls the very same Python function
compiled for the GPU, so CUDA results follow the CPU's arithmetic and edge cases
(NaN, infinities, empty rows) by construction. The host side
(:mod:`nbgrad.cuda.ops`) first moves the reduced dimensions last (``B = 1``) so that
there is one row per output.
"""

from __future__ import annotations

import math
import types

import numpy as np
from numba import cuda
from numba.cuda.core import config as _cuda_config

from .. import cache_guard
from ..kernels import nn as nk
from ..kernels import reduction as rk

cache_guard.install()  # numba-cuda's cache files are pickles: safe folders only

#: ``np`` as the CPU kernels' scalar code sees it on a GPU: CUDA has no ``np.exp``,
#: ``np.log``, ``np.sqrt`` on scalars, but ``math``'s are the same functions there
_NUMPY_ON_CUDA = types.ModuleType("nbgrad_numpy_on_cuda")
_NUMPY_ON_CUDA.exp = math.exp
_NUMPY_ON_CUDA.log = math.log
_NUMPY_ON_CUDA.sqrt = math.sqrt
_NUMPY_ON_CUDA.__getattr__ = lambda name: getattr(np, name)


def _device(fn):
    """The Python function behind an ``@njit`` kernel, compiled for CUDA."""
    py = fn.py_func
    if not _cuda_config.ENABLE_CUDASIM:
        scope = dict(py.__globals__, np=_NUMPY_ON_CUDA)
        py = types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__,
                                py.__closure__)
    return cuda.jit(device=True)(py)


_extreme = _device(rk.extreme_arb)
_logsumexp = _device(rk.logsumexp_arb)
_var = _device(rk.var_arb)
_norm = _device(rk.norm_arb)
_prod = _device(rk.prod_arb)
_cumsum = _device(rk.cumsum_arb)
_cumprod = _device(rk.cumprod_arb)
_scan = _device(rk.scan_arb)
_softmax = _device(nk.softmax_twopass)
_cross_entropy = _device(nk.cross_entropy_fwd)
_nll_fwd = _device(nk.nll_fwd)
_nll_bwd = _device(nk.nll_bwd)
_layer_norm = _device(nk.layer_norm_fwd)


@cuda.jit(cache=True)
def extreme_rows(x, A, R, B, out, idx, is_max):
    a = cuda.grid(1)
    while a < A:
        _extreme(x[a * R * B:(a + 1) * R * B], 1, R, B, out[a * B:(a + 1) * B],
                 idx[a * B:(a + 1) * B], is_max)
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def logsumexp_rows(x, A, R, B, out):
    a = cuda.grid(1)
    while a < A:
        _logsumexp(x[a * R * B:(a + 1) * R * B], 1, R, B, out[a * B:(a + 1) * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def var_rows(x, A, R, B, correction, out):
    a = cuda.grid(1)
    while a < A:
        _var(x[a * R * B:(a + 1) * R * B], 1, R, B, correction, out[a * B:(a + 1) * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def norm_rows(x, A, R, B, p, out):
    a = cuda.grid(1)
    while a < A:
        _norm(x[a * R * B:(a + 1) * R * B], 1, R, B, p, out[a * B:(a + 1) * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def prod_rows(x, A, R, B, out):
    a = cuda.grid(1)
    while a < A:
        _prod(x[a * R * B:(a + 1) * R * B], 1, R, B, out[a * B:(a + 1) * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def cumsum_rows(x, A, R, B, acc, out):
    a = cuda.grid(1)
    while a < A:
        _cumsum(x[a * R * B:(a + 1) * R * B], 1, R, B, acc[a * B:(a + 1) * B],
                out[a * R * B:(a + 1) * R * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def cumprod_rows(x, A, R, B, acc, out):
    a = cuda.grid(1)
    while a < A:
        _cumprod(x[a * R * B:(a + 1) * R * B], 1, R, B, acc[a * B:(a + 1) * B],
                 out[a * R * B:(a + 1) * R * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def scan_rows(bv, av, A, R, B, reverse, acc, out):
    a = cuda.grid(1)
    while a < A:
        _scan(bv[a * R * B:(a + 1) * R * B], av[a * R * B:(a + 1) * R * B], 1, R, B, reverse,
              acc[a * B:(a + 1) * B], out[a * R * B:(a + 1) * R * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def softmax_rows(x, A, R, B, log, out):
    a = cuda.grid(1)
    while a < A:
        _softmax(x[a * R * B:(a + 1) * R * B], 1, R, B, log, out[a * R * B:(a + 1) * R * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def cross_entropy_rows(x, target, weight, A, C, B, ignore_index, smoothing, loss, wt):
    a = cuda.grid(1)
    while a < A:
        _cross_entropy(x[a * C * B:(a + 1) * C * B], target[a * B:(a + 1) * B], weight, 1, C,
                       B, ignore_index, smoothing, loss[a * B:(a + 1) * B],
                       wt[a * B:(a + 1) * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def nll_rows(logp, target, weight, A, C, B, ignore_index, smoothing, loss, wt):
    a = cuda.grid(1)
    while a < A:
        _nll_fwd(logp[a * C * B:(a + 1) * C * B], target[a * B:(a + 1) * B], weight, 1, C, B,
                 ignore_index, smoothing, loss[a * B:(a + 1) * B], wt[a * B:(a + 1) * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def nll_backward_rows(g, target, weight, A, C, B, ignore_index, smoothing, out):
    a = cuda.grid(1)
    while a < A:
        _nll_bwd(g[a * B:(a + 1) * B], target[a * B:(a + 1) * B], weight, 1, C, B,
                 ignore_index, smoothing, out[a * C * B:(a + 1) * C * B])
        a += cuda.gridsize(1)


@cuda.jit(cache=True)
def layer_norm_rows(x, M, D, weight, bias, has_weight, has_bias, eps, out):
    m = cuda.grid(1)
    while m < M:
        _layer_norm(x[m * D:(m + 1) * D], 1, D, weight, bias, has_weight, has_bias, eps,
                    out[m * D:(m + 1) * D])
        m += cuda.gridsize(1)
