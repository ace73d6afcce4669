"""Records for reductions, scans, sorting and the ops of ``nbgrad.nn.functional``.

References are NumPy/SciPy code written independently of the kernels. Samples avoid
the points where an op is not differentiable (ties of max/sort, zeros of abs-like
gradients); the choices nbgrad makes at those points are tested in
``tests/test_numerics.py``.
"""

from __future__ import annotations

import numpy as np
import scipy.special as sp

from ..core import OpRecord, Sample, sample_array


def _arr(rng, *shape, domain: str = "real"):
    return sample_array(rng, shape, domain)


def _axis(dim):
    return dim if dim is None or isinstance(dim, int) else tuple(dim)


# ------------------------------------------------------------------ reductions
def _dim_samples(rng, domain: str = "real", tuples: bool = True, none: bool = True):
    x = _arr(rng, 2, 3, 4, domain=domain)
    out = [Sample((x,), {"dim": 1}, "dim1"), Sample((x,), {"dim": -1, "keepdim": True},
                                                    "dim-1-keep")]
    if none:
        out += [Sample((x,), {}, "all"), Sample((_arr(rng, domain=domain),), {}, "0d")]
    if tuples:
        out.append(Sample((x,), {"dim": (0, 2), "keepdim": True}, "dims02-keep"))
        out.append(Sample((x,), {"dim": (2, 0)}, "dims20"))
    return out


def _prod_samples(rng):
    with_zeros = _arr(rng, 3, 4)
    with_zeros[0, 1] = 0.0  # one zero in a row
    with_zeros[2, 0] = with_zeros[2, 3] = 0.0  # two zeros in a row
    return _dim_samples(rng) + [Sample((with_zeros,), {"dim": 1}, "zeros-dim1"),
                                Sample((with_zeros,), {}, "zeros-all"),
                                Sample((with_zeros[:, :1].copy(),), {"dim": 0}, "zeros-col")]


def _extreme_samples(rng):
    x = _arr(rng, 3, 4)
    return [Sample((x,), note="2d"), Sample((_arr(rng, 5),), note="1d"),
            Sample((_arr(rng),), note="0d")]


def _dim_value_samples(rng):
    x = _arr(rng, 3, 4, 2)
    return [Sample((x, 1), note="dim1"), Sample((x, -1, True), note="dim-1-keep"),
            Sample((x, 0, False), note="dim0"), Sample((_arr(rng), 0), note="0d")]


def _extreme_dim_ref(values, indices):
    def ref(x, dim, keepdim=False):
        if x.ndim == 0:
            return x.copy(), np.zeros((), np.int64)
        return values(x, dim, keepdims=keepdim), indices(x, dim, keepdims=keepdim)
    return ref


def _argmax_ref(fn):
    def ref(x, dim=None, keepdim=False):
        return np.asarray(fn(x, axis=dim, keepdims=keepdim))
    return ref


def _var_samples(rng):
    x = _arr(rng, 3, 4, 2)
    return [Sample((x,), note="all"), Sample((x,), {"dim": 1}, "dim1"),
            Sample((x,), {"dim": (0, 2), "keepdim": True, "correction": 0}, "dims02-biased"),
            Sample((x, 1, 2.0), note="correction2"),
            Sample((x,), {"dim": 0, "unbiased": False}, "unbiased-alias")]


def _var_ref(fn):
    def ref(x, dim=None, correction=1, keepdim=False, unbiased=None):
        if unbiased is not None:
            correction = 1 if unbiased else 0
        return fn(x, axis=_axis(dim), ddof=correction, keepdims=keepdim)
    return ref


def _logsumexp_samples(rng):
    return _dim_samples(rng) + [Sample((_arr(rng, 3, 4) * 1e3,), {"dim": 1}, "magnitude-1e3")]


def _norm_samples(rng):
    x = _arr(rng, 3, 4, domain="nonzero")
    return [Sample((x,), note="fro-all"), Sample((x, 2, 1), note="p2-dim1"),
            Sample((x, 1, 0, True), note="p1-dim0-keep"),
            Sample((x, float("inf"), 1), note="inf-dim1"),
            Sample((x, float("-inf"), (0, 1)), note="-inf-all"),
            Sample((x, 3, -1), note="p3"), Sample((x, 1.5), note="p1.5-all"),
            Sample((x, 0, 1), note="p0"), Sample((x, "fro", (0, 1)), note="fro-dims")]


def _norm_ref(x, p="fro", dim=None, keepdim=False):
    p = 2.0 if p == "fro" else float(p)
    a = np.abs(x)
    axis = _axis(dim)
    if p == np.inf:
        return np.max(a, axis=axis, keepdims=keepdim)
    if p == -np.inf:
        return np.min(a, axis=axis, keepdims=keepdim)
    if p == 0:
        return np.sum(a != 0, axis=axis, keepdims=keepdim).astype(x.dtype)
    return np.sum(a ** p, axis=axis, keepdims=keepdim) ** (1 / p)


def _scan_dim_samples(rng, zeros: bool = False):
    x = _arr(rng, 3, 4)
    if zeros:
        x[1, 1] = 0.0
        x[2, 0] = x[2, 2] = 0.0
    return [Sample((x, 1), note="dim1"), Sample((x, 0), note="dim0"),
            Sample((_arr(rng, 2, 3, 2), -2), note="3d-middle"), Sample((_arr(rng), 0), note="0d")]


def _cum_ref(fn):
    def ref(x, dim):
        return x.copy() if x.ndim == 0 else fn(x, axis=dim)
    return ref


def _scan_samples(rng):
    return [Sample((_arr(rng, 3, 4), _arr(rng, 3, 4), 1), note="forward"),
            Sample((_arr(rng, 3, 4), _arr(rng, 3, 4), 0, True), note="reverse"),
            Sample((_arr(rng, 2, 4), _arr(rng, 4), 1, True), note="broadcast-coef")]


def _scan_ref(b, a, dim, reverse=False):
    b, a = np.broadcast_arrays(b, a)
    b, a = np.moveaxis(b, dim, 0), np.moveaxis(a, dim, 0)
    h = np.zeros_like(b)
    n = b.shape[0]
    for k in (range(n - 1, -1, -1) if reverse else range(n)):
        if reverse:
            h[k] = b[k] + (a[k + 1] * h[k + 1] if k + 1 < n else 0)
        else:
            h[k] = b[k] + (a[k] * h[k - 1] if k > 0 else 0)
    return np.moveaxis(h, 0, dim)


def _shift_samples(rng):
    x = _arr(rng, 3, 4)
    return [Sample((x, 1, 1), note="right"), Sample((x, 0, -2, 1.5), note="left-fill"),
            Sample((x, 1, 5), note="beyond"), Sample((x, -1, 0), note="none")]


def _shift_ref(x, dim, offset, fill=0.0):
    n = x.shape[dim]
    src = np.arange(n) - offset
    inside = (src >= 0) & (src < n)
    out = np.take(x, np.clip(src, 0, n - 1), axis=dim)
    shape = [1] * x.ndim
    shape[dim] = n
    return np.where(inside.reshape(shape), out, fill)


def _sort_samples(rng):
    x = _arr(rng, 3, 5)
    return [Sample((x,), note="last"), Sample((x, 0, True), note="dim0-desc"),
            Sample((_arr(rng, 2, 3, 4),), {"dim": 1}, "3d")]


def _sort_ref(x, dim=-1, descending=False, stable=False):
    order = np.argsort(-x if descending else x, axis=dim, kind="stable")
    return np.take_along_axis(x, order, axis=dim), order


def _topk_samples(rng):
    x = _arr(rng, 3, 5)
    return [Sample((x, 2), note="k2"), Sample((x, 3, 0, False), note="smallest-dim0"),
            Sample((x, 5), note="k=n")]


def _topk_ref(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002 - torch's name
    values, order = _sort_ref(x, dim, largest)
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(0, k)
    return values[tuple(idx)], order[tuple(idx)]


# ------------------------------------------------------------------ nn
def _softmax_samples(rng):
    return [Sample((_arr(rng, 3, 4), 1), note="dim1"), Sample((_arr(rng, 3, 4), 0), note="dim0"),
            Sample((_arr(rng, 2, 3, 4), -2), note="3d"), Sample((_arr(rng, 5), 0), note="1d"),
            Sample((_arr(rng, 2, 3) * 1e3, 1), note="magnitude-1e3")]


def _activation(name: str, **kwargs):
    def make(rng):
        out = [Sample((_arr(rng, 2, 3, domain="nonzero") * 2,), dict(kwargs), note="2d"),
               Sample((_arr(rng, 5, domain="nonzero"),), dict(kwargs), note="1d")]
        return out
    return make


def _gelu_samples(rng):
    x = _arr(rng, 2, 3) * 2
    return [Sample((x,), note="exact"), Sample((x, "tanh"), note="tanh")]


def _gelu_ref(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    return x * sp.ndtr(x)


def _class_inputs(rng, with_ignore: bool = False):
    x = _arr(rng, 4, 5)
    target = np.array([0, 3, 4, 1])
    if with_ignore:
        target[1] = -100
    return x, target


def _nll_samples(rng):
    x, t = _class_inputs(rng)
    logp = sp.log_softmax(x, axis=1)
    xi, ti = _class_inputs(rng, True)
    w = rng.uniform(0.5, 2.0, 5)
    x3 = sp.log_softmax(_arr(rng, 2, 3, 4), axis=1)
    t3 = np.array([[0, 1, 2, 1], [2, 2, 0, 1]])
    return [Sample((logp, t), note="mean", diff=(0,)),
            Sample((sp.log_softmax(xi, 1), ti, w), note="weight-ignore", diff=(0,)),
            Sample((logp, t), {"reduction": "sum"}, "sum", diff=(0,)),
            Sample((logp, t), {"reduction": "none", "label_smoothing": 0.2}, "none-smooth",
                   diff=(0,)),
            Sample((x3, t3, w[:3], -100, "mean", 0.1), note="3d-weight-smooth", diff=(0,)),
            Sample((logp[0], np.array(2)), note="1d", diff=(0,))]


def _nll_ref(logp, target, weight=None, ignore_index=-100, reduction="mean",
             label_smoothing=0.0):
    cdim = 0 if logp.ndim == 1 else 1
    C = logp.shape[cdim]
    w = np.ones(C) if weight is None else weight
    lp = np.moveaxis(logp, cdim, -1)  # (..., C)
    keep = target != ignore_index
    safe = np.where(keep, target, 0)
    picked = np.take_along_axis(lp, safe[..., None], axis=-1)[..., 0]
    wt = w[safe] * keep
    loss = -wt * picked
    if label_smoothing:
        smooth = -(lp * w).sum(-1) * keep
        loss = (1 - label_smoothing) * loss + label_smoothing / C * smooth
    if reduction == "none":
        return loss
    return loss.sum() / wt.sum() if reduction == "mean" else loss.sum()


def _nll_backward_samples(rng):
    t = np.array([0, 3, -100, 1])
    w = rng.uniform(0.5, 2.0, 5)
    return [Sample((_arr(rng, 4), t, None, (4, 5), -100, "none", 0.0), note="none", diff=(0,)),
            Sample((_arr(rng), t, w, (4, 5), -100, "mean", 0.2), note="mean-weight-smooth",
                   diff=(0,)),
            Sample((_arr(rng), t, None, (4, 5), -100, "sum", 0.0), note="sum", diff=(0,))]


def _nll_backward_ref(g, target, weight, sizes, ignore_index, reduction, label_smoothing):
    C = sizes[1]
    w = np.ones(C) if weight is None else weight
    keep = target != ignore_index
    safe = np.where(keep, target, 0)
    if reduction == "none":
        G = g
    elif reduction == "sum":
        G = np.full(target.shape, float(g))
    else:
        G = np.full(target.shape, float(g) / (w[safe] * keep).sum())
    G = G * keep
    onehot = np.eye(C)[safe]
    coef = (1 - label_smoothing) * onehot * w[safe][:, None] + label_smoothing / C * w
    return -coef * G[:, None]


def _cross_entropy_samples(rng):
    x, t = _class_inputs(rng)
    xi, ti = _class_inputs(rng, True)
    w = rng.uniform(0.5, 2.0, 5)
    q = rng.dirichlet(np.ones(5), 4)
    x3 = _arr(rng, 2, 3, 4)
    t3 = np.array([[0, 1, 2, 1], [2, 2, 0, 1]])
    return [Sample((x, t), note="mean", diff=(0,)),
            Sample((xi, ti, w), {"label_smoothing": 0.1}, "weight-ignore-smooth", diff=(0,)),
            Sample((x, t), {"reduction": "none"}, "none", diff=(0,)),
            Sample((x3, t3, None, -100, "sum"), note="3d-sum", diff=(0,)),
            Sample((x * 1e3, t), note="magnitude-1e3", diff=(0,)),
            Sample((x[0], np.array(3)), note="1d", diff=(0,)),
            Sample((x, q), note="probabilities"),
            Sample((x, q, w), {"label_smoothing": 0.2, "reduction": "none"},
                   "probabilities-weight-smooth", diff=(0, 1))]


def _cross_entropy_ref(x, target, weight=None, ignore_index=-100, reduction="mean",
                       label_smoothing=0.0):
    cdim = 0 if x.ndim == 1 else 1
    logp = sp.log_softmax(x, axis=cdim)
    if target.dtype.kind != "f":
        return _nll_ref(logp, target, weight, ignore_index, reduction, label_smoothing)
    C = x.shape[cdim]
    q = target * (1 - label_smoothing) + label_smoothing / C
    w = np.ones(C) if weight is None else weight
    shape = [1] * x.ndim
    shape[cdim] = C
    per = -(q * w.reshape(shape) * logp).sum(cdim)
    if reduction == "none":
        return per
    return per.sum() / per.size if reduction == "mean" else per.sum()


def _pair_samples(rng):
    return [Sample((_arr(rng, 3, 4), _arr(rng, 3, 4)), note="mean"),
            Sample((_arr(rng, 3, 4), _arr(rng, 4)), {"reduction": "sum"}, "broadcast-sum"),
            Sample((_arr(rng, 2, 3), _arr(rng, 2, 3)), {"reduction": "none"}, "none")]


def _pair_ref(fn):
    def ref(a, b, reduction="mean"):
        v = fn(a - b)
        return v if reduction == "none" else (v.mean() if reduction == "mean" else v.sum())
    return ref


def _bce_samples(rng):
    p = _arr(rng, 3, 4, domain="positive") / 2.5  # in (0.2, 0.8)
    t = rng.uniform(0, 1, (3, 4))
    w = rng.uniform(0.5, 2.0, 4)
    return [Sample((p, t), note="mean"), Sample((p, t, w), {"reduction": "sum"}, "weight-sum"),
            Sample((p, t, w[:1]), {"reduction": "none"}, "none")]


def _bce_ref(p, t, weight=None, reduction="mean"):
    v = -(t * np.maximum(np.log(p), -100) + (1 - t) * np.maximum(np.log1p(-p), -100))
    if weight is not None:
        v = v * weight
    return v if reduction == "none" else (v.mean() if reduction == "mean" else v.sum())


def _bce_logits_samples(rng):
    x = _arr(rng, 3, 4) * 2
    t = rng.uniform(0, 1, (3, 4))
    w = rng.uniform(0.5, 2.0, 4)
    pw = rng.uniform(0.5, 3.0, 4)
    return [Sample((x, t), note="mean"),
            Sample((x, t, w, pw), {"reduction": "sum"}, "weight-pos_weight-sum"),
            Sample((x, t, None, pw), {"reduction": "none"}, "pos_weight-none"),
            Sample((x * 500, t), note="magnitude-1e3")]


def _bce_logits_ref(x, t, weight=None, pos_weight=None, reduction="mean"):
    log_p = -np.logaddexp(0, -x)  # log(sigmoid(x))
    log_q = -np.logaddexp(0, x)  # log(1 - sigmoid(x))
    pw = 1.0 if pos_weight is None else pos_weight
    v = -(pw * t * log_p + (1 - t) * log_q)
    if weight is not None:
        v = v * weight
    return v if reduction == "none" else (v.mean() if reduction == "mean" else v.sum())


def _layer_norm_samples(rng):
    x = _arr(rng, 3, 4)
    x3 = _arr(rng, 2, 3, 4)
    return [Sample((x, (4,)), note="plain"),
            Sample((x, (4,), _arr(rng, 4), _arr(rng, 4)), note="affine"),
            Sample((x3, (3, 4), _arr(rng, 3, 4)), {"eps": 1e-3}, "2dims-weight"),
            Sample((x3, 4, None, _arr(rng, 4)), note="bias-only")]


def _layer_norm_ref(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    k = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    out = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + eps)
    if weight is not None:
        out = out * weight
    return out + bias if bias is not None else out


def _dropout_samples(rng):
    return [Sample((_arr(rng, 4, 5), 0.3), {"seed": 7}, "p0.3"),
            Sample((_arr(rng, 3, 2),), {"seed": 3}, "default-p"),
            Sample((_arr(rng, 3), 1.0), {"seed": 1}, "p1")]


def _dropout_ref(x, p=0.5, seed=None):
    u = np.random.default_rng(seed).random(x.size).reshape(x.shape)
    return np.where(u >= p, x / (1 - p) if p < 1 else 0.0, 0.0)


def _embedding_samples(rng):
    w = _arr(rng, 5, 3)
    return [Sample((np.array([[0, 2], [4, 2]]), w), note="repeat", diff=(1,)),
            Sample((np.array(3), w), note="0d-index", diff=(1,)),
            Sample((np.array([1, 1, 0]), w, 4), note="padding-unused", diff=(1,))]


def _embedding_backward_samples(rng):
    idx = np.array([[0, 2], [4, 2]])
    return [Sample((_arr(rng, 2, 2, 3), idx, 5), note="plain", diff=(0,)),
            Sample((_arr(rng, 2, 2, 3), idx, 5, 2), note="padding", diff=(0,))]


def _embedding_backward_ref(g, idx, num_weights, padding_idx=None):
    out = np.zeros((num_weights, g.shape[-1]))
    np.add.at(out, idx.reshape(-1), g.reshape(-1, g.shape[-1]))
    if padding_idx is not None:
        out[padding_idx] = 0
    return out


def _linear_samples(rng):
    return [Sample((_arr(rng, 3, 4), _arr(rng, 2, 4), _arr(rng, 2)), note="bias"),
            Sample((_arr(rng, 2, 3, 4), _arr(rng, 5, 4)), note="batched-no-bias"),
            Sample((_arr(rng, 4), _arr(rng, 2, 4), _arr(rng, 2)), note="1d")]


def _linear_ref(x, w, b=None):
    out = x @ w.T
    return out + b if b is not None else out


RECORDS = [
    OpRecord("prod", _prod_samples,
             ref=lambda x, dim=None, keepdim=False: np.prod(x, axis=_axis(dim), keepdims=keepdim)),
    OpRecord("max", _extreme_samples, ref=np.max),
    OpRecord("min", _extreme_samples, ref=np.min),
    OpRecord("max_dim", _dim_value_samples, ref=_extreme_dim_ref(np.max, np.argmax)),
    OpRecord("min_dim", _dim_value_samples, ref=_extreme_dim_ref(np.min, np.argmin)),
    OpRecord("amax", _dim_samples,
             ref=lambda x, dim=None, keepdim=False: np.amax(x, _axis(dim), keepdims=keepdim)),
    OpRecord("amin", _dim_samples,
             ref=lambda x, dim=None, keepdim=False: np.amin(x, _axis(dim), keepdims=keepdim)),
    OpRecord("argmax", lambda rng: _dim_samples(rng, tuples=False), ref=_argmax_ref(np.argmax),
             grad=False),
    OpRecord("argmin", lambda rng: _dim_samples(rng, tuples=False), ref=_argmax_ref(np.argmin),
             grad=False),
    OpRecord("var", _var_samples, ref=_var_ref(np.var)),
    OpRecord("std", _var_samples, ref=_var_ref(np.std)),
    OpRecord("logsumexp", _logsumexp_samples,
             ref=lambda x, dim=None, keepdim=False: sp.logsumexp(x, _axis(dim), keepdims=keepdim)),
    OpRecord("norm", _norm_samples, ref=_norm_ref),
    OpRecord("cumsum", _scan_dim_samples, ref=_cum_ref(np.cumsum)),
    OpRecord("cumprod", lambda rng: _scan_dim_samples(rng, zeros=True), ref=_cum_ref(np.cumprod)),
    OpRecord("scan", _scan_samples, ref=_scan_ref),
    OpRecord("shift_along", _shift_samples, ref=_shift_ref),
    OpRecord("sort", _sort_samples, ref=_sort_ref),
    OpRecord("topk", _topk_samples, ref=_topk_ref),
    OpRecord("softmax", _softmax_samples, ref=lambda x, dim: sp.softmax(x, axis=dim)),
    OpRecord("log_softmax", _softmax_samples, ref=lambda x, dim: sp.log_softmax(x, axis=dim)),
    OpRecord("leaky_relu", _activation("leaky_relu", negative_slope=0.2),
             ref=lambda x, negative_slope=0.01: np.where(x > 0, x, negative_slope * x)),
    OpRecord("elu", _activation("elu", alpha=1.5),
             ref=lambda x, alpha=1.0: np.where(x > 0, x, alpha * np.expm1(x))),
    OpRecord("gelu", _gelu_samples, ref=_gelu_ref, ref_rtol=1e-9),
    OpRecord("silu", _activation("silu"), ref=lambda x: x * sp.expit(x)),
    OpRecord("nll_loss", _nll_samples, ref=_nll_ref),
    OpRecord("nll_loss_backward", _nll_backward_samples, ref=_nll_backward_ref),
    OpRecord("cross_entropy", _cross_entropy_samples, ref=_cross_entropy_ref, ref_rtol=1e-9),
    OpRecord("one_hot", lambda rng: [Sample((np.array([[0, 2], [3, 1]]),), note="infer"),
                                     Sample((np.array([1, 0]), 4), note="classes")],
             ref=lambda x, num_classes=-1: np.eye(max(num_classes, x.max() + 1),
                                                  dtype=np.int64)[x], grad=False),
    OpRecord("mse_loss", _pair_samples, ref=_pair_ref(np.square)),
    OpRecord("l1_loss", _pair_samples, ref=_pair_ref(np.abs)),
    OpRecord("binary_cross_entropy", _bce_samples, ref=_bce_ref),
    OpRecord("binary_cross_entropy_with_logits", _bce_logits_samples, ref=_bce_logits_ref,
             ref_rtol=1e-9),
    OpRecord("layer_norm", _layer_norm_samples, ref=_layer_norm_ref, ref_rtol=1e-9),
    OpRecord("dropout", _dropout_samples, ref=_dropout_ref, jit=False),
    OpRecord("embedding", _embedding_samples,
             ref=lambda idx, w, padding_idx=None: w[idx]),
    OpRecord("embedding_backward", _embedding_backward_samples, ref=_embedding_backward_ref),
    OpRecord("linear", _linear_samples, ref=_linear_ref),
]
