"""``nbgrad.vmap``: the batching rule of each op kind, in_axes/out_axes, compositions.

Every batched result is compared with a Python loop over the batch (stacked), and with
``jax.vmap`` where JAX is installed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.batching import BatchingError
from nbgrad.ops.registry import REGISTRY

RNG = np.random.default_rng(3)


def _np(t):
    return t.numpy() if isinstance(t, nb.Tensor) else np.asarray(t)


def _loop(f, in_axes, *args):
    """The batched result by a Python loop (out_axes 0), for tensor/array arguments."""
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    size = next(np.shape(a)[ax] for a, ax in zip(args, axes, strict=True) if ax is not None)
    outs = []
    for b in range(size):
        xs = [nb.tensor(np.take(a, b, axis=ax)) if ax is not None else
              (nb.tensor(a) if isinstance(a, np.ndarray) else a)
              for a, ax in zip(args, axes, strict=True)]
        outs.append(f(*xs))
    if isinstance(outs[0], (tuple, list)):
        return [np.stack([_np(o[k]) for o in outs]) for k in range(len(outs[0]))]
    return np.stack([_np(o) for o in outs])


def _check(f, *args, in_axes=0, atol=1e-10):
    got = nb.vmap(f, in_axes=in_axes)(*[nb.tensor(a) if isinstance(a, np.ndarray) else a
                                        for a in args])
    want = _loop(f, in_axes, *args)
    if isinstance(want, list):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(_np(g), w, atol=atol, rtol=1e-10)
    else:
        np.testing.assert_allclose(_np(got), want, atol=atol, rtol=1e-10)
    return got


def r(*shape):
    return RNG.standard_normal(shape)


# ------------------------------------------------------------------ rules per kind
CASES = {
    # elementwise, with broadcasting between batched and unbatched operands of any rank
    "elementwise": (lambda x, y: nb.sin(x) * y + x ** 2, (r(4, 3), r(4, 2, 3)), 0),
    "elementwise-unbatched": (lambda x, y: x * y - nb.exp(y), (r(4, 3), r(2, 3)), (0, None)),
    "elementwise-scalar": (lambda x, y: nb.where(x > 0, x, y), (r(5), r(5, 3)), 0),
    "reduction": (lambda x: x.sum(-1) + x.mean(0).sum() + x.sum(), (r(4, 3, 2),), 0),
    "reduction-keepdim": (lambda x: x - x.mean(1, keepdim=True), (r(4, 3, 2),), 0),
    "views": (lambda x: x.reshape(6, 2).T.flatten()[None, :].squeeze(0), (r(3, 4, 3),), 0),
    "permute": (lambda x: x.permute(2, 0, 1) * 2, (r(3, 4, 3, 2),), 0),
    "broadcast": (lambda x: nb.broadcast_to(x, (3, 4)) + x.expand(2, 3, 4).sum(0),
                  (r(5, 4),), 0),
    "matmul-2d": (lambda a, b: a @ b, (r(4, 3, 5), r(4, 5, 2)), 0),
    "matmul-1d-left": (lambda a, b: a @ b, (r(4, 5), r(5, 2)), (0, None)),
    "matmul-1d-right": (lambda a, b: a @ b, (r(3, 5), r(4, 5)), (None, 0)),
    "matmul-dot": (lambda a, b: nb.dot(a, b), (r(4, 5), r(4, 5)), 0),
    "matmul-batched": (lambda a, b: a @ b, (r(4, 2, 3, 5), r(5, 2)), (0, None)),
    "matmul-broadcast": (lambda a, b: a @ b, (r(3, 5), r(4, 2, 5, 6)), (None, 0)),
    "matmul-column-right": (lambda a, b: a @ b, (r(2, 3, 5), r(4, 5, 1)), (None, 0)),
    "matmul-vector-right-3d": (lambda a, b: a @ b, (r(2, 3, 5), r(4, 5)), (None, 0)),
    "matmul-batched-vector": (lambda a, b: a @ b, (r(4, 2, 3, 5), r(5)), (0, None)),
    "linear-one-output-weights": (lambda x, w: nb.nn.functional.linear(x, w),
                                  (r(2, 3), r(4, 1, 3)), (None, 0)),
    "linear": (lambda x, w, b: nb.nn.functional.linear(x, w, b),
               (r(4, 2, 3), r(5, 3), r(4, 5)), (0, None, 0)),
    "outer": (lambda a, b: nb.outer(a, b), (r(4, 3), r(2)), (0, None)),
    "mm-bmm": (lambda a, b: nb.mm(a, b) + nb.bmm(a[None], b[None])[0], (r(4, 2, 3), r(3, 2)),
               (0, None)),
    "indexing": (lambda x: x[1:, ::2] + x[0, None, :2] * x[[0, 2]][:, :2], (r(4, 3, 3),), 0),
    "advanced-index": (lambda x: x[[0, 2], 1] + x[..., 0][[1, 1]], (r(4, 3, 2),), 0),
    "flip-roll": (lambda x: nb.flip(x, 0) + nb.roll(x, 1, 1), (r(4, 3, 3),), 0),
    "split-unbind": (lambda x: sum(x.unbind(1)) + nb.split(x, 1, 0)[2].sum(), (r(4, 3, 2),), 0),
    "cat-stack": (lambda x, y: nb.cat([x, y, x], -1) + nb.stack([y, y, x], 0).sum(0).repeat(1, 3),
                  (r(4, 2, 3), r(2, 3)), (0, None)),
    "softmax": (lambda x: nb.softmax(x, -1) + nb.log_softmax(x, 0), (r(4, 3, 5),), 0),
    "logsumexp": (lambda x: nb.logsumexp(x, 1) + nb.amax(x, -1) + x.max(), (r(4, 3, 5),), 0),
    "cumsum-sort": (lambda x: nb.cumsum(x, 0) + nb.sort(x, -1)[0], (r(4, 3, 5),), 0),
    "std-var": (lambda x: x.std(0) + x.var(), (r(4, 3, 5),), 0),
    "gather": (lambda x, i: nb.gather(x, 1, i), (r(4, 3, 5), RNG.integers(0, 5, (4, 3, 2))), 0),
    "index_select": (lambda x, i: nb.index_select(x, 0, i),
                     (r(4, 3, 5), RNG.integers(0, 3, (4, 2))), 0),
    "linalg": (lambda a, b: nb.linalg.solve(a @ a.T + 3 * nb.eye(3), b) + nb.linalg.det(a),
               (r(4, 3, 3), r(4, 3)), 0),
    "linalg-inv": (lambda a: nb.linalg.inv(a @ a.T + nb.eye(3)), (r(4, 3, 3),), 0),
    "linear-bias-only": (lambda x, w, b: nb.nn.functional.linear(x, w, b),
                         (r(2, 3), r(5, 3), r(4, 5)), (None, None, 0)),
    "masked_fill": (lambda x, m, v: nb.masked_fill(x, m, v),
                    (r(4, 2, 3), RNG.random((3,)) > 0.5, r(4)), (None, None, 0)),
    "masked_fill-mask": (lambda x, m: nb.masked_fill(x, m, 2.0),
                         (r(2, 3), RNG.random((4, 3)) > 0.5), (None, 0)),
    "clamp": (lambda x, lo: nb.clamp(x, lo, None), (r(3,), r(4, 2, 3)), (None, 0)),
    "layer_norm": (lambda x, w: nb.nn.functional.layer_norm(x, (3,), w, None),
                   (r(4, 2, 3), r(4, 3)), 0),
    "mse": (lambda x, y: nb.nn.functional.mse_loss(x, y), (r(4, 3), r(4, 3)), 0),
    "conv2d": (lambda x, w: nb.nn.functional.conv2d(x, w, padding=1),
               (r(3, 2, 2, 5, 5), r(4, 2, 3, 3)), (0, None)),
    "conv2d-weights": (lambda x, w: nb.nn.functional.conv2d(x, w, stride=2),
                       (r(3, 2, 2, 5, 5), r(3, 4, 2, 3, 3)), 0),
    "conv1d": (lambda x, w, b: nb.nn.functional.conv1d(x, w, b, padding=1),
               (r(3, 2, 2, 7), r(4, 2, 3), r(3, 4)), (0, None, 0)),
    "conv1d-weights": (lambda x, w: nb.nn.functional.conv1d(x, w, groups=2),
                       (r(3, 2, 4, 7), r(3, 4, 2, 3)), 0),
    "einsum": (lambda a, b: nb.einsum("ij,jk->ik", a, b), (r(4, 2, 3), r(3, 5)), (0, None)),
    "cross_entropy": (lambda x, t: nb.nn.functional.cross_entropy(x, t),
                      (r(4, 3, 5), RNG.integers(0, 5, (4, 3))), 0),
    "cross_entropy-weighted": (
        lambda x, t: nb.nn.functional.cross_entropy(x, t, weight=nb.tensor(np.arange(1.0, 6.0)),
                                                    ignore_index=1, label_smoothing=0.1),
        (r(4, 6, 5), RNG.integers(0, 5, (4, 6))), 0),
    "cross_entropy-one": (lambda x, t: nb.nn.functional.cross_entropy(x, t),
                          (r(4, 5), RNG.integers(0, 5, (4,))), 0),
    "nll_loss": (lambda x, t: nb.nn.functional.nll_loss(nb.log_softmax(x, 1), t, reduction="sum")
                 + nb.nn.functional.nll_loss(x, t, reduction="none").sum(),
                 (r(4, 3, 5), RNG.integers(0, 5, (4, 3))), 0),
    "embedding": (lambda w, i: nb.nn.functional.embedding(i, w),
                  (r(6, 2), RNG.integers(0, 6, (4, 3))), (None, 0)),
    "embedding-weights": (lambda w, i: nb.nn.functional.embedding(i, w),
                          (r(4, 6, 2), RNG.integers(0, 6, (4, 3))), 0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_matches_a_python_loop(name):
    f, args, in_axes = CASES[name]
    _check(f, *args, in_axes=in_axes)


@pytest.mark.parametrize("name", ["elementwise", "reduction", "matmul-1d-right", "indexing",
                                  "softmax", "linalg", "conv2d", "cat-stack", "linear",
                                  "cross_entropy", "cross_entropy-weighted", "nll_loss",
                                  "cross_entropy-one", "embedding-weights", "conv2d-weights",
                                  "layer_norm", "gather", "einsum", "conv1d", "conv1d-weights"])
def test_per_example_gradients_of_each_kind(name):
    f, args, in_axes = CASES[name]
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    pos = next(i for i, a in enumerate(axes) if a is not None)

    def loss(*xs):
        return (f(*xs) ** 2).sum()
    g = nb.grad(loss, argnums=pos)
    _check(g, *args, in_axes=in_axes, atol=1e-9)


# ------------------------------------------------------------------ axes
def test_in_axes_out_axes_and_pytrees():
    x, y = r(3, 4), r(4, 5)
    f = lambda p, q: {"s": p["a"] * 2 + q[0], "t": (p["b"] @ q[1],)}  # noqa: E731
    out = nb.vmap(f, in_axes=({"a": 1, "b": None}, (0, -1)), out_axes={"s": 1, "t": 0})(
        {"a": nb.tensor(x), "b": nb.tensor(r(2, 3))}, (nb.tensor(r(4, 3)), nb.tensor(r(3, 4))))
    assert tuple(out["s"].shape) == (3, 4) and tuple(out["t"][0].shape) == (4, 2)
    got = nb.vmap(lambda a, b: a[:, None] * b, in_axes=(-1, 0), out_axes=-1)(
        nb.tensor(x), nb.tensor(y))
    np.testing.assert_allclose(got.numpy(),
                               np.stack([x[:, i][:, None] * y[i] for i in range(4)], -1))
    # an output not depending on the batch is broadcast; with out_axes None it is kept
    c, d = nb.vmap(lambda a: (nb.tensor(2.0), a.sum()), out_axes=(None, 0))(nb.tensor(x))
    assert c.shape == () and tuple(d.shape) == (3,)
    e = nb.vmap(lambda a: nb.ones(2), axis_size=3, in_axes=None)(nb.tensor(x))
    assert tuple(e.shape) == (3, 2)
    kw = nb.vmap(lambda a, scale=None: a * scale)(nb.tensor(x), scale=nb.tensor(r(3, 4)))
    assert tuple(kw.shape) == (3, 4)


def test_axis_errors_are_jax_like():
    x, y = nb.tensor(r(3, 4)), nb.tensor(r(5, 4))
    with pytest.raises(ValueError, match="inconsistent sizes for array axes to be mapped"):
        nb.vmap(lambda a, b: a + b)(x, y)
    with pytest.raises(ValueError, match="at least one non-None value in in_axes"):
        nb.vmap(lambda a: a, in_axes=None)(x)
    with pytest.raises(ValueError, match="rank should be at least 3"):
        nb.vmap(lambda a: a, in_axes=2)(x)
    with pytest.raises(ValueError, match="tuple of entries corresponding to the positional"):
        nb.vmap(lambda a, b: a, in_axes=(0,))(x, x)
    with pytest.raises(ValueError, match="out_axes is None"):
        nb.vmap(lambda a: a, out_axes=None)(x)
    with pytest.raises(TypeError, match="in_axes must be an int, None"):
        nb.vmap(lambda a: a, in_axes=0.5)


def test_an_op_without_a_rule_raises_naming_it():
    x = nb.tensor(r(3, 4))
    with pytest.raises(BatchingError, match="no batching rule for op 'dropout'"):
        nb.vmap(lambda a: nb.nn.functional.dropout(a, 0.5, training=True))(x)
    assert issubclass(BatchingError, NotImplementedError)


def test_value_dependent_python_raises_tracer_error():
    with pytest.raises(nb.TracerError):
        nb.vmap(lambda a: a * 2 if a.sum() > 0 else a)(nb.tensor(r(3, 4)))


# ------------------------------------------------------------------ compositions
def test_a_module_closed_over_gets_its_gradients():
    m = nb.nn.Sequential(nb.nn.Linear(3, 4), nb.nn.Tanh(), nb.nn.Linear(4, 2))
    X = nb.tensor(r(5, 3))
    out = nb.vmap(m)(X)
    np.testing.assert_allclose(out.detach().numpy(), m(X).detach().numpy(), atol=1e-14)
    out.sum().backward()
    got = [p.grad.numpy().copy() for p in m.parameters()]
    for p in m.parameters():
        p.grad = None
    m(X).sum().backward()
    for g, p in zip(got, m.parameters(), strict=True):
        np.testing.assert_allclose(g, p.grad.numpy(), atol=1e-13)


def _mlp_loss(w, x):
    return nb.sum(nb.tanh(x @ w[0]) @ w[1]) ** 2


def test_vmap_of_grad_gives_per_example_gradients():
    w = (nb.tensor(r(3, 4)), nb.tensor(r(4, 2)))
    X = r(6, 3)
    per = nb.vmap(nb.grad(_mlp_loss), in_axes=(None, 0))(w, nb.tensor(X))
    for b in range(6):
        ref = nb.grad(_mlp_loss)(w, nb.tensor(X[b]))
        for k in range(2):
            np.testing.assert_allclose(per[k].numpy()[b], ref[k].numpy(), atol=1e-12)


@pytest.mark.parametrize("name", ["embedding", "conv2d", "conv1d", "linear", "matmul-1d-left",
                                  "outer",
                                  "layer_norm", "einsum", "mm-bmm"])
def test_per_example_gradients_of_unmapped_parameters(name):
    f, args, in_axes = CASES[name]
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    pos = tuple(i for i, (a, x) in enumerate(zip(axes, args, strict=True))
                if np.asarray(x).dtype.kind == "f")
    g = nb.grad(lambda *xs: (f(*xs) ** 2).sum(), argnums=pos)
    got = nb.vmap(g, in_axes=in_axes)(*[nb.tensor(a) for a in args])
    want = _loop(g, in_axes, *args)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(_np(a), b, atol=1e-9, rtol=1e-10)


def test_grad_of_vmap():
    w, X = r(3, 4), r(6, 3)
    f = lambda w, x: nb.tanh(x @ w).sum()  # noqa: E731
    g = nb.grad(lambda w: nb.vmap(f, in_axes=(None, 0))(w, nb.tensor(X)).sum())(nb.tensor(w))
    ref = nb.grad(lambda w: nb.tanh(nb.tensor(X) @ w).sum())(nb.tensor(w))
    np.testing.assert_allclose(g.numpy(), ref.numpy(), atol=1e-12)
    # a detach inside the mapped function cuts the gradient as it does eagerly
    h = nb.grad(lambda x: nb.vmap(lambda a: a.detach() * a)(x).sum())(nb.tensor(X))
    np.testing.assert_allclose(h.numpy(), X, atol=1e-12)


def test_jit_of_vmap_is_one_graph_whatever_the_batch():
    w = nb.tensor(r(3, 4))
    f = nb.vmap(lambda x: nb.softmax(nb.tanh(x @ w), -1).sum(0), in_axes=0)
    counts = set()
    for n in (2, 7, 20):
        X = nb.tensor(r(n, 5, 3))
        j = nb.jit(f)
        np.testing.assert_allclose(j(X).numpy(), f(X).numpy(), atol=1e-12)
        np.testing.assert_allclose(j(X).numpy(), f(X).numpy(), atol=1e-12)  # compiled run
        assert j.traces == 1
        counts.add(len(next(iter(j._cache.values())).graph.nodes))
    assert len(counts) == 1  # no per-example replication: the graph is the same for any n


def test_batched_matrix_vector_products_are_one_matrix_product():
    """vmap folds the batch of a product with one batched operand into the rows of one
    2-D product, so a Jacobian or Hessian through ``A @ x`` makes one GEMM, not a batch
    of matrix-vector products (a 3-D matmul)."""
    A = nb.tensor(r(6, 5))

    def products(fn, x):
        j = nb.jit(fn)
        got = j(nb.tensor(x))
        nodes = [n for n in next(iter(j._cache.values())).graph.nodes if n.op == "matmul"]
        return got, nodes

    V = r(4, 5)
    got, nodes = products(nb.vmap(lambda v: A @ v), V)
    np.testing.assert_allclose(got.numpy(), V @ A.numpy().T, atol=1e-12)
    assert nodes and all(len(n.outputs[0].shape) <= 2 for n in nodes)
    x = r(5)
    f = lambda v: nb.logsumexp(A @ v, 0)  # noqa: E731
    H, nodes = products(nb.hessian(f), x)
    s = np.exp(A.numpy() @ x - np.log(np.exp(A.numpy() @ x).sum()))
    want = A.numpy().T @ (np.diag(s) - np.outer(s, s)) @ A.numpy()
    np.testing.assert_allclose(H.numpy(), want, atol=1e-12)
    assert nodes and all(len(n.outputs[0].shape) <= 2 for n in nodes), \
        [n.outputs[0].shape for n in nodes]


def test_vmap_of_vmap():
    X, Y = r(3, 4, 5), r(4, 5)
    f = lambda x, y: (x * y).sum() + nb.tanh(x).mean()  # noqa: E731
    got = nb.vmap(nb.vmap(f, in_axes=(0, 0)), in_axes=(0, None))(nb.tensor(X), nb.tensor(Y))
    want = np.array([[(X[i, j] * Y[j]).sum() + np.tanh(X[i, j]).mean() for j in range(4)]
                     for i in range(3)])
    np.testing.assert_allclose(got.numpy(), want, atol=1e-12)
    # a closure over the outer example
    got = nb.vmap(lambda x: nb.vmap(lambda y: x * y)(nb.tensor(Y[:, 0])))(nb.tensor(X[:, 0, 0]))
    np.testing.assert_allclose(got.numpy(), X[:, 0, 0, None] * Y[None, :, 0], atol=1e-12)


def test_vmap_of_jacobian_and_hessian():
    X = r(4, 3)
    w = nb.tensor(r(3, 3))
    f = lambda x: nb.tanh(x @ w) * x  # noqa: E731
    J = nb.vmap(nb.jacobian(f))(nb.tensor(X))
    g = lambda x: (nb.tanh(x @ w) ** 2).sum()  # noqa: E731
    H = nb.vmap(nb.hessian(g))(nb.tensor(X))
    for b in range(4):
        np.testing.assert_allclose(J.numpy()[b], nb.jacobian(f)(nb.tensor(X[b])).numpy(),
                                   atol=1e-12)
        np.testing.assert_allclose(H.numpy()[b], nb.hessian(g)(nb.tensor(X[b])).numpy(),
                                   atol=1e-11)


def test_jacobian_and_hessian_use_vmap_and_match_the_row_loop():
    from nbgrad import functional as F
    w = nb.tensor(r(6, 6))
    f = lambda x: nb.softmax(nb.tanh(x @ w), -1)  # noqa: E731
    g = lambda x: (nb.tanh(x @ w) ** 3).sum()  # noqa: E731
    x = nb.tensor(r(6))
    fast = nb.jacobian(f)(x), nb.hessian(g)(x)
    saved = F._VMAP[:]
    F._VMAP[:] = []
    try:
        slow = nb.jacobian(f)(x), nb.hessian(g)(x)
    finally:
        F._VMAP[:] = saved
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-12)


def test_jacobian_in_chunks(monkeypatch):
    from nbgrad import functional as F
    w = nb.tensor(r(7, 5))
    f = lambda x: nb.tanh(w @ x) * 2  # noqa: E731
    x = nb.tensor(r(5))
    want = nb.jacobian(f)(x).numpy()
    monkeypatch.setattr(F, "JACOBIAN_CHUNK_ELEMENTS", 30)  # 30 // (7 + 5): 2 rows a time
    np.testing.assert_allclose(nb.jacobian(f)(x).numpy(), want, atol=1e-14)
    h = nb.hessian(lambda x: (nb.tanh(w @ x) ** 3).sum())(x)
    monkeypatch.setattr(F, "JACOBIAN_CHUNK_ELEMENTS", 2 ** 24)
    np.testing.assert_allclose(h.numpy(), nb.hessian(lambda x: (nb.tanh(w @ x) ** 3).sum())(x)
                               .numpy(), atol=1e-12)


def test_jacobian_falls_back_to_rows_for_an_op_without_a_rule(monkeypatch):
    w = nb.tensor(r(4, 4))
    f = lambda x: nb.softmax(x @ w, 0) * x  # noqa: E731
    x = nb.tensor(r(4))
    want = nb.jacobian(f)(x).numpy()
    softmax = REGISTRY["softmax"]
    monkeypatch.setattr(softmax, "kind", dataclasses.replace(softmax.kind, batch=None))
    with pytest.raises(BatchingError, match="no batching rule for op 'softmax'"):
        nb.vmap(f)(nb.tensor(r(2, 4)))
    np.testing.assert_allclose(nb.jacobian(f)(x).numpy(), want, atol=1e-12)

    class Peek(nb.autograd.Function):  # a backward that reads the gradient's values
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return nb.tensor(g.numpy() * 2)

    J = nb.jacobian(lambda a: Peek.apply(a) * a)(x)
    np.testing.assert_allclose(J.numpy(), np.diag(4 * x.numpy()), atol=1e-12)


def test_compositions_with_jit_and_forward_mode():
    w = nb.tensor(r(4, 4))
    f = lambda x: nb.tanh(x @ w) * x  # noqa: E731
    g = lambda x: (nb.tanh(x @ w) ** 3).sum()  # noqa: E731
    x = nb.tensor(r(4))
    for transform, fn in ((nb.jacobian, f), (nb.hessian, g)):
        j = nb.jit(transform(fn))
        j(x)
        np.testing.assert_allclose(j(x).numpy(), transform(fn)(x).numpy(), atol=1e-12)
    X, T = nb.tensor(r(3, 4)), nb.tensor(r(3, 4))
    ref = np.stack([nb.jvp(f, (X[i],), (T[i],))[1].numpy() for i in range(3)])
    np.testing.assert_allclose(nb.jvp(nb.vmap(f), (X,), (T,))[1].numpy(), ref, atol=1e-12)
    got = nb.vmap(lambda a, b: nb.jvp(f, (a,), (b,))[1])(X, T)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-12)


def test_loops_inside_vmap():
    X = r(4, 3)
    f = lambda x: nb.fori_loop(0, 5, lambda i, c: nb.tanh(c) * x + i, x)  # noqa: E731
    _check(f, X)
    jf = nb.jit(nb.vmap(f))
    np.testing.assert_allclose(jf(nb.tensor(X)).numpy(), _loop(f, 0, X), atol=1e-12)
    s = lambda x: nb.scan(lambda c, r: (c * r, c.sum()), x, nb.tensor(r_xs))  # noqa: E731
    r_xs = r(6, 3)
    _check(nb.jit(s), X)


def test_loop_carry_becomes_batched_and_differentiates():
    X = r(4, 3)
    f = lambda x: nb.fori_loop(0, 3, lambda i, c: c * 0.5 + x * i, nb.zeros(3))  # noqa: E731
    _check(f, X)
    g = nb.grad(lambda X: (nb.vmap(f)(X) ** 2).sum())(nb.tensor(X))
    want = nb.grad(lambda X: sum((f(X[i]) ** 2).sum() for i in range(4)))(nb.tensor(X))
    np.testing.assert_allclose(g.numpy(), want.numpy(), atol=1e-12)
    s = lambda x: nb.scan(lambda c, q: (c + q * x, c.sum()), nb.zeros(3),  # noqa: E731
                          nb.tensor(np.ones((5, 3))), reverse=True)
    _check(s, X)
    j = nb.jit(nb.vmap(s))
    j(nb.tensor(X))
    got = j(nb.tensor(X))
    np.testing.assert_allclose(got[1].numpy(), _loop(s, 0, X)[1], atol=1e-12)
    assert sum(n.op == "loop" for n in next(iter(j._cache.values())).graph.nodes) == 1


def test_dynamic_indexing_with_a_batched_index():
    W, V = r(5, 4), r(5, 4)
    idx = np.array([2, 0, 4, -1, 3])
    f = lambda i, w: w[i] * 2 + nb.dynamic_slice(w, (i, nb.tensor(1)), (2, 2)).sum()  # noqa: E731
    _check(f, idx, W, in_axes=(0, None))
    g = nb.grad(lambda w, i: (f(i, w) ** 2).sum())
    _check(g, W, idx, in_axes=(None, 0))
    u = lambda i, w, v: w.at[i].set(v) * 1.5  # noqa: E731
    _check(u, idx, W, V, in_axes=(0, None, 0))
    _check(u, np.array(1), np.stack([W] * 5), V, in_axes=(None, 0, 0))
    # out of range, the window clamps as jax.lax.dynamic_slice's
    got = nb.vmap(lambda i, w: nb.dynamic_slice(w, (i, nb.tensor(0)), (2, 4)),
                  in_axes=(0, None))(nb.tensor(np.array([7, -9])), nb.tensor(W))
    np.testing.assert_allclose(got.numpy(), np.stack([W[3:5], W[0:2]]))


# ------------------------------------------------------------------ JAX as the oracle
def test_matches_jax_vmap():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    x, y, w = r(5, 3, 4), r(4, 2), r(5, 4)
    got = nb.vmap(lambda a, b, c: nb.softmax(a @ b, 0).sum(-1) * (c ** 2).sum(),
                  in_axes=(0, None, 0))(nb.tensor(x), nb.tensor(y), nb.tensor(w))
    want = jax.vmap(lambda a, b, c: jax.nn.softmax(a @ b, 0).sum(-1) * (c ** 2).sum(),
                    in_axes=(0, None, 0))(x, y, w)
    np.testing.assert_allclose(got.numpy(), np.asarray(want), atol=1e-12)
    per = nb.vmap(nb.grad(lambda v, a: nb.tanh(a @ v).sum()), in_axes=(None, 0))(
        nb.tensor(r_w := r(4)), nb.tensor(x))
    jper = jax.vmap(jax.grad(lambda v, a: jnp.tanh(a @ v).sum()), in_axes=(None, 0))(r_w, x)
    np.testing.assert_allclose(per.numpy(), np.asarray(jper), atol=1e-12)
    got = nb.vmap(lambda a: a.T, in_axes=1, out_axes=2)(nb.tensor(x))
    want = jax.vmap(lambda a: a.T, in_axes=1, out_axes=2)(x)
    np.testing.assert_allclose(got.numpy(), np.asarray(want))
    m = r(4, 4)
    got = nb.vmap(nb.hessian(lambda v: (nb.tanh(nb.tensor(m) @ v) ** 3).sum()))(nb.tensor(w))
    want = jax.vmap(jax.hessian(lambda v: (jnp.tanh(m @ v) ** 3).sum()))(w)
    np.testing.assert_allclose(got.numpy(), np.asarray(want), atol=1e-11)
    got = nb.vmap(nb.vmap(lambda a, b: nb.logsumexp(a * b, 0), in_axes=(0, None)),
                  in_axes=(None, 0))(nb.tensor(x[0]), nb.tensor(w))
    want = jax.vmap(jax.vmap(lambda a, b: jax.scipy.special.logsumexp(a * b, 0),
                             in_axes=(0, None)), in_axes=(None, 0))(x[0], w)
    np.testing.assert_allclose(got.numpy(), np.asarray(want), atol=1e-12)


# ------------------------------------------------------------------ every op record
def _records():
    from nbgrad.testing.core import all_records
    return all_records()


def _float_outputs(result):
    result = result if isinstance(result, (tuple, list)) else (result,)
    return [o for o in result if isinstance(o, nb.Tensor)]


def _sin_loss(call):
    def loss(*xs):
        outs = [o for o in _float_outputs(call(*xs)) if o.dtype.kind == "f"]
        return sum((nb.sin(o) * o).sum() for o in outs)
    return loss


@pytest.mark.parametrize("name", sorted(_records()))
def test_every_op_record_batches_like_a_loop(name):
    """Each sample of the op's record, drawn twice, batched: every float argument mapped,
    then only the first; the outputs and the per-example gradients equal the loop's. An
    op without a rule must raise BatchingError (never a wrong result)."""
    from nbgrad.testing.core import float_tensor_call
    rec = _records()[name]
    pairs = zip(rec.samples(np.random.default_rng(1)), rec.samples(np.random.default_rng(2)),
                strict=True)
    checked = 0
    for a, b in pairs:
        call, ta = float_tensor_call(rec, a)
        _, tb = float_tensor_call(rec, b)
        if not ta or [t.shape for t in ta] != [t.shape for t in tb]:
            continue
        fns = [call]
        if rec.grad:
            fns.append(nb.grad(_sin_loss(call), argnums=tuple(range(len(ta)))))
        for fn in fns:
            for first_only in (False, True):
                axes = tuple(None if first_only and i else 0 for i in range(len(ta)))
                second = [y if ax == 0 else x for x, y, ax in zip(ta, tb, axes, strict=True)]
                try:
                    want = [_float_outputs(fn(*ta)), _float_outputs(fn(*second))]
                except Exception:  # a sample the function refuses (e.g. a domain error)
                    continue
                args = [nb.stack([x, y]) if ax == 0 else x
                        for x, y, ax in zip(ta, tb, axes, strict=True)]
                try:
                    got = _float_outputs(nb.vmap(fn, in_axes=axes)(*args))
                except BatchingError:  # the clear error of a case without a rule
                    continue
                for g, w0, w1 in zip(got, *want, strict=True):
                    np.testing.assert_allclose(g.numpy(), np.stack([w0.numpy(), w1.numpy()]),
                                               rtol=1e-8, atol=1e-8, equal_nan=True)
                checked += 1
    if not checked:
        pytest.skip(f"{name}: no sample with float arguments, or no batching rule")


# ------------------------------------------------------------------ random graphs
def test_random_elementwise_reduction_graphs():
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    unary = [nb.sin, nb.tanh, nb.exp, lambda t: t * t, nb.abs]
    binary = [nb.add, nb.mul, nb.maximum, nb.sub]

    @hyp.settings(max_examples=25, deadline=None)
    @hyp.given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 3)),
                        min_size=1, max_size=6), st.integers(1, 4))
    def run(prog, size):
        def f(x, y):
            vals = [x, y]
            for kind, k, j in prog:
                a = vals[j % len(vals)]
                if kind == 0:
                    vals.append(unary[k % len(unary)](a))
                elif kind == 1:
                    vals.append(binary[k % len(binary)](a, vals[(j + 1) % len(vals)]))
                elif kind == 2:
                    vals.append(a.sum(-1, keepdim=True) if a.ndim else a)
                else:
                    vals.append(a.mean() * vals[0])
            return vals[-1]
        X = RNG.uniform(-1, 1, (size, 2, 3))
        Y = RNG.uniform(-1, 1, (3,))
        _check(f, X, Y, in_axes=(0, None))
    run()


@pytest.mark.parametrize("op", [
    lambda s: nb.sort(s, 0, True).values, lambda s: nb.cumsum(s, 0),
    lambda s: nb.cumprod(s, 0), lambda s: nb.softmax(s, 0), lambda s: nb.log_softmax(s, 0),
    lambda s: nb.logsumexp(s, 0), lambda s: nb.topk(s, 1, 0).values,
    lambda s: nb.gather(s, 0, nb.tensor(0)), lambda s: nb.amax(s, 0)])
def test_ops_along_a_dim_of_a_0d_value_and_their_gradients(op):
    """A 0-d value has a virtual dim 0 (NumPy, PyTorch); batched it is ``(B,)``, and the
    rule (forward, and backward ops such as gather_backward with their output sizes)
    must flatten it to ``(B, 1)`` (found by the fuzzer: sort of a sum under vmap(grad))."""
    f = lambda x: (op((x * x).sum()) * 3.0).sum()  # noqa: E731
    xs = nb.tensor(r(3, 2))
    got = nb.vmap(nb.grad(f))(xs).numpy()
    want = np.stack([nb.grad(f)(nb.tensor(xs.numpy()[b])).numpy() for b in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-12)
