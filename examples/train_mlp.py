"""Train a small MLP on two interleaved spirals with nbgrad.

    python examples/train_mlp.py

The data set is synthetic and seeded: two spirals of 300 points each that wind
around each other 1.5 times, with Gaussian noise. A 2-64-64-2 MLP with tanh
activations, trained full-batch with Adam on the cross-entropy loss for 600 steps,
classifies a separately drawn test set to at least 97% accuracy in a few seconds.
Everything is nbgrad: an ``nn.Sequential`` of ``nn.Linear`` and ``nn.Tanh`` layers, the
loss jitted with ``nbgrad.jit``, ``backward()`` and ``optim.Adam`` (one fused kernel
per step).
"""

from __future__ import annotations

import time

import numpy as np

import nbgrad as nb
import nbgrad.nn.functional as F
from nbgrad import nn


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


def make_mlp(sizes: list[int], seed: int = 0) -> nn.Module:
    """``Linear -> Tanh`` for every layer but the last, Xavier-uniform weights (for tanh)
    and zero biases."""
    nb.random.seed(seed)
    layers: list[nn.Module] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        linear = nn.Linear(fan_in, fan_out)
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        with nb.no_grad():
            linear.weight.copy_(nb.random.uniform((fan_out, fan_in), -bound, bound))
            linear.bias.zero_()
        layers += [linear, nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def accuracy(model: nn.Module, x: nb.Tensor, y: nb.Tensor) -> float:
    with nb.no_grad():
        return float((nb.argmax(model(x), 1) == y).numpy().mean())


def train(steps: int = 600, lr: float = 0.01, seed: int = 0, verbose: bool = False) -> dict:
    """Train on one seeded spiral set, evaluate on another; return the figures."""
    x_train, y_train = make_spirals(seed=seed)
    x_test, y_test = make_spirals(seed=seed + 1)
    model = make_mlp([2, 64, 64, 2], seed=seed)
    opt = nb.optim.Adam(model.parameters(), lr=lr)
    # the step's forward and backward run as compiled graphs; the parameters are read at
    # every call, so the optimizer's in-place updates are seen
    loss_fn = nb.jit(lambda x, y: F.cross_entropy(model(x), y))
    start = time.perf_counter()
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(x_train, y_train)
        loss.backward()
        opt.step()
        if verbose and step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    seconds = time.perf_counter() - start
    return {"loss": loss.item(), "train_accuracy": accuracy(model, x_train, y_train),
            "test_accuracy": accuracy(model, x_test, y_test), "seconds": seconds}


if __name__ == "__main__":
    result = train(verbose=True)
    print(f"final loss {result['loss']:.4f}, train accuracy {result['train_accuracy']:.1%}, "
          f"test accuracy {result['test_accuracy']:.1%}, {result['seconds']:.1f} s")
