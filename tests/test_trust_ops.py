"""Issue 12, ops: grad-mode decorators, exact remainder/floor_divide, polygamma's
argument order, clamp's tensor bounds, empty and 0-d inputs, out-of-range indices."""

import re
import threading

import numpy as np
import pytest

import nbgrad as nb

# ------------------------------------------------------------------ A. grad mode


def _backward_works() -> bool:
    x = nb.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    return x.grad is not None


@pytest.fixture(autouse=True)
def _grad_mode_isolation():
    """A leaked mode must fail only the test that leaked it."""
    yield
    nb.set_grad_enabled(True)


@pytest.mark.parametrize("make, inside_mode", [
    (lambda: nb.set_grad_enabled(False), False), (nb.no_grad, False),
    (lambda: nb.set_grad_enabled(True), True), (nb.enable_grad, True)],
    ids=["set_grad_enabled(False)", "no_grad", "set_grad_enabled(True)", "enable_grad"])
def test_grad_mode_decorator_leaves_mode_alone_outside_calls(make, inside_mode):
    assert nb.is_grad_enabled()

    @make()
    def f():
        return nb.is_grad_enabled()

    assert nb.is_grad_enabled(), "decorating changed the mode"
    assert f() is inside_mode
    assert nb.is_grad_enabled(), "calling changed the mode"
    assert _backward_works()
    with nb.no_grad():
        assert f() is inside_mode
        assert not nb.is_grad_enabled()
    assert nb.is_grad_enabled()


def test_set_grad_enabled_as_call_and_context_manager():
    try:
        nb.set_grad_enabled(False)
        assert not nb.is_grad_enabled()
        nb.set_grad_enabled(True)
        assert nb.is_grad_enabled()
        with nb.set_grad_enabled(False):
            assert not nb.is_grad_enabled()
            with nb.set_grad_enabled(True):
                assert nb.is_grad_enabled()
            assert not nb.is_grad_enabled()
        assert nb.is_grad_enabled()
    finally:
        nb.set_grad_enabled(True)


@pytest.mark.parametrize("make", [lambda: nb.set_grad_enabled(False), nb.no_grad])
def test_grad_mode_restored_when_decorated_function_raises(make):
    @make()
    def f():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        f()
    assert nb.is_grad_enabled()
    with pytest.raises(KeyError), make():
        raise KeyError("x")
    assert nb.is_grad_enabled()


@pytest.mark.parametrize("make", [lambda: nb.set_grad_enabled(False), nb.no_grad])
def test_grad_mode_decorator_on_generator_applies_to_each_step(make):
    @make()
    def gen(n):
        for _ in range(n):
            received = yield nb.is_grad_enabled()
            assert received == "go"
        return "done"

    g = gen(3)
    assert nb.is_grad_enabled()
    modes = [next(g)]
    assert nb.is_grad_enabled(), "mode leaked out of a generator step"
    modes.append(g.send("go"))
    assert nb.is_grad_enabled()
    modes.append(g.send("go"))
    with pytest.raises(StopIteration) as stop:
        g.send("go")
    assert stop.value.value == "done"
    assert modes == [False, False, False]
    assert nb.is_grad_enabled()
    # an exception thrown in, and closing early, restore too
    g2 = gen(2)
    next(g2)
    with pytest.raises(AssertionError):
        g2.send("wrong")
    assert nb.is_grad_enabled()
    g3 = gen(2)
    next(g3)
    g3.close()
    assert nb.is_grad_enabled()


def test_grad_mode_is_thread_local_and_shared_instances_are_safe():
    ctx = nb.no_grad()
    seen = {}
    barrier = threading.Barrier(2)

    def work(name):
        with ctx:
            barrier.wait()
            seen[name] = nb.is_grad_enabled()
            barrier.wait()
        seen[name + "_after"] = nb.is_grad_enabled()

    @nb.set_grad_enabled(False)
    def decorated():
        return nb.is_grad_enabled()

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a": False, "b": False, "a_after": True, "b_after": True}
    out = []
    t = threading.Thread(target=lambda: out.append((decorated(), nb.is_grad_enabled())))
    t.start()
    t.join()
    assert out == [(False, True)]
    assert nb.is_grad_enabled()


# ------------------------------------------------------------------ B. division with rounding

_SPECIAL = [0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 0.5, -0.25, 1e-3, -1e-3, 7.5, 1e20, -1e20, 1e300,
            -1e-300, 5e-324, np.inf, -np.inf, np.nan, 2.0 ** 53 + 2, 0.1, 1e-30, -1e-30]


def _pairs(dtype):
    vals = np.array(_SPECIAL, dtype=np.float64)
    with np.errstate(all="ignore"):
        vals = vals.astype(dtype)
    a, b = np.meshgrid(vals, vals, indexing="ij")
    return a.ravel(), b.ravel()


_DIVISION_OPS = ["remainder", "floor_divide", "fmod"]


def _np_ref(name, a, b):
    with np.errstate(all="ignore"):
        return getattr(np, name)(a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", _DIVISION_OPS)
@pytest.mark.parametrize("mode", ["eager", "interpret", "compile"])
def test_division_ops_match_numpy_on_special_values(name, dtype, mode):
    a, b = _pairs(dtype)
    expected = _np_ref(name, a, b)
    fn = getattr(nb, name)
    if mode == "eager":
        results = [fn(nb.tensor(a), nb.tensor(b)).numpy()]
    else:
        jitted = nb.jit(lambda x, y: fn(x, y) + 0.0, mode=mode)
        results = [jitted(nb.tensor(a), nb.tensor(b)).numpy() for _ in range(2)]
    for got in results:
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected, err_msg=f"{name} {mode}")
    if mode == "eager":  # signed zeros too
        zeros = expected == 0
        assert (np.signbit(results[0][zeros]) == np.signbit(expected[zeros])).all()


def test_division_regressions_from_issue():
    assert nb.remainder(nb.tensor([1e20]), 3.0).item() == 1.0
    assert nb.floor_divide(nb.tensor([-0.25]), -0.001).item() == 249.0
    assert (nb.tensor([1e20]) % 3.0).item() == 1.0
    assert (nb.tensor([-0.25]) // -0.001).item() == 249.0
    assert (1e20 % nb.tensor([3.0])).item() == 1.0
    assert (-0.25 // nb.tensor([-0.001])).item() == 249.0


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("name", ["remainder", "floor_divide"])
@pytest.mark.parametrize("mode", ["eager", "interpret", "compile"])
def test_integer_division_ops_stay_exact_integers(name, dtype, mode):
    info = np.iinfo(dtype)
    a = np.array([info.max, info.max - 1, info.min + 1, -7, 7, 0, -1, 5], dtype)
    b = np.array([3, -3, 7, 2, -2, 5, 3, -1], dtype)
    expected = _np_ref(name, a, b)
    fn = getattr(nb, name)
    if mode == "eager":
        results = [fn(nb.tensor(a), nb.tensor(b)).numpy()]
    else:
        jitted = nb.jit(lambda x, y: fn(x, y), mode=mode)
        results = [jitted(nb.tensor(a), nb.tensor(b)).numpy() for _ in range(2)]
    for got in results:
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name", ["remainder", "floor_divide"])
@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_integer_division_by_zero_raises(name, mode):
    fn = getattr(nb, name)
    a, b = nb.tensor(np.array([5, 6], np.int64)), nb.tensor(np.array([1, 0], np.int64))
    call = fn if mode == "eager" else nb.jit(lambda x, y: fn(x, y), mode=mode)
    with pytest.raises(ZeroDivisionError, match=name):
        call(a, b)


def test_remainder_gradient_uses_exact_floor_division():
    a = nb.tensor([-0.25, 1e20, 7.5], requires_grad=True)
    b = nb.tensor([-0.001, 3.0, -2.0], requires_grad=True)
    nb.remainder(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(b.grad.numpy(), -np.floor_divide([-0.25, 1e20, 7.5],
                                                                   [-0.001, 3.0, -2.0]))


@pytest.mark.parametrize("name", ["floor", "ceil", "round", "trunc"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rounding_ops_exact_on_huge_and_special_values(name, dtype):
    with np.errstate(all="ignore"):
        x = np.array(_SPECIAL + [2.5, -2.5, 0.5000000000000001, 4503599627370497.0], dtype)
    ref = {"round": np.rint}.get(name, getattr(np, name))
    np.testing.assert_array_equal(getattr(nb, name)(nb.tensor(x)).numpy(), ref(x))
    for mode in ("interpret", "compile"):
        jitted = nb.jit(lambda t: getattr(nb, name)(t) + 0.0, mode=mode)
        for _ in range(2):
            np.testing.assert_array_equal(jitted(nb.tensor(x)).numpy(), ref(x))


# ------------------------------------------------------------------ C. polygamma(n, input)


def test_polygamma_takes_n_first_as_pytorch():
    import scipy.special as sp
    x = np.array([0.5, 2.0, 3.5, -1.5])
    for n in range(4):
        expected = sp.polygamma(n, x)
        np.testing.assert_allclose(nb.polygamma(n, nb.tensor(x)).numpy(), expected, rtol=1e-9)
        np.testing.assert_allclose(nb.tensor(x).polygamma(n).numpy(), expected, rtol=1e-9)
        np.testing.assert_allclose(nb.polygamma(np.int64(n), nb.tensor(x)).numpy(), expected,
                                   rtol=1e-9)


@pytest.mark.parametrize("bad_n", [nb.tensor([1]), nb.tensor(1), nb.tensor([1.0]), 1.0, 1.5,
                                   True, "1", None],
                         ids=["tensor1", "tensor0d", "float_tensor", "float", "float1.5",
                              "bool", "str", "none"])
def test_polygamma_rejects_non_int_n(bad_n):
    x = nb.tensor([0.5, 2.0])
    with pytest.raises(TypeError, match="polygamma"):
        nb.polygamma(bad_n, x)
    with pytest.raises(TypeError, match="polygamma"):
        x.polygamma(bad_n)


def test_polygamma_swapped_arguments_and_negative_n_raise():
    x = nb.tensor([0.5, 2.0])
    with pytest.raises(TypeError, match=r"polygamma\(n, input\)"):
        nb.polygamma(x, 1)  # the old order
    with pytest.raises(RuntimeError, match="polygamma.*negative"):
        nb.polygamma(-1, x)


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_polygamma_gradients_and_jit(mode):
    import scipy.special as sp
    x = nb.tensor([0.5, 2.0, 3.5], requires_grad=True)
    (g,) = nb.autograd.grad(nb.polygamma(1, x).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.numpy(), sp.polygamma(2, x.numpy()), rtol=1e-9)
    (g2,) = nb.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(g2.numpy(), sp.polygamma(3, x.numpy()), rtol=1e-9)
    (gd,) = nb.autograd.grad(nb.digamma(x).sum(), x)
    np.testing.assert_allclose(gd.numpy(), sp.polygamma(1, x.numpy()), rtol=1e-9)
    f = nb.jit(lambda t: nb.polygamma(2, t) * 2.0, mode=mode)
    for _ in range(2):
        np.testing.assert_allclose(f(nb.tensor([0.5, 2.0])).numpy(),
                                   2 * sp.polygamma(2, [0.5, 2.0]), rtol=1e-9)


# ------------------------------------------------------------------ D. clamp with tensor bounds


def _clamp_grads_ref(x, lo, hi):
    """PyTorch's clamp_backward and clamp_backward_min_max for an upstream gradient of 1."""
    xb, lob, hib = np.broadcast_arrays(x, np.nan if lo is None else lo,
                                       np.nan if hi is None else hi)
    if lo is not None and hi is not None:
        gx = (xb >= lob) & (xb <= hib)
        gmin = (xb < lob) & (lob < hib)
        gmax = (xb > hib) | (hib < lob)
    elif lo is not None:
        gx, gmin, gmax = xb >= lob, xb < lob, None
    else:
        gx, gmin, gmax = xb <= hib, None, xb > hib

    def reduce(g, shape):
        if g is None:
            return None
        g = g.astype(float)
        while g.ndim > len(shape):
            g = g.sum(0)
        for d, n in enumerate(shape):
            if n == 1 and g.shape[d] != 1:
                g = g.sum(d, keepdims=True)
        return g
    return (reduce(gx, np.shape(x)), reduce(gmin, np.shape(lo)), reduce(gmax, np.shape(hi)))


_CLAMP_CASES = {
    "both": (np.array([[-2.0, 0.0, 0.5, 3.0], [1.0, -1.0, 2.5, 0.2]]),
             np.array([[-1.0], [0.5]]), np.array([1.0, 2.0, 0.0, 2.0])),
    "min_gt_max": (np.array([-3.0, 0.0, 5.0]), np.array([1.0, 1.0, 1.0]),
                   np.array([0.0, 0.0, 0.0])),
    "ties": (np.array([1.0, 2.0, 0.5]), np.array([1.0, 1.0, 1.0]), np.array([2.0, 2.0, 2.0])),
    "min_only": (np.array([-2.0, 0.0, 3.0]), np.array([0.5, 0.5, 0.5]), None),
    "max_only": (np.array([-2.0, 0.0, 3.0]), None, np.array([0.5])),
    "0d_bounds": (np.array([-2.0, 0.0, 3.0]), np.array(-1.0), np.array(1.0)),
}


@pytest.mark.parametrize("case", list(_CLAMP_CASES))
@pytest.mark.parametrize("fn", ["clamp", "clip", "method"])
def test_clamp_tensor_bounds_get_pytorch_gradients(case, fn):
    x_np, lo_np, hi_np = _CLAMP_CASES[case]
    x = nb.tensor(x_np, requires_grad=True)
    lo = None if lo_np is None else nb.tensor(lo_np, requires_grad=True)
    hi = None if hi_np is None else nb.tensor(hi_np, requires_grad=True)
    if fn == "method":
        y = x.clamp(lo, hi)
    else:
        y = getattr(nb, fn)(x, min=lo, max=hi)
    np.testing.assert_array_equal(y.numpy(), np.clip(x_np, lo_np, hi_np))
    y.sum().backward()
    gx, gmin, gmax = _clamp_grads_ref(x_np, lo_np, hi_np)
    np.testing.assert_array_equal(x.grad.numpy(), gx)
    if lo is not None:
        assert lo.grad is not None, "min got no gradient"
        np.testing.assert_array_equal(lo.grad.numpy(), gmin)
    if hi is not None:
        assert hi.grad is not None, "max got no gradient"
        np.testing.assert_array_equal(hi.grad.numpy(), gmax)


def test_clamp_tensor_bounds_mixed_with_numbers_and_gradcheck():
    x = nb.tensor([-2.0, 0.3, 3.0], requires_grad=True)
    hi = nb.tensor([1.0, 1.0, 2.0], requires_grad=True)
    y = nb.clamp(x, -1.0, hi)
    np.testing.assert_array_equal(y.numpy(), [-1.0, 0.3, 2.0])
    y.sum().backward()
    np.testing.assert_array_equal(hi.grad.numpy(), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 1.0, 0.0])
    rng = np.random.default_rng(0)
    xs = nb.tensor(rng.normal(size=(3, 4)), requires_grad=True)
    los = nb.tensor(rng.normal(size=(3, 1)) - 1.0, requires_grad=True)
    his = nb.tensor(rng.normal(size=(4,)) + 1.0, requires_grad=True)
    assert nb.autograd.gradcheck(lambda a, b, c: nb.clamp(a, b, c), (xs, los, his))
    assert nb.autograd.gradgradcheck(lambda a, b, c: nb.clamp(a, b, c) ** 2, (xs, los, his))


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_clamp_tensor_bounds_under_jit(mode):
    x_np, lo_np, hi_np = _CLAMP_CASES["both"]

    def loss(x, lo, hi):
        return (nb.clamp(x, lo, hi) * 2.0).sum()

    f = nb.jit(lambda x, lo, hi: nb.autograd.grad(loss(x, lo, hi), (x, lo, hi)), mode=mode)
    gx, gmin, gmax = _clamp_grads_ref(x_np, lo_np, hi_np)
    for _ in range(2):
        args = [nb.tensor(a, requires_grad=True) for a in (x_np, lo_np, hi_np)]
        got = f(*args)
        for g, ref in zip(got, (gx, gmin, gmax), strict=True):
            np.testing.assert_array_equal(g.numpy(), 2 * ref)


def test_clamp_tensor_bounds_bad_shapes_and_in_place():
    with pytest.raises(RuntimeError, match=r"clamp.*\(3,\).*\(2,\)"):
        nb.clamp(nb.tensor([1.0, 2.0, 3.0]), nb.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="clamp"):
        nb.clamp(nb.tensor([1.0]))
    t = nb.tensor([-2.0, 0.5, 4.0])
    t.clamp_(nb.tensor([-1.0, -1.0, -1.0]), nb.tensor(1.0))
    np.testing.assert_array_equal(t.numpy(), [-1.0, 0.5, 1.0])


# ------------------------------------------------------------------ E. empty and 0-d inputs


def _t(shape, requires_grad=True):
    n = int(np.prod(shape))
    return nb.tensor(np.arange(n, dtype=float).reshape(shape) + 1.0, requires_grad=requires_grad)


def _sum_backward(out, inputs):
    outs = out if isinstance(out, tuple) else (out,)
    loss = None
    for o in outs:
        if o.requires_grad:
            loss = o.sum() if loss is None else loss + o.sum()
    if loss is not None:
        loss.backward()
    for t in inputs:
        assert t.grad is not None and t.grad.shape == t.shape


_MATMUL_SHAPES = [((0,), (0,), ()), ((0,), (0, 3), (3,)), ((3, 0), (0,), (3,)),
                  ((2, 0), (0, 3), (2, 3)), ((0, 2), (2, 3), (0, 3)), ((2, 3), (3, 0), (2, 0)),
                  ((0, 2, 3), (3, 4), (0, 2, 4)), ((2, 0, 3), (2, 3, 4), (2, 0, 4)),
                  ((2, 3, 0), (2, 0, 4), (2, 3, 4)), ((2, 3), (0, 3, 4), (0, 2, 4)),
                  ((0, 3), (2, 1, 3, 4), (2, 1, 0, 4)), ((3,), (0, 3, 2), (0, 2))]


@pytest.mark.parametrize("a_shape, b_shape, out_shape", _MATMUL_SHAPES,
                         ids=[f"{a}@{b}" for a, b, _ in _MATMUL_SHAPES])
def test_matmul_with_zero_size_dims(a_shape, b_shape, out_shape):
    a, b = _t(a_shape), _t(b_shape)
    y = nb.matmul(a, b)
    assert y.shape == out_shape
    np.testing.assert_array_equal(y.numpy(), np.matmul(a.numpy(), b.numpy()))
    _sum_backward(y, (a, b))
    assert not np.isnan(a.grad.numpy()).any() and not np.isnan(b.grad.numpy()).any()


@pytest.mark.parametrize("a_shape, b_shape", [((), (3,)), ((3,), ()), ((), ()), ((), (2, 2))])
def test_matmul_of_0d_raises_like_pytorch(a_shape, b_shape):
    with pytest.raises(RuntimeError, match=r"matmul.*at least 1D.*" + re.escape(str(a_shape))):
        nb.matmul(_t(a_shape), _t(b_shape))


@pytest.mark.parametrize("shape, det", [((0, 0), 1.0), ((2, 0, 0), [1.0, 1.0]),
                                        ((0, 3, 3), np.zeros(0))])
def test_decompositions_of_empty_matrices(shape, det):
    for name in ("det", "slogdet", "inv", "cholesky"):
        A = _t(shape)
        out = getattr(nb.linalg, name)(A)
        if name == "det":
            np.testing.assert_array_equal(out.numpy(), det)
        elif name == "slogdet":
            np.testing.assert_array_equal(out.sign.numpy(), np.ones_like(det))
            np.testing.assert_array_equal(out.logabsdet.numpy(), np.zeros_like(det))
            out = out.logabsdet
        else:
            assert out.shape == shape
        _sum_backward(out, (A,))
        np.testing.assert_array_equal(A.grad.numpy(), np.zeros(shape))


@pytest.mark.parametrize("a_shape, b_shape, out_shape", [
    ((0, 0), (0, 2), (0, 2)), ((0, 0), (0,), (0,)), ((2, 0, 0), (2, 0, 3), (2, 0, 3)),
    ((3, 3), (3, 0), (3, 0)), ((0, 3, 3), (0, 3, 1), (0, 3, 1)), ((0, 3, 3), (3, 2), (0, 3, 2))])
def test_solvers_with_zero_size_dims(a_shape, b_shape, out_shape):
    eye = np.broadcast_to(np.eye(a_shape[-1]) * 2.0, a_shape).copy()
    for name in ("solve", "solve_triangular"):
        if name == "solve_triangular" and len(b_shape) < 2:
            continue
        A = nb.tensor(eye, requires_grad=True)
        B = _t(b_shape)
        kw = {"upper": False} if name == "solve_triangular" else {}
        X = getattr(nb.linalg, name)(A, B, **kw)
        assert X.shape == out_shape
        np.testing.assert_array_equal(X.numpy(), np.broadcast_to(B.numpy() / 2.0, out_shape))
        _sum_backward(X, (A, B))


_EMPTY_REDUCTIONS = [
    # (name, shape, kwargs, expected value)
    ("sum", (0,), {}, 0.0), ("sum", (2, 0), {"dim": 1}, [0.0, 0.0]),
    ("mean", (0,), {}, np.nan), ("mean", (2, 0), {"dim": 1}, [np.nan, np.nan]),
    ("mean", (2, 0), {"dim": 0}, np.zeros(0)), ("prod", (0,), {}, 1.0),
    ("prod", (2, 0), {"dim": 1}, [1.0, 1.0]), ("var", (0,), {}, np.nan),
    ("std", (2, 0), {"dim": 1}, [np.nan, np.nan]), ("logsumexp", (0,), {"dim": 0}, -np.inf),
    ("logsumexp", (2, 0), {"dim": 1}, [-np.inf, -np.inf]), ("norm", (0,), {}, 0.0),
    ("norm", (2, 0), {"dim": 1}, [0.0, 0.0]), ("amax", (2, 0), {"dim": 0}, np.zeros(0)),
    ("sum", (), {}, 1.0), ("sum", (), {"dim": 0}, 1.0), ("mean", (), {"dim": -1}, 1.0),
    ("prod", (), {}, 1.0), ("var", (), {}, np.nan), ("std", (), {"dim": 0}, np.nan),
    ("logsumexp", (), {"dim": 0}, 1.0), ("norm", (), {}, 1.0), ("amax", (), {"dim": 0}, 1.0),
    ("amin", (), {}, 1.0),
]


def _reduce(name, x, kwargs):
    fn = nb.linalg.norm if name == "norm" and hasattr(nb.linalg, "norm") else getattr(nb, name)
    return fn(x, **kwargs)


@pytest.mark.parametrize("name, shape, kwargs, expected", _EMPTY_REDUCTIONS,
                         ids=[f"{n}{s}{k}" for n, s, k, _ in _EMPTY_REDUCTIONS])
def test_reductions_of_empty_and_0d_inputs(name, shape, kwargs, expected):
    import warnings

    x = _t(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the mean of nothing is NaN without a NumPy warning
        y = _reduce(name, x, kwargs)
    np.testing.assert_array_equal(y.numpy(), expected)
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin", "amax", "amin"])
@pytest.mark.parametrize("shape, kwargs", [((0,), {}), ((0,), {"dim": 0}), ((2, 0), {"dim": 1}),
                                           ((2, 0), {})])
def test_max_like_reductions_of_empty_raise_naming_the_op(name, shape, kwargs):
    with pytest.raises(IndexError, match=rf"{name}:.*zero-size.*{re.escape(str(shape))}"):
        getattr(nb, name)(_t(shape), **kwargs)


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_over_a_nonempty_dim_of_an_empty_tensor_and_its_gradient(name):
    x = _t((2, 0))
    values, indices = getattr(nb, name)(x, dim=0)
    assert values.shape == (0,) and indices.shape == (0,)
    values.sum().backward()
    assert x.grad.shape == (2, 0)
    y = _t(())
    v, i = getattr(nb, name)(y, dim=0)
    assert v.item() == 1.0 and i.item() == 0


@pytest.mark.parametrize("self_shape, dim, index, out", [
    ((2, 0), 1, np.zeros((2, 0), np.int64), np.zeros((2, 0))),
    ((2, 3), 0, np.zeros((0, 3), np.int64), np.zeros((0, 3))),
    ((2, 3), 1, np.zeros((2, 0), np.int64), np.zeros((2, 0))),
    ((), 0, np.array(0), 1.0), ((), 0, np.array([0, 0]), [1.0, 1.0]),
    ((3,), 0, np.array(2), 3.0)])
def test_gather_on_empty_and_0d(self_shape, dim, index, out):
    x = _t(self_shape)
    y = nb.gather(x, dim, nb.tensor(index))
    assert y.shape == np.shape(out)
    np.testing.assert_array_equal(y.numpy(), out)
    y.sum().backward()
    assert x.grad.shape == x.shape
    np.testing.assert_array_equal(x.grad.numpy().sum(), np.size(out))


@pytest.mark.parametrize("x_shape, w_shape", [((3, 0), (5, 0)), ((0,), (5, 0)),
                                              ((0, 2, 3), (5, 3)), ((2, 3), (0, 3))])
def test_linear_with_zero_size_dims(x_shape, w_shape):
    x, w, b = _t(x_shape), _t(w_shape), _t(w_shape[:1])
    y = _nnf().linear(x, w, b)
    expected = np.matmul(x.numpy(), w.numpy().T) + b.numpy()
    np.testing.assert_array_equal(y.numpy(), expected)
    _sum_backward(y, (x, w, b))


def test_embedding_with_zero_width_rows():
    w = _t((4, 0))
    e = _nnf().embedding(nb.tensor([1, 2]), w)
    assert e.shape == (2, 0)
    e.sum().backward()
    assert w.grad.shape == (4, 0)


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_empty_inputs_under_jit(mode):
    def f(a, b):
        return nb.matmul(a, b).sum() + a.sum() * 2.0

    jitted = nb.jit(lambda a, b: nb.autograd.grad(f(a, b), (a, b)), mode=mode)
    for _ in range(2):
        a, b = _t((2, 0, 3)), _t((2, 3, 4))
        ga, gb = jitted(a, b)
        assert ga.shape == (2, 0, 3) and gb.shape == (2, 3, 4)
        np.testing.assert_array_equal(gb.numpy(), np.zeros((2, 3, 4)))


torch_cases = [(n, s, k) for n, s, k, _ in _EMPTY_REDUCTIONS]


@pytest.mark.parametrize("name, shape, kwargs", torch_cases,
                         ids=[f"{n}{s}{k}" for n, s, k in torch_cases])
def test_reductions_of_empty_and_0d_match_torch(name, shape, kwargs):
    torch = pytest.importorskip("torch")
    x = _t(shape)
    tx = torch.tensor(x.numpy())
    tfn = torch.linalg.vector_norm if name == "norm" else getattr(torch, name)
    expected = tfn(tx, **kwargs)
    np.testing.assert_array_equal(_reduce(name, x, kwargs).numpy(), expected.numpy())


@pytest.mark.parametrize("a_shape, b_shape, out_shape", _MATMUL_SHAPES,
                         ids=[f"{a}@{b}" for a, b, _ in _MATMUL_SHAPES])
def test_matmul_with_zero_size_dims_matches_torch(a_shape, b_shape, out_shape):
    torch = pytest.importorskip("torch")
    a, b = _t(a_shape), _t(b_shape)
    expected = torch.matmul(torch.tensor(a.numpy()), torch.tensor(b.numpy()))
    np.testing.assert_array_equal(nb.matmul(a, b).numpy(), expected.numpy())


# ------------------------------------------------------------------ F. out-of-range indices

_W = np.arange(12.0).reshape(4, 3)
_X = np.arange(12.0).reshape(3, 4)
_LOGITS = np.random.default_rng(0).normal(size=(3, 5))


def _nnf():
    import nbgrad.nn.functional as F
    return F


#: op -> (function of (tensor, index), tensor, index maker, too large, too negative, size)
_INDEX_OPS = {
    "embedding": (lambda w, i: _nnf().embedding(i, w), _W, lambda i: np.array([0, i]), 4, -1,
                  "4 rows"),
    "cross_entropy": (lambda x, t: _nnf().cross_entropy(x, t), _LOGITS,
                      lambda i: np.array([0, i, 1]), 5, -1, "5 classes"),
    "nll_loss": (lambda x, t: _nnf().nll_loss(x, t), _LOGITS, lambda i: np.array([0, i, 1]), 5,
                 -2, "5 classes"),
    "gather": (lambda x, i: nb.gather(x, 1, i), _X, lambda i: np.array([[0], [i], [1]]), 4, -1,
               "size 4"),
    "index_select": (lambda x, i: nb.index_select(x, 1, i), _X, lambda i: np.array([0, i]), 4,
                     -1, "size 4"),
    "take": (lambda x, i: nb.take(x, i), _X, lambda i: np.array([0, i]), 12, -13,
             "12 elements"),
}


@pytest.mark.parametrize("which", ["too_large", "too_negative"])
@pytest.mark.parametrize("mode", ["eager", "interpret", "compile"])
@pytest.mark.parametrize("output", ["value", "gradient"])
@pytest.mark.parametrize("name", list(_INDEX_OPS))
def test_out_of_range_index_raises_index_error(name, which, mode, output):
    fn, base, make, large, negative, size = _INDEX_OPS[name]
    bad = large if which == "too_large" else negative

    def f(x, idx):
        y = fn(x, idx) * 2.0
        if output == "value":
            return y
        return nb.autograd.grad(y.sum(), x)[0]

    call = f if mode == "eager" else nb.jit(f, mode=mode)
    good = call(nb.tensor(base, requires_grad=True), nb.tensor(make(1)))
    call(nb.tensor(base, requires_grad=True), nb.tensor(make(1)))  # the compiled path
    assert np.isfinite(good.numpy()).all()
    # the gradient of cross_entropy is nll_loss_backward's
    op = "(nll_loss|cross_entropy)" if name == "cross_entropy" else name
    with pytest.raises(IndexError, match=rf"{op}(_backward)?: (index|target) {bad} .*{size}"):
        call(nb.tensor(base, requires_grad=True), nb.tensor(make(bad)))


@pytest.mark.parametrize("mode", ["eager", "interpret", "compile"])
@pytest.mark.parametrize("name", ["cross_entropy", "nll_loss"])
def test_ignore_index_targets_are_not_out_of_range(name, mode):
    F = _nnf()

    def f(x, t):
        loss = getattr(F, name)(x, t, ignore_index=-100)
        return loss, nb.autograd.grad(loss, x)[0]

    call = f if mode == "eager" else nb.jit(f, mode=mode)
    x = _LOGITS if name == "cross_entropy" else np.log(np.full((3, 5), 0.2))
    for _ in range(2):
        loss, g = call(nb.tensor(x, requires_grad=True), nb.tensor(np.array([0, -100, 1])))
        assert np.isfinite(loss.item())
        np.testing.assert_array_equal(g.numpy()[1], np.zeros(5))
    with pytest.raises(IndexError, match=rf"{name}: target -100"):
        getattr(F, name)(nb.tensor(x), nb.tensor(np.array([0, -100, 1])), ignore_index=-1)


@pytest.mark.parametrize("mode", ["eager", "interpret", "compile"])
def test_take_accepts_negative_indices_in_range(mode):
    def f(x, i):
        return nb.take(x, i) * 1.0

    call = f if mode == "eager" else nb.jit(f, mode=mode)
    for _ in range(2):
        np.testing.assert_array_equal(call(nb.tensor(_X), nb.tensor(np.array([-1, -12]))).numpy(),
                                      [11.0, 0.0])


@pytest.mark.parametrize("name", ["scatter", "scatter_add"])
def test_scatter_kernels_check_index_range_too(name):
    from nbgrad.ops.registry import get

    kernel = get(name).kernels["cpu"]
    with pytest.raises(IndexError, match=rf"{name}: index 4 .*size 4"):
        kernel(np.zeros((3, 4)), 1, np.array([[4], [0], [0]]), np.ones((3, 1)))
