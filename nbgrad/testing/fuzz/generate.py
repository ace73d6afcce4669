"""Drawing whole programs: :func:`generate` (one program per seed, deterministic) and
:func:`programs` (the same as a hypothesis strategy)."""

from __future__ import annotations

from collections.abc import Callable

from ..core import DOMAINS
from .families import (
    _binary,
    _index,
    _product,
    _reduce,
    _shape_op,
    _ternary,
    _unary,
    shapes,
)
from .patterns import PATTERNS
from .program import Builder, Program, Rand

FAMILIES: dict[str, Callable] = {
    "unary": _unary, "binary": _binary, "ternary": _ternary, "reduce": _reduce,
    "shape": _shape_op, "index": _index, "product": _product, **PATTERNS,
}
#: how often each family is drawn (the patterns aimed at the jit's weak spots most)
WEIGHTS: dict[str, int] = {"unary": 2, "binary": 3, "ternary": 1, "reduce": 3, "shape": 2,
                           "index": 2, "product": 2, "reuse": 5, "loop": 3, "unrolled": 2,
                           "function": 1}


def generate(seed: int, max_steps: int = 4, families: tuple[str, ...] = tuple(FAMILIES),
             float32: float = 0.25) -> Program:
    """The program of ``seed``: 1 or 2 leaves, then 1 to ``max_steps`` family draws;
    float32 leaves with probability ``float32``."""
    r = Rand(seed)
    dtype = "float32" if r.rng.random() < float32 else "float64"
    b = Builder(seed, dtype)
    for _ in range(r.integers(1, 2)):
        b.leaf(shapes(r), r.choice(sorted(DOMAINS)))
    weights = [WEIGHTS.get(f, 1) for f in families]
    pool = [f for f, w in zip(families, weights, strict=True) for _ in range(w)]
    for _ in range(r.integers(1, max_steps)):
        FAMILIES[r.choice(pool)](r, b)
    return b.program()


def programs(max_steps: int = 4, families: tuple[str, ...] = tuple(FAMILIES),
             float32: float = 0.0):
    """A hypothesis strategy of :func:`generate` programs (seeds drawn by hypothesis)."""
    from hypothesis import strategies as st
    return st.integers(0, 2**32 - 1).map(
        lambda seed: generate(seed, max_steps, families, float32))
