"""Scatter kernels: gradients of indexing accumulate over repeated indices."""

from __future__ import annotations

from numba import njit

OPTS = dict(cache=True, nogil=True)


@njit(**OPTS)
def scatter_add_flat(out, positions, values):
    """``out[positions[i]] += values[i]`` for every i (repeats add up)."""
    for i in range(positions.size):
        out[positions[i]] += values[i]


@njit(**OPTS)
def gather_flat(src, positions, out):
    for i in range(positions.size):
        out[i] = src[positions[i]]


# ------------------------------------------------------------------ along one dimension
# Arrays are C-contiguous (A, N, B) views: A = the dimensions before ``dim``, N = ``dim``,
# B = the dimensions after it. Indices are int64 and already checked to be in range.
@njit(**OPTS)
def gather_dim(src, idx, out):
    """``out[a, m, b] = src[a, idx[a, m, b], b]`` (torch's ``gather``)."""
    for a in range(idx.shape[0]):
        s = src[a]
        for m in range(idx.shape[1]):
            irow = idx[a, m]
            orow = out[a, m]
            for b in range(idx.shape[2]):
                orow[b] = s[irow[b], b]


@njit(**OPTS)
def scatter_dim(out, idx, src, accumulate):
    """``out[a, idx[a, m, b], b] = src[a, m, b]`` (``+=`` when ``accumulate``: repeats add)."""
    for a in range(idx.shape[0]):
        o = out[a]
        for m in range(idx.shape[1]):
            irow = idx[a, m]
            srow = src[a, m]
            if accumulate:
                for b in range(idx.shape[2]):
                    o[irow[b], b] += srow[b]
            else:
                for b in range(idx.shape[2]):
                    o[irow[b], b] = srow[b]


@njit(**OPTS)
def index_select_dim(src, idx, out):
    """``out[a, m, :] = src[a, idx[m], :]`` (``index_select``)."""
    for a in range(src.shape[0]):
        for m in range(idx.size):
            out[a, m, :] = src[a, idx[m], :]


@njit(**OPTS)
def index_add_dim(out, idx, src):
    """``out[a, idx[m], :] += src[a, m, :]`` (repeats add up)."""
    for a in range(src.shape[0]):
        for m in range(idx.size):
            orow = out[a, idx[m]]
            srow = src[a, m]
            for b in range(srow.size):
                orow[b] += srow[b]


@njit(**OPTS)
def masked_fill_flat(out, mask, value):
    """``out[i] = value`` where ``mask[i]``."""
    for i in range(out.size):
        if mask[i]:
            out[i] = value
