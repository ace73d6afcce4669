"""PythonOp and PythonOpGrad: custom ``autograd.Function``s that run Python inside a graph.

A custom Function whose forward or backward cannot be traced into nbgrad ops (it calls
``x.numpy()``, SciPy, legacy NumPy code...) becomes two graph nodes, modelled on ONNX
Runtime's ``com.microsoft`` PythonOp and PythonOpGrad:

``PythonOp``
    inputs: the Function's tensor arguments; outputs: an int64 context handle, then the
    Function's outputs. Attributes (ONNX Runtime's names): ``name`` (the qualified name),
    ``input_convention`` (``'d'`` tensor, ``'c'`` other, per argument),
    ``input_requires_grads``, ``input_tensor_types`` (ONNX type codes),
    ``input_tensor_ranks``, the non-tensor arguments by kind and position
    (``input_int_scalars``/``..._positions``, ``input_float_scalars``/``..._positions``,
    ``input_int_tuples``/``..._positions``/``..._begins``, the same for float tuples, and
    ``input_pointer_scalars``/``..._positions`` for any other object, kept by reference),
    ``output_tensor_types``, ``output_tensor_ranks``, ``output_tensor_requires_grads``,
    ``training_mode`` and ``inplace``. Running it calls the user's ``forward`` with a
    fresh ctx, stored in the handle table.
``PythonOpGrad``
    inputs: the context handle, the N output gradients (``None`` where no gradient
    arrives; materialised as zeros unless ``ctx.set_materialize_grads(False)``) and the N
    forward outputs (a control dependency on the forward); outputs: the gradients of the
    tensor inputs that require grad. Attributes: ``name``, ``output_convention``,
    ``input_tensor_types``/``ranks``/``requires_grads`` (the gradient inputs),
    ``output_tensor_types``/``ranks``/``requires_grads`` (per forward tensor input). It
    calls the user's ``backward`` with the saved ctx and checks what it returns as eager
    mode does (wrong count or shape raise the same errors).

Context handles live in :mod:`nbgrad.jit.trace.handles` (a counter-keyed table, never
addresses), the attribute values in :mod:`nbgrad.jit.trace.pythonop_attrs`; the nodes
run on arrays through :mod:`nbgrad.jit.trace.pythonop_run` (a graph's top-level
PythonOps as Python calls between native segments, :mod:`nbgrad.jit.segments`).

Errors raised by the user's ``forward`` or ``backward`` reach the caller as the original
exception, with the Function's name added to the message.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...autograd.function import BackwardFunction, FunctionCtx, _DelayedErrorNode, apply_function
from ...autograd.node import Node as AutogradNode
from ...autograd.node import gradient_edge
from ...errors import TracerError
from ...grad_mode import STATE
from ...tensor import STATE_TRACE, Tensor
from .handles import HANDLES, own
from .ir import (
    MARKERS,
    ONCE_DIFFERENTIABLE,
    PYTHON_OP,
    PYTHON_OP_GRAD,
    Node,
    Var,
    check,
    type_str,
)
from .pythonop_attrs import (  # noqa: F401 - the node attributes, used from here too
    ONNX_TYPES,
    FnRef,
    ObjRef,
    _needs_input_grad,
    argument_attrs,
    fn_ref,
    kwargs_attr,
    obj_ref,
    onnx_type,
    qualified_name,
    rebuild_args,
)
from .tracer import stop_gradient

__all__ = ["PythonOpBackward", "check_node", "replay_node", "trace_python_op"]

_CTX_FIELDS = FunctionCtx.FIELDS


# ------------------------------------------------------------------ calling user code
def function_label(cls: type, what: str) -> str:
    return f"{cls.__qualname__}.{what}"


def annotate(exc: BaseException, cls: type, what: str) -> None:
    """Name the Function in an exception raised by its user code (type unchanged)."""
    if getattr(exc, "_nbgrad_function", False):
        return
    label = function_label(cls, what)
    try:
        exc._nbgrad_function = True  # type: ignore[attr-defined]
    except AttributeError:
        pass
    if cls.__name__ in str(exc):
        return
    if len(exc.args) == 1 and isinstance(exc.args[0], str):
        exc.args = (f"{label}: {exc.args[0]}",)
    elif not exc.args:
        exc.args = (label,)
    if label not in str(exc):  # a message not made from args
        exc.add_note(f"(raised in {label}, a custom autograd.Function called inside "
                     "nbgrad.jit)")


def user_call(cls: type, what: str, fn: Callable, *args: Any, grad: bool | None = False,
              **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with no tracer installed (and grad mode ``grad`` unless
    None); an exception gets the Function's name (:func:`call_user_code`)."""
    return call_user_code(cls, what, fn, args, kwargs, grad)


_NO_KWARGS: dict = {}


def call_user_code(cls: type, what: str, fn: Callable, args: tuple,
                   kwargs: dict = _NO_KWARGS, grad: bool | None = False) -> Any:
    """``fn(*args, **kwargs)``, user code of the Function ``cls`` (or a check of what it
    returned), as :func:`user_code` calls it. :func:`user_call` with the arguments as a
    tuple and a dict (no keyword of theirs can clash)."""
    return user_code(cls, what, fn, grad)(*args, **kwargs)


def user_code(cls: type, what: str, fn: Callable, grad: bool | None = False
              ) -> Callable[..., Any]:
    """``fn``, user code of the Function ``cls`` (or a check of what it returned), as it is
    called: with no tracer installed and grad mode ``grad`` (unless None); an exception
    gets the Function's name (:func:`annotate`; a TracerError is nbgrad's own). The
    runners of a PythonOp, which runs once per call of its graph, make it once."""
    trace, state = STATE_TRACE, STATE

    def call(*args: Any, **kwargs: Any) -> Any:
        prev, prev_grad = trace.tracer, state.grad_enabled
        trace.tracer = None
        if grad is not None:
            state.grad_enabled = grad
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not isinstance(exc, TracerError):
                annotate(exc, cls, what)
            raise
        finally:
            state.grad_enabled = prev_grad
            trace.tracer = prev

    return call


def output_list(cls: type, raw: Any) -> list[Tensor]:
    """The outputs of a forward as a list of tensors (anything else is a TracerError)."""
    outs = list(raw) if isinstance(raw, tuple) else [raw]
    for k, o in enumerate(outs):
        if not isinstance(o, Tensor):
            raise TracerError(f"{cls.__qualname__}.forward returned a {type(o).__name__} as "
                              f"output {k}; inside nbgrad.jit the outputs of a custom "
                              "Function must be tensors")
    return outs


def _check_outputs(cls: type, outs: list[Tensor], expect: Sequence[Var]) -> None:
    name = cls.__qualname__
    if len(outs) != len(expect):
        raise RuntimeError(f"{name}.forward returned {len(outs)} outputs, but the graph traced "
                           f"by nbgrad.jit expects {len(expect)}")
    for k, (o, v) in enumerate(zip(outs, expect, strict=True)):
        if o._data.shape != v.shape or o._data.dtype != v.dtype:
            raise RuntimeError(
                f"{name}.forward returned {o.dtype.name}{list(o.shape)} as output {k}, but "
                f"the graph traced by nbgrad.jit expects {type_str(v)}; inside nbgrad.jit the "
                "shapes and dtypes of a custom Function's outputs must not depend on values")


def _dirty(cls: type, ctx: FunctionCtx) -> None:
    if ctx.dirty_tensors:
        raise TracerError(f"{cls.__qualname__}.forward modifies an input in place "
                          "(ctx.mark_dirty); in-place custom Functions are not supported "
                          "inside nbgrad.jit")


def _handle_tensor(ctx: FunctionCtx, cls: type, by_array: bool) -> Tensor:
    h = HANDLES.register(ctx, qualified_name(cls))
    arr = np.asarray(h, np.int64)
    own(h, arr, by_array)
    return Tensor._make(arr)


def _zeros(v: Var | tuple) -> Tensor:
    shape, dtype = (v.shape, v.dtype) if isinstance(v, Var) else v
    return Tensor._make(np.zeros(shape, dtype))


# ------------------------------------------------------------------ the autograd node
class PythonOpBackward(BackwardFunction):
    """The eager autograd node of a PythonOp: calls the user's ``backward`` without a
    tracer; while tracing, records a PythonOpGrad node for the call."""

    __slots__ = ("record",)

    def __init__(self, fn_cls: type, ctx: FunctionCtx, edges: list) -> None:
        super().__init__(fn_cls, ctx, edges)
        #: while tracing: (weak reference to the handle array, output arrays, PythonOp
        #: attrs). Weak: the table holds the ctx, which holds this node; a strong reference
        #: would keep the handle array, the owner of the table entry, alive for ever.
        self.record = None

    def apply(self, grads: list, create_graph: bool) -> list:
        tracer = STATE_TRACE.tracer
        result = user_call(self.fn_cls, "backward", BackwardFunction.apply, self, grads,
                           create_graph, grad=None)
        if tracer is None or self.record is None:
            return result
        handle_ref, out_arrays, fattrs = self.record
        harr = handle_ref()
        if harr is None:
            raise TracerError(f"{self.fn_cls.__qualname__}: the backward of a PythonOp is "
                              "traced after the trace that recorded its forward ended")
        handle = Tensor._make(harr)
        n = len(out_arrays)
        g_in = [grads[k] if k < len(grads) else None for k in range(n)]
        acts = [Tensor._make(a) for a in out_arrays]
        req = [e is not None for e in self.next_edges]
        return _record_grad(tracer, self.fn_cls, fattrs, handle, g_in, acts, req, result,
                            self.input_meta, create_graph)


class _NoTracedDoubleBackward(AutogradNode):
    """Stands for the backward of a PythonOpGrad recorded while tracing: raises if reached."""

    __slots__ = ("fn_name",)

    def __init__(self, fn_name: str, edges: list) -> None:
        super().__init__(edges)
        self.fn_name = fn_name

    def apply(self, grads: list, create_graph: bool) -> list:
        raise TracerError(
            f"differentiating the backward of {self.fn_name} inside nbgrad.jit is not "
            "supported: it is a PythonOp (a custom Function whose code runs in Python). "
            "Take higher-order gradients outside the jitted function, or write the "
            "Function with nbgrad ops so that it compiles")


def _record_grad(tracer, cls: type, fattrs: dict, handle: Tensor, g_in: list, acts: list,
                 req: list[bool], result: list, input_meta: list, create_graph: bool) -> list:
    """Record one PythonOpGrad node for a backward call that already ran."""
    in_vars = [tracer.var_of(handle)] + [None if g is None else tracer.var_of(g)
                                         for g in g_in] + [tracer.var_of(a) for a in acts]
    outs = []
    for k, r in enumerate(req):
        if r:
            g = result[k]
            arr = np.zeros(*input_meta[k]) if g is None else np.array(g._data, copy=True)
            outs.append(Tensor._make(arr))
    attrs = grad_attrs(cls, fattrs, g_in, acts, req, outs)
    tracer.add_node(Node(PYTHON_OP_GRAD, in_vars, [Var(t._data.shape, t._data.dtype)
                                                   for t in outs], attrs), outs)
    new = list(result)
    it = iter(outs)
    for k, r in enumerate(req):
        if not r:
            continue
        t = next(it)
        g = result[k]
        if create_graph and g is not None and g._requires_grad:
            t._requires_grad = True
            t.grad_fn = _NoTracedDoubleBackward(cls.__qualname__, [gradient_edge(g)])
        new[k] = t
    return new


# ------------------------------------------------------------------ node attributes
def python_op_attrs(cls: type, args: Sequence[Any], kwargs: dict, outs: list[Tensor],
                    node: BackwardFunction | None) -> dict[str, Any]:
    tensors = [a for a in args if isinstance(a, Tensor)]
    grad = STATE.grad_enabled
    attrs: dict[str, Any] = {"name": qualified_name(cls)}
    arg = argument_attrs(args)
    attrs["input_convention"] = arg.pop("input_convention")
    attrs["input_requires_grads"] = tuple(int(grad and t._requires_grad) for t in tensors)
    attrs["input_tensor_types"] = tuple(onnx_type(t.dtype) for t in tensors)
    attrs["input_tensor_ranks"] = tuple(t.ndim for t in tensors)
    attrs.update(arg)
    attrs["output_tensor_types"] = tuple(onnx_type(o.dtype) for o in outs)
    attrs["output_tensor_ranks"] = tuple(o.ndim for o in outs)
    attrs["output_tensor_requires_grads"] = tuple(
        int(node is not None and o.grad_fn is node) for o in outs)
    attrs["training_mode"] = int(node is not None)
    attrs["inplace"] = 0
    attrs["#fn"] = fn_ref(cls)
    if kwargs:
        attrs["#kwargs"] = kwargs_attr(kwargs)
    return attrs


def grad_attrs(cls: type, fattrs: dict, g_in: list, acts: list, req: list[bool],
               outs: list[Tensor]) -> dict[str, Any]:
    return {"name": fattrs["name"],
            "output_convention": fattrs["input_convention"],
            "input_tensor_types": tuple(onnx_type(a.dtype) for a in acts),
            "input_tensor_ranks": tuple(a.ndim for a in acts),
            "input_tensor_requires_grads": tuple(int(g is not None) for g in g_in),
            "output_tensor_types": tuple(onnx_type(t.dtype) for t in outs),
            "output_tensor_ranks": tuple(t.ndim for t in outs),
            "output_tensor_requires_grads": tuple(int(r) for r in req),
            "#fn": fattrs["#fn"]}


# ------------------------------------------------------------------ tracing
def trace_python_op(tracer, cls: type, args: tuple, kwargs: dict) -> Any:
    """Run ``cls`` eagerly (no tracer) and record it into ``tracer`` as a PythonOp node."""
    return _trace_python_op(tracer, cls, args, kwargs)[0]


def _trace_python_op(tracer, cls: type, args: tuple, kwargs: dict) -> tuple[Any, list]:
    ctx = FunctionCtx()
    raw = user_call(cls, "forward", apply_function, cls, args, kwargs, ctx, PythonOpBackward,
                    grad=None)
    outs = output_list(cls, raw)
    _dirty(cls, ctx)
    node = ctx._node
    handle = _handle_tensor(ctx, cls, by_array=True)
    attrs = python_op_attrs(cls, args, kwargs, outs, node)
    in_vars = [tracer.use(a) for a in args if isinstance(a, Tensor)]
    out_vars = [Var((), np.int64)] + [Var(o._data.shape, o._data.dtype) for o in outs]
    tracer.add_node(Node(PYTHON_OP, in_vars, out_vars, attrs), [handle] + outs)
    if node is not None:
        node.record = (weakref.ref(handle._data), [o._data for o in outs], attrs)
    return raw, [handle] + outs


# ------------------------------------------------------------------ replay (eager tensors)
def replay_node(node: Node, values: list) -> list:
    """Run one node of these kinds on tensors (the reference semantics; records the node
    when a tracer is installed)."""
    if node.op == PYTHON_OP:
        return _replay_forward(node, values)
    if node.op == PYTHON_OP_GRAD:
        return _replay_backward(node, values)
    if node.op == ONCE_DIFFERENTIABLE:
        return [mark_once(values[0], node.attrs["name"])]
    if node.op in MARKERS:  # StopGradient
        return [stop_gradient(values[0], node.attrs.get("keep_tangent", False))]
    from .function_trace import replay_function  # cyclic: function_trace builds PythonOps
    return replay_function(node, values)


def _replay_forward(node: Node, values: list) -> list[Tensor]:
    cls = node.attrs["#fn"].fn
    args, kwargs = rebuild_args(node.attrs, values)
    tracer = STATE_TRACE.tracer
    if tracer is not None:
        outs = _trace_python_op(tracer, cls, args, kwargs)[1]
        _check_outputs(cls, outs[1:], node.outputs[1:])
        return outs
    ctx = FunctionCtx()
    raw = user_call(cls, "forward", apply_function, cls, args, kwargs, ctx, PythonOpBackward,
                    grad=None)
    outs = output_list(cls, raw)
    _check_outputs(cls, outs, node.outputs[1:])
    return [_handle_tensor(ctx, cls, by_array=False)] + outs


def _grad_inputs(node: Node, values: list, ctx: FunctionCtx) -> tuple[list, list]:
    n = len(node.attrs["input_tensor_types"])
    acts = values[1 + n:1 + 2 * n]
    grads = []
    for k in range(n):
        g = values[1 + k]
        if g is None and ctx.materialize_grads:
            g = _zeros(node.inputs[1 + n + k])
        grads.append(g)
    return grads, acts


def _checker(node: Node, ctx: FunctionCtx | None) -> BackwardFunction:
    """A BackwardFunction that checks returned gradients exactly as eager mode does."""
    a = node.attrs
    cls = a["#fn"].fn
    req = a["output_tensor_requires_grads"]
    b = BackwardFunction(cls, ctx, [(None, 0) if r else None for r in req])
    b.arg_is_tensor = tuple(c == "d" for c in a["output_convention"])
    it = iter(node.outputs)
    meta = []
    for r in req:
        if r:
            v = next(it)
            meta.append((v.shape, v.dtype))
        else:
            meta.append(((), np.dtype(np.float64)))
    b.input_meta = meta
    return b


def _replay_backward(node: Node, values: list) -> list[Tensor]:
    a = node.attrs
    cls = a["#fn"].fn
    handle = values[0]
    ctx = HANDLES.get(int(np.asarray(handle._data).reshape(())), a["name"])
    grads, acts = _grad_inputs(node, values, ctx)
    result = user_call(cls, "backward", cls.backward, ctx, *grads, grad=None)
    checked = user_call(cls, "backward", _checker(node, ctx).check_gradients, result,
                        grad=None)
    req = a["output_tensor_requires_grads"]
    tracer = STATE_TRACE.tracer
    if tracer is not None:
        meta = [(v.shape, v.dtype) for v in node.outputs]
        it = iter(meta)
        input_meta = [next(it) if r else ((), np.float64) for r in req]
        fattrs = {"name": a["name"], "input_convention": a["output_convention"],
                  "#fn": a["#fn"]}
        n = len(a["input_tensor_types"])
        g_in = [values[1 + k] for k in range(n)]
        out = _record_grad(tracer, cls, fattrs, handle, g_in, acts, [bool(r) for r in req],
                           checked, input_meta, STATE.grad_enabled)
        return [out[k] for k, r in enumerate(req) if r]
    outs = []
    it = iter(node.outputs)
    for k, r in enumerate(req):
        if r:
            v = next(it)
            g = checked[k]
            outs.append(_zeros(v) if g is None else g)
    return outs


def mark_once(x: Tensor, name: str) -> Tensor:
    """The OnceDifferentiable marker: ``x`` itself, whose double backward raises."""
    tracer = STATE_TRACE.tracer
    if tracer is not None:
        v = tracer.lookup(x)
        if v is not None and tracer.is_dynamic(v):
            t = Tensor._make(np.array(x._data, copy=True), requires_grad=x._requires_grad,
                             grad_fn=x.grad_fn, output_nr=x._output_nr)
            tracer.add_node(Node(ONCE_DIFFERENTIABLE, [v], [v.like()], {"name": name}), [t])
            x = t
    if STATE.grad_enabled and x._requires_grad:
        return Tensor._make(x._data, requires_grad=True,
                            grad_fn=_DelayedErrorNode(name, [gradient_edge(x)]))
    return x


# ------------------------------------------------------------------ run (arrays)
def check_node(node: Node, where: str) -> None:
    """Raise ``TracerError`` unless a node of these kinds is well formed."""
    a = node.attrs
    if node.op in MARKERS:
        if len(node.inputs) != 1 or len(node.outputs) != 1 or node.inputs[0] is None or \
                node.inputs[0].shape != node.outputs[0].shape or \
                node.inputs[0].dtype != node.outputs[0].dtype:
            raise TracerError(f"ill-formed graph: {where}: a marker maps one value to one of "
                              "the same type")
        return
    for key in ("name", "#fn"):
        if key not in a:
            raise TracerError(f"ill-formed graph: {where} lacks attribute {key!r}")
    if node.op == PYTHON_OP_GRAD:
        n = len(a["input_tensor_types"])
        if len(node.inputs) != 1 + 2 * n or node.inputs[0] is None:
            raise TracerError(f"ill-formed graph: {where} has {len(node.inputs)} inputs, "
                              f"expected the handle, {n} gradients and {n} outputs")
        if len(node.outputs) != sum(a["output_tensor_requires_grads"]):
            raise TracerError(f"ill-formed graph: {where}: one output per input requiring "
                              "grad expected")
        return
    n_in = a["input_convention"].count("d")
    if len(node.inputs) != n_in:
        raise TracerError(f"ill-formed graph: {where} has {len(node.inputs)} inputs, its "
                          f"input_convention {a['input_convention']!r} has {n_in} tensors")
    n_out = len(a["output_tensor_types"])
    if node.op == PYTHON_OP:
        h = node.outputs[0] if node.outputs else None
        if h is None or h.shape != () or h.dtype != np.int64 or len(node.outputs) != 1 + n_out:
            raise TracerError(f"ill-formed graph: {where}: outputs are an int64 handle and "
                              f"{n_out} tensors")
        return
    body = a["#forward"]
    if len(body.inputs) != n_in or len(body.outputs) != len(node.outputs):
        raise TracerError(f"ill-formed graph: {where}: its forward graph does not match")
    for v, b in zip(node.outputs, body.outputs, strict=True):
        if v.shape != b.shape or v.dtype != b.dtype:
            raise TracerError(f"ill-formed graph: {where}: output {type_str(v)} differs from "
                              f"its forward's {type_str(b)}")
    check(body)
