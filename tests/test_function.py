"""Custom autograd.Function: the ctx API, error messages, once_differentiable."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import Function, gradcheck, gradgradcheck, once_differentiable


class Cube(Function):
    @staticmethod
    def forward(ctx, x, scale=1.0):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * x * x * scale

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * ctx.scale * g, None


def test_function_forward_backward_and_attributes():
    x = nb.tensor([1.0, 2.0], requires_grad=True)
    y = Cube.apply(x, 2.0)
    assert y.grad_fn.name() == "CubeBackward"
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 6 * x.numpy() ** 2)


def test_function_gradcheck_and_double_backward_through_nbgrad_ops():
    x = nb.tensor(np.random.default_rng(0).standard_normal(4), requires_grad=True)
    assert gradcheck(lambda t: Cube.apply(t, 1.5), (x,))
    assert gradgradcheck(lambda t: Cube.apply(t, 1.5), (x,))


def test_needs_input_grad_and_non_tensor_arguments():
    seen = {}

    class Probe(Function):
        @staticmethod
        def forward(ctx, a, b, k):
            seen["needs"] = ctx.needs_input_grad
            return a * b * k

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    a = nb.tensor([1.0], requires_grad=True)
    Probe.apply(a, nb.tensor([2.0]), 3).sum().backward()
    assert seen["needs"] == (True, False, False)


def test_wrong_number_of_gradients_names_the_function():
    class TooFew(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b

        @staticmethod
        def backward(ctx, g):
            return g

    a, b = nb.tensor([1.0], requires_grad=True), nb.tensor([2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="TooFew.backward returned an incorrect number"):
        TooFew.apply(a, b).sum().backward()


def test_wrong_gradient_shape_names_the_function():
    class BadShape(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return nb.ones(5)

    a = nb.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="BadShape.backward returned an invalid gradient"):
        BadShape.apply(a).sum().backward()


def test_mark_non_differentiable_and_materialize_grads():
    class SortWithIndex(Function):
        @staticmethod
        def forward(ctx, x):
            order = np.argsort(x.numpy())
            idx = nb.tensor(order.astype(np.float64))
            ctx.mark_non_differentiable(idx)
            ctx.order = order
            ctx.set_materialize_grads(False)
            return x[order], idx

        @staticmethod
        def backward(ctx, g, g_idx):
            assert g_idx is None  # not materialised
            out = nb.zeros(len(ctx.order))
            out[ctx.order] = g
            return out

    x = nb.tensor([3.0, 1.0, 2.0], requires_grad=True)
    vals, idx = SortWithIndex.apply(x)
    assert not idx.requires_grad
    (vals * nb.tensor([1.0, 2.0, 3.0])).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 1.0, 2.0])


def test_mark_dirty_in_place_function():
    class AddOneInPlace(Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1.0)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    a = nb.tensor([1.0, 2.0], requires_grad=True)
    h = a * 2
    out = AddOneInPlace.apply(h)
    assert out is h and h.grad_fn.name() == "AddOneInPlaceBackward"
    out.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [2.0, 2.0])
    np.testing.assert_allclose(h.numpy(), [3.0, 5.0])


def test_saved_tensor_modified_in_place_is_detected():
    x = nb.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1.0
    y = Cube.apply(h)
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_once_differentiable_blocks_double_backward():
    class Square(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @once_differentiable
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = nb.tensor([1.5], requires_grad=True)
    y = Square.apply(x).sum()
    (g,) = nb.autograd.grad(y, x)
    assert g.item() == pytest.approx(3.0)
    y2 = Square.apply(x).sum()
    (g2,) = nb.autograd.grad(y2, x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g2.sum().backward()


def test_gradcheck_failure_shows_the_differing_jacobian_entries():
    from nbgrad.autograd.gradcheck import GradcheckError

    class OffByTwo(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 4 * x * g  # should be 2 * x * g

    x = nb.tensor([1.0, -2.0, 3.0], requires_grad=True)
    with pytest.raises(GradcheckError) as info:
        gradcheck(OffByTwo.apply, (x,))
    text = str(info.value)
    assert "Jacobian mismatch in 3 entries" in text
    assert "analytic" in text and "numeric" in text
    assert "12" in text and "6" in text  # worst entry: analytic 12 vs numeric 6 at x=3
    assert not gradcheck(OffByTwo.apply, (x,), raise_exception=False)


def test_backward_frees_the_function_graph_without_the_cycle_collector():
    """After a backward the ctx and node go by reference counting (no ctx <-> node cycle
    left for the cyclic collector), and a second backward still raises."""
    x = nb.tensor([1.0, 2.0], requires_grad=True)
    gc.disable()
    try:
        y = Cube.apply(x, 2.0)
        ctx = weakref.ref(y.grad_fn.ctx)
        loss = y.sum()
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
        del y, loss
        assert ctx() is None
    finally:
        gc.enable()
