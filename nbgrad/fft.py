"""``nbgrad.fft``: discrete Fourier transforms with gradients (``torch.fft``'s and NumPy's
names and arguments), on the rocket-fft package's Numba overloads of ``np.fft``.

Transforms take a real :class:`~nbgrad.Tensor` or a
:class:`~nbgrad.complex_tensor.ComplexTensor` and return a ``ComplexTensor`` (``irfft``,
``irfft2`` and ``irfftn`` a real tensor). Each is built from three real table ops on
complex pairs (:mod:`nbgrad.ops.fft`), so gradients (PyTorch's convention), double
backward and ``nbgrad.jit`` (both tiers, natively) need nothing more. ``n``/``s`` crop or
zero-pad the input first; ``norm`` is ``"backward"`` (default), ``"ortho"`` or
``"forward"``; ``dim``/``dims`` may be spelled ``axis``/``axes``.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence

import numpy as np

from . import ops
from .complex_tensor import ComplexTensor
from .factories import tensor
from .ops.fft import fft_c2c, fft_c2r, fft_r2c
from .tensor import Tensor

# Numba loads rocket-fft through its entry point; checked here for a clear error
if importlib.util.find_spec("rocket_fft") is None:  # pragma: no cover - a dependency
    raise ImportError("nbgrad.fft needs the rocket-fft package (pip install rocket-fft)")

__all__ = ["fft", "fft2", "fftn", "fftshift", "hfft", "hfft2", "hfftn", "ifft", "ifft2",
           "ifftn", "ifftshift", "ihfft", "ihfft2", "ihfftn", "irfft", "irfft2", "irfftn",
           "rfft", "rfft2", "rfftn"]

_NORMS = ("backward", "ortho", "forward")


# ------------------------------------------------------------------ arguments
def _scale(op: str, norm: str | None, count: int, inverse: bool) -> float:
    norm = "backward" if norm is None else norm
    if norm not in _NORMS:
        raise ValueError(f"fft.{op}: norm must be one of {_NORMS} or None, got {norm!r}")
    if norm == "ortho":
        return 1.0 / math.sqrt(count)
    return 1.0 / count if (norm == "forward") != inverse else 1.0


def _real(op: str, x) -> Tensor:
    if isinstance(x, ComplexTensor):
        raise TypeError(f"fft.{op}: expects a real tensor, got a complex one of shape "
                        f"{x.shape} (use fft.{op.replace('r', '', 1)} for complex input)")
    x = x if isinstance(x, Tensor) else tensor(x)
    if isinstance(x, ComplexTensor):
        return _real(op, x)
    return x if x.dtype.kind == "f" else ops.to_dtype(x, "float64")


def _pairs(op: str, x) -> Tensor:
    """The complex pairs of ``x`` (a real input gets imaginary part 0)."""
    if isinstance(x, ComplexTensor):
        return x._pairs
    if not isinstance(x, Tensor):
        x = tensor(x)
        if isinstance(x, ComplexTensor):
            return x._pairs
    x = x if x.dtype.kind == "f" else ops.to_dtype(x, "float64")
    return ops.stack([x, ops.zeros_like(x)], -1)


def _dims(op: str, ndim: int, dim, sizes, default_all: bool
          ) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """Normalised dims (distinct, non-negative) and their requested lengths (None: as is)."""
    if dim is None:
        if sizes is not None:
            dim = tuple(range(ndim - len(sizes), ndim))
        else:
            dim = tuple(range(ndim)) if default_all else tuple(range(max(ndim - 2, 0), ndim))
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    if sizes is None:
        sizes = (None,) * len(dims)
    sizes = (sizes,) if isinstance(sizes, (int, np.integer)) else tuple(sizes)
    if len(sizes) != len(dims):
        raise ValueError(f"fft.{op}: s {sizes} and dims {dims} must have the same length")
    out = []
    for d in dims:
        if not -ndim <= d < ndim:
            raise IndexError(f"fft.{op}: dim {d} out of range for an input of {ndim} dims")
        out.append(int(d) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"fft.{op}: dims {dims} repeat a dim")
    if not out:
        raise ValueError(f"fft.{op}: no dims to transform")
    for s in sizes:
        if s is not None and s != -1 and s < 1:
            raise ValueError(f"fft.{op}: invalid number of data points {s}; the length of "
                             "a transformed dim must be at least 1")
    return tuple(out), tuple(None if s in (None, -1) else int(s) for s in sizes)


def _resize(x: Tensor, dim: int, length: int) -> Tensor:
    """``x`` cropped or zero-padded along ``dim`` to ``length``."""
    have = x.shape[dim]
    if have == length:
        return x
    trailing = x.ndim - 1 - dim  # dims after ``dim`` (the pair dim included)
    return ops.pad(x, (0, 0) * trailing + (0, length - have))


def _lengths(op: str, shape: tuple, dims: tuple, sizes: tuple) -> tuple[int, ...]:
    lengths = tuple(shape[d] if s is None else s for d, s in zip(dims, sizes, strict=True))
    if any(n < 1 for n in lengths):
        raise ValueError(f"fft.{op}: invalid number of data points ({lengths}) for an input "
                         f"of shape {tuple(shape)} along dims {dims}; specify n or s")
    return lengths


# ------------------------------------------------------------------ complex to complex
def _c2c(op: str, x, sizes, dims, norm, inverse: bool, default_all: bool, dim_alias=None
         ) -> ComplexTensor:
    p = _pairs(op, x)
    dims, sizes = _dims(op, p.ndim - 1, dims if dim_alias is None else dim_alias, sizes,
                        default_all)
    lengths = _lengths(op, p.shape[:-1], dims, sizes)
    for d, n in zip(dims, lengths, strict=True):
        p = _resize(p, d, n)
    return ComplexTensor(fft_c2c(p, dims, inverse,
                                 _scale(op, norm, math.prod(lengths), inverse)))


def fft(input, n: int | None = None, dim: int = -1, norm: str | None = None, *,
        axis: int | None = None) -> ComplexTensor:
    """The 1-D discrete Fourier transform along ``dim`` (length ``n``)."""
    return _c2c("fft", input, None if n is None else (n,), axis if axis is not None else dim,
                norm, False, False)


def ifft(input, n: int | None = None, dim: int = -1, norm: str | None = None, *,
         axis: int | None = None) -> ComplexTensor:
    """The 1-D inverse discrete Fourier transform along ``dim``."""
    return _c2c("ifft", input, None if n is None else (n,), axis if axis is not None else dim,
                norm, True, False)


def fft2(input, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
         norm: str | None = None, *, axes=None) -> ComplexTensor:
    """The 2-D transform over ``dim`` (default the last two)."""
    return _c2c("fft2", input, s, dim, norm, False, False, dim_alias=axes)


def ifft2(input, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None, *, axes=None) -> ComplexTensor:
    """The 2-D inverse transform over ``dim``."""
    return _c2c("ifft2", input, s, dim, norm, True, False, dim_alias=axes)


def fftn(input, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
         norm: str | None = None, *, axes=None) -> ComplexTensor:
    """The N-D transform over ``dim`` (default: the last ``len(s)`` dims, or all)."""
    return _c2c("fftn", input, s, dim, norm, False, True, dim_alias=axes)


def ifftn(input, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None, *, axes=None) -> ComplexTensor:
    """The N-D inverse transform over ``dim``."""
    return _c2c("ifftn", input, s, dim, norm, True, True, dim_alias=axes)


# ------------------------------------------------------------------ real to half spectrum
def _r2c(op: str, x, sizes, dims, norm, default_all: bool) -> ComplexTensor:
    x = _real(op, x)
    if x.ndim == 0:
        raise IndexError(f"fft.{op}: expects at least one dim, got a 0-d tensor")
    dims, sizes = _dims(op, x.ndim, dims, sizes, default_all)
    lengths = _lengths(op, x.shape, dims, sizes)
    last, n = dims[-1], lengths[-1]
    x = _resize(x, last, n)
    for d, m in zip(dims[:-1], lengths[:-1], strict=True):
        x = _resize(x, d, m)
    scale = _scale(op, norm, math.prod(lengths), False)
    p = fft_r2c(x, last, scale if len(dims) == 1 else 1.0)
    if len(dims) > 1:
        p = fft_c2c(p, dims[:-1], False, scale)
    return ComplexTensor(p)


def rfft(input, n: int | None = None, dim: int = -1, norm: str | None = None, *,
         axis: int | None = None) -> ComplexTensor:
    """The half spectrum (``n // 2 + 1`` bins) of a real signal along ``dim``."""
    return _r2c("rfft", input, None if n is None else (n,),
                axis if axis is not None else dim, norm, False)


def rfft2(input, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None, *, axes=None) -> ComplexTensor:
    """The 2-D transform of a real input, halved along the last of ``dim``."""
    return _r2c("rfft2", input, s, dim if axes is None else axes, norm, False)


def rfftn(input, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None, *, axes=None) -> ComplexTensor:
    """The N-D transform of a real input, halved along the last of ``dim``."""
    return _r2c("rfftn", input, s, dim if axes is None else axes, norm, True)


# ------------------------------------------------------------------ half spectrum to real
def _c2r(op: str, x, sizes, dims, norm, default_all: bool) -> Tensor:
    p = _pairs(op, x)
    dims, sizes = _dims(op, p.ndim - 1, dims, sizes, default_all)
    shape = p.shape[:-1]
    n = sizes[-1] if sizes[-1] is not None else 2 * (shape[dims[-1]] - 1)
    lengths = _lengths(op, shape, dims[:-1], sizes[:-1]) + (n,)
    if n < 1:
        raise ValueError(f"fft.{op}: invalid number of data points ({n}) for an input of "
                         f"shape {tuple(shape)} along dim {dims[-1]}; specify n or s")
    scale = _scale(op, norm, math.prod(lengths), True)
    for d, m in zip(dims[:-1], lengths[:-1], strict=True):
        p = _resize(p, d, m)
    if len(dims) > 1:
        p = fft_c2c(p, dims[:-1], True, 1.0)
    p = _resize(p, dims[-1], n // 2 + 1)
    return fft_c2r(p, dims[-1], n, scale)


def irfft(input, n: int | None = None, dim: int = -1, norm: str | None = None, *,
          axis: int | None = None) -> Tensor:
    """The real signal (length ``n``, default ``2 (m - 1)``) of a half spectrum."""
    return _c2r("irfft", input, None if n is None else (n,),
                axis if axis is not None else dim, norm, False)


def irfft2(input, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
           norm: str | None = None, *, axes=None) -> Tensor:
    """The inverse of :func:`rfft2`."""
    return _c2r("irfft2", input, s, dim if axes is None else axes, norm, False)


def irfftn(input, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
           norm: str | None = None, *, axes=None) -> Tensor:
    """The inverse of :func:`rfftn`."""
    return _c2r("irfftn", input, s, dim if axes is None else axes, norm, True)


# ------------------------------------------------------------------ Hermitian signals
_SWAP = {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}


def _swapped(op: str, norm: str | None) -> str:
    if norm not in _SWAP:
        raise ValueError(f"fft.{op}: norm must be one of {_NORMS} or None, got {norm!r}")
    return _SWAP[norm]


def _conj(op: str, x) -> ComplexTensor:
    p = _pairs(op, x)
    return ComplexTensor(p).conj()


def hfft(input, n: int | None = None, dim: int = -1, norm: str | None = None, *,
         axis: int | None = None) -> Tensor:
    """The (real) transform of a Hermitian-symmetric signal given by its first half."""
    return irfft(_conj("hfft", input), n, dim, _swapped("hfft", norm), axis=axis)


def ihfft(input, n: int | None = None, dim: int = -1, norm: str | None = None, *,
          axis: int | None = None) -> ComplexTensor:
    """The inverse of :func:`hfft`: the half spectrum of the inverse transform of a real
    signal."""
    return rfft(input, n, dim, _swapped("ihfft", norm), axis=axis).conj()


def hfft2(input, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
          norm: str | None = None, *, axes=None) -> Tensor:
    """The 2-D :func:`hfft`."""
    return irfft2(_conj("hfft2", input), s, dim, _swapped("hfft2", norm), axes=axes)


def ihfft2(input, s: Sequence[int] | None = None, dim: Sequence[int] = (-2, -1),
           norm: str | None = None, *, axes=None) -> ComplexTensor:
    """The 2-D :func:`ihfft`."""
    return rfft2(input, s, dim, _swapped("ihfft2", norm), axes=axes).conj()


def hfftn(input, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
          norm: str | None = None, *, axes=None) -> Tensor:
    """The N-D :func:`hfft`."""
    return irfftn(_conj("hfftn", input), s, dim, _swapped("hfftn", norm), axes=axes)


def ihfftn(input, s: Sequence[int] | None = None, dim: Sequence[int] | None = None,
           norm: str | None = None, *, axes=None) -> ComplexTensor:
    """The N-D :func:`ihfft`."""
    return rfftn(input, s, dim, _swapped("ihfftn", norm), axes=axes).conj()


# ------------------------------------------------------------------ shifts
def _shift(op: str, x, dim, sign: int):
    x = x if isinstance(x, (Tensor, ComplexTensor)) else tensor(x)
    t = x._pairs if isinstance(x, ComplexTensor) else x
    ndim = x.ndim
    if dim is None:
        dim = tuple(range(ndim))
    elif isinstance(dim, (int, np.integer)):
        dim = (dim,)
    if ndim == 0 or not dim:
        return x
    dims = _dims(op, ndim, tuple(dim), None, True)[0]
    out = ops.roll(t, tuple(sign * (t.shape[d] // 2) for d in dims), dims)
    return ComplexTensor(out) if isinstance(x, ComplexTensor) else out


def fftshift(input, dim: int | Sequence[int] | None = None, *, axes=None):
    """The zero-frequency term moved to the centre of ``dim`` (default: every dim)."""
    return _shift("fftshift", input, dim if axes is None else axes, 1)


def ifftshift(input, dim: int | Sequence[int] | None = None, *, axes=None):
    """The inverse of :func:`fftshift`."""
    return _shift("ifftshift", input, dim if axes is None else axes, -1)
