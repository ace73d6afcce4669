"""Reduction kernels over an (A, R, B) view: reduce the middle axis of a C-contiguous array.

Any run of adjacent dimensions reduces without a copy: the dimensions before it make
A, the run makes R and the ones after it make B. Non-adjacent dimensions are moved
together first (one copy). Sums accumulate in float64.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from .layout import accumulator, as_dtype, as_sum_dtype, broadcast, c_contiguous, permuted

OPTS = dict(cache=True, nogil=True)


def sum_arb(x, A, R, B, out) -> None:
    """``out[a, b] = sum over r of x[a, r, b]`` (flat C order), accumulated in float64;
    two kernels, so that a program compiles only the one its shapes need."""
    if B == 1:
        _sum_rows(x, A, R, out)
    else:
        _sum_mid(x, A, R, B, out)


@njit(**OPTS)
def _sum_rows(x, A, R, out):
    for a in range(A):
        row = x[a * R:(a + 1) * R]
        s = 0.0
        for r in range(R):
            s += row[r]
        out[a] = s


@njit(**OPTS)
def _sum_mid(x, A, R, B, out):
    acc = np.zeros(B, np.float64)
    for a in range(A):
        acc[:] = 0.0
        for r in range(R):
            row = x[(a * R + r) * B:(a * R + r + 1) * B]
            for b in range(B):
                acc[b] += row[b]
        o = out[a * B:(a + 1) * B]
        for b in range(B):
            o[b] = acc[b]


@njit(**OPTS)
def prod_arb(x, A, R, B, out):
    for a in range(A):
        o = out[a * B:(a + 1) * B]
        o[:] = 1
        for r in range(R):
            row = x[(a * R + r) * B:(a * R + r + 1) * B]
            for b in range(B):
                o[b] *= row[b]


@njit(**OPTS)
def extreme_arb(x, A, R, B, out, idx, is_max):
    """max (is_max) or min over R, with the first index of the extreme; NaN wins."""
    for a in range(A):
        for b in range(B):
            best = x[a * R * B + b]
            bi = 0
            for r in range(1, R):
                v = x[(a * R + r) * B + b]
                if best != best:
                    break
                if v != v or (is_max and v > best) or (not is_max and v < best):
                    best = v
                    bi = r
            out[a * B + b] = best
            idx[a * B + b] = bi


@njit(**OPTS)
def logsumexp_arb(x, A, R, B, out):
    for a in range(A):
        for b in range(B):
            m = -np.inf
            for r in range(R):
                v = x[(a * R + r) * B + b]
                if v > m or v != v:
                    m = v
            if not (m > -np.inf and m < np.inf):  # all -inf, some +inf, or NaN
                out[a * B + b] = m
                continue
            s = 0.0
            for r in range(R):
                s += np.exp(x[(a * R + r) * B + b] - m)
            out[a * B + b] = m + np.log(s)


@njit(**OPTS)
def var_arb(x, A, R, B, correction, out):
    """Two-pass variance with ``correction`` subtracted from the count."""
    denom = max(R - correction, 0.0)
    for a in range(A):
        for b in range(B):
            s = 0.0
            for r in range(R):
                s += x[(a * R + r) * B + b]
            mean = s / R
            q = 0.0
            for r in range(R):
                d = x[(a * R + r) * B + b] - mean
                q += d * d
            if denom > 0:
                out[a * B + b] = q / denom
            else:  # as torch: x / 0
                out[a * B + b] = np.nan if q == 0 or q != q else np.inf


@njit(**OPTS)
def extreme_values_arb(x, A, R, B, is_max, out):
    """amax (is_max) or amin over R; NaN wins (as torch)."""
    for a in range(A):
        o = out[a * B:(a + 1) * B]
        o[:] = x[a * R * B:a * R * B + B]
        for r in range(1, R):
            row = x[(a * R + r) * B:(a * R + r + 1) * B]
            for b in range(B):
                v = row[b]
                best = o[b]
                if best == best and (v != v or (is_max and v > best)
                                     or (not is_max and v < best)):
                    o[b] = v


@njit(**OPTS)
def cumsum_arb(x, A, R, B, acc, out):
    """Running sum over R, accumulated in ``acc`` (float64 or int64, length B)."""
    for a in range(A):
        acc[:] = 0
        for r in range(R):
            off = (a * R + r) * B
            for b in range(B):
                acc[b] += x[off + b]
                out[off + b] = acc[b]


@njit(**OPTS)
def cumprod_arb(x, A, R, B, acc, out):
    """Running product over R, accumulated in ``acc`` (float64 or int64, length B)."""
    for a in range(A):
        acc[:] = 1
        for r in range(R):
            off = (a * R + r) * B
            for b in range(B):
                acc[b] *= x[off + b]
                out[off + b] = acc[b]


@njit(**OPTS)
def scan_arb(bv, av, A, R, B, reverse, acc, out):
    """The first-order linear recurrence over R.

    Forward: ``h[r] = b[r] + a[r] * h[r-1]`` (``a[0]`` unused). Reverse:
    ``h[r] = b[r] + a[r+1] * h[r+1]``. The reverse scan with the same ``a`` is the
    transpose of the forward one, which is what makes the op's gradients scans again.
    """
    for a in range(A):
        if not reverse:
            for r in range(R):
                off = (a * R + r) * B
                for b in range(B):
                    if r == 0:
                        acc[b] = bv[off + b]
                    else:
                        acc[b] = bv[off + b] + av[off + b] * acc[b]
                    out[off + b] = acc[b]
        else:
            for r in range(R - 1, -1, -1):
                off = (a * R + r) * B
                for b in range(B):
                    if r == R - 1:
                        acc[b] = bv[off + b]
                    else:
                        acc[b] = bv[off + b] + av[off + B + b] * acc[b]
                    out[off + b] = acc[b]


@njit(**OPTS)
def norm_arb(x, A, R, B, p, out):
    """The vector p-norm over R. ``p`` is a float: 0, inf, -inf or any other value.

    For p > 0 the values are scaled by the largest magnitude first, so squares of
    1e200 do not overflow and squares of 1e-200 do not underflow. NaN propagates.
    """
    for a in range(A):
        for b in range(B):
            base = a * R * B + b
            if p == 0:
                acc = 0.0
                for r in range(R):
                    if x[base + r * B] != 0:
                        acc += 1.0
                out[a * B + b] = acc
            elif p == np.inf or p == -np.inf:
                best = abs(x[base])
                for r in range(1, R):
                    v = abs(x[base + r * B])
                    if best != best:
                        break
                    if v != v or (p > 0 and v > best) or (p < 0 and v < best):
                        best = v
                out[a * B + b] = best
            elif p < 0:
                acc = 0.0
                for r in range(R):
                    acc += abs(x[base + r * B]) ** p
                out[a * B + b] = acc ** (1.0 / p)
            else:
                scale = 0.0
                for r in range(R):
                    v = abs(x[base + r * B])
                    if v > scale or v != v:
                        scale = v
                        if v != v:
                            break
                if scale == 0.0 or scale != scale or scale == np.inf:
                    out[a * B + b] = scale
                    continue
                acc = 0.0
                for r in range(R):
                    v = abs(x[base + r * B]) / scale
                    if p == 2.0:
                        acc += v * v
                    elif p == 1.0:
                        acc += v
                    else:
                        acc += v ** p
                if p == 2.0:
                    out[a * B + b] = scale * np.sqrt(acc)
                elif p == 1.0:
                    out[a * B + b] = scale * acc
                else:
                    out[a * B + b] = scale * acc ** (1.0 / p)


# ------------------------------------------------------------------ layout helpers
def normalize_dims(dim, ndim: int, op: str) -> tuple[int, ...]:
    """``dim`` (None, int or sequence; negatives allowed) as sorted, unique dims."""
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
    out = set()
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{op}: dim must be an int or a tuple of ints, got {dim!r}")
        d = int(d)
        lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
        if not lo <= d <= hi:
            raise IndexError(f"{op}: dim {d} is out of range for a tensor of {ndim} "
                             f"dimension(s) (expected in [{lo}, {hi}])")
        if (d % ndim if ndim else 0) in out:
            raise RuntimeError(f"{op}: dim {d % ndim if ndim else 0} appears more than once "
                               f"in dims {dim!r}")
        out.add(d % ndim if ndim else 0)
    return tuple(sorted(out))


def restored_dims(dim, sizes: tuple[int, ...], keepdim: bool, op: str) -> tuple[int, ...]:
    """The dims a reduction over ``dim`` of an input of shape ``sizes`` removed, which its
    backward puts back (none with ``keepdim``, nor for a 0-d input, whose dim 0 or -1
    names no dim)."""
    dims = normalize_dims(dim, len(sizes), op)
    return dims if not keepdim and sizes else ()


def arb_plan(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool = False):
    """How to reduce ``dims`` of a C-contiguous array of ``shape``: ``(perm, A, R, B,
    out_shape)``, ``perm`` the transposition that makes the dims adjacent (None: none
    needed), ``out_shape`` the result's shape (reduced dims kept as 1 when ``keepdim``)."""
    nd = len(shape)
    if nd == 0:
        return None, 1, 1, 1, ()
    dims = tuple(d for d in dims if d < nd)
    kept = tuple(d for d in range(nd) if d not in dims)
    kept_shape = tuple(shape[d] for d in kept)
    out_shape = keep_shape(shape, dims, keepdim, kept_shape)
    perm = None
    if dims and dims != tuple(range(dims[0], dims[-1] + 1)):
        perm = kept + dims
        shape = tuple(shape[d] for d in perm)
        dims = tuple(range(len(kept), nd))
    if not dims:
        return perm, math.prod(shape), 1, 1, out_shape
    return (perm, math.prod(shape[:dims[0]]), math.prod(shape[dims[0]:dims[-1] + 1]),
            math.prod(shape[dims[-1] + 1:]), out_shape)


def arb_view(x: np.ndarray, dims: tuple[int, ...]):
    """Return (flat contiguous data, A, R, B, reduced shape without the dims)."""
    perm, A, R, B, kept_shape = arb_plan(x.shape, dims)
    xs = c_contiguous(x if perm is None else np.transpose(x, perm))
    return xs.reshape(-1), A, R, B, kept_shape


def keep_shape(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool,
               kept_shape: tuple[int, ...]) -> tuple[int, ...]:
    if not keepdim:
        return kept_shape
    return tuple(1 if d in dims else s for d, s in enumerate(shape))


# ------------------------------------------------------------------ natives
# ``@njit`` entry points that generated code calls directly (``Opaque.native``) and the
# ops' CPU kernels call too, flat as ``NativePlan`` says: the input flat with its
# ``shape`` and the plan's transposition ``perm`` (empty: none), results flat.
@njit(**OPTS)
def extreme_values_native(x, shape, perm, A, R, B, is_max):
    """amax (is_max) or amin of ``x`` over the plan's dims (:func:`arb_plan`)."""
    out = np.empty(A * B, x.dtype)
    extreme_values_arb(permuted(x, shape, perm), A, R, B, is_max, out)
    return out


@njit(**OPTS)
def extreme_dim_native(x, shape, perm, A, R, B, is_max):
    """``(values, first indices)`` of the max (is_max) or min over the plan's dims."""
    values = np.empty(A * B, x.dtype)
    idx = np.empty(A * B, np.int64)
    extreme_arb(permuted(x, shape, perm), A, R, B, values, idx, is_max)
    return values, idx


@njit(**OPTS)
def arg_extreme_native(x, shape, perm, A, R, B, is_max):
    """The first index of the max (is_max) or min over the plan's dims."""
    return extreme_dim_native(x, shape, perm, A, R, B, is_max)[1]


@njit(**OPTS)
def variance_native(x, shape, perm, A, R, B, correction, root):
    """The variance (its square root when ``root``); NaN for an empty input."""
    out = np.empty(A * B, x.dtype)
    if x.size == 0:
        out[:] = np.nan
    else:
        var_arb(permuted(x, shape, perm), A, R, B, correction, out)
    if root:
        out = np.sqrt(out)
    return out


@njit(**OPTS)
def logsumexp_native(x, shape, perm, A, R, B):
    """``log(sum(exp(x)))`` over the plan's dims; -inf for an empty input."""
    out = np.empty(A * B, x.dtype)
    if x.size == 0:
        out[:] = -np.inf
    else:
        logsumexp_arb(permuted(x, shape, perm), A, R, B, out)
    return out


@njit(**OPTS)
def prod_native(x, shape, perm, A, R, B, dtype):
    """The product over the plan's dims, in ``dtype`` (None: the sum dtype of ``x``)."""
    y = as_sum_dtype(x, dtype)
    out = np.empty(A * B, y.dtype)
    prod_arb(permuted(y, shape, perm), A, R, B, out)
    return out


@njit(**OPTS)
def norm_native(x, shape, perm, A, R, B, p, dtype):
    """The vector p-norm over the plan's dims, of ``x`` cast to ``dtype`` (if not None)."""
    y = as_dtype(x, dtype)
    out = np.empty(A * B, y.dtype)
    norm_arb(permuted(y, shape, perm), A, R, B, p, out)
    return out


@njit(**OPTS)
def cumulative_native(x, A, R, B, dtype, product):
    """Running sums (products when ``product``) over the middle axis of an (A, R, B)
    view, in ``dtype`` (None: the sum dtype of ``x``)."""
    y = as_sum_dtype(x, dtype)
    out = np.empty(y.size, y.dtype)
    acc = accumulator(out, B)
    if product:
        cumprod_arb(y, A, R, B, acc, out)
    else:
        cumsum_arb(y, A, R, B, acc, out)
    return out


@njit(**OPTS)
def scan_native(b, a, b_shape, a_shape, shape, A, R, B, reverse):
    """:func:`scan_arb` of ``b`` and ``a`` broadcast to ``shape``."""
    fb = broadcast(b, b_shape, shape)
    fa = broadcast(a.astype(b.dtype), a_shape, shape)
    out = np.empty(fb.size, b.dtype)
    scan_arb(fb, fa, A, R, B, reverse, np.empty(B, b.dtype), out)
    return out


@njit(**OPTS)
def shift_native(x, A, R, B, offset, fill):
    """``out[a, r, b] = x[a, r - offset, b]`` of an (A, R, B) view, ``fill`` outside."""
    out = np.empty(x.size, x.dtype)
    for a in range(A):
        for r in range(R):
            src = r - offset
            off = (a * R + r) * B
            if 0 <= src < R:
                so = (a * R + src) * B
                for b in range(B):
                    out[off + b] = x[so + b]
            else:
                for b in range(B):
                    out[off + b] = fill
    return out


def _line_order(line, descending):
    """Stable argsort of a 1-D array (descending: reversed order, ties kept in place);
    NaN counts as the largest value (as torch)."""


@overload(_line_order)
def _line_order_impl(line, descending):
    if isinstance(line.dtype, types.Float):
        def floats(line, descending):
            if not descending:
                return np.argsort(line, kind="mergesort")
            order = np.empty(line.size, np.int64)
            rest = np.empty(line.size, np.int64)
            keys = np.empty(line.size, line.dtype)
            j = c = 0
            for i in range(line.size):
                if line[i] != line[i]:
                    order[j] = i
                    j += 1
                else:
                    rest[c] = i
                    keys[c] = -line[i]
                    c += 1
            by = np.argsort(keys[:c], kind="mergesort")
            for t in range(c):
                order[j + t] = rest[by[t]]
            return order
        return floats
    if isinstance(line.dtype, types.Boolean):
        return lambda line, descending: _line_order(line.astype(np.int8), descending)

    def integers(line, descending):  # ~x = -x - 1: decreasing, no overflow
        return np.argsort(~line if descending else line, kind="mergesort")
    return integers


@njit(**OPTS)
def sorted_native(x, A, R, B, k, descending):
    """``(values, indices)`` of the first ``k`` of each line of the middle axis of an
    (A, R, B) view in sorted order (see :func:`_line_order`)."""
    values = np.empty(A * k * B, x.dtype)
    idx = np.empty(A * k * B, np.int64)
    line = np.empty(R, x.dtype)
    for a in range(A):
        for b in range(B):
            for r in range(R):
                line[r] = x[(a * R + r) * B + b]
            order = _line_order(line, descending)
            for t in range(k):
                values[(a * k + t) * B + b] = line[order[t]]
                idx[(a * k + t) * B + b] = order[t]
    return values, idx
