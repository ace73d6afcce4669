"""Records for the decompositions of ``nbgrad.linalg``: ``eigh``, ``eigvalsh``, ``svd``,
``svdvals``, ``pinv``, ``qr``, ``matrix_exp`` and the checked divisions of their gradients.

Eigenvectors and singular vectors are defined up to sign: the records' calls fix it
(the first row of ``V``, of ``U``, made non-negative), a differentiable choice away from
zeros, so that outputs compare with NumPy's and finite differences are continuous.
``eigh`` reads one triangle, so it is tested on the symmetric part of its input. Samples
have distinct eigenvalues / singular values (the vectors' gradients divide by gaps).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ... import linalg, ops
from ..core import OpRecord, Sample


def _sym_t(A):
    return (A + ops.transpose(A, -2, -1)) * 0.5


def _sym(A):
    return (A + np.swapaxes(A, -1, -2)) / 2


def _signs_t(V):
    return ops.sign(V[..., :1, :])


def _signs(V):
    return np.sign(V[..., :1, :])


def _eigh_call(A, UPLO="L"):
    L, V = linalg.eigh(_sym_t(A), UPLO)
    return L, V * _signs_t(V)


def _eigh_ref(A, UPLO="L"):
    L, V = np.linalg.eigh(_sym(A), UPLO)
    return L, V * _signs(V)


def _svd_call(A, full_matrices=True):
    U, S, Vh = linalg.svd(A, full_matrices)
    k = S.shape[-1]
    U, Vh = U[..., :, :k], Vh[..., :k, :]
    s = _signs_t(U)
    return U * s, S, Vh * ops.transpose(s, -2, -1)


def _svd_ref(A, full_matrices=True):
    U, S, Vh = np.linalg.svd(A, full_matrices=full_matrices)
    k = S.shape[-1]
    U, Vh = U[..., :, :k], Vh[..., :k, :]
    s = _signs(U)
    return U * s, S, Vh * np.swapaxes(s, -1, -2)


def _pinv_call(A, **kw):
    return linalg.pinv(_sym_t(A) if kw.get("hermitian") else A, **kw)


def _pinv_ref(A, atol=None, rtol=None, hermitian=False):
    if hermitian:
        A = _sym(A)
    if rtol is None:
        rtol = np.finfo(A.dtype).eps * max(A.shape[-2:]) if not atol else 0.0
    U, S, Vh = np.linalg.svd(A, full_matrices=False)
    cut = np.maximum(atol or 0.0, rtol * S[..., :1])
    inv = np.where(S > cut, 1.0 / np.where(S > cut, S, 1.0), 0.0)
    return np.swapaxes(Vh, -1, -2) @ (inv[..., :, None] * np.swapaxes(U, -1, -2))


def _gap_ref(X, L, op):
    gap = L[..., None, :] - L[..., :, None]
    n = L.shape[-1]
    return np.where(np.eye(n, dtype=bool), 0.0, X / np.where(np.eye(n, dtype=bool), 1.0, gap))


def _qr_ref(A, mode="reduced"):
    if mode == "r":
        return np.empty(0), np.linalg.qr(A, "r")
    return tuple(np.linalg.qr(A, mode))


def _expm_ref(A):
    return np.stack([scipy.linalg.expm(a) for a in A.reshape(-1, *A.shape[-2:])]).reshape(
        A.shape)


def _lu_ref(A):
    flat = A.reshape(-1, *A.shape[-2:])
    out = [scipy.linalg.lu_factor(a) for a in flat]
    LU = np.stack([lu for lu, _ in out]).reshape(A.shape)
    piv = np.stack([p + 1 for _, p in out]).reshape(A.shape[:-2] + (min(A.shape[-2:]),))
    return LU, piv


def _perm_ref(pivots, m):
    flat = pivots.reshape(-1, pivots.shape[-1])
    out = np.tile(np.arange(m), (len(flat), 1))
    for row, p in zip(out, flat, strict=True):
        for j, t in enumerate(p - 1):
            row[[j, t]] = row[[t, j]]
    return out.reshape(pivots.shape[:-1] + (m,))


def _a(rng, *shape):
    return rng.standard_normal(shape)


def _distinct(rng, *batch, n=3):
    """A symmetric matrix with well separated eigenvalues 1..n (times 1.5)."""
    q, _ = np.linalg.qr(rng.standard_normal(batch + (n, n)))
    w = 1.5 * np.arange(1, n + 1) - 0.7 * n
    return (q * w[..., None, :]) @ np.swapaxes(q, -1, -2)


def _eigh_samples(rng):
    return [Sample((_distinct(rng),), note="3x3"),
            Sample((_distinct(rng, 2, n=4),), note="batch"),
            Sample((_distinct(rng) + np.triu(_a(rng, 3, 3), 1), "U"), note="upper"),
            Sample((_a(rng, 1, 1),), note="1x1")]


def _svd_samples(rng):
    return [Sample((_a(rng, 3, 3),), note="square"),
            Sample((_a(rng, 4, 2), False), note="tall-reduced"),
            Sample((_a(rng, 2, 4),), note="wide-full"),
            Sample((_a(rng, 2, 4, 3), False), note="batch-tall"),
            Sample((_a(rng, 2, 2, 5), True), note="batch-wide-full")]


def _pinv_samples(rng):
    return [Sample((_a(rng, 3, 3),), note="square"),
            Sample((_a(rng, 4, 2),), note="tall"),
            Sample((_a(rng, 2, 2, 4),), note="batch-wide"),
            Sample((np.eye(3),), note="identity"),
            Sample((_distinct(rng),), {"hermitian": True}, note="hermitian"),
            Sample((_a(rng, 3, 4),), {"atol": 1e-8}, note="atol")]


def _gap_samples(rng):
    return [Sample((_a(rng, 3, 3), np.array([-1.0, 0.5, 2.0]), "linalg.eigh"), note="3x3"),
            Sample((_a(rng, 2, 2, 2), np.array([[0.0, 1.0], [3.0, -1.0]]), "linalg.svd"),
                   note="batch")]


RECORDS = [
    OpRecord("linalg.eigh", _eigh_samples, call=_eigh_call, ref=_eigh_ref, ref_rtol=1e-8),
    OpRecord("linalg.eigvalsh", lambda rng: [
        Sample((_distinct(rng),), note="3x3"),
        Sample((_a(rng, 2, 3, 3), "U"), note="batch-upper")],
        call=lambda A, UPLO="L": linalg.eigvalsh(_sym_t(A), UPLO),
        ref=lambda A, UPLO="L": np.linalg.eigvalsh(_sym(A), UPLO), ref_rtol=1e-8),
    OpRecord("gap_divide", _gap_samples, ref=_gap_ref, ref_rtol=1e-12),
    OpRecord("column_divide", lambda rng: [
        Sample((_a(rng, 4, 3), np.array([2.0, -1.0, 0.5]), "linalg.svd"), note="4x3"),
        Sample((_a(rng, 2, 2, 3), np.array([[1.0, 2.0, 3.0], [0.7, -0.4, 1.1]]), "linalg.svd"),
               note="batch")],
        ref=lambda X, d, op: X / d[..., None, :], ref_rtol=1e-12),
    OpRecord("linalg.svd", _svd_samples, call=_svd_call, ref=_svd_ref, ref_rtol=1e-8),
    OpRecord("linalg.svdvals", lambda rng: [Sample((_a(rng, 3, 3),), note="square"),
                                            Sample((_a(rng, 2, 4, 3),), note="batch-tall"),
                                            Sample((_a(rng, 2, 5),), note="wide")],
             ref=lambda A: np.linalg.svd(A, compute_uv=False), ref_rtol=1e-8),
    OpRecord("linalg.pinv", _pinv_samples, call=_pinv_call, ref=_pinv_ref, ref_rtol=1e-8),
    OpRecord("linalg.qr", lambda rng: [Sample((_a(rng, 4, 3),), note="tall"),
                                       Sample((_a(rng, 3, 3), "complete"), note="complete"),
                                       Sample((_a(rng, 2, 3, 5),), note="batch-wide"),
                                       Sample((_a(rng, 2, 5), "complete"), note="wide-complete")],
             ref=_qr_ref, ref_rtol=1e-8),
    OpRecord("linalg.lu_factor", lambda rng: [Sample((_a(rng, 3, 3),), note="3x3"),
                                              Sample((_a(rng, 2, 4, 4),), note="batch"),
                                              Sample((_a(rng, 4, 3),), note="tall"),
                                              Sample((_a(rng, 3, 5),), note="wide")],
             ref=_lu_ref, ref_rtol=1e-10),
    OpRecord("lu_permutation", lambda rng: [
        Sample((np.array([3, 2, 3], np.int32), 3), note="3"),
        Sample((np.array([[2, 2], [1, 3]], np.int32), 4), note="batch-tall")],
        ref=_perm_ref, grad=False),
    OpRecord("linalg.matrix_exp", lambda rng: [Sample((_a(rng, 3, 3),), note="3x3"),
                                               Sample((2 * _a(rng, 2, 4, 4),), note="scaled"),
                                               Sample((_a(rng, 1, 1),), note="1x1")],
             ref=_expm_ref, ref_rtol=1e-10),
]
