"""Random graphs of nbgrad ops for differential testing (hypothesis strategies).

:func:`programs` draws a :class:`Program`: a few leaf tensors (shapes of 0 to 3
dimensions, values from the op records' input domains) and a chain of steps, each an
op of the derivative table applied to earlier values: elementwise unary and binary ops
(broadcast shapes, Python-scalar operands), reductions over random dims, softmax and
scans, shape ops, indexing (``t[...]``, gather, index_select, take, scatter_add...),
matmul and friends. ``tests/test_fuzz.py`` runs each program eagerly, against finite
differences (``nbgrad.autograd.gradcheck``) and under ``nbgrad.jit``.

Programs are built while they are drawn: each step runs eagerly (without grad) on the
actual values, so that

- an op only sees values inside its domain: where an input is outside it, a smooth
  *adapter* step (``0.5 + 1.5 * sigmoid(x)`` for ``positive``, ...) is put first;
- steps that would sit on a point where the op is not differentiable (ties of
  ``max``/``sort``/``maximum``, a jump of ``fmod``, a zero variance under ``std``)
  are replaced by a smooth fallback, so that a mismatch is always a real bug;
- sizes stay small (gradcheck takes one finite difference per input element).

A program's ``repr`` is Python that rebuilds it (leaf values come from its ``seed``),
so a failing case can be pasted into ``@example(...)`` as a regression test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from .. import ops as nb  # the op functions, called as ``nb.NAME`` like nbgrad's own
from ..factories import tensor
from ..grad_mode import no_grad
from ..nn import functional as F
from ..tensor import Tensor
from .core import DOMAINS, all_records
from .records.elementwise import _BINARY, _UNARY

#: the largest value (in elements) a program keeps; bigger results are replaced
MAX_SIZE = 48
#: the smallest gap (ties, kinks, jumps) a step keeps from a non-differentiable point
GAP = 0.02


# ------------------------------------------------------------------ programs
@dataclass(frozen=True)
class Leaf:
    """An input tensor: its shape and the domain its values come from."""

    shape: tuple[int, ...]
    domain: str = "real"


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
    reaches the result).
    """

    nodes: tuple
    seed: int = 0

    def leaves(self, dtype=np.float64, requires_grad: bool = True) -> tuple[Tensor, ...]:
        """The input tensors (values drawn from each leaf's domain with ``seed``)."""
        out = []
        for k, node in enumerate(n for n in self.nodes if isinstance(n, Leaf)):
            value = leaf_value(self.seed, k, node.shape, node.domain)
            out.append(Tensor(value.astype(dtype), requires_grad=requires_grad))
        return tuple(out)

    def __call__(self, *leaves: Tensor) -> Tensor:
        values = self.values(*leaves)
        read = {i for node in self.nodes if isinstance(node, Step) for i in node.inputs}
        out = values[-1]
        for i, v in enumerate(values[:-1]):
            if i not in read:
                weight = np.random.default_rng([self.seed, 7, i]).uniform(0.5, 1.5, v.shape)
                out = out + (v * weight.astype(v.dtype)).sum()
        return out

    def loss(self, *leaves: Tensor) -> Tensor:
        """A scalar: the result weighted by fixed random weights and summed."""
        out = self(*leaves)
        weight = np.random.default_rng([self.seed, 8]).uniform(0.5, 1.5, out.shape)
        return (out * weight.astype(out.dtype)).sum()

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

    def __repr__(self) -> str:
        lines = ",\n    ".join(repr(n) for n in self.nodes)
        return f"Program(nodes=(\n    {lines},\n), seed={self.seed})"


def leaf_value(seed: int, k: int, shape: tuple[int, ...], domain: str) -> np.ndarray:
    """The values of leaf ``k`` of a program with ``seed``."""
    rng = np.random.default_rng([seed, k])
    return np.asarray(DOMAINS[domain](rng, shape), dtype=np.float64)


# ------------------------------------------------------------------ domains
def _frac_ok(a: np.ndarray, halves: bool = False) -> bool:
    f = np.abs(a - np.round(a))
    if halves:
        f = np.minimum(f, np.abs(np.abs(a - np.floor(a)) - 0.5))
    return bool(np.all(f >= 0.05))


#: whether values lie safely inside a domain (also away from kinks at 0 and integers)
DOMAIN_OK: dict[str, Callable[[np.ndarray], bool]] = {
    "real": lambda a: bool(np.all(np.abs(a) <= 5)),
    "small": lambda a: bool(np.all(np.abs(a) <= 1.5)),
    "positive": lambda a: bool(np.all((a >= 0.2) & (a <= 5))),
    "unit": lambda a: bool(np.all(np.abs(a) <= 0.9)),
    "gt1": lambda a: bool(np.all((a >= 1.1) & (a <= 5))),
    "nonzero": lambda a: bool(np.all((np.abs(a) >= 0.2) & (np.abs(a) <= 5))),
    "nonint": lambda a: bool(np.all(np.abs(a) <= 5)) and _frac_ok(a, halves=True),
}

#: smooth maps of any real value into a domain (as nbgrad expressions)
ADAPTERS: dict[str, Callable[[Tensor], Tensor]] = {
    "real": lambda x: 3.0 * nb.tanh(x / 3.0),
    "small": lambda x: 1.5 * nb.tanh(x / 1.5),
    "positive": lambda x: 0.5 + 1.5 * nb.sigmoid(x),
    "unit": lambda x: 0.85 * nb.tanh(x),
    "gt1": lambda x: 1.2 + 1.8 * nb.sigmoid(x),
    "nonzero": lambda x: 0.5 + 1.5 * nb.sigmoid(x),
    "nonint": lambda x: 0.1 + 0.3 * nb.sigmoid(x),
}


# ------------------------------------------------------------------ the op catalogue
@dataclass(frozen=True)
class FuzzOp:
    """How a program step runs: ``run(inputs, params)`` with nbgrad's public API.

    ``entry`` is the derivative-table entry the step exercises (checked against the op
    records); ``None`` for the adapters.
    """

    run: Callable[[list[Tensor], tuple], Tensor]
    entry: str | None


FUZZ_OPS: dict[str, FuzzOp] = {}


def _op(name: str, entry: str | None = "", run: Callable | None = None) -> None:
    """Register step kind ``name`` exercising table entry ``entry`` (default: ``name``)."""
    FUZZ_OPS[name] = FuzzOp(run, name if entry == "" else entry)


def _fn(name: str) -> Callable:
    return getattr(nb, name, None) or getattr(F, name)


for _d in ADAPTERS:
    _op(f"adapt_{_d}", None, lambda xs, p, _d=_d: ADAPTERS[_d](xs[0]))

_UNARY_DOMAINS = {name: domain for name, (domain, _ref) in _UNARY.items()}
_UNARY_DOMAINS.update({"softplus": "real", "gelu": "real", "silu": "real",
                       "elu": "nonzero", "leaky_relu": "nonzero"})
for _name in _UNARY_DOMAINS:
    _op(_name, run=lambda xs, p, _n=_name: _fn(_n)(xs[0]))

_BINARY_DOMAINS = {name: (da, db) for name, (da, db, _ref) in _BINARY.items()}
# any dividend: the steps keep the quotient away from the jumps (see _binary_ok)
_BINARY_DOMAINS["fmod"] = _BINARY_DOMAINS["remainder"] = ("real", "positive")


def _run_binary(name: str) -> Callable:
    fn = _fn(name)

    def run(xs, params):
        if len(xs) == 2:
            return fn(xs[0], xs[1])
        scalar, side = params  # a Python number on the left or the right
        return fn(scalar, xs[0]) if side == "left" else fn(xs[0], scalar)

    return run


for _name in _BINARY_DOMAINS:
    _op(_name, run=_run_binary(_name))
_op("where", run=lambda xs, p: nb.where(tensor(np.array(p[0], dtype=bool)), xs[0], xs[1]))
_op("lerp", run=lambda xs, p: nb.lerp(xs[0], xs[1], p[0]))
_op("clamp", run=lambda xs, p: nb.clamp(xs[0], p[0], p[1]))

# reductions: params = (dim, keepdim) or op-specific
for _name in ("sum", "mean", "prod", "amax", "amin", "logsumexp"):
    _op(_name, run=lambda xs, p, _n=_name: _fn(_n)(xs[0], dim=p[0], keepdim=p[1]))
_op("var", run=lambda xs, p: nb.var(xs[0], dim=p[0], keepdim=p[1], correction=p[2]))
_op("std", run=lambda xs, p: nb.std(xs[0], dim=p[0], keepdim=p[1], correction=p[2]))
_op("norm", run=lambda xs, p: nb.norm(xs[0], float(p[2]), dim=p[0], keepdim=p[1]))
_op("max_dim", run=lambda xs, p: nb.max(xs[0], p[0], p[1]).values)
_op("min_dim", run=lambda xs, p: nb.min(xs[0], p[0], p[1]).values)
for _name in ("cumsum", "cumprod", "softmax", "log_softmax"):
    _op(_name, run=lambda xs, p, _n=_name: _fn(_n)(xs[0], p[0]))
_op("sort", run=lambda xs, p: nb.sort(xs[0], p[0], p[1]).values)  # (dim, descending)
_op("topk", run=lambda xs, p: nb.topk(xs[0], p[2], p[0], p[1]).values)  # (dim, largest, k)
_op("layer_norm", run=lambda xs, p: F.layer_norm(xs[0], p[0], *xs[1:]))

# shape ops
_op("reshape", run=lambda xs, p: nb.reshape(xs[0], p[0]))
_op("flatten", run=lambda xs, p: nb.flatten(xs[0], p[0], p[1]))
_op("transpose", run=lambda xs, p: nb.transpose(xs[0], p[0], p[1]))
_op("permute", run=lambda xs, p: nb.permute(xs[0], p[0]))
_op("unsqueeze", run=lambda xs, p: nb.unsqueeze(xs[0], p[0]))
_op("squeeze", run=lambda xs, p: nb.squeeze(xs[0], p[0]))
_op("flip", run=lambda xs, p: nb.flip(xs[0], p[0]))
_op("roll", run=lambda xs, p: nb.roll(xs[0], p[0], p[1]))
_op("expand", run=lambda xs, p: nb.expand(xs[0], p[0]))
_op("repeat", run=lambda xs, p: nb.repeat(xs[0], p[0]))
_op("tile", run=lambda xs, p: nb.tile(xs[0], p[0]))
_op("tril", run=lambda xs, p: nb.tril(xs[0], p[0]))
_op("triu", run=lambda xs, p: nb.triu(xs[0], p[0]))
_op("cat", run=lambda xs, p: nb.cat(list(xs), p[0]))
_op("stack", run=lambda xs, p: nb.stack(list(xs), p[0]))
_op("split", run=lambda xs, p: nb.split(xs[0], p[0], p[1])[p[2]])
_op("chunk", run=lambda xs, p: nb.chunk(xs[0], p[0], p[1])[p[2]])
_op("pad", run=lambda xs, p: nb.pad(xs[0], p[0], "constant", p[1]))


# indexing: index arrays are stored as (nested) lists so that a program's repr is Python
def _index_value(item):
    if isinstance(item, list):
        return np.array(item, dtype=bool if item and isinstance(_first(item), bool)
                        else np.int64)
    return item


def _first(item):
    while isinstance(item, list) and item:
        item = item[0]
    return item


def _ints(p) -> Tensor:
    return tensor(np.array(p, dtype=np.int64))


_op("index", run=lambda xs, p: xs[0][tuple(_index_value(i) for i in p[0])])
_op("gather", run=lambda xs, p: nb.gather(xs[0], p[0], _ints(p[1])))
_op("index_select", run=lambda xs, p: nb.index_select(xs[0], p[0], _ints(p[1])))
_op("take", run=lambda xs, p: nb.take(xs[0], _ints(p[0])))
_op("masked_fill", run=lambda xs, p: nb.masked_fill(xs[0], tensor(np.array(p[0], bool)),
                                                     p[1]))
_op("scatter_add", run=lambda xs, p: nb.scatter_add(xs[0], p[0], _ints(p[1]), xs[1]))
_op("diagonal", run=lambda xs, p: nb.diagonal(xs[0], p[0], p[1], p[2]))
_op("trace", run=lambda xs, p: nb.trace(xs[0]))

# products
_op("matmul", run=lambda xs, p: nb.matmul(xs[0], xs[1]) if not p else xs[0] @ xs[1])
_op("mm", run=lambda xs, p: nb.mm(xs[0], xs[1]))
_op("bmm", run=lambda xs, p: nb.bmm(xs[0], xs[1]))
_op("dot", run=lambda xs, p: nb.dot(xs[0], xs[1]))
_op("outer", run=lambda xs, p: nb.outer(xs[0], xs[1]))
_op("einsum", run=lambda xs, p: nb.einsum(p[0], *xs))
_op("linear", run=lambda xs, p: F.linear(*xs))
_op("mse_loss", run=lambda xs, p: F.mse_loss(xs[0], xs[1], reduction=p[0]))


def catalogue_entries() -> set[str]:
    """The table entries the fuzzer exercises."""
    return {op.entry for op in FUZZ_OPS.values() if op.entry is not None}


# ------------------------------------------------------------------ building programs
class Builder:
    """Collects nodes while a program is drawn, running each step to know its value."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
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
                not np.all(np.isfinite(value)):
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
        return Program(tuple(self.nodes), self.seed)


def _size(shape) -> int:
    return math.prod(shape)


# ------------------------------------------------------------------ strategies
def shapes(min_dims: int = 0, max_dims: int = 3, max_side: int = 4) -> st.SearchStrategy:
    """Small shapes (total size at most ``MAX_SIZE // 2``)."""
    return st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims).map(
        tuple).filter(lambda s: _size(s) <= MAX_SIZE // 2)


@st.composite
def broadcast_partner(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape`` to ``shape`` or wider."""
    dims = [draw(st.sampled_from([s, 1])) if s > 1 else draw(st.sampled_from([1, 2]))
            for s in shape]
    drop = draw(st.integers(0, len(dims)))
    dims = dims[drop:]
    if drop == 0 and len(shape) < 3 and draw(st.booleans()):  # one more leading dim
        dims = [draw(st.integers(1, 2))] + dims
    out = tuple(dims)
    full = np.broadcast_shapes(shape, out)
    return out if _size(full) <= MAX_SIZE // 2 else tuple(shape[drop:])


def _choice(draw, options: list | tuple, b: Builder | None = None):
    """One of ``options``. Hypothesis draws 0 far more often than other values, which
    with ``sampled_from`` would make the first op of every list dominate the programs;
    offsetting by the builder's seed and length spreads that bias over all ops."""
    salt = 0 if b is None else b.seed + 7 * len(b.nodes)
    return options[(draw(st.integers(0, 2**16 - 1)) + salt) % len(options)]


def _pick(draw, b: Builder, min_ndim: int = 0) -> int | None:
    """An earlier value (recent ones more likely) with at least ``min_ndim`` dims."""
    choices = [i for i, v in enumerate(b.values) if v.ndim >= min_ndim]
    if not choices:
        return None
    k = draw(st.integers(0, len(choices) - 1))
    return choices[len(choices) - 1 - k]


def _dim(draw, ndim: int) -> int:
    """A valid dim, negative half of the time (0-d tensors accept 0 and -1)."""
    n = max(ndim, 1)
    d = draw(st.integers(0, n - 1))
    return d - n if draw(st.booleans()) else d


def _dims(draw, ndim: int, allow_tuple: bool = True):
    kind = draw(st.sampled_from(["none", "int", "tuple"] if allow_tuple and ndim >= 2
                                else ["none", "int"]))
    if kind == "none":
        return None
    if kind == "int":
        return _dim(draw, ndim)
    dims = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(d - ndim if draw(st.booleans()) else d for d in dims)


def _axes(dim, ndim: int) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else dim
    return tuple(sorted(d % max(ndim, 1) for d in dims)) if ndim else ()


def _groups(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """``a`` as rows (one per output element) of the values each reduction sees."""
    if a.ndim == 0:
        return a.reshape(1, 1)
    kept = [d for d in range(a.ndim) if d not in axes]
    moved = np.transpose(a, kept + list(axes))
    return moved.reshape(_size([a.shape[d] for d in kept]), -1)


def _gaps_ok(rows: np.ndarray, which: str) -> bool:
    """No ties where the op's gradient picks one element (``top``: the largest of each
    row, ``bottom``: the smallest, ``all``: every rank)."""
    if rows.shape[1] < 2:
        return True
    s = np.sort(rows, axis=1)
    if which == "top":
        gaps = s[:, -1] - s[:, -2]
    elif which == "bottom":
        gaps = s[:, 1] - s[:, 0]
    else:
        gaps = np.diff(s, axis=1)
    return bool(np.all(gaps >= GAP))


# --- families: each draws one step (or a fallback) onto the builder
def _unary(draw, b: Builder) -> None:
    i = _pick(draw, b)
    name = _choice(draw, sorted(_UNARY_DOMAINS), b)
    x = b.operand(i, _UNARY_DOMAINS[name])
    if b.add(name, (x,)) is None:
        b.add("tanh", (i,))


def _binary(draw, b: Builder) -> None:
    i = _pick(draw, b)
    name = _choice(draw, sorted(_BINARY_DOMAINS), b)
    da, db = _BINARY_DOMAINS[name]
    swap = draw(st.booleans())  # ``other op x`` rather than ``x op other``
    how = _choice(draw, ["fresh", "existing", "scalar"])
    if how == "scalar":  # a Python number as one operand, in that operand's domain
        side = "left" if swap else "right"
        x = b.operand(i, db if swap else da)
        value = float(np.round(leaf_value(b.seed, 1000 + len(b.nodes), (),
                                          da if swap else db), 3))
        if _scalar_ok(value, da if swap else db) and _binary_ok(name, b, x, value, side) \
                and b.add(name, (x,), (value, side)) is not None:
            return
        b.add("mul", (i,), (0.5, "right"))
        return
    shape = b.shape(i)
    other = None
    if how == "existing":
        fits = [j for j, v in enumerate(b.values) if j != i and _broadcasts(shape, v.shape)]
        if fits:
            other = fits[draw(st.integers(0, len(fits) - 1))]
    if other is None:
        other = b.leaf(draw(broadcast_partner(shape)), db)
    x, y = b.operand(i, da), b.operand(other, db)
    if swap:  # ``b op a`` with the domains following the operands
        x, y = b.operand(other, da), b.operand(i, db)
    if _binary_ok(name, b, x, y) and b.add(name, (x, y)) is not None:
        return
    b.add("add", (i, other))


def _broadcasts(a: tuple, c: tuple) -> bool:
    try:
        return _size(np.broadcast_shapes(a, c)) <= MAX_SIZE // 2
    except ValueError:
        return False


def _scalar_ok(value: float, domain: str) -> bool:
    return DOMAIN_OK[domain](np.float64(value))


def _binary_ok(name: str, b: Builder, x: int, y, side: str = "right") -> bool:
    """Away from the points where ``name`` is not differentiable."""
    a = b.values[x]
    c = b.values[y] if not isinstance(y, float) else np.float64(y)
    if side == "left":
        a, c = c, a
    a, c = np.broadcast_arrays(a, c)
    if name in ("maximum", "minimum"):
        return bool(np.all(np.abs(a - c) >= GAP))
    if name in ("fmod", "remainder"):
        q = a / c
        return bool(np.all(np.abs(q - np.round(q)) >= GAP))
    return True


def _ternary(draw, b: Builder) -> None:
    i = _pick(draw, b)
    shape = b.shape(i)
    kind = _choice(draw, ["where", "lerp", "clamp"], b)
    if kind == "clamp":
        lo, hi = sorted(draw(st.lists(st.sampled_from([-1.5, -0.5, 0.0, 0.5, 1.5]),
                                      min_size=2, max_size=2, unique=True)))
        v = b.values[i]
        if np.all(np.abs(v - lo) >= GAP) and np.all(np.abs(v - hi) >= GAP):
            if b.add("clamp", (i,), (lo, hi)) is not None:
                return
    else:
        other = b.leaf(draw(broadcast_partner(shape)), "real")
        if kind == "where":
            full = np.broadcast_shapes(shape, b.shape(other))
            mask = np.random.default_rng([b.seed, 3, len(b.nodes)]).random(full) > 0.5
            if b.add("where", (i, other), (mask.tolist(),)) is not None:
                return
        else:
            weight = float(np.round(leaf_value(b.seed, 3000 + len(b.nodes), (), "unit"), 3))
            if b.add("lerp", (i, other), (weight,)) is not None:
                return
    b.add("sigmoid", (i,))


_REDUCE = ("sum", "mean", "prod", "amax", "amin", "logsumexp", "var", "std", "norm",
           "max_dim", "min_dim", "cumsum", "cumprod", "softmax", "log_softmax", "sort",
           "topk", "layer_norm")


def _reduce(draw, b: Builder) -> None:
    i = _pick(draw, b)
    name = _choice(draw, _REDUCE, b)
    ndim = b.values[i].ndim
    step = _reduce_step(draw, b, name, i, ndim)
    if step is None or b.add(*step) is None:
        b.add("sum", (i,), (_dims(draw, ndim), draw(st.booleans())))


def _reduce_step(draw, b: Builder, name: str, i: int, ndim: int):
    """(op, inputs, params) for a reduction-like step, or None where it would be unsafe."""
    keep = draw(st.booleans())
    if name in ("sum", "mean", "logsumexp"):
        return name, (i,), (_dims(draw, ndim), keep)
    if name in ("prod", "cumprod"):
        x = b.operand(i, "small")
        if name == "cumprod":
            return name, (x,), (_dim(draw, ndim),)
        return name, (x,), (_dims(draw, ndim), keep)
    if name in ("amax", "amin", "max_dim", "min_dim"):
        dim = _dims(draw, ndim) if name in ("amax", "amin") else _dim(draw, ndim)
        rows = _groups(b.values[i], _axes(dim, ndim))
        ok = _gaps_ok(rows, "top" if name in ("amax", "max_dim") else "bottom")
        return (name, (i,), (dim, keep)) if ok else None
    if name in ("var", "std"):
        dim = _dims(draw, ndim)
        correction = draw(st.sampled_from([0, 1]))
        rows = _groups(b.values[i], _axes(dim, ndim))
        if rows.shape[1] - correction < 1 or np.min(np.var(rows, axis=1)) < GAP:
            return None
        return name, (i,), (dim, keep, correction)
    if name == "norm":
        p = draw(st.sampled_from([1, 2, 3, "inf"]))  # a string keeps repr() Python
        dim = _dims(draw, ndim)
        x = b.operand(i, "nonzero") if p == 1 else i
        rows = np.abs(_groups(b.values[x], _axes(dim, ndim)))
        if p == "inf" and not _gaps_ok(rows, "top"):
            return None
        if np.min(np.sqrt(np.sum(rows ** 2, axis=1))) < 0.1:
            return None
        return name, (x,), (dim, keep, p)
    if name in ("cumsum", "softmax", "log_softmax"):
        return name, (i,), (_dim(draw, ndim),)
    if name in ("sort", "topk"):
        dim = _dim(draw, ndim)
        descending = draw(st.booleans())
        rows = _groups(b.values[i], _axes(dim, ndim))
        if not _gaps_ok(rows, "all"):
            return None
        if name == "sort":
            return name, (i,), (dim, descending)
        k = draw(st.integers(1, rows.shape[1]))
        return name, (i,), (dim, descending, k)
    # layer_norm over the last dims, with weight and bias sometimes
    if ndim == 0:
        return None
    k = draw(st.integers(1, min(ndim, 2)))
    normalized = b.shape(i)[ndim - k:]
    rows = b.values[i].reshape(-1, _size(normalized))
    if rows.shape[1] < 2 or np.min(np.var(rows, axis=1)) < GAP:
        return None
    extra = tuple(b.leaf(normalized, "real") for _ in range(draw(st.integers(0, 2))))
    return name, (i, *extra), (tuple(normalized),)


_SHAPE_OPS = ("reshape", "flatten", "transpose", "permute", "unsqueeze", "squeeze", "flip",
              "roll", "expand", "repeat", "tile", "tril", "triu", "cat", "stack", "split",
              "chunk", "pad")


def _shape_op(draw, b: Builder) -> None:
    i = _pick(draw, b)
    name = _choice(draw, _SHAPE_OPS, b)
    step = _shape_step(draw, b, name, i)
    if step is None or b.add(*step) is None:
        b.add("unsqueeze", (i,), (0,))


def _shape_step(draw, b: Builder, name: str, i: int):
    shape = b.shape(i)
    nd = len(shape)
    n = _size(shape)
    if name == "reshape":
        options = [(n,), (-1,), tuple(reversed(shape)), (1, n), (n, 1)]
        divisors = [d for d in range(2, n) if n % d == 0]
        options += [(d, -1) for d in divisors]
        return name, (i,), (draw(st.sampled_from(options)),)
    if name == "flatten":
        if nd == 0:
            return name, (i,), (0, -1)
        s = draw(st.integers(0, nd - 1))
        return name, (i,), (s, draw(st.integers(s, nd - 1)))
    if name == "transpose":
        return name, (i,), (_dim(draw, nd), _dim(draw, nd))
    if name == "permute":
        return name, (i,), (tuple(draw(st.permutations(range(nd)))),)
    if name == "unsqueeze":
        return name, (i,), (_dim(draw, nd + 1),)
    if name == "squeeze":
        ones = [d for d, s in enumerate(shape) if s == 1]
        return name, (i,), (draw(st.sampled_from(ones)) if ones and draw(st.booleans())
                            else None,)
    if name == "flip":
        if nd == 0:
            return None
        dims = draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True))
        return name, (i,), (tuple(dims),)
    if name == "roll":
        if nd == 0:
            return None
        dims = tuple(draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd,
                                   unique=True)))
        shifts = tuple(draw(st.integers(-3, 3)) for _ in dims)
        return name, (i,), (shifts, dims)
    if name == "expand":
        size = tuple(draw(st.sampled_from([s, 3])) if s == 1 else s for s in shape)
        if draw(st.booleans()):
            size = (2,) + size
        return (name, (i,), (size,)) if _size(size) <= MAX_SIZE else None
    if name in ("repeat", "tile"):
        reps = tuple(draw(st.integers(1, 2)) for _ in range(nd + draw(st.integers(0, 1))))
        if name == "repeat" and len(reps) < nd or not reps:
            return None
        return (name, (i,), (reps,)) if n * _size(reps) <= MAX_SIZE else None
    if name in ("tril", "triu"):
        return (name, (i,), (draw(st.integers(-1, 1)),)) if nd >= 2 else None
    if name in ("cat", "stack"):
        if nd == 0 and name == "cat":
            return None
        d = _dim(draw, nd + (name == "stack"))
        other_shape = list(shape)
        if name == "cat":
            other_shape[d] = draw(st.integers(1, 2))
        other = b.leaf(tuple(other_shape), "real")
        order = (other, i) if draw(st.booleans()) else (i, other)
        return name, order, (d,)
    if name in ("split", "chunk"):
        if nd == 0:
            return None
        d = _dim(draw, nd)
        size = shape[d]
        pieces = draw(st.integers(1, max(size, 1)))
        count = -(-size // pieces) if name == "split" else len(
            range(0, size, -(-size // pieces)))
        return name, (i,), (pieces, d, draw(st.integers(0, count - 1)))
    # pad: constant padding (negative = crop) of the last one or two dims
    if nd == 0:
        return None
    k = draw(st.integers(1, min(nd, 2)))
    pad = []
    for j in range(k):
        s = shape[nd - 1 - j]
        pad += [draw(st.integers(-(s - 1) if s > 1 else 0, 2)), draw(st.integers(0, 2))]
    value = draw(st.sampled_from([0.0, 0.5]))
    grown = n * math.prod(shape[nd - 1 - j] + pad[2 * j] + pad[2 * j + 1]
                          for j in range(k)) // max(math.prod(shape[nd - k:]), 1)
    return (name, (i,), (tuple(pad), value)) if grown <= MAX_SIZE else None


_INDEX_OPS = ("index_basic", "index_advanced", "index_mask", "gather", "index_select",
              "take", "masked_fill", "scatter_add", "diagonal", "trace")


def _index(draw, b: Builder) -> None:
    name = _choice(draw, _INDEX_OPS, b)
    i = _pick(draw, b, min_ndim=2 if name in ("diagonal", "trace") else 0)
    if i is None:
        i = _pick(draw, b)
        name = "index_basic"
    step = _index_step(draw, b, name, i)
    if step is None or b.add(*step) is None:
        b.add("index", (i,), ((Ellipsis,),))


def _index_step(draw, b: Builder, name: str, i: int):
    shape = b.shape(i)
    nd = len(shape)
    rng = np.random.default_rng([b.seed, 4, len(b.nodes)])
    if name == "index_basic":
        items: list = []
        for s in shape:
            kind = draw(st.sampled_from(["int", "slice", "full"]))
            if kind == "int":
                items.append(draw(st.integers(-s, s - 1)))
            elif kind == "slice":
                start = draw(st.integers(0, s - 1))
                items.append(slice(start, None, draw(st.integers(1, 2))))
            else:
                items.append(slice(None))
        if draw(st.booleans()):
            items.insert(draw(st.integers(0, len(items))), None)
        if items and draw(st.booleans()):
            items[0] = Ellipsis
        return "index", (i,), (tuple(items),)
    if nd == 0:
        return None
    d = draw(st.integers(0, nd - 1))
    if name == "index_advanced":
        idx = rng.integers(-shape[d], shape[d], draw(st.integers(1, 4))).tolist()
        items = [slice(None)] * d + [idx]
        return "index", (i,), (tuple(items),)
    if name == "index_mask":
        mask = (rng.random(shape[:d + 1]) > 0.4).tolist()
        return "index", (i,), ((mask,),)
    if name == "gather":
        index_shape = tuple(draw(st.integers(1, s)) if k != d else draw(st.integers(1, 4))
                            for k, s in enumerate(shape))
        return "gather", (i,), (d, rng.integers(0, shape[d], index_shape).tolist())
    if name == "index_select":
        return "index_select", (i,), (d, rng.integers(0, shape[d], draw(
            st.integers(1, 4))).tolist())
    if name == "take":
        n = _size(shape)
        return "take", (i,), (rng.integers(-n, n, draw(shapes(0, 2, 3))).tolist(),)
    if name == "masked_fill":
        mask = rng.random(shape[d:]) > 0.5
        return "masked_fill", (i,), (mask.tolist(), draw(st.sampled_from([0.0, -1.5])))
    if name == "scatter_add":
        index_shape = tuple(draw(st.integers(1, s)) for s in shape)
        index = rng.integers(0, shape[d], index_shape).tolist()
        src = b.leaf(index_shape, "real")
        return "scatter_add", (i, src), (d, index)
    if name == "diagonal":
        d1, d2 = draw(st.permutations(range(nd)))[:2]
        return "diagonal", (i,), (draw(st.integers(-1, 1)), d1, d2)
    return ("trace", (i,), ()) if nd == 2 else None


def _product(draw, b: Builder) -> None:
    i = _pick(draw, b, min_ndim=1)
    if i is None:
        i = b.leaf(draw(shapes(1, 2)), "real")
    shape = b.shape(i)
    nd, n = len(shape), shape[-1]
    k = draw(st.integers(1, 3))
    choice = _choice(draw, ["matmul", "matmul_vec", "batched", "special", "linear",
                            "mse_loss"], b)
    if choice == "matmul":
        step = ("matmul", (i, b.leaf((n, k))), (draw(st.booleans()),) if draw(
            st.booleans()) else ())
    elif choice == "matmul_vec":  # vector @ x or x @ vector
        if nd == 1 or draw(st.booleans()):
            step = ("matmul", (i, b.leaf((n,))), ())
        else:
            m = shape[-2]
            step = ("matmul", (b.leaf((m,)), i), ())
    elif choice == "batched":
        batch = draw(st.sampled_from([c for c in [(2,), (1,), (2, 1)]
                                      if _broadcasts(shape[:-2], c)]))
        step = ("matmul", (i, b.leaf(batch + (n, k))), ())
    elif choice == "special":
        if nd == 1:
            step = draw(st.sampled_from([("dot", (i, b.leaf((n,))), ()),
                                         ("outer", (i, b.leaf((k,))), ())]))
        elif nd == 2:
            step = draw(st.sampled_from([("mm", (i, b.leaf((n, k))), ()),
                                         ("einsum", (i, b.leaf((n, k))), ("ij,jk->ik",)),
                                         ("einsum", (i,), ("ij->j",))]))
        else:
            step = ("bmm", (i, b.leaf(shape[:1] + (n, k))), ()) if nd == 3 else None
    elif choice == "linear":
        bias = (b.leaf((k,)),) if draw(st.booleans()) else ()
        step = ("linear", (i, b.leaf((k, n)), *bias), ())
    else:
        target = b.leaf(draw(broadcast_partner(shape)))
        step = ("mse_loss", (i, target), (draw(st.sampled_from(["mean", "sum", "none"])),))
    if step is None or b.add(*step) is None:
        b.add("tanh", (i,))


FAMILIES: dict[str, Callable] = {
    "unary": _unary, "binary": _binary, "ternary": _ternary, "reduce": _reduce,
    "shape": _shape_op, "index": _index, "product": _product,
}


@st.composite
def programs(draw, max_steps: int = 5, families: tuple[str, ...] = tuple(FAMILIES)
             ) -> Program:
    """A random program of 1 to ``max_steps`` steps drawn from ``families``."""
    b = Builder(draw(st.integers(0, 2**32 - 1)))
    for _ in range(draw(st.integers(1, 2))):
        b.leaf(draw(shapes()), draw(st.sampled_from(sorted(DOMAINS))))
    for _ in range(draw(st.integers(1, max_steps))):
        FAMILIES[_choice(draw, families, b)](draw, b)
    return b.program()


def check_catalogue() -> list[str]:
    """Names the fuzzer exercises that are not table entries with an op record."""
    records = all_records()
    return sorted(e for e in catalogue_entries() if e not in records)
