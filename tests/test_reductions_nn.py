"""API semantics of reductions, sorting and nn.functional beyond the generated op tests."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.nn.functional as F
from nbgrad.autograd import gradcheck, gradgradcheck


@pytest.fixture
def x(rng):
    return nb.tensor(rng.standard_normal((3, 4)), requires_grad=True)


# ------------------------------------------------------------------ max / min
def test_max_forms_dispatch_like_torch(x):
    full = nb.max(x)
    assert full.shape == () and full.item() == x.numpy().max()
    values, indices = nb.max(x, 1)
    res = x.max(dim=1, keepdim=True)
    assert res.values.shape == (3, 1) and res.indices.shape == (3, 1)
    np.testing.assert_array_equal(values.numpy(), x.numpy().max(1))
    np.testing.assert_array_equal(indices.numpy(), x.numpy().argmax(1))
    assert indices.dtype == nb.int64 and not indices.requires_grad
    assert values.requires_grad
    other = nb.zeros(3, 4)
    np.testing.assert_array_equal(nb.max(x, other).numpy(), np.maximum(x.numpy(), 0))
    np.testing.assert_array_equal(x.min(other=other).numpy(), np.minimum(x.numpy(), 0))
    np.testing.assert_array_equal(nb.min(x, axis=0).values.numpy(), x.numpy().min(0))
    with pytest.raises(TypeError, match="keepdim"):
        nb.max(x, keepdim=True)


def test_argmax_flat_and_keepdim(x):
    assert nb.argmax(x).item() == x.numpy().argmax()
    assert nb.argmin(x, keepdim=True).shape == (1, 1)
    assert x.argmax(1, keepdim=True).shape == (3, 1)
    np.testing.assert_array_equal(nb.argmax(nb.tensor([1, 5, 5, 2])).numpy(), 1)


def test_reducing_an_empty_dimension_names_the_op():
    with pytest.raises(IndexError, match="amax.*zero-size"):
        nb.amax(nb.zeros(0, 3), 0)
    with pytest.raises(IndexError, match="max"):
        nb.max(nb.zeros(0))
    with pytest.raises(IndexError, match="out of range"):
        nb.amax(nb.zeros(2, 3), 2)


def test_reductions_keep_float32(rng):
    x = nb.tensor(rng.standard_normal((3, 4)).astype(np.float32))
    for out in (nb.prod(x), nb.amax(x, 1), nb.var(x), nb.std(x, 0), nb.logsumexp(x, 1),
                nb.norm(x), nb.cumsum(x, 1), nb.cumprod(x, 0), nb.sort(x).values,
                F.softmax(x, 1), F.log_softmax(x, 0), F.layer_norm(x, (4,)),
                F.cross_entropy(x, nb.tensor([0, 1, 3])), F.mse_loss(x, x), F.gelu(x)):
        assert out.dtype == nb.float32


# ------------------------------------------------------------------ prod, var, scans
def test_prod_of_integers_and_dtype():
    t = nb.tensor([[1, 2], [3, 4]])
    assert nb.prod(t).dtype == nb.int64 and nb.prod(t).item() == 24
    np.testing.assert_array_equal(nb.prod(t, 0).numpy(), [3, 8])
    assert nb.prod(t, dtype=nb.float64).dtype == nb.float64
    np.testing.assert_array_equal(nb.prod(t, (0, 1), keepdim=True).numpy(), [[24]])


def test_var_spellings(x):
    a = x.numpy()
    np.testing.assert_allclose(nb.var(x).item(), a.var(ddof=1))
    np.testing.assert_allclose(nb.var(x, unbiased=False).item(), a.var())
    np.testing.assert_allclose(nb.var(x, 1, False).numpy(), a.var(1))  # torch's unbiased slot
    np.testing.assert_allclose(nb.var(x, True).item(), a.var(ddof=1))
    np.testing.assert_allclose(nb.std(x, axis=0, correction=0, keepdim=True).numpy(),
                               a.std(0, keepdims=True))
    with pytest.raises(TypeError, match="floating"):
        nb.var(nb.tensor([1, 2]))


def test_cumsum_of_integers_and_axis_alias():
    t = nb.tensor([[1, 2], [3, 4]])
    out = nb.cumsum(t, axis=0)
    assert out.dtype == nb.int64
    np.testing.assert_array_equal(out.numpy(), [[1, 2], [4, 6]])
    np.testing.assert_array_equal(t.cumprod(1).numpy(), [[1, 2], [3, 12]])
    with pytest.raises(TypeError, match="dim is required"):
        nb.cumsum(t)


def test_cumprod_third_derivative_with_zeros():
    x = nb.tensor([1.5, 0.0, 2.0, 0.5], requires_grad=True)
    assert gradgradcheck(lambda t: nb.cumprod(t, 0), (x,))
    (g,) = nb.autograd.grad(nb.prod(x), x, create_graph=True)
    (h,) = nb.autograd.grad(g[1], x, create_graph=True)  # d/dx (x0 x2 x3) at x1's slot
    np.testing.assert_allclose(h.numpy(), [1.0, 0.0, 0.75, 3.0])
    (t,) = nb.autograd.grad(h[0], x)
    np.testing.assert_allclose(t.numpy(), [0.0, 0.0, 0.5, 2.0])


def test_norm_p_values_and_errors(x):
    a = x.numpy()
    np.testing.assert_allclose(nb.norm(x, "fro").item(), np.linalg.norm(a))
    np.testing.assert_allclose(x.norm(1, 1).numpy(), np.abs(a).sum(1))
    np.testing.assert_allclose(nb.norm(x, float("inf")).item(), np.abs(a).max())
    with pytest.raises(ValueError, match="nuc"):
        nb.norm(x, "nuc")


# ------------------------------------------------------------------ sort, topk
def test_sort_is_stable_and_descending_keeps_tie_order():
    t = nb.tensor([3.0, 1.0, 3.0, 2.0, 1.0])
    np.testing.assert_array_equal(nb.sort(t).indices.numpy(), [1, 4, 3, 0, 2])
    np.testing.assert_array_equal(nb.sort(t, descending=True).indices.numpy(), [0, 2, 3, 1, 4])
    ints = nb.tensor([3, 1, 3])
    np.testing.assert_array_equal(nb.sort(ints, descending=True).values.numpy(), [3, 3, 1])


def test_topk_values_get_gradients_indices_do_not(x):
    values, indices = nb.topk(x, 2, dim=0)
    assert not indices.requires_grad
    values.sum().backward()
    expected = np.zeros((3, 4))
    np.put_along_axis(expected, indices.numpy(), 1.0, axis=0)
    np.testing.assert_array_equal(x.grad.numpy(), expected)
    assert nb.topk(x, 0).values.shape == (3, 0)
    with pytest.raises(RuntimeError, match="topk: k=5"):
        nb.topk(x, 5)


# ------------------------------------------------------------------ dropout
def test_dropout_is_deterministic_with_a_seed(rng):
    x = nb.tensor(rng.standard_normal((50, 40)))
    a = F.dropout(x, 0.25, seed=11)
    b = F.dropout(x, 0.25, seed=11)
    c = F.dropout(x, 0.25, seed=12)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), c.numpy())
    kept = a.numpy() != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(a.numpy()[kept], x.numpy()[kept] / 0.75)
    nb.random.seed(4)
    d = F.dropout(x, 0.5)
    nb.random.seed(4)
    np.testing.assert_array_equal(F.dropout(x, 0.5).numpy(), d.numpy())
    gen1, gen2 = np.random.default_rng(5), np.random.default_rng(5)
    np.testing.assert_array_equal(F.dropout(x, 0.5, generator=gen1).numpy(),
                                  F.dropout(x, 0.5, generator=gen2).numpy())


def test_dropout_backward_uses_the_saved_mask(rng):
    x = nb.tensor(rng.standard_normal((20, 10)), requires_grad=True)
    gen = np.random.default_rng(0)
    out = F.dropout(x, 0.4, generator=gen)
    gen.random(1000)  # drawing more must not change the backward
    out.sum().backward()
    mask = (out.numpy() != 0) / 0.6
    np.testing.assert_allclose(x.grad.numpy(), mask)
    assert gradgradcheck(lambda t: F.dropout(t, 0.4, seed=3), (x[:2, :3].detach()
                                                                 .requires_grad_(),))


def test_dropout_outside_training_and_bad_arguments(x):
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    np.testing.assert_array_equal(F.dropout(x, 1.0, seed=0).numpy(), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="p must be"):
        F.dropout(x, 1.5)
    with pytest.raises(TypeError, match="seed or generator"):
        F.dropout(x, seed=1, generator=np.random.default_rng(1))


# ------------------------------------------------------------------ losses
def test_cross_entropy_ignore_index_and_errors(rng):
    logits = nb.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    target = nb.tensor([1, -100, 3])
    loss = F.cross_entropy(logits, target)
    ref = F.cross_entropy(logits[[0, 2]], nb.tensor([1, 3]))
    np.testing.assert_allclose(loss.item(), ref.item())
    loss.backward()
    np.testing.assert_array_equal(logits.grad.numpy()[1], 0.0)
    assert np.isnan(F.cross_entropy(logits, nb.tensor([-100, -100, -100])).item())
    with pytest.raises(IndexError, match="target 4 is out of bounds"):
        F.cross_entropy(logits, nb.tensor([0, 4, 1]))
    with pytest.raises(RuntimeError, match="does not match"):
        F.cross_entropy(logits, nb.tensor([0, 1]))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(logits, nb.tensor([0, 1, 2]), reduction="avg")


def test_cross_entropy_with_probabilities_differentiates_the_target(rng):
    logits = nb.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    q = nb.tensor(rng.dirichlet(np.ones(4), 3), requires_grad=True)
    F.cross_entropy(logits, q).backward()
    logp = F.log_softmax(logits, 1).detach().numpy()
    np.testing.assert_allclose(q.grad.numpy(), -logp / 3)


def test_cross_entropy_hessian_equals_softmax_jacobian(rng):
    logits = nb.tensor(rng.standard_normal(4), requires_grad=True)
    (g,) = nb.autograd.grad(F.cross_entropy(logits, nb.tensor(2)), logits, create_graph=True)
    p = F.softmax(logits, 0).detach().numpy()
    rows = [nb.autograd.grad(g[i], logits, retain_graph=True)[0].numpy() for i in range(4)]
    np.testing.assert_allclose(np.stack(rows), np.diag(p) - np.outer(p, p), atol=1e-12)


def test_binary_cross_entropy_checks_its_input():
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        F.binary_cross_entropy(nb.tensor([0.5, 1.5]), nb.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        F.binary_cross_entropy(nb.tensor([0.5, 0.5]), nb.tensor([1.0]))
    # log clamped at -100, as torch
    assert F.binary_cross_entropy(nb.tensor([0.0]), nb.tensor([1.0])).item() == 100.0


# ------------------------------------------------------------------ embedding, layer_norm, linear
def test_embedding_padding_row_gets_no_gradient_and_repeats_add(rng):
    w = nb.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    idx = nb.tensor([[0, 2, 2], [1, 0, 3]])
    out = F.embedding(idx, w, padding_idx=1)
    np.testing.assert_array_equal(out.numpy(), w.numpy()[idx.numpy()])
    out.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy()[:, 0], [2.0, 0.0, 2.0, 1.0])
    gout = nb.tensor(rng.standard_normal((2, 3, 3)), requires_grad=True)
    assert gradcheck(lambda g: nb.ops.nn.embedding_backward(g, idx, 4, 1), (gout,))
    with pytest.raises(IndexError, match="index 4 is out of range"):
        F.embedding(nb.tensor([4]), w)


def test_layer_norm_and_linear_shape_errors(rng):
    x = nb.tensor(rng.standard_normal((2, 3)))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(x, (2,))
    with pytest.raises(RuntimeError, match="weight of shape"):
        F.layer_norm(x, (3,), nb.ones(2))
    with pytest.raises(RuntimeError, match="linear"):
        F.linear(x, nb.ones(4, 2))
    out = F.layer_norm(x, 3)
    np.testing.assert_allclose(out.numpy().mean(1), 0.0, atol=1e-12)


def test_functional_namespace_and_methods(x):
    for name in ("softmax", "log_softmax", "cross_entropy", "nll_loss", "mse_loss", "l1_loss",
                 "binary_cross_entropy", "binary_cross_entropy_with_logits", "leaky_relu",
                 "elu", "gelu", "silu", "layer_norm", "dropout", "embedding", "linear",
                 "one_hot"):
        assert callable(getattr(F, name)), name
    np.testing.assert_allclose(x.softmax(1).numpy().sum(1), 1.0)
    np.testing.assert_allclose(x.logsumexp(1).numpy(), np.log(np.exp(x.numpy()).sum(1)))
    assert x.std().shape == () and x.amax((0, 1)).shape == ()
    with pytest.raises(TypeError, match="dim is required"):
        F.softmax(x)


def test_cross_entropy_under_jit_checks_target_values_at_every_call():
    import nbgrad.nn.functional as F
    rng = np.random.default_rng(0)
    logits = nb.tensor(rng.standard_normal((4, 3)), requires_grad=True)

    def loss(x, t):
        return F.cross_entropy(x, t)

    step = nb.jit(nb.value_and_grad(loss))
    value, g = step(logits, nb.tensor([0, 2, 1, 2]))
    ref_value, ref_g = nb.value_and_grad(loss)(logits, nb.tensor([0, 2, 1, 2]))
    np.testing.assert_allclose(value.numpy(), ref_value.numpy(), rtol=1e-12)
    np.testing.assert_allclose(g.numpy(), ref_g.numpy(), rtol=1e-12)
    with pytest.raises(IndexError, match="cross_entropy: target 7 is out of bounds"):
        step(logits, nb.tensor([0, 7, 1, 2]))
