"""Train a small MLP on two interleaved spirals with nbgrad.

    python examples/train_mlp.py

The data set is synthetic and seeded: two spirals of 300 points each that wind
around each other 1.5 times, with Gaussian noise. A 2-64-64-2 MLP with tanh
activations, trained full-batch with Adam on the cross-entropy loss for 600 steps,
classifies a separately drawn test set to at least 97% accuracy in a few seconds.
Everything is nbgrad: ``nn.functional.linear``, ``tanh``, ``cross_entropy``,
``backward()`` and in-place parameter updates under ``no_grad()``.
"""

from __future__ import annotations

import time

import numpy as np

import nbgrad as nb
import nbgrad.nn.functional as F


def make_spirals(n_per_class: int = 300, noise: float = 0.15, seed: int = 0
                 ) -> tuple[nb.Tensor, nb.Tensor]:
    """Two interleaved spirals: points (n, 2) float64 and labels (n,) int64."""
    rng = np.random.default_rng(seed)
    turns = np.sqrt(rng.uniform(0.0, 1.0, n_per_class)) * 3.0 * np.pi
    arm = np.stack([turns * np.cos(turns), turns * np.sin(turns)], axis=1) / (3.0 * np.pi)
    points = np.concatenate([arm, -arm]) + rng.normal(0.0, noise / 3.0, (2 * n_per_class, 2))
    labels = np.repeat([0, 1], n_per_class)
    order = rng.permutation(2 * n_per_class)
    return nb.tensor(points[order]), nb.tensor(labels[order])


def init_mlp(sizes: list[int], seed: int = 0) -> list[nb.Tensor]:
    """Weights (Xavier-uniform, for tanh) and zero biases of an MLP, as leaf tensors."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        params.append(nb.tensor(rng.uniform(-bound, bound, (fan_out, fan_in)),
                                requires_grad=True))
        params.append(nb.zeros(fan_out, requires_grad=True))
    return params


def mlp(params: list[nb.Tensor], x: nb.Tensor) -> nb.Tensor:
    """Logits of the MLP: ``linear -> tanh`` for every layer but the last."""
    h = x
    for i in range(0, len(params) - 2, 2):
        h = nb.tanh(F.linear(h, params[i], params[i + 1]))
    return F.linear(h, params[-2], params[-1])


class Adam:
    """Adam (Kingma & Ba) over a list of leaf tensors, updated in place."""

    def __init__(self, params: list[nb.Tensor], lr: float = 0.01, betas=(0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.m = [nb.zeros(*p.shape) for p in params]
        self.v = [nb.zeros(*p.shape) for p in params]
        self.t = 0

    def step(self) -> None:
        b1, b2 = self.betas
        self.t += 1
        scale = self.lr * np.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
        with nb.no_grad():
            for p, m, v in zip(self.params, self.m, self.v, strict=True):
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).add_(p.grad * p.grad, alpha=1 - b2)
                p.sub_(m / (nb.sqrt(v) + self.eps), alpha=scale)
                p.grad = None


def accuracy(params: list[nb.Tensor], x: nb.Tensor, y: nb.Tensor) -> float:
    with nb.no_grad():
        return float((nb.argmax(mlp(params, x), 1) == y).numpy().mean())


def train(steps: int = 600, lr: float = 0.01, seed: int = 0, verbose: bool = False) -> dict:
    """Train on one seeded spiral set, evaluate on another; return the figures."""
    x_train, y_train = make_spirals(seed=seed)
    x_test, y_test = make_spirals(seed=seed + 1)
    params = init_mlp([2, 64, 64, 2], seed=seed)
    opt = Adam(params, lr=lr)
    start = time.perf_counter()
    for step in range(steps):
        loss = F.cross_entropy(mlp(params, x_train), y_train)
        loss.backward()
        opt.step()
        if verbose and step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    seconds = time.perf_counter() - start
    return {"loss": loss.item(), "train_accuracy": accuracy(params, x_train, y_train),
            "test_accuracy": accuracy(params, x_test, y_test), "seconds": seconds}


if __name__ == "__main__":
    result = train(verbose=True)
    print(f"final loss {result['loss']:.4f}, train accuracy {result['train_accuracy']:.1%}, "
          f"test accuracy {result['test_accuracy']:.1%}, {result['seconds']:.1f} s")
