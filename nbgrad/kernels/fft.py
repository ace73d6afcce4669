"""``@njit`` natives of the FFT ops (:mod:`nbgrad.ops.fft`), calling ``np.fft`` through the
rocket-fft package: Numba loads it through its entry point when it first compiles, so this
module imports nothing of it (``nbgrad.fft`` checks that it is installed).

nbgrad has no complex dtype: a complex array is a float array with a trailing dimension of
2 (real, imaginary), as ``torch.view_as_real``. Each native builds the complex array from
the pairs, transforms it and writes pairs back. They take flat arrays and the plan's
constants (``stack`` = (before, length, after) of the transformed dim), so they compile once
per dtype. Transforms are unnormalised, times ``scale``.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.core import types
from numba.extending import overload

OPTS = dict(cache=True, nogil=True)

_LOADED: list[bool] = []


def require_rocket_fft() -> None:
    """Import rocket-fft before any native runs, or raise a clear ImportError. Natives
    loaded from Numba's disk cache call into its library without compiling, so without
    it they would crash rather than fail (the ops' kernels call this first)."""
    if _LOADED:
        return
    try:
        import rocket_fft  # noqa: F401
    except ImportError:
        raise ImportError("nbgrad: the FFT ops need the rocket-fft package "
                          "(pip install rocket-fft)") from None
    _LOADED.append(True)


def complex_empty(x, size):
    """An empty 1-D complex array of ``size``: complex64 for float32 ``x``, else complex128."""


@overload(complex_empty)
def _complex_empty(x, size):
    if x.dtype == types.float32:
        return lambda x, size: np.empty(size, np.complex64)
    return lambda x, size: np.empty(size, np.complex128)


@njit(**OPTS)
def _to_complex(X):
    n = X.size // 2
    c = complex_empty(X, n)
    for i in range(n):
        c[i] = X[2 * i] + 1j * X[2 * i + 1]
    return c


@njit(**OPTS)
def _to_pairs(c, X, scale):
    out = np.empty(2 * c.size, X.dtype)
    for i in range(c.size):
        out[2 * i] = c[i].real * scale
        out[2 * i + 1] = c[i].imag * scale
    return out


@njit(**OPTS)
def c2c_native(X, shape, dims, inverse, scale):
    """The c2c transform of the pairs ``X`` (complex shape ``shape``) over ``dims``:
    ``sum_j x_j exp(-+2 pi i jk / n)`` (``+`` when ``inverse``), times ``scale``."""
    c = _to_complex(X)
    if c.size == 0:
        return np.empty(0, X.dtype)
    for d in dims:
        pre = 1
        for k in range(d):
            pre *= shape[k]
        post = c.size // (pre * shape[d])
        a = c.reshape((pre, shape[d], post))
        if inverse:
            c = np.fft.ifft(a, axis=1, norm="forward").reshape(-1)
        else:
            c = np.fft.fft(a, axis=1).reshape(-1)
    return _to_pairs(c, X, scale)


@njit(**OPTS)
def r2c_native(X, stack, scale, adjoint):
    """``rfft`` of the real ``X`` (``stack``: before, n, after) along its middle dim, times
    ``scale``; ``adjoint``: the interior bins doubled (the adjoint of :func:`c2r_native`)."""
    pre, n, post = stack[0], stack[1], stack[2]
    m = n // 2 + 1
    if pre * post == 0:
        return np.empty(0, X.dtype)
    c = np.fft.rfft(X.reshape((pre, n, post)), axis=1)
    if adjoint:
        top = m - 1 if n % 2 == 0 else m
        c[:, 1:top, :] = c[:, 1:top, :] * 2
    return _to_pairs(c.reshape(-1), X, scale)


@njit(**OPTS)
def c2r_native(X, stack, n, scale, adjoint):
    """The real inverse transform (length ``n``) of the half spectrum ``X`` (pairs, ``stack``:
    before, n // 2 + 1, after) as ``irfft`` unnormalised, times ``scale``; ``adjoint``: the
    interior bins halved first (the adjoint of :func:`r2c_native`)."""
    pre, m, post = stack[0], stack[1], stack[2]
    if pre * post == 0:
        return np.empty(0, X.dtype)
    c = _to_complex(X).reshape((pre, m, post))
    if adjoint:
        top = m - 1 if n % 2 == 0 else m
        c[:, 1:top, :] = c[:, 1:top, :] * 0.5
    x = np.fft.irfft(c, n, axis=1, norm="forward")
    out = np.empty(x.size, X.dtype)
    flat = x.reshape(-1)
    for i in range(x.size):
        out[i] = flat[i] * scale
    return out
