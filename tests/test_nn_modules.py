"""``nbgrad.nn`` modules and ``nbgrad.optim`` (issue 14 item 4): the Module tree and its
state dicts, the layers against NumPy, the optimizers against reference updates written
out here (and against PyTorch where it is installed), one kernel call per parameter
group, and training under ``nbgrad.jit`` equal to eager training."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.optim import kernels as optim_kernels

nn, optim, F = nb.nn, nb.optim, nb.nn.functional


def _mlp(seed: int = 0) -> nn.Module:
    nb.random.seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def _data(seed: int = 1, n: int = 16):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    return nb.tensor(x), nb.tensor((x[:, 0] + x[:, 1] > 0).astype(np.int64))


# ------------------------------------------------------------------ the Module tree
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("scale", nb.ones(4), persistent=False)
        self.extra = [1, 2]  # a plain attribute

    def forward(self, x):
        return self.norm(self.proj(x)) * self.scale


def test_module_finds_parameters_buffers_and_children_by_dotted_name():
    model = nn.Sequential(Block(), nn.ReLU(), nn.Linear(4, 1))
    assert [n for n, _ in model.named_parameters()] == [
        "0.proj.weight", "0.proj.bias", "0.norm.weight", "0.norm.bias", "2.weight", "2.bias"]
    assert list(model.state_dict()) == [
        "0.proj.weight", "0.proj.bias", "0.norm.weight", "0.norm.bias", "0.norm.running_mean",
        "0.norm.running_var", "0.norm.num_batches_tracked", "2.weight", "2.bias"]
    assert [n for n, _ in model.named_buffers()][0] == "0.scale"  # a buffer, not persistent
    assert len(list(model.modules())) == 6
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in model.parameters())
    shared = nn.Linear(2, 2)
    twice = nn.Sequential(shared, shared)
    assert len(list(twice.parameters())) == 2  # a shared layer's parameters once


def test_module_attribute_rules():
    block = Block()
    with pytest.raises(TypeError, match="cannot assign Tensor as parameter 'weight'"):
        block.proj.weight = nb.ones(4, 4)
    block.proj.bias = None
    assert "proj.bias" not in block.state_dict()
    with pytest.raises(AttributeError, match="call super"):
        class Bad(nn.Module):
            def __init__(self):
                self.w = nn.Parameter(nb.ones(2))
        Bad()
    assert "Linear(in_features=4, out_features=4, bias=False)" in repr(block)


def test_train_eval_switch_every_module():
    model = nn.Sequential(Block(), nn.Dropout(0.5))
    model.eval()
    assert not any(m.training for m in model.modules())
    x = nb.tensor(np.random.default_rng(0).normal(size=(3, 4)))
    np.testing.assert_array_equal(model(x).numpy(), model(x).numpy())  # no dropout in eval
    model.train()
    assert all(m.training for m in model.modules())


def test_state_dict_round_trips_through_npz(tmp_path):
    model = _mlp(0)
    other = _mlp(1)
    assert not np.allclose(model[0].weight.numpy(), other[0].weight.numpy())
    nn.save(model.state_dict(), tmp_path / "model.npz")
    loaded = nn.load(tmp_path / "model.npz")
    weight = other[0].weight
    missing, unexpected = other.load_state_dict(loaded)
    assert (missing, unexpected) == ([], [])
    assert other[0].weight is weight  # loaded in place
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(KeyError, match=r"missing keys \['2.bias'\]"):
        other.load_state_dict({k: v for k, v in loaded.items() if k != "2.bias"})
    with pytest.raises(ValueError, match="'0.weight' has shape"):
        other.load_state_dict({**loaded, "0.weight": np.zeros((2, 2))})


# ------------------------------------------------------------------ layers
def test_linear_conv_embedding_layernorm_match_numpy():
    nb.random.seed(3)
    rng = np.random.default_rng(3)
    lin = nn.Linear(3, 2)
    x = rng.normal(size=(4, 3))
    np.testing.assert_allclose(lin(nb.tensor(x)).numpy(),
                               x @ lin.weight.numpy().T + lin.bias.numpy(), rtol=1e-13)
    assert np.abs(lin.weight.numpy()).max() <= 1 / np.sqrt(3)  # PyTorch's init bound
    conv = nn.Conv2d(2, 3, 3, padding=1)
    img = rng.normal(size=(1, 2, 5, 5))
    got = conv(nb.tensor(img)).numpy()
    padded = np.pad(img, ((0, 0), (0, 0), (1, 1), (1, 1)))
    w = conv.weight.numpy()
    want = np.zeros((1, 3, 5, 5))
    for i in range(5):
        for j in range(5):
            want[0, :, i, j] = np.einsum("ckl,ockl->o", padded[0, :, i:i + 3, j:j + 3], w)
    np.testing.assert_allclose(got, want + conv.bias.numpy()[None, :, None, None], rtol=1e-12)
    emb = nn.Embedding(5, 2, padding_idx=0)
    np.testing.assert_array_equal(emb.weight.numpy()[0], 0.0)
    np.testing.assert_array_equal(emb(nb.tensor([3, 0])).numpy(), emb.weight.numpy()[[3, 0]])
    ln = nn.LayerNorm(3)
    y = ln(nb.tensor(x)).numpy()
    np.testing.assert_allclose(y, (x - x.mean(1, keepdims=True))
                               / np.sqrt(x.var(1, keepdims=True) + 1e-5), rtol=1e-12)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_running_statistics(momentum):
    rng = np.random.default_rng(4)
    bn = nn.BatchNorm2d(3, momentum=momentum)
    batches = [rng.normal(1.0, 2.0, size=(4, 3, 2, 2)) for _ in range(3)]
    mean, var = np.zeros(3), np.ones(3)
    for k, b in enumerate(batches, 1):
        y = bn(nb.tensor(b)).numpy()
        mu, v = b.mean((0, 2, 3)), b.var((0, 2, 3))
        np.testing.assert_allclose(y, (b - mu[:, None, None]) / np.sqrt(v[:, None, None] + 1e-5),
                                   rtol=1e-10, atol=1e-12)
        f = 1.0 / k if momentum is None else momentum
        mean = (1 - f) * mean + f * mu
        var = (1 - f) * var + f * b.var((0, 2, 3), ddof=1)
    np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.numpy(), var, rtol=1e-12)
    assert int(bn.num_batches_tracked.numpy()) == 3
    bn.eval()
    b = batches[0]
    np.testing.assert_allclose(bn(nb.tensor(b)).numpy(),
                               (b - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5),
                               rtol=1e-12)


def test_batchnorm_training_under_jit_raises_and_eval_runs():
    bn = nn.BatchNorm1d(3)
    x = nb.tensor(np.random.default_rng(5).normal(size=(4, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match="running statistics inside nbgrad.jit"):
        nb.jit(lambda x: bn(x).sum())(x)
    bn.eval()
    f = nb.jit(lambda x: bn(x).sum())
    for _ in range(3):
        np.testing.assert_allclose(float(f(x)), float(bn(x).sum()), rtol=1e-13)


# ------------------------------------------------------------------ optimizers
def _reference(kind: str, hyper: dict, params: list[np.ndarray], grads: list[list[np.ndarray]]):
    """The update rules written out (PyTorch's documented algorithms)."""
    params = [p.copy() for p in params]
    state = [dict(step=0, m=np.zeros_like(p), v=np.zeros_like(p), vmax=np.zeros_like(p),
                  buf=None) for p in params]
    for step_grads in grads:
        for p, g, s in zip(params, step_grads, state, strict=True):
            g = -g if hyper.get("maximize") else g.copy()
            s["step"] += 1
            lr, wd = hyper["lr"], hyper.get("weight_decay", 1e-2 if kind == "AdamW" else 0.0)
            if kind == "SGD":
                g = g + wd * p
                mom = hyper.get("momentum", 0.0)
                if mom:
                    s["buf"] = g.copy() if s["buf"] is None else (
                        mom * s["buf"] + (1 - hyper.get("dampening", 0.0)) * g)
                    g = g + mom * s["buf"] if hyper.get("nesterov") else s["buf"]
                p -= lr * g
                continue
            b1, b2 = hyper.get("betas", (0.9, 0.999))
            if kind == "AdamW":
                p *= 1 - lr * wd
            else:
                g = g + wd * p
            s["m"] = b1 * s["m"] + (1 - b1) * g
            s["v"] = b2 * s["v"] + (1 - b2) * g * g
            v = s["v"]
            if hyper.get("amsgrad"):
                s["vmax"] = np.maximum(s["vmax"], v)
                v = s["vmax"]
            t = s["step"]
            denom = np.sqrt(v) / np.sqrt(1 - b2 ** t) + hyper.get("eps", 1e-8)
            p -= lr / (1 - b1 ** t) * s["m"] / denom
    return params


OPTIMIZERS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, maximize=True)),
    ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.3)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.02, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.5, amsgrad=True, maximize=True)),
]


@pytest.mark.parametrize("kind,hyper", OPTIMIZERS, ids=lambda v: str(v))
def test_optimizers_follow_their_update_rules(kind, hyper):
    rng = np.random.default_rng(6)
    start = [rng.normal(size=(3, 2)), rng.normal(size=4), rng.normal(size=())]
    grads = [[rng.normal(size=p.shape) for p in start] for _ in range(5)]
    params = [nn.Parameter(p.copy()) for p in start]
    opt = getattr(optim, kind)(params, **hyper)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = nb.tensor(g)
        opt.step()
    for got, want in zip(params, _reference(kind, hyper, start, grads), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind,hyper", OPTIMIZERS[1:3] + OPTIMIZERS[5:], ids=lambda v: str(v))
def test_optimizers_match_pytorch(kind, hyper):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    start = [rng.normal(size=(3, 2)), rng.normal(size=4)]
    grads = [[rng.normal(size=p.shape) for p in start] for _ in range(6)]
    ours = [nn.Parameter(p.copy()) for p in start]
    theirs = [torch.tensor(p.copy(), requires_grad=True) for p in start]
    opt = getattr(optim, kind)(ours, **hyper)
    topt = getattr(torch.optim, kind)(theirs, **hyper, foreach=False)
    for step_grads in grads:
        for p, t, g in zip(ours, theirs, step_grads, strict=True):
            p.grad, t.grad = nb.tensor(g), torch.tensor(g)
        opt.step()
        topt.step()
    for p, t in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=1e-14, atol=1e-15)


def test_one_kernel_call_per_parameter_group(monkeypatch):
    calls = []
    real = optim_kernels.adam_step
    monkeypatch.setattr(optim_kernels, "adam_step", lambda *a: calls.append(a) or real(*a))
    model = _mlp()
    opt = optim.Adam([{"params": model[0].parameters()},
                      {"params": model[2].parameters(), "lr": 0.1}])
    x, y = _data()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    assert len(calls) == 2  # two groups of two parameters each
    assert calls[0][0].size == 3 * 8 + 8 and calls[1][0].size == 8 * 2 + 2
    assert model[0].weight._data.base is calls[0][0]  # parameters live in the flat buffer


def test_parameters_without_gradient_are_left_alone():
    a, b = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(3))
    opt = optim.Adam([a, b], lr=0.1)
    a.grad = nb.tensor(np.ones(2))
    opt.step()
    np.testing.assert_array_equal(b.numpy(), 1.0)
    assert opt.state_dict()["state.1.step"] == 0 and opt.state_dict()["state.0.step"] == 1


def test_optimizer_state_round_trips_and_resumes_exactly(tmp_path):
    x, y = _data()

    def train(model, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

    model = _mlp()
    opt = optim.AdamW(model.parameters(), lr=0.05)
    train(model, opt, 6)
    straight = [p.numpy().copy() for p in model.parameters()]

    model = _mlp()
    opt = optim.AdamW(model.parameters(), lr=0.05)
    train(model, opt, 3)
    nn.save(model.state_dict(), tmp_path / "m.npz")
    nn.save(opt.state_dict(), tmp_path / "o.npz")
    model = _mlp(seed=9)
    opt = optim.AdamW(model.parameters(), lr=0.5)
    model.load_state_dict(nn.load(tmp_path / "m.npz"))
    opt.load_state_dict(nn.load(tmp_path / "o.npz"))
    assert opt.param_groups[0]["lr"] == 0.05
    train(model, opt, 3)
    for got, want in zip(model.parameters(), straight, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)


def test_optimizer_follows_a_dtype_change_and_refuses_bad_groups():
    model = _mlp()
    opt = optim.SGD(model.parameters(), lr=0.1)
    model.float()
    x, y = _data()
    F.cross_entropy(model(nb.tensor(x.numpy().astype(np.float32))), y).backward()
    opt.step()
    assert model[0].weight.dtype == np.float32
    with pytest.raises(TypeError, match="share one floating dtype"):
        optim.SGD([nn.Parameter(np.ones(2)), nn.Parameter(np.ones(2, np.float32))])
    with pytest.raises(ValueError, match="more than one group"):
        w = nn.Parameter(np.ones(2))
        optim.SGD([{"params": [w]}, {"params": [w]}])
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(model.parameters(), betas=(1.0, 0.9))


# ------------------------------------------------------------------ under nbgrad.jit
@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_training_under_jit_equals_eager(mode):
    x, y = _data()

    def run(jitted: bool):
        model = nn.Sequential(nn.Linear(3, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 2))
        nb.random.seed(0)
        for p in model.parameters():
            p._data[...] = nb.random.normal(p.shape).numpy()
        opt = optim.Adam(model.parameters(), lr=0.05)

        def loss_fn(x, y):
            return F.cross_entropy(model(x), y)

        step = nb.jit(loss_fn, mode=mode) if jitted else loss_fn
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = step(x, y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        if jitted:
            assert step.cache_info()["traces"] == 1  # parameters are read at every call
        return losses, [p.numpy().copy() for p in model.parameters()]

    want_losses, want = run(False)
    got_losses, got = run(True)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-12)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ namespaces
def test_namespaces_are_reachable_after_import_and_load_on_first_use():
    import subprocess
    import sys
    code = (
        "import sys, nbgrad as nb\n"
        "lazy = ['nbgrad.nn', 'nbgrad.optim', 'nbgrad.special', 'nbgrad.fft']\n"
        "assert not any(m in sys.modules for m in lazy), [m for m in lazy if m in sys.modules]\n"
        "assert nb.nn.functional.relu and nb.nn.Linear and nb.optim.Adam and nb.special.ndtr\n"
        "assert nb.linalg.solve and nb.fft.rfft\n"
        "print('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
