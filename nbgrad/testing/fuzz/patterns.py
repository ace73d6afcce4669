"""The step families aimed at the jit's trust bugs: one tensor read through several
views at different offsets in one expression (slices with offsets and negative steps,
integer and boolean indices, stencils, ``x[:, None] * x[None, :]``, ``x @ x.T``),
``fori_loop``/``scan`` bodies with 0-d and n-d carries, the same bodies in a plain Python
loop (unrolled by the trace, re-rolled by the jit), and custom autograd Functions."""

from __future__ import annotations

import numpy as np

from .constructs import FORI_BODIES, NUMPY_FORI, NUMPY_SCAN, UNROLLED_BODIES
from .families import _pick, random_slice, shapes, spelled
from .program import MAX_SIZE, Builder, Rand


# ------------------------------------------------------------------ several reads of one value
def _view(r: Rand, shape: tuple[int, ...], lengths: list[int | None], advanced: int | None
          ) -> tuple:
    """Index items giving ``lengths[d]`` elements of each dim (``None``: an int index,
    the dim dropped); dim ``advanced`` uses an integer array or a boolean mask."""
    items: list = []
    for d, (size, length) in enumerate(zip(shape, lengths, strict=True)):
        if length is None:
            items.append(r.integers(-size, size - 1))
        elif d == advanced and r.booleans():
            picks = r.rng.integers(-size, size, length).tolist()
            items.append([int(v) for v in picks])
        elif d == advanced and length <= size:
            mask = [False] * size
            for k in r.subset(size, length, length):
                mask[k] = True
            items.append(mask)
        elif length == size and r.integers(0, 3) == 0:
            items.append(slice(None))
        else:
            items.append(random_slice(r, size, length))
    while items and items[-1] == slice(None) and r.booleans():
        items.pop()
    return tuple(items)


def two_views(r: Rand, shape: tuple[int, ...]) -> tuple[tuple, tuple]:
    """Two index tuples reading same-shaped, usually different, parts of ``shape``."""
    lengths: list[int | None] = []
    for size in shape:
        kind = r.choice(["int", "slice", "slice", "slice"] if len(shape) > 1 else ["slice"])
        lengths.append(None if kind == "int" else r.integers(1, max(size - 1, 1)) if
                       size > 1 and r.integers(0, 3) else r.integers(1, size))
    dims = [d for d, n in enumerate(lengths) if n is not None]
    advanced = r.choice(dims) if dims and r.integers(0, 2) == 0 else None
    return _view(r, shape, lengths, advanced), _view(r, shape, lengths, advanced)


def _combine(r: Rand, b: Builder, x: int, y: int) -> int | None:
    name = r.choice(["mul", "mul", "mul", "add", "sub", "hypot"])
    return b.add(name, (x, y))


def _reuse(r: Rand, b: Builder) -> None:
    i = _pick(r, b, min_ndim=1)
    if i is None or r.integers(0, 3) == 0:
        i = b.leaf(shapes(r, 1, 2, 5), "real")
    kind = r.choice(["offsets", "offsets", "offsets", "stencil", "outer", "gram",
                     "transpose"])
    shape = b.shape(i)
    if kind == "stencil" and max(shape) >= 3:
        d = r.choice([k for k, s in enumerate(shape) if s >= 3])
        full = [slice(None)] * d
        parts = [b.add("index", (i,), (tuple(full + [slice(lo, hi)]),))
                 for lo, hi in ((None, -2), (1, -1), (2, None))]
        mid = b.add("mul", (parts[1],), (-2.0, "right"))
        first = b.add("add", (parts[0], mid)) if None not in parts and mid is not None \
            else None
        if first is not None and b.add("add", (first, parts[2])) is not None:
            return
    if kind == "outer" and len(shape) == 1 and shape[0] ** 2 <= MAX_SIZE:
        col = b.add("index", (i,), ((slice(None), None),))
        row = b.add("index", (i,), ((None, slice(None)) if r.booleans() else (None,),))
        if col is not None and row is not None and _combine(r, b, col, row) is not None:
            return
    if kind == "gram" and len(shape) == 2:
        t = b.add("transpose", (i,), (0, 1))
        pair = (i, t) if r.booleans() else (t, i)
        if shape[0] == shape[1] and r.booleans():
            pair = (i, i)
        m = b.add("matmul", pair, (r.booleans(),))
        if m is not None:
            i, shape = m, b.shape(m)  # then read the product at two offsets
    if kind == "transpose" and len(shape) == 2 and shape[0] == shape[1]:
        t = b.add("transpose", (i,), (r.choice([0, -2]), r.choice([1, -1])))
        if _combine(r, b, i, t) is not None:
            return
    va, vb = two_views(r, shape)
    a = b.add("index", (i,), (va,))
    c = b.add("index", (i,), (vb,))
    if a is not None and c is not None:
        _combine(r, b, a, c)


# ------------------------------------------------------------------ loops
#: fori_loop bodies to draw from: the ones using the loop index (dtype promotion of the
#: carry, issue 12) twice as often
FORI_CHOICES = [k for k in sorted(FORI_BODIES) if not k.startswith("np_")]
FORI_CHOICES += [k for k in FORI_CHOICES if k.startswith("index")]

def _carry(r: Rand, b: Builder) -> int:
    """A loop's initial carry: an earlier value or its sum (0-d)."""
    i = _pick(r, b)
    if r.booleans() and b.values[i].ndim:
        s = b.add("sum", (i,), (None, False))
        i = i if s is None else s
    return b.operand(i, "unit")


def _closed_over(r: Rand, b: Builder, shape: tuple[int, ...]) -> int:
    """A value a loop body closes over: an earlier one that broadcasts to ``shape`` or a
    new leaf, in the unit domain."""
    fits = [j for j, v in enumerate(b.values) if _broadcasts_into(v.shape, shape)]
    w = r.choice(fits) if fits and r.booleans() else b.leaf(
        tuple(s if r.booleans() else 1 for s in shape), "unit")
    return b.operand(w, "unit")


def _loop(r: Rand, b: Builder) -> None:
    if r.booleans():
        c = _carry(r, b)
        w = _closed_over(r, b, b.shape(c))
        body = spelled(b, r.choice(FORI_CHOICES), NUMPY_FORI)
        if b.add("fori_loop", (c, w), (r.integers(1, 4), body)) is None:
            b.add("tanh", (c,))
        return
    xs = _pick(r, b, min_ndim=1)
    if xs is None or r.booleans():
        xs = b.leaf(shapes(r, 1, 2, 4), "unit")
    xs = b.operand(xs, "unit")
    row = b.shape(xs)[1:]
    full = r.booleans()
    body = r.choice(["accumulate", "gate"]) + ("" if full else "_0d")
    init = b.leaf(row if full else (), "unit")
    body = spelled(b, body, NUMPY_SCAN)
    if b.add("scan", (init, xs), (body, r.choice(["carry", "ys"]), r.booleans())) is None:
        b.add("tanh", (xs,))


def _unrolled(r: Rand, b: Builder) -> None:
    """A plain Python loop of 4 to 8 steps of a fori body: the trace unrolls it and
    re-rolling (:mod:`nbgrad.jit.trace.reroll`) makes it a loop node again."""
    c = _carry(r, b)
    w = _closed_over(r, b, b.shape(c))
    if b.add("unrolled", (c, w), (r.integers(4, 8), r.choice(UNROLLED_BODIES))) is None:
        b.add("tanh", (c,))


# ------------------------------------------------------------------ custom Functions
def _function(r: Rand, b: Builder) -> None:
    i = _pick(r, b)
    name = r.choice(["fn_softclip", "fn_scaled_mul", "fn_softclip_numpy",
                     "fn_scaled_mul_numpy", "fn_sincos_numpy"])
    if name in ("fn_scaled_mul", "fn_scaled_mul_numpy"):
        fits = [j for j, v in enumerate(b.values) if v.shape == b.shape(i)]
        other = r.choice(fits) if r.booleans() else b.leaf(b.shape(i), "real")
        step = b.add(name, (b.operand(i, "real"), b.operand(other, "real")),
                     (r.choice([0.5, 1.5, -2.0]),))
    elif name == "fn_sincos_numpy":
        step = b.add(name, (b.operand(i, "real"),), (r.booleans(),))
    else:
        step = b.add(name, (i,))
    if step is None:
        b.add("sin", (i,))


PATTERNS = {"reuse": _reuse, "loop": _loop, "unrolled": _unrolled, "function": _function}


def _broadcasts_into(small: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    try:
        return np.broadcast_shapes(small, shape) == shape
    except ValueError:
        return False
