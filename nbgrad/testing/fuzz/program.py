"""Fuzz programs: leaves and steps, their values, their nbgrad source, and the builder
that runs each step while a program is drawn."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...grad_mode import no_grad
from ...tensor import Tensor
from ..core import DOMAINS
from .catalogue import DOMAIN_OK, FUZZ_OPS
from .constructs import FUNCTIONS

#: the largest value (in elements) a program keeps; bigger results are replaced
MAX_SIZE = 48
#: the smallest gap (ties, kinks, jumps) a step keeps from a non-differentiable point
GAP = 0.02


@dataclass(frozen=True)
class Leaf:
    """An input tensor: its shape and the domain its values come from (``key``: which
    draw of the program's seed gives them; by default the leaf's position)."""

    shape: tuple[int, ...]
    domain: str = "real"
    key: int | None = None


@dataclass(frozen=True)
class Step:
    """``op`` (a key of :data:`FUZZ_OPS`) applied to earlier values ``inputs``."""

    op: str
    inputs: tuple[int, ...]
    params: tuple = ()


@dataclass(frozen=True)
class Program:
    """Leaves and steps; ``program(*leaves)`` replays them with nbgrad ops.

    Values are numbered in the order of ``nodes``. The result is the last value plus,
    for every other value that no step reads, a weighted sum of it (so that every leaf
    reaches the result). ``dtype`` is the dtype of the leaves (``"float64"`` or
    ``"float32"``).
    """

    nodes: tuple
    seed: int = 0
    dtype: str = "float64"

    def leaves(self, dtype=None, requires_grad: bool = True) -> tuple[Tensor, ...]:
        """The input tensors (values drawn from each leaf's domain with ``seed``)."""
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        out = []
        for k, node in enumerate(n for n in self.nodes if isinstance(n, Leaf)):
            key = k if node.key is None else node.key
            value = leaf_value(self.seed, key, node.shape, node.domain)
            out.append(Tensor(value.astype(dtype), requires_grad=requires_grad))
        return tuple(out)

    def unread(self) -> list[int]:
        """The values (but the last) that no step reads."""
        read = {i for node in self.nodes if isinstance(node, Step) for i in node.inputs}
        return [i for i in range(len(self.nodes) - 1) if i not in read]

    def weight(self, i: int | None, shape: tuple[int, ...]) -> np.ndarray:
        """The fixed weights of unread value ``i`` (``None``: of the result, in ``loss``)."""
        key = [self.seed, 8] if i is None else [self.seed, 7, i]
        return np.random.default_rng(key).uniform(0.5, 1.5, shape)

    def __call__(self, *leaves: Tensor) -> Tensor:
        values = self.values(*leaves)
        out = values[-1]
        for i in self.unread():
            v = values[i]
            out = out + (v * _weights_for(self.weight(i, v.shape), v)).sum()
        return out

    def loss(self, *leaves: Tensor) -> Tensor:
        """A scalar: the result weighted by fixed random weights and summed."""
        out = self(*leaves)
        return (out * _weights_for(self.weight(None, out.shape), out)).sum()

    def both(self, *leaves: Tensor) -> tuple[Tensor, Tensor]:
        """``(result, loss)`` from one run."""
        out = self(*leaves)
        return out, (out * _weights_for(self.weight(None, out.shape), out)).sum()

    def values(self, *leaves: Tensor) -> list[Tensor]:
        """Every value of the program, leaves included, in order."""
        it = iter(leaves)
        values: list[Tensor] = []
        for node in self.nodes:
            if isinstance(node, Leaf):
                values.append(next(it))
            else:
                values.append(FUZZ_OPS[node.op].run([values[i] for i in node.inputs],
                                                    node.params))
        return values

    def output(self, k: int) -> Program:
        """The program cut after value ``k`` (a smaller program, for reproducers)."""
        nodes = list(self.nodes[:k + 1])
        return Program(tuple(nodes), self.seed, self.dtype)

    def __repr__(self) -> str:
        lines = ",\n    ".join(repr(n) for n in self.nodes)
        extra = "" if self.dtype == "float64" else f", dtype={self.dtype!r}"
        return f"Program(nodes=(\n    {lines},\n), seed={self.seed}{extra})"


def _weights_for(weights: np.ndarray, v: Tensor) -> np.ndarray | Tensor:
    """Weights for ``v`` in its dtype: a NumPy array on the CPU (as users write), a tensor
    on ``v``'s device elsewhere (an array would be a CPU operand there)."""
    w = weights.astype(v.dtype)
    return w if v.device == "cpu" else Tensor(w, device=v.device)


def leaf_value(seed: int, k: int, shape: tuple[int, ...], domain: str) -> np.ndarray:
    """The values of leaf ``k`` of a program with ``seed``."""
    rng = np.random.default_rng([seed, k])
    return np.asarray(DOMAINS[domain](rng, shape), dtype=np.float64)


def _array_code(a: np.ndarray) -> str:
    return f"np.array({a.tolist()!r})" if a.ndim else f"np.array({a.item()!r})"


def to_source(program: Program) -> str:
    """The program as runnable nbgrad code: ``def f(x0, ...)`` returning ``(result,
    loss)`` and ``inputs``, the leaf tensors."""
    with no_grad():
        shapes = [tuple(v.shape) for v in program.values(*program.leaves(
            requires_grad=False))]
    names: list[str] = []
    body: list[str] = []
    for i, node in enumerate(program.nodes):
        if isinstance(node, Leaf):
            names.append(f"x{len(names) - len(body)}")
            continue
        names.append(f"v{i}")
        args = [names[j] for j in node.inputs]
        body.append(f"    v{i} = {FUZZ_OPS[node.op].code(args, node.params)}")
    leaf_names = [n for n in names if n.startswith("x")]
    out = names[-1]
    dt = f"np.{program.dtype}"
    for i in program.unread():
        w = _array_code(program.weight(i, shapes[i]))
        body.append(f"    {out} = {out} + ({names[i]} * {w}.astype({dt})).sum()")
    w = _array_code(program.weight(None, shapes[-1]))
    body.append(f"    return {out}, ({out} * {w}.astype({dt})).sum()")
    used = sorted(n for n in FUNCTIONS if any(isinstance(s, Step) and s.op == n
                                              for s in program.nodes))
    head = ["import numpy as np", "", "import nbgrad as nb",
            "from nbgrad.nn import functional as F  # noqa: F401"]
    if any(isinstance(s, Step) and s.op == "unrolled" for s in program.nodes):
        head.insert(0, "import functools")
    if used:
        classes = sorted({FUNCTIONS[n][1].split(".")[0] for n in used})
        head.append(f"from nbgrad.testing.fuzz.constructs import {', '.join(classes)}")
    inputs = [f"nb.tensor({_array_code(t.numpy())}, dtype={dt}, requires_grad=True)"
              for t in program.leaves(np.float64, requires_grad=False)]
    return "\n".join(head + ["", "", f"def f({', '.join(leaf_names)}):", *body, "", "",
                             "inputs = [" + ",\n          ".join(inputs) + "]"])


# ------------------------------------------------------------------ drawing programs
class Rand:
    """The random choices of one program (a seeded NumPy generator)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng([seed, 99])

    def integers(self, lo: int, hi: int) -> int:
        """An int in ``[lo, hi]`` (both included)."""
        return int(self.rng.integers(lo, hi + 1))

    def booleans(self) -> bool:
        return bool(self.rng.integers(0, 2))

    def choice(self, options):
        return options[int(self.rng.integers(len(options)))]

    def subset(self, n: int, lo: int, hi: int) -> list[int]:
        """``lo`` to ``hi`` distinct ints of ``range(n)``, in random order."""
        return [int(v) for v in self.rng.permutation(n)[:self.integers(lo, min(hi, n))]]

    def permutation(self, n: int) -> tuple[int, ...]:
        return tuple(int(v) for v in self.rng.permutation(n))


class Builder:
    """Collects nodes while a program is drawn, running each step to know its value."""

    def __init__(self, seed: int, dtype: str = "float64") -> None:
        self.seed = seed
        self.dtype = dtype
        self.nodes: list = []
        self.values: list[np.ndarray] = []
        self.n_leaves = 0

    def leaf(self, shape: tuple[int, ...], domain: str = "real") -> int:
        self.nodes.append(Leaf(tuple(shape), domain))
        self.values.append(leaf_value(self.seed, self.n_leaves, tuple(shape), domain))
        self.n_leaves += 1
        return len(self.values) - 1

    def evaluate(self, op: str, inputs: tuple[int, ...], params: tuple) -> np.ndarray:
        with no_grad():
            xs = [Tensor(self.values[i]) for i in inputs]
            return FUZZ_OPS[op].run(xs, params).numpy()

    def add(self, op: str, inputs: tuple[int, ...], params: tuple = ()) -> int | None:
        """Append a step; None (and nothing appended) if its value is unusable."""
        value = self.evaluate(op, inputs, params)
        if value.dtype.kind != "f" or not 0 < value.size <= MAX_SIZE or \
                not np.all(np.isfinite(value)) or np.max(np.abs(value)) > 1e4:
            return None
        self.nodes.append(Step(op, tuple(inputs), tuple(params)))
        self.values.append(value)
        return len(self.values) - 1

    def operand(self, i: int, domain: str) -> int:
        """``i`` itself when its values suit ``domain``, else an adapter step of it."""
        if DOMAIN_OK[domain](self.values[i]):
            return i
        out = self.add(f"adapt_{domain}", (i,))
        assert out is not None, "adapters keep values finite"
        return out

    def shape(self, i: int) -> tuple[int, ...]:
        return self.values[i].shape

    def program(self) -> Program:
        return Program(tuple(self.nodes), self.seed, self.dtype)
