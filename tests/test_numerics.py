"""Numerically careful kernels and PyTorch's choices at ties and boundaries.

Large inputs (|x| ~ 1e3) must neither overflow nor lose the result in logsumexp,
log_softmax, cross_entropy, binary_cross_entropy_with_logits and softplus; the
gradients of abs, relu, max, clamp (and friends) at ties and boundaries, and of sqrt
and norm at zero, are the values PyTorch documents and returns.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.nn.functional as F


def _grad(fn, x):
    x = nb.tensor(np.asarray(x, dtype=np.float64), requires_grad=True)
    fn(x).sum().backward()
    return x.grad.numpy()


# ------------------------------------------------------------------ magnitude 1e3
@pytest.mark.parametrize("dtype", [nb.float32, nb.float64])
def test_logsumexp_is_stable_at_1e3(dtype):
    x = nb.tensor([[1000.0, 1000.0, -1000.0], [-1000.0, -1000.0, -1000.0]], dtype=dtype,
                  requires_grad=True)
    out = nb.logsumexp(x, 1)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.numpy(), [1000 + math.log(2), -1000 + math.log(3)],
                               rtol=1e-6)
    out.sum().backward()
    # float32 keeps the result to one unit in the last place of 1000 (6e-5)
    rtol = 1e-4 if dtype == nb.float32 else 1e-12
    np.testing.assert_allclose(x.grad.numpy(), [[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]],
                               rtol=rtol, atol=1e-30)


@pytest.mark.parametrize("dtype", [nb.float32, nb.float64])
def test_log_softmax_and_softmax_are_stable_at_1e3(dtype):
    x = nb.tensor([[1000.0, 0.0, -1000.0], [1000.0, 999.0, 1000.0]], dtype=dtype,
                  requires_grad=True)
    logp = F.log_softmax(x, 1)
    assert np.isfinite(logp.numpy()).all()
    np.testing.assert_allclose(logp.numpy()[0], [0.0, -1000.0, -2000.0], rtol=1e-6)
    p = F.softmax(x, 1).numpy()
    np.testing.assert_allclose(p.sum(1), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(p[1, 0], p[1, 2])
    logp[:, 1].sum().backward()
    assert np.isfinite(x.grad.numpy()).all()
    np.testing.assert_allclose(x.grad.numpy()[0], [-1.0, 1.0, 0.0], atol=1e-6)


@pytest.mark.parametrize("dtype", [nb.float32, nb.float64])
def test_cross_entropy_is_stable_at_1e3(dtype):
    x = nb.tensor([[1000.0, 0.0], [0.0, 1000.0], [-1000.0, 1000.0]], dtype=dtype,
                  requires_grad=True)
    target = nb.tensor([1, 1, 0])
    loss = F.cross_entropy(x, target, reduction="none")
    np.testing.assert_allclose(loss.numpy(), [1000.0, 0.0, 2000.0], rtol=1e-6)
    loss.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[1, -1], [0, 0], [-1, 1]], atol=1e-6)
    soft = F.cross_entropy(x.detach(), nb.tensor([[0.5, 0.5]] * 3, dtype=dtype))
    assert np.isfinite(soft.item())


@pytest.mark.parametrize("dtype", [nb.float32, nb.float64])
def test_bce_with_logits_is_stable_at_1e3(dtype):
    x = nb.tensor([1000.0, -1000.0, 1000.0, -1000.0], dtype=dtype, requires_grad=True)
    t = nb.tensor([0.0, 1.0, 1.0, 0.0], dtype=dtype)
    loss = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    np.testing.assert_allclose(loss.numpy(), [1000.0, 1000.0, 0.0, 0.0], rtol=1e-6)
    loss.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, -1.0, 0.0, 0.0], atol=1e-6)
    weighted = F.binary_cross_entropy_with_logits(
        x.detach(), t, pos_weight=nb.tensor([2.0, 2.0, 2.0, 2.0], dtype=dtype),
        reduction="none")
    np.testing.assert_allclose(weighted.numpy(), [1000.0, 2000.0, 0.0, 0.0], rtol=1e-6)


def test_softplus_is_stable_at_1e3():
    x = nb.tensor([1000.0, -1000.0, 0.0], requires_grad=True)
    out = nb.softplus(x)
    np.testing.assert_allclose(out.numpy(), [1000.0, 0.0, math.log(2)], rtol=1e-12)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 0.0, 0.5])


def test_two_norm_does_not_overflow_or_underflow():
    big = nb.tensor([3e200, 4e200])
    small = nb.tensor([3e-200, 4e-200])
    np.testing.assert_allclose(nb.norm(big).item(), 5e200, rtol=1e-14)
    np.testing.assert_allclose(nb.norm(small).item(), 5e-200, rtol=1e-14)


# ------------------------------------------------------------------ ties and boundaries
def test_abs_gradient_at_zero_is_zero():
    np.testing.assert_array_equal(_grad(nb.abs, [0.0, -2.0, 3.0]), [0.0, -1.0, 1.0])


def test_relu_gradient_at_zero_is_zero():
    np.testing.assert_array_equal(_grad(nb.relu, [0.0, -1.0, 2.0]), [0.0, 0.0, 1.0])


def test_leaky_relu_gradient_at_zero_is_the_slope():
    np.testing.assert_allclose(_grad(lambda x: F.leaky_relu(x, 0.1), [0.0, -1.0, 2.0]),
                               [0.1, 0.1, 1.0])


def test_full_max_and_min_split_the_gradient_among_ties():
    np.testing.assert_array_equal(_grad(nb.max, [1.0, 3.0, 3.0]), [0.0, 0.5, 0.5])
    np.testing.assert_array_equal(_grad(nb.min, [2.0, 2.0, 2.0, 5.0]), [1 / 3, 1 / 3, 1 / 3, 0])


def test_max_along_a_dim_gives_the_gradient_to_the_first_index():
    x = [[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]]
    np.testing.assert_array_equal(_grad(lambda t: nb.max(t, 1).values, x),
                                  [[0, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(_grad(lambda t: nb.min(t, 0).values, [[1.0, 0.0],
                                                                         [1.0, 0.0]]),
                                  [[1, 1], [0, 0]])


def test_amax_and_amin_split_the_gradient_among_ties():
    x = [[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]]
    np.testing.assert_array_equal(_grad(lambda t: nb.amax(t, 1), x),
                                  [[0, 0.5, 0.5], [0.5, 0.5, 0]])
    np.testing.assert_array_equal(_grad(lambda t: nb.amin(t, (0, 1)), [[1.0, 1.0],
                                                                        [4.0, 1.0]]),
                                  [[1 / 3, 1 / 3], [0, 1 / 3]])


def test_maximum_and_minimum_split_the_gradient_at_ties():
    a = nb.tensor([1.0, 2.0], requires_grad=True)
    b = nb.tensor([1.0, 3.0], requires_grad=True)
    nb.maximum(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.5, 0.0])
    np.testing.assert_array_equal(b.grad.numpy(), [0.5, 1.0])


def test_clamp_gradient_passes_at_the_bounds():
    np.testing.assert_array_equal(_grad(lambda x: nb.clamp(x, 0.0, 2.0),
                                        [-1.0, 0.0, 1.0, 2.0, 3.0]), [0, 1, 1, 1, 0])


def test_l1_loss_gradient_at_a_tie_is_zero():
    x = nb.tensor([1.0, 2.0], requires_grad=True)
    F.l1_loss(x, nb.tensor([1.0, 0.0]), reduction="sum").backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 1.0])


def test_sqrt_gradient_at_zero_is_inf():
    g = _grad(nb.sqrt, [0.0, 4.0])
    assert g[0] == np.inf
    assert g[1] == 0.25


def test_norm_gradient_at_zero_is_zero_at_every_order():
    x = nb.zeros(3, requires_grad=True)
    (g,) = nb.autograd.grad(nb.norm(x), x, create_graph=True)
    np.testing.assert_array_equal(g.numpy(), [0.0, 0.0, 0.0])
    (gg,) = nb.autograd.grad(g.sum(), x)
    np.testing.assert_array_equal(gg.numpy(), [0.0, 0.0, 0.0])
    for p in (1, 3, float("inf")):
        np.testing.assert_array_equal(_grad(lambda t, p=p: nb.norm(t, p), [0.0, 0.0]), [0, 0])


def test_inf_norm_splits_the_gradient_among_ties_with_signs():
    np.testing.assert_array_equal(_grad(lambda t: nb.norm(t, float("inf")), [1.0, -3.0, 3.0]),
                                  [0.0, -0.5, 0.5])


def test_std_gradient_of_a_constant_is_zero():
    np.testing.assert_array_equal(_grad(nb.std, [2.0, 2.0, 2.0]), [0.0, 0.0, 0.0])


def test_prod_and_cumprod_gradients_with_zeros():
    # one zero: only it gets the product of the others; two zeros: all gradients vanish
    np.testing.assert_array_equal(_grad(nb.prod, [2.0, 0.0, 3.0]), [0.0, 6.0, 0.0])
    np.testing.assert_array_equal(_grad(nb.prod, [0.0, 0.0, 3.0]), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(_grad(lambda t: nb.cumprod(t, 0), [2.0, 0.0, 3.0]),
                                  [1.0, 2.0 + 6.0, 0.0])
    # the second derivative with two zeros: d2/dx0 dx1 prod = x2
    x = nb.tensor([0.0, 0.0, 3.0], requires_grad=True)
    (g,) = nb.autograd.grad(nb.prod(x), x, create_graph=True)
    (h,) = nb.autograd.grad(g[0], x)
    np.testing.assert_array_equal(h.numpy(), [0.0, 3.0, 0.0])


def test_sort_and_topk_put_nan_last_and_first_as_torch():
    x = nb.tensor([2.0, float("nan"), -1.0, 2.0])
    values, indices = nb.sort(x)
    np.testing.assert_array_equal(indices.numpy(), [2, 0, 3, 1])
    values, indices = nb.sort(x, descending=True)
    np.testing.assert_array_equal(indices.numpy(), [1, 0, 3, 2])
    assert nb.topk(x, 1).indices.item() == 1
    assert np.isnan(nb.max(x).item()) and nb.argmax(x).item() == 1
