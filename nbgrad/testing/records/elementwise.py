"""Records for elementwise ops."""

from __future__ import annotations

import numpy as np
import scipy.special as sp

from ..core import OpRecord, Sample, binary_samples, sample_array, unary_samples

_UNARY = {
    # name: (domain, NumPy reference)
    "neg": ("real", np.negative),
    "abs": ("nonzero", np.abs),
    "sign": ("nonzero", np.sign),
    "square": ("real", np.square),
    "exp": ("real", np.exp),
    "expm1": ("real", np.expm1),
    "log": ("positive", np.log),
    "log1p": ("positive", np.log1p),
    "log2": ("positive", np.log2),
    "log10": ("positive", np.log10),
    "sqrt": ("positive", np.sqrt),
    "rsqrt": ("positive", lambda x: 1 / np.sqrt(x)),
    "reciprocal": ("nonzero", np.reciprocal),
    "sin": ("real", np.sin),
    "cos": ("real", np.cos),
    "tan": ("unit", np.tan),
    "asin": ("unit", np.arcsin),
    "acos": ("unit", np.arccos),
    "atan": ("real", np.arctan),
    "sinh": ("real", np.sinh),
    "cosh": ("real", np.cosh),
    "tanh": ("real", np.tanh),
    "asinh": ("real", np.arcsinh),
    "acosh": ("gt1", np.arccosh),
    "atanh": ("unit", np.arctanh),
    "sigmoid": ("real", sp.expit),
    "relu": ("nonzero", lambda x: np.maximum(x, 0)),
    "erf": ("real", sp.erf),
    "erfc": ("real", sp.erfc),
    "erfinv": ("unit", sp.erfinv),
    "erfcx": ("real", sp.erfcx),
    "ndtri": ("prob", sp.ndtri),
    "log_ndtr": ("real", sp.log_ndtr),
    "i0": ("real", sp.i0),
    "i0e": ("real", sp.i0e),
    "i1": ("real", sp.i1),
    "i1e": ("real", sp.i1e),
    "floor": ("nonint", np.floor),
    "ceil": ("nonint", np.ceil),
    "round": ("nonint", np.rint),
    "trunc": ("nonint", np.trunc),
    "lgamma": ("positive", sp.gammaln),
    "digamma": ("positive", sp.digamma),
}

_BINARY = {
    "add": ("real", "real", np.add),
    "sub": ("real", "real", np.subtract),
    "mul": ("real", "real", np.multiply),
    "div": ("real", "nonzero", np.divide),
    "pow": ("positive", "real", np.power),
    "maximum": ("real", "real", np.maximum),
    "minimum": ("real", "real", np.minimum),
    "atan2": ("real", "nonzero", np.arctan2),
    "fmod": ("nonint", "positive", np.fmod),
    "remainder": ("nonint", "positive", np.remainder),
    "hypot": ("nonzero", "nonzero", np.hypot),
    "copysign": ("nonzero", "nonzero", np.copysign),
}

_COMPARE = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal, "floor_divide": np.floor_divide,
}
_LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or,
            "logical_xor": np.logical_xor}


_BITWISE = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
            "bitwise_xor": np.bitwise_xor, "bitwise_left_shift": np.left_shift,
            "bitwise_right_shift": np.right_shift}


def _int_pairs(rng):
    return [Sample((rng.integers(-50, 50, (2, 3)), rng.integers(0, 5, (3,))), note="int64"),
            Sample((rng.random((2, 3)) > 0.5, rng.random((3,)) > 0.5), note="bool")]


def _bool_pairs(rng):
    return [Sample((rng.random((2, 3)) > 0.5, rng.random((3,)) > 0.5), note="bool")]


def _where_samples(rng):
    return [
        Sample((rng.random((2, 3)) > 0.5, sample_array(rng, (2, 3)),
                sample_array(rng, (2, 3))), note="same"),
        Sample((rng.random((3,)) > 0.5, sample_array(rng, (2, 3)),
                sample_array(rng, (2, 1))), note="broadcast"),
    ]


def _lerp_samples(rng):
    return [
        Sample((sample_array(rng, (2, 3)), sample_array(rng, (2, 3)),
                sample_array(rng, (2, 3), "unit")), note="same"),
        Sample((sample_array(rng, (2, 3)), sample_array(rng, (3,)),
                sample_array(rng, (2, 1), "unit")), note="broadcast"),
    ]


def _polygamma_samples(rng):
    """``polygamma(n, input)``: n first, as in PyTorch."""
    return [Sample((n, sample_array(rng, shape, "positive")), note=f"n={n} {shape}")
            for n, shape in ((0, (3,)), (1, (2, 3)), (2, (4,)), (3, ()))]


def _clamp_samples(rng):
    x = sample_array(rng, (3, 4)) * 2
    x = np.where(np.abs(np.abs(x) - 0.5) < 0.05, x + 0.2, x)  # keep off the bounds
    return [Sample((x,), {"min": -0.5, "max": 0.5}, note="both"),
            Sample((x,), {"min": -0.5}, note="min"),
            Sample((x,), {"max": 0.5}, note="max")]


def _clamp_tensor_samples(rng):
    """Tensor bounds, broadcast, one missing, and ``min > max`` somewhere (max wins)."""
    x = sample_array(rng, (3, 4)) * 2
    lo = sample_array(rng, (3, 1)) - 0.5
    hi = sample_array(rng, (4,)) + 0.5
    hi[0] = lo.min() - 0.3  # a column where max < min for every row

    def off(v, *bounds):  # keep x off the bounds (finite differences cross no kink)
        for b in bounds:
            v = np.where(np.abs(v - b) < 0.05, v + 0.15, v)
        return v
    x = off(x, lo, hi)
    return [Sample((x, lo, hi), note="both"), Sample((x, lo), note="min"),
            Sample((x,), {"max": hi}, note="max")]


RECORDS = [
    *(OpRecord(name, unary_samples(domain), ref=ref) for name, (domain, ref) in _UNARY.items()),
    *(OpRecord(name, binary_samples(da, db), ref=ref)
      for name, (da, db, ref) in _BINARY.items()),
    *(OpRecord(name, binary_samples("nonint", "nonzero"), ref=ref, grad=False)
      for name, ref in _COMPARE.items()),
    *(OpRecord(name, _bool_pairs, ref=ref, grad=False) for name, ref in _LOGICAL.items()),
    OpRecord("logical_not", lambda rng: [Sample((rng.random((2, 3)) > 0.5,))],
             ref=np.logical_not, grad=False),
    *(OpRecord(name, lambda rng, name=name: _int_pairs(rng)[:1 if "shift" in name else 2],
               ref=ref, grad=False) for name, ref in _BITWISE.items()),
    OpRecord("bitwise_not", lambda rng: [Sample((rng.integers(-50, 50, (2, 3)),))],
             ref=np.invert, grad=False),
    OpRecord("softplus", unary_samples("real"),
             ref=lambda x: np.logaddexp(0, x)),
    OpRecord("polygamma", _polygamma_samples,
             ref=lambda n, x: sp.polygamma(n, x), ref_rtol=1e-9),
    OpRecord("clamp", _clamp_samples, ref=lambda x, min=None, max=None: np.clip(x, min, max)),
    OpRecord("clamp_tensor", _clamp_tensor_samples,
             ref=lambda x, min=None, max=None: np.clip(x, min, max)),
    OpRecord("where", _where_samples, ref=np.where),
    OpRecord("lerp", _lerp_samples, ref=lambda a, b, w: a + w * (b - a)),
]
