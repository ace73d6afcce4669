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
