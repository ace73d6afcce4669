"""Special-value inputs for the differential check, and an IEEE-aware comparison.

After its ordinary calls every jitted program runs once more (same shapes and dtypes, so
no new compile) on its inputs with special values mixed in: signed zeros, subnormals,
huge values, infinities, NaN and the domain edges of common ops (``±1``). Eager, tier 1
and tier 2 must then agree: NaN in the same places, the same infinities, finite values
equal up to rounding (``reassoc`` sums may round differently, so the absolute floor
scales with the largest finite magnitude around). This finds code that is only right
for ordinary values, such as LLVM fast-math flags that assume no NaN, infinity or
signed zero (``arcp`` turned ``a / b`` with a tiny ``b`` into ``a * (1 / b)`` = NaN).
"""

from __future__ import annotations

import numpy as np

from ...ops.registry import REGISTRY
from ...ops.traits import Matmul
from ..records.elementwise import _BINARY, _UNARY
from .program import Leaf, Program, Step

#: the special values mixed into inputs, per dtype (with values within a small factor of
#: the largest float: tier 2's former ``contract``/``reassoc`` flags moved where they
#: overflow, fuzz finding F3)
SPECIAL_VALUES: dict[str, tuple[float, ...]] = {
    "float64": (0.0, -0.0, 5e-324, -1e-310, 1e300, -1e300, 1e308, -1e308, np.inf, -np.inf,
                np.nan, 1.0, -1.0),
    "float32": (0.0, -0.0, 1e-45, -1e-40, 1e30, -1e30, 3e38, -3e38, np.inf, -np.inf,
                np.nan, 1.0, -1.0),
}
#: relative tolerance of finite values (also the absolute floor per largest |value|)
SPECIAL_RTOL = {"float64": 1e-12, "float32": 1e-5}
#: how likely an element (a 0-d input: the input) is replaced by a special value
SHARE, SHARE_0D = 0.4, 0.6


def special_inputs(program: Program, base: list[np.ndarray]) -> list[np.ndarray]:
    """``base`` (the program's leaf values) with special values mixed in: each program
    draws a few kinds of special value (so that NaN does not hide everything else) and
    puts them at random places; at least one element is special."""
    rng = np.random.default_rng([program.seed, 11])
    pool = SPECIAL_VALUES[program.dtype]
    kinds = rng.choice(len(pool), size=int(rng.integers(1, 5)), replace=False)
    values = np.array([pool[k] for k in kinds])
    out = []
    for a in base:  # a 0-d input (often broadcast: a divisor, a bound) draws from all
        share = SHARE_0D if a.ndim == 0 else SHARE
        mask = rng.random(a.shape) < share
        kind = rng.choice(np.array(pool) if a.ndim == 0 else values, a.shape)
        out.append(np.where(mask, kind, a).astype(a.dtype))
    if not any(np.any(a != b) | np.any(np.isnan(a)) for a, b in zip(out, base, strict=True)):
        first = out[0].reshape(-1)
        first[int(rng.integers(first.size))] = values[0]
    return out


def elementwise_only(program: Program) -> bool:
    """Whether every step is elementwise and no value is summed into the result (then
    the sign of a zero result must match too)."""
    names = set(_UNARY) | set(_BINARY)
    return not program.unread() and all(
        isinstance(n, Leaf) or n.op in names or n.op.startswith("adapt_")
        for n in program.nodes)


def compare_gradients(program: Program) -> bool:
    """Whether gradients on special inputs are compared: not through a ``scan`` (fuzz
    finding F4, open for loops with stacks: the jit's reversed loop multiplies the zero
    cotangent of an unread carry or stacked output by an infinite partial, 0 * inf = NaN,
    where eager has none). The fuzzer's ``fori_loop`` has one carry, always read."""
    return not any(isinstance(n, Step) and n.op == "scan" for n in program.nodes)


def blas_products(program: Program) -> bool:
    """Whether the program has a matrix product (an op of kind ``Matmul``): BLAS skips
    the terms of a zero factor, so ``0 * inf`` in a product may give no NaN where a
    loop gives one; eager calls BLAS, the jit tiers loop over small products. NaN
    placement is then not compared on special inputs (values elsewhere are)."""
    return any(isinstance(n, Step) and isinstance(getattr(REGISTRY.get(n.op), "kind", None),
                                                  Matmul) for n in program.nodes)


def ieee_difference(got: np.ndarray, want: np.ndarray, rtol: float, scale: float,
                    signs: bool = False, nan_places: bool = True) -> str | None:
    """Why ``got`` differs from ``want`` (None if it does not): NaN in other places
    (unless not ``nan_places``), other infinities, finite values off by more than
    ``rtol * (|want| + scale)`` or, with ``signs``, zeros of another sign."""
    g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    checks = [("NaN", (np.isnan(g) != np.isnan(w)) if nan_places else np.zeros(g.shape, bool))]
    inf = np.isinf(g) | np.isinf(w)
    checks.append(("infinity", inf & ~np.isnan(g) & ~np.isnan(w) & (g != w)))
    finite = np.isfinite(g) & np.isfinite(w)
    with np.errstate(all="ignore"):
        err = np.where(finite, np.abs(g - w), 0.0)
    checks.append(("finite value", finite & (err > rtol * (np.abs(w) + scale))))
    if signs:
        checks.append(("sign of zero", (g == 0) & (w == 0) & (np.signbit(g) != np.signbit(w))))
    for what, bad in checks:
        if np.any(bad):
            k = int(np.argmax(bad))
            return (f"{what} at flat index {k}: got {g[k]!r}, eager {w[k]!r} "
                    f"({int(np.sum(bad))} of {w.size} elements off)")
    return None


def largest_finite(*arrays: np.ndarray | None) -> float:
    """The largest finite ``|value|`` in ``arrays`` (1.0 at least)."""
    top = 1.0
    for a in arrays:
        if a is not None and a.size:
            f = np.abs(a[np.isfinite(a)].astype(np.float64))
            top = max(top, float(np.max(f, initial=0.0)))
    return top


def array_code(a: np.ndarray) -> str:
    """``np.array(...)`` source of ``a``, infinities and NaN included."""
    text = repr(a.tolist() if a.ndim else a.item())
    return f"np.array({text})".replace("inf", "np.inf").replace("nan", "np.nan")
