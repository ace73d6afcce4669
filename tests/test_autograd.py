"""Semantics of the eager engine: backward, grad, hooks, versions, grad mode, memory."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

import nbgrad as nb


def leaf(*values, dtype=None):
    return nb.tensor(np.asarray(values, dtype=float), dtype=dtype, requires_grad=True)


def test_backward_accumulates_into_leaves():
    x = leaf(1.0, 2.0)
    (x * x).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2 + 3, 4 + 3])


def test_second_backward_without_retain_graph_raises():
    x = leaf(1.0, 2.0)
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = leaf(1.0, 2.0)
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * first)


def test_non_scalar_output_needs_a_gradient():
    x = leaf(1.0, 2.0)
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        (x * 2).backward()
    (x * 2).backward(nb.tensor([1.0, 10.0]))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 20.0])


def test_grad_returns_a_tuple_and_leaves_dot_grad_alone():
    x, w = leaf(1.0, 2.0), leaf(3.0, 4.0)
    gx, gw = nb.autograd.grad((x * w).sum(), (x, w))
    np.testing.assert_allclose(gx.numpy(), [3.0, 4.0])
    np.testing.assert_allclose(gw.numpy(), [1.0, 2.0])
    assert x.grad is None and w.grad is None


def test_grad_of_unused_input():
    x, unused = leaf(1.0), leaf(2.0)
    y = (x * 2).sum()
    with pytest.raises(RuntimeError, match="allow_unused=True"):
        nb.autograd.grad(y, (x, unused), retain_graph=True)
    gx, gu = nb.autograd.grad(y, (x, unused), allow_unused=True)
    assert gu is None and gx.item() == 2.0


def test_grad_with_grad_outputs_and_non_leaf_input():
    x = leaf(1.0, 2.0, 3.0)
    h = x * x
    y = h.sin()
    (gh,) = nb.autograd.grad(y, h, grad_outputs=nb.ones(3))
    np.testing.assert_allclose(gh.numpy(), np.cos(x.numpy() ** 2))


def test_backward_inputs_accumulates_only_there():
    x, w = leaf(1.0), leaf(2.0)
    (x * w).sum().backward(inputs=[w])
    assert x.grad is None and w.grad.item() == 1.0


def test_output_that_does_not_require_grad():
    with pytest.raises(RuntimeError, match="does not require grad"):
        nb.tensor([1.0]).sum().backward()


def test_hooks_on_leaf_and_non_leaf_can_replace_the_gradient():
    x = leaf(1.0, 2.0)
    h = x * 2
    seen = []
    h.register_hook(lambda g: seen.append(g.numpy().copy()) or g * 10)
    handle = x.register_hook(lambda g: g + 1)
    h.sum().backward()
    np.testing.assert_allclose(seen[0], [1.0, 1.0])
    np.testing.assert_allclose(x.grad.numpy(), [21.0, 21.0])
    handle.remove()
    x.grad = None
    (x * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_retain_grad_keeps_non_leaf_gradients():
    x = leaf(1.0, 2.0)
    h = x * 3
    h.retain_grad()
    y = h * h
    y.retain_grad()
    y.sum().backward()
    np.testing.assert_allclose(h.grad.numpy(), 2 * h.numpy())
    np.testing.assert_allclose(y.grad.numpy(), [1.0, 1.0])
    assert (x * 2).grad is None  # not retained


def test_in_place_after_save_is_detected():
    x = leaf(1.0, 2.0)
    h = x * 1.0
    y = h.exp()  # saves its result... and mul saves nothing of h
    z = (h * h).sum()  # saves h
    with nb.no_grad():
        pass
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    assert y.requires_grad


def test_a_node_saves_only_what_the_inputs_needing_a_gradient_read():
    """``h * c`` with only ``h`` needing a gradient reads ``c``, not ``h``: ``h`` is
    not kept alive, and changing it in place afterwards is allowed (as in PyTorch)."""
    x = leaf(1.0, 2.0)
    c = nb.tensor(np.array([3.0, 4.0]))
    for other in (2.5, c):
        h = x * 1.0
        y = h * other
        ref = weakref.ref(h)
        del h
        assert ref() is None, f"h kept alive by y = h * {other!r}"
        (g,) = nb.autograd.grad(y.sum(), [x])
        np.testing.assert_allclose(g.numpy(), np.broadcast_to(np.asarray(other, float), 2))
    h = x * 1.0
    y = h / c  # div's formula for self reads only other
    h.mul_(5.0)
    (g,) = nb.autograd.grad(y.sum(), [x])
    np.testing.assert_allclose(g.numpy(), 1.0 / c.numpy())
    w = leaf(3.0, 4.0)  # the other operand needs a gradient: h is saved for it
    h = x * 1.0
    y = h * w
    ref = weakref.ref(h)
    del h
    assert ref() is not None
    h = x * 1.0
    z = (h * w).sum()
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_grad_with_only_the_asked_leaves_runs_and_skips_as_before():
    """``grad`` when the asked inputs are every leaf reached (the engine then runs every
    node), and when they are not (only the nodes leading to them run)."""
    x, w = leaf(1.0, 2.0), leaf(3.0, 4.0)
    calls = []

    class Spy(nb.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 1.0

        @staticmethod
        def backward(ctx, g):
            calls.append(1)
            return g * 2.0

    y = (Spy.apply(x) * x).sum()
    (g,) = nb.autograd.grad(y, [x])
    np.testing.assert_allclose(g.numpy(), [3.0, 6.0])  # 2 x from Spy, x from the product
    assert calls == [1]
    y = (Spy.apply(w) * x).sum()  # w's branch leads to no asked input: not run
    (g,) = nb.autograd.grad(y, [x])
    np.testing.assert_allclose(g.numpy(), [3.0, 4.0])
    assert calls == [1]
    y = (x * 2.0).sum() + (w * 0.0).sum()
    assert nb.autograd.grad(y, [w])[0].numpy().tolist() == [0.0, 0.0]
    assert nb.autograd.grad((x * 2.0).sum(), [w], allow_unused=True) == (None,)


def test_in_place_ops_bump_versions_shared_with_views():
    t = nb.zeros(2, 3)
    row = t[0]
    v0 = t._version
    row.add_(1.0)
    assert t._version == row._version == v0 + 1
    np.testing.assert_allclose(t.numpy()[0], [1, 1, 1])


def test_in_place_on_leaf_requiring_grad_raises_unless_no_grad():
    w = leaf(1.0, 2.0)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        w.mul_(2)
    with nb.no_grad():
        w.mul_(2)
    np.testing.assert_allclose(w.numpy(), [2.0, 4.0])


def test_in_place_ops_are_differentiable():
    x = leaf(1.0, 2.0)
    y = x * 1.0
    y.mul_(x)  # y = x^2
    y.add_(3.0)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


def test_setitem_records_the_graph():
    x = leaf(1.0, 2.0)
    buf = nb.zeros(3)
    buf[1:] = x * x
    buf.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])
    assert buf._version == 1


def test_grad_mode_context_managers_and_decorators():
    x = leaf(1.0)
    with nb.no_grad():
        assert not (x * 2).requires_grad
        with nb.enable_grad():
            assert (x * 2).requires_grad
    assert (x * 2).requires_grad

    @nb.no_grad()
    def f():
        return x * 2

    assert not f().requires_grad
    with nb.set_grad_enabled(False):
        assert not nb.is_grad_enabled()
    assert nb.is_grad_enabled()


def test_grad_mode_is_thread_local():
    results = {}
    entered, release = threading.Event(), threading.Event()

    def worker():
        with nb.no_grad():
            entered.set()
            release.wait(5)
            results["worker"] = nb.is_grad_enabled()

    th = threading.Thread(target=worker)
    th.start()
    entered.wait(5)
    results["main"] = nb.is_grad_enabled()
    release.set()
    th.join()
    assert results == {"main": True, "worker": False}


def test_long_chain_backpropagates_without_recursion():
    x = leaf(0.5)
    y = x
    for _ in range(100_000):
        y = y * 1.0
    y.sum().backward()
    assert x.grad.item() == 1.0


def test_graph_is_collectable_after_backward():
    x = leaf(1.0, 2.0)
    y = (x.exp() * x).sum()
    node = weakref.ref(y.grad_fn)
    y.backward()
    del y
    gc.collect()
    assert node() is None


def test_saved_tensors_are_freed_after_backward():
    x = leaf(1.0, 2.0)
    h = x.exp()
    y = (h * x).sum()
    mul_node = y.grad_fn.next_edges[0][0]
    assert mul_node.saved
    y.backward()
    assert mul_node.saved is None


def test_create_graph_builds_differentiable_gradients():
    x = leaf(0.3, -0.4)
    y = (x ** 3).sum()
    (g,) = nb.autograd.grad(y, x, create_graph=True)
    assert g.requires_grad
    (gg,) = nb.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(gg.numpy(), 6 * x.numpy())


def test_broadcast_gradients_are_summed_to_the_input_shape():
    a = nb.tensor(np.ones((3, 1, 2)), requires_grad=True)
    b = nb.tensor(np.ones((4, 1)), requires_grad=True)
    (a * b).sum().backward()
    assert a.grad.shape == (3, 1, 2) and b.grad.shape == (4, 1)
    np.testing.assert_allclose(b.grad.numpy(), np.full((4, 1), 6.0))


def test_float32_gradients_stay_float32():
    x = nb.tensor([1.0, 2.0], dtype=nb.float32, requires_grad=True)
    w = nb.tensor([0.5, 0.5], requires_grad=True)  # float64
    (x * w).sum().backward()
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float64


def test_detect_anomaly_names_the_forward_site():
    x = leaf(-1.0, 1.0)
    with nb.autograd.detect_anomaly(), pytest.raises(RuntimeError, match="test_autograd.py"):
        nb.log(x)
