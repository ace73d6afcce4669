"""``scaled_dot_product_attention`` of ``torch.nn.functional``, written over table ops
(matmul, softmax, where), so it differentiates to any order and lowers natively."""

from __future__ import annotations

import math

import numpy as np

from ..tensor import Tensor
from .dispatch import as_tensor
from .elementwise import where
from .linalg import matmul
from .nn import dropout, softmax
from .shape import transpose

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 *, seed: int | None = None) -> Tensor:
    """``softmax(query @ key.T * scale + mask) @ value`` over the last two dimensions.

    ``scale`` defaults to ``1 / sqrt(E)`` for query features ``E``. ``attn_mask`` is a
    boolean mask (True: attend) or a float bias, broadcast to ``(..., L, S)``;
    ``is_causal`` masks the upper triangle. A row that attends to nothing gives NaN, as
    PyTorch. ``dropout_p`` drops attention weights (``seed`` as :func:`dropout`).
    """
    q, k, v = as_tensor(query), as_tensor(key), as_tensor(value)
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.ndim < 2 or t.dtype.kind != "f":
            raise ValueError(f"scaled_dot_product_attention: {name} must be a floating "
                             f"tensor of at least 2 dimensions, got {t.dtype} of shape "
                             f"{tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError("scaled_dot_product_attention: shapes do not fit: query "
                         f"{tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)} "
                         "(need query (..., L, E), key (..., S, E), value (..., S, Ev))")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal, "
                         "not both")
    factor = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = matmul(q, transpose(k, -2, -1)) * factor
    L, S = q.shape[-2], k.shape[-2]
    if is_causal:
        attn_mask = np.tril(np.ones((L, S), dtype=bool))
    if attn_mask is not None:
        mask = as_tensor(attn_mask)
        if mask.dtype == np.bool_:
            scores = where(mask, scores, -math.inf)
        else:
            scores = scores + mask
    weights = softmax(scores, -1)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p, True, seed=seed)
    return matmul(weights, v)
