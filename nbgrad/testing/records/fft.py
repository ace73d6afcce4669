"""Records for the FFT ops (:mod:`nbgrad.ops.fft`): complex values as real pairs
``(..., 2)``, references from ``np.fft``. The public transforms (:mod:`nbgrad.fft`) are
tested in ``tests/test_fft.py``."""

from __future__ import annotations

import numpy as np

from ..core import OpRecord, Sample, sample_array


def _complex(p: np.ndarray) -> np.ndarray:
    return p[..., 0] + 1j * p[..., 1]


def _pairs(c: np.ndarray) -> np.ndarray:
    return np.stack([c.real, c.imag], -1)


def _c2c_ref(x, dim, inverse, scale):
    c = _complex(x)
    if c.size == 0:
        return np.zeros(x.shape)
    out = np.fft.ifftn(c, axes=dim, norm="forward") if inverse else np.fft.fftn(c, axes=dim)
    return _pairs(out * scale)


def _weights(m: int, n: int, value: float) -> np.ndarray:
    w = np.full(m, value)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    return w


def _r2c_ref(x, dim, scale, adjoint=False):
    if x.size == 0:
        shape = list(x.shape)
        shape[dim] = shape[dim] // 2 + 1
        return np.zeros(shape + [2])
    c = np.fft.rfft(x, axis=dim) * scale
    if adjoint:
        w = _weights(c.shape[dim], x.shape[dim], 2.0)
        c = c * w.reshape((-1,) + (1,) * (x.ndim - 1 - dim))
    return _pairs(c)


def _c2r_ref(x, dim, n, scale, adjoint=False):
    c = _complex(x)
    if c.size == 0:
        shape = list(c.shape)
        shape[dim] = n
        return np.zeros(shape)
    if adjoint:
        w = _weights(c.shape[dim], n, 0.5)
        c = c * w.reshape((-1,) + (1,) * (c.ndim - 1 - dim))
    return np.fft.irfft(c, n, axis=dim, norm="forward") * scale


def _a(rng, *shape):
    return sample_array(rng, shape)


RECORDS = [
    OpRecord("fft_c2c", lambda rng: [
        Sample((_a(rng, 5, 2), (0,), False, 1.0), note="1d-odd"),
        Sample((_a(rng, 3, 4, 2), (1,), True, 0.25), note="inverse-even"),
        Sample((_a(rng, 2, 3, 4, 2), (0, 2), False, 0.5), note="two-dims"),
        Sample((_a(rng, 0, 4, 2), (1,), False, 1.0), note="empty-batch")],
        ref=_c2c_ref, ref_rtol=1e-10),
    OpRecord("fft_r2c", lambda rng: [
        Sample((_a(rng, 5), 0, 1.0), note="odd"),
        Sample((_a(rng, 3, 6), 1, 0.5), note="even"),
        Sample((_a(rng, 4, 3, 2), 1, 1.0, True), note="adjoint-odd"),
        Sample((_a(rng, 4, 2), 0, 1.0, True), note="adjoint-even"),
        Sample((_a(rng, 0, 4), 1, 1.0), note="empty-batch")],
        ref=_r2c_ref, ref_rtol=1e-10),
    OpRecord("fft_c2r", lambda rng: [
        Sample((_a(rng, 3, 2), 0, 5, 1.0), note="odd"),
        Sample((_a(rng, 2, 4, 2), 1, 6, 0.5), note="even"),
        Sample((_a(rng, 4, 3, 2, 2), 1, 4, 1.0, True), note="adjoint-even"),
        Sample((_a(rng, 3, 2), 0, 5, 1.0, True), note="adjoint-odd"),
        Sample((_a(rng, 0, 3, 2), 1, 4, 1.0), note="empty-batch")],
        ref=_c2r_ref, ref_rtol=1e-10),
]
