"""Shape ops: views (``reshape``, ``permute``, ``expand``...) and joins (``cat``, ``split``...).

Views return NumPy views of the input and share its version counter; pure data
movement uses NumPy's copies (there is no arithmetic to compile).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

from .. import ops as _ops  # the package, resolved at call time (indexing imports shape)
from ..kernels import matrix as mk
from ..kernels.layout import c_contiguous, call_native
from ..tensor import Tensor
from .convert import to_dtype
from .dispatch import apply, as_tensor, promote_operands
from .registry import formula_helper, get, kernel, op_function
from .traits import Broadcast, Fill, Join, Move, NativePlan, Opaque, Permute, View, batching

__all__ = [
    "broadcast_tensors",
    "broadcast_to",
    "cat",
    "chunk",
    "clone",
    "concatenate",
    "contiguous",
    "expand",
    "expand_as",
    "flatten",
    "flip",
    "ones_like",
    "pad",
    "permute",
    "repeat",
    "reshape",
    "roll",
    "split",
    "split_with_sizes",
    "squeeze",
    "stack",
    "swapaxes",
    "t",
    "tile",
    "transpose",
    "tril",
    "triu",
    "unbind",
    "unsqueeze",
    "view",
    "zeros_like",
]


def _ints(size, op: str) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    try:
        return tuple(operator.index(s) for s in size)  # not int(): 2.5 is an error
    except TypeError:
        raise TypeError(f"{op}: sizes must be ints, got {tuple(size)!r}") from None


def _dim(d: int, ndim: int, op: str) -> int:
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    if not isinstance(d, (int, np.integer)):
        raise TypeError(f"{op}: dim must be an int, got {type(d).__name__}")
    if not lo <= d <= hi:
        raise IndexError(
            f"{op}: dim {d} is out of range for a tensor of {ndim} dimension(s) "
            f"(expected in [{lo}, {hi}])"
        )
    return int(d) % max(ndim, 1)


# ------------------------------------------------------------------ reshape family
@kernel("reshape", view_of=0, kind=View())
def _reshape_kernel(x, shape):
    try:
        return x.reshape(shape)
    except ValueError:
        raise RuntimeError(
            f"reshape: shape {tuple(shape)} is invalid for a tensor of shape "
            f"{x.shape} ({x.size} elements)"
        ) from None


@op_function("reshape")
def reshape(self: Tensor, *shape) -> Tensor:
    """The same elements in a new shape (a view when possible); one size may be -1."""
    shape = _ints(shape, "reshape")
    if self.shape == shape:
        return self
    return apply(get("reshape"), (self, shape))


@kernel("view", view_of=0, kind=View())
def _view_kernel(x, size):
    if x.flags.c_contiguous:
        return _reshape_kernel(x, size)
    try:
        return np.reshape(x, size, copy=False)  # a view whenever the strides allow one
    except ValueError:
        _reshape_kernel(x, size)  # a size that does not fit raises reshape's error
        raise RuntimeError(f"view: shape {tuple(size)} is not compatible with the strides of "
                           f"this non-contiguous tensor of shape {x.shape}; use reshape()"
                           ) from None


@op_function("view")
def view(self: Tensor, *size) -> Tensor:
    """A view with a new shape, as PyTorch: any tensor whose strides allow one (a
    contiguous one always does); otherwise a RuntimeError pointing to ``reshape``."""
    return apply(get("view"), (self, _ints(size, "view")))


@kernel("flatten", view_of=0, kind=View())
def _flatten_kernel(x, start_dim, end_dim):
    if x.ndim == 0:
        return x.reshape(1)
    shape = (
        x.shape[:start_dim]
        + (int(np.prod(x.shape[start_dim : end_dim + 1])),)
        + x.shape[end_dim + 1 :]
    )
    return x.reshape(shape)


@op_function("flatten")
def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dimensions ``start_dim..end_dim`` into one."""
    nd = max(self.ndim, 1)
    s = _dim(start_dim, nd, "flatten")
    e = _dim(end_dim, nd, "flatten")
    if s > e:
        raise IndexError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return apply(get("flatten"), (self, s, e))


def _permute_perm(attrs: dict, ndim: int) -> tuple[int, ...]:
    return tuple(int(d) % ndim for d in attrs["dims"]) if ndim else ()


def _transpose_perm(attrs: dict, ndim: int) -> tuple[int, ...]:
    perm = list(range(ndim))
    if ndim:
        d0, d1 = attrs["dim0"] % ndim, attrs["dim1"] % ndim
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return tuple(perm)


@kernel("permute", view_of=0, kind=Permute(_permute_perm))
def _permute_kernel(x, dims):
    return np.transpose(x, dims)


@formula_helper
def inverse_permutation(dims) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(dims))


@op_function("permute")
def permute(self: Tensor, *dims) -> Tensor:
    """Reorder the dimensions."""
    dims = _ints(dims, "permute")
    if sorted(d % max(self.ndim, 1) for d in dims) != list(range(self.ndim)):
        raise RuntimeError(
            f"permute: dims {dims} are not a permutation of the "
            f"{self.ndim} dimensions of shape {self.shape}"
        )
    return apply(get("permute"), (self, tuple(d % max(self.ndim, 1) for d in dims)))


@kernel("transpose", view_of=0, kind=Permute(_transpose_perm))
def _transpose_kernel(x, dim0, dim1):
    return np.swapaxes(x, dim0, dim1) if x.ndim else x.view()  # 0-d: dims 0 and -1 allowed


@op_function("transpose")
def transpose(self: Tensor, dim0: int, dim1: int) -> Tensor:
    """Swap two dimensions."""
    nd = max(self.ndim, 1)
    d0, d1 = _dim(dim0, nd, "transpose"), _dim(dim1, nd, "transpose")
    return apply(get("transpose"), (self, d0, d1))


def swapaxes(self: Tensor, axis0: int, axis1: int) -> Tensor:
    return transpose(self, axis0, axis1)


def t(self: Tensor) -> Tensor:
    """Transpose of a 2-D tensor (0-D and 1-D tensors are returned as they are)."""
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor of at most 2 dimensions, got {self.ndim}")
    return transpose(self, 0, 1) if self.ndim == 2 else self


@kernel("squeeze", view_of=0, kind=View())
def _squeeze_kernel(x, dim):
    dims = tuple(i for i, s in enumerate(x.shape) if s == 1 and (dim is None or i in dim))
    return np.squeeze(x, axis=dims) if dims else x.view()


@op_function("squeeze")
def squeeze(self: Tensor, dim=None) -> Tensor:
    """Remove dimensions of size 1 (all of them, or those in ``dim``)."""
    if dim is not None:
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        dim = tuple(sorted({_dim(d, max(self.ndim, 1), "squeeze") for d in dims}))
    return apply(get("squeeze"), (self, dim))


@kernel("unsqueeze", view_of=0, kind=View())
def _unsqueeze_kernel(x, dim):
    return np.expand_dims(x, dim)


@op_function("unsqueeze")
def unsqueeze(self: Tensor, dim: int) -> Tensor:
    """Insert a dimension of size 1 at ``dim``."""
    return apply(get("unsqueeze"), (self, _dim(dim, self.ndim + 1, "unsqueeze")))


@kernel("expand", view_of=0, kind=Broadcast())
def _expand_kernel(x, size):
    try:
        return np.broadcast_to(x, size)
    except ValueError:
        raise RuntimeError(f"expand: shape {x.shape} cannot be expanded to {tuple(size)}") from None


@op_function("expand")
def expand(self: Tensor, *size) -> Tensor:
    """Broadcast to ``size`` without copying (-1 keeps a dimension)."""
    size = _ints(size, "expand")
    lead = len(size) - self.ndim
    if lead < 0:
        raise RuntimeError(f"expand: cannot expand shape {self.shape} to fewer dimensions {size}")
    size = tuple(self.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    if size == self.shape:
        return self
    return apply(get("expand"), (self, size))


@kernel("broadcast_to", view_of=0, kind=Broadcast())
def _broadcast_to_kernel(x, size):
    return _expand_kernel(x, size)


@op_function("broadcast_to")
def broadcast_to(self: Tensor, size) -> Tensor:
    """NumPy's broadcasting to ``size`` (a read-only view)."""
    size = _ints((size,), "broadcast_to")
    if size == self.shape:
        return self
    return apply(get("broadcast_to"), (self, size))


def expand_as(self: Tensor, other: Tensor) -> Tensor:
    return expand(self, other.shape)


def broadcast_tensors(*tensors: Tensor) -> tuple[Tensor, ...]:
    shape = np.broadcast_shapes(*(t.shape for t in tensors))
    return tuple(expand(t, shape) for t in tensors)


@kernel("contiguous", kind=View())
def _contiguous_kernel(x):
    return c_contiguous(x) if not x.flags.c_contiguous else x.copy()


@op_function("contiguous")
def contiguous(self: Tensor) -> Tensor:
    """A C-contiguous copy (or ``self`` when it already is contiguous)."""
    if self._data.flags.c_contiguous:
        return self
    return apply(get("contiguous"), (self,))


def clone(self: Tensor) -> Tensor:
    """A copy that stays in the graph."""
    return apply(get("contiguous"), (self,))


# ------------------------------------------------------------------ joins and splits
@formula_helper
def sizes_along(tensors, dim: int) -> tuple[int, ...]:
    """The size of each tensor along ``dim``."""
    return tuple(t.shape[dim] for t in tensors)


def _check_list(tensors, op: str) -> list[Tensor]:
    if isinstance(tensors, Tensor) or not isinstance(tensors, Sequence) or not tensors:
        raise TypeError(f"{op}: expected a non-empty list of tensors")
    return promote_operands(*tensors)


@kernel("cat", kind=Join())
def _cat_kernel(tensors, dim):
    try:
        return np.concatenate(tensors, axis=dim)
    except ValueError:
        shapes = [a.shape for a in tensors]
        raise RuntimeError(f"cat: shapes {shapes} do not match outside dim {dim}") from None


@op_function("cat")
def cat(tensors: Sequence[Tensor], dim: int = 0, *, axis=None) -> Tensor:
    """Join tensors along an existing dimension."""
    ts = _check_list(tensors, "cat")
    if any(t.ndim == 0 for t in ts):
        raise RuntimeError(f"cat: zero-dimensional tensors cannot be concatenated (shapes "
                           f"{[tuple(t.shape) for t in ts]}); use stack")
    d = _dim(dim if axis is None else axis, ts[0].ndim, "cat")
    return apply(get("cat"), (ts, d))


def concatenate(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    return cat(tensors, axis)


@kernel("stack", kind=Join(stack=True))
def _stack_kernel(tensors, dim):
    try:
        return np.stack(tensors, axis=dim)
    except ValueError:
        shapes = [a.shape for a in tensors]
        raise RuntimeError(f"stack: expects tensors of one shape, got {shapes}") from None


@op_function("stack")
def stack(tensors: Sequence[Tensor], dim: int = 0, *, axis=None) -> Tensor:
    """Join tensors along a new dimension."""
    ts = _check_list(tensors, "stack")
    d = _dim(dim if axis is None else axis, ts[0].ndim + 1, "stack")
    return apply(get("stack"), (ts, d))


@kernel("split_with_sizes", view_of=0, kind=Move())
def _split_with_sizes_kernel(x, split_sizes, dim):
    if sum(split_sizes) != x.shape[dim]:
        raise RuntimeError(
            f"split_with_sizes: sizes {tuple(split_sizes)} do not add up to "
            f"{x.shape[dim]} (dim {dim} of shape {x.shape})"
        )
    bounds = np.cumsum(split_sizes)[:-1]
    return list(np.split(x, bounds, axis=dim))


@op_function("split_with_sizes")
def split_with_sizes(self: Tensor, split_sizes, dim: int = 0) -> tuple[Tensor, ...]:
    """Split into pieces of the given sizes along ``dim``."""
    d = _dim(dim, self.ndim, "split_with_sizes")
    return apply(get("split_with_sizes"), (self, tuple(int(s) for s in split_sizes), d))


def _split_sizes(n: int, split_size_or_sections) -> list[int]:
    if isinstance(split_size_or_sections, (int, np.integer)):
        step = int(split_size_or_sections)
        if step <= 0:
            raise ValueError(f"split: split_size must be positive, got {step}")
        return [step] * (n // step) + ([n % step] if n % step else [])
    return [int(s) for s in split_size_or_sections]


@kernel("split", view_of=0, kind=Move())
def _split_kernel(x, split_size_or_sections, dim):
    return _split_with_sizes_kernel(x, _split_sizes(x.shape[dim], split_size_or_sections), dim)


@op_function("split")
def split(self: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Split into pieces of ``split_size`` (int) or of the sizes in a list."""
    d = _dim(dim, self.ndim, "split")
    sizes = split_size_or_sections
    if not isinstance(sizes, (int, np.integer)):
        sizes = tuple(int(s) for s in sizes)
    return apply(get("split"), (self, sizes, d))


@kernel("unbind", view_of=0, kind=Move())
def _unbind_kernel(x, dim):
    return [x[(slice(None),) * dim + (i,)] for i in range(x.shape[dim])]


@op_function("unbind")
def unbind(self: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices along ``dim``, as a tuple."""
    return apply(get("unbind"), (self, _dim(dim, self.ndim, "unbind")))


# ------------------------------------------------------------------ like-factories
@kernel("zeros_like", kind=Fill(0.0))
def _zeros_like_kernel(x):
    return np.zeros(x.shape, x.dtype)


@op_function("zeros_like")
def zeros_like(self: Tensor, dtype=None, requires_grad: bool = False, *,
               device=None) -> Tensor:
    """Zeros of the shape (and dtype and device) of ``self``."""
    out = apply(get("zeros_like"), (as_tensor(self),))
    return _finish_like(out, dtype, requires_grad, device)


@kernel("ones_like", kind=Fill(1.0))
def _ones_like_kernel(x):
    return np.ones(x.shape, x.dtype)


@op_function("ones_like")
def ones_like(self: Tensor, dtype=None, requires_grad: bool = False, *,
              device=None) -> Tensor:
    """Ones of the shape (and dtype and device) of ``self``."""
    out = apply(get("ones_like"), (as_tensor(self),))
    return _finish_like(out, dtype, requires_grad, device)


def _finish_like(out: Tensor, dtype, requires_grad: bool, device) -> Tensor:
    if dtype is not None:
        out = to_dtype(out, dtype)
    if device is not None:
        out = out.to(device)
    if requires_grad:
        out.requires_grad_(True)
    return out


# ------------------------------------------------------------------ flip, roll, chunk
def _dims_or_axis(dims, axis, op: str):
    if axis is not None:
        if dims:
            raise TypeError(f"{op}: give dims or axis, not both")
        dims = (axis,)
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    return dims


@formula_helper
def negated(values) -> tuple[int, ...]:
    """``values`` with every entry negated (shifts of ``roll``, widths of ``pad``)."""
    return tuple(-int(v) for v in values)


@kernel("flip", kind=Move())
def _flip_kernel(x, dims):
    return c_contiguous(np.flip(x, dims)) if dims else x.copy()


@op_function("flip")
def flip(self: Tensor, *dims, axis=None) -> Tensor:
    """Reverse the order of elements along ``dims`` (a copy)."""
    dims = _dims_or_axis(dims, axis, "flip")
    nd = max(self.ndim, 1)
    norm = tuple(_dim(d, nd, "flip") for d in _ints(dims, "flip"))
    if len(set(norm)) != len(norm):
        raise RuntimeError(f"flip: dims {tuple(dims)} name a dimension twice")
    return apply(get("flip"), (self, norm if self.ndim else ()))


@kernel("roll", kind=Move())
def _roll_kernel(x, shifts, dims):
    return np.roll(x, shifts, axis=dims)


@op_function("roll")
def roll(self: Tensor, shifts, dims=None, *, axis=None) -> Tensor:
    """Shift elements circularly by ``shifts`` along ``dims`` (over the flattened tensor
    when ``dims`` is None)."""
    if axis is not None:
        if dims is not None:
            raise TypeError("roll: give dims or axis, not both")
        dims = axis
    shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else _ints((shifts,), "roll")
    if dims is None:
        if len(shifts) != 1:
            raise RuntimeError(f"roll: without dims, shifts must be one int, got {shifts}")
        return apply(get("roll"), (self, shifts, None))
    dims = (dims,) if isinstance(dims, (int, np.integer)) else _ints((dims,), "roll")
    if len(dims) != len(shifts):
        raise RuntimeError(f"roll: shifts {shifts} and dims {dims} differ in length")
    dims = tuple(_dim(d, max(self.ndim, 1), "roll") for d in dims)
    return apply(get("roll"), (self, tuple(int(s) for s in shifts), dims))


@kernel("chunk", view_of=0, kind=Move())
def _chunk_kernel(x, chunks, dim):
    n = x.shape[dim]
    if n == 0:
        return [x[...]]
    step = -(-n // chunks)
    return _split_with_sizes_kernel(x, _split_sizes(n, step), dim)


@op_function("chunk")
def chunk(self: Tensor, chunks: int, dim: int = 0, *, axis=None) -> tuple[Tensor, ...]:
    """Split into ``chunks`` pieces of ``ceil(size / chunks)`` along ``dim`` (the last may
    be smaller, and there may be fewer pieces)."""
    if not isinstance(chunks, (int, np.integer)) or chunks <= 0:
        raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    d = _dim(dim if axis is None else axis, self.ndim, "chunk")
    return apply(get("chunk"), (self, int(chunks), d))


# ------------------------------------------------------------------ repeat, tile
@formula_helper
def repeat_grad_shape(repeats, shape) -> tuple[int, ...]:
    """(r0, s0, r1, s1, ...): the output of ``repeat`` with each repeat split off."""
    padded = (1,) * (len(repeats) - len(shape)) + tuple(shape)
    return tuple(x for r, s in zip(repeats, padded, strict=True) for x in (int(r), int(s)))


@formula_helper
def repeat_grad_dims(repeats, shape) -> tuple[int, ...]:
    """The repeat axes of :func:`repeat_grad_shape` (summed in the gradient)."""
    return tuple(range(0, 2 * len(repeats), 2))


def _tile_array(x: np.ndarray, reps) -> np.ndarray:
    lead = len(reps) - x.ndim
    return np.tile(x.reshape((1,) * lead + x.shape), reps)


@kernel("repeat", kind=Move())
def _repeat_kernel(x, repeats):
    return _tile_array(x, repeats)


def _check_reps(reps, op: str) -> tuple[int, ...]:
    if any(r < 0 for r in reps):
        raise RuntimeError(f"{op}: repeats must be non-negative, got {reps}")
    return reps


@op_function("repeat")
def repeat(self: Tensor, *repeats) -> Tensor:
    """Tile the tensor: ``x.repeat(2, 3)`` repeats rows twice and columns three times
    (torch's ``repeat``; extra leading repeats add dimensions)."""
    reps = _check_reps(_ints(repeats, "repeat"), "repeat")
    if len(reps) < self.ndim:
        raise RuntimeError(f"repeat: {len(reps)} repeats cannot be fewer than the "
                           f"{self.ndim} dimensions of shape {self.shape}")
    if not reps:
        return clone(self)
    return apply(get("repeat"), (self, reps))


@kernel("tile", kind=Move())
def _tile_kernel(x, dims):
    return _tile_array(x, dims)


@op_function("tile")
def tile(self: Tensor, *dims) -> Tensor:
    """Like :func:`repeat`, but fewer repeats than dimensions are padded with ones in front
    (``torch.tile`` / ``np.tile``)."""
    reps = _check_reps(_ints(dims, "tile"), "tile")
    reps = (1,) * (self.ndim - len(reps)) + reps
    if not reps:
        return clone(self)
    return apply(get("tile"), (self, reps))


# ------------------------------------------------------------------ tril, triu
def _check_matrix(self: Tensor, op: str) -> None:
    if self.ndim < 2:
        raise RuntimeError(f"{op}: expects a tensor of at least 2 dimensions, got shape "
                           f"{self.shape}")


def _triangle_kind(lower: bool) -> Opaque:
    def static(attrs: dict, shapes: tuple) -> NativePlan:
        shape = tuple(shapes[0])
        return NativePlan((int(attrs["diagonal"]), lower,
                           (math.prod(shape[:-2]), *shape[-2:])), (shape,))
    return Opaque(native=mk.triangle_native, static=static)


_TRIL, _TRIU = _triangle_kind(True), _triangle_kind(False)


@kernel("tril", kind=_TRIL, batch=batching("leading"))
def _tril_kernel(x, diagonal):
    return call_native(_TRIL, (x,), {"diagonal": diagonal})


@op_function("tril")
def tril(self: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle (on and below the ``diagonal``-th diagonal) of the last two
    dimensions; the rest is zero."""
    _check_matrix(self, "tril")
    return apply(get("tril"), (self, int(diagonal)))


@kernel("triu", kind=_TRIU, batch=batching("leading"))
def _triu_kernel(x, diagonal):
    return call_native(_TRIU, (x,), {"diagonal": diagonal})


@op_function("triu")
def triu(self: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle (on and above the ``diagonal``-th diagonal) of the last two
    dimensions; the rest is zero."""
    _check_matrix(self, "triu")
    return apply(get("triu"), (self, int(diagonal)))


# ------------------------------------------------------------------ pad
_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_pairs(pad, ndim: int) -> list[tuple[int, int, int]]:
    """(dim, before, after) for each padded dimension, from torch's last-dim-first tuple."""
    return [(ndim - 1 - k, int(pad[2 * k]), int(pad[2 * k + 1])) for k in range(len(pad) // 2)]


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))


def _pad_static(attrs: dict, shapes: tuple) -> NativePlan:
    """``pad_native``'s constants: the output shape and the block of the input it holds."""
    if attrs["mode"] != "constant":
        raise RuntimeError(f"pad: the kernel only pads in constant mode, got {attrs['mode']!r}")
    shape = tuple(shapes[0])
    out, extent = list(shape), list(shape)
    src, dst = [0] * len(shape), [0] * len(shape)
    for d, lo, hi in _pad_pairs(attrs["pad"], len(shape)):
        n = shape[d]
        out[d] = n + lo + hi
        src[d], dst[d] = max(-lo, 0), max(lo, 0)
        extent[d] = max(n - max(-lo, 0) - max(-hi, 0), 0)
    value = attrs["value"]
    return NativePlan((math.prod(out), tuple(extent) or (1,), tuple(src) or (0,),
                       tuple(dst) or (0,), _strides(shape) or (1,), _strides(tuple(out)) or (1,),
                       0.0 if value is None else float(value)), (tuple(out),))


_PAD = Opaque(native=mk.pad_native, static=_pad_static)


@kernel("pad", kind=_PAD, batch=batching("leading"))
def _pad_kernel(x, pad, mode, value):
    return call_native(_PAD, (x,), {"pad": pad, "mode": mode, "value": value})


def _pad_index(n: int, lo: int, hi: int, mode: str) -> np.ndarray:
    i = np.arange(-lo, n + hi)
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    if mode == "circular":
        return i % n
    i = np.abs(i)  # reflect: mirror without repeating the edge
    return np.where(i > n - 1, 2 * (n - 1) - i, i)


@op_function("pad")
def pad(self: Tensor, pad, mode: str = "constant", value: float | None = None) -> Tensor:
    """Pad with ``pad = (left_last, right_last, left_2nd_last, ...)`` (torch's order, last
    dimension first). ``mode`` is ``"constant"`` (``value``, default 0), ``"reflect"``,
    ``"replicate"`` or ``"circular"``. Negative widths crop, in every mode (the crops
    first, then the padding of what is left)."""
    pad = _ints((pad,), "pad")
    if len(pad) % 2 or len(pad) > 2 * self.ndim:
        raise RuntimeError(f"pad: the padding {pad} must have an even length of at most "
                           f"2 * {self.ndim} (shape {self.shape})")
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode must be one of {_PAD_MODES}, got {mode!r}")
    pairs = _pad_pairs(pad, self.ndim)
    for d, lo, hi in pairs:
        if self.shape[d] + lo + hi < 0:
            raise RuntimeError(f"pad: padding ({lo}, {hi}) of dim {d} leaves a negative size "
                               f"for shape {self.shape}")
    if mode != "constant" and min(pad, default=0) < 0:  # crop first, then pad what is left
        crop = tuple(slice(max(-lo, 0), self.shape[d] - max(-hi, 0)) for d, lo, hi in pairs)
        cropped = _ops.index(self, (slice(None),) * (self.ndim - len(pairs)) + crop[::-1])
        return globals()["pad"](cropped, tuple(max(p, 0) for p in pad), mode, value)
    for d, lo, hi in pairs:
        n = self.shape[d]
        if mode != "constant":
            limit = n - 1 if mode == "reflect" else (n if mode == "circular" else None)
            if min(lo, hi) < 0 or n == 0 or (limit is not None and max(lo, hi) > limit):
                raise RuntimeError(f"pad: {mode} padding ({lo}, {hi}) of dim {d} does not "
                                   f"fit the size {n} (shape {self.shape})")
    if mode == "constant":
        return apply(get("pad"), (self, pad, mode, None if value is None else float(value)))
    if value not in (None, 0):
        raise RuntimeError(f"pad: value is only used in constant mode (mode={mode!r})")
    out = self
    for d, lo, hi in pairs:
        if lo or hi:
            out = _ops.index(out, (slice(None),) * d + (_pad_index(self.shape[d], lo, hi, mode),))
    return out
