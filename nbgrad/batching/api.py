"""``nbgrad.vmap``: JAX's ``vmap`` (and ``torch.func.vmap``) on nbgrad's tracer.

A call moves each mapped argument's batch axis to the front, traces ``f`` once at the
per-example (logical) shapes with the jit tracer (on the first example's values, so
argument checks see logical shapes and a value-dependent Python branch raises
``TracerError`` as under ``nbgrad.jit``), then runs the graph on the whole batch, every
node through the batching rule of its op kind (:mod:`nbgrad.batching.interpret`). Those
rules call public ops: autograd records them (``grad`` of a ``vmap`` works), an enclosing
``nbgrad.jit`` records them as one graph (no Python loop over the batch), and an
enclosing ``vmap`` traces them (``vmap`` of ``vmap``). Values that do not depend on a
mapped argument are broadcast over the batch in the outputs, as in JAX.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import pytree
from ..grad_mode import STATE
from ..jit.trace.passes import dce
from ..jit.trace.tracer import Tracer
from ..ops import movedim
from ..tensor import STATE_TRACE, Tensor
from .core import Value, broadcast_batch
from .interpret import run_batched

__all__ = ["vmap"]

Axes = Any  # an int, None, or a (prefix) pytree of them


def _check_axes(axes: Axes, what: str) -> None:
    leaves, _ = pytree.flatten(axes)
    for a in leaves:
        if not (isinstance(a, (int, np.integer)) and not isinstance(a, bool)):
            raise TypeError(f"vmap {what} must be an int, None, or a (nested) tuple/list/dict "
                            f"of them, got {a!r} in {axes!r}")


def _leaf_axes(axes: Axes, tree: Any, what: str) -> list:
    """One axis per leaf of ``tree``, ``axes`` being a tree prefix of it (JAX's rule)."""
    if axes is None or isinstance(axes, (int, np.integer)):
        return [axes] * len(pytree.flatten(tree)[0])
    if isinstance(axes, (tuple, list)) and isinstance(tree, (tuple, list)) and \
            len(axes) == len(tree):
        return [a for sub, t in zip(axes, tree, strict=True) for a in _leaf_axes(sub, t, what)]
    if isinstance(axes, dict) and isinstance(tree, dict) and set(axes) == set(tree):
        return [a for k in tree for a in _leaf_axes(axes[k], tree[k], what)]
    _, spec = pytree.flatten(tree)
    raise ValueError(f"vmap {what} specification must be a tree prefix of the corresponding "
                     f"value, got specification {axes!r} for value tree "
                     f"{pytree.describe(spec)}")


def _as_tensor(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return Tensor(x)
    return x


def _describe(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"{x.dtype}{list(x.shape)}"
    return type(x).__name__


def _batch_size(leaves: list, axes: list, names: list[str], axis_size: int | None) -> int:
    found = []
    for x, a, name in zip(leaves, axes, names, strict=True):
        if a is None:
            continue
        if not isinstance(x, Tensor):
            raise ValueError(f"vmap was requested to map {name} along axis {a}, but it is a "
                             f"{type(x).__name__}, not a tensor (give it in_axes None)")
        if not -x.ndim <= a < x.ndim or x.ndim == 0:
            raise ValueError(f"vmap was requested to map {name} along axis {a}, which implies "
                             f"that its rank should be at least {a + 1 if a >= 0 else -a}, but "
                             f"is only {x.ndim} (its shape is {tuple(x.shape)})")
        found.append((x.shape[a % x.ndim], a, name, x))
    sizes = {s for s, _, _, _ in found}
    if axis_size is not None:
        sizes.add(int(axis_size))
    if not found and axis_size is None:
        raise ValueError("vmap must have at least one non-None value in in_axes (or be given "
                         "axis_size)")
    if len(sizes) > 1:
        lines = [f"  * {name} ({_describe(x)}) has size {s} along axis {a}"
                 for s, a, name, x in found]
        if axis_size is not None:
            lines.append(f"  * axis_size is {axis_size}")
        raise ValueError("vmap got inconsistent sizes for array axes to be mapped:\n"
                         + "\n".join(lines))
    return sizes.pop()


def _placeholder(t: Tensor, size: int) -> Tensor:
    """The first example of ``t`` (batch axis first) as a fresh tensor to trace with."""
    data = t._data
    example = np.array(data[0], copy=True) if size else np.zeros(data.shape[1:], data.dtype)
    ph = Tensor._make(example)
    if STATE.grad_enabled and t._requires_grad and example.dtype.kind == "f":
        ph.requires_grad_(True)  # so the trace marks where f cuts gradients (detach)
    return ph


def _trace(f: Callable, leaves: list, axes: list, args_spec, size: int):
    """Trace ``f`` at the logical shapes; returns (graph, inputs, output spec)."""
    tracer = Tracer(parent=STATE_TRACE.tracer)
    trace_leaves: list = []
    given: dict[int, Value] = {}
    for x, a in zip(leaves, axes, strict=True):
        if isinstance(x, Tensor):
            t = _placeholder(x, size) if a is not None else x
            v = tracer.add_input(t)
            given[id(v)] = (x, a is not None)
            trace_leaves.append(t)
        else:
            trace_leaves.append(x)
    args, kwargs = pytree.unflatten(args_spec, trace_leaves)
    result = _run(tracer, f, args, kwargs)
    out_leaves, out_spec = pytree.flatten(result)
    with tracer:
        outs = []
        for o in out_leaves:
            if not isinstance(o, Tensor):
                if isinstance(o, (bool, int, float, np.ndarray, np.generic)):
                    o = Tensor(np.asarray(o))
                else:
                    raise TypeError(f"vmap: the function returned a {type(o).__name__}; "
                                    "outputs must be tensors (or numbers), in tuples, lists "
                                    "and dicts")
            outs.append(tracer.use(o))
    graph = tracer.graph
    graph.outputs = outs
    for t, v in tracer.implicit:
        given[id(v)] = (t, False)
    for _, inner, t in tracer.captures:
        given[id(inner)] = (t, False)
    inputs = [given[id(v)] for v in graph.inputs]
    return dce(graph), inputs, out_spec


def _run(tracer: Tracer, f: Callable, args: tuple, kwargs: dict) -> Any:
    with tracer, np.errstate(all="ignore"):  # the batch run warns where it must
        return f(*args, **kwargs)


def vmap(f: Callable, in_axes: Axes = 0, out_axes: Axes = 0,
         axis_size: int | None = None) -> Callable:
    """Vectorise ``f`` over an axis of its arguments, as ``jax.vmap``.

    ``in_axes``: an int (the axis mapped in every argument), None (not mapped), or a
    tuple with one entry per positional argument, each an int, None or a pytree prefix
    of that argument; negative axes count from the end. Tensors in keyword arguments
    are mapped over axis 0 (as JAX), other keyword values are passed unchanged.
    ``out_axes``: where the batch axis goes in each output (an int or a prefix pytree of
    the output; None for an output that must not depend on the batch).
    ``axis_size``: the batch size when no argument is mapped. Composes with ``grad``,
    ``jacobian``, ``hessian``, ``nbgrad.jit`` and itself; an op without a batching rule
    raises :class:`NotImplementedError` (``nbgrad.batching.BatchingError``) naming it.
    """
    if not callable(f):
        raise TypeError(f"vmap: expected a function, got {type(f).__name__}")
    _check_axes(in_axes, "in_axes")
    _check_axes(out_axes, "out_axes")
    if isinstance(in_axes, dict):
        raise TypeError("vmap in_axes must be an int, None, or a tuple of entries "
                        "corresponding to the positional arguments passed to the function, "
                        f"got {in_axes!r}")

    @functools.wraps(f)
    def vmapped(*args, **kwargs):
        if isinstance(in_axes, (tuple, list)):
            if len(in_axes) != len(args):
                raise ValueError(f"vmap in_axes must be an int, None, or a tuple of entries "
                                 f"corresponding to the positional arguments passed to the "
                                 f"function, but got len(in_axes)={len(in_axes)}, "
                                 f"len(args)={len(args)}")
            axes = _leaf_axes(tuple(in_axes), args, "in_axes")
        else:
            axes = _leaf_axes(in_axes, args, "in_axes")
        axes += [0 if isinstance(x, (Tensor, np.ndarray)) else None
                 for x in pytree.flatten(kwargs)[0]]
        leaves, spec = pytree.flatten((args, kwargs))
        leaves = [_as_tensor(x) for x in leaves]
        names = _leaf_names(args, kwargs)
        size = _batch_size(leaves, axes, names, axis_size)
        moved = [x if a is None or a % x.ndim == 0 else movedim(x, a % x.ndim, 0)
                 for x, a in zip(leaves, axes, strict=True)]
        graph, inputs, out_spec = _trace(f, moved, axes, spec, size)
        results = run_batched(graph, inputs, size)
        out_struct = pytree.unflatten(out_spec, list(range(len(results))))
        o_axes = _leaf_axes(out_axes, out_struct, "out_axes")
        return pytree.unflatten(out_spec, [_place(t, b, a, size, k) for k, ((t, b), a)
                                           in enumerate(zip(results, o_axes, strict=True))])

    return vmapped


def _leaf_names(args: tuple, kwargs: dict) -> list[str]:
    names = []
    for i, a in enumerate(args):
        n = len(pytree.flatten(a)[0])
        names += [f"argument {i}" if n == 1 else f"argument {i} (leaf {j})" for j in range(n)]
    for k, v in kwargs.items():
        names += [f"keyword argument {k!r}"] * len(pytree.flatten(v)[0])
    return names


def _place(t: Tensor, batched: bool, axis: int | None, size: int, k: int) -> Tensor:
    if axis is None:
        if batched:
            raise ValueError(f"vmap has mapped output (output {k}) but out_axes is None; "
                             "only an output that does not depend on the mapped inputs can "
                             "have out_axes None")
        return t
    if not batched:
        t = broadcast_batch(t, size)
    nd = t.ndim
    if not -nd <= axis < nd:
        raise ValueError(f"vmap out_axes {axis} is out of range for output {k} of rank "
                         f"{nd - 1} (the batch axis makes it {nd})")
    axis %= nd
    return t if axis == 0 else movedim(t, 0, axis)
