"""Records for ``einsum``, the diagonal ops and ``nbgrad.linalg`` (decompositions, solvers).

Matrices for ``inv``, ``solve`` and ``cholesky`` are well conditioned (``A A^T + n I``
or ``R + n I``); ``cholesky`` is tested on the symmetric part of its input, since it
only reads one triangle.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ... import linalg, ops
from ..core import OpRecord, Sample, sample_array


def _arr(rng, *shape):
    return sample_array(rng, shape)


def _spd(rng, *batch, n=3):
    a = rng.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _general(rng, *batch, n=3):
    return rng.standard_normal(batch + (n, n)) + n * np.eye(n)


def _low_rank(rng, n, rank):
    """A singular n x n matrix of the given rank (distinct nonzero singular values)."""
    return rng.standard_normal((n, rank)) @ rng.standard_normal((rank, n))


def _einsum_samples(rng):
    a = _arr
    return [
        Sample(("ij,jk->ik", a(rng, 3, 4), a(rng, 4, 2)), note="matmul"),
        Sample(("bij,bjk->bik", a(rng, 2, 3, 4), a(rng, 2, 4, 2)), note="batched"),
        Sample(("ii->i", a(rng, 3, 3)), note="diagonal"),
        Sample(("ii", a(rng, 3, 3)), note="trace-implicit"),
        Sample(("ij->ji", a(rng, 2, 3)), note="transpose"),
        Sample(("ij->", a(rng, 2, 3)), note="sum"),
        Sample(("i,j->ij", a(rng, 3), a(rng, 2)), note="outer"),
        Sample(("...ij,...jk->...ik", a(rng, 2, 1, 3, 4), a(rng, 3, 4, 2)),
               note="ellipsis-broadcast"),
        Sample(("ij,jk,kl->il", a(rng, 2, 3), a(rng, 3, 4), a(rng, 4, 2)), note="three"),
        Sample(("bii,bi->b", a(rng, 2, 3, 3), a(rng, 2, 3)), note="diag-and-batch"),
        Sample(("ij,jk", a(rng, 2, 3), a(rng, 3, 2)), note="implicit-output"),
        Sample(("ij,ij->ij", a(rng, 3, 1), a(rng, 3, 4)), note="size1-broadcast"),
        Sample(("ijk,k->ij", a(rng, 2, 3, 4), a(rng, 4)), note="matvec"),
    ]


def _diag_backward_ref(g, sizes, offset, dim1, dim2):
    out = np.zeros(sizes)
    planes = np.moveaxis(out, (dim1, dim2), (-2, -1))
    n1, n2 = planes.shape[-2:]
    for k in range(g.shape[-1]):
        i, j = (k, k + offset) if offset >= 0 else (k - offset, k)
        if i < n1 and j < n2:
            planes[..., i, j] = g[..., k]
    return out


def _vector_rhs(A, B):
    return B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])


def _solve_ref(A, B):
    if _vector_rhs(A, B):
        return np.linalg.solve(A, B[..., None])[..., 0]
    return np.linalg.solve(A, B)


def _sym(A):
    return (A + np.swapaxes(A, -1, -2)) / 2


def _solve_triangular_ref(A, B, upper, left=True, unitriangular=False):
    if A.ndim == 2 and B.ndim == 2:
        if left:
            return scipy.linalg.solve_triangular(A, B, lower=not upper,
                                                 unit_diagonal=unitriangular)
        return scipy.linalg.solve_triangular(A, B.T, trans=1, lower=not upper,
                                             unit_diagonal=unitriangular).T
    T = np.triu(A) if upper else np.tril(A)
    if unitriangular:
        T = T - np.diagonal(T, 0, -2, -1)[..., None] * np.eye(A.shape[-1]) + np.eye(A.shape[-1])
    if left:
        return np.linalg.solve(T, B)
    return np.swapaxes(np.linalg.solve(np.swapaxes(T, -1, -2), np.swapaxes(B, -1, -2)), -1, -2)


def _solve_triangular_samples(rng):
    L = np.tril(_arr(rng, 3, 3)) + 3 * np.eye(3)
    U = np.triu(_arr(rng, 2, 3, 3)) + 3 * np.eye(3)
    return [
        Sample((L, _arr(rng, 3, 2)), {"upper": False}, note="lower-left"),
        Sample((U, _arr(rng, 3, 2)), {"upper": True}, note="upper-left-batch-broadcast"),
        Sample((L, _arr(rng, 2, 3)), {"upper": False, "left": False}, note="lower-right"),
        Sample((U[0], _arr(rng, 3, 2)), {"upper": True, "unitriangular": True},
               note="upper-unit"),
        Sample((L, _arr(rng, 2, 3)), {"upper": False, "left": False, "unitriangular": True},
               note="lower-right-unit"),
    ]


def _triangular_matmul_ref(A, B, upper, transpose=False):
    T = np.triu(A) if upper else np.tril(A)
    return np.swapaxes(T, -1, -2) @ B if transpose else T @ B


def _triangular_matmul_samples(rng):
    return [
        Sample((_arr(rng, 3, 3), _arr(rng, 3, 2)), {"upper": False}, note="lower"),
        Sample((_arr(rng, 3, 3), _arr(rng, 3, 4)), {"upper": True, "transpose": True},
               note="upper-transposed"),
        Sample((_arr(rng, 2, 3, 3), _arr(rng, 3, 2)), {"upper": False, "transpose": True},
               note="batch-broadcast-A"),
        Sample((_arr(rng, 3, 3), _arr(rng, 2, 3, 1)), {"upper": True}, note="batch-broadcast-B"),
    ]


def _factor(rng, *batch, n=3):
    """A Cholesky factor (lower, well conditioned) with junk above the diagonal, which
    ``cholesky_backward`` must not read."""
    return np.linalg.cholesky(_spd(rng, *batch, n=n)) + np.triu(_arr(rng, *batch, n, n), 1)


def _cholesky_backward_ref(gL, L):
    low = np.tril(L)
    inv = np.linalg.inv(low)
    p = np.swapaxes(low, -1, -2) @ np.tril(gL)
    phi = 0.5 * (np.tril(p) + np.swapaxes(np.tril(p, -1), -1, -2))
    return np.swapaxes(inv, -1, -2) @ phi @ inv


def _cholesky_backward_samples(rng):
    return [
        Sample((_arr(rng, 3, 3), _factor(rng)), note="3x3"),
        Sample((_arr(rng, 2, 4, 4), _factor(rng, 2, n=4)), note="batch"),
        Sample((_arr(rng, 2, 3, 3), _factor(rng)), note="batch-broadcast-L"),
        Sample((_arr(rng, 1, 1), _factor(rng, n=1)), note="1x1"),
    ]


RECORDS = [
    OpRecord("einsum", _einsum_samples, ref=lambda eq, *ops_: np.einsum(eq, *ops_),
             ref_rtol=1e-9),
    OpRecord("diagonal", lambda rng: [Sample((_arr(rng, 3, 4),), note="main"),
                                      Sample((_arr(rng, 3, 4), 1), note="offset1"),
                                      Sample((_arr(rng, 2, 3, 4), -1, 2, 0), note="dims20")],
             ref=lambda x, offset=0, dim1=0, dim2=1: np.diagonal(x, offset, dim1, dim2)),
    OpRecord("diagonal_backward", lambda rng: [
        Sample((_arr(rng, 3), (3, 4), 0, 0, 1), note="main"),
        Sample((_arr(rng, 3, 2), (2, 3, 4), -1, 2, 0), note="dims20")],
        ref=_diag_backward_ref),
    OpRecord("diag", lambda rng: [Sample((_arr(rng, 4),), note="1d"),
                                  Sample((_arr(rng, 3), 1), note="1d-offset"),
                                  Sample((_arr(rng, 3, 4), -1), note="2d-offset-1"),
                                  Sample((_arr(rng, 3, 4), 2), note="2d-offset2")],
             ref=lambda x, diagonal=0: np.diag(x, diagonal)),
    OpRecord("trace", lambda rng: [Sample((_arr(rng, 3, 4),), note="wide"),
                                   Sample((_arr(rng, 4, 4),), note="square")],
             ref=np.trace),
    OpRecord("linalg.inv", lambda rng: [Sample((_general(rng),), note="3x3"),
                                        Sample((_spd(rng, 2),), note="batch")],
             ref=np.linalg.inv, ref_rtol=1e-9),
    OpRecord("linalg.det", lambda rng: [Sample((_general(rng),), note="3x3"),
                                        Sample((_general(rng, 2, n=2),), note="batch"),
                                        Sample((_low_rank(rng, 3, 2),), note="rank-n-1"),
                                        Sample((np.stack([_general(rng), _low_rank(rng, 3, 2)]),),
                                               note="batch-mixed-singular")],
             # eps: finite differences next to a singular matrix solve with it (cond ~ 1/eps)
             ref=np.linalg.det, ref_rtol=1e-9, eps=1e-4),
    OpRecord("linalg.slogdet", lambda rng: [Sample((-_spd(rng),), note="negative-det"),
                                            Sample((_general(rng, 2),), note="batch")],
             ref=lambda A: tuple(np.linalg.slogdet(A)), ref_rtol=1e-9),
    OpRecord("linalg.solve", lambda rng: [
        Sample((_general(rng), _arr(rng, 3, 2)), note="matrix"),
        Sample((_general(rng), _arr(rng, 3)), note="vector"),
        Sample((_spd(rng, 2), _arr(rng, 3)), note="batch-A-vector-B"),
        Sample((_spd(rng, 2), _arr(rng, 2, 3)), note="batched-vectors"),
        Sample((_general(rng), _arr(rng, 2, 3, 1)), note="batch-broadcast")],
        ref=_solve_ref, ref_rtol=1e-9),
    OpRecord("linalg.cholesky", lambda rng: [Sample((_spd(rng),), note="3x3"),
                                             Sample((_spd(rng, 2, n=2),), note="batch"),
                                             Sample((_spd(rng),), {"upper": True},
                                                    note="upper")],
             call=lambda A, upper=False: linalg.cholesky(_sym_t(A), upper=upper),
             ref=lambda A, upper=False: _chol_ref(_sym(A), upper), ref_rtol=1e-9),
    OpRecord("linalg.solve_triangular", _solve_triangular_samples,
             ref=_solve_triangular_ref, ref_rtol=1e-9),
    OpRecord("triangular_matmul", _triangular_matmul_samples, ref=_triangular_matmul_ref,
             ref_rtol=1e-12),
    OpRecord("cholesky_backward", _cholesky_backward_samples, ref=_cholesky_backward_ref,
             ref_rtol=1e-9),
]


def _sym_t(A):
    return (A + ops.transpose(A, -2, -1)) * 0.5


def _chol_ref(A, upper):
    L = np.linalg.cholesky(A)
    return np.swapaxes(L, -1, -2) if upper else L
