"""The three FFT ops behind :mod:`nbgrad.fft`, on complex values held as real pairs.

nbgrad has no complex dtype: a complex array of shape ``S`` is a float tensor of shape
``S + (2,)`` (real, imaginary), as ``torch.view_as_real``. So each transform is a real op:

- ``fft_c2c(self, dim, inverse, scale)``: pairs to pairs over the dims ``dim``,
  ``scale * sum_j x_j exp(-+2 pi i jk / n)`` (``+`` when ``inverse``);
- ``fft_r2c(self, dim, scale, adjoint)``: real (length ``n`` along ``dim``) to the half
  spectrum (``n // 2 + 1`` pairs), as ``rfft`` times ``scale``;
- ``fft_c2r(self, dim, n, scale, adjoint)``: half spectrum to real length ``n``, as
  ``irfft`` unnormalised times ``scale``.

They are linear, so each gradient is the adjoint transform, another of these ops (table
formulas, so double backward needs nothing more): c2c's is c2c the other way; r2c's is
c2r with the interior bins halved first, c2r's is r2c with them doubled (``adjoint=True``
selects those weights). Lengths, padding and ``norm`` are the callers' (:mod:`nbgrad.fft`).
The natives are in :mod:`nbgrad.kernels.fft`.
"""

from __future__ import annotations

import math

from ..kernels import fft as kf
from ..kernels.layout import call_native
from ..tensor import Tensor
from .dispatch import apply
from .registry import formula_helper, get, kernel, op_function
from .traits import NativePlan, Opaque, batching

__all__: list[str] = []


def _stack(shape: tuple, dim: int) -> tuple[int, int, int]:
    return (math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:]))


@formula_helper
def fft_not(flag: bool) -> bool:
    """``not flag`` (the adjoint's direction or weights)."""
    return not flag


@formula_helper
def fft_length(shape: tuple, dim: int) -> int:
    """``shape[dim]``: the real length an r2c transform read."""
    return int(shape[dim])


def _check_float(op: str, x: Tensor) -> None:
    if not isinstance(x, Tensor) or x.dtype.kind != "f":
        raise TypeError(f"{op}: expects a float tensor, got "
                        f"{type(x).__name__ if not isinstance(x, Tensor) else x.dtype}")


def _check_pairs(op: str, x: Tensor) -> None:
    _check_float(op, x)
    if x.ndim < 2 or x.shape[-1] != 2:
        raise RuntimeError(f"{op}: expects complex values as real pairs, shape (..., 2) with "
                           f"at least one complex dim, got shape {tuple(x.shape)}")


# ------------------------------------------------------------------ c2c
_C2C = Opaque(native=kf.c2c_native, static=lambda attrs, shapes: NativePlan(
    (tuple(shapes[0][:-1]), tuple(int(d) for d in attrs["dim"]), bool(attrs["inverse"]),
     float(attrs["scale"])), (tuple(shapes[0]),)))


@kernel("fft_c2c", kind=_C2C, batch=batching("along"))
def _c2c_kernel(self, dim, inverse, scale):
    kf.require_rocket_fft()
    return call_native(_C2C, (self,), {"dim": dim, "inverse": inverse, "scale": scale})


@op_function("fft_c2c")
def fft_c2c(self: Tensor, dim: tuple[int, ...], inverse: bool, scale: float) -> Tensor:
    """The complex transform of the pairs ``self`` over the complex dims ``dim``
    (non-negative, the pair dim excluded), unnormalised, times ``scale``."""
    _check_pairs("fft_c2c", self)
    dim = tuple(int(d) for d in dim)
    if not dim or any(not 0 <= d < self.ndim - 1 for d in dim):
        raise IndexError(f"fft_c2c: dims {dim} out of range for complex shape "
                         f"{tuple(self.shape[:-1])}")
    return apply(get("fft_c2c"), (self, dim, bool(inverse), float(scale)))


# ------------------------------------------------------------------ r2c
_R2C = Opaque(native=kf.r2c_native, static=lambda attrs, shapes: NativePlan(
    (_stack(tuple(shapes[0]), attrs["dim"]), float(attrs["scale"]), bool(attrs["adjoint"])),
    (_half(tuple(shapes[0]), attrs["dim"]) + (2,),)))


def _half(shape: tuple, dim: int) -> tuple:
    return shape[:dim] + (shape[dim] // 2 + 1,) + shape[dim + 1:]


@kernel("fft_r2c", kind=_R2C, batch=batching("along"))
def _r2c_kernel(self, dim, scale, adjoint):
    kf.require_rocket_fft()
    return call_native(_R2C, (self,), {"dim": dim, "scale": scale, "adjoint": adjoint})


@op_function("fft_r2c")
def fft_r2c(self: Tensor, dim: int, scale: float, adjoint: bool = False) -> Tensor:
    """The half spectrum (pairs, ``n // 2 + 1`` along ``dim``) of the real ``self``, as
    ``rfft`` times ``scale``; ``adjoint`` doubles the interior bins."""
    _check_float("fft_r2c", self)
    if not 0 <= dim < self.ndim or self.shape[dim] == 0:
        raise IndexError(f"fft_r2c: dim {dim} must name a non-empty dim of shape "
                         f"{tuple(self.shape)}")
    return apply(get("fft_r2c"), (self, int(dim), float(scale), bool(adjoint)))


# ------------------------------------------------------------------ c2r
_C2R = Opaque(native=kf.c2r_native, static=lambda attrs, shapes: NativePlan(
    (_stack(tuple(shapes[0][:-1]), attrs["dim"]), int(attrs["n"]), float(attrs["scale"]),
     bool(attrs["adjoint"])),
    (tuple(shapes[0][:attrs["dim"]]) + (int(attrs["n"]),)
     + tuple(shapes[0][attrs["dim"] + 1:-1]),)))


@kernel("fft_c2r", kind=_C2R, batch=batching("along"))
def _c2r_kernel(self, dim, n, scale, adjoint):
    kf.require_rocket_fft()
    return call_native(_C2R, (self,), {"dim": dim, "n": n, "scale": scale,
                                       "adjoint": adjoint})


@op_function("fft_c2r")
def fft_c2r(self: Tensor, dim: int, n: int, scale: float, adjoint: bool = False) -> Tensor:
    """The real signal of length ``n`` whose half spectrum is ``self`` (pairs,
    ``n // 2 + 1`` along ``dim``), as ``irfft`` unnormalised, times ``scale``;
    ``adjoint`` halves the interior bins first."""
    _check_pairs("fft_c2r", self)
    if not 0 <= dim < self.ndim - 1 or n < 1 or self.shape[dim] != n // 2 + 1:
        raise IndexError(f"fft_c2r: dim {dim} of complex shape {tuple(self.shape[:-1])} "
                         f"must hold n // 2 + 1 = {n // 2 + 1} bins (n = {n})")
    return apply(get("fft_c2r"), (self, int(dim), int(n), float(scale), bool(adjoint)))
