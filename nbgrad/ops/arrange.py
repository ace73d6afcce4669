"""Shape and indexing functions written over table ops (as PyTorch's composites):
``movedim``, ``narrow``, ``select``, ``unflatten``, ``ravel``, ``hstack``, ``vstack``,
``atleast_1d/2d/3d``, ``meshgrid``, ``tensor_split``, ``rot90``, ``diff``,
``take_along_dim``, ``trapezoid``. Each differentiates to any order and runs natively in
both jit tiers with no kernel of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..tensor import Tensor
from .dispatch import as_tensor
from .elementwise import where
from .indexing import gather
from .indexing import index as index_at
from .reduction import sum
from .shape import _dim, broadcast_to, cat, expand, flip, permute, reshape, transpose


def movedim(self: Tensor, source, destination) -> Tensor:
    """Dimensions ``source`` moved to positions ``destination`` (ints or sequences); the
    others keep their order."""
    x = as_tensor(self)
    src = [source] if isinstance(source, (int, np.integer)) else list(source)
    dst = [destination] if isinstance(destination, (int, np.integer)) else list(destination)
    if len(src) != len(dst):
        raise RuntimeError(f"movedim: source {tuple(src)} and destination {tuple(dst)} differ "
                           "in length")
    src = [_dim(d, x.ndim, "movedim") for d in src]
    dst = [_dim(d, x.ndim, "movedim") for d in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise RuntimeError(f"movedim: repeated dimension in {tuple(src)} or {tuple(dst)}")
    rest = iter(d for d in range(x.ndim) if d not in src)
    where = dict(zip(dst, src, strict=True))
    return permute(x, tuple(where[k] if k in where else next(rest) for k in range(x.ndim)))


moveaxis = movedim


def narrow(self: Tensor, dim: int, start: int, length: int) -> Tensor:
    """``length`` entries of ``dim`` from ``start`` (a negative start counts from the end)."""
    x = as_tensor(self)
    d = _dim(dim, x.ndim, "narrow")
    n = x.shape[d]
    start = int(start) + (n if start < 0 else 0)
    if not 0 <= start <= n or length < 0 or start + length > n:
        raise IndexError(f"narrow: start {start} and length {length} do not fit dim {d} of "
                         f"size {n} (shape {tuple(x.shape)})")
    return index_at(x, (slice(None),) * d + (slice(start, start + int(length)),))


def select(self: Tensor, dim: int, index: int) -> Tensor:
    """The slice at position ``index`` of ``dim`` (that dimension removed)."""
    x = as_tensor(self)
    d = _dim(dim, x.ndim, "select")
    n = x.shape[d]
    if not -n <= index < n:
        raise IndexError(f"select: index {index} is out of range for dim {d} of size {n}")
    return index_at(x, (slice(None),) * d + (int(index),))


def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
    """Dimension ``dim`` split into ``sizes`` (one may be -1)."""
    x = as_tensor(self)
    d = _dim(dim, x.ndim, "unflatten")
    return reshape(x, (*x.shape[:d], *sizes, *x.shape[d + 1:]))


def ravel(self: Tensor) -> Tensor:
    """The elements as a 1-D tensor (C order)."""
    return reshape(as_tensor(self), (-1,))


def atleast_1d(*tensors):
    """Each tensor with at least one dimension (one tensor, or a tuple of them)."""
    out = tuple(reshape(t, (1,)) if as_tensor(t).ndim == 0 else as_tensor(t)
                for t in _tensors(tensors))
    return out[0] if len(out) == 1 else out


def atleast_2d(*tensors):
    """Each tensor with at least two dimensions (a 1-D one becomes a row)."""
    out = tuple(reshape(t, (1,) * (2 - t.ndim) + tuple(t.shape)) if t.ndim < 2 else t
                for t in map(as_tensor, _tensors(tensors)))
    return out[0] if len(out) == 1 else out


def atleast_3d(*tensors):
    """Each tensor with at least three dimensions (NumPy's rule: (n,) -> (1, n, 1),
    (m, n) -> (m, n, 1))."""
    def three(t: Tensor) -> Tensor:
        shape = {0: (1, 1, 1), 1: (1, *t.shape, 1), 2: (*t.shape, 1)}.get(t.ndim)
        return t if shape is None else reshape(t, shape)
    out = tuple(three(as_tensor(t)) for t in _tensors(tensors))
    return out[0] if len(out) == 1 else out


def _tensors(tensors) -> tuple:
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return tuple(tensors[0])
    return tensors


def hstack(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenation along the second dimension (the first for 1-D tensors)."""
    ts = [as_tensor(t) for t in tensors]
    ts = [reshape(t, (1,)) if t.ndim == 0 else t for t in ts]
    return cat(ts, 0 if ts and ts[0].ndim == 1 else 1)


def vstack(tensors: Sequence[Tensor]) -> Tensor:
    """Concatenation along the first dimension, 1-D tensors as rows."""
    ts = atleast_2d(*tensors)
    return cat(list(ts) if isinstance(ts, tuple) else [ts], 0)


row_stack = vstack


def meshgrid(*tensors, indexing: str = "ij") -> tuple[Tensor, ...]:
    """Coordinate grids of 1-D tensors: ``indexing='ij'`` (PyTorch's default, matrix
    indexing) or ``'xy'`` (NumPy's default, the first two dimensions swapped)."""
    ts = [as_tensor(t) for t in _tensors(tensors)]
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if any(t.ndim > 1 for t in ts):
        raise RuntimeError("meshgrid: expects 0-D or 1-D tensors")
    ts = [reshape(t, (-1,)) for t in ts]
    shape = tuple(t.shape[0] for t in ts)
    grids = [expand(reshape(t, (1,) * k + (-1,) + (1,) * (len(ts) - k - 1)), *shape)
             for k, t in enumerate(ts)]
    if indexing == "xy" and len(ts) >= 2:  # the first two dimensions swapped
        grids = [transpose(g, 0, 1) for g in grids]
    return tuple(grids)


def tensor_split(self: Tensor, indices_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Views split along ``dim``: into ``sections`` parts as equal as can be (the first
    ones one longer), or at the positions ``indices``."""
    x = as_tensor(self)
    d = _dim(dim, x.ndim, "tensor_split")
    n = x.shape[d]
    if isinstance(indices_or_sections, Tensor):  # a 0-d tensor: sections; 1-D: indices
        values = indices_or_sections.numpy()
        indices_or_sections = int(values) if values.ndim == 0 else values.tolist()
    if isinstance(indices_or_sections, (int, np.integer)):
        k = int(indices_or_sections)
        if k <= 0:
            raise RuntimeError(f"tensor_split: sections must be positive, got {k}")
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        bounds = np.cumsum([0] + sizes).tolist()
    else:
        bounds = [0] + [int(i) for i in indices_or_sections] + [n]
    lead = (slice(None),) * d
    return tuple(index_at(x, lead + (slice(min(max(a, 0), n), min(max(b, a, 0), n)),))
                 for a, b in zip(bounds[:-1], bounds[1:], strict=True))


def rot90(self: Tensor, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
    """Rotation by ``k`` quarter turns in the plane ``dims`` (from the first towards the
    second axis, as NumPy and PyTorch)."""
    x = as_tensor(self)
    if len(dims) != 2:
        raise RuntimeError(f"rot90: dims must hold two dimensions, got {tuple(dims)}")
    a, b = (_dim(d, x.ndim, "rot90") for d in dims)
    if a == b:
        raise RuntimeError(f"rot90: dims {tuple(dims)} name the same dimension")
    k = int(k) % 4
    if k == 0:
        return x
    if k == 2:
        return flip(flip(x, a), b)
    if k == 1:
        return transpose(flip(x, b), a, b)
    return flip(transpose(x, a, b), b)


def diff(self: Tensor, n: int = 1, dim: int = -1, prepend=None, append=None) -> Tensor:
    """The ``n``-th forward difference along ``dim`` (``prepend``/``append`` joined first)."""
    x = as_tensor(self)
    d = _dim(dim, x.ndim, "diff")
    parts = [as_tensor(p) for p in (prepend,) if p is not None] + [x] + \
        [as_tensor(p) for p in (append,) if p is not None]
    if len(parts) > 1:
        x = cat([p if p.ndim == x.ndim else broadcast_to(
            p, x.shape[:d] + (1,) + x.shape[d + 1:]) for p in parts], d)
    lead = (slice(None),) * d
    for _ in range(int(n)):
        x = index_at(x, lead + (slice(1, None),)) - index_at(x, lead + (slice(None, -1),))
    return x


def take_along_dim(self: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """``self`` at ``indices`` along ``dim`` (both broadcast but for ``dim``); the flat
    entries when ``dim`` is None (NumPy's ``take_along_axis``). Negative indices count
    from the end, as PyTorch's."""
    x, idx = as_tensor(self), as_tensor(indices)
    if dim is None:
        idx = reshape(idx, (-1,))
        return gather(reshape(x, (-1,)), 0, where(idx < 0, idx + x.numel(), idx))
    d = _dim(dim, x.ndim, "take_along_dim")
    idx = where(idx < 0, idx + x.shape[d], idx)
    if idx.ndim != x.ndim:
        raise RuntimeError(f"take_along_dim: indices of shape {tuple(idx.shape)} need "
                           f"{x.ndim} dimensions")
    shape = np.broadcast_shapes(x.shape[:d] + (1,) + x.shape[d + 1:],
                                idx.shape[:d] + (1,) + idx.shape[d + 1:])
    x = broadcast_to(x, shape[:d] + (x.shape[d],) + shape[d + 1:])
    idx = broadcast_to(idx, shape[:d] + (idx.shape[d],) + shape[d + 1:])
    return gather(x, d, idx)


def trapezoid(y: Tensor, x: Tensor | None = None, *, dx: float = 1.0,
              dim: int = -1) -> Tensor:
    """The trapezoidal rule along ``dim``: samples ``y`` at points ``x`` (spacing ``dx``
    when ``x`` is None)."""
    y = as_tensor(y)
    d = _dim(dim, y.ndim, "trapezoid")
    lead = (slice(None),) * d
    mid = (index_at(y, lead + (slice(1, None),)) + index_at(y, lead + (slice(None, -1),))) * 0.5
    if x is None:
        return sum(mid, d) * float(dx)
    x = as_tensor(x)
    step = diff(x, dim=-1 if x.ndim == 1 else d)
    if x.ndim == 1:
        step = reshape(step, (-1,) + (1,) * (y.ndim - d - 1))
    return sum(mid * step, d)


trapz = trapezoid

__all__ = ["atleast_1d", "atleast_2d", "atleast_3d", "diff", "hstack", "meshgrid",
           "moveaxis", "movedim", "narrow", "ravel", "rot90", "row_stack", "select",
           "take_along_dim", "tensor_split", "trapezoid", "trapz", "unflatten", "vstack"]
