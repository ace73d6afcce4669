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
addresses), the attribute values in :mod:`nbgrad.jit.trace.pythonop_attrs`. A graph's
top-level PythonOps run through :func:`run_forward` and :func:`run_backward` as Python
calls between native segments (:mod:`nbgrad.jit.segments`).

Errors raised by the user's ``forward`` or ``backward`` reach the caller as the original
exception, with the Function's name added to the message.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import dtypes
from ...autograd.function import BackwardFunction, FunctionCtx, _DelayedErrorNode, apply_function
from ...autograd.node import Node as AutogradNode
from ...autograd.node import gradient_edge
from ...errors import TracerError
from ...grad_mode import STATE, no_grad
from ...tensor import STATE_TRACE, Tensor, wrap_array
from .handles import _TLS, HANDLES, own
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

__all__ = ["PythonOpBackward", "RunPlan", "run_backward", "run_forward", "run_node"]

_CTX_FIELDS = frozenset(vars(FunctionCtx()))
_INT64 = np.dtype(np.int64)


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
    None); an exception gets the Function's name."""
    prev = STATE_TRACE.tracer
    STATE_TRACE.tracer = None
    prev_grad = STATE.grad_enabled
    if grad is not None:
        STATE.grad_enabled = grad
    try:
        return fn(*args, **kwargs)
    except TracerError:
        raise
    except Exception as exc:
        annotate(exc, cls, what)
        raise
    finally:
        STATE.grad_enabled = prev_grad
        STATE_TRACE.tracer = prev


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
def run_node(node: Node, arrays: Sequence[np.ndarray | None],
             plan: RunPlan | None = None) -> list[np.ndarray]:
    """Run one node of these kinds on arrays, as the tier-1 interpreter's eager step and
    tier 2's call back into Python do (fresh output arrays). ``plan``: ``node``'s
    :func:`run_plan`, made once by a caller that runs the node many times."""
    if node.op == PYTHON_OP:
        return run_forward(plan or RunPlan(node), arrays)
    if node.op == PYTHON_OP_GRAD:
        return run_backward(plan or RunPlan(node), arrays)
    if node.op in MARKERS:
        return [np.array(arrays[0], copy=True)]
    tensors = [None if a is None else Tensor._make(np.array(a, dtype=v.dtype, copy=True)
                                                   .reshape(v.shape))
               for a, v in zip(arrays, node.inputs, strict=True)]
    prev = STATE_TRACE.tracer
    STATE_TRACE.tracer = None
    try:
        with no_grad():
            outs = replay_node(node, tensors)
    finally:
        STATE_TRACE.tracer = prev
    return [np.array(t._data, copy=True) for t in outs]


class RunPlan:
    """What running a PythonOp or PythonOpGrad node on arrays needs that does not change
    from call to call (read from the node once)."""

    __slots__ = ("node", "cls", "name", "in_specs", "args", "tensor_pos", "kwargs",
                 "needs_input_grad", "expect", "checker", "n", "grad_specs", "zero_specs",
                 "out_specs", "direct", "one_in", "one_out", "one_grad", "own")

    def __init__(self, node: Node) -> None:
        a = node.attrs
        self.node = node
        #: a PythonOp's handle is owned by its array from the start (set by
        #: :class:`~nbgrad.jit.segments.SegmentedExecutable` where that is right), else by
        #: the current owner scope
        self.own = False
        self.cls = a["#fn"].fn
        self.name = a["name"]
        self.in_specs = [None if v is None else (v.shape, dtypes.canonical(v.dtype))
                         for v in node.inputs]
        if node.op == PYTHON_OP:
            args, self.kwargs = rebuild_args(a, [None] * len(node.inputs))
            self.args = list(args)
            self.tensor_pos = [i for i, c in enumerate(a["input_convention"]) if c == "d"]
            self.needs_input_grad = _needs_input_grad(a)
            self.expect = node.outputs[1:]
            #: every argument a tensor (present), no keywords: ``forward(ctx, *tensors)``
            self.direct = (len(self.tensor_pos) == len(self.args) and not self.kwargs
                           and None not in self.in_specs)
            #: the (shape, dtype) of the one tensor argument (of a direct call), else None
            self.one_in = self.in_specs[0] if self.direct and len(self.args) == 1 else None
            #: the (shape, dtype) of the one output, else None
            self.one_out = ((self.expect[0].shape, self.expect[0].dtype)
                            if len(self.expect) == 1 else None)
        else:
            self.n = n = len(a["input_tensor_types"])
            self.grad_specs = self.in_specs[1:1 + n]
            #: the (shape, dtype) of the one gradient argument, else None
            self.one_in = self.grad_specs[0] if n == 1 else None
            self.zero_specs = [(v.shape, dtypes.canonical(v.dtype))
                               for v in node.inputs[1 + n:1 + 2 * n]]
            self.checker = _checker(node, None)
            it = iter(node.outputs)
            self.out_specs = [(next(it), k) for k, r in
                              enumerate(a["output_tensor_requires_grads"]) if r]
            #: one tensor argument, which requires grad: the (shape, dtype) its gradient
            #: must have to pass ``check_gradients`` unchanged, else None
            self.one_grad = ((self.out_specs[0][0].shape, self.out_specs[0][0].dtype)
                             if a["output_convention"] == "d" and len(self.out_specs) == 1
                             else None)


def run_plan(node: Node) -> RunPlan | None:
    """The :class:`RunPlan` of a PythonOp or PythonOpGrad node (None for other kinds)."""
    return RunPlan(node) if node.op in (PYTHON_OP, PYTHON_OP_GRAD) else None


def _tensor_of(arr, spec: tuple) -> Tensor:
    """A private copy of ``arr`` (user code may keep or modify it) as a tensor."""
    if type(arr) is np.ndarray and arr.shape == spec[0]:
        # astype copies and gives ``spec``'s dtype object: arrays made by cached Numba code
        # have equal but unpickled dtype objects, which the eager lean path (an identity
        # test) would send down the general path
        return wrap_array(arr.astype(spec[1]))
    return wrap_array(np.array(arr, dtype=spec[1], copy=True).reshape(spec[0]))


_refcount = sys.getrefcount


def _probe(t: Tensor) -> tuple[int, int]:
    d = t._data
    return _refcount(t), _refcount(d)


def _alone_counts() -> tuple[int, int]:
    t = wrap_array(np.empty(4))
    return _probe(t)


#: the reference counts of a tensor that one local of its caller holds and of its array,
#: which only the tensor holds, as :func:`_take` sees them (measured in the same shape,
#: :func:`_probe`, not assumed: CPython versions count differently)
_ALONE_T, _ALONE_D = _alone_counts()


def _take(t: Tensor) -> np.ndarray:
    """The data of ``t``, which user code returned and the caller holds in one local, as a
    value of the graph: the array itself where nothing else can reach it or its memory
    (no other holder of ``t`` or of the array, which owns its C-contiguous, aligned,
    writeable memory: a view or a saved tensor counts as a holder), else a C-contiguous
    copy (user code may keep, view or modify what it returned)."""
    d = t._data
    if _refcount(t) == _ALONE_T and _refcount(d) == _ALONE_D:
        f = d.flags
        if f.owndata and f.carray:
            return d
    return d.copy()


def run_forward(plan: RunPlan, arrays: Sequence) -> list[np.ndarray]:
    """Run a PythonOp node (``plan``'s) on arrays: the user's ``forward`` on private
    copies, with a fresh ctx, no tracer and grad mode off; returns the handle (0-d int64)
    and the outputs: C-contiguous copies, or a one-output forward's own array where
    nothing else can reach it (:func:`_take`). Errors name the Function."""
    cls = plan.cls
    if len(arrays) != len(plan.in_specs):
        raise ValueError(f"PythonOp of {plan.name}: {len(arrays)} inputs, the node has "
                         f"{len(plan.in_specs)}")
    one = plan.one_in
    if one is not None and type(x := arrays[0]) is np.ndarray and x.shape == one[0]:
        args = [wrap_array(x.astype(one[1]))]  # the common case of _tensor_of()
    elif plan.direct:  # _tensor_of(), inlined (a call of this runs per PythonOp per call)
        args = [wrap_array(x.astype(dt) if type(x) is np.ndarray and x.shape == shape else
                           np.array(x, dtype=dt, copy=True).reshape(shape))
                for x, (shape, dt) in zip(arrays, plan.in_specs, strict=True)]
    else:
        args = plan.args.copy()
        for pos, x, spec in zip(plan.tensor_pos, arrays, plan.in_specs, strict=True):
            args[pos] = None if x is None else _tensor_of(x, spec)
    ctx = FunctionCtx()
    ctx.needs_input_grad = plan.needs_input_grad
    # user_call(), inlined
    trace, grad = STATE_TRACE, STATE
    prev, prev_grad = trace.tracer, grad.grad_enabled
    trace.tracer = None
    grad.grad_enabled = False
    try:
        raw = cls.forward(ctx, *args, **plan.kwargs) if plan.kwargs else \
            cls.forward(ctx, *args)
    except TracerError:
        raise
    except Exception as exc:
        annotate(exc, cls, "forward")
        raise
    finally:
        grad.grad_enabled = prev_grad
        trace.tracer = prev
    one = plan.one_out
    if one is not None and type(raw) is Tensor and raw._data.shape == one[0] and \
            raw._data.dtype == one[1]:
        outs = [_take(raw)]  # the common case of output_arrays()
    else:
        outs = output_arrays(plan, raw)
    return with_handle(plan, ctx, outs)


def output_arrays(plan: RunPlan, raw: Any) -> list[np.ndarray]:
    """C-contiguous copies of the outputs of ``raw``, a forward's result, checked against
    the node."""
    outs = output_list(plan.cls, raw)
    _check_outputs(plan.cls, outs, plan.expect)
    return [o._data.copy() for o in outs]


def with_handle(plan: RunPlan, ctx: FunctionCtx, outs: list[np.ndarray]) -> list[np.ndarray]:
    """``[handle, *outs]``: ``ctx`` behind a new handle (a 0-d int64 array), owned by that
    array (``plan.own``), else by the current owner scope, else by the array."""
    if plan.own:  # the array owns the handle (it leaves the run only as itself)
        return [HANDLES.owned(ctx, plan.name), *outs]
    h = HANDLES.register(ctx, plan.name)
    harr = np.array(h, _INT64)
    if (scope := getattr(_TLS, "scope", None)) is not None:  # own(), inlined
        scope.created.append(h)
    else:
        own(h, harr)
    return [harr, *outs]


def _grad_tensors(plan: RunPlan, arrays: Sequence, ctx: FunctionCtx) -> list:
    """The gradient arguments of a backward: private copies of ``arrays[1:1 + n]``, zeros
    for absent ones unless ``ctx`` says otherwise (None then)."""
    grads = []
    for x, spec, zero in zip(arrays[1:1 + plan.n], plan.grad_specs, plan.zero_specs,
                             strict=True):
        if x is not None and spec is not None:
            grads.append(_tensor_of(x, spec))
        elif ctx.materialize_grads:
            grads.append(wrap_array(np.zeros(*zero)))
        else:
            grads.append(None)
    return grads


def run_backward(plan: RunPlan, arrays: Sequence) -> list[np.ndarray]:
    """Run a PythonOpGrad node (``plan``'s) on arrays: the user's ``backward`` with the
    ctx of the handle ``arrays[0]`` on private copies of the gradients (zeros for absent
    ones unless the ctx says otherwise), its result checked as eager mode does; returns
    copies of the gradients of the inputs that require grad (a one-gradient backward's
    own array where nothing else can reach it, :func:`_take`)."""
    cls = plan.cls
    if len(arrays) != len(plan.in_specs):
        raise ValueError(f"PythonOpGrad of {plan.name}: {len(arrays)} inputs, the node has "
                         f"{len(plan.in_specs)}")
    h = arrays[0]  # tier 2 passes the handle as an int, tier 1 as a 0-d array
    ctx = HANDLES.get(h if type(h) is int else h.item() if type(h) is np.ndarray and
                      h.size == 1 else int(np.asarray(h).reshape(())), plan.name)
    one = plan.one_in
    if one is not None and type(x := arrays[1]) is np.ndarray and x.shape == one[0]:
        grads = [wrap_array(x.astype(one[1]))]  # the common case of the loop below
    else:
        grads = _grad_tensors(plan, arrays, ctx)
    # user_call(), inlined
    trace, grad = STATE_TRACE, STATE
    prev, prev_grad = trace.tracer, grad.grad_enabled
    trace.tracer = None
    grad.grad_enabled = False
    try:
        result = cls.backward(ctx, *grads)
        one = plan.one_grad
        if one is not None and type(result) is Tensor and result._data.shape == one[0] \
                and result._data.dtype == one[1]:
            return [_take(result)]  # the common case of check_gradients
        checked = plan.checker.check_gradients(result)
    except TracerError:
        raise
    except Exception as exc:
        annotate(exc, cls, "backward")
        raise
    finally:
        grad.grad_enabled = prev_grad
        trace.tracer = prev
    return gradient_arrays(plan, checked)


def gradient_arrays(plan: RunPlan, checked: list) -> list[np.ndarray]:
    """What :func:`run_backward` returns for the gradients ``checked`` (by
    ``check_gradients``): copies of those of the inputs that require grad (zeros for
    None)."""
    outs = []
    for v, k in plan.out_specs:
        g = checked[k]
        if g is None:
            outs.append(np.zeros(v.shape, v.dtype))
            continue
        a = g._data  # checked: v's shape and dtype
        outs.append(a.copy() if a.shape == v.shape and a.dtype == v.dtype else
                    np.array(a, dtype=v.dtype, copy=True).reshape(v.shape))
    return outs


def fallback_callable(node: Node) -> Callable:
    """What tier 2's generated code calls back (through ``objmode``) to run ``node``:
    arrays of the present inputs in, a tuple of output arrays (0-d as 1 element) out."""
    specs = [None if v is None else (v.shape, v.dtype) for v in node.inputs]
    outs = [(v.shape if v.shape else (1,), v.dtype) for v in node.outputs]
    plan = run_plan(node)
    if plan is not None and None not in specs:
        # the common case: every input present, the plan's runner called directly (it
        # copies what it hands to user code and returns fresh arrays of the node's dtypes)
        runner = run_forward if node.op == PYTHON_OP else run_backward

        def call_plan(*args):
            return tuple([r if r.shape == s and r.dtype == dt and r.flags.c_contiguous
                          else np.asarray(r, dtype=dt, order="C").reshape(s)
                          for r, (s, dt) in zip(runner(plan, args), outs, strict=True)])

        call_plan.__name__ = f"callback_{node.op}"
        return call_plan

    def call(*args):
        it = iter(args)
        if plan is None:
            values = [None if s is None else np.asarray(next(it), dtype=s[1]).reshape(s[0])
                      for s in specs]
        else:  # the plan's runners convert (and copy) what they use
            values = [None if s is None else next(it) for s in specs]
        results = run_node(node, values, plan)
        # run_node returns fresh arrays: copy only to fix a dtype or layout
        return tuple(np.asarray(r, dtype=dt, order="C").reshape(s)
                     for r, (s, dt) in zip(results, outs, strict=True))

    call.__name__ = f"callback_{node.op}"
    return call


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
