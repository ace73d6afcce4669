"""The step families of fuzz programs: unary, binary and ternary elementwise ops
(broadcast shapes, Python-scalar operands), reductions, shape ops, indexing and
products. Each family draws one step (or a safe fallback) onto a :class:`Builder`,
keeping every op inside its domain and away from non-differentiable points."""

from __future__ import annotations

import math

import numpy as np

from .catalogue import _BINARY_DOMAINS, _UNARY_DOMAINS, DOMAIN_OK, NUMPY_SPELLINGS
from .program import GAP, MAX_SIZE, Builder, Rand, leaf_value


def _size(shape) -> int:
    return math.prod(shape)


# ------------------------------------------------------------------ strategies
def shapes(r: Rand, min_dims: int = 0, max_dims: int = 3, max_side: int = 4
           ) -> tuple[int, ...]:
    """A small shape (total size at most ``MAX_SIZE // 2``)."""
    while True:
        shape = tuple(r.integers(1, max_side) for _ in range(r.integers(min_dims, max_dims)))
        if _size(shape) <= MAX_SIZE // 2:
            return shape


def broadcast_partner(r: Rand, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape`` to ``shape`` or wider."""
    dims = [r.choice((s, 1)) if s > 1 else r.choice((1, 2)) for s in shape]
    drop = r.integers(0, len(dims))
    dims = dims[drop:]
    if drop == 0 and len(shape) < 3 and r.booleans():  # one more leading dim
        dims = [r.integers(1, 2)] + dims
    out = tuple(dims)
    full = np.broadcast_shapes(shape, out)
    return out if _size(full) <= MAX_SIZE // 2 else tuple(shape[drop:])


def random_slice(r: Rand, size: int, length: int) -> slice:
    """A slice of ``length`` elements of a dim of ``size``: any offset, a step of 1 or 2,
    forwards or backwards, bounds written positive or negative or left out."""
    steps = [k for k in (1, 2, -1, -2) if (length - 1) * abs(k) + 1 <= size]
    step = r.choice(steps)
    span = (length - 1) * abs(step) + 1
    offset = r.integers(0, size - span)
    if step > 0:
        start, stop = offset, offset + span
        stop = None if stop == size and r.booleans() else stop
    else:
        start, stop = size - 1 - offset, size - 1 - offset - span
        stop = None if stop < 0 else stop
    if start is not None and r.booleans():
        start = start - size
        if start == -size and step > 0 and r.booleans():
            start = None
    if stop is not None and stop >= 0 and r.booleans() and stop - size < 0:
        stop = stop - size
    return slice(start, stop, None if step == 1 and r.booleans() else step)


def _pick(r: Rand, b: Builder, min_ndim: int = 0) -> int | None:
    """An earlier value (recent ones more likely) with at least ``min_ndim`` dims."""
    choices = [i for i, v in enumerate(b.values) if v.ndim >= min_ndim]
    if not choices:
        return None
    k = r.integers(0, len(choices) - 1)
    return choices[len(choices) - 1 - k]


def _dim(r: Rand, ndim: int) -> int:
    """A valid dim, negative half of the time (0-d tensors accept 0 and -1)."""
    n = max(ndim, 1)
    d = r.integers(0, n - 1)
    return d - n if r.booleans() else d


def _dims(r: Rand, ndim: int, allow_tuple: bool = True):
    kind = r.choice(["none", "int", "tuple"] if allow_tuple and ndim >= 2
                    else ["none", "int"])
    if kind == "none":
        return None
    if kind == "int":
        return _dim(r, ndim)
    dims = r.subset(ndim, 1, ndim)
    return tuple(d - ndim if r.booleans() else d for d in dims)


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
#: the share of steps with a NumPy spelling that use it (``np.sin(x)`` for ``nb.sin(x)``)
NUMPY_SHARE = 0.25


def spelled(b: Builder, name: str, spellings: dict[str, str] = NUMPY_SPELLINGS) -> str:
    """Step kind (or loop body) ``name``, or for about :data:`NUMPY_SHARE` of the steps its
    NumPy spelling in ``spellings`` (the same ops, reached through NumPy's ufuncs or
    functions). Drawn from a generator of its own, so a seed's program is the same as
    without spellings but for how steps are written."""
    numpy = spellings.get(name)
    if numpy is None or np.random.default_rng([b.seed, 17, len(b.nodes)]).random() >= \
            NUMPY_SHARE:
        return name
    return numpy


def _unary(r: Rand, b: Builder) -> None:
    i = _pick(r, b)
    name = r.choice(sorted(_UNARY_DOMAINS))
    x = b.operand(i, _UNARY_DOMAINS[name])
    if b.add(spelled(b, name), (x,)) is None:
        b.add("tanh", (i,))


def _binary(r: Rand, b: Builder) -> None:
    i = _pick(r, b)
    name = r.choice(sorted(_BINARY_DOMAINS))
    da, db = _BINARY_DOMAINS[name]
    swap = r.booleans()  # ``other op x`` rather than ``x op other``
    how = r.choice(["fresh", "existing", "scalar", "zero_d"])
    if how == "scalar":  # a Python number as one operand, in that operand's domain
        side = "left" if swap else "right"
        x = b.operand(i, db if swap else da)
        value = float(np.round(leaf_value(b.seed, 1000 + len(b.nodes), (),
                                          da if swap else db), 3))
        if _scalar_ok(value, da if swap else db) and _binary_ok(name, b, x, value, side) \
                and b.add(spelled(b, name), (x,), (value, side)) is not None:
            return
        b.add("mul", (i,), (0.5, "right"))
        return
    shape = b.shape(i)
    other = None
    if how == "existing":
        fits = [j for j, v in enumerate(b.values) if j != i and _broadcasts(shape, v.shape)]
        if fits:
            other = fits[r.integers(0, len(fits) - 1)]
    if how == "zero_d":  # a 0-d leaf broadcast over ``i`` (code may hoist work on it)
        other = b.leaf((), da if swap else db)
    if other is None:
        other = b.leaf(broadcast_partner(r, shape), db)
    x, y = b.operand(i, da), b.operand(other, db)
    if swap:  # ``b op a`` with the domains following the operands
        x, y = b.operand(other, da), b.operand(i, db)
    if _binary_ok(name, b, x, y) and b.add(spelled(b, name), (x, y)) is not None:
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


def _ternary(r: Rand, b: Builder) -> None:
    i = _pick(r, b)
    shape = b.shape(i)
    kind = r.choice(["where", "lerp", "clamp"])
    if kind == "clamp":
        lo, hi = sorted(r.rng.choice([-1.5, -0.5, 0.0, 0.5, 1.5], 2, replace=False).tolist())
        v = b.values[i]
        if np.all(np.abs(v - lo) >= GAP) and np.all(np.abs(v - hi) >= GAP):
            if b.add("clamp", (i,), (lo, hi)) is not None:
                return
    else:
        other = b.leaf(broadcast_partner(r, shape), "real")
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
           "topk", "layer_norm", "fft_real", "ifft_rfft_imag", "irfft_rfft")


def _reduce(r: Rand, b: Builder) -> None:
    i = _pick(r, b)
    name = r.choice(_REDUCE)
    ndim = b.values[i].ndim
    step = _reduce_step(r, b, name, i, ndim)
    if step is None or b.add(spelled(b, step[0]), *step[1:]) is None:
        b.add("sum", (i,), (_dims(r, ndim), r.booleans()))


def _reduce_step(r: Rand, b: Builder, name: str, i: int, ndim: int):
    """(op, inputs, params) for a reduction-like step, or None where it would be unsafe."""
    keep = r.booleans()
    if name in ("sum", "mean", "logsumexp"):
        return name, (i,), (_dims(r, ndim), keep)
    if name in ("prod", "cumprod"):
        x = b.operand(i, "small")
        if name == "cumprod":
            return name, (x,), (_dim(r, ndim),)
        return name, (x,), (_dims(r, ndim), keep)
    if name in ("amax", "amin", "max_dim", "min_dim"):
        dim = _dims(r, ndim) if name in ("amax", "amin") else _dim(r, ndim)
        rows = _groups(b.values[i], _axes(dim, ndim))
        ok = _gaps_ok(rows, "top" if name in ("amax", "max_dim") else "bottom")
        return (name, (i,), (dim, keep)) if ok else None
    if name in ("var", "std"):
        dim = _dims(r, ndim)
        correction = r.choice([0, 1])
        rows = _groups(b.values[i], _axes(dim, ndim))
        if rows.shape[1] - correction < 1 or np.min(np.var(rows, axis=1)) < GAP:
            return None
        return name, (i,), (dim, keep, correction)
    if name == "norm":
        p = r.choice([1, 2, 3, "inf"])  # a string keeps repr() Python
        dim = _dims(r, ndim)
        x = b.operand(i, "nonzero") if p == 1 else i
        rows = np.abs(_groups(b.values[x], _axes(dim, ndim)))
        if p == "inf" and not _gaps_ok(rows, "top"):
            return None
        if np.min(np.sqrt(np.sum(rows ** 2, axis=1))) < 0.1:
            return None
        return name, (x,), (dim, keep, p)
    if name in ("cumsum", "softmax", "log_softmax"):
        return name, (i,), (_dim(r, ndim),)
    if name in ("fft_real", "ifft_rfft_imag", "irfft_rfft"):
        dim = _dim(r, ndim)
        if ndim == 0 or b.shape(i)[dim] < (2 if name == "irfft_rfft" else 1):
            return None
        return name, (i,), (dim, r.choice(["backward", "ortho", "forward"]))
    if name in ("sort", "topk"):
        dim = _dim(r, ndim)
        descending = r.booleans()
        rows = _groups(b.values[i], _axes(dim, ndim))
        if not _gaps_ok(rows, "all"):
            return None
        if name == "sort":
            return name, (i,), (dim, descending)
        k = r.integers(1, rows.shape[1])
        return name, (i,), (dim, descending, k)
    # layer_norm over the last dims, with weight and bias sometimes
    if ndim == 0:
        return None
    k = r.integers(1, min(ndim, 2))
    normalized = b.shape(i)[ndim - k:]
    rows = b.values[i].reshape(-1, _size(normalized))
    if rows.shape[1] < 2 or np.min(np.var(rows, axis=1)) < GAP:
        return None
    extra = tuple(b.leaf(normalized, "real") for _ in range(r.integers(0, 2)))
    return name, (i, *extra), (tuple(normalized),)


_SHAPE_OPS = ("reshape", "flatten", "transpose", "permute", "unsqueeze", "squeeze", "flip",
              "roll", "expand", "repeat", "tile", "tril", "triu", "cat", "stack", "split",
              "chunk", "pad")


def _shape_op(r: Rand, b: Builder) -> None:
    i = _pick(r, b)
    name = r.choice(_SHAPE_OPS)
    step = _shape_step(r, b, name, i)
    if step is None or b.add(*step) is None:
        b.add("unsqueeze", (i,), (0,))


def _shape_step(r: Rand, b: Builder, name: str, i: int):
    shape = b.shape(i)
    nd = len(shape)
    n = _size(shape)
    if name == "reshape":
        options = [(n,), (-1,), tuple(reversed(shape)), (1, n), (n, 1)]
        divisors = [d for d in range(2, n) if n % d == 0]
        options += [(d, -1) for d in divisors]
        return name, (i,), (r.choice(options),)
    if name == "flatten":
        if nd == 0:
            return name, (i,), (0, -1)
        s = r.integers(0, nd - 1)
        return name, (i,), (s, r.integers(s, nd - 1))
    if name == "transpose":
        return name, (i,), (_dim(r, nd), _dim(r, nd))
    if name == "permute":
        return name, (i,), (tuple(r.permutation(nd)),)
    if name == "unsqueeze":
        return name, (i,), (_dim(r, nd + 1),)
    if name == "squeeze":
        ones = [d for d, s in enumerate(shape) if s == 1]
        return name, (i,), (r.choice(ones) if ones and r.booleans()
                            else None,)
    if name == "flip":
        if nd == 0:
            return None
        dims = r.subset(nd, 1, nd)
        return name, (i,), (tuple(dims),)
    if name == "roll":
        if nd == 0:
            return None
        dims = tuple(r.subset(nd, 1, nd))
        shifts = tuple(r.integers(-3, 3) for _ in dims)
        return name, (i,), (shifts, dims)
    if name == "expand":
        size = tuple(r.choice([s, 3]) if s == 1 else s for s in shape)
        if r.booleans():
            size = (2,) + size
        return (name, (i,), (size,)) if _size(size) <= MAX_SIZE else None
    if name in ("repeat", "tile"):
        reps = tuple(r.integers(1, 2) for _ in range(nd + r.integers(0, 1)))
        if name == "repeat" and len(reps) < nd or not reps:
            return None
        return (name, (i,), (reps,)) if n * _size(reps) <= MAX_SIZE else None
    if name in ("tril", "triu"):
        return (name, (i,), (r.integers(-1, 1),)) if nd >= 2 else None
    if name in ("cat", "stack"):
        if nd == 0 and name == "cat":
            return None
        d = _dim(r, nd + (name == "stack"))
        other_shape = list(shape)
        if name == "cat":
            other_shape[d] = r.integers(1, 2)
        other = b.leaf(tuple(other_shape), "real")
        order = (other, i) if r.booleans() else (i, other)
        return name, order, (d,)
    if name in ("split", "chunk"):
        if nd == 0:
            return None
        d = _dim(r, nd)
        size = shape[d]
        pieces = r.integers(1, max(size, 1))
        count = -(-size // pieces) if name == "split" else len(
            range(0, size, -(-size // pieces)))
        return name, (i,), (pieces, d, r.integers(0, count - 1))
    # pad: constant padding (negative = crop) of the last one or two dims
    if nd == 0:
        return None
    k = r.integers(1, min(nd, 2))
    pad = []
    for j in range(k):
        s = shape[nd - 1 - j]
        pad += [r.integers(-(s - 1) if s > 1 else 0, 2), r.integers(0, 2)]
    value = r.choice([0.0, 0.5])
    grown = n * math.prod(shape[nd - 1 - j] + pad[2 * j] + pad[2 * j + 1]
                          for j in range(k)) // max(math.prod(shape[nd - k:]), 1)
    return (name, (i,), (tuple(pad), value)) if grown <= MAX_SIZE else None


_INDEX_OPS = ("index_basic", "index_advanced", "index_mask", "gather", "index_select",
              "take", "masked_fill", "scatter_add", "diagonal", "trace")


def _index(r: Rand, b: Builder) -> None:
    name = r.choice(_INDEX_OPS)
    i = _pick(r, b, min_ndim=2 if name in ("diagonal", "trace") else 0)
    if i is None:
        i = _pick(r, b)
        name = "index_basic"
    step = _index_step(r, b, name, i)
    if step is None or b.add(*step) is None:
        b.add("index", (i,), ((Ellipsis,),))


def _index_step(r: Rand, b: Builder, name: str, i: int):
    shape = b.shape(i)
    nd = len(shape)
    rng = np.random.default_rng([b.seed, 4, len(b.nodes)])
    if name == "index_basic":
        items: list = []
        for s in shape:
            kind = r.choice(["int", "slice", "full"])
            if kind == "int":
                items.append(r.integers(-s, s - 1))
            elif kind == "slice":
                items.append(random_slice(r, s, r.integers(1, s)))
            else:
                items.append(slice(None))
        if r.booleans():
            items.insert(r.integers(0, len(items)), None)
        if items and r.booleans():
            items[0] = Ellipsis
        return "index", (i,), (tuple(items),)
    if nd == 0:
        return None
    d = r.integers(0, nd - 1)
    if name == "index_advanced":
        idx = rng.integers(-shape[d], shape[d], r.integers(1, 4)).tolist()
        items = [slice(None)] * d + [idx]
        return "index", (i,), (tuple(items),)
    if name == "index_mask":
        mask = (rng.random(shape[:d + 1]) > 0.4).tolist()
        return "index", (i,), ((mask,),)
    if name == "gather":
        index_shape = tuple(r.integers(1, s) if k != d else r.integers(1, 4)
                            for k, s in enumerate(shape))
        return "gather", (i,), (d, rng.integers(0, shape[d], index_shape).tolist())
    if name == "index_select":
        return "index_select", (i,), (d, rng.integers(0, shape[d], r.integers(1, 4)).tolist())
    if name == "take":
        n = _size(shape)
        return "take", (i,), (rng.integers(-n, n, shapes(r, 0, 2, 3)).tolist(),)
    if name == "masked_fill":
        mask = rng.random(shape[d:]) > 0.5
        return "masked_fill", (i,), (mask.tolist(), r.choice([0.0, -1.5]))
    if name == "scatter_add":
        index_shape = tuple(r.integers(1, s) for s in shape)
        index = rng.integers(0, shape[d], index_shape).tolist()
        src = b.leaf(index_shape, "real")
        return "scatter_add", (i, src), (d, index)
    if name == "diagonal":
        d1, d2 = r.permutation(nd)[:2]
        return "diagonal", (i,), (r.integers(-1, 1), d1, d2)
    return ("trace", (i,), ()) if nd == 2 else None


def _product(r: Rand, b: Builder) -> None:
    i = _pick(r, b, min_ndim=1)
    if i is None:
        i = b.leaf(shapes(r, 1, 2), "real")
    shape = b.shape(i)
    nd, n = len(shape), shape[-1]
    k = r.integers(1, 3)
    choice = r.choice(["matmul", "matmul_vec", "batched", "special", "linear",
                       "mse_loss"])
    if choice == "matmul":
        step = ("matmul", (i, b.leaf((n, k))), (r.booleans(),) if r.booleans() else ())
    elif choice == "matmul_vec":  # vector @ x or x @ vector
        if nd == 1 or r.booleans():
            step = ("matmul", (i, b.leaf((n,))), ())
        else:
            m = shape[-2]
            step = ("matmul", (b.leaf((m,)), i), ())
    elif choice == "batched":
        batch = r.choice([c for c in [(2,), (1,), (2, 1)] if _broadcasts(shape[:-2], c)])
        step = ("matmul", (i, b.leaf(batch + (n, k))), ())
    elif choice == "special":
        if nd == 1:
            step = r.choice([("dot", (i, b.leaf((n,))), ()),
                             ("outer", (i, b.leaf((k,))), ())])
        elif nd == 2:
            step = r.choice([("mm", (i, b.leaf((n, k))), ()),
                             ("einsum", (i, b.leaf((n, k))), ("ij,jk->ik",)),
                             ("einsum", (i,), ("ij->j",))])
        else:
            step = ("bmm", (i, b.leaf(shape[:1] + (n, k))), ()) if nd == 3 else None
    elif choice == "linear":
        bias = (b.leaf((k,)),) if r.booleans() else ()
        step = ("linear", (i, b.leaf((k, n)), *bias), ())
    else:
        target = b.leaf(broadcast_partner(r, shape))
        step = ("mse_loss", (i, target), (r.choice(["mean", "sum", "none"]),))
    if step is None or b.add(*step) is None:
        b.add("tanh", (i,))


