"""JAX-style functional transforms on top of the eager autograd engine.

``grad``, ``value_and_grad``, ``vjp``, ``jvp``, ``jacobian``, ``hessian`` and ``hvp``
take a Python function of tensors and return a new function (or, for ``vjp``, ``jvp``
and ``hvp``, the results directly), following JAX's signatures and output structures.

How they work: each call makes fresh differentiation inputs for the arguments it
differentiates (an alias node joined to the caller's graph when the caller may itself
differentiate the result, a detached leaf otherwise), runs the function under
``enable_grad()``, and asks :func:`nbgrad.autograd.grad` for the gradients.
``create_graph=True`` is used exactly when the result may be differentiated again:
grad mode is on and either the call is nested inside another transform or some
argument of the call requires grad. So ``grad(grad(f))``, ``jacobian(grad(f))``,
``hessian(f)`` and ``vjp(grad(f), x)`` compose, while a top-level call on plain
inputs keeps no graph alive (returned values are detached).

Arguments may be tensors, NumPy arrays or Python floats (converted to tensors; NumPy
arrays keep their floating dtype, Python floats become float64), or nested tuples,
lists and dicts of them (JAX's pytrees, simplified). Differentiating with respect to
an integer or boolean argument is a ``TypeError``, as in JAX.

``jvp`` uses the double-vjp construction: ``u -> J^T u`` is linear in ``u``, so the
vjp of that map with cotangent ``t`` is ``J t``. Its results equal JAX's.

A function that closes over a tensor requiring grad is differentiated only with
respect to its arguments; at top level (no enclosing transform, no argument requiring
grad) the returned values are detached from such closed-over tensors too.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from . import autograd, pytree
from .autograd import forward
from .errors import TracerError
from .grad_mode import enable_grad, is_grad_enabled, no_grad
from .ops import cat, clone, permute, reshape, stack, to_dtype, view
from .tensor import Tensor

__all__ = ["grad", "hessian", "hvp", "jacfwd", "jacobian", "jacrev", "jvp", "value_and_grad",
           "vjp"]


# ------------------------------------------------------------------ nesting state
class _Nesting(threading.local):
    def __init__(self) -> None:
        self.depth = 0


_NESTING = _Nesting()


@contextmanager
def _inside_transform():
    """Run the user's function one transform level deeper, with grad mode on."""
    _NESTING.depth += 1
    try:
        with enable_grad():
            yield
    finally:
        _NESTING.depth -= 1


# ------------------------------------------------------------------ conversions
def _needs_graph(*trees: Any) -> bool:
    """Whether results may be differentiated again, so backward must build a graph."""
    if not is_grad_enabled():
        return False
    if _NESTING.depth > 0:
        return True
    for tree in trees:
        leaves, _ = pytree.flatten(tree)
        if any(isinstance(x, Tensor) and x.requires_grad for x in leaves):
            return True
    return False


def _float_tensor(x: Any, where: str, transform: str) -> Tensor:
    """``x`` as a floating tensor (not yet differentiable); TypeError for other dtypes."""
    if isinstance(x, Tensor):
        t = x
    elif isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{transform}: {where} is a bool; only floating-point inputs can be "
                        "differentiated")
    elif isinstance(x, float):
        t = Tensor(np.asarray(x, dtype=np.float64))
    elif isinstance(x, (np.ndarray, np.generic)):
        t = Tensor(np.asarray(x))
    elif isinstance(x, int):
        raise TypeError(f"{transform}: {where} is the int {x!r}; only floating-point inputs "
                        f"can be differentiated (pass {float(x)!r})")
    else:
        raise TypeError(f"{transform}: {where} is a {type(x).__name__}; expected a tensor, a "
                        "NumPy array or a float")
    if t.dtype.kind != "f":
        raise TypeError(f"{transform}: {where} has dtype {t.dtype}; only floating-point "
                        "(float32, float64) inputs can be differentiated")
    return t


def _diff_input(x: Any, create_graph: bool, where: str, transform: str) -> Tensor:
    """A fresh tensor to differentiate with respect to, standing for ``x``.

    Joined to the caller's graph through an alias node when ``create_graph`` and ``x``
    requires grad (so an enclosing transform sees through it); a detached leaf otherwise.
    """
    t = _float_tensor(x, where, transform)
    if create_graph and t.requires_grad:
        if t._data.flags.c_contiguous:
            return view(t, *t.shape)
        return clone(t)
    return _detach(t).requires_grad_(True)


def _as_output(x: Any, where: str, transform: str) -> Tensor:
    """An output of the user's function as a floating tensor."""
    if isinstance(x, Tensor):
        if x.dtype.kind != "f":
            raise TypeError(f"{transform}: {where} has dtype {x.dtype}; only floating-point "
                            "outputs can be differentiated")
        return x
    if isinstance(x, (float, int, np.floating, np.integer)) and not isinstance(x, bool):
        return Tensor(np.asarray(x, dtype=np.float64))
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return Tensor(x)
    raise TypeError(f"{transform}: {where} is a {type(x).__name__}; the function must return "
                    "tensors (or a tuple (output, aux) with has_aux=True)")


def _like(value: Any, ref: Tensor, where: str, transform: str) -> Tensor:
    """A tangent or cotangent for ``ref``: same shape, ``ref``'s dtype."""
    if isinstance(value, Tensor):
        t = value
    elif isinstance(value, (float, int, np.ndarray, np.generic)) and not isinstance(value,
                                                                                     bool):
        t = Tensor(np.asarray(value, dtype=ref.dtype))
    else:
        raise TypeError(f"{transform}: {where} is a {type(value).__name__}; expected a tensor, "
                        "a NumPy array or a float")
    if tuple(t.shape) != tuple(ref.shape):
        raise ValueError(f"{transform}: {where} has shape {tuple(t.shape)}, but the value it "
                         f"goes with has shape {tuple(ref.shape)}")
    if t.dtype.kind != "f":
        raise TypeError(f"{transform}: {where} has dtype {t.dtype}; expected a floating dtype")
    if t.dtype != ref.dtype:
        t = to_dtype(t, ref.dtype)
    return t


def _zeros(ref: Tensor) -> Tensor:
    return Tensor(np.zeros(ref.shape, dtype=ref.dtype))


def _detach(x: Tensor) -> Tensor:
    """``x`` outside the graph; under forward mode it keeps its tangents (this is the
    transform's bookkeeping, not the user's ``detach``)."""
    out = x.detach()
    if forward.STATE.active:
        forward.transfer_tangent(x, out)
    return out


def _detach_tree(tree: Any) -> Any:
    return pytree.tree_map(lambda x: _detach(x) if isinstance(x, Tensor) else x, tree)


def _finish(tree: Any, create_graph: bool) -> Any:
    """Results as returned to the caller: detached unless they may be differentiated again."""
    return tree if create_graph else _detach_tree(tree)


def _split_aux(result: Any, transform: str) -> tuple[Any, Any]:
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TypeError(f"{transform} with has_aux=True: the function must return a pair "
                        f"(output, aux), got {type(result).__name__}"
                        + (f" of length {len(result)}" if isinstance(result, (tuple, list))
                           else ""))
    return result[0], result[1]


# ------------------------------------------------------------------ argnums
def _norm_argnums(argnums: int | Sequence[int], transform: str) -> tuple[tuple[int, ...], bool]:
    """(positions, single) from an int or a tuple of ints."""
    if isinstance(argnums, (int, np.integer)) and not isinstance(argnums, bool):
        return (int(argnums),), True
    if isinstance(argnums, (tuple, list)) and all(
            isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in argnums):
        if not argnums:
            raise ValueError(f"{transform}: argnums is an empty tuple; give at least one "
                             "argument position")
        return tuple(int(a) for a in argnums), False
    raise TypeError(f"{transform}: argnums must be an int or a tuple of ints, got {argnums!r}")


def _resolve_argnums(argnums: tuple[int, ...], nargs: int, transform: str) -> tuple[int, ...]:
    out = []
    for a in argnums:
        if not -nargs <= a < nargs:
            raise ValueError(f"{transform}: argnums={a} but the function was called with "
                             f"{nargs} positional argument(s)")
        out.append(a % nargs)
    if len(set(out)) != len(out):
        raise ValueError(f"{transform}: argnums {argnums} repeats an argument")
    return tuple(out)


class _DiffArgs:
    """The differentiated positional arguments of one call, flattened into leaves."""

    def __init__(self, args: tuple, positions: tuple[int, ...], create_graph: bool,
                 transform: str) -> None:
        self.args = list(args)
        self.positions = positions
        self.leaves: list[Tensor] = []
        self.specs: list[tuple[tuple, int, int]] = []  # (spec, start, stop) per position
        for p in positions:
            leaves, spec = pytree.flatten(args[p])
            start = len(self.leaves)
            for k, leaf in enumerate(leaves):
                where = f"argument {p}" if spec == ("leaf",) else f"leaf {k} of argument {p}"
                self.leaves.append(_diff_input(leaf, create_graph, where, transform))
            self.specs.append((spec, start, len(self.leaves)))
            self.args[p] = pytree.unflatten(spec, self.leaves[start:])

    def rebuild(self, per_leaf: Sequence, single: bool) -> Any:
        """Per-leaf values regrouped as the differentiated arguments' trees."""
        trees = tuple(pytree.unflatten(spec, per_leaf[start:stop]) for spec, start, stop in
                      self.specs)
        return trees[0] if single else trees


def _grads(outputs: Sequence[Tensor], inputs: Sequence[Tensor], grad_outputs: Sequence | None,
           create_graph: bool, retain_graph: bool) -> list[Tensor]:
    """Gradients of ``outputs`` (those that require grad) w.r.t. ``inputs``; zeros if unused."""
    pairs = [(o, None if grad_outputs is None else grad_outputs[k])
             for k, o in enumerate(outputs) if o.requires_grad]
    if not pairs or not inputs:
        return [_zeros(x) for x in inputs]
    outs = [o for o, _ in pairs]
    gos = None if grad_outputs is None else [g for _, g in pairs]
    found = autograd.grad(outs, list(inputs), gos, retain_graph=retain_graph,
                          create_graph=create_graph, allow_unused=True)
    return [g if g is not None else _zeros(x) for g, x in zip(found, inputs, strict=True)]


def _scalar_output(out: Any, transform: str) -> Tensor:
    t = _as_output(out, "the output", transform)
    if t.ndim != 0:
        raise TypeError(f"{transform}: gradient is only defined for functions with a scalar "
                        f"output (shape ()), but the output has shape {tuple(t.shape)}; use "
                        "jacobian or vjp for non-scalar outputs")
    return t


# ------------------------------------------------------------------ grad, value_and_grad
def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0,
                   has_aux: bool = False) -> Callable:
    """A function returning ``(f(*args), grad)``, or ``((f(*args), aux), grad)`` with has_aux.

    ``f`` must return a scalar (a tensor of shape ``()``). The gradient has the
    structure of argument ``argnums`` (a tuple of them for a tuple ``argnums``).
    """
    positions, single = _norm_argnums(argnums, "value_and_grad")

    @functools.wraps(f)
    def value_and_grad_f(*args, **kwargs):
        where = _resolve_argnums(positions, len(args), "value_and_grad")
        create_graph = _needs_graph(args, kwargs)
        diff = _DiffArgs(args, where, create_graph, "value_and_grad")
        with _inside_transform():
            result = f(*diff.args, **kwargs)
        aux = None
        if has_aux:
            result, aux = _split_aux(result, "value_and_grad")
        out = _scalar_output(result, "value_and_grad")
        grads = _grads([out], diff.leaves, None, create_graph, create_graph)
        value = _finish(out, create_graph)
        grads_tree = diff.rebuild(grads, single)
        if has_aux:
            return (value, _finish(aux, create_graph)), grads_tree
        return value, grads_tree

    return value_and_grad_f


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The gradient of a scalar function ``f``, as a function of ``f``'s arguments.

    ``grad(f)(x)`` has ``x``'s shape; ``argnums`` picks the argument(s) (a tuple gives a
    tuple of gradients); with ``has_aux=True``, ``f`` returns ``(output, aux)`` and the
    new function returns ``(grad, aux)``. Unlike :func:`nbgrad.autograd.grad` this is a
    transform: it composes (``grad(grad(f))``) and never touches ``.grad``.
    """
    vg = value_and_grad(f, argnums, has_aux)

    @functools.wraps(f)
    def grad_f(*args, **kwargs):
        value, g = vg(*args, **kwargs)
        if has_aux:
            return g, value[1]
        return g

    return grad_f


# ------------------------------------------------------------------ vjp, jvp
def vjp(f: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """``(f(*primals), vjp_fn)`` (and ``aux`` last with has_aux).

    ``vjp_fn(cotangent)``, with ``cotangent`` shaped like the output, returns a tuple
    with one cotangent per primal; it may be called many times.
    """
    create_graph = _needs_graph(primals)
    diff = _DiffArgs(primals, tuple(range(len(primals))), create_graph, "vjp")
    with _inside_transform():
        result = f(*diff.args)
    aux = None
    if has_aux:
        result, aux = _split_aux(result, "vjp")
    out_leaves, out_spec = pytree.flatten(result)
    outs = [_as_output(o, "an output" if out_spec != ("leaf",) else "the output", "vjp")
            for o in out_leaves]
    result = pytree.unflatten(out_spec, outs)

    def vjp_fn(cotangent: Any) -> tuple:
        ct_leaves, ct_spec = pytree.flatten(cotangent)
        if len(ct_leaves) != len(outs) or (ct_spec != out_spec and not
                                          _same_structure(ct_spec, out_spec)):
            raise ValueError(f"vjp_fn: the cotangent has structure {pytree.describe(ct_spec)}, "
                             f"but the output has structure {pytree.describe(out_spec)}")
        cts = [_like(c, o, f"cotangent {k}", "vjp_fn")
               for k, (c, o) in enumerate(zip(ct_leaves, outs, strict=True))]
        graph = create_graph or _needs_graph(cts)
        with enable_grad() if graph else _null():
            grads = _grads(outs, diff.leaves, cts, graph, True)
        return diff.rebuild(_finish(grads, graph), False)

    value = _finish(result, create_graph)
    if has_aux:
        return value, vjp_fn, _finish(aux, create_graph)
    return value, vjp_fn


@contextmanager
def _null():
    yield


def _same_structure(a: tuple, b: tuple) -> bool:
    """Equal structure, treating tuples and lists alike (JAX is stricter; we are lenient)."""
    ka = "seq" if a[0] in ("tuple", "list", "namedtuple") else a[0]
    kb = "seq" if b[0] in ("tuple", "list", "namedtuple") else b[0]
    if ka != kb:
        return False
    if ka == "seq":
        return len(a[-1]) == len(b[-1]) and all(
            _same_structure(x, y) for x, y in zip(a[-1], b[-1], strict=True))
    if ka == "dict":
        return a[1] == b[1] and all(_same_structure(x, y) for x, y in
                                    zip(a[2], b[2], strict=True))
    return True


def _check_sequence(value: Any, name: str, transform: str) -> tuple:
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{transform}: {name} must be a tuple or a list (one entry per "
                        f"argument of the function), got {type(value).__name__}")
    return tuple(value)


def _primal_pairs(primals: Sequence, tangents: Sequence, transform: str):
    """The flattened primals and their tangents, checked against each other."""
    primals = _check_sequence(primals, "primals", transform)
    tangents = _check_sequence(tangents, "tangents", transform)
    if len(primals) != len(tangents):
        raise ValueError(f"{transform}: got {len(primals)} primals but {len(tangents)} "
                         "tangents")
    p_leaves, p_spec = pytree.flatten(primals)
    t_leaves, t_spec = pytree.flatten(tangents)
    if len(t_leaves) != len(p_leaves) or not _same_structure(t_spec, p_spec):
        raise ValueError(f"{transform}: tangents have structure {pytree.describe(t_spec)}, "
                         f"but primals have structure {pytree.describe(p_spec)}")
    xs = [_float_tensor(x, f"primal {k}", transform) for k, x in enumerate(p_leaves)]
    ts = [_like(t, x, f"tangent {k}", transform)
          for k, (t, x) in enumerate(zip(t_leaves, xs, strict=True))]
    return primals, p_spec, xs, ts


def _dual_input(x: Tensor, create_graph: bool) -> Tensor:
    """A fresh tensor standing for primal ``x``, made by an op: its own array (tracers
    tell tensors apart by array, and this one gets a tangent ``x`` lacks), the tangents
    of enclosing levels, and ``x``'s graph when ``create_graph``."""
    with _null() if create_graph and x.requires_grad else no_grad():
        return view(x, *x.shape) if x._data.flags.c_contiguous else clone(x)


def jvp(f: Callable, primals: Sequence, tangents: Sequence, has_aux: bool = False) -> tuple:
    """``(f(*primals), J @ tangents)`` (and ``aux`` last with has_aux), as JAX's ``jvp``.

    Forward mode: the tangents travel with the primals through every op (the table's
    forward derivatives, :mod:`nbgrad.autograd.forward`), so the cost is about that of
    one more forward pass. ``primals`` and ``tangents`` are tuples (or lists) of equal
    structure; the tangent output has the structure of ``f``'s output.
    """
    primals, p_spec, xs, ts = _primal_pairs(primals, tangents, "jvp")
    create_graph = _needs_graph(primals, tangents)
    with forward.dual_level() as level, (enable_grad() if create_graph else _null()):
        duals = [_dual_input(x, create_graph) for x in xs]
        for d, t in zip(duals, ts, strict=True):
            level.set(d, t)
        result = f(*pytree.unflatten(p_spec, duals))
        aux = None
        if has_aux:
            result, aux = _split_aux(result, "jvp")
        out_leaves, out_spec = pytree.flatten(result)
        outs = [_as_output(o, "an output", "jvp") for o in out_leaves]
        t_out = [level.get(o) for o in outs]
    t_out = [t if t is not None else _zeros(o) for t, o in zip(t_out, outs, strict=True)]
    value = _finish(pytree.unflatten(out_spec, outs), create_graph)
    t_tree = pytree.unflatten(out_spec, _finish(t_out, create_graph))
    if has_aux:
        return value, t_tree, _finish(aux, create_graph)
    return value, t_tree


def jvp_by_double_vjp(f: Callable, primals: Sequence, tangents: Sequence) -> tuple:
    """``jvp`` built from two reverse passes (``t -> d/du <J^T u, t>``): the construction
    before forward mode, kept as an oracle for tests and benchmarks."""
    primals = _check_sequence(primals, "primals", "jvp")
    tangents = _check_sequence(tangents, "tangents", "jvp")
    create_graph = _needs_graph(primals, tangents)
    diff = _DiffArgs(primals, tuple(range(len(primals))), create_graph, "jvp")
    t_leaves, _ = pytree.flatten(tangents)
    tans = [_like(t, x, f"tangent {k}", "jvp")
            for k, (t, x) in enumerate(zip(t_leaves, diff.leaves, strict=True))]
    with _inside_transform():
        result = f(*diff.args)
    out_leaves, out_spec = pytree.flatten(result)
    outs = [_as_output(o, "an output", "jvp") for o in out_leaves]
    tangent_out = _forward_product(outs, diff.leaves, tans, create_graph)
    value = _finish(pytree.unflatten(out_spec, outs), create_graph)
    return value, pytree.unflatten(out_spec, _finish(tangent_out, create_graph))


def _forward_product(outs: list[Tensor], inputs: list[Tensor], tangents: list[Tensor],
                     create_graph: bool) -> list[Tensor]:
    """``J @ t`` per output by double vjp: ``t -> d/du <J^T u, t>`` at u = 0."""
    live = [k for k, o in enumerate(outs) if o.requires_grad]
    result = [_zeros(o) for o in outs]
    if not live or not inputs:
        return result
    with enable_grad():
        us = [Tensor(np.zeros(outs[k].shape, dtype=outs[k].dtype), requires_grad=True)
              for k in live]
        vjps = autograd.grad([outs[k] for k in live], inputs, us, create_graph=True,
                             retain_graph=True, allow_unused=True)
        pairs = [(g, t) for g, t in zip(vjps, tangents, strict=True)
                 if g is not None and g.requires_grad]
        if not pairs:
            return result
        found = autograd.grad([g for g, _ in pairs], us, [t for _, t in pairs],
                              create_graph=create_graph, retain_graph=create_graph,
                              allow_unused=True)
    for k, g in zip(live, found, strict=True):
        if g is not None:
            result[k] = g
    return result


# ------------------------------------------------------------------ jacobian, hessian, hvp
#: ``[vmap]`` once :mod:`nbgrad.batching` is imported (it installs itself: a higher layer)
_VMAP: list[Callable] = []
#: how many elements of seeds and gradients one batched vjp of ``jacobian`` may hold
JACOBIAN_CHUNK_ELEMENTS = 2 ** 24


def _seeds(n: int, start: int, stop: int, shape: tuple, dtype) -> Tensor:
    """Rows ``start:stop`` of the identity of size ``n``, each shaped ``shape``."""
    rows = np.zeros((stop - start, n), dtype=dtype)
    rows[np.arange(stop - start), np.arange(start, stop)] = 1
    return Tensor(rows.reshape((stop - start,) + shape))


def _jacobian_of(out: Tensor, leaves: list[Tensor], create_graph: bool) -> list[Tensor]:
    """``d out / d x`` (shape ``out.shape + x.shape``) per leaf ``x``: the vjp of every
    basis cotangent at once under ``vmap``; one vjp per row where vmap cannot batch an op
    of the backward (or the output has one element)."""
    if not out.requires_grad:
        return [Tensor(np.zeros(tuple(out.shape) + tuple(x.shape), dtype=x.dtype))
                for x in leaves]
    n = out.size
    if n > 1 and _VMAP:
        chunk = max(1, min(n, JACOBIAN_CHUNK_ELEMENTS // (n + sum(x.size for x in leaves))))
        pull = _VMAP[0](lambda ct: _grads([out], leaves, [ct], create_graph, True))
        try:
            with enable_grad() if create_graph else no_grad():
                parts = [pull(_seeds(n, k, min(k + chunk, n), tuple(out.shape), out.dtype))
                         for k in range(0, n, chunk)]
        except (NotImplementedError, TracerError):
            pass  # the loop below needs no batching rule
        else:
            return [reshape(p[0] if len(parts) == 1 else cat(list(p)),
                            *(tuple(out.shape) + tuple(x.shape)))
                    for p, x in zip(zip(*parts, strict=True), leaves, strict=True)]
    rows = [[] for _ in leaves]
    for k in range(n):
        seed = np.zeros(out.shape, dtype=out.dtype)
        seed.reshape(-1)[k] = 1
        gs = _grads([out], leaves, [Tensor(seed)], create_graph, True)
        for row, g in zip(rows, gs, strict=True):
            row.append(reshape(g, -1))
    return [reshape(stack(row), *(tuple(out.shape) + tuple(x.shape))) if row else
            Tensor(np.zeros(tuple(out.shape) + tuple(x.shape), dtype=x.dtype))
            for x, row in zip(leaves, rows, strict=True)]


def jacobian(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of ``f`` by reverse mode (JAX's ``jacrev``).

    For an output of shape ``S`` and an argument of shape ``T`` the Jacobian has shape
    ``S + T``. A tuple ``argnums`` gives a tuple per output; a tuple of outputs gives a
    tuple of those. With ``has_aux=True`` the new function returns ``(jacobian, aux)``.
    """
    positions, single = _norm_argnums(argnums, "jacobian")

    @functools.wraps(f)
    def jacobian_f(*args, **kwargs):
        where = _resolve_argnums(positions, len(args), "jacobian")
        create_graph = _needs_graph(args, kwargs)
        diff = _DiffArgs(args, where, create_graph, "jacobian")
        with _inside_transform():
            result = f(*diff.args, **kwargs)
        aux = None
        if has_aux:
            result, aux = _split_aux(result, "jacobian")
        out_leaves, out_spec = pytree.flatten(result)
        outs = [_as_output(o, "an output", "jacobian") for o in out_leaves]
        per_output = []
        with enable_grad() if create_graph else _null():
            for out in outs:
                jacs = _jacobian_of(out, diff.leaves, create_graph)
                per_output.append(diff.rebuild(_finish(jacs, create_graph), single))
        jac = pytree.unflatten(out_spec, per_output)
        if has_aux:
            return jac, _finish(aux, create_graph)
        return jac

    return jacobian_f


def jacrev(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian by reverse mode, JAX's name for :func:`jacobian`."""
    return jacobian(f, argnums, has_aux)


def _forward_columns(g: Callable, xs: list[Tensor], j: int, has_aux: bool) -> list[Tensor]:
    """Per output of ``g``: its ``jvp`` along every basis direction of input ``j``, stacked
    (``(x.size,) + S``); all at once under ``vmap``, one ``jvp`` each where it cannot
    batch an op."""
    x = xs[j]
    if not x.size:
        return []
    zeros = [_zeros(t) for t in xs]

    def push(direction):
        out = jvp(g, xs, zeros[:j] + [direction] + zeros[j + 1:], has_aux=has_aux)
        return tuple(pytree.flatten(out[1])[0])

    if x.size > 1 and _VMAP:
        try:
            return list(_VMAP[0](push)(_seeds(x.size, 0, x.size, tuple(x.shape), x.dtype)))
        except (NotImplementedError, TracerError):
            pass  # one jvp per direction below needs no batching rule
    rows = []
    for k in range(x.size):
        seed = np.zeros(x.shape, dtype=x.dtype)
        seed.reshape(-1)[k] = 1
        rows.append(push(Tensor(seed)))
    return [stack([row[m] for row in rows]) for m in range(len(rows[0]))]


def jacfwd(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Jacobian of ``f`` by forward mode: a ``jvp`` per input element, batched with
    ``vmap`` (JAX's ``jacfwd``; cheaper than :func:`jacobian` when inputs are fewer than
    outputs).

    Shapes and structure as :func:`jacobian`: ``S + T`` for an output of shape ``S`` and
    an argument of shape ``T``.
    """
    positions, single = _norm_argnums(argnums, "jacfwd")

    @functools.wraps(f)
    def jacfwd_f(*args, **kwargs):
        where = _resolve_argnums(positions, len(args), "jacfwd")
        specs, xs = [], []
        for p in where:
            leaves, spec = pytree.flatten(args[p])
            start = len(xs)
            xs += [_float_tensor(x, f"leaf {k} of argument {p}", "jacfwd")
                   for k, x in enumerate(leaves)]
            specs.append((spec, start, len(xs)))

        def g(*leaves):
            call = list(args)
            for p, (spec, start, stop) in zip(where, specs, strict=True):
                call[p] = pytree.unflatten(spec, list(leaves[start:stop]))
            return f(*call, **kwargs)

        out = g(*xs)
        value, aux = _split_aux(out, "jacfwd") if has_aux else (out, None)
        out_leaves, out_spec = pytree.flatten(value)
        outs = [_as_output(o, "an output", "jacfwd") for o in out_leaves]
        columns = [_forward_columns(g, xs, j, has_aux) for j in range(len(xs))]
        per_output = []
        for m, o in enumerate(outs):
            jacs = []
            for j, x in enumerate(xs):
                if x.size:
                    J = reshape(columns[j][m], *(tuple(x.shape) + tuple(o.shape)))
                    nx = x.ndim
                    J = permute(J, *range(nx, nx + o.ndim), *range(nx))
                else:
                    J = Tensor(np.zeros(tuple(o.shape) + tuple(x.shape), dtype=x.dtype))
                jacs.append(J)
            trees = tuple(pytree.unflatten(spec, jacs[start:stop])
                          for spec, start, stop in specs)
            per_output.append(trees[0] if single else trees)
        jac = pytree.unflatten(out_spec, per_output)
        return (jac, aux) if has_aux else jac

    return jacfwd_f


def hessian(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The Hessian of ``f``: the Jacobian of its Jacobian (shape ``S + T + T``).

    A tuple ``argnums`` gives nested tuples ``H[i][j] = d2f / dx_i dx_j``.
    """
    if has_aux:
        inner = jacobian(f, argnums, has_aux=True)
        return jacobian(inner, argnums, has_aux=True)
    return jacobian(jacobian(f, argnums), argnums)


def hvp(f: Callable, primals: Any, tangents: Any) -> tuple:
    """``(f(*primals), H @ tangents)`` for a scalar ``f`` (the Hessian-vector product).

    Forward over reverse: the ``jvp`` of ``grad(f)``, one forward pass, one reverse pass
    and the tangents carried through both. ``primals`` and ``tangents`` are tuples (or
    lists) with one entry per argument of ``f``; the product has their structure. A single
    tensor (not in a tuple) is taken as the only argument, and the product is then a
    single tensor.
    """
    single = not isinstance(primals, (tuple, list))
    primals = (primals,) if single else tuple(primals)
    tangents = (tangents,) if single and not isinstance(tangents, (tuple, list)) else \
        _check_sequence(tangents, "tangents", "hvp")
    if len(primals) != len(tangents):
        raise ValueError(f"hvp: got {len(primals)} primals but {len(tangents)} tangents")
    positions = tuple(range(len(primals)))
    vg = value_and_grad(lambda *a: _scalar_output(f(*a), "hvp"), positions)
    (value, _), (_, product) = jvp(vg, primals, tangents)
    return value, product[0] if single else product
