"""Dtypes nbgrad supports and NumPy-style promotion between them."""

from __future__ import annotations

import numpy as np

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

SUPPORTED = (float32, float64, int32, int64, bool_)
FLOATING = (float32, float64)
_BY_NAME = {d.name: d for d in SUPPORTED} | {"bool": bool_, "float": float64, "int": int64,
                                               "double": float64, "long": int64}


def as_dtype(dtype: object) -> np.dtype:
    """Normalise ``dtype`` (a NumPy dtype, type or name) to a supported NumPy dtype."""
    if isinstance(dtype, str) and dtype in _BY_NAME:
        return _BY_NAME[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"nbgrad: {dtype!r} is not a dtype") from exc
    if dt in SUPPORTED:
        return dt
    if dt == np.float16:
        raise TypeError("nbgrad: float16 is not supported; convert to float32 first")
    if dt.kind in "iu":
        return int64
    raise TypeError(f"nbgrad: dtype {dt} is not supported (use float32, float64, int64 or bool)")


def is_floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f"


def promote(*dtypes: np.dtype) -> np.dtype:
    """NumPy's promotion among tensor dtypes."""
    if len(dtypes) == 1:
        return dtypes[0]
    return as_dtype(np.result_type(*dtypes))


def float_result(dtype: np.dtype) -> np.dtype:
    """The dtype of a floating result computed from ``dtype`` (NumPy: ints become float64)."""
    return dtype if dtype.kind == "f" else float64


def canonical(dtype: np.dtype) -> np.dtype:
    """NumPy's own dtype object equal to ``dtype`` (for built-in types). Arrays made by code
    Numba loaded from its disk cache carry equal copies, and eager's lean path tests
    dtypes by identity."""
    canon = np.dtype(dtype.type)
    return canon if canon == dtype else dtype
