"""Graph nodes: the Node base class, leaf accumulation (AccumulateGrad), saved tensors."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence

from ..grad_mode import no_grad
from ..ops import add
from ..tensor import STATE_TRACE, Tensor

_sequence = itertools.count()

RETAIN_GRAPH_MESSAGE = (
    "Trying to backward through the graph a second time (or to use saved tensors after "
    "they were freed). Specify retain_graph=True in the first backward() or "
    "autograd.grad() call if you need to backward through the graph again.")


class Node:
    """A backward function: maps gradients of its outputs to gradients of its inputs.

    ``next_edges[i]`` is ``(node, output_nr)`` for the i-th tensor input, or ``None``
    when that input needs no gradient.
    """

    __slots__ = ("next_edges", "seq", "_pre_hooks", "_post_hooks", "_retain", "__weakref__",
                 "anomaly_trace")

    def __init__(self, next_edges: Sequence) -> None:
        self.next_edges = next_edges
        self.seq = next(_sequence)
        self._pre_hooks = None  # output_nr -> {key: hook}
        self._post_hooks = None
        self._retain = None  # output_nr -> weakref of a tensor that retains its grad
        self.anomaly_trace = None

    def name(self) -> str:
        return type(self).__name__

    def apply(self, grads: list, create_graph: bool) -> list:
        raise NotImplementedError  # abstract

    def release(self) -> None:
        """Free saved buffers (called after backward unless retain_graph)."""

    def tensor_pre_hooks(self, output_nr: int) -> dict:
        if self._pre_hooks is None:
            self._pre_hooks = {}
        return self._pre_hooks.setdefault(output_nr, {})

    def register_hook(self, hook) -> None:
        """``hook(grad_inputs, grad_outputs)`` runs after this node's backward."""
        if self._post_hooks is None:
            self._post_hooks = []
        self._post_hooks.append(hook)

    @property
    def next_functions(self) -> tuple:
        return tuple(e if e is not None else (None, 0) for e in self.next_edges)

    def __repr__(self) -> str:
        return f"<{self.name()}>"


class AccumulateGrad(Node):
    """Adds the incoming gradient to a leaf tensor's ``.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable: Tensor) -> None:
        super().__init__([])
        self.variable = variable

    def apply(self, grads: list, create_graph: bool) -> list:
        accumulate_into(self.variable, grads[0], create_graph)
        return []


def accumulate_into(leaf: Tensor, grad: Tensor | None, create_graph: bool) -> None:
    if grad is None:
        return
    if leaf.grad is None:
        if create_graph:
            leaf.grad = grad
        else:
            leaf.grad = Tensor._make(grad._data.copy(), device=grad._device)
            if STATE_TRACE.tracer is not None:  # nbgrad.jit: the copy is the traced value
                STATE_TRACE.tracer.alias(leaf.grad, grad)
    elif create_graph or leaf.grad._requires_grad or STATE_TRACE.tracer is not None:
        leaf.grad = add(leaf.grad, grad)
    else:
        with no_grad():
            leaf.grad.add_(grad)


def gradient_edge(t: Tensor) -> tuple[Node, int] | None:
    """The edge a gradient for ``t`` flows into (None if ``t`` needs no gradient)."""
    if not t._requires_grad:
        return None
    if t.grad_fn is not None:
        return (t.grad_fn, t._output_nr)
    acc = t._accumulator() if t._accumulator is not None else None
    if acc is None:
        acc = AccumulateGrad(t)
        t._accumulator = weakref.ref(acc)
    return (acc, 0)


def register_retain_grad(t: Tensor) -> None:
    node = t.grad_fn
    if node._retain is None:
        node._retain = {}
    node._retain[t._output_nr] = weakref.ref(t)


class SavedTensor:
    """A tensor saved for backward, with the version it had when it was saved."""

    __slots__ = ("tensor", "version", "name")

    def __init__(self, tensor: Tensor, name: str) -> None:
        self.tensor = tensor
        self.version = tensor._version_box[0]
        self.name = name

    def unpack(self, node: Node) -> Tensor:
        t = self.tensor
        if t._version_box[0] != self.version:
            raise RuntimeError(modified_message(node, self.name, t, self.version))
        return t


#: ``(data, tensor)``: called when a saved output is rebuilt around ``data``; set by
#: :mod:`nbgrad.autograd.forward` while a forward-mode level is open
ON_UNPACK_OUTPUT = None


class SavedOutput:
    """An output saved by its own node: stored without a reference cycle, rebuilt on unpack."""

    __slots__ = ("data", "version_box", "version", "output_nr", "device", "name")

    def __init__(self, t: Tensor, name: str) -> None:
        self.data = t._data
        self.version_box = t._version_box
        self.version = t._version_box[0]
        self.output_nr = t._output_nr
        self.device = t._device
        self.name = name

    def unpack(self, node: Node) -> Tensor:
        if self.version_box[0] != self.version:
            raise RuntimeError(modified_message(node, self.name, self, self.version))
        t = Tensor._make(self.data, requires_grad=True, grad_fn=node,
                         output_nr=self.output_nr, device=self.device,
                         version_box=self.version_box)
        if ON_UNPACK_OUTPUT is not None:  # forward mode: the output's tangents
            ON_UNPACK_OUTPUT(self.data, t)
        return t


class SavedMeta:
    """Only the metadata of a tensor, for formulas that read ``x.shape`` and no values."""

    __slots__ = ("shape", "dtype", "ndim")

    def __init__(self, t: Tensor) -> None:
        self.shape = t._data.shape
        self.dtype = t._data.dtype
        self.ndim = t._data.ndim

    def unpack(self, node: Node) -> SavedMeta:
        return self


_SAVED_META: dict = {}  # (shape, dtype) -> SavedMeta, shared by nodes (never written)


def saved_meta(t: Tensor) -> SavedMeta:
    """``SavedMeta(t)``, one object for every tensor of a shape and dtype (bounded)."""
    d = t._data
    meta = _SAVED_META.get((d.shape, d.dtype))
    if meta is None:
        meta = SavedMeta(t)
        if len(_SAVED_META) < 4096:
            _SAVED_META[(meta.shape, meta.dtype)] = meta
    return meta


def modified_message(node: Node, name: str, t, saved_version: int) -> str:
    shape = tuple(t.data.shape) if isinstance(t, SavedOutput) else tuple(t.shape)
    now = t.version_box[0] if isinstance(t, SavedOutput) else t._version_box[0]
    return (f"one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: {name!r} of {node.name()} (shape {shape}) is at version "
            f"{now}; expected version {saved_version} instead.")
