"""Running backward from outputs: ``backward`` (into ``.grad``) and ``grad`` (returned)."""

from __future__ import annotations

import numpy as np

from ..device import cpu_device
from ..factories import tensor, zeros
from ..ops import ones_like
from ..tensor import STATE_TRACE, Tensor, wrap_array
from .engine import GraphTask
from .node import accumulate_into, gradient_edge


def _as_tuple(x) -> tuple:
    if x is None:
        return ()
    if isinstance(x, Tensor):
        return (x,)
    return tuple(x)


def _root_gradients(outputs: tuple, grad_outputs: tuple, create_graph: bool) -> list:
    if grad_outputs and len(grad_outputs) != len(outputs):
        raise RuntimeError(f"got {len(grad_outputs)} gradients for {len(outputs)} outputs")
    roots = []
    for i, out in enumerate(outputs):
        if not isinstance(out, Tensor):
            raise TypeError(f"outputs[{i}] is a {type(out).__name__}, not a tensor")
        g = grad_outputs[i] if grad_outputs else None
        if not out._requires_grad:
            raise RuntimeError(f"element {i} of the outputs does not require grad and has no "
                               "grad_fn")
        if g is None:
            if out.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs; "
                                   f"output {i} has shape {tuple(out.shape)}: pass "
                                   "grad_tensors / grad_outputs")
            if out._device is cpu_device and STATE_TRACE.tracer is None:
                # ones_like(out) less its dispatch (a 0-d loss: without np.ones' steps)
                d = out._data
                g = wrap_array(np.array(1, d.dtype) if d.ndim == 0 else
                               np.ones(d.shape, d.dtype))
            else:
                g = ones_like(out)
        elif not isinstance(g, Tensor):
            g = tensor(g, dtype=out.dtype)
        if tuple(g.shape) != tuple(out.shape):
            raise RuntimeError(f"gradient of shape {tuple(g.shape)} given for output {i} of "
                               f"shape {tuple(out.shape)}")
        roots.append((gradient_edge(out), g))
    return roots


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """Accumulate gradients of ``tensors`` into ``.grad`` of the leaves (or of ``inputs``)."""
    outputs = _as_tuple(tensors)
    grads = _as_tuple(grad_tensors) if not isinstance(grad_tensors, Tensor) else (grad_tensors,)
    if retain_graph is None:
        retain_graph = create_graph
    roots = _root_gradients(outputs, grads, create_graph)
    if inputs is None:
        GraphTask(retain_graph, create_graph).run(roots)
        return
    ins = _as_tuple(inputs)
    if not ins:
        raise RuntimeError("backward(inputs=...) got an empty list of inputs")
    edges = []
    for t in ins:
        edge = gradient_edge(t)
        if edge is None:
            raise RuntimeError("backward(inputs=...): an input does not require grad")
        edges.append(edge)
    results = GraphTask(retain_graph, create_graph, capture=edges).run(roots)
    for t, g in zip(ins, results, strict=True):
        if g is not None:
            accumulate_into(t, g, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool = False,
         materialize_grads: bool = False) -> tuple:
    """Gradients of ``outputs`` with respect to ``inputs``, as a tuple (``.grad`` untouched)."""
    outs = _as_tuple(outputs)
    ins = _as_tuple(inputs)
    gos = _as_tuple(grad_outputs) if not isinstance(grad_outputs, Tensor) else (grad_outputs,)
    if retain_graph is None:
        retain_graph = create_graph
    for i, t in enumerate(ins):
        if not isinstance(t, Tensor):
            raise TypeError(f"inputs[{i}] is a {type(t).__name__}, not a tensor")
        if not t._requires_grad:
            raise RuntimeError(f"inputs[{i}] does not require grad")
    roots = _root_gradients(outs, gos, create_graph)
    results = None
    tracer = STATE_TRACE.tracer
    if tracer is not None and not create_graph and ins:  # nbgrad.jit is tracing
        implicit = [not gos or gos[k] is None for k in range(len(outs))]
        results = tracer.traced_grad(outs, roots, implicit, ins, retain_graph)
    if results is None:
        edges = [gradient_edge(t) for t in ins]
        results = GraphTask(retain_graph, create_graph, capture=edges).run(roots)
    out = []
    for i, (t, g) in enumerate(zip(ins, results, strict=True)):
        if g is None:
            if materialize_grads:
                g = zeros(t.shape, dtype=t.dtype)
            elif not allow_unused:
                raise RuntimeError(f"one of the differentiated tensors (inputs[{i}]) appears "
                                   "to not have been used in the graph; set allow_unused=True "
                                   "if this is the desired behavior")
        out.append(g)
    return tuple(out)


