"""Margin and embedding losses of ``torch.nn.functional``, written over table ops (as
PyTorch writes them): each differentiates to any order and lowers natively."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .activations import _reduce
from .dispatch import as_tensor, promote_operands
from .elementwise import clamp, softplus, sqrt, where
from .reduction import mean, norm, sum

__all__ = ["cosine_embedding_loss", "hinge_embedding_loss", "margin_ranking_loss",
           "multilabel_soft_margin_loss", "pairwise_distance", "pdist", "soft_margin_loss",
           "triplet_margin_loss"]


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6,
                      keepdim: bool = False) -> Tensor:
    """``||x1 - x2 + eps||_p`` along the last dimension."""
    a, b = promote_operands(x1, x2)
    d = a - b + float(eps)
    return norm(d, float(p), -1 if d.ndim else None, keepdim=keepdim and d.ndim > 0)


def pdist(input: Tensor, p: float = 2.0) -> Tensor:  # noqa: A002
    """The p-norm distances between all pairs of rows ``i < j`` of an (N, M) input, in
    row-major order of the pairs."""
    x = as_tensor(input)
    if x.ndim != 2:
        raise RuntimeError(f"pdist: expects a 2-D input, got shape {tuple(x.shape)}")
    rows, cols = np.triu_indices(x.shape[0], 1)
    a = x.index_select(0, as_tensor(rows.astype(np.int64)))
    b = x.index_select(0, as_tensor(cols.astype(np.int64)))
    return norm(a - b, float(p), -1)


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        reduction: str = "mean") -> Tensor:
    """``max(0, -target * (input1 - input2) + margin)``."""
    loss = clamp(-as_tensor(target) * (as_tensor(input1) - input2) + float(margin), min=0.0)
    return _reduce(loss, reduction, "margin_ranking_loss")


def soft_margin_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:  # noqa: A002
    """``log(1 + exp(-target * input))``, computed as a softplus."""
    return _reduce(softplus(-as_tensor(target) * input), reduction, "soft_margin_loss")


def multilabel_soft_margin_loss(input: Tensor, target: Tensor,  # noqa: A002
                                weight: Tensor | None = None,
                                reduction: str = "mean") -> Tensor:
    """The binary cross-entropy with logits of each class, averaged over the classes."""
    x, y = as_tensor(input), as_tensor(target)
    loss = y * softplus(-x) + (1.0 - y) * softplus(x)
    if weight is not None:
        loss = loss * weight
    return _reduce(mean(loss, -1) if loss.ndim else loss, reduction,
                   "multilabel_soft_margin_loss")


def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0,  # noqa: A002
                         reduction: str = "mean") -> Tensor:
    """``input`` where ``target`` is 1, ``max(0, margin - input)`` where it is -1 (both
    terms elsewhere, as PyTorch)."""
    x, y = as_tensor(input), as_tensor(target)
    loss = where(y != -1, x, 0.0) + where(y != 1, clamp(float(margin) - x, min=0.0), 0.0)
    return _reduce(loss, reduction, "hinge_embedding_loss")


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor,
                          margin: float = 0.0, reduction: str = "mean") -> Tensor:
    """``1 - cos`` where ``target`` is 1, ``max(0, cos - margin)`` where it is -1 (the
    cosine along the last dimension, its squared norms offset by 1e-12 as PyTorch's)."""
    a, b = promote_operands(input1, input2)
    cos = sum(a * b, -1) / sqrt((sum(a * a, -1) + 1e-12) * (sum(b * b, -1) + 1e-12))
    y = as_tensor(target)
    loss = where(y == 1, 1.0 - cos, 0.0) + where(y == -1, clamp(cos - float(margin), min=0.0),
                                                 0.0)
    return _reduce(loss, reduction, "cosine_embedding_loss")


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor,
                        margin: float = 1.0, p: float = 2.0, eps: float = 1e-6,
                        swap: bool = False, reduction: str = "mean") -> Tensor:
    """``max(0, d(anchor, positive) - d(anchor, negative) + margin)`` with the p-norm
    pairwise distance (``swap``: the smaller of the negative's two distances)."""
    d_pos = pairwise_distance(anchor, positive, p, eps)
    d_neg = pairwise_distance(anchor, negative, p, eps)
    if swap:
        d_swap = pairwise_distance(positive, negative, p, eps)
        d_neg = where(d_swap < d_neg, d_swap, d_neg)
    return _reduce(clamp(d_pos - d_neg + float(margin), min=0.0), reduction,
                   "triplet_margin_loss")

