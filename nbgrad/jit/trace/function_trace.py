"""Custom ``autograd.Function``s met while tracing: the native path or a PythonOp.

``Function.apply`` on a traced tensor calls :func:`trace_function`, which decides at
trace time:

Native path
    The forward is traced into a sub-graph by a child tracer (its ops are ordinary table
    ops), and the backward is tried on a throwaway tracer whose gradients and saved
    tensors are all traced values. When both trace (no ``numpy()``/``item()``/branch on
    a traced value, no exception, every output and gradient computed by nbgrad ops), the
    call becomes one ``Function`` node: inputs the Function's tensor arguments, outputs
    its outputs followed by *residuals* (intermediate tensors the forward kept on ``ctx``
    for the backward), attributes those of a PythonOp plus ``#forward`` (the sub-graph)
    and ``#residuals`` (where on ``ctx`` each residual lives).

    Executables never see the node: :func:`expand` inlines its forward before a graph is
    lowered or compiled. Its gradient is the user's: differentiating a graph replays it
    with eager ops (:mod:`nbgrad.jit.trace.autodiff`), and :func:`replay_function` runs the
    Function as eager mode does, under the tracer, so the forward's ops and, when the
    autograd engine calls it, the user's ``backward`` are recorded as table ops. The
    compiled backward is therefore the user's formula (not the autodiff of the forward),
    fused like any other op. A backward marked ``once_differentiable`` leaves
    ``OnceDifferentiable`` markers on its results (identity when run; a double backward
    through them raises, as in eager mode).

PythonOp path
    Anything else (see :mod:`nbgrad.jit.trace.pythonop`).

``cls.jit_path`` (``"auto"`` by default, ``"native"`` or ``"python"``) forces a path;
``"native"`` raises a :class:`~nbgrad.TracerError` saying why a Function does not compile.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ...autograd.function import BackwardFunction, FunctionCtx, apply_function
from ...errors import TracerError
from ...grad_mode import no_grad
from ...tensor import STATE_TRACE, Tensor
from .ir import FUNCTION, LOOP, MARKERS, Graph, LoopInfo, Node, Var, inline_graph, make_loop
from .passes import optimize
from .pythonop import (
    _CTX_FIELDS,
    annotate,
    argument_attrs,
    fn_ref,
    kwargs_attr,
    mark_once,
    onnx_type,
    output_list,
    qualified_name,
    rebuild_args,
    trace_python_op,
)
from .tracer import Tracer, user_site

__all__ = ["NativeBackward", "expand", "replay_function", "trace_function", "wants_function"]

PATHS = ("auto", "native", "python")


class _NotNative(Exception):
    """The Function cannot take the native path (the message says why)."""


def _traced_in(tracer, value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is, or (in lists, tuples and dicts) holds, a traced tensor."""
    if isinstance(value, Tensor):
        return tracer.is_traced(value)
    if depth < 4 and isinstance(value, (list, tuple)):
        return any(_traced_in(tracer, x, depth + 1) for x in value)
    if depth < 4 and isinstance(value, dict):
        return any(_traced_in(tracer, x, depth + 1) for x in value.values())
    return False


def wants_function(tracer, cls: type, args: tuple, kwargs: dict | None = None) -> bool:
    """Whether ``cls.apply(*args)`` must be recorded: some argument is or holds a traced
    tensor."""
    return any(_traced_in(tracer, a) for a in list(args) + list((kwargs or {}).values()))


def trace_function(tracer, cls: type, args: tuple, kwargs: dict) -> Any:
    """Record ``cls.apply(*args, **kwargs)`` into ``tracer`` (natively when it compiles)."""
    for k, v in kwargs.items():
        if _traced_in(tracer, v):
            raise TracerError(f"{user_site()}: {cls.__qualname__}.apply got a traced tensor in "
                              f"the keyword argument {k}=; inside nbgrad.jit pass tensors to "
                              "a custom Function as positional arguments")
    for i, a in enumerate(args):
        if not isinstance(a, Tensor) and _traced_in(tracer, a):
            raise TracerError(f"{user_site()}: argument {i} of {cls.__qualname__}.apply holds "
                              f"a traced tensor inside a {type(a).__name__}; inside nbgrad.jit "
                              "pass each tensor to a custom Function as its own argument")
    path = getattr(cls, "jit_path", "auto")
    if path not in PATHS:
        raise ValueError(f"{cls.__qualname__}.jit_path must be one of {PATHS}, got {path!r}")
    if path != "python":
        try:
            return _trace_native(tracer, cls, args, kwargs)
        except _NotNative as exc:
            if path == "native":
                raise TracerError(f"{user_site()}: {cls.__qualname__} cannot run natively "
                                  f"inside nbgrad.jit: {exc}") from None
    return trace_python_op(tracer, cls, args, kwargs)


# ------------------------------------------------------------------ the native path
class NativeBackward(BackwardFunction):
    """The autograd node of a natively traced Function: the user's backward, followed by
    ``OnceDifferentiable`` markers when it is ``once_differentiable`` and being traced."""

    __slots__ = ()

    def apply(self, grads: list, create_graph: bool) -> list:
        result = BackwardFunction.apply(self, grads, create_graph)
        if STATE_TRACE.tracer is None or not getattr(self.fn_cls.backward,
                                                     "once_differentiable", False):
            return result
        name = f"{self.fn_cls.__qualname__}.backward"
        return [None if g is None else mark_once(g, name) for g in result]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TracerError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _trace_native(tracer, cls: type, args: tuple, kwargs: dict) -> Any:
    name = cls.__qualname__
    sub = Tracer(parent=tracer)
    tensor_args = [a for a in args if isinstance(a, Tensor)]
    for t in tensor_args:
        sub.add_input(t)
    ctx = FunctionCtx()
    try:
        with sub:
            raw = apply_function(cls, args, kwargs, ctx, NativeBackward)
    except Exception as exc:
        raise _NotNative(f"its forward does not trace ({_describe(exc)})") from exc
    if sub.captures:
        raise TracerError(f"{user_site()}: {name}.forward reads a tensor computed inside the "
                          "jitted function that is not one of its arguments; pass it to "
                          f"{name}.apply as an argument")
    outs = output_list(cls, raw)
    if ctx.dirty_tensors:
        raise TracerError(f"{user_site()}: {name}.forward modifies an input in place "
                          "(ctx.mark_dirty); in-place custom Functions are not supported "
                          "inside nbgrad.jit")
    out_vars = []
    for k, o in enumerate(outs):
        v = sub.lookup(o)
        if v is None or not sub.is_dynamic(v):
            raise _NotNative(f"its output {k} is not computed from its inputs by nbgrad ops")
        out_vars.append(v)
    recipe, res_tensors, res_vars = _residuals(ctx, sub, out_vars)
    node = ctx._node
    if node is not None:
        _probe_backward(cls, node, sub, tensor_args, outs, res_tensors)
    sub.graph.outputs = out_vars + res_vars
    attrs = function_attrs(cls, args, kwargs, outs, node, recipe, sub.graph)
    in_vars = [tracer.use(t) for t in tensor_args]
    new_vars = [Var(v.shape, v.dtype) for v in sub.graph.outputs]
    tracer.add_node(Node(FUNCTION, in_vars, new_vars, attrs), outs + res_tensors)
    return raw


def _residuals(ctx: FunctionCtx, sub: Tracer, out_vars: list[Var]):
    """Intermediate traced tensors the forward left on ``ctx`` (saved or as attributes)."""
    skip = {id(v) for v in out_vars} | {id(v) for v in sub.graph.inputs}
    recipe: list[tuple] = []
    tensors: list[Tensor] = []
    vars_: list[Var] = []

    def consider(t: Any, path: tuple) -> None:
        if not isinstance(t, Tensor):
            return
        v = sub.lookup(t)
        if v is None or not sub.is_dynamic(v) or id(v) in skip:
            return
        skip.add(id(v))
        recipe.append(path)
        tensors.append(t)
        vars_.append(v)

    for i, t in enumerate(ctx.saved_tensors):
        consider(t, ("saved", i))
    for key, val in vars(ctx).items():
        if key in _CTX_FIELDS:
            continue
        if isinstance(val, Tensor):
            consider(val, ("attr", key))
        elif isinstance(val, (list, tuple)):
            for j, x in enumerate(val):
                consider(x, ("attr", key, j))
    return tuple(recipe), tensors, vars_


def _probe_backward(cls: type, node: BackwardFunction, sub: Tracer, tensor_args: list,
                    outs: list, res_tensors: list) -> None:
    """Call the user's backward on traced values; raise _NotNative unless it traces."""
    probe = Tracer(implicit_inputs=False)
    for t in tensor_args + outs + res_tensors:
        probe.bind(t, Var(t._data.shape, t._data.dtype))
    grads = []
    for o in outs:
        if o.grad_fn is node:
            g = Tensor._make(np.ones(o._data.shape, o._data.dtype))
            probe.bind(g, Var(g._data.shape, g._data.dtype))
            grads.append(g)
        else:
            grads.append(None)
    patterns = [grads]
    diff = [k for k, g in enumerate(grads) if g is not None]
    if not node.ctx.materialize_grads and len(diff) > 1:
        # the backward may get None for outputs that receive no gradient: try each alone
        patterns += [[g if k == j else None for k, g in enumerate(grads)] for j in diff]
    for pattern in patterns:
        try:
            with probe, no_grad():
                result = node.apply(pattern, False)
        except Exception as exc:
            raise _NotNative(f"its backward does not trace ({_describe(exc)})") from exc
        for k, g in enumerate(result):
            if g is None:
                continue
            v = probe.lookup(g)
            if v is None or not probe.is_dynamic(v):
                raise _NotNative(f"the gradient it returns for tensor input {k} is not "
                                 "computed by nbgrad ops from the saved values and output "
                                 "gradients")
    for ref, _ in probe.frozen:
        t = ref()
        if t is None or probe.lookup(t) is not None:
            continue
        v = sub.lookup(t)
        if v is not None and sub.is_dynamic(v):
            raise _NotNative("its backward reads an intermediate value of the forward that "
                             "is neither saved with ctx.save_for_backward nor a ctx attribute")


def function_attrs(cls: type, args: tuple, kwargs: dict, outs: list[Tensor],
                   node: BackwardFunction | None, recipe: tuple, forward: Graph) -> dict:
    tensors = [a for a in args if isinstance(a, Tensor)]
    attrs: dict[str, Any] = {"name": qualified_name(cls)}
    arg = argument_attrs(args)
    attrs["input_convention"] = arg.pop("input_convention")
    attrs["input_requires_grads"] = tuple(int(node is not None and t._requires_grad)
                                          for t in tensors)
    attrs["input_tensor_types"] = tuple(onnx_type(t.dtype) for t in tensors)
    attrs["input_tensor_ranks"] = tuple(t.ndim for t in tensors)
    attrs.update(arg)
    attrs["output_tensor_types"] = tuple(onnx_type(o.dtype) for o in outs)
    attrs["output_tensor_ranks"] = tuple(o.ndim for o in outs)
    attrs["residuals"] = len(recipe)
    attrs["#fn"] = fn_ref(cls)
    attrs["#forward"] = forward
    attrs["#residuals"] = recipe
    if kwargs:
        attrs["#kwargs"] = kwargs_attr(kwargs)
    return attrs


def _fetch(ctx: FunctionCtx, path: tuple) -> Any:
    if path[0] == "saved":
        return ctx.saved_tensors[path[1]]
    value = getattr(ctx, path[1])
    return value[path[2]] if len(path) > 2 else value


def replay_function(node: Node, values: list) -> list[Tensor]:
    """Run a native Function node as eager mode runs the Function (ops recorded when a
    tracer is installed): its outputs, then its residuals."""
    a = node.attrs
    cls = a["#fn"].fn
    args, kwargs = rebuild_args(a, values)
    ctx = FunctionCtx()
    try:
        raw = apply_function(cls, args, kwargs, ctx, NativeBackward)
    except TracerError:
        raise
    except Exception as exc:
        annotate(exc, cls, "forward")
        raise
    outs = output_list(cls, raw) + [_fetch(ctx, p) for p in a["#residuals"]]
    if len(outs) != len(node.outputs) or any(
            not isinstance(o, Tensor) or o._data.shape != v.shape or o._data.dtype != v.dtype
            for o, v in zip(outs, node.outputs, strict=False)):
        raise RuntimeError(f"{cls.__qualname__}: its forward returned or saved values of "
                           "other shapes or dtypes than when it was traced by nbgrad.jit")
    return outs


# ------------------------------------------------------------------ expansion
def _has_native(graph: Graph) -> bool:
    key = ("pythonop", "native")
    v = graph.cache.get(key)
    if v is None:
        v = graph.cache[key] = any(n.op == FUNCTION or n.op in MARKERS
                                   for n in graph.walk())
    return v


def expand(graph: Graph) -> Graph:
    """``graph`` with native Function nodes replaced by their forward's nodes and
    markers (OnceDifferentiable, StopGradient) by their input (loop bodies included);
    the same graph when it has neither."""
    if not _has_native(graph):
        return graph
    cached = graph.cache.get(("pythonop", "expanded"))
    if cached is not None:
        return cached
    out = optimize(_expand(graph))
    graph.cache[("pythonop", "expanded")] = out
    return out


def _expand(graph: Graph) -> Graph:
    if not _has_native(graph):
        return graph
    consts = dict(graph.consts)
    nodes: list[Node] = []
    rename: dict[int, Var] = {}

    def r(v: Var | None) -> Var | None:
        return None if v is None else rename.get(id(v), v)

    for node in graph.nodes:
        ins = [r(v) for v in node.inputs]
        if node.op == FUNCTION:
            _inline(node, ins, nodes, consts, rename)
        elif node.op in MARKERS:
            rename[id(node.outputs[0])] = ins[0]
        elif node.op == LOOP:
            info = LoopInfo.of(node)
            body = _expand(info.body)
            nodes.append(make_loop(ins, list(node.outputs), replace(info, body=body)))
        elif ins != list(node.inputs):
            nodes.append(Node(node.op, ins, node.outputs, node.attrs))
        else:
            nodes.append(node)
    return Graph(list(graph.inputs), consts, nodes, [r(v) for v in graph.outputs])


def _inline(node: Node, ins: list, nodes: list[Node], consts: dict, rename: dict) -> None:
    fg = _expand(node.attrs["#forward"])
    m: dict[int, Var] = {id(fv): iv for fv, iv in zip(fg.inputs, ins, strict=True)}
    for ov, v in zip(node.outputs, inline_graph(fg, m, nodes, consts), strict=True):
        rename[id(ov)] = v

