"""Arguments users pass today (issue 14 item 1): PyTorch's and NumPy's spellings."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd.gradcheck import gradcheck
from nbgrad.ops.registry import REGISTRY


@pytest.fixture
def x():
    return nb.tensor(np.array([[1.25, -2.5, 3.75], [7.0, -7.0, 0.5]]), requires_grad=True)


def _np(t):
    return t.detach().numpy() if isinstance(t, nb.Tensor) else np.asarray(t)


def test_div_rounding_modes(x):
    y = nb.tensor(np.array([[2.0, 2.0, -2.0], [2.0, 3.0, 0.25]]))
    np.testing.assert_array_equal(_np(nb.div(x, y, rounding_mode="trunc")),
                                  np.trunc(_np(x) / _np(y)))
    np.testing.assert_array_equal(_np(nb.div(x, y, rounding_mode="floor")),
                                  np.floor(_np(x) / _np(y)))
    np.testing.assert_array_equal(_np(nb.div(x, y)), _np(x) / _np(y))
    a, b = nb.tensor(np.array([7, -7, 5])), nb.tensor(np.array([2, 2, -3]))
    trunc, floor = nb.div(a, b, rounding_mode="trunc"), nb.div(a, b, rounding_mode="floor")
    assert trunc.dtype == floor.dtype == nb.int64  # integers stay integers, as torch
    np.testing.assert_array_equal(trunc.numpy(), [3, -3, -1])
    np.testing.assert_array_equal(floor.numpy(), [3, -4, -2])
    nb.div(x, y, rounding_mode="floor").sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 0.0)  # as torch: piecewise constant
    with pytest.raises(ValueError, match="rounding_mode"):
        nb.div(x, y, rounding_mode="round")


def test_add_and_sub_take_alpha(x):
    y = nb.tensor(np.ones((2, 3)), requires_grad=True)
    np.testing.assert_allclose(_np(nb.add(x, y, alpha=2)), _np(x) + 2)
    np.testing.assert_allclose(_np(nb.sub(x, y, alpha=0.5)), _np(x) - 0.5)
    np.testing.assert_allclose(_np(nb.add(x, 3.0, alpha=2)), _np(x) + 6)
    assert gradcheck(lambda a, b: nb.sub(a * a, b, alpha=-3.0), (x, y))
    with pytest.raises(TypeError, match="alpha"):
        nb.add(x, y, alpha="2")


def test_round_takes_decimals(x):
    v = nb.tensor(np.array([1.2345, -2.675, 15.0, 0.125]))
    for d in (0, 1, 2, -1):
        np.testing.assert_array_equal(_np(nb.round(v, decimals=d)), np.round(_np(v), d))
    with pytest.raises(TypeError, match="decimals"):
        nb.round(v, decimals=1.5)


@pytest.mark.parametrize("fn, extra", [
    (nb.sum, {}), (nb.mean, {}), (nb.amax, {}), (nb.amin, {}), (nb.prod, {}),
    (nb.logsumexp, {}), (nb.var, {}), (nb.std, {}), (nb.norm, {}), (nb.argmax, {}),
    (nb.argmin, {})])
def test_reductions_take_numpy_spellings(x, fn, extra):
    want = fn(x, dim=1, keepdim=True, **extra)
    got = fn(x, axis=1, keepdims=True, **extra)
    np.testing.assert_array_equal(_np(got), _np(want))
    assert got.shape[1] == 1


def _functions_with(param: str) -> list[str]:
    names = []
    for name, op in sorted(REGISTRY.items()):
        fn = getattr(nb, name, None)
        if op.fn is not None and fn is not None and param in inspect.signature(op.fn).parameters:
            names.append(name)
    return names


@pytest.mark.parametrize("name", _functions_with("keepdim"))
def test_every_keepdim_takes_keepdims(name):
    """Every public op with torch's ``keepdim`` also takes NumPy's ``keepdims`` and
    ``axis`` (the generator of this class: each such op is checked, not a list)."""
    fn = getattr(nb, name)
    t = nb.tensor(np.random.default_rng(0).random((2, 3)) + 0.5)
    try:
        want = fn(t, dim=1, keepdim=True)
    except Exception as exc:  # noqa: BLE001 - needs other arguments: the spelling must
        with pytest.raises(type(exc)):  # then fail the same way
            fn(t, axis=1, keepdims=True)
        return
    got = fn(t, axis=1, keepdims=True)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,), strict=True):
        np.testing.assert_array_equal(_np(g), _np(w))


def test_both_spellings_at_once_raise(x):
    with pytest.raises(TypeError, match="both 'keepdim' and its other spelling 'keepdims'"):
        nb.sum(x, 1, keepdim=True, keepdims=False)


def test_shape_ops_take_dims_and_axis(x):
    np.testing.assert_array_equal(_np(nb.flip(x, dims=(0,))), _np(x)[::-1])
    np.testing.assert_array_equal(_np(nb.flip(x, dims=[0, 1])), _np(x)[::-1, ::-1])
    np.testing.assert_array_equal(_np(nb.flip(x, axis=1)), _np(x)[:, ::-1])
    one = nb.tensor(np.ones((1, 3)))
    assert nb.squeeze(one, axis=0).shape == (3,)
    assert nb.unsqueeze(x, axis=0).shape == (1, 2, 3)
    assert nb.softmax(x, axis=1).shape == (2, 3)


def test_var_std_take_correction_and_unbiased(x):
    a = _np(x)
    np.testing.assert_allclose(_np(nb.var(x, correction=0)), a.var())
    np.testing.assert_allclose(_np(nb.var(x, 1, correction=2)), a.var(1, ddof=2))
    np.testing.assert_allclose(_np(nb.std(x, unbiased=False)), a.std())
    np.testing.assert_allclose(_np(nb.std(x, unbiased=True)), a.std(ddof=1))


def test_like_factories_take_dtype_and_device(x):
    for like in (nb.zeros_like, nb.ones_like, nb.empty_like):
        t = like(x, dtype=nb.float32, device="cpu")
        assert t.dtype == nb.float32 and t.shape == x.shape and t.device.type == "cpu"
    t = nb.full_like(x, 7, dtype=nb.int64, device="cpu")
    assert t.dtype == nb.int64 and (t.numpy() == 7).all()


def test_to_with_copy(x):
    same = x.to(nb.float64)
    assert same is x
    copy = x.to(nb.float64, copy=True)
    assert copy is not x and not np.shares_memory(copy.numpy(), x.numpy())
    copy.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 1.0)  # the copy stays in the graph
    assert x.to("cpu", non_blocking=True) is x


def test_tensor_dtype_methods(x):
    assert x.bool().dtype == nb.bool_ and x.float().dtype == nb.float32
    assert x.double().dtype == nb.float64 and x.long().dtype == nb.int64
    assert x.int().dtype == nb.int32
    np.testing.assert_array_equal(x.int().numpy(), _np(x).astype(np.int32))


def test_reflected_logical_operators():
    m = nb.tensor(np.array([True, False, True]))
    np.testing.assert_array_equal((True | m).numpy(), [True, True, True])
    np.testing.assert_array_equal((False | m).numpy(), m.numpy())
    np.testing.assert_array_equal((True & m).numpy(), m.numpy())
    np.testing.assert_array_equal((True ^ m).numpy(), ~m.numpy())


def test_masked_fill_broadcasts_self_to_the_mask():
    x = nb.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    mask = nb.tensor(np.array([[True, False, False], [False, False, True]]))
    y = nb.masked_fill(x, mask, 0.0)
    np.testing.assert_array_equal(y.numpy(), [[0, 2, 3], [1, 2, 0]])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1, 2, 1])
    with pytest.raises(RuntimeError, match="do not broadcast"):
        nb.masked_fill(x, nb.tensor(np.ones(4, bool)), 0.0)


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_negative_pad_widths_crop_in_every_mode(mode):
    pad = nb.nn.functional.pad
    a = np.arange(12.0).reshape(3, 4)
    t = nb.tensor(a, requires_grad=True)
    y = pad(t, (-1, 2, 1, -1), mode=mode)
    np_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
               "circular": "wrap"}[mode]
    want = np.pad(a[:2, 1:], ((1, 0), (0, 2)), mode=np_mode)  # crop, then pad
    np.testing.assert_array_equal(y.numpy(), want)
    assert gradcheck(lambda u: pad(u, (-1, 2, 1, -1), mode=mode) ** 2, (t,))
    np.testing.assert_array_equal(pad(t, (-1, -1), mode=mode).numpy(), a[:, 1:3])


def test_gather_on_0d_input():
    t = nb.tensor(np.array(3.0), requires_grad=True)
    out = nb.gather(t, 0, nb.tensor(np.array(0)))
    assert out.shape == () and float(out) == 3.0


def test_view_of_any_stride_compatible_tensor():
    base = nb.tensor(np.arange(24.0).reshape(2, 3, 4), requires_grad=True)
    sliced = base[:, 1:, :]                       # not contiguous, but rows stay whole
    v = sliced.view(2, 2 * 4)
    np.testing.assert_array_equal(v.numpy(), sliced.numpy().reshape(2, 8))
    assert np.shares_memory(v.numpy(), base.numpy())  # a view, as PyTorch
    v.sum().backward()
    assert base.grad.numpy()[:, 1:].sum() == 16 and base.grad.numpy()[:, :1].sum() == 0
    with pytest.raises(RuntimeError, match="not compatible with the strides.*reshape"):
        base.transpose(0, 2).view(24)
    with pytest.raises(RuntimeError, match="invalid for a tensor"):
        sliced.view(5)


def test_linspace_in_the_requested_dtype():
    for dt in (nb.float32, nb.float64):
        t = nb.linspace(0, 1, 5, dtype=dt)
        assert t.dtype == dt
        np.testing.assert_allclose(t.numpy(), np.linspace(0, 1, 5))


def test_solve_triangular_vector_rhs_and_lower():
    rng = np.random.default_rng(1)
    L = np.tril(rng.random((4, 4))) + 4 * np.eye(4)
    b = rng.random(4)
    A = nb.tensor(L, requires_grad=True)
    B = nb.tensor(b, requires_grad=True)
    x = nb.linalg.solve_triangular(A, B, lower=True)
    assert x.shape == (4,)
    np.testing.assert_allclose(x.numpy(), np.linalg.solve(L, b), rtol=1e-12)
    np.testing.assert_allclose(nb.linalg.solve_triangular(A, B, upper=False).numpy(),
                               x.numpy())
    np.testing.assert_allclose(  # SciPy's lower=False is upper
        nb.linalg.solve_triangular(A.T, B, lower=False).numpy(), np.linalg.solve(L.T, b),
        rtol=1e-12)
    right = nb.linalg.solve_triangular(A, B, lower=True, left=False)  # x @ A = b
    np.testing.assert_allclose(right.numpy() @ L, b, rtol=1e-12)
    assert gradcheck(lambda a, v: nb.linalg.solve_triangular(a, v, lower=True), (A, B))
    with pytest.raises(TypeError, match="exactly one of upper"):
        nb.linalg.solve_triangular(A, B)
    with pytest.raises(TypeError, match="exactly one of upper"):
        nb.linalg.solve_triangular(A, B, upper=True, lower=True)


def test_arguments_under_jit(x):
    y = nb.tensor(np.full((2, 3), 2.0))

    def f(a, b):
        return (nb.add(a, b, alpha=2) * nb.div(a, b, rounding_mode="floor")
                + nb.sum(a, axis=1, keepdims=True) + nb.round(a, decimals=1)).sum()
    for mode in ("interpret", "compile"):
        np.testing.assert_allclose(float(nb.jit(f, mode=mode)(x, y)), float(f(x, y)))
        g = nb.grad(nb.jit(f, mode=mode))(x, y)
        np.testing.assert_allclose(g.numpy(), nb.grad(f)(x, y).numpy())
