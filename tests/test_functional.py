"""The JAX-style transforms: grad, value_and_grad, vjp, jvp, jacobian, hessian, hvp.

Checked against closed-form derivatives, central finite differences and, where JAX
is installed, JAX itself (float64).
"""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb

RNG = np.random.default_rng(7)


def _np(t) -> np.ndarray:
    return np.asarray(t.numpy() if isinstance(t, nb.Tensor) else t, dtype=np.float64)


def _fd_jacobian(fn, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d fn(x) / d x by central differences, shaped out.shape + x.shape."""
    x = np.array(x, dtype=np.float64)
    out0 = _np(fn(x.copy()))
    jac = np.zeros(out0.shape + x.shape)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        jac[(Ellipsis, *idx)] = (_np(fn(xp)) - _np(fn(xm))) / (2 * eps)
    return jac


def f_scalar(x):
    return nb.sum(nb.sin(x) * x + nb.exp(0.3 * x) ** 2)


def f_scalar_grad_exact(x):
    return np.cos(x) * x + np.sin(x) + 0.6 * np.exp(0.6 * x)


def f_scalar_hess_diag_exact(x):
    return -np.sin(x) * x + 2 * np.cos(x) + 0.36 * np.exp(0.6 * x)


def f_vector(x, w):
    """R^3 x R^(2x3) -> R^2: tanh(w @ x) * sum(x^2)."""
    return nb.tanh(w @ x) * nb.sum(x * x)


# ------------------------------------------------------------------ grad / value_and_grad
def test_grad_matches_closed_form():
    x = RNG.standard_normal(5)
    g = nb.grad(f_scalar)(nb.tensor(x))
    assert isinstance(g, nb.Tensor) and g.shape == (5,)
    np.testing.assert_allclose(g.numpy(), f_scalar_grad_exact(x), rtol=1e-12)


def test_grad_accepts_numpy_and_python_floats():
    x = RNG.standard_normal(4)
    g_np = nb.grad(f_scalar)(x)
    assert g_np.dtype == np.float64
    np.testing.assert_allclose(g_np.numpy(), f_scalar_grad_exact(x), rtol=1e-12)
    g_float = nb.grad(lambda s: nb.sin(s) * s)(0.7)
    assert g_float.shape == () and g_float.dtype == np.float64
    assert g_float.item() == pytest.approx(np.cos(0.7) * 0.7 + np.sin(0.7), rel=1e-13)


def test_grad_keeps_float32():
    x = RNG.standard_normal(3).astype(np.float32)
    g = nb.grad(lambda t: nb.sum(t * t))(x)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g.numpy(), 2 * x, rtol=1e-6)


def test_grad_argnums_tuple_and_negative():
    x, y = RNG.standard_normal(3), RNG.standard_normal(3)

    def f(a, b):
        return nb.sum(a * a * b)

    ga, gb = nb.grad(f, argnums=(0, 1))(x, y)
    np.testing.assert_allclose(ga.numpy(), 2 * x * y, rtol=1e-13)
    np.testing.assert_allclose(gb.numpy(), x * x, rtol=1e-13)
    np.testing.assert_allclose(nb.grad(f, argnums=-1)(x, y).numpy(), x * x, rtol=1e-13)
    only_b = nb.grad(f, argnums=(1,))(x, y)
    assert isinstance(only_b, tuple) and len(only_b) == 1


def test_value_and_grad_and_has_aux():
    x = RNG.standard_normal(4)

    def f(t):
        y = nb.sin(t)
        return nb.sum(y * y), {"y": y, "note": "aux"}

    (value, aux), g = nb.value_and_grad(f, has_aux=True)(x)
    assert value.item() == pytest.approx(np.sum(np.sin(x) ** 2), rel=1e-13)
    np.testing.assert_allclose(g.numpy(), 2 * np.sin(x) * np.cos(x), rtol=1e-12)
    np.testing.assert_allclose(aux["y"].numpy(), np.sin(x))
    assert aux["note"] == "aux"
    assert not aux["y"].requires_grad and not value.requires_grad
    g2, aux2 = nb.grad(f, has_aux=True)(x)
    np.testing.assert_allclose(g2.numpy(), g.numpy())
    assert aux2["note"] == "aux"


def test_grad_of_unused_argument_is_zero():
    g = nb.grad(lambda a, b: nb.sum(a * 2.0), argnums=1)(np.ones(2), np.ones(3))
    np.testing.assert_array_equal(g.numpy(), np.zeros(3))
    g_const = nb.grad(lambda a: nb.tensor(3.0))(np.ones(2))
    np.testing.assert_array_equal(g_const.numpy(), np.zeros(2))


def test_grad_pytree_arguments():
    params = {"w": RNG.standard_normal((2, 3)), "b": [RNG.standard_normal(2)]}
    x = RNG.standard_normal(3)

    def loss(p, x):
        return nb.sum(nb.tanh(p["w"] @ x + p["b"][0]) ** 2)

    g = nb.grad(loss)(params, x)
    assert set(g) == {"w", "b"} and isinstance(g["b"], list)
    z = params["w"] @ x + params["b"][0]
    dz = 2 * np.tanh(z) * (1 - np.tanh(z) ** 2)
    np.testing.assert_allclose(g["w"].numpy(), np.outer(dz, x), rtol=1e-12)
    np.testing.assert_allclose(g["b"][0].numpy(), dz, rtol=1e-12)


def test_grad_errors():
    with pytest.raises(TypeError, match=r"scalar output.*shape \(3,\)"):
        nb.grad(lambda t: t * 2.0)(np.ones(3))
    with pytest.raises(TypeError, match="int"):
        nb.grad(lambda t: t * 2.0)(3)
    with pytest.raises(TypeError, match="int64"):
        nb.grad(lambda t: nb.sum(t))(np.arange(3))
    with pytest.raises(ValueError, match="argnums=2"):
        nb.grad(lambda a, b: nb.sum(a), argnums=2)(1.0, 2.0)
    with pytest.raises(TypeError, match="argnums"):
        nb.grad(lambda a: a, argnums="0")
    with pytest.raises(TypeError, match="pair"):
        nb.grad(lambda a: a * 1.0, has_aux=True)(1.0)


def test_grad_is_distinct_from_autograd_grad():
    assert nb.grad is not nb.autograd.grad
    x = nb.tensor([1.0, 2.0], requires_grad=True)
    (g,) = nb.autograd.grad(nb.sum(x * x), x)
    np.testing.assert_allclose(g.numpy(), [2.0, 4.0])


# ------------------------------------------------------------------ nesting
def test_grad_of_grad_and_third_order():
    x = 0.9
    d2 = nb.grad(nb.grad(lambda s: s ** 3 * nb.sin(s)))(x)
    want2 = 6 * x * np.sin(x) + 6 * x ** 2 * np.cos(x) - x ** 3 * np.sin(x)
    assert d2.item() == pytest.approx(want2, rel=1e-12)
    d3 = nb.grad(nb.grad(nb.grad(lambda s: nb.exp(2.0 * s))))(x)
    assert d3.item() == pytest.approx(8 * np.exp(2 * x), rel=1e-12)


def test_nested_closure_has_no_perturbation_confusion():
    # d/dx [x * d/dy (x * y)] = d/dx [x * x] = 2x
    def outer(x):
        return x * nb.grad(lambda y: x * y)(3.0)

    assert nb.grad(outer)(1.5).item() == pytest.approx(3.0, rel=1e-13)
    # d/dx [d/dy (x + y)] = 0: the inner derivative does not depend on x
    assert nb.grad(lambda x: nb.grad(lambda y: x + y)(1.0) * 1.0)(2.0).item() == 0.0


def test_top_level_results_keep_no_graph():
    x = RNG.standard_normal(3)
    g = nb.grad(f_scalar)(x)
    assert not g.requires_grad and g.grad_fn is None
    value, g2 = nb.value_and_grad(f_scalar)(nb.tensor(x))
    assert not value.requires_grad and not g2.requires_grad
    jac = nb.jacobian(lambda t: nb.sin(t))(x)
    assert not jac.requires_grad


def test_grad_result_is_differentiable_by_the_tape():
    x = nb.tensor(RNG.standard_normal(3), requires_grad=True)
    g = nb.grad(f_scalar)(x)
    assert g.requires_grad
    nb.sum(g).backward()
    np.testing.assert_allclose(x.grad.numpy(), f_scalar_hess_diag_exact(x.numpy()),
                               rtol=1e-12)


def test_no_grad_outside_still_computes_and_detaches():
    x = nb.tensor(RNG.standard_normal(3), requires_grad=True)
    with nb.no_grad():
        g = nb.grad(f_scalar)(x)
    assert not g.requires_grad
    np.testing.assert_allclose(g.numpy(), f_scalar_grad_exact(x.numpy()), rtol=1e-12)


def test_custom_function_inside_grad():
    class Cube(nb.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3.0 * x * x

    x = RNG.standard_normal(4)
    g = nb.grad(lambda t: nb.sum(Cube.apply(t)))(x)
    np.testing.assert_allclose(g.numpy(), 3 * x ** 2, rtol=1e-13)
    h = nb.grad(lambda t: nb.sum(nb.grad(lambda u: nb.sum(Cube.apply(u)))(t)))(x)
    np.testing.assert_allclose(h.numpy(), 6 * x, rtol=1e-13)


# ------------------------------------------------------------------ jacobian / hessian
def test_jacobian_shapes_and_values():
    w = RNG.standard_normal((2, 3))
    x = RNG.standard_normal(3)
    jx = nb.jacobian(f_vector)(x, w)
    assert jx.shape == (2, 3)
    np.testing.assert_allclose(jx.numpy(), _fd_jacobian(lambda v: f_vector(nb.tensor(v), w), x),
                               rtol=1e-6, atol=1e-8)
    jx2, jw = nb.jacobian(f_vector, argnums=(0, 1))(x, w)
    assert jw.shape == (2, 2, 3)
    np.testing.assert_allclose(jx2.numpy(), jx.numpy())
    np.testing.assert_allclose(jw.numpy(), _fd_jacobian(lambda m: f_vector(x, nb.tensor(m)), w),
                               rtol=1e-6, atol=1e-8)


def test_jacobian_of_matrix_function_and_tuple_outputs():
    a = RNG.standard_normal((2, 3))

    def f(m):
        return nb.exp(m), nb.sum(m * m)

    j_exp, j_sum = nb.jacobian(f)(a)
    assert j_exp.shape == (2, 3, 2, 3) and j_sum.shape == (2, 3)
    np.testing.assert_allclose(j_exp.numpy().reshape(6, 6), np.diag(np.exp(a).ravel()),
                               rtol=1e-13)
    np.testing.assert_allclose(j_sum.numpy(), 2 * a, rtol=1e-13)


def test_hessian_equals_jacobian_of_grad():
    x = RNG.standard_normal(4)
    h = nb.hessian(f_scalar)(x)
    assert h.shape == (4, 4)
    np.testing.assert_allclose(h.numpy(), np.diag(f_scalar_hess_diag_exact(x)), rtol=1e-11,
                               atol=1e-13)
    np.testing.assert_allclose(nb.jacobian(nb.grad(f_scalar))(x).numpy(), h.numpy(),
                               rtol=1e-13, atol=1e-14)


def test_hessian_argnums_tuple_nested():
    x, y = RNG.standard_normal(2), RNG.standard_normal(3)

    def f(a, b):
        return nb.sum(a) ** 2 * nb.sum(nb.sin(b))

    (hxx, hxy), (hyx, hyy) = nb.hessian(f, argnums=(0, 1))(x, y)
    assert (hxx.shape, hxy.shape, hyx.shape, hyy.shape) == ((2, 2), (2, 3), (3, 2), (3, 3))
    sa, sb = np.sum(x), np.sum(np.sin(y))
    np.testing.assert_allclose(hxx.numpy(), np.full((2, 2), 2 * sb), rtol=1e-12)
    np.testing.assert_allclose(hxy.numpy(), np.tile(2 * sa * np.cos(y), (2, 1)), rtol=1e-12)
    np.testing.assert_allclose(hyx.numpy(), hxy.numpy().T, rtol=1e-12)
    np.testing.assert_allclose(hyy.numpy(), np.diag(-sa ** 2 * np.sin(y)), rtol=1e-12,
                               atol=1e-15)


def test_hessian_of_vector_function_has_out_in_in_shape():
    x = RNG.standard_normal(3)
    h = nb.hessian(lambda t: t * nb.sum(t * t))(x)
    assert h.shape == (3, 3, 3)
    # d2/dxj dxk [x_i * |x|^2] = 2 (d_ij x_k + d_ik x_j + d_jk x_i)
    eye = np.eye(3)
    want = 2 * (np.einsum("ij,k->ijk", eye, x) + np.einsum("ik,j->ijk", eye, x)
                + np.einsum("jk,i->ijk", eye, x))
    np.testing.assert_allclose(h.numpy(), want, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ vjp / jvp / hvp
def test_vjp_matches_jacobian_transpose_and_is_reusable():
    w = RNG.standard_normal((2, 3))
    x = RNG.standard_normal(3)
    out, vjp_fn = nb.vjp(f_vector, x, w)
    np.testing.assert_allclose(out.numpy(), f_vector(nb.tensor(x), nb.tensor(w)).numpy())
    jx, jw = nb.jacobian(f_vector, argnums=(0, 1))(x, w)
    for _ in range(2):
        v = RNG.standard_normal(2)
        gx, gw = vjp_fn(v)
        np.testing.assert_allclose(gx.numpy(), v @ jx.numpy(), rtol=1e-12)
        np.testing.assert_allclose(gw.numpy(), np.tensordot(v, jw.numpy(), 1), rtol=1e-12)
    with pytest.raises(ValueError, match="shape"):
        vjp_fn(np.ones(3))


def test_vjp_has_aux_and_tuple_outputs():
    x = RNG.standard_normal(3)
    (a, b), vjp_fn, aux = nb.vjp(lambda t: ((nb.sin(t), nb.sum(t)), "aux"), x, has_aux=True)
    assert aux == "aux"
    (g,) = vjp_fn((np.ones(3), 2.0))
    np.testing.assert_allclose(g.numpy(), np.cos(x) + 2.0, rtol=1e-13)


def test_jvp_matches_jacobian_product():
    w = RNG.standard_normal((2, 3))
    x, tx, tw = RNG.standard_normal(3), RNG.standard_normal(3), RNG.standard_normal((2, 3))
    out, t_out = nb.jvp(f_vector, (x, w), (tx, tw))
    jx, jw = nb.jacobian(f_vector, argnums=(0, 1))(x, w)
    want = jx.numpy() @ tx + np.tensordot(jw.numpy(), tw, 2)
    np.testing.assert_allclose(t_out.numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(out.numpy(), f_vector(nb.tensor(x), nb.tensor(w)).numpy())
    assert not t_out.requires_grad


def test_jvp_piecewise_and_constant_outputs():
    x = np.array([-1.0, 2.0, -3.0])
    t = np.array([1.0, 1.0, 1.0])
    (r, c), (tr, tc) = nb.jvp(lambda v: (nb.relu(v) + nb.sign(v), nb.tensor(2.0)), (x,), (t,))
    np.testing.assert_array_equal(tr.numpy(), [0.0, 1.0, 0.0])
    assert tc.item() == 0.0 and c.item() == 2.0


def test_jvp_errors():
    with pytest.raises(TypeError, match="tuple or a list"):
        nb.jvp(nb.sin, np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        nb.jvp(nb.sin, (np.ones(2),), (np.ones(3),))


def test_hvp_matches_hessian_product():
    x, v = RNG.standard_normal(4), RNG.standard_normal(4)
    out, hv = nb.hvp(f_scalar, (x,), (v,))
    assert isinstance(hv, tuple) and len(hv) == 1
    np.testing.assert_allclose(hv[0].numpy(), f_scalar_hess_diag_exact(x) * v, rtol=1e-12)
    assert out.item() == pytest.approx(f_scalar(nb.tensor(x)).item(), rel=1e-14)
    _, hv_single = nb.hvp(f_scalar, x, v)
    np.testing.assert_allclose(hv_single.numpy(), hv[0].numpy())


def test_vjp_of_grad_is_hvp_and_jvp_of_grad_too():
    x, v = RNG.standard_normal(3), RNG.standard_normal(3)
    _, vjp_fn = nb.vjp(nb.grad(f_scalar), x)
    (hv,) = vjp_fn(v)
    _, jv = nb.jvp(nb.grad(f_scalar), (x,), (v,))
    want = f_scalar_hess_diag_exact(x) * v
    np.testing.assert_allclose(hv.numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(jv.numpy(), want, rtol=1e-12)


def test_grad_through_jvp():
    # d/dx <J(x) t, 1> for f = sin: sum(cos(x) * t) -> -sin(x) * t
    t = RNG.standard_normal(3)
    x = RNG.standard_normal(3)
    g = nb.grad(lambda v: nb.sum(nb.jvp(nb.sin, (v,), (t,))[1]))(x)
    np.testing.assert_allclose(g.numpy(), -np.sin(x) * t, rtol=1e-12)


def test_grad_matches_finite_differences_on_a_network():
    w1, w2 = RNG.standard_normal((4, 3)), RNG.standard_normal((1, 4))
    x = RNG.standard_normal((5, 3))

    def loss(a, b):
        h = nb.tanh(nb.tensor(x) @ a.T)
        return nb.mean(nb.log1p(nb.exp(h @ b.T)))

    ga, gb = nb.grad(loss, argnums=(0, 1))(w1, w2)
    np.testing.assert_allclose(ga.numpy(), _fd_jacobian(lambda a: loss(nb.tensor(a), w2), w1),
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(gb.numpy(), _fd_jacobian(lambda b: loss(w1, nb.tensor(b)), w2),
                               rtol=1e-6, atol=1e-9)


# ------------------------------------------------------------------ against JAX
@pytest.fixture(scope="module")
def jax_modules():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    with jax.disable_jit():  # op by op: far less compile time for these tiny functions
        yield jax, jnp


def _pair(lib):
    """The same function written once for nbgrad and once for jax.numpy."""
    def f(x, w):
        return lib.tanh(w @ x) * lib.sum(x * x) + lib.sin(x[:2])
    return f


def test_against_jax(jax_modules):
    jax, jnp = jax_modules

    class NB:
        tanh, sin, sum = nb.tanh, nb.sin, nb.sum

    f_nb, f_jax = _pair(NB), _pair(jnp)
    x, w = RNG.standard_normal(3), RNG.standard_normal((2, 3))
    tx, tw = RNG.standard_normal(3), RNG.standard_normal((2, 3))

    def close(ours, theirs):
        np.testing.assert_allclose(_np(ours), np.asarray(theirs), rtol=1e-12, atol=1e-14)

    for ours, theirs in zip(nb.jacobian(f_nb, argnums=(0, 1))(x, w),
                            jax.jacrev(f_jax, argnums=(0, 1))(x, w), strict=True):
        close(ours, theirs)
    out, t_out = nb.jvp(f_nb, (x, w), (tx, tw))
    jout, jt_out = jax.jvp(f_jax, (x, w), (tx, tw))
    close(out, jout)
    close(t_out, jt_out)
    v = RNG.standard_normal(2)
    for ours, theirs in zip(nb.vjp(f_nb, x, w)[1](v), jax.vjp(f_jax, x, w)[1](v), strict=True):
        close(ours, theirs)

    def scalar_nb(x, w):
        return nb.sum(f_nb(x, w) ** 2)

    def scalar_jax(x, w):
        return jnp.sum(f_jax(x, w) ** 2)

    for ours, theirs in zip(nb.grad(scalar_nb, argnums=(0, 1))(x, w),
                            jax.grad(scalar_jax, argnums=(0, 1))(x, w), strict=True):
        close(ours, theirs)
    # Hessian blocks against JAX's forward-over-reverse products in two random directions
    # (cheaper than jax.hessian, which takes seconds to trace on this machine)
    h_ours = nb.hessian(scalar_nb, argnums=(0, 1))(x, w)
    hb = [[_np(h_ours[i][j]) for j in range(2)] for i in range(2)]
    for _ in range(2):
        tx, tw = RNG.standard_normal(3), RNG.standard_normal((2, 3))
        jx, jw = jax.jvp(jax.grad(scalar_jax, argnums=(0, 1)), (x, w), (tx, tw))[1]
        np.testing.assert_allclose(hb[0][0] @ tx + np.tensordot(hb[0][1], tw, 2), jx,
                                   rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(np.tensordot(hb[1][0], tx, 1)
                                   + np.tensordot(hb[1][1], tw, 2), jw, rtol=1e-11, atol=1e-13)
    hv = nb.hvp(lambda a: scalar_nb(a, w), (x,), (tx,))[1][0]
    close(hv, jax.jvp(jax.grad(lambda a: scalar_jax(a, w)), (x,), (tx,))[1])


def test_hessian_and_jvp_with_aux_and_dict_outputs():
    x = np.array([1.0, 2.0])
    h, aux = nb.hessian(lambda t: (nb.sum(t ** 3), t * 2.0), has_aux=True)(x)
    np.testing.assert_allclose(h.numpy(), np.diag(6 * x))
    np.testing.assert_allclose(aux.numpy(), 2 * x)
    assert not aux.requires_grad
    out, t_out, note = nb.jvp(lambda t: (nb.sin(t), "note"), (x,), (np.ones(2),), has_aux=True)
    np.testing.assert_allclose(t_out.numpy(), np.cos(x), rtol=1e-14)
    assert note == "note"
    jac = nb.jacobian(lambda t: {"a": t * 2.0, "b": nb.sum(t)})(x)
    np.testing.assert_allclose(jac["a"].numpy(), 2 * np.eye(2))
    np.testing.assert_allclose(jac["b"].numpy(), np.ones(2))
