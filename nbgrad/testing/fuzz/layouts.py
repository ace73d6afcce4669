"""Argument layouts: the same leaf values, laid out in memory the ways users pass them.

A jitted function must give the same results whatever the memory behind its arguments:
contiguous or strided, reversed (negative strides), transposed (Fortran order), at an
offset into a larger array, and several arguments inside one buffer. Executors that
read arguments in place, or key anything by buffer, get these wrong in ways contiguous
fresh arrays never show (tier 2 once read one buffer at two offsets). :func:`leaves`
builds the leaf tensors of one call from ``arrays`` by a seeded draw: every array is
copied into its own slot of one shared 1-D buffer (slots in random order, with gaps)
and viewed there in one of :data:`LAYOUTS`, through nbgrad's own view ops, so each leaf
is a user-made tensor that shares the buffer and holds exactly the array's values.
"""

from __future__ import annotations

import numpy as np

from ...factories import from_numpy
from ...tensor import Tensor

#: how a leaf may sit in the shared buffer
LAYOUTS = ("contiguous", "strided", "reversed", "transposed")


def _gap(dt: np.dtype):
    """What fills the buffer outside the leaves: NaN, or a large integer."""
    return np.nan if dt.kind in "fc" else (True if dt.kind == "b" else 12345)


def _slot_size(shape: tuple[int, ...], layout: str) -> int:
    n = int(np.prod(shape, dtype=np.int64))
    return 2 * n if layout == "strided" else n


def _choose(shape: tuple[int, ...], rng: np.random.Generator) -> str:
    if not shape or 0 in shape:
        return "contiguous"
    options = [x for x in LAYOUTS if x != "transposed" or len(shape) >= 2]
    return options[int(rng.integers(len(options)))]


def _view(base: Tensor, start: int, shape: tuple[int, ...], layout: str) -> Tensor:
    """The leaf's view of ``base`` (a 1-D tensor) at ``start`` in ``layout``."""
    n = int(np.prod(shape, dtype=np.int64))
    if layout == "strided":  # every other element of a slot twice the size
        last = shape[-1]
        return base[start:start + 2 * n].reshape(*shape[:-1], 2 * last)[..., ::2]
    if layout == "reversed":  # the slot holds the rows in reverse order
        return base[start:start + n].reshape(*shape)[::-1]
    if layout == "transposed":  # the slot holds the transpose, C-ordered
        return base[start:start + n].reshape(*reversed(shape)).permute(
            *range(len(shape) - 1, -1, -1))
    return base[start:start + n].reshape(*shape)


def _fill(buf: np.ndarray, start: int, a: np.ndarray, layout: str) -> None:
    """Write ``a`` into ``buf`` so that :func:`_view` of the slot reads ``a``."""
    n = a.size
    if layout == "strided":
        slot = buf[start:start + 2 * n].reshape(*a.shape[:-1], 2 * a.shape[-1])
        slot[..., ::2] = a
        slot[..., 1::2] = _gap(buf.dtype)  # never read: a reader of the gaps shows it
    elif layout == "reversed":
        buf[start:start + n] = a[::-1].ravel()
    elif layout == "transposed":
        buf[start:start + n] = a.T.ravel()
    elif n:
        buf[start:start + n] = a.ravel()


def leaves(arrays: list[np.ndarray], rng: np.random.Generator
           ) -> tuple[list[Tensor], list[str]]:
    """Leaf tensors (requiring grad) holding ``arrays``' values in one shared buffer,
    and the layout each got. Arrays of different dtypes get one buffer per dtype."""
    layouts = [_choose(a.shape, rng) for a in arrays]
    out: list[Tensor | None] = [None] * len(arrays)
    for dt in sorted({a.dtype.str for a in arrays}):
        ks = [k for k, a in enumerate(arrays) if a.dtype.str == dt]
        order = [ks[i] for i in rng.permutation(len(ks))]
        starts, pos = {}, 0
        for k in order:
            pos += int(rng.integers(0, 3))  # a gap: leaves at odd offsets, not touching
            starts[k] = pos
            pos += _slot_size(arrays[k].shape, layouts[k])
        buf = np.full(pos + 1, _gap(np.dtype(dt)), np.dtype(dt))
        for k in order:
            _fill(buf, starts[k], arrays[k], layouts[k])
        base = from_numpy(buf)
        for k in order:
            view = _view(base, starts[k], arrays[k].shape, layouts[k])
            out[k] = view.detach().requires_grad_(True)
    return out, layouts  # type: ignore[return-value]


def describe(layouts: list[str]) -> str:
    """A short account of a call's layouts, for a mismatch report."""
    return ", ".join(f"x{k} {name}" for k, name in enumerate(layouts) if name != "contiguous") \
        or "all contiguous"
