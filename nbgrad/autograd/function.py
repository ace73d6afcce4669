"""Custom differentiable functions: ``nbgrad.autograd.Function`` with PyTorch's ctx API."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np

from ..grad_mode import STATE, no_grad
from ..ops import sum_to, to_dtype
from ..tensor import STATE_TRACE, Tensor
from . import forward
from .node import RETAIN_GRAPH_MESSAGE, Node, SavedOutput, SavedTensor, gradient_edge

_FLOAT64 = np.dtype(np.float64)
#: ``ctx._node`` once the node released its saved tensors (not None: reading them raises)
_RELEASED = object()
_NONE_MARKED: frozenset[int] = frozenset()


class FunctionCtx:
    """The ``ctx`` object passed to ``forward`` and ``backward``.

    Its own fields start as the class's defaults (immutable values; an instance sets one
    only where it changes): a PythonOp inside nbgrad.jit makes a ctx per call."""

    to_save: tuple = ()
    _saved: list | None = None
    _node: Node | object | None = None
    needs_input_grad: tuple[bool, ...] = ()
    # marking makes a new set (``|=``)
    non_differentiable: frozenset[int] = _NONE_MARKED
    dirty_tensors: frozenset[int] = _NONE_MARKED
    materialize_grads = True
    #: the names of the fields above (anything else on a ctx is the user's): every name
    #: defined so far in this class body, so a field goes above this line, anything else
    #: below it
    FIELDS: ClassVar[frozenset[str]] = frozenset(
        name for name in locals() if not name.startswith("__"))

    def save_for_backward(self, *tensors: Tensor | None) -> None:
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError("save_for_backward can only save tensors (or None), got "
                                f"{type(t).__name__}")
        self.to_save = tensors

    @property
    def saved_tensors(self) -> tuple:
        if self._saved is None:
            if self._node is not None:
                raise RuntimeError(RETAIN_GRAPH_MESSAGE)
            return tuple(self.to_save)
        return tuple(s.unpack(self._node) if s is not None else None for s in self._saved)

    def mark_non_differentiable(self, *tensors: Tensor) -> None:
        self.non_differentiable |= {id(t) for t in tensors}

    def mark_dirty(self, *tensors: Tensor) -> None:
        self.dirty_tensors |= {id(t) for t in tensors}

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)


class BackwardFunction(Node):
    """The graph node of one ``Function.apply``: calls the user's ``backward``."""

    __slots__ = ("fn_cls", "ctx", "arg_is_tensor", "input_meta", "output_meta")

    def __init__(self, fn_cls: type, ctx: FunctionCtx, edges: list) -> None:
        super().__init__(edges)
        self.fn_cls = fn_cls
        self.ctx = ctx

    def name(self) -> str:
        return f"{self.fn_cls.__name__}Backward"

    def release(self) -> None:
        ctx = self.ctx
        ctx._saved = None
        # break the ctx <-> node cycle so that reference counting frees the graph at once
        # (the cyclic collector would otherwise); saved_tensors still raises
        ctx._node = _RELEASED

    def apply(self, grads: list, create_graph: bool) -> list:
        ctx = self.ctx
        if ctx._saved is None and ctx.to_save:
            raise RuntimeError(RETAIN_GRAPH_MESSAGE)
        full = []
        for k, (shape, dtype) in enumerate(self.output_meta):
            g = grads[k] if k < len(grads) else None
            if g is None and ctx.materialize_grads:
                g = Tensor._make(np.zeros(shape, dtype))
            full.append(g)
        result = self.fn_cls.backward(ctx, *full)
        return self.check_gradients(result)

    def check_gradients(self, result: Any) -> list:
        """Validate what ``backward`` returned and map it to the tensor inputs."""
        name = self.fn_cls.__name__
        if not isinstance(result, tuple):
            result = (result,)
        n_args = len(self.arg_is_tensor)
        if len(result) < n_args or any(r is not None for r in result[n_args:]):
            raise RuntimeError(f"function {name}.backward returned an incorrect number of "
                               f"gradients (expected {n_args}, got {len(result)})")
        out = []
        k = 0
        for pos, is_tensor in enumerate(self.arg_is_tensor):
            g = result[pos]
            if not is_tensor:
                if g is not None:
                    raise RuntimeError(f"function {name}.backward returned a gradient "
                                       f"different from None at position {pos}, but the "
                                       "corresponding forward input was not a tensor")
                continue
            shape, dtype = self.input_meta[k]
            if g is not None and self.next_edges[k] is not None and not (
                    type(g) is Tensor and g._data.shape == shape and g._data.dtype == dtype):
                g = _fit_gradient(name, pos, g, shape, dtype)
            out.append(g if self.next_edges[k] is not None else None)
            k += 1
        return out


def _fit_gradient(name: str, pos: int, g, shape: tuple, dtype) -> Tensor:
    if not isinstance(g, Tensor):
        raise TypeError(f"function {name}.backward returned a {type(g).__name__} at "
                        f"position {pos}; expected a tensor or None")
    if tuple(g.shape) != tuple(shape):
        try:
            ok = np.broadcast_shapes(tuple(shape), tuple(g.shape)) == tuple(g.shape)
        except ValueError:
            ok = False
        if not ok:
            raise RuntimeError(f"function {name}.backward returned an invalid gradient at "
                               f"index {pos}: got shape {tuple(g.shape)} but expected shape "
                               f"compatible with {tuple(shape)}")
        g = sum_to(g, shape)
    if g.dtype != dtype:
        g = to_dtype(g, dtype)
    return g


class Function:
    """A custom op: static ``forward(ctx, *args)`` and ``backward(ctx, *grads)``; call ``apply``."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("Function subclasses must implement forward")

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise NotImplementedError("Function subclasses must implement backward")

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        tracer = STATE_TRACE.tracer
        if tracer is not None and not (forward.STATE.active and forward.has_tangent(args)) \
                and tracer.wants_function(cls, args, kwargs):
            return tracer.trace_function(cls, args, kwargs)
        return apply_function(cls, args, kwargs)


def apply_function(cls: type, args: tuple, kwargs: dict, ctx: FunctionCtx | None = None,
                   node_cls: type | None = None) -> Any:
    """Run ``cls.forward`` without recording, then connect its outputs to one node.

    ``ctx`` (a fresh :class:`FunctionCtx`) and ``node_cls`` (a subclass of
    :class:`BackwardFunction`) let ``nbgrad.jit`` keep the context and pick the node.
    """
    if ctx is None:
        ctx = FunctionCtx()
    tensor_args = []
    needs_input_grad = []
    for a in args:
        if isinstance(a, Tensor):
            tensor_args.append(a)
            needs_input_grad.append(a._requires_grad)
        else:
            needs_input_grad.append(False)
    ctx.needs_input_grad = needs = tuple(needs_input_grad)
    # no_grad() and forward.suspended(), inlined: the Function is one op to forward mode too
    fstate = forward.STATE
    levels = fstate.active
    grad_enabled = STATE.grad_enabled
    STATE.grad_enabled = False
    fstate.active = ()
    try:
        raw = cls.forward(ctx, *args, **kwargs)
    finally:
        STATE.grad_enabled = grad_enabled
        fstate.active = levels
    is_tuple = isinstance(raw, tuple)
    outputs = list(raw) if is_tuple else [raw]
    node = None
    if grad_enabled and any(needs):
        node = (node_cls or BackwardFunction)(cls, ctx,
                                              [gradient_edge(t) for t in tensor_args])
        node.arg_is_tensor = tuple(isinstance(a, Tensor) for a in args)
        node.input_meta = [(t._data.shape, t._data.dtype) for t in tensor_args]
        ctx._node = node
    input_ids = {id(t) for t in tensor_args}
    dirty = ctx.dirty_tensors
    non_differentiable = ctx.non_differentiable
    meta = []
    for k, out in enumerate(outputs):
        if not isinstance(out, Tensor):
            meta.append(((), _FLOAT64))
            continue
        if id(out) in input_ids and id(out) not in dirty:
            out = Tensor._make(out._data, device=out._device, version_box=out._version_box,
                               base=out)  # an input returned as is: a new alias
            outputs[k] = out
        data = out._data
        meta.append((data.shape, data.dtype))
        if node is not None and id(out) not in non_differentiable \
                and data.dtype.kind == "f":
            out.grad_fn = node
            out._output_nr = k
            out._requires_grad = True
    if node is not None:
        node.output_meta = meta
        output_ids = {id(o) for o in outputs if isinstance(o, Tensor)}
        ctx._saved = [None if t is None else
                      (SavedOutput(t, "saved_tensors") if id(t) in output_ids
                       else SavedTensor(t, "saved_tensors")) for t in ctx.to_save]
        ctx.to_save = ()
    if levels and forward.has_tangent(args):
        forward.push_function_tangents(
            cls, ctx, args, kwargs, outputs,
            lambda again: apply_function(cls, again, kwargs))
    return tuple(outputs) if is_tuple else outputs[0]


class _DelayedErrorNode(Node):
    """Stands for the backward of a once_differentiable backward: raises if reached."""

    __slots__ = ("fn_name",)

    def __init__(self, fn_name: str, edges: list) -> None:
        super().__init__(edges)
        self.fn_name = fn_name

    def apply(self, grads: list, create_graph: bool) -> list:
        raise RuntimeError(f"trying to differentiate twice a function that was marked with "
                           f"@once_differentiable ({self.fn_name})")


def once_differentiable(backward):
    """Mark a ``backward`` as not differentiable itself: a double backward through it raises."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        create_graph = STATE.grad_enabled
        with no_grad():
            result = backward(ctx, *grads)
        if not create_graph:
            return result
        inputs = [g for g in grads if isinstance(g, Tensor) and g._requires_grad]
        inputs += [t for t in (ctx.saved_tensors if ctx._saved is not None else ())
                   if isinstance(t, Tensor) and t._requires_grad]
        if not inputs:
            return result
        node = _DelayedErrorNode(getattr(backward, "__qualname__", "backward"),
                                 [gradient_edge(t) for t in inputs])
        items = result if isinstance(result, tuple) else (result,)
        wrapped = []
        for r in items:
            if isinstance(r, Tensor):
                r = Tensor._make(r._data, requires_grad=True, grad_fn=node, device=r._device)
            wrapped.append(r)
        return tuple(wrapped) if isinstance(result, tuple) else wrapped[0]

    wrapper.once_differentiable = True
    return wrapper
