"""Ops written over table ops (``nbgrad/ops/{pointwise,activations,arrange,products,
statistics,normalization,attention}.py``, issue 14): each checked like a table entry,
against NumPy/SciPy, by gradcheck and gradgradcheck (float64), and under both jit tiers
against eager mode (values and gradients)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.integrate
import scipy.linalg
import scipy.spatial.distance
import scipy.special

import nbgrad as nb
from nbgrad.autograd.gradcheck import gradcheck, gradgradcheck

F = nb.nn.functional
RNG = np.random.default_rng(14)


def _r(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape)


def _pos(*shape):
    return RNG.uniform(0.3, 2.0, shape)


@dataclass
class Case:
    name: str
    fn: Callable                    # of tensors
    args: tuple                     # NumPy arrays (the differentiable inputs)
    ref: Callable | None = None     # of NumPy arrays
    grad: bool = True
    second: bool = True
    jit: bool = True                # False: reads values (raises inside nbgrad.jit)

    def __repr__(self) -> str:
        return self.name


def _spd(n=3):
    a = RNG.standard_normal((n, n))
    return a @ a.T + n * np.eye(n)


def _np_norm(x, dims, eps=1e-5):
    mu = x.mean(dims, keepdims=True)
    return (x - mu) / np.sqrt(x.var(dims, keepdims=True) + eps)


def _np_attention(q, k, v, mask):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


_SIGNS = np.array([1.0, -1.0, 1.0, -1.0])
_LABELS = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
_MASK = np.array([[True, False, True], [False, False, True]])


def _np_cos(a, b):
    return (a * b).sum(-1) / np.sqrt(((a * a).sum(-1) + 1e-12) * ((b * b).sum(-1) + 1e-12))


def _np_put(x, rows, values):
    out = x.copy()
    out[rows] = values
    return out


def _np_index_add(x, s):
    out = x.copy()
    np.add.at(out.T, [0, 2, 0], 2 * s.T)
    return out


def _np_conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, strides=None):
    """The scatter form: each input entry adds ``x * w`` at its window."""
    sh, sw = strides or (stride, stride)
    N, C, H, W = x.shape
    _, O, kh, kw = w.shape
    full = np.zeros((N, O, (H - 1) * sh + kh + output_padding, (W - 1) * sw + kw
                     + output_padding))
    for i in range(H):
        for j in range(W):
            full[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw] += np.einsum(
                "nc,cokl->nokl", x[:, :, i, j], w)
    end_h, end_w = full.shape[2] - padding, full.shape[3] - padding
    if strides is not None:  # 1-D: padding only along the width
        return full[:, :, :, padding:end_w] + b[None, :, None, None]
    return full[:, :, padding:end_h, padding:end_w] + b[None, :, None, None]


_UNPOOL = np.array([[[[0, 3], [9, 14]]]])


def _np_unpool(x):
    out = np.zeros(16)
    out[_UNPOOL.reshape(-1)] = x.reshape(-1)
    return out.reshape(1, 1, 4, 4)


def _np_put_flat(x, index, s):
    out = x.copy().reshape(-1)
    np.add.at(out, index, s)
    return out.reshape(x.shape)


def _np_masked_scatter(x, mask, s):
    out = x.copy()
    out[mask] = s[:mask.sum()]
    return out


def _np_conv3d(x, w, b):
    """Direct cross-correlation, padding 1, strides (1, 2, 1)."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)))
    O, _, kd, kh, kw = w.shape
    od, oh, ow = xp.shape[2] - kd + 1, (xp.shape[3] - kh) // 2 + 1, xp.shape[4] - kw + 1
    out = np.zeros((1, O, od, oh, ow))
    for d in range(od):
        for h in range(oh):
            for v in range(ow):
                patch = xp[0, :, d:d + kd, 2 * h:2 * h + kh, v:v + kw]
                out[0, :, d, h, v] = np.einsum("cijk,ocijk->o", patch, w)
    return out + b[None, :, None, None, None]


_SCATTER = np.array([[0, 2], [0, 0], [2, 2]])


def _np_scatter_reduce(x, s, reduce, include_self):
    out, count = x.copy(), np.ones_like(x) if include_self else np.zeros_like(x)
    if not include_self:
        out[np.unique(_SCATTER[:, 0]), 0] = 0.0
        out[np.unique(_SCATTER[:, 1]), 1] = 0.0
    for i in range(3):
        for j in range(2):
            out[_SCATTER[i, j], j] += s[i, j]
            count[_SCATTER[i, j], j] += 1
    return out / np.maximum(count, 1) if reduce == "mean" else out


def _np_scatter_fold(x, s, reduce, include_self):
    fold = {"prod": np.prod, "amax": np.max, "amin": np.min}[reduce]
    out = x.copy()
    for j in range(2):
        for n in np.unique(_SCATTER[:, j]):
            vals = list(s[_SCATTER[:, j] == n, j]) + ([x[n, j]] if include_self else [])
            out[n, j] = fold(vals)
    return out


def _np_bilinear_corners(x):
    def matrix(n_in, n_out):
        src = np.arange(n_out) * (n_in - 1) / (n_out - 1)
        lo = np.minimum(np.floor(src).astype(int), n_in - 2)
        m = np.zeros((n_out, n_in))
        m[np.arange(n_out), lo] = 1 - (src - lo)
        m[np.arange(n_out), lo + 1] = src - lo
        return m
    return matrix(2, 3) @ x @ matrix(3, 5).T


_MEAN, _VAR = np.array([0.1, -0.2, 0.3]), np.array([0.5, 1.5, 2.0])
_CAUSAL = np.tril(np.ones((4, 4), dtype=bool))


def _np_huber(x, t, d=1.0):
    a = np.abs(x - t)
    return np.mean(np.where(a < d, 0.5 * a * a, d * (a - 0.5 * d)))


_SPD = _spd()
_L = np.linalg.cholesky(_SPD)
CASES = [
    # pointwise
    Case("logaddexp", nb.logaddexp, (_r(3, 4), _r(4)), np.logaddexp),
    Case("logaddexp2", nb.logaddexp2, (_r(3), _r(3)), np.logaddexp2),
    Case("xlogy", nb.xlogy, (np.array([0.0, 1.5, -2.0]), _pos(3)), scipy.special.xlogy),
    Case("xlog1py", nb.xlog1py, (np.array([0.0, 1.5, -2.0]), _pos(3)), scipy.special.xlog1py),
    Case("logit", nb.logit, (RNG.uniform(0.1, 0.9, 5),), scipy.special.logit),
    Case("logit-eps", lambda p: nb.logit(p, 0.2), (RNG.uniform(0.3, 0.7, 5),),
         lambda p: scipy.special.logit(np.clip(p, 0.2, 0.8))),
    Case("exp2", nb.exp2, (_r(4),), np.exp2),
    Case("sinc", nb.sinc, (_r(5) + 0.1,), np.sinc),
    Case("fmax", nb.fmax, (_r(4), _r(4)), np.fmax),
    Case("fmin", nb.fmin, (_r(4), _r(4)), np.fmin),
    Case("clamp_min", lambda x: nb.clamp_min(x, 0.3), (_r(5),), lambda x: np.maximum(x, 0.3)),
    Case("clamp_max", lambda x: nb.clamp_max(x, 0.3), (_r(5),), lambda x: np.minimum(x, 0.3)),
    Case("float_power", nb.float_power, (_pos(4), _r(4)), np.float_power),
    Case("frac", nb.frac, (_r(5) * 3 + 0.05,), lambda x: x - np.trunc(x)),
    Case("rsub", lambda a, b: nb.rsub(a, b, alpha=2), (_r(3), _r(3)), lambda a, b: b - 2 * a),
    Case("addcmul", lambda a, b, c: nb.addcmul(a, b, c, value=0.5), (_r(3), _r(3), _r(3)),
         lambda a, b, c: a + 0.5 * b * c),
    Case("addcdiv", lambda a, b, c: nb.addcdiv(a, b, c, value=2), (_r(3), _r(3), _pos(3)),
         lambda a, b, c: a + 2 * b / c),
    Case("nan_to_num", nb.nan_to_num, (_r(4),), np.nan_to_num),
    # activations, normalisation, losses
    Case("logsigmoid", F.logsigmoid, (_r(5) * 5,), lambda x: -np.logaddexp(0, -x)),
    Case("relu6", F.relu6, (_r(5) * 4 + 0.01,), lambda x: np.clip(x, 0, 6)),
    Case("hardtanh", F.hardtanh, (_r(5) + 0.01,), lambda x: np.clip(x, -1, 1)),
    Case("selu", F.selu, (_r(5) + 0.01,), lambda x: 1.0507009873554805 * np.where(
        x > 0, x, 1.6732632423543772 * np.expm1(x))),
    Case("celu", lambda x: F.celu(x, 0.5), (_r(5) + 0.01,),
         lambda x: np.maximum(x, 0) + np.minimum(0, 0.5 * np.expm1(x / 0.5))),
    Case("mish", F.mish, (_r(5),), lambda x: x * np.tanh(np.logaddexp(0, x))),
    Case("softmin", lambda x: F.softmin(x, 1), (_r(2, 3),),
         lambda x: scipy.special.softmax(-x, 1)),
    Case("glu", F.glu, (_r(2, 4),), lambda x: x[:, :2] * scipy.special.expit(x[:, 2:])),
    Case("hardshrink", F.hardshrink, (np.array([-1.0, -0.2, 0.3, 0.8]),),
         lambda x: np.where(np.abs(x) > 0.5, x, 0)),
    Case("softshrink", F.softshrink, (np.array([-1.0, -0.2, 0.3, 0.8]),),
         lambda x: np.sign(x) * np.maximum(np.abs(x) - 0.5, 0)),
    Case("threshold", lambda x: F.threshold(x, 0.1, 20.0), (_r(5) + 0.01,),
         lambda x: np.where(x > 0.1, x, 20.0)),
    Case("normalize", F.normalize, (_r(2, 3),),
         lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)),
    Case("cosine_similarity", F.cosine_similarity, (_r(2, 3), _r(2, 3)),
         lambda a, b: (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)),
    Case("huber_loss", F.huber_loss, (_r(6), _r(6)), _np_huber),
    Case("smooth_l1_loss", lambda a, b: F.smooth_l1_loss(a, b, beta=0.5), (_r(6), _r(6)),
         lambda a, b: _np_huber(a, b, 0.5) / 0.5),  # smooth L1 = huber / beta
    Case("kl_div", lambda x, t: F.kl_div(x, t, reduction="batchmean"),
         (np.log(_pos(2, 3)), _pos(2, 3)),
         lambda x, t: (t * (np.log(t) - x)).sum() / 2),
    Case("gaussian_nll_loss", F.gaussian_nll_loss, (_r(4), _r(4), _pos(4)),
         lambda x, t, v: np.mean(0.5 * (np.log(v) + (x - t) ** 2 / v))),
    Case("poisson_nll_loss", F.poisson_nll_loss, (_r(4), _pos(4)),
         lambda x, t: np.mean(np.exp(x) - t * x)),
    # shape and indexing
    Case("movedim", lambda x: nb.movedim(x, 0, -1), (_r(2, 3, 4),),
         lambda x: np.moveaxis(x, 0, -1)),
    Case("narrow", lambda x: nb.narrow(x, 1, 1, 2), (_r(2, 4),), lambda x: x[:, 1:3]),
    Case("select", lambda x: nb.select(x, 1, -1), (_r(2, 4),), lambda x: x[:, -1]),
    Case("unflatten", lambda x: nb.unflatten(x, 1, (2, 2)), (_r(3, 4),),
         lambda x: x.reshape(3, 2, 2)),
    Case("ravel", nb.ravel, (_r(2, 3),), np.ravel),
    Case("hstack", lambda a, b: nb.hstack([a, b]), (_r(2, 1), _r(2, 3)),
         lambda a, b: np.hstack([a, b])),
    Case("vstack", lambda a, b: nb.vstack([a, b]), (_r(3), _r(2, 3)),
         lambda a, b: np.vstack([a, b])),
    Case("atleast_3d", nb.atleast_3d, (_r(4),), np.atleast_3d),
    Case("meshgrid", lambda a, b: nb.meshgrid(a, b, indexing="xy")[1] * 2.0, (_r(3), _r(2)),
         lambda a, b: np.meshgrid(a, b)[1] * 2.0),
    Case("tensor_split", lambda x: nb.tensor_split(x, 3, 1)[0] * 3.0, (_r(2, 7),),
         lambda x: np.array_split(x, 3, 1)[0] * 3.0),
    Case("rot90", lambda x: nb.rot90(x, 3), (_r(2, 3),), lambda x: np.rot90(x, 3)),
    Case("diff", lambda x: nb.diff(x, 2, dim=0), (_r(5, 2),), lambda x: np.diff(x, 2, 0)),
    Case("take_along_dim", lambda x: nb.take_along_dim(x, nb.tensor(np.array([[2], [0]])), 1),
         (_r(2, 3),), lambda x: np.take_along_axis(x, np.array([[2], [0]]), 1)),
    Case("trapezoid", lambda y, x: nb.trapezoid(y, x), (_r(2, 5), np.sort(_r(5))),
         lambda y, x: np.trapezoid(y, x)),
    # products and matrix functions
    Case("mv", nb.mv, (_r(2, 3), _r(3)), np.dot),
    Case("inner", nb.inner, (_r(2, 3), _r(4, 3)), np.inner),
    Case("tensordot", lambda a, b: nb.tensordot(a, b, ([1, 2], [0, 1])), (_r(2, 3, 2), _r(3, 2, 2)),
         lambda a, b: np.tensordot(a, b, ([1, 2], [0, 1]))),
    Case("kron", nb.kron, (_r(2, 2), _r(2, 3)), np.kron),
    Case("addmm", lambda c, a, b: nb.addmm(c, a, b, beta=0.5, alpha=2), (_r(2, 2), _r(2, 3),
                                                                          _r(3, 2)),
         lambda c, a, b: 0.5 * c + 2 * a @ b),
    Case("addmv", nb.addmv, (_r(2), _r(2, 3), _r(3)), lambda c, a, b: c + a @ b),
    Case("addr", nb.addr, (_r(2, 3), _r(2), _r(3)), lambda c, a, b: c + np.outer(a, b)),
    Case("baddbmm", nb.baddbmm, (_r(2, 2, 2), _r(2, 2, 3), _r(2, 3, 2)),
         lambda c, a, b: c + a @ b),
    Case("addbmm", nb.addbmm, (_r(2, 2), _r(3, 2, 3), _r(3, 3, 2)),
         lambda c, a, b: c + (a @ b).sum(0)),
    Case("multi_dot", lambda a, b, c: nb.multi_dot([a, b, c]), (_r(3), _r(3, 2), _r(2, 2)),
         lambda a, b, c: a @ b @ c),
    Case("matrix_power", lambda a: nb.matrix_power(a, 3), (_spd() / 3,),
         lambda a: np.linalg.matrix_power(a, 3)),
    Case("matrix_power-neg", lambda a: nb.matrix_power(a, -2), (_spd(),),
         lambda a: np.linalg.matrix_power(a, -2)),
    Case("cholesky_solve", lambda b, L: nb.cholesky_solve(b, L), (_r(3, 2), _L),
         lambda b, L: scipy.linalg.cho_solve((L, True), b)),
    Case("logdet", nb.logdet, (_SPD,), lambda a: np.linalg.slogdet(a)[1]),
    Case("cross", nb.cross, (_r(2, 3), _r(2, 3)), np.cross),
    Case("dist", lambda a, b: nb.dist(a, b, 3), (_r(2, 3), _r(3)),
         lambda a, b: np.sum(np.abs(a - b) ** 3) ** (1 / 3)),
    Case("cdist", nb.cdist, (_r(4, 3), _r(2, 3)), scipy.spatial.distance.cdist),
    Case("diag_embed", lambda x: nb.diag_embed(x, 1), (_r(2, 3),),
         lambda x: np.stack([np.diag(r, 1) for r in x])),
    Case("block_diag", lambda a, b: nb.block_diag(a, b), (_r(2, 2), _r(3)),
         lambda a, b: scipy.linalg.block_diag(a, b)),
    # normalisations and attention (nbgrad/ops/normalization.py, attention.py)
    Case("batch_norm", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
         (_r(4, 3, 2), _r(3), _r(3)),
         lambda x, w, b: _np_norm(x, (0, 2)) * w[:, None] + b[:, None]),
    Case("batch_norm-eval", lambda x: F.batch_norm(x, nb.tensor(_MEAN), nb.tensor(_VAR)),
         (_r(2, 3),), lambda x: (x - _MEAN) / np.sqrt(_VAR + 1e-5)),
    Case("group_norm", lambda x, w: F.group_norm(x, 2, w), (_r(2, 4, 3), _r(4)),
         lambda x, w: _np_norm(x.reshape(2, 2, 6), 2).reshape(2, 4, 3) * w[:, None]),
    Case("instance_norm", F.instance_norm, (_r(2, 3, 4),), lambda x: _np_norm(x, 2)),
    Case("rms_norm", lambda x, w: F.rms_norm(x, (3,), w, 1e-6), (_r(2, 3), _r(3)),
         lambda x, w: x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6) * w),
    Case("scaled_dot_product_attention",
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
         (_r(2, 4, 3), _r(2, 4, 3), _r(2, 4, 2)), lambda q, k, v: _np_attention(q, k, v, _CAUSAL)),
    # reductions
    Case("nansum", lambda x: nb.nansum(x, 1), (_r(2, 3),), lambda x: np.nansum(x, 1)),
    Case("nanmean", lambda x: nb.nanmean(x, 0), (_r(2, 3),), lambda x: np.nanmean(x, 0)),
    Case("var_mean", lambda x: nb.var_mean(x, 1)[0] + nb.var_mean(x, 1)[1], (_r(2, 3),),
         lambda x: x.var(1, ddof=1) + x.mean(1)),
    Case("std_mean", lambda x: nb.std_mean(x, 0)[0] * nb.std_mean(x, 0)[1], (_r(3, 2),),
         lambda x: x.std(0, ddof=1) * x.mean(0)),
    Case("aminmax", lambda x: nb.aminmax(x, dim=1).max - nb.aminmax(x, dim=1).min,
         (_r(2, 3),), lambda x: x.max(1) - x.min(1)),
    Case("kthvalue", lambda x: nb.kthvalue(x, 2, 1).values, (_r(2, 4),),
         lambda x: np.sort(x, 1)[:, 1]),
    Case("median", lambda x: nb.median(x, 1).values, (_r(2, 5),),
         lambda x: np.sort(x, 1)[:, 2]),
    Case("nanmedian", lambda x: nb.nanmedian(x, 0).values, (_r(3, 2),),
         lambda x: np.sort(x, 0)[1]),
    Case("quantile", lambda x: nb.quantile(x, nb.tensor(np.array([0.2, 0.75])), 1),
         (_r(2, 5),), lambda x: np.quantile(x, [0.2, 0.75], 1)),
    Case("nanquantile", lambda x: nb.nanquantile(x, 0.4), (_r(2, 5),),
         lambda x: np.nanquantile(x, 0.4)),
    Case("logcumsumexp", lambda x: nb.logcumsumexp(x, 1), (_r(2, 4),),
         lambda x: np.log(np.cumsum(np.exp(x), 1))),
    # losses and activations (nbgrad/ops/losses.py, activations.py)
    Case("hardsigmoid", F.hardsigmoid, (_r(6) * 2,), lambda x: np.clip(x + 3, 0, 6) / 6),
    Case("hardswish", F.hardswish, (_r(6) * 2,), lambda x: x * np.clip(x + 3, 0, 6) / 6),
    Case("softsign", F.softsign, (_r(5),), lambda x: x / (1 + np.abs(x))),
    Case("tanhshrink", F.tanhshrink, (_r(5),), lambda x: x - np.tanh(x)),
    Case("prelu", F.prelu, (_r(2, 3, 2), _pos(3)),
         lambda x, w: np.where(x > 0, x, w[:, None] * x)),
    Case("rrelu-eval", F.rrelu, (_r(5),), lambda x: np.where(x >= 0, x, x * (1 / 8 + 1 / 3) / 2)),
    Case("margin_ranking_loss", lambda a, b: F.margin_ranking_loss(a, b, nb.tensor(_SIGNS), 0.1),
         (_r(4), _r(4)), lambda a, b: np.mean(np.maximum(0, -_SIGNS * (a - b) + 0.1))),
    Case("soft_margin_loss", lambda x: F.soft_margin_loss(x, nb.tensor(_SIGNS)), (_r(4),),
         lambda x: np.mean(np.log1p(np.exp(-_SIGNS * x)))),
    Case("multilabel_soft_margin_loss",
         lambda x: F.multilabel_soft_margin_loss(x, nb.tensor(_LABELS)), (_r(2, 3),),
         lambda x: np.mean(np.mean(_LABELS * np.log1p(np.exp(-x))
                                   + (1 - _LABELS) * np.log1p(np.exp(x)), -1))),
    Case("hinge_embedding_loss", lambda x: F.hinge_embedding_loss(x, nb.tensor(_SIGNS)),
         (_r(4),), lambda x: np.mean(np.where(_SIGNS == 1, x, np.maximum(0, 1 - x)))),
    Case("cosine_embedding_loss",
         lambda a, b: F.cosine_embedding_loss(a, b, nb.tensor(_SIGNS[:2]), 0.1),
         (_r(2, 3), _r(2, 3)), lambda a, b: np.mean(np.where(
             _SIGNS[:2] == 1, 1 - _np_cos(a, b), np.maximum(0, _np_cos(a, b) - 0.1)))),
    Case("triplet_margin_loss", F.triplet_margin_loss, (_r(2, 3), _r(2, 3), _r(2, 3)),
         lambda a, p, n: np.mean(np.maximum(0, np.linalg.norm(a - p + 1e-6, axis=-1)
                                            - np.linalg.norm(a - n + 1e-6, axis=-1) + 1))),
    Case("pairwise_distance", F.pairwise_distance, (_r(3, 4), _r(3, 4)),
         lambda a, b: np.linalg.norm(a - b + 1e-6, axis=-1)),
    # arrays and statistics (nbgrad/ops/arrays.py)
    Case("deg2rad", nb.deg2rad, (_r(3),), np.deg2rad),
    Case("fliplr", nb.fliplr, (_r(2, 3),), np.fliplr),
    Case("dstack", lambda a, b: nb.dstack([a, b]), (_r(2, 3), _r(2, 3)),
         lambda a, b: np.dstack([a, b])),
    Case("column_stack", lambda a, b: nb.column_stack([a, b]), (_r(3), _r(3, 2)),
         lambda a, b: np.column_stack([a, b])),
    Case("hsplit", lambda x: nb.hsplit(x, 2)[1], (_r(2, 4),), lambda x: np.hsplit(x, 2)[1]),
    Case("repeat_interleave", lambda x: nb.repeat_interleave(x, nb.tensor([1, 0, 2]), 0),
         (_r(3, 2),), lambda x: np.repeat(x, [1, 0, 2], 0)),
    Case("cartesian_prod", lambda a, b: nb.cartesian_prod(a, b), (_r(2), _r(3)),
         lambda a, b: np.array([[u, v] for u in a for v in b])),
    Case("diagflat", lambda x: nb.diagflat(x, 1), (_r(2, 2),), lambda x: np.diagflat(x, 1)),
    Case("sum_to_size", lambda x: nb.sum_to_size(x, (1, 3)), (_r(2, 3),),
         lambda x: x.sum(0, keepdims=True)),
    Case("cov", lambda x, w: nb.cov(x, aweights=w), (_r(2, 5), _pos(5)),
         lambda x, w: np.cov(x, aweights=w)),
    Case("corrcoef", nb.corrcoef, (_r(3, 6),), np.corrcoef),
    Case("cumulative_trapezoid", lambda y, x: nb.cumulative_trapezoid(y, x),
         (_r(2, 5), np.sort(_r(5))),
         lambda y, x: scipy.integrate.cumulative_trapezoid(y, x, axis=-1)),
    # linear algebra (nbgrad/ops/matrix_functions.py)
    Case("vector_norm", lambda x: nb.linalg.vector_norm(x, 3, 1), (_r(2, 3),),
         lambda x: np.linalg.norm(x, 3, axis=1)),
    Case("matrix_norm-inf", lambda a: nb.linalg.matrix_norm(a, np.inf), (_r(3, 3),),
         lambda a: np.linalg.norm(a, np.inf)),
    Case("matrix_norm-1", lambda a: nb.linalg.matrix_norm(a, 1), (_r(2, 3, 3),),
         lambda a: np.stack([np.linalg.norm(m, 1) for m in a])),
    Case("linalg.norm", lambda x: nb.linalg.norm(x), (_r(2, 3),), np.linalg.norm),
    Case("vecdot", lambda a, b: nb.linalg.vecdot(a, b), (_r(2, 3), _r(3)),
         lambda a, b: (a * b).sum(-1)),
    Case("vander", lambda x: nb.linalg.vander(x), (_r(4),),
         lambda x: np.vander(x, increasing=True)),
    Case("cholesky_inverse", nb.cholesky_inverse, (_L,), lambda L: np.linalg.inv(L @ L.T)),
    Case("triangular_solve", lambda b, L: nb.triangular_solve(b, L, upper=False).solution,
         (_r(3, 2), _L), lambda b, L: scipy.linalg.solve_triangular(L, b, lower=True)),
    # selection (nbgrad/ops/selection.py)
    Case("index_add", lambda x, s: nb.index_add(x, 1, nb.tensor([0, 2, 0]), s, alpha=2),
         (_r(2, 3), _r(2, 3)), _np_index_add),
    Case("index_copy", lambda x, s: nb.index_copy(x, 0, nb.tensor([2, 0]), s),
         (_r(3, 2), _r(2, 2)), lambda x, s: _np_put(x, [2, 0], s)),
    Case("index_fill", lambda x: nb.index_fill(x, 1, nb.tensor([1, 1]), -1.5), (_r(2, 3),),
         lambda x: _np_put(x.T, [1], np.full((1, 2), -1.5)).T),
    Case("masked_select", lambda x: nb.masked_select(x, nb.tensor(_MASK)), (_r(2, 3),),
         lambda x: x[_MASK]),
    # resampling (nbgrad/ops/resampling.py)
    Case("avg_pool1d", lambda x: F.avg_pool1d(x, 2), (_r(1, 2, 6),),
         lambda x: x.reshape(1, 2, 3, 2).mean(-1)),
    Case("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (2, 3)), (_r(1, 1, 4, 6),),
         lambda x: x.reshape(1, 1, 2, 2, 3, 2).mean((3, 5))),
    Case("adaptive_max_pool1d", lambda x: F.adaptive_max_pool1d(x, 3), (_r(1, 2, 6),),
         lambda x: x.reshape(1, 2, 3, 2).max(-1)),
    Case("interpolate-nearest", lambda x: F.interpolate(x, scale_factor=2), (_r(1, 1, 2, 3),),
         lambda x: x.repeat(2, 2).repeat(2, 3)),
    Case("interpolate-bilinear",
         lambda x: F.interpolate(x, size=(3, 5), mode="bilinear", align_corners=True),
         (_r(1, 1, 2, 3),), _np_bilinear_corners),
    Case("unfold", lambda x: F.unfold(x, 2), (_r(1, 1, 3, 3),),
         lambda x: np.stack([x[0, 0, i:i + 2, j:j + 2].reshape(-1) for i in range(2)
                             for j in range(2)], 1)[None]),
    Case("pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), (_r(1, 4, 2, 3),),
         lambda x: x.reshape(1, 1, 2, 2, 2, 3).transpose(0, 1, 4, 2, 5, 3).reshape(1, 1, 4, 6)),
    Case("local_response_norm", lambda x: F.local_response_norm(x, 2), (_r(2, 3, 2),),
         lambda x: x / (1 + 1e-4 * np.stack([(x[:, max(c - 1, 0):c + 1] ** 2).sum(1) / 2
                                             for c in range(3)], 1)) ** 0.75),

    # variants (nbgrad/ops/variants.py)
    Case("select_scatter", lambda x, s: nb.select_scatter(x, s, 1, -1), (_r(2, 3), _r(2)),
         lambda x, s: np.concatenate([x[:, :2], s[:, None]], 1)),
    Case("slice_scatter", lambda x, s: nb.slice_scatter(x, s, 0, 0, 4, 2), (_r(4, 2), _r(2, 2)),
         lambda x, s: _np_put(x, [0, 2], s)),
    Case("diagonal_scatter", lambda x, s: nb.diagonal_scatter(x, s, 1), (_r(3, 4), _r(3)),
         lambda x, s: x - np.diag(np.diagonal(x, 1), 1)[:3, :4] + np.diag(s, 1)[:3, :4]),
    Case("cummax", lambda x: nb.cummax(x, 1).values, (_r(2, 5),),
         lambda x: np.maximum.accumulate(x, 1), jit=False),
    Case("cummin", lambda x: nb.cummin(x, 0).values, (_r(4, 2),),
         lambda x: np.minimum.accumulate(x, 0), jit=False),
    Case("ldexp", lambda x: nb.ldexp(x, nb.tensor([1, -2, 3])), (_r(3),),
         lambda x: np.ldexp(x, [1, -2, 3])),
    Case("transpose_copy", lambda x: nb.transpose_copy(x, 0, 1), (_r(2, 3),), lambda x: x.T),

    Case("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, 2, 1, 1),
         (_r(1, 2, 3, 3), _r(2, 3, 3, 3), _r(3)), _np_conv_transpose2d),
    Case("conv_transpose1d", lambda x, w: F.conv_transpose1d(x, w, stride=2),
         (_r(1, 2, 4), _r(2, 1, 3)),
         lambda x, w: _np_conv_transpose2d(x[:, :, None], w[:, :, None], np.zeros(1), 2, 0,
                                           0, (1, 2))[:, :, 0]),

    Case("put", lambda x, s: nb.put(x, nb.tensor([5, 0, 5]), s, accumulate=True),
         (_r(2, 3), _r(3)), lambda x, s: _np_put_flat(x, [5, 0, 5], s)),
    Case("masked_scatter", lambda x, s: nb.masked_scatter(x, nb.tensor(_MASK), s),
         (_r(2, 3), _r(5)), lambda x, s: _np_masked_scatter(x, _MASK, s)),
    Case("pdist", F.pdist, (_r(4, 3),), scipy.spatial.distance.pdist),
    Case("max_unpool2d", lambda x: F.max_unpool2d(x, nb.tensor(_UNPOOL), 2),
         (_r(1, 1, 2, 2),), lambda x: _np_unpool(x)),

    Case("mvlgamma", lambda x: nb.mvlgamma(x, 3), (_pos(4) + 1.5,),
         lambda x: np.array([scipy.special.multigammaln(v, 3) for v in x])),
    Case("renorm", lambda x: nb.renorm(x, 2, 0, 1.0), (_r(3, 4),),
         lambda x: x * np.where(np.linalg.norm(x, axis=1, keepdims=True) > 1.0,
                                1.0 / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-7), 1.0)),

    Case("conv3d", lambda x, w, b: F.conv3d(x, w, b, padding=1, stride=(1, 2, 1)),
         (_r(1, 2, 3, 4, 3), _r(4, 2, 2, 3, 2), _r(4)), _np_conv3d),

    Case("scatter_reduce-sum", lambda x, s: nb.scatter_reduce(x, 0, nb.tensor(_SCATTER), s,
                                                                "sum", include_self=False),
         (_r(3, 2), _r(3, 2)), lambda x, s: _np_scatter_reduce(x, s, "sum", False)),
    Case("scatter_reduce-mean", lambda x, s: nb.scatter_reduce(x, 0, nb.tensor(_SCATTER), s,
                                                                 "mean"),
         (_r(3, 2), _r(3, 2)), lambda x, s: _np_scatter_reduce(x, s, "mean", True)),
    *(Case(f"scatter_reduce-{red}-{inc}",
           lambda x, s, red=red, inc=inc: nb.scatter_reduce(x, 0, nb.tensor(_SCATTER), s, red,
                                                            include_self=inc),
           (_r(3, 2), _r(3, 2)),
           lambda x, s, red=red, inc=inc: _np_scatter_fold(x, s, red, inc))
      for red, inc in (("prod", True), ("prod", False), ("amax", False), ("amin", True))),

]


def _inputs(case: Case, grad: bool = True):
    return tuple(nb.tensor(a, requires_grad=grad) for a in case.args)


def _outputs(out) -> list:
    return [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, nb.Tensor)]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_forward_matches_numpy(case):
    got = case.fn(*_inputs(case, grad=False))
    np.testing.assert_allclose(got.numpy(), case.ref(*case.args), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradcheck_first_and_second_order(case):
    assert gradcheck(case.fn, _inputs(case))
    if case.second:
        assert gradgradcheck(case.fn, _inputs(case))


@pytest.mark.parametrize("case", [c for c in CASES if c.jit], ids=repr)
def test_jit_tiers_equal_eager(case):
    """The sum of squares and its gradient (every input), as one jitted graph
    (``jit(value_and_grad(...))``) in each tier, equal eager mode."""
    def loss(*xs):
        return (case.fn(*xs) ** 2).sum()

    argnums = tuple(range(len(case.args)))
    want_v, want_g = nb.value_and_grad(loss, argnums=argnums)(*_inputs(case))
    for mode in ("interpret", "compile"):
        step = nb.jit(nb.value_and_grad(loss, argnums=argnums), mode=mode)
        for _ in range(2):  # the trace, then the tier's executable
            v, gs = step(*_inputs(case))
            np.testing.assert_allclose(float(v), float(want_v), rtol=1e-12)
            for g, w in zip(gs, want_g, strict=True):
                np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10, atol=1e-12)
        if mode == "compile":
            assert "objmode(" not in step.source(*_inputs(case)).split("def run_graph")[1]


def test_predicates():
    x = nb.tensor(np.array([np.nan, np.inf, -np.inf, 0.0, -1.5]))
    for fn, ref in [(nb.isnan, np.isnan), (nb.isinf, np.isinf), (nb.isfinite, np.isfinite),
                    (nb.isposinf, np.isposinf), (nb.isneginf, np.isneginf)]:
        got = fn(x)
        assert got.dtype == nb.bool_
        np.testing.assert_array_equal(got.numpy(), ref(x.numpy()))
        np.testing.assert_array_equal(fn(nb.tensor(np.arange(3))).numpy(), ref(np.arange(3)))
    np.testing.assert_array_equal(nb.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0).numpy(),
                                  [1.0, 2.0, -2.0, 0.0, -1.5])
    np.testing.assert_array_equal(nb.any(x > 0, 0).numpy(), True)
    np.testing.assert_array_equal(nb.all(nb.tensor(np.ones((2, 2))), axis=1).numpy(), [1, 1])
    np.testing.assert_array_equal(nb.count_nonzero(nb.tensor([[0, 1], [2, 3]]), 0).numpy(), [1, 2])


def test_xlogy_is_zero_and_nan_free_where_x_is_zero():
    x = nb.tensor(np.array([0.0, 0.0, 0.0, 2.0]), requires_grad=True)
    y = nb.tensor(np.array([0.0, np.inf, 3.0, 0.5]), requires_grad=True)
    out = nb.xlogy(x, y)
    np.testing.assert_array_equal(out.numpy()[:3], 0.0)
    np.testing.assert_array_equal(out.numpy(), scipy.special.xlogy(x.numpy(), y.numpy()))
    out.sum().backward()
    assert np.isfinite(x.grad.numpy()).all() and np.isfinite(y.grad.numpy()).all()
    # d/dx = log(y) (also at x = 0, as finite differences say), 0 at the conventions
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, math.log(3.0), math.log(0.5)])
    np.testing.assert_allclose(y.grad.numpy(), [0.0, 0.0, 0.0, 4.0])
    assert np.isnan(nb.xlogy(nb.tensor([0.0]), nb.tensor([np.nan])).numpy()).all()


def test_order_statistics_with_nan():
    a = np.array([[1.0, np.nan, 3.0, 0.5], [2.0, 1.0, 4.0, 3.0]])
    np.testing.assert_array_equal(nb.median(nb.tensor(a), 1).values.numpy(), [np.nan, 2.0])
    np.testing.assert_array_equal(nb.nanmedian(nb.tensor(a), 1).values.numpy(), [1.0, 2.0])
    np.testing.assert_allclose(nb.nanquantile(nb.tensor(a), 0.5, 1).numpy(),
                               np.nanquantile(a, 0.5, 1))
    assert np.isnan(nb.quantile(nb.tensor(a), 0.5, 1).numpy()[0])
    for method in ("lower", "higher", "nearest", "midpoint"):
        np.testing.assert_allclose(nb.quantile(nb.tensor(a[1]), 0.4, interpolation=method).numpy(),
                                   np.quantile(a[1], 0.4, method=method))


def test_logcumsumexp_handles_large_and_minus_infinite_values():
    x = nb.tensor(np.array([[1000.0, 1000.0, -np.inf], [-np.inf, -np.inf, -np.inf]]))
    out = nb.logcumsumexp(x, 1).numpy()
    np.testing.assert_allclose(out[0], [1000.0, 1000.0 + math.log(2), 1000.0 + math.log(2)])
    np.testing.assert_array_equal(out[1], -np.inf)


def test_feature_dropout_zeroes_whole_channels():
    x = nb.tensor(np.ones((4, 6, 3, 3)))
    y = F.dropout2d(x, 0.5)
    per_channel = y.numpy().reshape(4, 6, 9)
    assert np.all((per_channel == 0).all(-1) | (per_channel == 2.0).all(-1))
    np.testing.assert_array_equal(F.dropout2d(x, 0.5, training=False).numpy(), x.numpy())


def test_index_factories_and_identities_match_numpy():
    np.testing.assert_array_equal(nb.tril_indices(3, 4, 1).numpy(), np.tril_indices(3, 1, 4))
    np.testing.assert_array_equal(nb.triu_indices(4, 3).numpy(), np.triu_indices(4, 0, 3))
    np.testing.assert_allclose(nb.logspace(0, 2, 5, base=2.0).numpy(),
                               np.logspace(0, 2, 5, base=2))
    x = nb.tensor(np.array([-1.5, 0.0, 2.0, np.nan]))
    np.testing.assert_array_equal(nb.angle(x).numpy(), np.angle(x.numpy()))
    assert nb.conj(x) is x and nb.real(x) is x
    np.testing.assert_array_equal(nb.cummax(nb.tensor([1.0, 3.0, 3.0, 2.0]), 0).indices.numpy(),
                                  [0, 1, 2, 2])  # the last position of a tie, as PyTorch


@pytest.mark.parametrize("case", [c for c in CASES if not c.jit], ids=repr)
def test_value_dependent_ops_raise_inside_jit(case):
    with pytest.raises(nb.errors.TracerError):
        nb.jit(case.fn)(*_inputs(case))


def test_counting_and_runs_match_numpy():
    x = nb.tensor(np.array([3, 1, 1, 2, 2, 2, 5]))
    np.testing.assert_array_equal(nb.bincount(x, minlength=7).numpy(),
                                  np.bincount(x.numpy(), minlength=7))
    values, inverse, counts = nb.unique_consecutive(x, True, True)
    np.testing.assert_array_equal(values.numpy(), [3, 1, 2, 5])
    np.testing.assert_array_equal(inverse.numpy(), [0, 1, 1, 2, 2, 2, 3])
    np.testing.assert_array_equal(counts.numpy(), [1, 2, 3, 1])
    y = nb.tensor(np.array([0.5, 1.5, 1.7, 3.0, 9.0]))
    np.testing.assert_array_equal(nb.histc(y, 3, 0, 3).numpy(), [1.0, 2.0, 1.0])
