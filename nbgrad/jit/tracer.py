"""The tracer: records the ops a Python function runs into a :class:`~nbgrad.jit.ir.Graph`.

Tracing is concrete. While a :class:`Tracer` is installed in
``nbgrad.tensor.STATE_TRACE``, every op still runs eagerly, and
``nbgrad.ops.dispatch.apply`` reports it to :meth:`Tracer.record`. So shapes and
values are known during the trace, and backward formulas, which are ordinary op
calls, are recorded like any forward op: tracing a function that calls
``nbgrad.autograd.grad`` records its forward and backward into one graph.

Tensors are matched to graph values by their array object (``id(t._data)``), so
``detach()`` and the aliases the autograd engine makes of saved outputs keep their
value. A tensor the tracer has not seen is a constant (a snapshot of its value),
except a tensor that requires grad, which becomes an implicit input (read at every
call, differentiated like an argument). Values are *dynamic* when they depend on an
input; an op whose inputs are all constant is folded (not recorded).

A value-dependent Python branch (``bool(t)``, ``t.item()``, ``t.numpy()``) on a
dynamic tensor raises :class:`~nbgrad.TracerError` naming the user's file and line,
and so does reading a traced tensor after it was modified in place.
"""

from __future__ import annotations

import os
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends import is_cuda_array
from ..errors import TracerError
from ..tensor import STATE_TRACE, Tensor
from .ir import Graph, Node, Var

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SMALL = 64  # constants with at most this many elements are shared by value


def user_site() -> str:
    """``file:line`` (and the source line) of the innermost frame outside nbgrad."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_PACKAGE_DIR) and "/numba/" not in path:
            line = f": {frame.line.strip()}" if frame.line else ""
            return f"{frame.filename}:{frame.lineno}{line}"
    return "<unknown location>"


class Tracer:
    """Records ops into ``self.graph``; installed with :meth:`activate`.

    ``parent`` is the enclosing tracer when this one traces a loop body: a dynamic
    value of the parent used in the body becomes an invariant input of the body
    (``self.captures`` lists ``(parent var, body var, tensor)``).
    """

    def __init__(self, parent: Tracer | None = None, implicit_inputs: bool = True) -> None:
        self.graph = Graph()
        self.parent = parent
        self._env: dict[int, tuple[np.ndarray, list, int, Var]] = {}
        self._dynamic: set[int] = set()
        self._small: dict[tuple, Var] = {}
        self._big: dict[int, tuple[np.ndarray, int, Var]] = {}
        self._keep: list = []  # keeps every array seen alive, so ids stay unique
        self.captures: list[tuple[Var, Var, Tensor]] = []
        self._captured: dict[int, Var] = {}
        self.implicit_inputs = implicit_inputs
        #: (tensor, var) of tensors requiring grad found in closures (top level only)
        self.implicit: list[tuple[Tensor, Var]] = []
        #: weak references and versions of closed-over tensors frozen as constants
        self.frozen: list[tuple[weakref.ref, int]] = []
        self._prev = None

    # ------------------------------------------------------------------ install
    def __enter__(self) -> Tracer:
        self._prev = STATE_TRACE.tracer
        STATE_TRACE.tracer = self
        return self

    def __exit__(self, *exc: object) -> None:
        STATE_TRACE.tracer = self._prev
        self._prev = None

    # ------------------------------------------------------------------ values
    def add_input(self, t: Tensor) -> Var:
        """Make ``t`` a graph input (a dynamic value)."""
        v = Var(t._data.shape, t._data.dtype)
        self.graph.inputs.append(v)
        self.bind(t, v)
        return v

    def bind(self, t: Tensor, v: Var, dynamic: bool = True) -> None:
        """From now on ``t`` (and every tensor sharing its array) is the value ``v``."""
        arr = t._data
        self._keep.append(arr)
        self._env[id(arr)] = (arr, t._version_box, t._version_box[0], v)
        if dynamic:
            self._dynamic.add(id(v))

    def lookup(self, t: Tensor) -> Var | None:
        """The var bound to ``t``, or None (checking that it was not modified in place)."""
        arr = t._data
        entry = self._env.get(id(arr))
        if entry is None or entry[0] is not arr:
            return None
        _, box, version, v = entry
        if box is t._version_box and box[0] != version:
            raise TracerError(f"{user_site()}: a tensor traced by nbgrad.jit was modified in "
                              "place; in-place operations on traced tensors are not supported "
                              "inside nbgrad.jit (use the out-of-place op instead)")
        return v

    def is_dynamic(self, v: Var) -> bool:
        return id(v) in self._dynamic

    def var_of(self, t: Tensor) -> Var:
        """The graph value of ``t``: bound, captured from a parent trace, or a constant."""
        v = self.lookup(t)
        if v is not None:
            return v
        if self.parent is not None:
            outer = self.parent._dynamic_var(t)
            if outer is not None:
                return self._capture(outer, t)
        elif self.implicit_inputs and t._requires_grad:
            v = self.add_input(t)
            self.implicit.append((t, v))
            return v
        return self.constant(t)

    def _dynamic_var(self, t: Tensor) -> Var | None:
        """The var of ``t`` if it is dynamic here (or in an enclosing trace)."""
        v = self.lookup(t)
        if v is not None:
            return v if self.is_dynamic(v) else None
        if self.parent is not None:
            outer = self.parent._dynamic_var(t)
            if outer is not None:
                return self._capture(outer, t)
        elif self.implicit_inputs and t._requires_grad:
            v = self.add_input(t)
            self.implicit.append((t, v))
            return v
        return None

    def _capture(self, outer: Var, t: Tensor) -> Var:
        inner = self._captured.get(id(outer))
        if inner is None:
            inner = outer.like()
            self._captured[id(outer)] = inner
            self.captures.append((outer, inner, t))
            self.graph.inputs.append(inner)
            self._dynamic.add(id(inner))
        self.bind(t, inner)
        return inner

    def constant(self, t: Tensor | np.ndarray) -> Var:
        """A constant var holding the current value of ``t`` (shared for equal values)."""
        arr = t._data if isinstance(t, Tensor) else t
        if is_cuda_array(arr):  # constants are host arrays; CUDA graphs upload them
            return self._cuda_constant(t, arr)
        arr = np.asarray(arr)
        if arr.size <= _SMALL:
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            v = self._small.get(key)
            if v is None:
                v = self._small[key] = self.graph.add_const(arr)
        else:
            version = t._version_box[0] if isinstance(t, Tensor) else 0
            entry = self._big.get(id(arr))
            if entry is not None and entry[0] is arr and entry[1] == version:
                v = entry[2]
            else:
                self._keep.append(arr)
                v = self.graph.add_const(arr)
                self._big[id(arr)] = (arr, version, v)
        if isinstance(t, Tensor):
            self.frozen.append((weakref.ref(t), t._version_box[0]))
        return v

    def _cuda_constant(self, t: Tensor | object, arr) -> Var:
        """A constant var for CUDA data (copied to the host once per array and version)."""
        version = t._version_box[0] if isinstance(t, Tensor) else 0
        entry = self._big.get(id(arr))
        if entry is not None and entry[0] is arr and entry[1] == version:
            v = entry[2]
        else:
            self._keep.append(arr)
            v = self.graph.add_const(arr.copy_to_host())
            self._big[id(arr)] = (arr, version, v)
        if isinstance(t, Tensor):
            self.frozen.append((weakref.ref(t), t._version_box[0]))
        return v

    # ------------------------------------------------------------------ hooks
    def record(self, op, args: tuple, outputs: list[Tensor]) -> None:
        """Called by ``dispatch.apply`` after every op (it already ran eagerly)."""
        inputs: list[Var | None] = []
        dynamic = False
        attrs: dict[str, Any] = {}
        for i, p in enumerate(op.params):
            if p.is_tensor:
                t = args[i]
                v = None if t is None else self.var_of(t)
                inputs.append(v)
                dynamic = dynamic or (v is not None and id(v) in self._dynamic)
            elif p.is_tensor_list:
                ts = list(args[i])
                attrs["#" + p.name] = len(ts)
                for t in ts:
                    v = self.var_of(t)
                    inputs.append(v)
                    dynamic = dynamic or id(v) in self._dynamic
            else:
                attrs[p.name] = args[i]
        if not dynamic:
            return  # folded: the outputs are constants, snapshotted when first used
        outs = [Var(o._data.shape, o._data.dtype) for o in outputs]
        self.graph.nodes.append(Node(op.name, inputs, outs, attrs))
        for t, v in zip(outputs, outs, strict=True):
            self.bind(t, v)

    def add_node(self, node: Node, outputs: list[Tensor]) -> None:
        """Append a node built elsewhere (a loop) and bind its output tensors."""
        self.graph.nodes.append(node)
        for t, v in zip(outputs, node.outputs, strict=True):
            self.bind(t, v)

    def is_traced(self, t: Tensor) -> bool:
        """Whether ``t``'s value depends on the inputs of a function being traced."""
        v = self.lookup(t)
        if v is not None:
            return self.is_dynamic(v)
        if self.parent is not None:
            return self.parent.is_traced(t)
        return self.implicit_inputs and t._requires_grad

    def refuse(self, what: str) -> None:
        raise TracerError(
            f"{user_site()}: {what} needs the value of a tensor that nbgrad.jit is tracing, "
            "and values are not known when the graph is built. Use tensor ops instead of "
            "Python control flow (nbgrad.where, nbgrad.fori_loop, nbgrad.scan), or pass the "
            "value as a static argument (static_argnums)")

    def wants_function(self, cls: type, args: tuple, kwargs: dict | None = None) -> bool:
        """Whether ``cls.apply(*args)`` must be recorded (see :mod:`.function_trace`)."""
        from .function_trace import wants_function
        return wants_function(self, cls, args, kwargs)

    def trace_function(self, cls: type, args: tuple, kwargs: dict) -> Any:
        """Record a custom Function: natively or as a PythonOp (:mod:`.function_trace`)."""
        from .function_trace import trace_function
        return trace_function(self, cls, args, kwargs)

    def alias(self, new: Tensor, old: Tensor) -> None:
        """``new`` holds a copy of ``old``'s value (used by the engine's ``.grad`` copies)."""
        v = self.lookup(old)
        if v is not None:
            self.bind(new, v, self.is_dynamic(v))

    def frozen_alive(self) -> list[tuple[weakref.ref, int]]:
        """The frozen closure tensors still alive (temporaries are dropped)."""
        seen: set[int] = set()
        out = []
        for ref, version in self.frozen:
            t = ref()
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                out.append((ref, version))
        return out


def run_traced(tracer: Tracer, fn: Callable, *args: Any, quiet: bool = False) -> Any:
    """Call ``fn(*args)`` with ``tracer`` installed (``quiet``: no NumPy warnings)."""
    with tracer:
        if quiet:
            with np.errstate(all="ignore"):
                return fn(*args)
        return fn(*args)
