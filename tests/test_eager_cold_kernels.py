"""Eager paths that skip a Numba compile on a cold start compute what the kernels compute.

The general broadcast of IEEE-rounded binary ops (add, sub, mul, div, comparisons) calls
the op's NumPy ufunc (``ScalarOp.ufunc``) instead of compiling ``bcast_<name>``, and
eager matrix products call NumPy's BLAS (issue 15 item 8)."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import nbgrad as nb
from nbgrad.kernels import elementwise as ew

UFUNC_OPS = sorted(ew._UFUNCS)
SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e308, -1e308, 5e-324, 1.0, -2.5]
PAIRS = [((3, 1), (1, 4)), ((2, 1, 3), (4, 1)), ((1, 5), (2, 1, 1)), ((4, 1, 2), (1, 3, 1))]


def kernels_asked(monkeypatch) -> list[str]:
    """The names of the compiled kernels eager code asks for from now on (a spy)."""
    asked = []
    real = ew.kernel_function

    def spy(prefix, name):
        asked.append(f"{prefix}_{name}")
        return real(prefix, name)

    monkeypatch.setattr(ew, "kernel_function", spy)
    return asked


def _kernel_broadcast(name, a, b, out_dtype):
    """``bcast_<name>`` called directly: the values the ufunc path must reproduce."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    out = np.empty(shape, out_dtype)
    ew.kernel_function("bcast", name)(
        np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1),
        out.reshape(-1), np.asarray(shape, np.int64), ew.broadcast_strides(a.shape, shape),
        ew.broadcast_strides(b.shape, shape), np.zeros(len(shape), np.int64))
    return out


def _out_dtype(name, dtype):
    return np.dtype(np.bool_) if ew.BINARY[name].kind == "bool" else np.dtype(dtype)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(UFUNC_OPS), pair=st.sampled_from(PAIRS),
       dtype=st.sampled_from([np.float64, np.float32]), data=st.data())
def test_general_broadcast_ufunc_matches_the_kernel_bit_for_bit(name, pair, dtype, data):
    def draw(shape):
        vals = data.draw(st.lists(st.sampled_from(SPECIALS), min_size=int(np.prod(shape)),
                                  max_size=int(np.prod(shape))))
        with np.errstate(all="ignore"):
            return np.asarray(vals, dtype).reshape(shape)

    a, b = draw(pair[0]), draw(pair[1])
    out_dtype = _out_dtype(name, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy floating-point warnings
        got = ew.run_binary(name, a, b, out_dtype)
    want = _kernel_broadcast(name, a, b, out_dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if out_dtype.kind == "f":  # the sign of zeros and of NaNs' neighbours too
        np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]),
                                      np.signbit(want[~np.isnan(want)]))


def test_general_broadcast_compiles_no_kernel_for_float_ufunc_ops(monkeypatch):
    asked = kernels_asked(monkeypatch)
    for key in [k for k in ew._FUNCS if k.startswith("bcast_")]:
        monkeypatch.delitem(ew._FUNCS, key)
    a, b = np.arange(3.0).reshape(3, 1), np.arange(4.0).reshape(1, 4)
    for name in UFUNC_OPS:
        ew.run_binary(name, a, b, _out_dtype(name, np.float64))
    assert not [k for k in asked if k.startswith("bcast_")]
    # integer operands keep the kernel (NumPy's integer semantics differ: bool + bool)
    ew.run_binary("add", a.astype(np.int64), b.astype(np.int64), np.dtype(np.int64))
    assert "bcast_add" in asked


def test_eager_products_match_numpy_and_take_any_layout():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 4))
    for x, y in ((a, b), (np.asfortranarray(a), b), (a, np.asfortranarray(b)),
                 (a[:, ::-1], b[::-1])):
        np.testing.assert_allclose(nb.matmul(nb.tensor(x), nb.tensor(y)).numpy(), x @ y,
                                   rtol=1e-14, atol=1e-14)
    A, B = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 3, 4))
    np.testing.assert_allclose(nb.matmul(nb.tensor(A), nb.tensor(B)).numpy(), A @ B,
                               rtol=1e-14, atol=1e-14)
    f32 = nb.matmul(nb.tensor(a, dtype=nb.float32), nb.tensor(b, dtype=nb.float32))
    assert f32.dtype == np.float32


def test_eager_products_compile_no_numba_kernel(monkeypatch):
    # a Numba dispatcher meeting new argument types compiles (or loads from the disk
    # cache): eager products must not, whatever the layouts and dtypes
    from numba.core.dispatcher import Dispatcher

    met = []
    real = Dispatcher._compile_for_args

    def spy(self, *args, **kws):
        met.append(self.py_func.__qualname__)
        return real(self, *args, **kws)

    monkeypatch.setattr(Dispatcher, "_compile_for_args", spy)
    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        a, b = rng.standard_normal((3, 2)).astype(dtype), rng.standard_normal((2, 5))
        nb.matmul(nb.tensor(a), nb.tensor(b.astype(dtype)))
        nb.matmul(nb.tensor(a).T, nb.tensor(a))
        nb.matmul(nb.tensor(np.ones((2, 3, 2), dtype)), nb.tensor(b.astype(dtype)))
    assert met == []


def _kernel_binary(name, a, b, out_dtype):
    """``binary_<name>`` called directly (same shapes, or ``b`` one element)."""
    out = np.empty(a.shape, out_dtype)
    mode = 0 if a.shape == b.shape else 1
    ew.kernel_function("binary", name)(a.reshape(-1), b.reshape(-1).copy(), out.reshape(-1),
                                       mode, ew.EMPTY, ew.EMPTY, ew.EMPTY)
    return out


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(UFUNC_OPS), scalar=st.booleans(),
       dtype=st.sampled_from([np.float64, np.float32]), data=st.data())
def test_small_arrays_ufunc_matches_the_kernel_bit_for_bit(name, scalar, dtype, data):
    # float arrays under UFUNC_MAX elements run the ufunc: no binary_<name> compile on a
    # cold start (W1's first call); they must give what the kernel gives
    vals = data.draw(st.lists(st.sampled_from(SPECIALS), min_size=7, max_size=7))
    other = data.draw(st.lists(st.sampled_from(SPECIALS), min_size=7, max_size=7))
    with np.errstate(all="ignore"):
        a = np.asarray(vals, dtype)
        b = np.asarray(other[:1] if scalar else other, dtype).reshape(() if scalar else 7)
    out_dtype = _out_dtype(name, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy floating-point warnings
        got = ew.run_binary(name, a, b, out_dtype)
    want = _kernel_binary(name, a, b, out_dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if out_dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got[~np.isnan(got)]),
                                      np.signbit(want[~np.isnan(want)]))


def test_small_neg_ufunc_matches_the_kernel():
    x = np.asarray(SPECIALS, np.float64)
    want = np.empty_like(x)
    ew.kernel_function("unary", "neg")(x, want, 0.0, 0.0)
    got = ew.run_unary("neg", x, x.dtype)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_first_w1_call_asks_for_no_binary_kernel(monkeypatch):
    # W1's first result under nbgrad.jit (trace, eager tape replay) compiled binary_add,
    # binary_mul, binary_sub and unary_neg on a cold start (~1 s); small float operands
    # now run NumPy's ufuncs. Only its non-ufunc kernels (tanh, the sum) may be asked for.
    asked = kernels_asked(monkeypatch)
    for key in [k for k in ew._FUNCS if k.startswith(("binary_", "unary_", "bcast_"))]:
        monkeypatch.delitem(ew._FUNCS, key)

    def loss(W, b, x0):
        def body(i, x):
            return x + 0.01 * nb.tanh(W @ x + b) - 0.001 * x
        x = nb.fori_loop(0, 5, body, x0)
        return (x * x).sum()

    rng = np.random.default_rng(0)
    f = nb.jit(nb.value_and_grad(loss, argnums=(0, 1)))
    f(nb.tensor(rng.standard_normal((4, 4))), nb.tensor(rng.standard_normal(4)),
      nb.tensor(rng.standard_normal(4)))
    assert asked and set(asked) <= {"unary_tanh"}, asked


def test_lean_path_runs_the_exact_ufunc_bit_for_bit(monkeypatch):
    # small float tensors on the lean path (dispatch.lean_path) run the op's exact ufunc
    # (ScalarOp.ufunc), not its compiled kernel: the kernel's values, dtypes and shapes
    from nbgrad.ops import elementwise as el
    from nbgrad.ops.registry import get

    kern = {n: ew.kernel_function("binary", n) for n in UFUNC_OPS}
    for name in UFUNC_OPS:  # fresh lean kernels and paths, which have looked up no
        op = get(name)      # compiled kernel
        for attr in ("lean", "lean_apply", "lean_reflected"):
            monkeypatch.setattr(op, attr, getattr(op, attr))
        el._set_lean(op, name, ew.BINARY[name].kind)
    asked = kernels_asked(monkeypatch)
    rng = np.random.default_rng(61)
    pool = np.asarray(SPECIALS + list(rng.standard_normal(6) * 3))
    reflected = {"add": lambda s, t: s + t, "sub": lambda s, t: s - t,
                 "mul": lambda s, t: s * t, "div": lambda s, t: s / t}

    def want(name, a, b, mode):  # the kernel: mode 0 same shapes, 1 b one element, 2 a
        out = np.empty(b.shape if mode == 2 else a.shape, _out_dtype(name, a.dtype))
        kern[name](a.reshape(-1).copy(), b.reshape(-1).copy(), out.reshape(-1), mode,
                   ew.EMPTY, ew.EMPTY, ew.EMPTY)
        return out

    def same(got, ref):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)
        if ref.dtype.kind == "f":
            np.testing.assert_array_equal(np.signbit(got), np.signbit(ref))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy floating-point warnings
        for shape in [(7,), (3, 4), (0,), (1,), ()]:
            if shape == ():  # 0-d operands keep the kernel
                assert asked == [], asked
            for dtype in (np.float64, np.float32):
                with np.errstate(all="ignore"):  # 1e308 in float32
                    a = pool[rng.integers(0, len(pool), shape)].astype(dtype)
                    b = pool[rng.integers(0, len(pool), shape)].astype(dtype)
                    s = np.asarray(pool[rng.integers(0, len(pool))], dtype)
                ta, tb, ts = nb.tensor(a), nb.tensor(b), nb.tensor(s)
                for name in UFUNC_OPS:
                    f = getattr(nb, name)
                    same(f(ta, tb).numpy(), want(name, a, b, 0))
                    same(f(ta, ta).numpy(), want(name, a, a, 0))
                    same(f(ta, ts).numpy(), want(name, a, s, 1))
                    same(f(ta, -2.5).numpy(), want(name, a, np.asarray(-2.5, dtype), 1))
                    if name in reflected:
                        same(reflected[name](3, ta).numpy(),
                             want(name, np.asarray(3.0, dtype), a, 2))
