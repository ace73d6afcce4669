"""Structured loops: ``fori_loop`` and ``scan``, the ``loop`` graph node, and its gradient.

Eagerly, :func:`fori_loop` and :func:`scan` are plain Python loops. Under
``nbgrad.jit`` the body is traced once into a sub-graph and the loop becomes one
``loop`` node (see :class:`~nbgrad.jit.trace.ir.LoopInfo`), executed natively by the tier-1
interpreter's LOOP instruction and never unrolled.

Gradients of a loop come from the derivative table, like everything else: the body
graph is replayed with eager ops on inputs that require grad and
``nbgrad.autograd.grad`` is called on it under a tracer, which records the joint
body ``J(inputs, cotangents) -> (outputs, gradients)``. Partial evaluation splits
``J`` into its primal part (run by the forward loop, which also stacks the per-step
values the gradient needs: the carries and intermediate results it reads) and its
tangent part (the body of a reversed loop that carries the cotangent of the carry and
accumulates the gradients of loop invariants). The backward loop is again a ``loop``
node, so higher-order gradients follow by the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import pytree
from ...autograd import forward
from ...autograd.node import RETAIN_GRAPH_MESSAGE, SavedOutput, SavedTensor, gradient_edge
from ...autograd.node import Node as AutogradNode
from ...errors import TracerError
from ...factories import tensor
from ...grad_mode import STATE, enable_grad, no_grad
from ...ops import cat, reshape, stack
from ...recompute import checkpoint as checkpoint_fn
from ...recompute import checkpointed_steps, loop_segments
from ...tensor import STATE_TRACE, Tensor
from ..reference import replay
from .autodiff import consts_for, joint_graph, partial_eval, reached_inputs, unrolled_reach
from .handles import run_owned
from .ir import LOOP, STOP_GRADIENT, Graph, LoopInfo, Node, Var, make_loop, type_str
from .loop_zeros import peeled_run, without_zero_cotangents
from .passes import accumulate_into, dce_nodes
from .tracer import Tracer, run_traced, user_site

__all__ = ["apply_loop", "fori_loop", "scan"]


# ------------------------------------------------------------------ user API
def _static_int(value: Any, what: str, fn: str) -> int:
    if isinstance(value, Tensor):
        tracer = STATE_TRACE.tracer
        if tracer is not None and tracer.is_traced(value):
            raise TracerError(f"{user_site()}: {fn}: {what} must be a Python int (a loop "
                              "bound cannot depend on a traced value)")
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: {what} must be an int, got {type(value).__name__}")
    return int(value)


def _leaf_tensor(x: Any, fn: str, what: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float, np.number, np.bool_, np.ndarray, list)):
        return tensor(x)
    raise TypeError(f"{fn}: {what} holds a {type(x).__name__}; expected tensors or numbers")


def _traced(tensors: Sequence[Tensor]) -> bool:
    """Whether a loop over ``tensors`` becomes a loop node of the trace: under
    ``nbgrad.jit``, on the CPU. The CUDA tier has no loop node: there the trace records
    the steps one by one, as eager mode runs them."""
    return STATE_TRACE.tracer is not None and all(t.device == "cpu" for t in tensors)


def _index_tensor(i: int) -> Tensor:
    return Tensor._make(np.asarray(i, np.int64))


def fori_loop(lower: int, upper: int, body: Callable[[Tensor, Any], Any], init: Any, *,
              checkpoint: bool | int | str | None = None, _remat: bool = False) -> Any:
    """``val = init; for i in range(lower, upper): val = body(i, val)``; returns ``val``.

    ``i`` is an int64 0-d tensor; ``init`` is a tensor or a tuple/list/dict of tensors
    (numbers become tensors) and ``body`` must return the same structure, shapes and
    dtypes. Under ``nbgrad.jit`` the body is traced once and runs as a native loop;
    gradients flow to ``init`` and to every tensor the body closes over.

    ``checkpoint`` bounds the memory of the gradient: ``True`` or ``"sqrt"`` keeps about
    ``2 sqrt(T)`` carries of a ``T``-step loop, an int ``k`` one carry per ``k`` steps
    (plus the ``k`` of the segment being differentiated), ``"log"`` about
    ``2 log2(T)``; the steps in between are recomputed during
    backward (see :mod:`nbgrad.recompute`). Under ``nbgrad.jit`` the loop becomes a loop
    over segments whose gradient stacks only each segment's first carry.
    """
    lower = _static_int(lower, "lower", "fori_loop")
    upper = _static_int(upper, "upper", "fori_loop")
    leaves, spec = pytree.flatten(init)
    carry = [_leaf_tensor(x, "fori_loop", "init") for x in leaves]
    if checkpoint is not None and checkpoint is not False:
        segments = loop_segments(max(upper - lower, 0), checkpoint)  # checks the value
        if _traced(carry):
            size = "log" if checkpoint == "log" else (segments[0][1] if segments else 1)
            return _segmented(lower, upper, body, init, size)

        def step(k: int, val: Any) -> Any:
            return pytree.unflatten(spec, _check_carry("fori_loop", spec, carry,
                                                       body(_index_tensor(lower + k), val)))
        return checkpointed_steps(step, max(upper - lower, 0), checkpoint,
                                  pytree.unflatten(spec, carry))
    if not _traced(carry):  # the same carry check as the traced body's
        val = pytree.unflatten(spec, carry)
        for i in range(lower, upper):
            val = pytree.unflatten(spec, _check_carry("fori_loop", spec, carry,
                                                      body(_index_tensor(i), val)))
        return val
    count = max(upper - lower, 0)

    def traced(idx, *c):
        out = body(idx, pytree.unflatten(spec, list(c)))
        return _check_carry("fori_loop", spec, carry, out)

    holders = [_index_tensor(lower)] + _placeholders([t._data for t in carry])
    graph, inv = _trace_body(traced, holders)
    info = LoopInfo(count, len(carry), 0, (), (), (lower, 1), graph, _remat)
    outs = apply_loop(info, carry + inv)
    return pytree.unflatten(spec, outs)


def _segmented(lower: int, upper: int, body: Callable, init: Any, size: int | str) -> Any:
    """A traced ``fori_loop`` in segments of ``size`` steps (or ``"log"``: halves,
    recursively, down to two steps): an outer loop whose gradient stacks one carry per
    segment and recomputes the segment, then the remaining steps."""
    count = max(upper - lower, 0)
    if size == "log":
        if count <= 2:
            return fori_loop(lower, upper, body, init)
        seg = count // 2

        def half(j, val):
            start = j * seg + lower
            return _segmented(0, seg, lambda k, v: body(start + k, v), val, "log")
    else:
        seg = int(size)

        def half(j, val):
            start = j * seg + lower
            return fori_loop(0, seg, lambda k, v: body(start + k, v), val)
    full = count // seg if seg else 0
    val = fori_loop(0, full, half, init, _remat=True) if full else init
    rest = lower + full * seg
    return fori_loop(rest, upper, body, val) if rest < upper else val


def _segmented_scan(f: Callable, init: Any, xs: Any, length: int, reverse: bool,
                   size: int) -> tuple[Any, Any]:
    """A traced ``scan`` in segments of ``size`` rows: an outer remat scan over blocks of
    ``size`` rows, each an inner scan, then the remaining rows (first when ``reverse``)."""
    full = length // size
    if full == 0:
        return scan(f, init, xs, length=length, reverse=reverse)
    xleaves, xspec = pytree.flatten(xs)
    split = full * size
    blocks = [reshape(t[:split], (full, size) + tuple(t.shape[1:])) for t in xleaves]
    rest = [t[split:] for t in xleaves]

    def segment(c, rows):
        return scan(f, c, pytree.unflatten(xspec, rows), length=size, reverse=reverse)

    def head(c):
        c, ys = scan(segment, c, blocks, length=full, reverse=reverse, _remat=True)
        return c, pytree.tree_map(lambda y: reshape(y, (split,) + tuple(y.shape[2:])), ys)

    def tail(c):
        return scan(f, c, pytree.unflatten(xspec, rest), length=length - split,
                    reverse=reverse)

    if split == length:
        return head(init)
    if reverse:
        c, ys_tail = tail(init)
        c, ys_head = head(c)
    else:
        c, ys_head = head(init)
        c, ys_tail = tail(c)
    h, spec = pytree.flatten(ys_head)
    t = pytree.flatten(ys_tail)[0]
    return c, pytree.unflatten(spec, [cat([a, b]) for a, b in zip(h, t, strict=True)])


def scan(f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any = None,
         length: int | None = None, reverse: bool = False, *,
         checkpoint: bool | int | str | None = None, _remat: bool = False) -> tuple[Any, Any]:
    """JAX's ``scan``: ``carry, y = f(carry, x)`` for each row ``x`` of ``xs``.

    Returns ``(final carry, ys)`` where ``ys`` stacks the ``y`` of every step (in the
    order of ``xs`` also when ``reverse=True``). ``xs`` is a tensor or a structure of
    tensors with a common leading length (or None, then ``length`` is required).
    ``checkpoint`` (``True``/``"sqrt"`` or a segment length) keeps one carry per
    segment for the gradient and recomputes the steps between.
    """
    leaves, spec = pytree.flatten(init)
    carry = [_leaf_tensor(x, "scan", "init") for x in leaves]
    xleaves, xspec = pytree.flatten(xs)
    xt = [_leaf_tensor(x, "scan", "xs") for x in xleaves]
    if any(t.ndim == 0 for t in xt):
        raise TypeError("scan: every tensor in xs needs a leading axis to scan over")
    lengths = {t.shape[0] for t in xt}
    if length is not None:
        lengths.add(_static_int(length, "length", "scan"))
    if len(lengths) != 1:
        raise ValueError(f"scan: xs and length disagree on the number of steps: "
                         f"{sorted(lengths) if lengths else 'none given'}")
    n = lengths.pop()
    if checkpoint is not None and checkpoint is not False and n > 0:
        if checkpoint == "log":
            raise ValueError("scan: checkpoint='log' is for fori_loop; give True, 'sqrt' or "
                             "a segment length")
        if _traced(carry + xt):
            return _segmented_scan(f, init, xs, n, reverse, loop_segments(n, checkpoint)[0][1])
        return _scan_segments(f, spec, carry, xspec, xt, n, reverse, checkpoint)
    if not _traced(carry + xt):
        return _scan_eager(f, spec, carry, xspec, xt, n, reverse)
    yspec_box: list = []

    def traced(*ins):
        c = pytree.unflatten(spec, list(ins[:len(carry)]))
        x = pytree.unflatten(xspec, list(ins[len(carry):]))
        out = f(c, x)
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError("scan: the body must return a pair (carry, y)")
        new = _check_carry("scan", spec, carry, out[0])
        yleaves, yspec = pytree.flatten(out[1])
        yspec_box.append(yspec)
        return new + [_leaf_tensor(y, "scan", "y") for y in yleaves]

    rows = [t._data[n - 1 if reverse else 0] if n else np.zeros(t.shape[1:], t.dtype)
            for t in xt]
    graph, inv = _trace_body(traced, _placeholders([t._data for t in carry] + rows))
    n_y = len(graph.outputs) - len(carry)
    xs_index = tuple(((n - 1, -1) if reverse else (0, 1)) for _ in xt)
    ys_index = tuple(((n - 1, -1, n) if reverse else (0, 1, n)) for _ in range(n_y))
    if n == 0:
        xs_index = tuple((0, 1) for _ in xt)
        ys_index = tuple((0, 1, 0) for _ in range(n_y))
    info = LoopInfo(n, len(carry), len(xt), xs_index, ys_index, None, graph, _remat)
    outs = apply_loop(info, carry + xt + inv)
    return (pytree.unflatten(spec, outs[:len(carry)]),
            pytree.unflatten(yspec_box[0], outs[len(carry):]))


def _scan_segments(f, spec, carry, xspec, xt, n, reverse, how):
    """An eager scan in checkpointed segments (:func:`nbgrad.recompute.loop_segments`)."""
    segments = loop_segments(n, how)
    parts: list = [None] * len(segments)
    c = pytree.unflatten(spec, carry)
    order = range(len(segments) - 1, -1, -1) if reverse else range(len(segments))
    for k in order:
        s, e, _ = segments[k]

        def run(c, rows, s=s, e=e):
            out_c, ys = _scan_eager(f, spec, pytree.flatten(c)[0], xspec, list(rows),
                                    e - s, reverse)
            return out_c, ys
        c, parts[k] = checkpoint_fn(run)(c, [t[s:e] for t in xt])
    yleaves = [pytree.flatten(p) for p in parts]
    stacked = [cat([leaves[j] for leaves, _ in yleaves]) for j in range(len(yleaves[0][0]))]
    return c, pytree.unflatten(yleaves[0][1], stacked)


def _scan_eager(f, spec, carry, xspec, xt, n, reverse):
    c = pytree.unflatten(spec, carry)
    ys: list = []
    yspec = None
    order = range(n - 1, -1, -1) if reverse else range(n)
    for i in order:
        out = f(c, pytree.unflatten(xspec, [t[i] for t in xt]))
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError("scan: the body must return a pair (carry, y)")
        c = pytree.unflatten(spec, _check_carry("scan", spec, carry, out[0]))
        y = out[1]
        yleaves, yspec = pytree.flatten(y)
        ys.append([_leaf_tensor(v, "scan", "y") for v in yleaves])
    if reverse:
        ys.reverse()
    if n == 0:
        with no_grad():
            rows = [Tensor._make(np.zeros(t.shape[1:], t.dtype)) for t in xt]
            _, y = f(pytree.unflatten(spec, carry), pytree.unflatten(xspec, rows))
        yleaves, yspec = pytree.flatten(y)
        empty = [Tensor._make(np.zeros((0,) + tuple(np.shape(v._data if isinstance(v, Tensor)
                                                             else v)),
                                       v.dtype if isinstance(v, Tensor) else np.float64))
                 for v in yleaves]
        return c, pytree.unflatten(yspec, empty)
    stacked = [stack([row[k] for row in ys]) for k in range(len(ys[0]))]
    return c, pytree.unflatten(yspec, stacked)


def _check_carry(fn: str, spec, init: list[Tensor], out: Any) -> list[Tensor]:
    leaves, ospec = pytree.flatten(out)
    if ospec != spec:
        raise TypeError(f"{fn}: the body returned a carry of structure {pytree.describe(ospec)}"
                        f", but init has structure {pytree.describe(spec)}")
    tensors = [_leaf_tensor(x, fn, "the carry") for x in leaves]
    for k, (a, b) in enumerate(zip(init, tensors, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            hint = ""
            if a.shape == b.shape:  # e.g. float32 carry + 0.05 * i (i: an int64 tensor)
                hint = f" (cast the new value back with .to({a.dtype.name!r}))"
            raise TypeError(f"{fn}: carry leaf {k} changes from {a.dtype}{list(a.shape)} to "
                            f"{b.dtype}{list(b.shape)} in the body; a loop carry must keep "
                            f"its shape and dtype{hint}")
    return tensors


def _placeholders(arrays: Sequence[np.ndarray]) -> list[Tensor]:
    return [Tensor._make(np.array(a, copy=True)) for a in arrays]


def _trace_body(fn: Callable, holders: list[Tensor]) -> tuple[Graph, list[Tensor]]:
    """Trace ``fn(*holders)`` once into a body graph; returns it and the captured tensors.

    With grad mode on, the body runs as eager mode would with floating inputs that
    require grad, so that the tracer marks where it cuts the graph (``detach()``,
    ``no_grad()``: :class:`~nbgrad.jit.trace.tracer.Tracer`): the body graph is differentiated
    (:func:`_build_plan`) whenever the loop is, by the jit or by eager autograd while
    tracing. Else it runs under ``no_grad()``."""
    parent = STATE_TRACE.tracer
    sub = Tracer(parent=parent)
    diff = STATE.grad_enabled and parent is not None and parent.cut_gradients
    for t in holders:
        if diff and t.dtype.kind == "f":  # a non-leaf, as a carry is from step 2 on
            t._requires_grad = True
            t.grad_fn = _BodyInput([])
        sub.add_input(t)
    with enable_grad() if diff else no_grad():
        outs = run_traced(sub, fn, *holders, quiet=True)
        with sub:  # a result that eager mode cut from the graph is cut in the loop too
            sub.graph.outputs = [sub.use(t) for t in outs]
    return _without_dead_code(sub.graph, len(holders), [t for _, _, t in sub.captures])


def _without_dead_code(graph: Graph, n_fixed: int, captured: list[Tensor]
                       ) -> tuple[Graph, list[Tensor]]:
    """The body without dead nodes and without the captured inputs only they read (e.g.
    a segment's start offset that a body ignoring its counter adds to it): such inputs
    would make the loop run step by step in Python while it is traced."""
    if len(graph.inputs) != n_fixed + len(captured):
        return graph, captured
    nodes = dce_nodes(graph.nodes, graph.outputs)
    read = {id(v) for n in nodes for v in n.inputs if v is not None}
    read.update(id(v) for v in graph.outputs)
    keep = [k for k in range(len(captured)) if id(graph.inputs[n_fixed + k]) in read]
    inputs = graph.inputs[:n_fixed] + [graph.inputs[n_fixed + k] for k in keep]
    return (Graph(inputs, consts_for(graph, nodes, graph.outputs), nodes, graph.outputs),
            [captured[k] for k in keep])


class _BodyInput(AutogradNode):
    """The autograd node of a body input while the body is traced (gradients end here)."""

    __slots__ = ()

    def apply(self, grads: list, create_graph: bool) -> list:
        return []


# ------------------------------------------------------------------ the loop node at run time
def apply_loop(info: LoopInfo, inputs: Sequence[Tensor]) -> list[Tensor]:
    """Run a loop node on tensors: records it when tracing, makes it differentiable.

    Returns the loop's outputs (final carries, then ys stacks).
    """
    inputs = list(inputs)
    if forward.STATE.active and forward.has_tangent(inputs):
        raise NotImplementedError(
            f"{user_site()}: forward mode (jvp, jacfwd, hvp) through fori_loop/scan inside "
            "nbgrad.jit is not supported yet; call the transform outside nbgrad.jit, or use "
            "reverse mode (vjp, grad, jacobian)")
    rg = tuple(bool(STATE.grad_enabled and t._requires_grad) for t in inputs)
    tracer = STATE_TRACE.tracer
    if any(rg) and tracer is not None and tracer.parent is not None:
        # tracing a loop body: the outputs only need eager mode's requires_grad flags
        # (the enclosing loop's plan differentiates this loop when it needs to)
        outs = _run_forward(info, None, inputs)
        for o, r in zip(outs, _loop_rg(info, rg)[1], strict=True):
            if r:
                o._requires_grad = True
                o.grad_fn = _BodyInput([])
        return outs
    plan = _get_plan(info, rg, inputs) if any(rg) else None
    outs = _run_forward(info, plan, inputs)
    return outs[:len(info.body.outputs)]


def _run_forward(info: LoopInfo, plan: LoopPlan | None, inputs: list[Tensor]) -> list[Tensor]:
    run = plan.fwd_info if plan is not None else info
    arrays = execute_loop(run, [t._data for t in inputs])
    outs = [Tensor._make(a) for a in arrays]
    tracer = STATE_TRACE.tracer
    if tracer is not None:
        # carries and xs as eager mode reads them; an invariant stands for every use the
        # body makes of a captured value (the body's own markers cut where it detaches)
        n = run.n_carry + run.n_xs
        in_vars = [tracer.use(t) if k < n else tracer.var_of(t) for k, t in enumerate(inputs)]
        if any(tracer.is_dynamic(v) for v in in_vars):
            out_vars = [Var(a.shape, a.dtype) for a in arrays]
            tracer.add_node(make_loop(in_vars, out_vars, run), outs)
    if plan is not None:
        node = LoopBackward([gradient_edge(t) if r else None
                             for t, r in zip(inputs, plan.rg, strict=True)])
        node.plan = plan
        node.saved = [SavedTensor(t, "loop input") for t in inputs]
        for k, o in enumerate(outs):
            if plan.out_rg[k]:
                o._requires_grad = True
                o.grad_fn = node
                o._output_nr = k
        node.outputs_saved = [SavedOutput(o, "loop output") for o in outs]
    return outs


def execute_loop(info: LoopInfo, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Concrete outputs of a loop node (natively when the interpreter supports the body)."""
    from ..program import run_loop_native  # cyclic: tier 1 runs loops eagerly through us
    out = run_loop_native(info, arrays)
    if out is not None:
        return out
    return execute_loop_eager(info, arrays)


def execute_loop_eager(info: LoopInfo, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The reference semantics of a loop node: replay the body with eager ops."""
    prev = STATE_TRACE.tracer
    STATE_TRACE.tracer = None
    try:
        with no_grad():
            # PythonOp contexts made by the body are owned by the outputs (handles.run_owned)
            return run_owned(info.body, lambda: _loop_eager(
                info, [np.asarray(a) for a in arrays], replay))
    finally:
        STATE_TRACE.tracer = prev


def _loop_eager(info: LoopInfo, arrays: list[np.ndarray], replay) -> list[np.ndarray]:
    nc, nx = info.n_carry, info.n_xs
    carry = [Tensor._make(a.copy()) for a in arrays[:nc]]
    stacks = arrays[nc:nc + nx]
    inv = [Tensor._make(a) for a in arrays[nc + nx:]]
    ys_out = [np.zeros((length,) + v.shape, v.dtype)
              for (_, _, length), v in zip(info.ys_index, info.body.outputs[nc:], strict=True)]
    for j in range(info.count):
        ins = []
        if info.index is not None:
            ins.append(_index_tensor(info.index[0] + info.index[1] * j))
        ins += carry
        ins += [Tensor._make(s[start + step * j]) for s, (start, step)
                in zip(stacks, info.xs_index, strict=True)]
        ins += inv
        outs = replay(info.body, ins)
        carry = outs[:nc]
        for ys, (start, step, _), y in zip(ys_out, info.ys_index, outs[nc:], strict=True):
            ys[start + step * j] = y._data
    return [t._data for t in carry] + ys_out


# ------------------------------------------------------------------ gradients
class LoopBackward(AutogradNode):
    """The autograd node of a loop: its backward runs the reversed (tangent) loop."""

    __slots__ = ("plan", "saved", "outputs_saved")

    def name(self) -> str:
        return "LoopBackward"

    def release(self) -> None:
        self.saved = None
        self.outputs_saved = None

    def apply(self, grads: list, create_graph: bool) -> list:
        if self.saved is None:
            raise RuntimeError(RETAIN_GRAPH_MESSAGE)
        plan = self.plan
        inputs = [s.unpack(self) for s in self.saved]
        outs = [s.unpack(self) for s in self.outputs_saved]
        if any(g is not None for g in grads[plan.n_out:]):
            # cotangents for the stacked per-step values (higher order): differentiate
            # the forward-with-stacks loop itself, recomputing what it needs
            plan2 = _get_plan(plan.fwd_info, plan.rg, inputs)
            outs2 = _run_forward(plan.fwd_info, plan2, inputs)
            return _backward(plan2, inputs, outs2, grads)
        wanted = {k for k in range(plan.n_out) if k < len(grads) and grads[k] is not None}
        return _backward(without_zero_cotangents(plan, wanted) or plan, inputs, outs, grads)


def _backward(plan: LoopPlan, inputs: list[Tensor], outs: list[Tensor], grads: list) -> list:
    vals = []
    for kind, k in plan.recipe:
        if kind == "ct":
            g = grads[k] if k < len(grads) else None
            if g is None:
                o = outs[k]
                g = Tensor._make(np.zeros(o.shape, o.dtype))
            vals.append(g)
        elif kind == "zeros":
            v = plan.bwd_info.body.inputs[k]
            vals.append(Tensor._make(np.zeros(v.shape, v.dtype)))
        elif kind == "out":
            vals.append(outs[k])
        else:
            vals.append(inputs[k])
    wanted = {k for k in range(plan.n_out) if k < len(grads) and grads[k] is not None}
    bouts = peeled_run(plan, wanted, vals, apply_loop)
    if bouts is None:
        bouts = apply_loop(plan.bwd_info, vals)
    # as the eager Python loop: an input that no output with a gradient reads over the
    # steps gets no gradient (None), not zeros
    reached = unrolled_reach(plan.fwd_info.count, plan.fwd_info.n_carry, plan.step_reach,
                             wanted)
    res: list = [None] * len(inputs)
    for i, k in plan.grad_map:
        if i in reached:
            res[i] = bouts[k]
    return res


@dataclass
class LoopPlan:
    """How to differentiate one loop for one pattern of inputs requiring grad."""

    rg: tuple[bool, ...]           # loop inputs requiring grad
    n_out: int                     # outputs of the original loop
    fwd_info: LoopInfo             # the loop with the per-step stacks the backward reads
    out_rg: tuple[bool, ...]       # which outputs of fwd_info are differentiable
    bwd_info: LoopInfo             # the reversed loop
    recipe: list[tuple[str, int]]  # how to build bwd inputs: ct/zeros/out/in, index
    grad_map: list[tuple[int, int]]  # (loop input, bwd output) pairs
    step_reach: tuple[frozenset[int], ...]  # per output: the inputs one step reads


def _get_plan(info: LoopInfo, rg: tuple[bool, ...], inputs: Sequence[Tensor]) -> LoopPlan:
    key = ("plan", info.count, info.xs_index, info.ys_index, info.index, rg, info.remat)
    plan = info.body.cache.get(key)
    if plan is None:
        plan = info.body.cache[key] = _build_plan(info, rg, [t._data for t in inputs])
    return plan


def _depends(graph: Graph, seeds: set[int]) -> set[int]:
    """ids of the vars of ``graph`` that depend on the vars in ``seeds`` through
    differentiable paths (floats only; a StopGradient marker cuts)."""
    dep = set(seeds)
    for node in graph.nodes:
        if node.op != STOP_GRADIENT and any(v is not None and id(v) in dep
                                            for v in node.inputs):
            for v in node.outputs:
                if v.dtype.kind == "f":
                    dep.add(id(v))
    return dep


def _loop_rg(info: LoopInfo, rg: tuple[bool, ...]) -> tuple[list[bool], list[bool]]:
    """(loop inputs differentiated, outputs that require grad) when inputs ``rg`` do:
    a fixed point over the body's dependencies (a carry computed from a differentiated
    value is differentiated)."""
    body = info.body
    nc = info.n_carry
    _, carry_v, xs_v, inv_v = info.body_inputs()
    in_vars = carry_v + xs_v + inv_v
    rg_in = [r and v.dtype.kind == "f" for r, v in zip(rg, in_vars, strict=True)]
    while True:
        dep = _depends(body, {id(v) for v, r in zip(in_vars, rg_in, strict=True) if r})
        new = [rg_in[i] or (id(body.outputs[i]) in dep and carry_v[i].dtype.kind == "f")
               for i in range(nc)]
        if new == rg_in[:nc]:
            break
        rg_in[:nc] = new
    return rg_in, [id(v) in dep for v in body.outputs]


def _step_example(info: LoopInfo, idx_v: Var | None, in_vars: list[Var],
                  example: list[np.ndarray]) -> list[np.ndarray]:
    """Input values of one step of the body (the first row of each xs stack), on which
    the joint body is traced."""
    nc, nx = info.n_carry, info.n_xs
    ex: list[np.ndarray] = []
    if idx_v is not None:
        ex.append(np.asarray(info.index[0], np.int64))
    for i, v in enumerate(in_vars):
        if nc <= i < nc + nx:
            stack, (start, _) = example[i], info.xs_index[i - nc]
            ex.append(stack[start] if info.count and stack.shape[0]
                      else np.zeros(v.shape, v.dtype))
        else:
            ex.append(example[i])
    return ex


def _residuals(j_inputs: list[Var], pnodes: list[Node], tnodes: list[Node],
               needed: list[Var], off: int, nc: int, nx: int, remat: bool = False):
    """What the backward body reads from the forward: the per-step values the forward
    loop stacks, the xs and invariants it reads, whether it reads the index; values that
    depend only on invariants are recomputed (prepended to ``tnodes``), not stacked, and
    with ``remat`` every value is (only the step's inputs are stacked).
    Returns (tnodes, stacked, xs_used, inv_used, idx_used)."""
    pos = {id(v): i for i, v in enumerate(j_inputs)}
    # values that depend only on loop invariants are recomputed by the backward body
    # (and hoisted out of it), not stacked per step
    variant = {id(v) for v in j_inputs[:off + nc + nx]}
    for node in pnodes:
        if any(v is not None and id(v) in variant for v in node.inputs):
            variant.update(id(v) for v in node.outputs)
    producer = {id(o): n for n in pnodes for o in n.outputs}
    recompute: list[Node] = []
    seen_nodes: set[int] = set()
    extra_needed: list[Var] = []

    def pull(v: Var) -> None:
        node = producer.get(id(v))
        if node is None or id(node) in seen_nodes:
            if node is None and id(v) in pos and v not in extra_needed:
                extra_needed.append(v)
            return
        seen_nodes.add(id(node))
        for u in node.inputs:
            if u is not None:
                pull(u)
        recompute.append(node)

    kept_needed = []
    for v in needed:
        if id(v) not in pos and (remat or id(v) not in variant):
            pull(v)
        else:
            kept_needed.append(v)
    order = {id(n): i for i, n in enumerate(pnodes)}
    recompute.sort(key=lambda n: order[id(n)])
    tnodes = recompute + tnodes
    needed = kept_needed + [v for v in extra_needed if all(v is not u for u in kept_needed)]
    stacked: list[Var] = []   # per-step values the forward loop stacks for the backward
    xs_used: list[int] = []
    inv_used: list[int] = []
    idx_used = False
    for v in needed:
        p = pos.get(id(v))
        if p is None or (off <= p < off + nc):
            stacked.append(v)
        elif p < off:
            idx_used = True
        elif p < off + nc + nx:
            xs_used.append(p - off - nc)
        else:
            inv_used.append(p - off - nc - nx)
    return tnodes, stacked, xs_used, inv_used, idx_used


def _build_plan(info: LoopInfo, rg: tuple[bool, ...], example: list[np.ndarray]) -> LoopPlan:
    body = info.body
    nc, nx = info.n_carry, info.n_xs
    n_in = len(rg)
    idx_v, carry_v, xs_v, inv_v = info.body_inputs()
    in_vars = carry_v + xs_v + inv_v
    rg_in, out_rg = _loop_rg(info, rg)

    # ---- the joint body J(inputs, cotangents) -> (outputs, gradients), split
    off = 1 if idx_v is not None else 0
    ex = _step_example(info, idx_v, in_vars, example)
    joint = joint_graph(body, [False] * off + rg_in, ex, out_rg)
    jg = joint.graph
    j_inputs = joint.inputs
    out_vars = joint.outputs
    ct_of = dict(zip(joint.diff, joint.cts, strict=True))  # body output k -> cotangent var
    grad_of = {i - off: g for i, g in zip(joint.wrt, joint.grads, strict=True)}
    step_reach = _step_reach(joint, off, len(body.outputs))
    pnodes, tnodes, needed = partial_eval(joint)
    j_idx = j_inputs[0] if idx_v is not None else None
    j_carry = j_inputs[off:off + nc]
    j_xs = j_inputs[off + nc:off + nc + nx]
    j_inv = j_inputs[off + nc + nx:]
    tnodes, stacked, xs_used, inv_used, idx_used = _residuals(
        j_inputs, pnodes, tnodes, needed, off, nc, nx, info.remat)
    count = info.count
    last = max(count - 1, 0)
    # ---- forward loop with stacks
    f_outputs = out_vars + stacked
    f_nodes = dce_nodes(pnodes, f_outputs)
    fwd = Graph(list(j_inputs[:len(body.inputs)]), consts_for(jg, f_nodes, f_outputs),
                f_nodes, f_outputs)
    fwd_info = LoopInfo(count, nc, nx, info.xs_index,
                        info.ys_index + tuple((0, 1, count) for _ in stacked), info.index, fwd)

    # ---- backward loop
    b_inputs: list[Var] = []
    recipe: list[tuple[str, int]] = []
    b_outputs: list[Var] = []
    grad_map: list[tuple[int, int]] = []
    adds: list[Node] = []
    extra_consts: dict[Var, np.ndarray] = {}

    def zero_var(like: Var) -> Var:
        z = like.like()
        extra_consts[z] = np.zeros(like.shape, like.dtype)
        return z

    if idx_used:
        b_inputs.append(j_idx)
    carries_b = [i for i in range(nc) if rg_in[i]]
    for i in carries_b:   # cotangent of the carry, flowing backwards
        ct = ct_of.get(i)
        if ct is None:
            ct = j_carry[i].like()
        b_inputs.append(ct)
        recipe.append(("ct", i))
        g = grad_of.get(i)
        b_outputs.append(g if g is not None else zero_var(j_carry[i]))
    acc_for = [i for i in range(nc + nx, n_in) if rg_in[i] and grad_of.get(i) is not None]
    for i in acc_for:     # gradients of invariants accumulate over the steps
        acc = j_inv[i - nc - nx].like()
        b_inputs.append(acc)
        recipe.append(("zeros", len(b_inputs) - 1))
        others = [g for j, g in grad_of.items() if j != i]
        if accumulate_into(tnodes, jg.consts, grad_of[i], acc, b_outputs + others):
            b_outputs.append(grad_of[i])
            continue
        new = acc.like()
        adds.append(Node("add", [acc, grad_of[i]], [new], {}))
        b_outputs.append(new)
    n_carry_b = len(b_inputs) - (1 if idx_used else 0)
    xs_index_b: list[tuple[int, int]] = []
    n_orig = len(body.outputs)
    for r, v in enumerate(stacked):
        b_inputs.append(v)
        recipe.append(("out", n_orig + r))
        xs_index_b.append((last, -1))
    for k in xs_used:
        b_inputs.append(j_xs[k])
        recipe.append(("in", nc + k))
        start, step = info.xs_index[k]
        xs_index_b.append((start + step * last, -step) if count else (0, 1))
    for k in range(info.n_ys):
        ct = ct_of.get(nc + k)
        if ct is None:
            continue
        b_inputs.append(ct)
        recipe.append(("ct", nc + k))
        start, step, _ = info.ys_index[k]
        xs_index_b.append((start + step * last, -step) if count else (0, 1))
    for k in inv_used:
        b_inputs.append(j_inv[k])
        recipe.append(("in", nc + nx + k))
    n_xs_b = len(xs_index_b)
    ys_index_b: list[tuple[int, int, int]] = []
    xs_grads = [k for k in range(nx) if rg_in[nc + k]]
    for k in xs_grads:
        g = grad_of.get(nc + k)
        b_outputs.append(g if g is not None else zero_var(j_xs[k]))
        start, step = info.xs_index[k]
        length = example[nc + k].shape[0]
        ys_index_b.append((start + step * last, -step, length) if count else (0, 1, length))
    b_nodes = dce_nodes(tnodes + adds, b_outputs)
    b_consts = consts_for(jg, b_nodes, b_outputs)
    b_consts.update(extra_consts)
    bwd = Graph(b_inputs, b_consts, b_nodes, b_outputs)
    index_b = None
    if idx_used:
        index_b = (info.index[0] + info.index[1] * last, -info.index[1])
    bwd_info = LoopInfo(count, n_carry_b, n_xs_b, tuple(xs_index_b), tuple(ys_index_b),
                        index_b, bwd)
    for j, i in enumerate(carries_b):
        grad_map.append((i, j))
    for j, i in enumerate(acc_for):
        grad_map.append((i, len(carries_b) + j))
    for j, k in enumerate(xs_grads):
        grad_map.append((nc + k, len(carries_b) + len(acc_for) + j))
    f_rg = tuple(out_rg) + tuple(v.dtype.kind == "f" for v in stacked)
    return LoopPlan(tuple(rg), n_orig, fwd_info, f_rg, bwd_info, recipe, grad_map,
                    step_reach)


def _step_reach(joint, off: int, n_out: int) -> tuple[frozenset[int], ...]:
    """Per body output: the loop inputs (carries, xs, invariants) whose gradient its
    cotangent reaches in one step (from the joint body)."""
    return tuple(frozenset(i - off for i in reached_inputs(joint, [k == o for k in
                                                                  range(n_out)]))
                 for o in range(n_out))


def describe_loop(info: LoopInfo) -> str:
    """One line about a loop node (for error messages)."""
    ins = ", ".join(type_str(v) for v in info.body.inputs)
    return f"loop of {info.count} steps over ({ins})"


__all__ += ["LOOP", "LoopBackward", "describe_loop", "execute_loop"]
