"""Batching rules of ``Opaque`` ops, by family (:data:`FAMILIES`).

Opaque ops say nothing else executors can use, so each one that ``vmap`` supports
declares a rule family where it registers (``@kernel(..., batch=batching(...))``,
:class:`~nbgrad.ops.traits.Batching`). The families: ops along a ``dim`` attribute (the dim
shifted by one), ops over trailing dimensions that take any leading batch dimensions
(linear algebra), broadcasting ops with an optional loss ``reduction``, and
convolutions (the batch merged into the images, or into the channel groups when the
weights are batched), and rules of one op each. An Opaque op that declares none raises a
``BatchingError`` naming it.
"""

from __future__ import annotations

import string
from collections.abc import Callable

import numpy as np

from ..ops import (
    add,
    amax,
    amin,
    broadcast_to,
    diagonal,
    diagonal_backward,
    div,
    gather,
    gather_backward,
    index,
    index_select,
    layer_norm,
    lt,
    maximum,
    mean,
    minimum,
    mul,
    ne,
    permute,
    reshape,
    scatter,
    to_dtype,
    where,
)
from ..ops import sum as sum_
from ..ops.indexing import Index
from ..ops.traits import Batching
from ..tensor import Tensor
from .core import Call
from .rules import norm_dim

Rule = Callable[[Call], list[Tensor]]


# ------------------------------------------------------------------ along a dim
def _shift(dim, rank: int):
    if dim is None:
        return None
    if isinstance(dim, (tuple, list)):
        return tuple(norm_dim(int(d), rank) for d in dim)
    return norm_dim(int(dim), rank)


def along(attr: str = "dim", sizes: str | None = None, together: bool = False) -> Rule:
    """Ops along ``attrs[attr]`` (an int, a tuple, or None for every dim). ``together``:
    every tensor input has the first one's rank (they are all broadcast to the batch);
    ``sizes``: an attribute holding the logical output shape."""
    def rule(call: Call) -> list[Tensor]:
        rank = len(call.in_shapes[0])
        dim = call.attrs[attr]
        if together:
            top = max(len(s) for s, v in zip(call.in_shapes, call.values, strict=True)
                      if v is not None)
            vals = [None if v is None else call.lifted(i, top) for i, v in enumerate(call.values)]
        else:
            vals = list(call.values)
            if any(call.batched[1:]):
                raise call.fail("only its first tensor argument may be batched")
        flat = dim is None or (rank == 0 and dim != ())
        if flat:  # every element: the input flattened
            vals[0] = reshape(vals[0], (call.size, -1))
            if together:
                vals = [None if v is None else reshape(v, (call.size, -1)) for v in vals]
            new = (1,) if isinstance(dim, (tuple, list)) else 1
        else:
            new = _shift(dim, rank)
        extra = {attr: new}
        if sizes is not None:  # the logical output shape, flattened as the input was
            logical = tuple(call.attrs[sizes])
            extra[sizes] = (call.size, int(np.prod(logical))) if flat else \
                (call.size,) + logical
        return call.finish(call.run(vals, **extra))
    return rule


def _reduce_all(fn) -> Rule:
    def rule(call: Call) -> list[Tensor]:
        flat = reshape(call.values[0], (call.size, -1))
        return [fn(flat, (1,), False)]
    return rule


def _trace(call: Call) -> list[Tensor]:
    return [sum_(diagonal(call.values[0], 0, 1, 2), -1)]


def _diag(call: Call) -> list[Tensor]:
    k = call.attrs["diagonal"]
    if len(call.in_shapes[0]) == 2:
        return call.finish([diagonal(call.values[0], k, 1, 2)])
    sizes = (call.size,) + tuple(call.out_shapes[0])  # a vector on the k-th diagonal
    return [diagonal_backward(call.values[0], sizes, k, 1, 2)]


def _diagonal_backward(call: Call) -> list[Tensor]:
    sizes = tuple(call.attrs["input_sizes"])
    return call.run(call.values, input_sizes=(call.size,) + sizes,
                    dim1=norm_dim(call.attrs["dim1"], len(sizes)),
                    dim2=norm_dim(call.attrs["dim2"], len(sizes)))


def _scatter(call: Call) -> list[Tensor]:
    """scatter / scatter_add: a 0-d ``src`` (one value) is broadcast to the index."""
    rank = len(call.in_shapes[0])
    vals = [call.lifted(0, rank), call.lifted(1, rank)]
    vals.append(call.full(2, tuple(call.in_shapes[1])) if not call.in_shapes[2]
                else call.lifted(2, rank))
    return call.finish(call.run(vals, dim=norm_dim(call.attrs["dim"], rank)))


def _index_along(call: Call, dim: int, idx_pos: int) -> tuple[Tensor, int]:
    """A batched 1-D ``index`` argument as a gather index shaped like the output."""
    out = tuple(call.out_shapes[0])
    d = norm_dim(dim, len(out)) - 1
    idx = call.values[idx_pos]
    shape = (call.size,) + (1,) * d + (idx.shape[-1],) + (1,) * (len(out) - d - 1)
    return broadcast_to(reshape(idx, shape), (call.size,) + out), d + 1


def _index_select(call: Call) -> list[Tensor]:
    if not call.batched[1]:
        return along()(call)
    idx, d = _index_along(call, call.attrs["dim"], 1)
    return [gather(call.expanded(0), d, idx)]


def _index_select_backward(call: Call) -> list[Tensor]:
    if not call.batched[1]:
        return along(sizes="sizes")(call)
    sizes = (call.size,) + tuple(call.attrs["sizes"])
    d = norm_dim(call.attrs["dim"], len(sizes) - 1)
    grad = call.expanded(0)
    idx = call.values[1]
    shape = (call.size,) + (1,) * (d - 1) + (idx.shape[-1],) + (1,) * (len(sizes) - d - 1)
    idx = broadcast_to(reshape(idx, shape), tuple(grad.shape))
    return [gather_backward(grad, sizes, d, idx)]


def _flat_index(call: Call, i: int, n: int) -> Tensor:
    """Flat indices ``(B, -1)`` into ``n`` elements, negative ones counted from the end."""
    idx = reshape(call.expanded(i), (call.size, -1))
    return where(lt(idx, 0), add(idx, n), idx)


def _take(call: Call) -> list[Tensor]:
    flat = reshape(call.expanded(0), (call.size, -1))
    n = int(np.prod(call.in_shapes[0]))
    return call.finish([gather(flat, 1, _flat_index(call, 1, n))])


def _take_backward(call: Call) -> list[Tensor]:
    sizes = tuple(call.attrs["sizes"])
    n = 1
    for s in sizes:
        n *= s
    grad = reshape(call.expanded(0), (call.size, -1))
    out = gather_backward(grad, (call.size, n), 1, _flat_index(call, 1, n))
    return call.finish([out])


# ------------------------------------------------------------------ leading batch dims
def leading(*cores: int) -> Rule:
    """Ops over trailing dims (``cores[i]`` of them for tensor input ``i``; none given: a
    single input) taking any leading batch dims: each input is broadcast to the common
    leading shape, so the batch axis lines up in every one."""
    def rule(call: Call) -> list[Tensor]:
        if not cores:
            return call.finish(call.run([call.expanded(0)] + list(call.values[1:])))
        shapes = [tuple(s) for s in call.in_shapes]
        lead = np.broadcast_shapes(*[s[:len(s) - c] for s, c in zip(shapes, cores,
                                                                     strict=False)])
        vals = [call.full(i, lead + s[len(s) - c:]) for i, (s, c) in
                enumerate(zip(shapes, cores, strict=False))]
        return call.finish(call.run(vals))
    return rule


def _solve(call: Call) -> list[Tensor]:
    a, b = tuple(call.in_shapes[0]), tuple(call.in_shapes[1])
    vector = len(b) == 1 or (len(b) == len(a) - 1 and b == a[:-1])
    return leading(2, 1 if vector else 2)(call)


# ------------------------------------------------------------------ broadcasting ops
def broadcasting(first: bool = True) -> Rule:
    """Ops whose tensors broadcast together (``first``: the output has the first one's
    shape, so it is broadcast to the batch; else every tensor is broadcast to the common
    shape, as losses want); a ``reduction`` other than ``'none'`` is done per batch row
    after the op runs with ``'none'``."""
    def rule(call: Call) -> list[Tensor]:
        shapes = [tuple(s) for s, v in zip(call.in_shapes, call.values, strict=True)
                  if v is not None]
        rank = max(len(s) for s in shapes)
        vals = [None if v is None else call.aligned(i, rank) for i, v in enumerate(call.values)]
        if first:
            vals[0] = call.lifted(0, rank)
        else:
            common = np.broadcast_shapes(*shapes)
            vals = [None if v is None else call.full(i, common)
                    for i, v in enumerate(call.values)]
        red = call.attrs.get("reduction")
        if red is None or red == "none":
            return call.run(vals)
        out = call.run(vals, reduction="none")[0]
        dims = tuple(range(1, out.ndim))
        if not dims:
            return [out]
        if red == "sum":
            return [sum_(out, dims)]
        if red == "mean":
            return [mean(out, dims)]
        raise call.fail(f"reduction {red!r}")
    return rule


def _masked_fill(call: Call) -> list[Tensor]:
    if not call.batched[2]:
        return broadcasting()(call)
    rank = len(call.out_shapes[0])
    x = call.lifted(0, rank)
    value = call.aligned(2, rank)
    if value.dtype != x.dtype:
        value = to_dtype(value, x.dtype)
    return [where(call.aligned(1, rank), value, x)]


def _layer_norm(call: Call) -> list[Tensor]:
    x = call.expanded(0)
    ns, eps = call.attrs["normalized_shape"], call.attrs["eps"]
    w, b = call.values[1], call.values[2]
    if not (call.batched[1] or call.batched[2]):
        return [layer_norm(x, ns, w, b, eps)]
    out = layer_norm(x, ns, None, None, eps)
    rank = len(call.out_shapes[0])
    if w is not None:
        out = mul(out, call.aligned(1, rank))
    if b is not None:
        out = add(out, call.aligned(2, rank))
    return [out]


def _one_hot(call: Call) -> list[Tensor]:
    return call.run(call.values, num_classes=int(call.out_shapes[0][-1]))


def _einsum(call: Call) -> list[Tensor]:
    eq = call.attrs["equation"].replace(" ", "")
    if "..." in eq or "->" not in eq:
        raise call.fail(f"equation {eq!r} (write it with explicit output and no '...')")
    letter = next(c for c in string.ascii_letters if c not in eq)
    lhs, rhs = eq.split("->")
    terms = [letter + t if b else t for t, b in zip(lhs.split(","), call.batched, strict=True)]
    return call.run(call.values, equation=",".join(terms) + "->" + letter + rhs)


# ------------------------------------------------------------------ class-index losses
def _rows(call: Call, i: int, has_n: bool) -> Tensor:
    """Input ``i`` with the batch merged into its first (N) dim (or made N when absent)."""
    t = call.expanded(i)
    if not has_n:
        return t
    shape = tuple(call.in_shapes[i])
    return reshape(t, (call.size * shape[0],) + shape[1:])


def _denominator(call: Call, target: Tensor, dtype) -> Tensor:
    """Per batch row: the weight (or count) of the targets not ignored ('mean')."""
    if call.values[2] is not None and call.batched[2]:
        raise call.fail("a batched class weight")
    keep = ne(target, call.attrs["ignore_index"])
    if call.values[2] is None:
        w = to_dtype(keep, dtype)
    else:
        safe = reshape(where(keep, target, 0), (-1,))
        w = mul(reshape(index_select(call.values[2], 0, safe), tuple(target.shape)),
                to_dtype(keep, dtype))
    dims = tuple(range(1, w.ndim))
    return sum_(w, dims) if dims else w


def _class_loss(call: Call) -> list[Tensor]:
    """cross_entropy / nll_loss: the batch merged into N, reduced per batch row."""
    if call.values[2] is not None and call.batched[2]:
        raise call.fail("a batched class weight")
    has_n = len(call.in_shapes[0]) > 1
    tshape = tuple(call.in_shapes[1])
    x, t = _rows(call, 0, has_n), _rows(call, 1, has_n)
    out = reshape(call.run([x, t, call.values[2]], reduction="none")[0],
                  (call.size,) + tshape)
    red = call.attrs["reduction"]
    if red == "none":
        return [out]
    total = sum_(out, tuple(range(1, out.ndim))) if out.ndim > 1 else out
    if red == "sum":
        return [total]
    target = reshape(call.expanded(1), (call.size,) + tshape)
    return [div(total, _denominator(call, target, out.dtype))]


def _nll_loss_backward(call: Call) -> list[Tensor]:
    sizes = tuple(call.attrs["sizes"])
    has_n = len(sizes) > 1
    tshape = tuple(call.in_shapes[1])
    red = call.attrs["reduction"]
    g = call.expanded(0)
    if red != "none":
        g = reshape(g, (call.size,) + (1,) * len(tshape))
        if red == "mean":
            target = reshape(call.expanded(1), (call.size,) + tshape)
            den = _denominator(call, target, g.dtype)
            g = div(g, reshape(den, tuple(g.shape)))
        g = broadcast_to(g, (call.size,) + tshape)
    if has_n:
        g = reshape(g, (call.size * tshape[0],) + tshape[1:])
    new = (call.size * sizes[0],) + sizes[1:] if has_n else (call.size,) + sizes
    out = call.run([g, _rows(call, 1, has_n), call.values[2]], reduction="none", sizes=new)
    return call.finish(out)


def _offset_rows(call: Call, i: int, rows: int) -> Tensor:
    """Integer indices ``(B, ...)`` into row block ``b`` of ``B`` stacked tables."""
    idx = call.expanded(i)
    shift = Tensor._make(np.arange(call.size, dtype=idx.dtype).reshape(
        (call.size,) + (1,) * (idx.ndim - 1)) * rows)
    return add(idx, shift)


def _embedding(call: Call) -> list[Tensor]:
    if not call.batched[1]:
        return call.run([call.expanded(0), call.values[1]])
    if call.attrs["padding_idx"] is not None:
        raise call.fail("batched weights with a padding_idx")
    v, d = call.in_shapes[1]
    table = reshape(call.values[1], (call.size * v, d))
    return call.run([_offset_rows(call, 0, v), table])


def _embedding_backward(call: Call) -> list[Tensor]:
    v = call.attrs["num_weights"]
    g, pad = call.expanded(0), call.attrs["padding_idx"]
    if pad is not None:
        keep = ne(call.expanded(1), pad)
        g = where(reshape(keep, tuple(keep.shape) + (1,)), g, 0.0)
    out = call.run([g, _offset_rows(call, 1, v)], num_weights=call.size * v, padding_idx=None)
    return call.finish(out)


# ------------------------------------------------------------------ dynamic windows
def _window(call: Call, pos: int, shape: tuple, sizes: tuple) -> Tensor:
    """Flat positions ``(B, prod(sizes))`` of each example's window (jax.lax's clamping)."""
    starts = call.expanded(pos)  # (B, ndim)
    b, nd = call.size, len(shape)
    total = None
    stride = 1
    for d in reversed(range(nd)):
        s = index(starts, Index((slice(None), d)))
        s = where(lt(s, 0), add(s, shape[d]), s)
        s = minimum(maximum(s, 0), shape[d] - sizes[d])
        steps = np.arange(sizes[d], dtype=np.int64).reshape((1,) * (d + 1) + (sizes[d],) +
                                                            (1,) * (nd - d - 1))
        at = mul(add(reshape(s, (b,) + (1,) * nd), Tensor._make(steps)), stride)
        total = at if total is None else add(total, at)
        stride *= shape[d]
    return reshape(broadcast_to(total, (b,) + sizes), (b, -1))


def _dynamic_slice(call: Call) -> list[Tensor]:
    shape, sizes = tuple(call.in_shapes[0]), tuple(call.attrs["sizes"])
    if not shape:  # the window of a 0-d tensor is the tensor
        return [call.expanded(0)]
    flat = reshape(call.expanded(0), (call.size, -1))
    return call.finish([gather(flat, 1, _window(call, 1, shape, sizes))])


def _dynamic_slice_backward(call: Call) -> list[Tensor]:
    sizes, shape = tuple(call.attrs["sizes"]), tuple(call.in_shapes[0])
    if not sizes:
        return [call.expanded(0)]
    n = int(np.prod(sizes))
    grad = reshape(call.expanded(0), (call.size, -1))
    out = gather_backward(grad, (call.size, n), 1, _window(call, 1, sizes, shape))
    return call.finish([out])


def _dynamic_update_slice(call: Call) -> list[Tensor]:
    shape, upd = tuple(call.in_shapes[0]), tuple(call.in_shapes[1])
    if not shape:
        out = call.expanded(1)
        return [out if out.dtype == call.values[0].dtype else to_dtype(out, call.values[0].dtype)]
    flat = reshape(call.expanded(0), (call.size, -1))
    src = reshape(call.expanded(1), (call.size, -1))
    if src.dtype != flat.dtype:
        src = to_dtype(src, flat.dtype)
    return call.finish([scatter(flat, 1, _window(call, 2, shape, upd), src)])


# ------------------------------------------------------------------ images
def _merge(call: Call, i: int) -> Tensor:
    """Input ``i`` (logical ``(N, ...)``, batched) with the batch merged into N."""
    shape = tuple(call.in_shapes[i])
    return reshape(call.values[i], (call.size * shape[0],) + shape[1:])


def images(size_attr: str | None = None) -> Rule:
    """Pooling-like ops of a batched image stack (the batch joins the images)."""
    def rule(call: Call) -> list[Tensor]:
        if any(call.batched[1:]):
            raise call.fail("only its first tensor argument may be batched")
        vals = list(call.values)
        vals[0] = _merge(call, 0)
        extra = {}
        if size_attr is not None:
            s = tuple(call.attrs[size_attr])
            extra[size_attr] = (call.size * s[0],) + s[1:]
        return call.finish(call.run(vals, **extra))
    return rule


def _grouped(call: Call, i: int) -> Tensor:
    """Images ``(B, N, C, *S)`` as ``(N, B*C, *S)`` (the batch as channel groups)."""
    n, c, *spatial = call.in_shapes[i]
    x = call.expanded(i)
    x = permute(x, (1, 0) + tuple(range(2, x.ndim)))
    return reshape(x, (n, call.size * c, *spatial))


def _stacked(call: Call, i: int) -> Tensor | None:
    """Weights (or a bias) ``(B, O, ...)`` as ``(B*O, ...)``."""
    if call.values[i] is None:
        return None
    shape = tuple(call.in_shapes[i])
    return reshape(call.expanded(i), (call.size * shape[0],) + shape[1:])


def _ungroup(call: Call, out: Tensor) -> list[Tensor]:
    n, c, *spatial = call.out_shapes[0]
    out = reshape(out, (n, call.size, c, *spatial))
    return [permute(out, (1, 0) + tuple(range(2, out.ndim)))]


def _conv(call: Call) -> list[Tensor]:
    if not any(call.batched[1:]):
        return images()(call)
    groups = call.attrs["groups"] * call.size
    out = call.run([_grouped(call, 0), _stacked(call, 1), _stacked(call, 2)], groups=groups)
    return _ungroup(call, out[0])


def _conv2d_input_backward(call: Call) -> list[Tensor]:
    if not call.batched[1]:
        return images("input_size")(call)
    n, c, h, w = call.attrs["input_size"]
    out = call.run([_grouped(call, 0), _stacked(call, 1)], input_size=(n, call.size * c, h, w),
                   groups=call.attrs["groups"] * call.size)
    return _ungroup(call, out[0])


def _conv2d_weight_backward(call: Call) -> list[Tensor]:
    size = tuple(call.attrs["weight_size"])
    out = call.run([_grouped(call, 0), _grouped(call, 1)],
                   weight_size=(call.size * size[0],) + size[1:],
                   groups=call.attrs["groups"] * call.size)
    return call.finish(out)


def _own(rule: Rule) -> Callable[[], Rule]:
    """The family of one rule written for one op."""
    return lambda: rule


def _reduce_extreme(which: str) -> Rule:
    return _reduce_all(amax if which == "max" else amin)


#: family name -> rule factory: an Opaque op names its family (and the family's
#: arguments) where it registers, ``@kernel(..., batch=batching("along"))``
FAMILIES: dict[str, Callable[..., Rule]] = {
    "along": along,
    "leading": leading,
    "broadcasting": broadcasting,
    "images": images,
    "reduce_all": _reduce_extreme,
    "scatter": _own(_scatter),
    "index_select": _own(_index_select),
    "index_select_backward": _own(_index_select_backward),
    "take": _own(_take),
    "take_backward": _own(_take_backward),
    "trace": _own(_trace),
    "diag": _own(_diag),
    "diagonal_backward": _own(_diagonal_backward),
    "solve": _own(_solve),
    "masked_fill": _own(_masked_fill),
    "layer_norm": _own(_layer_norm),
    "class_loss": _own(_class_loss),
    "nll_loss_backward": _own(_nll_loss_backward),
    "dynamic_slice": _own(_dynamic_slice),
    "dynamic_slice_backward": _own(_dynamic_slice_backward),
    "dynamic_update_slice": _own(_dynamic_update_slice),
    "embedding": _own(_embedding),
    "embedding_backward": _own(_embedding_backward),
    "one_hot": _own(_one_hot),
    "einsum": _own(_einsum),
    "conv": _own(_conv),
    "conv2d_input_backward": _own(_conv2d_input_backward),
    "conv2d_weight_backward": _own(_conv2d_weight_backward),
}

_RULES: dict[Batching, Rule] = {}


def rule_for(batch: Batching | None) -> Rule | None:
    """The batching rule an Opaque op declares (None when it declares none)."""
    if batch is None:
        return None
    rule = _RULES.get(batch)
    if rule is None:
        family = FAMILIES.get(batch.family)
        if family is None:
            raise KeyError(f"batching family {batch.family!r} is not one of "
                           f"{sorted(FAMILIES)}")
        rule = _RULES[batch] = family(*batch.args, **dict(batch.options))
    return rule
