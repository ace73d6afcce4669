"""Python's operators on tensors do what they do on NumPy arrays, for every operator,
dtype and operand order (the bug class: ``t | 4`` on an int tensor was a logical or).

For each operator, each pair of operand kinds (tensor or Python scalar, in both orders)
and each dtype, nbgrad's result equals NumPy's in values and dtype kind, or both raise
(nbgrad with a TypeError or ZeroDivisionError naming the op, never a Numba error).
"""

from __future__ import annotations

import operator

import numpy as np
import pytest

import nbgrad as nb

BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
    "pow": operator.pow, "and": operator.and_, "or": operator.or_, "xor": operator.xor,
    "lshift": operator.lshift, "rshift": operator.rshift, "eq": operator.eq,
    "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "matmul": operator.matmul,
}
UNARY = {"neg": operator.neg, "pos": operator.pos, "invert": operator.invert,
         "abs": operator.abs}

ARRAYS = {
    "int64": np.array([[3, -2, 7], [1, 4, -6], [5, 2, 9]], np.int64),
    "bool": np.array([[True, False, True], [False, False, True], [True, True, False]]),
    "float64": np.array([[1.5, -2.25, 3.0], [0.5, 4.0, -1.0], [2.0, 8.0, 0.25]]),
}
SCALARS = {"int64": 3, "bool": True, "float64": 1.5}

#: where nbgrad follows PyTorch rather than NumPy, on purpose: (op, dtype) -> why
AS_PYTORCH = {
    ("pos", "bool"): "+t returns t (NumPy refuses bool)",
    ("matmul", "bool"): "products of bools are refused (NumPy's is a logical product)",
    ("lshift", "bool"): "shifts refuse bools (NumPy computes them as int8)",
    ("rshift", "bool"): "shifts refuse bools (NumPy computes them as int8)",
}
#: where the values agree and only the result dtype differs: (op, dtype) -> why
OTHER_DTYPE = {
    ("floordiv", "bool"): "bool // bool stays bool (NumPy: int8); the values agree",
    ("mod", "bool"): "bool % bool stays bool (NumPy: int8); the values agree",
    ("matmul", "int64"): "matmul computes in float64 (BLAS)",
    ("pow", "int64"): "integer powers are computed in float64 (so a negative exponent "
                      "gives a fraction, where NumPy raises)",
    ("pow", "bool"): "integer powers are computed in float64",
}


def _numpy(fn, a, b=None):
    try:
        with np.errstate(all="ignore"):
            return fn(a) if b is None else fn(a, b), None
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        return None, exc


def test_the_lists_of_differences_name_real_cases():
    for name, dtype in (*AS_PYTORCH, *OTHER_DTYPE):
        assert (name in BINARY or name in UNARY) and dtype in ARRAYS


def _nbgrad(fn, a, b=None):
    try:
        out = fn(a) if b is None else fn(a, b)
        return (out.numpy() if isinstance(out, nb.Tensor) else np.asarray(out)), None
    except (TypeError, ValueError, ZeroDivisionError, RuntimeError) as exc:
        return None, exc


def _wrap(v):
    return nb.tensor(v) if isinstance(v, np.ndarray) else v


def _check(want, want_exc, got, got_exc, what, key=None):
    if key in AS_PYTORCH or (key in OTHER_DTYPE and isinstance(want_exc, ValueError)):
        return
    if want_exc is not None:
        assert got_exc is not None, f"{what}: NumPy raises {want_exc!r}, nbgrad gives {got}"
        assert "numba" not in type(got_exc).__module__, f"{what}: {got_exc!r}"
        return
    assert got_exc is None, f"{what}: NumPy gives {want}, nbgrad raises {got_exc!r}"
    want = np.asarray(want)
    assert got.shape == want.shape, what
    # NumPy's bool ** bool and bool - bool quirks aside, kinds agree
    kinds = {"b": "b", "i": "i", "u": "i", "f": "f"}
    assert kinds[got.dtype.kind] == kinds[want.dtype.kind] or key in OTHER_DTYPE, \
        f"{what}: dtype {got.dtype}, NumPy {want.dtype}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-14,
                               equal_nan=True, err_msg=what)


@pytest.mark.parametrize("dtype", list(ARRAYS))
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_operators_match_numpy(name, dtype):
    fn = BINARY[name]
    a = ARRAYS[dtype]
    b = np.flip(ARRAYS[dtype], 1).copy()
    if name in ("lshift", "rshift") and dtype == "int64":
        b = np.array([[1, -2, 70], [0, 63, 64], [5, 2, 3]])  # undefined in C: NumPy's results
    if name == "pow" and dtype == "int64":
        b = np.abs(b) % 4
    s = SCALARS[dtype]
    for left, right, what in ((a, b, "t op t"), (a, s, "t op scalar"), (s, a, "scalar op t")):
        if name == "matmul" and not (isinstance(left, np.ndarray)
                                     and isinstance(right, np.ndarray)):
            continue
        want, want_exc = _numpy(fn, left, right)
        got, got_exc = _nbgrad(fn, _wrap(left), _wrap(right))
        if want_exc is None and name in ("truediv", "floordiv", "mod") and dtype != "float64" \
                and np.any(np.asarray(right) == 0):
            continue  # integer division by zero: NumPy warns, nbgrad raises (tested elsewhere)
        _check(want, want_exc, got, got_exc, f"{name} {dtype} {what}", (name, dtype))


@pytest.mark.parametrize("dtype", list(ARRAYS))
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_operators_match_numpy(name, dtype):
    fn = UNARY[name]
    want, want_exc = _numpy(fn, ARRAYS[dtype])
    got, got_exc = _nbgrad(fn, nb.tensor(ARRAYS[dtype]))
    _check(want, want_exc, got, got_exc, f"{name} {dtype}", (name, dtype))


def test_bitwise_ops_under_jit_equal_eager():
    a, b = nb.tensor(ARRAYS["int64"]), nb.tensor(np.abs(ARRAYS["int64"]) % 5)

    def f(a, b):
        return (a | 4) + (a & b) + (a ^ b) + (a << b) + (a >> 1) + ~a

    want = f(a, b).numpy()
    for mode in ("interpret", "compile"):
        g = nb.jit(f, mode=mode)
        for _ in range(2):
            np.testing.assert_array_equal(g(a, b).numpy(), want)


def test_products_of_bools_raise_by_name():
    m = nb.tensor(ARRAYS["bool"])
    with pytest.raises(TypeError, match="matmul: products of bool tensors"):
        m @ m
