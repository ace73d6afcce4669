"""nbgrad.fft and ComplexTensor: values against np.fft (and torch.fft where installed),
first and second order gradients, both jit tiers against eager, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.autograd import gradcheck, gradgradcheck

pytest.importorskip("rocket_fft")
fft = nb.fft
NORMS = (None, "ortho", "forward")


def _rng():
    return np.random.default_rng(14)


def _c(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


# ------------------------------------------------------------------ values vs np.fft
# (name, input is complex, input shape, nbgrad kwargs, numpy kwargs)
VALUE_CASES = [
    ("fft", True, (5,), {}, {}),
    ("fft", True, (3, 6), {"dim": 0}, {"axis": 0}),
    ("fft", False, (4, 6), {"n": 9}, {"n": 9}),
    ("fft", True, (4, 6), {"n": 3, "axis": 0}, {"n": 3, "axis": 0}),
    ("ifft", True, (7,), {}, {}),
    ("ifft", True, (2, 6), {"n": 4}, {"n": 4}),
    ("rfft", False, (7,), {}, {}),
    ("rfft", False, (3, 8), {"n": 11}, {"n": 11}),
    ("rfft", False, (6, 3), {"n": 4, "dim": 0}, {"n": 4, "axis": 0}),
    ("irfft", True, (5,), {}, {}),
    ("irfft", True, (3, 4), {"n": 7}, {"n": 7}),
    ("irfft", True, (3, 6), {"n": 4, "axis": -1}, {"n": 4, "axis": -1}),
    ("fft2", True, (3, 4, 5), {}, {}),
    ("fft2", False, (4, 5), {"s": (6, 3)}, {"s": (6, 3)}),
    ("ifft2", True, (2, 3, 4), {"dim": (0, 2)}, {"axes": (0, 2)}),
    ("rfft2", False, (3, 4, 5), {}, {}),
    ("rfft2", False, (4, 5), {"s": (3, 8)}, {"s": (3, 8)}),
    ("irfft2", True, (4, 3), {}, {}),
    ("irfft2", True, (4, 3), {"s": (5, 5)}, {"s": (5, 5)}),
    ("fftn", True, (2, 3, 4), {}, {}),
    ("fftn", True, (2, 3, 4), {"s": (5, 2)}, {"s": (5, 2), "axes": (1, 2)}),
    ("fftn", False, (2, 3, 4), {"axes": (0, 2)}, {"axes": (0, 2)}),
    ("ifftn", True, (2, 3, 4), {"dim": (1,)}, {"axes": (1,)}),
    ("rfftn", False, (2, 3, 4), {}, {}),
    ("irfftn", True, (2, 3, 4), {"s": (3, 4, 5)}, {"s": (3, 4, 5), "axes": (0, 1, 2)}),
    ("hfft", True, (3, 4), {}, {}),
    ("hfft", True, (4,), {"n": 5}, {"n": 5}),
    ("ihfft", False, (2, 5), {"n": 6}, {"n": 6}),
    ("fft", True, (0, 4), {}, {}),
    ("rfft", False, (0, 5), {}, {}),
    ("irfft", True, (2, 0, 3), {"dim": -1}, {"axis": -1}),
]


@pytest.mark.parametrize("case", VALUE_CASES, ids=lambda c: f"{c[0]}{c[2]}{c[3]}")
@pytest.mark.parametrize("norm", NORMS)
def test_values_match_numpy(case, norm):
    name, is_complex, shape, kw, np_kw = case
    rng = _rng()
    x = _c(rng, *shape) if is_complex else rng.standard_normal(shape)
    got = getattr(fft, name)(nb.tensor(x), norm=norm, **kw)
    want = getattr(np.fft, name)(x, norm=norm, **np_kw)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got.numpy()), want, rtol=1e-12, atol=1e-12)


def test_float32_gives_complex64_and_real_int_input_float64():
    x = np.arange(6, dtype=np.float32)
    z = fft.rfft(nb.tensor(x))
    assert z.dtype == np.complex64 and z.real.dtype == np.float32
    np.testing.assert_allclose(z.numpy(), np.fft.rfft(x), rtol=1e-5, atol=1e-5)
    assert fft.irfft(z).dtype == np.float32
    assert (2j * z + 1.0).dtype == np.complex64 and (z / (1 + 1j)).dtype == np.complex64
    assert fft.fft(nb.tensor(np.arange(4))).dtype == np.complex128


def test_shifts_match_numpy_and_differentiate():
    rng = _rng()
    x, r = _c(rng, 3, 4), rng.standard_normal((5, 2))
    np.testing.assert_array_equal(np.asarray(fft.fftshift(nb.tensor(x))), np.fft.fftshift(x))
    np.testing.assert_array_equal(fft.ifftshift(nb.tensor(r), dim=0).numpy(),
                                  np.fft.ifftshift(r, axes=0))
    t = nb.tensor(r, requires_grad=True)
    assert gradcheck(lambda u: fft.fftshift(u, axes=(0, 1)), (t,))


def test_matches_torch_fft():
    torch = pytest.importorskip("torch")
    rng = _rng()
    x = _c(rng, 3, 4)
    for name, kw in [("fft", {"n": 5}), ("ifft", {}), ("fftn", {"s": (2, 6)}),
                     ("irfft", {"n": 5})]:
        got = getattr(fft, name)(nb.tensor(x), norm="ortho", **kw)
        want = getattr(torch.fft, name)(torch.tensor(x), norm="ortho", **kw).numpy()
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ gradients
# (name, input is complex, shape, kwargs): every transform, odd and even, padded, cropped
GRAD_CASES = [
    ("fft", True, (5,), {}), ("fft", False, (2, 4), {"n": 6}), ("ifft", True, (4,), {"n": 3}),
    ("rfft", False, (5,), {}), ("rfft", False, (2, 6), {"n": 5, "dim": 0}),
    ("rfft", False, (4,), {"n": 7}),
    ("irfft", True, (4,), {}), ("irfft", True, (3,), {"n": 5}),
    ("irfft", True, (2, 4), {"n": 4}), ("irfft", True, (3,), {"n": 8}),
    ("fft2", True, (2, 3), {"s": (3, 2)}), ("ifft2", True, (2, 3), {}),
    ("rfft2", False, (3, 4), {}), ("irfft2", True, (3, 3), {"s": (2, 5)}),
    ("fftn", True, (2, 2, 3), {}), ("ifftn", True, (2, 3), {"s": (4,)}),
    ("hfft", True, (3,), {"n": 4}), ("ihfft2", False, (2, 3), {}),
    ("rfftn", False, (2, 3, 3), {"dim": (0, 2)}), ("irfftn", True, (2, 2, 3), {}),
]


def _as_real_fn(name, is_complex, kw, norm):
    """The transform as a function of real tensors (complex inputs/outputs as pairs)."""
    def fn(t):
        z = nb.view_as_complex(t) if is_complex else t
        out = getattr(fft, name)(z, norm=norm, **kw)
        return nb.view_as_real(out) if isinstance(out, nb.ComplexTensor) else out
    return fn


def _input(rng, is_complex, shape):
    x = rng.standard_normal(shape + ((2,) if is_complex else ()))
    return nb.tensor(x, requires_grad=True)


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: f"{c[0]}{c[2]}{c[3]}")
@pytest.mark.parametrize("norm", NORMS)
def test_gradcheck_and_gradgradcheck(case, norm):
    name, is_complex, shape, kw = case
    fn = _as_real_fn(name, is_complex, kw, norm)
    t = _input(_rng(), is_complex, shape)
    assert gradcheck(fn, (t,))
    assert gradgradcheck(fn, (t,))


@pytest.mark.parametrize("case", GRAD_CASES[::2], ids=lambda c: f"{c[0]}{c[2]}{c[3]}")
def test_gradients_match_torch(case):
    """A weighted sum of the output's pairs: the input's gradient (a complex one in
    PyTorch's convention, dL/dRe + i dL/dIm) equals torch.fft's."""
    torch = pytest.importorskip("torch")
    name, is_complex, shape, kw = case
    rng = _rng()
    x = _c(rng, *shape) if is_complex else rng.standard_normal(shape)
    z = nb.tensor(x, requires_grad=True)
    out = getattr(fft, name)(z, norm="ortho", **kw)
    pairs = nb.view_as_real(out) if isinstance(out, nb.ComplexTensor) else out
    w = rng.standard_normal(pairs.shape)
    (pairs * nb.tensor(w)).sum().backward()
    zt = torch.tensor(x, requires_grad=True)
    tkw = {("dim" if k == "axis" else k): v for k, v in kw.items()}
    out_t = getattr(torch.fft, name)(zt, norm="ortho", **tkw)
    pairs_t = torch.view_as_real(out_t) if out_t.is_complex() else out_t
    (pairs_t * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(np.asarray(z.grad.numpy()), zt.grad.resolve_conj().numpy(),
                               rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ ComplexTensor
def test_complex_tensor_arithmetic_grads_match_torch():
    torch = pytest.importorskip("torch")
    rng = _rng()
    a, b, r = _c(rng, 2, 3), _c(rng, 3), rng.standard_normal((2, 3))

    def run(lib, A, B, R):
        out = (A * B) / (B + 2.0) - R * A + (1 - 2j) * A.conj() + A / R
        loss = (out.abs() ** 2).sum() + out.angle().sum() + A.real.mean() * B.imag.sum()
        return loss + (A.sum(0) * B).real.sum() + A[1, ::2].imag.sum() \
            + A.reshape(3, 2).mean().real * 3

    za, zb = nb.tensor(a, requires_grad=True), nb.tensor(b, requires_grad=True)
    zr = nb.tensor(r, requires_grad=True)
    loss = run(nb, za, zb, zr)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    tr = torch.tensor(r, requires_grad=True)
    loss_t = run(torch, ta, tb, tr)
    loss_t.backward()
    loss.backward()
    np.testing.assert_allclose(float(loss), loss_t.item(), rtol=1e-12)
    for mine, theirs in [(za, ta), (zb, tb), (zr, tr)]:
        np.testing.assert_allclose(np.asarray(mine.grad.numpy()), theirs.grad.numpy(),
                                   rtol=1e-10, atol=1e-12)


def test_complex_tensor_basics():
    z = nb.complex(nb.tensor([1.0, 0.0]), nb.tensor([2.0, 0.0]))
    assert isinstance(z, nb.ComplexTensor) and z.shape == (2,) and z.dtype == np.complex128
    np.testing.assert_array_equal(np.asarray(z), [1 + 2j, 0])
    assert nb.view_as_real(z).shape == (2, 2)
    p = nb.tensor([[1.0, 2.0]], requires_grad=True)
    w = nb.view_as_complex(p)
    w.abs().sum().backward()  # |0| has gradient 0, as PyTorch; here |1+2i|
    np.testing.assert_allclose(p.grad.numpy(), [[1 / 5 ** 0.5, 2 / 5 ** 0.5]])
    zero = nb.tensor(np.zeros(2, complex), requires_grad=True)
    zero.abs().sum().backward()
    np.testing.assert_array_equal(zero.grad.numpy(), [0, 0])
    assert z.detach().requires_grad is False and z[..., 1].item() == 0j
    assert np.real(z).shape == (2,) and np.sum(z).item() == 1 + 2j


def test_complex_errors_are_clear():
    z = nb.tensor(np.array([1 + 1j, 2 - 1j]), requires_grad=True)
    with pytest.raises(TypeError, match="exp does not take complex tensors"):
        nb.exp(z)
    with pytest.raises(TypeError, match="matmul does not take complex tensors"):
        z.matmul(z)
    for bad in (lambda: z @ z, lambda: z ** 2, lambda: nb.tensor([1.0, 2.0]) ** z):
        with pytest.raises(TypeError, match="does not take complex tensors"):
            bad()
    np.testing.assert_array_equal((z == z.conj()).numpy(), [False, False])
    np.testing.assert_array_equal((z != np.array([1 + 1j, 0])).numpy(), [False, True])
    with pytest.raises(TypeError, match="numpy.exp is not supported on a complex tensor"):
        np.exp(z)
    np.testing.assert_allclose(np.exp(z.detach()), np.exp([1 + 1j, 2 - 1j]))
    with pytest.raises(RuntimeError, match="real scalar outputs"):
        z.sum().backward()
    with pytest.raises(TypeError, match="expects a real tensor"):
        fft.rfft(z)
    with pytest.raises(TypeError, match="shape \\(3,\\)"):
        nb.view_as_complex(nb.tensor([1.0, 2.0, 3.0]))


def test_bad_dims_and_lengths_raise_naming_the_op():
    x = nb.tensor(np.ones((3, 4)))
    with pytest.raises(IndexError, match="fft.fft: dim 2 out of range"):
        fft.fft(x, dim=2)
    with pytest.raises(ValueError, match="fft.rfft: invalid number of data points 0"):
        fft.rfft(x, n=0)
    with pytest.raises(ValueError, match="fft.irfft: invalid number of data points"):
        fft.irfft(nb.tensor(np.ones((3, 1), complex)))
    with pytest.raises(ValueError, match="fft.fft2: s .* and dims .* same length"):
        fft.fft2(x, s=(2,), dim=(0, 1))
    with pytest.raises(ValueError, match="fft.fftn: dims .* repeat"):
        fft.fftn(x, dim=(0, 0))
    with pytest.raises(ValueError, match="norm must be one of"):
        fft.fft(x, norm="bad")
    with pytest.raises(ValueError, match="fft.fft: invalid number of data points"):
        fft.fft(nb.tensor(np.ones((3, 0))))


# ------------------------------------------------------------------ nbgrad.jit
def _power_loss(x, y):
    spec = fft.rfft(x, norm="ortho")
    cross = fft.fft2(y) * fft.fft2(y).conj()
    return (spec.abs() ** 2).sum() + fft.irfft(spec * 0.5, n=7).sum() + cross.real.mean()


@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_jit_tiers_equal_eager_natively(mode):
    rng = _rng()
    x, y = nb.tensor(rng.standard_normal((2, 7))), nb.tensor(rng.standard_normal((3, 4)))
    want_v, want_g = nb.value_and_grad(_power_loss, argnums=(0, 1))(x, y)
    step = nb.jit(nb.value_and_grad(_power_loss, argnums=(0, 1)), mode=mode)
    for _ in range(2):  # the trace, then the tier's executable
        v, gs = step(x, y)
        np.testing.assert_allclose(float(v), float(want_v), rtol=1e-12)
        for g, w in zip(gs, want_g, strict=True):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10, atol=1e-12)
    if mode == "compile":
        assert "objmode(" not in step.source(x, y).split("def run_graph")[1]


def test_jit_takes_and_returns_complex_tensors():
    z = nb.tensor(_c(_rng(), 2, 4))
    jitted = nb.jit(lambda w: fft.ifft(fft.fft(w) * 2.0), mode="interpret")
    for _ in range(2):
        out = jitted(z)
        assert isinstance(out, nb.ComplexTensor)
        np.testing.assert_allclose(np.asarray(out), 2 * z.numpy(), rtol=1e-12, atol=1e-12)


def test_gradient_with_respect_to_a_complex_argument_matches_torch():
    """nb.grad of a function of a ComplexTensor (a pytree node), eager and jitted."""
    torch = pytest.importorskip("torch")
    x = _c(_rng(), 5)

    def loss(z):
        return (fft.fft(z, norm="ortho").abs() ** 2 * nb.tensor(np.arange(5.0))).sum()

    zt = torch.tensor(x, requires_grad=True)
    (torch.fft.fft(zt, norm="ortho").abs() ** 2 * torch.arange(5.0)).sum().backward()
    for g in (nb.grad(loss)(nb.tensor(x)), nb.jit(nb.grad(loss), mode="interpret")(nb.tensor(x))):
        assert isinstance(g, nb.ComplexTensor)
        np.testing.assert_allclose(np.asarray(g), zt.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_fft_ops_raise_a_clear_error_without_rocket_fft(monkeypatch):
    # cached natives would call into rocket-fft's library without compiling: without the
    # package the ops must raise before any native runs, never crash
    import sys

    from nbgrad.kernels import fft as kf

    monkeypatch.setattr(kf, "_LOADED", [])
    monkeypatch.setitem(sys.modules, "rocket_fft", None)  # import rocket_fft -> ImportError
    from nbgrad.ops import fft as ops_fft

    with pytest.raises(ImportError, match="rocket-fft"):
        ops_fft.fft_r2c(nb.tensor(np.ones((2, 4))), 1, 1.0)
    with pytest.raises(ImportError, match="rocket-fft"):
        ops_fft.fft_c2c(nb.tensor(np.ones((4, 2))), (0,), False, 1.0)
    with pytest.raises(ImportError, match="rocket-fft"):
        ops_fft.fft_c2r(nb.tensor(np.ones((3, 2))), 0, 4, 1.0)
