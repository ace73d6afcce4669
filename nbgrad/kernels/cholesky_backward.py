"""Cholesky's backward, blocked: ``gA`` from the factor ``L`` and the gradient ``gL``.

The symbolic form, ``gA = L^-T Phi L^-1`` with ``Phi = sym(tril(L^T gL))`` (diagonal
halved), costs two triangular solves and a triangular product: ``3 n^3`` flops. This is
the reverse of the blocked Cholesky algorithm instead (Murray, "Differentiation of the
Cholesky decomposition", 2016, ``chol_blocked_rev``): it walks the factor's block
columns from the last, with two general products per block (``2 n^3 / 3`` flops in all,
BLAS ``gemm``), one small triangular solve (``trsm``) and the unblocked reverse on the
diagonal block. Its result is the gradient of the lower triangle; ``gA`` is its
symmetric part (what the symbolic form gives). Only the lower triangles of ``L`` and
``gL`` are read.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .blas import trsm
from .gemm import gemm
from .layout import broadcast, view3

OPTS = dict(cache=True, nogil=True)

#: the block size (columns of the factor per step)
BLOCK = 64


@njit(**OPTS)
def _unblocked_reverse(L, G, j0, k0):
    """Murray's unblocked reverse on the diagonal block ``j0:k0`` of ``L``, in place in
    ``G`` (rows ``j0:k0``, columns up to ``k0``)."""
    for j in range(k0 - 1, j0 - 1, -1):
        d = L[j, j]
        s = 0.0
        for i in range(j + 1, k0):
            s += L[i, j] * G[i, j]
        dbar = (G[j, j] - s / d) / d
        for i in range(j + 1, k0):
            G[i, j] /= d
        for c in range(j0, j):
            G[j, c] -= dbar * L[j, c]
        for i in range(j + 1, k0):
            ci = G[i, j]
            for c in range(j0, j):
                G[j, c] -= ci * L[i, c]
                G[i, c] -= ci * L[j, c]
        G[j, j] = 0.5 * dbar


@njit(**OPTS)
def _subtract_product(a, b, out):
    """``out -= a @ b`` (``gemm`` into a scratch matrix)."""
    tmp = np.empty((a.shape[0], b.shape[1]), out.dtype)
    gemm(a, b, tmp)
    out -= tmp


@njit(**OPTS)
def reverse_into(L, G, block):
    """The lower-triangle gradient of the Cholesky factorisation, in place in ``G`` (which
    holds ``tril(gL)`` on entry): ``L`` (n, n) C-contiguous."""
    n = L.shape[0]
    k = n
    while k > 0:
        j = max(0, k - block)
        if k < n:
            # C = A_C D^-T in the forward: its gradient is Cbar D^-1, and D's gets -Cbar^T C
            cbar = np.ascontiguousarray(G[k:, j:k])
            trsm(np.ascontiguousarray(L[j:k, j:k]), cbar, True, False, False, False)
            G[k:, j:k] = cbar
            if j > 0:
                _subtract_product(cbar, L[j:k, :j], G[k:, :j])
            t = np.empty((k - j, k - j), G.dtype)
            gemm(cbar.T, L[k:, j:k], t)
            for a in range(k - j):
                for b in range(a + 1):
                    G[j + a, j + b] -= t[a, b]
        _unblocked_reverse(L, G, j, k)
        if j > 0:
            dbar = G[j:k, j:k]
            _subtract_product(dbar + dbar.T, L[j:k, :j], G[j:k, :j])
            if k < n:
                _subtract_product(G[k:, j:k].T, L[k:, :j], G[j:k, :j])  # Cbar^T B
        k = j


@njit(**OPTS)
def cholesky_backward_native(gL, L, g_shape, l_shape, g_full, l_full, g_stack, l_stack):
    """``gA`` (symmetric) for each factor of ``L`` and gradient of ``gL``, batches
    broadcast (see the module doc)."""
    g = view3(broadcast(gL, g_shape, g_full), g_stack)
    low = view3(broadcast(L, l_shape, l_full), l_stack)
    batch, n = l_stack[0], l_stack[1]
    out = np.empty((batch, n, n), L.dtype)
    work = np.empty((n, n), L.dtype)
    for s in range(batch):
        for r in range(n):
            for c in range(r + 1):
                work[r, c] = g[s, r, c]
            for c in range(r + 1, n):
                work[r, c] = 0
        reverse_into(np.ascontiguousarray(low[s]), work, BLOCK)
        for r in range(n):
            for c in range(r):
                v = 0.5 * work[r, c]
                out[s, r, c] = v
                out[s, c, r] = v
            out[s, r, r] = work[r, r]
    return out.reshape(-1)
