"""Running PythonOp and PythonOpGrad nodes on arrays (:mod:`nbgrad.jit.trace.pythonop`):
the user's ``forward`` and ``backward`` called on private copies, with grad mode off and
no tracer, their results checked as eager mode checks them.

A node's :class:`RunPlan` keeps what does not change from call to call, and its ``run``:
a runner specialised to the node's common case (one tensor argument of the node's shape,
:func:`_forward_runner`, :func:`_backward_runner`) that takes the general path
(:func:`run_forward`, :func:`run_backward`) for anything else. Tier 1's eager step,
tier 2's call back (:func:`fallback_callable`) and segmented graphs
(:mod:`nbgrad.jit.segments`) run nodes through it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import dtypes
from ...autograd.function import FunctionCtx
from ...grad_mode import no_grad
from ...tensor import STATE_TRACE, Tensor, wrap_array
from .handles import _TLS, HANDLES, SelfHandle, own
from .ir import MARKERS, PYTHON_OP, PYTHON_OP_GRAD, Node
from .pythonop import (
    _check_outputs,
    _checker,
    output_list,
    replay_node,
    user_code,
)
from .pythonop_attrs import _needs_input_grad, rebuild_args

__all__ = ["RunPlan", "fallback_callable", "run_backward", "run_forward", "run_node",
           "run_plan"]

_INT64 = np.dtype(np.int64)


def run_node(node: Node, arrays: Sequence[np.ndarray | None],
             plan: RunPlan | None = None) -> list[np.ndarray]:
    """Run one node of these kinds on arrays, as the tier-1 interpreter's eager step and
    tier 2's call back into Python do (fresh output arrays). ``plan``: ``node``'s
    :func:`run_plan`, made once by a caller that runs the node many times."""
    if node.op in (PYTHON_OP, PYTHON_OP_GRAD):
        return (plan or RunPlan(node)).run(arrays)
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
                 "out_specs", "direct", "one_in", "one_out", "one_grad", "_own", "run")

    def __init__(self, node: Node) -> None:
        a = node.attrs
        self.node = node
        self._own = False
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
        #: ``run(arrays) -> arrays``: the node run on arrays (see the module doc)
        self.run = self._runner()

    @property
    def own(self) -> bool:
        """Whether a PythonOp's handle is its context itself, a :class:`SelfHandle` (set by
        :class:`~nbgrad.jit.segments.SegmentedExecutable` where that is right), rather than
        a table entry owned by the current owner scope or its array."""
        return self._own

    @own.setter
    def own(self, value: bool) -> None:
        self._own = value
        self.run = self._runner()

    def _runner(self) -> Callable[[Sequence], list[np.ndarray]]:
        return (_forward_runner if self.node.op == PYTHON_OP else _backward_runner)(self)


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


def _counts(t: Tensor) -> tuple[int, int]:
    d = t._data
    return _refcount(t), _refcount(d)


def _alone_in_runner() -> tuple[int, int]:
    raw = wrap_array(np.empty(4))
    return _counts(raw)


#: The reference counts of a tensor that user code returned, which the runner holds in one
#: local, and of its array, which only the tensor holds, as :func:`_alone_array` sees them:
#: measured in that shape, not assumed (CPython versions count differently).
_ALONE_T, _ALONE_D = _alone_in_runner()
if (_ALONE_T, _ALONE_D) != (3, 3) and sys.version_info < (3, 14):
    # more than the runner's local, the parameter and the call's argument (a tracer or
    # debugger that reads the frames' locals holds more): counts that would take arrays
    # something else holds, so nothing is taken (every result is copied)
    _ALONE_T = _ALONE_D = -1


def _alone_array(t: Any, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
    """The array of ``t``, a result of user code that the runner holds in one local, where
    it may be the graph's value as it is: a tensor of ``shape`` and ``dtype`` that nothing
    else holds (no saved tensor, view, returned input or kept array), whose array owns its
    C-contiguous, aligned, writeable memory; else None (copy: user code may keep, view or
    modify what it returned)."""
    if type(t) is not Tensor:
        return None
    d = t._data
    if d.shape == shape and d.dtype == dtype and _refcount(t) == _ALONE_T and \
            _refcount(d) == _ALONE_D:
        f = d.flags
        if f.owndata and f.carray:
            return d
    return None


def run_forward(plan: RunPlan, arrays: Sequence) -> list[np.ndarray]:
    """Run a PythonOp node (``plan``'s) on arrays: the user's ``forward`` on private
    copies, with a fresh ctx, no tracer and grad mode off; returns the handle
    (:func:`with_handle`) and the outputs (:func:`output_arrays`). Errors name the
    Function. (``plan.run``: see :func:`_forward_runner`.)"""
    return plan.run(arrays)


def _forward_args(plan: RunPlan, arrays: Sequence) -> list:
    """The arguments of a forward for ``arrays``, private copies (the general case)."""
    if len(arrays) != len(plan.in_specs):
        raise ValueError(f"PythonOp of {plan.name}: {len(arrays)} inputs, the node has "
                         f"{len(plan.in_specs)}")
    if plan.direct:  # _tensor_of(), inlined
        return [wrap_array(x.astype(dt) if type(x) is np.ndarray and x.shape == shape else
                           np.array(x, dtype=dt, copy=True).reshape(shape))
                for x, (shape, dt) in zip(arrays, plan.in_specs, strict=True)]
    args = plan.args.copy()
    for pos, x, spec in zip(plan.tensor_pos, arrays, plan.in_specs, strict=True):
        args[pos] = None if x is None else _tensor_of(x, spec)
    return args


def output_arrays(plan: RunPlan, raw: Any) -> list[np.ndarray]:
    """C-contiguous copies of the outputs of ``raw``, a forward's result, checked against
    the node."""
    outs = output_list(plan.cls, raw)
    _check_outputs(plan.cls, outs, plan.expect)
    return [o._data.copy() for o in outs]


def with_handle(plan: RunPlan, ctx: FunctionCtx, outs: list[np.ndarray]) -> list[np.ndarray]:
    """``[handle, *outs]``: ``ctx`` behind a new handle (a 0-d int64 array) owned by the
    current owner scope, else by the array (where ``plan.own``, the runner returns the
    context itself, a :class:`SelfHandle`, instead)."""
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
    ctx of the handle ``arrays[0]`` (:func:`context_of`) on private copies of the
    gradients (zeros for absent ones unless the ctx says otherwise), no tracer and grad
    mode off; returns :func:`gradient_arrays` (a one-gradient backward's own array where
    nothing else can reach it, :func:`_alone_array`). (``plan.run``: see
    :func:`_backward_runner`.)"""
    return plan.run(arrays)


def _backward_args(plan: RunPlan, arrays: Sequence) -> tuple[FunctionCtx, list]:
    """The context and gradient arguments of a backward for ``arrays`` (the general
    case)."""
    if len(arrays) != len(plan.in_specs):
        raise ValueError(f"PythonOpGrad of {plan.name}: {len(arrays)} inputs, the node has "
                         f"{len(plan.in_specs)}")
    ctx = context_of(plan, arrays[0])
    return ctx, _grad_tensors(plan, arrays, ctx)


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
        runner = plan.run

        def call_plan(*args):
            return tuple([r if r.shape == s and r.dtype == dt and r.flags.c_contiguous
                          else np.asarray(r, dtype=dt, order="C").reshape(s)
                          for r, (s, dt) in zip(runner(args), outs, strict=True)])

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


def context_of(plan: RunPlan, h: Any) -> FunctionCtx:
    """The context of a PythonOpGrad's handle ``h``: the context itself (a segmented
    forward's :class:`SelfHandle`), or a handle: an int from tier 2's code, a 0-d array
    from tier 1."""
    if type(h) is SelfHandle:
        return h
    return HANDLES.get(h if type(h) is int else h.item() if type(h) is np.ndarray and
                       h.size == 1 else int(np.asarray(h).reshape(())), plan.name)


# ------------------------------------------------------------------ the runners
def _forward_runner(plan: RunPlan) -> Callable[[Sequence], list[np.ndarray]]:
    """``plan.run`` of a PythonOp, with what it reads from ``plan`` bound (a PythonOp
    runs once per call of its graph): one tensor argument of the node's shape (the common
    case) is copied inline, anything else by :func:`_forward_args`; the user's code is
    called through :func:`~nbgrad.jit.trace.pythonop.user_code`."""
    cls, kwargs, needs, one_out = plan.cls, plan.kwargs, plan.needs_input_grad, plan.one_out
    forward = user_code(cls, "forward", cls.forward)
    shape, dtype = plan.one_in if plan.one_in is not None else (None, None)
    out_shape, out_dtype = one_out if one_out is not None else (None, None)
    make_ctx, own = (SelfHandle if plan.own else FunctionCtx), plan.own
    ndarray = np.ndarray

    def run(arrays: Sequence) -> list[np.ndarray]:
        if shape is not None and len(arrays) == 1 and type(x := arrays[0]) is ndarray \
                and x.shape == shape:
            args = (wrap_array(x.astype(dtype)),)  # a private copy (:func:`_tensor_of`)
        else:
            args = _forward_args(plan, arrays)
        ctx = make_ctx()
        ctx.needs_input_grad = needs
        raw = forward(ctx, *args, **kwargs)
        # the common case of output_arrays(): the array of a result alone
        d = _alone_array(raw, out_shape, out_dtype)
        outs = [d] if d is not None else output_arrays(plan, raw)
        # the handle leaves the run only as itself (own): the context is the handle
        return [ctx, *outs] if own else with_handle(plan, ctx, outs)

    return run


def _backward_runner(plan: RunPlan) -> Callable[[Sequence], list[np.ndarray]]:
    """``plan.run`` of a PythonOpGrad, with what it reads from ``plan`` bound: one
    gradient argument of the node's shape (the common case) is copied inline, anything
    else by :func:`_backward_args`; the user's code is called through
    :func:`~nbgrad.jit.trace.pythonop.user_code`."""
    cls, n, one_grad = plan.cls, len(plan.in_specs), plan.one_grad
    backward = user_code(cls, "backward", cls.backward)
    check = user_code(cls, "backward", plan.checker.check_gradients)
    shape, dtype = plan.one_in if plan.one_in is not None else (None, None)
    g_shape, g_dtype = one_grad if one_grad is not None else (None, None)
    ndarray = np.ndarray

    def run(arrays: Sequence) -> list[np.ndarray]:
        if shape is not None and len(arrays) == n and type(x := arrays[1]) is ndarray \
                and x.shape == shape:
            ctx = context_of(plan, arrays[0])
            grads = (wrap_array(x.astype(dtype)),)  # a private copy (:func:`_tensor_of`)
        else:
            ctx, grads = _backward_args(plan, arrays)
        result = backward(ctx, *grads)
        # the common case of check_gradients: the array of a result alone
        d = _alone_array(result, g_shape, g_dtype)
        if d is not None:
            return [d]
        checked = check(result)
        return gradient_arrays(plan, checked)

    return run
