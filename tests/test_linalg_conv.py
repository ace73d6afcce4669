"""Linear algebra, shape, convolution and pooling ops against PyTorch (values, first and
second derivatives) and their error messages. The generated tests in test_ops_table.py
check the same ops against NumPy references and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.nn.functional as F
from nbgrad import linalg

torch = pytest.importorskip("torch")
TF = torch.nn.functional


def _pair(*arrays):
    """The same float64 inputs as nbgrad and torch leaves."""
    ours = [nb.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    return ours, theirs


def _compare(f_ours, f_theirs, arrays, second_order=True, rtol=1e-10):
    """Values, gradients and (with ``second_order``) a Hessian-vector product agree."""
    rng = np.random.default_rng(0)
    ours, theirs = _pair(*arrays)
    a, b = f_ours(*ours), f_theirs(*theirs)
    np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=rtol, atol=1e-12)
    g = rng.standard_normal(b.shape)
    ga = nb.autograd.grad(a, ours, nb.tensor(g), create_graph=True)
    gb = torch.autograd.grad(b, theirs, torch.tensor(g), create_graph=True)
    for x, y in zip(ga, gb, strict=True):
        np.testing.assert_allclose(x.numpy(), y.detach().numpy(), rtol=rtol, atol=1e-12)
    if second_order:
        vs = [rng.standard_normal(x.shape) for x in arrays]
        sa = sum((x * nb.tensor(v)).sum() for x, v in zip(ga, vs, strict=True))
        sb = sum((x * torch.tensor(v)).sum() for x, v in zip(gb, vs, strict=True))
        hb = torch.autograd.grad(sb, theirs, allow_unused=True) if sb.requires_grad else \
            [None] * len(theirs)
        if not sa.requires_grad:  # a linear op: its gradient does not depend on the inputs
            assert all(y is None or not y.any() for y in hb)
            return
        ha = nb.autograd.grad(sa, ours, allow_unused=True)
        for x, y in zip(ha, hb, strict=True):
            if x is None or y is None:  # no dependence on one side: the other must be zero
                assert (x is None or not x.numpy().any()) and (y is None or not y.any())
            else:
                np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=rtol, atol=1e-12)


RNG = np.random.default_rng(42)


def _r(*shape):
    return RNG.standard_normal(shape)


def _spd(n, *batch):
    a = RNG.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


# ------------------------------------------------------------------ linear algebra
@pytest.mark.parametrize(("eq", "shapes"), [
    ("ij,jk->ik", [(3, 4), (4, 2)]),
    ("bij,bkj->bik", [(2, 3, 4), (2, 5, 4)]),
    ("ii->i", [(3, 3)]),
    ("ij,ij", [(2, 3), (2, 3)]),
    ("...ij,...j", [(2, 3, 4), (4,)]),
    ("ij,jk,kl->li", [(2, 3), (3, 2), (2, 4)]),
])
def test_einsum_matches_torch(eq, shapes):
    _compare(lambda *a: nb.einsum(eq, *a), lambda *a: torch.einsum(eq, *a),
             [_r(*s) for s in shapes])


def test_linalg_matches_torch():
    A, B = _spd(3, 2), _r(2, 3, 2)
    _compare(linalg.inv, torch.linalg.inv, [A])
    _compare(linalg.det, torch.linalg.det, [_r(3, 3) + 3 * np.eye(3)])
    _compare(lambda a: linalg.slogdet(a)[1], lambda a: torch.linalg.slogdet(a)[1], [A])
    _compare(linalg.solve, torch.linalg.solve, [A, B])
    _compare(linalg.solve, torch.linalg.solve, [A, _r(3)])
    _compare(lambda a: linalg.cholesky(a.mT @ a + nb.eye(3, dtype="float64")),
             lambda a: torch.linalg.cholesky(a.mT @ a + torch.eye(3, dtype=torch.float64)),
             [_r(3, 3)])
    _compare(lambda a, b: linalg.solve_triangular(a, b, upper=True, left=False),
             lambda a, b: torch.linalg.solve_triangular(a, b, upper=True, left=False),
             [np.triu(_r(3, 3)) + 3 * np.eye(3), _r(2, 3)])
    _compare(nb.trace, torch.trace, [_r(3, 4)])
    _compare(lambda x: nb.diag(x, 1), lambda x: torch.diag(x, 1), [_r(3, 4)])
    _compare(lambda x: nb.diagonal(x, -1, 0, 2), lambda x: torch.diagonal(x, -1, 0, 2),
             [_r(3, 2, 4)])
    _compare(nb.outer, torch.outer, [_r(3), _r(4)])


def test_slogdet_sign_carries_no_gradient():
    sign, logabs = linalg.slogdet(nb.tensor(-_spd(3), requires_grad=True))
    assert sign.item() == -1.0 and not sign.requires_grad and logabs.requires_grad
    assert isinstance(linalg.slogdet(nb.tensor(_spd(2))), linalg.SlogdetResult)


def test_linalg_errors():
    singular = nb.tensor(np.ones((3, 3)))
    with pytest.raises(linalg.LinAlgError, match="linalg.inv"):
        linalg.inv(singular)
    with pytest.raises(linalg.LinAlgError, match="linalg.solve"):
        linalg.solve(singular, nb.tensor(np.ones(3)))
    with pytest.raises(linalg.LinAlgError, match="linalg.cholesky"):
        linalg.cholesky(nb.tensor(-np.eye(2)))
    assert issubclass(linalg.LinAlgError, RuntimeError)
    assert linalg.det(singular).item() == pytest.approx(0.0)
    with pytest.raises(RuntimeError, match=r"linalg.inv: expects a square matrix .* \(2, 3\)"):
        linalg.inv(nb.tensor(np.ones((2, 3))))
    with pytest.raises(RuntimeError, match="linalg.solve: A of shape"):
        linalg.solve(nb.tensor(np.eye(3)), nb.tensor(np.ones((4, 2))))
    with pytest.raises(RuntimeError, match="einsum: equation 'ij,jk' names 2 operand"):
        nb.einsum("ij,jk", nb.tensor(np.ones((2, 2))))
    with pytest.raises(RuntimeError, match="einsum: subscript 'j' has sizes 3 and 4"):
        nb.einsum("ij,jk", nb.tensor(np.ones((2, 3))), nb.tensor(np.ones((4, 2))))
    with pytest.raises(RuntimeError, match="einsum: invalid subscript"):
        nb.einsum("i1->i", nb.tensor(np.ones((2, 2))))
    with pytest.raises(RuntimeError, match="einsum: output subscript 'k'"):
        nb.einsum("ij->k", nb.tensor(np.ones((2, 2))))


def test_linalg_namespace_and_float32():
    assert nb.linalg.inv is linalg.inv
    a = nb.tensor(_spd(3).astype(np.float32))
    assert linalg.inv(a).dtype == np.float32
    assert linalg.cholesky(a).dtype == np.float32
    assert nb.einsum("ij,jk", a, a).dtype == np.float32
    np.testing.assert_allclose(nb.inverse(a).numpy() @ a.numpy(), np.eye(3), atol=1e-5)


# ------------------------------------------------------------------ shape ops
def test_shape_ops_match_torch():
    x = _r(2, 3, 4)
    _compare(lambda a: a.flip(0, 2), lambda a: a.flip(0, 2), [x])
    _compare(lambda a: a.roll((1, -1), (0, 2)), lambda a: a.roll((1, -1), (0, 2)), [x])
    _compare(lambda a: a.repeat(2, 1, 1, 2), lambda a: a.repeat(2, 1, 1, 2), [x])
    _compare(lambda a: a.tile(3), lambda a: a.tile((3,)), [x])
    _compare(lambda a: a.tril(-1) + a.triu(2), lambda a: a.tril(-1) + a.triu(2), [x])
    _compare(lambda a: a.chunk(3, 2)[1], lambda a: a.chunk(3, 2)[1], [x])
    pad = (2, 1, 1, 0)
    for mode in ("constant", "reflect", "replicate", "circular"):
        _compare(lambda a, m=mode: nb.pad(a, pad, mode=m),
                 lambda a, m=mode: TF.pad(a, pad, mode=m), [x])
    _compare(lambda a: nb.pad(a, (-1, 2), value=1.5), lambda a: TF.pad(a, (-1, 2), value=1.5),
             [x])


def test_shape_op_errors():
    x = nb.tensor(np.ones((2, 3)))
    with pytest.raises(RuntimeError, match="repeat: 1 repeats cannot be fewer"):
        x.repeat(2)
    with pytest.raises(RuntimeError, match="pad: the padding"):
        nb.pad(x, (1, 1, 1))
    with pytest.raises(RuntimeError, match="pad: reflect padding"):
        nb.pad(x, (3, 0), mode="reflect")
    with pytest.raises(ValueError, match="pad: mode"):
        nb.pad(x, (1, 1), mode="wrap")
    with pytest.raises(RuntimeError, match="tril: expects a tensor of at least 2"):
        nb.tril(nb.tensor([1.0]))
    with pytest.raises(RuntimeError, match="roll: shifts"):
        x.roll((1, 2), 0)
    with pytest.raises(ValueError, match="chunk: chunks must be a positive int"):
        x.chunk(0)
    with pytest.raises(IndexError, match="flip: dim 2"):
        x.flip(2)


# ------------------------------------------------------------------ convolution, pooling
@pytest.mark.parametrize("kw", [
    {},
    {"stride": 2, "padding": 1},
    {"stride": (1, 2), "padding": (2, 0), "dilation": (2, 1)},
    {"groups": 2, "padding": "same"},
])
@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_conv2d_matches_torch_to_second_order(kw):
    x, w, b = _r(2, 4, 6, 5), _r(6, 4 // kw.get("groups", 1), 3, 2), _r(6)
    _compare(lambda x, w, b: F.conv2d(x, w, b, **kw), lambda x, w, b: TF.conv2d(x, w, b, **kw),
             [x, w, b])


def test_conv1d_matches_torch():
    _compare(lambda x, w: F.conv1d(x, w, stride=2, padding=1, dilation=2),
             lambda x, w: TF.conv1d(x, w, stride=2, padding=1, dilation=2),
             [_r(2, 3, 11), _r(4, 3, 3)])


@pytest.mark.parametrize("kw", [
    {"kernel_size": 2},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": (2, 3), "stride": 2, "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
     "count_include_pad": False},
])
def test_pooling_matches_torch(kw):
    x = _r(2, 3, 7, 6)
    _compare(lambda a: F.avg_pool2d(a, **kw), lambda a: TF.avg_pool2d(a, **kw), [x])
    kw = {k: v for k, v in kw.items() if k != "count_include_pad"}
    _compare(lambda a: F.max_pool2d(a, **kw), lambda a: TF.max_pool2d(a, **kw), [x])


def test_conv_float32_and_errors():
    x = nb.tensor(_r(1, 2, 5, 5).astype(np.float32))
    w = nb.tensor(_r(3, 2, 3, 3).astype(np.float32))
    assert F.conv2d(x, w).dtype == np.float32
    assert F.max_pool2d(F.conv2d(x, w), 2).shape == (1, 3, 1, 1)
    with pytest.raises(RuntimeError, match="conv2d: 2 input channels and 3 output channels"):
        F.conv2d(x, nb.tensor(np.ones((3, 1, 3, 3), np.float32)))
    with pytest.raises(RuntimeError, match="conv2d: the kernel .* is larger than the input"):
        F.conv2d(x, nb.tensor(np.ones((3, 2, 6, 6), np.float32)))
    with pytest.raises(RuntimeError, match="conv2d: bias must have shape"):
        F.conv2d(x, w, nb.tensor(np.ones(2, np.float32)))
    with pytest.raises(RuntimeError, match="max_pool2d: padding"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(RuntimeError, match="avg_pool2d: expects a 3-D"):
        F.avg_pool2d(nb.tensor(np.ones((5, 5))), 2)


def test_conv_and_pool_kernel_variants_agree():
    """The direct-loop conv (timed by perf/cnn_step.py) and the 2x2 max-pool fast path give
    what the general kernels give, NaN and ties included."""
    from nbgrad.kernels import conv as ck

    x = _r(2, 4, 7, 6)
    w = _r(6, 2, 3, 2)
    a = np.empty((2, 6, 4, 5))
    b = np.empty_like(a)
    ck.conv2d_forward(x, w, 2, 1, 1, 1, 1, 2, 2, a)
    ck.conv2d_direct(x, w, 2, 1, 1, 1, 1, 2, 2, b)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    planes = _r(3, 7, 6)
    planes[0, 0, :2] = np.nan
    planes[1, 2:4, 2:4] = 1.0
    out = [np.empty((3, 3, 3)) for _ in range(2)]
    idx = [np.empty((3, 3, 3), np.int64) for _ in range(2)]
    ck.max_pool2d_forward(planes, 2, 2, 2, 2, 0, 0, 1, 1, out[0], idx[0])
    ck.max_pool2d_2x2(planes, out[1], idx[1])
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(idx[0], idx[1])
    assert np.isnan(out[1][0, 0, 0]) and idx[1][0, 0, 0] == 1  # the last NaN, as torch
    assert idx[1][1, 1, 1] == 2 * 6 + 2  # a tie: the first maximum in the window
