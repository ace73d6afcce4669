"""The tracer: records the ops a Python function runs into a :class:`~nbgrad.jit.trace.ir.Graph`.

Tracing is concrete. While a :class:`Tracer` is installed in
``nbgrad.tensor.STATE_TRACE``, every op still runs eagerly, and
``nbgrad.ops.dispatch.apply`` reports it to :meth:`Tracer.record`. So shapes and
values are known during the trace, and backward formulas, which are ordinary op
calls, are recorded like any forward op: tracing a function that calls
``nbgrad.autograd.grad`` records its forward and backward into one graph.

Tensors are matched to graph values by their array object (``id(t._data)``), so
the aliases the autograd engine makes of saved outputs keep their value. A tensor the
tracer has not seen is a constant (a snapshot of its value),
except a tensor that requires grad, which becomes an implicit input (read at every
call, differentiated like an argument). Values are *dynamic* when they depend on an
input; an op whose inputs are all constant is folded (not recorded).

Where eager mode cuts the autograd graph, the graph gets a ``StopGradient`` marker,
because the graph is differentiated afterwards by replaying it with every op recording
(:mod:`nbgrad.jit.trace.autodiff`): a ``detach()`` (also ``.data`` and the functional
transforms' detached results) of a value that carries a gradient becomes the marker's
output (on a new alias of the array, so that both stay apart), and an op recorded with
grad enabled reads a marker in place of any input that does not require grad eagerly
but carries a gradient in the graph (the results of ``no_grad()`` blocks and decorators,
``set_grad_enabled(False)``, ``detach_()``, ``requires_grad_(False)``, gradients
computed without ``create_graph``, custom Functions' non-differentiable outputs).
``_carry`` tracks which values carry a gradient when the graph is differentiated (its
inputs that require grad, and what differentiable ops compute from them), so graphs
that are never differentiated get no markers.

A value-dependent Python branch (``bool(t)``, ``t.item()``, ``t.numpy()``) on a
dynamic tensor raises :class:`~nbgrad.TracerError` naming the user's file and line,
and so does reading a traced tensor after it was modified in place.
"""

from __future__ import annotations

import contextlib
import gc
import os
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ...autograd import forward
from ...backends import is_cuda_array
from ...errors import TracerError
from ...grad_mode import STATE
from ...tensor import STATE_TRACE, Tensor, tracer_installed, tracer_removed
from .ir import STOP_GRADIENT, Graph, Node, Var

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SMALL = 64  # constants with at most this many elements are shared by value
#: :meth:`Tracer.traced_grad`'s implementation, registered by :mod:`.traced_grad` (which
#: differentiates with a Tracer, so this module cannot import it)
GRAD_FROM_REROLL: list[Callable] = []


def _differentiated(t: Tensor) -> bool:
    """Whether a tensor from outside the trace is differentiated: it requires grad, or it
    has a tangent of an open forward-mode level (then it is an input, not a constant, so
    that a replay of the graph on it carries its tangent)."""
    return t._requires_grad or (bool(forward.STATE.active) and forward.has_tangent((t,)))


def _tangent_only(t: Tensor) -> bool:
    """A tensor folded into a constant that has a tangent of an open forward-mode level
    (a ``jvp`` input made from a constant): it must become an input, so that a replay of
    the graph on the tensor itself carries the tangent."""
    return bool(forward.STATE.active) and forward.has_tangent((t,))


def _strong(arr: Any) -> Callable[[], Any]:
    """A strong reference to ``arr``, called like a weak one."""
    return lambda: arr


def user_site() -> str:
    """``file:line`` (and the source line) of the innermost frame outside nbgrad."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_PACKAGE_DIR) and "/numba/" not in path:
            line = f": {frame.line.strip()}" if frame.line else ""
            return f"{frame.filename}:{frame.lineno}{line}"
    return "<unknown location>"


class Tracer:
    """Records ops into ``self.graph``; installed for a ``with`` block (``with tracer:``).

    ``parent`` is the enclosing tracer when this one traces a loop body: a dynamic
    value of the parent used in the body becomes an invariant input of the body
    (``self.captures`` lists ``(parent var, body var, tensor)``). ``cut_gradients``:
    put ``StopGradient`` markers where eager mode cuts the graph (off for the joint
    graphs of :mod:`nbgrad.jit.trace.autodiff`, which record a differentiation themselves).
    """

    def __init__(self, parent: Tracer | None = None, implicit_inputs: bool = True,
                 cut_gradients: bool = True) -> None:
        self.graph = Graph()
        self.parent = parent
        #: id(array) -> (reference to the array, its version box, version when bound, var).
        #: Strong for what :meth:`bind` binds (inputs, captures, the outputs of loops and
        #: custom Functions: their users rely on the trace keeping them alive), weak for op
        #: outputs (:meth:`record`), so that the trace keeps no intermediate alive; a dead
        #: array's id may be reused: the reference tells.
        self._env: dict[int, tuple[Callable, list, int, Var]] = {}
        self._dynamic: set[int] = set()
        self._small: dict[tuple, Var] = {}
        self._big: dict[int, tuple[np.ndarray, int, Var]] = {}
        self.captures: list[tuple[Var, Var, Tensor]] = []
        self._captured: dict[int, Var] = {}
        #: id(inner var) -> index in captures of a capture by a tensor not requiring grad
        self._stand_ins: dict[int, int] = {}
        self.implicit_inputs = implicit_inputs
        #: (tensor, var) of tensors requiring grad found in closures (top level only)
        self.implicit: list[tuple[Tensor, Var]] = []
        #: weak references and versions of closed-over tensors frozen as constants
        self.frozen: list[tuple[weakref.ref, int]] = []
        self._prev = None
        self.cut_gradients = cut_gradients
        #: inputs requiring grad carry a gradient only when grad mode was on at the start
        self._grad_roots = STATE.grad_enabled
        self._carry: set[int] = set()  # ids of the vars that carry a gradient
        self._stops: dict[tuple[int, bool], Var] = {}  # (id(var), kind) -> its marker var

    # ------------------------------------------------------------------ install
    def __enter__(self) -> Tracer:
        tracer_installed()
        self._prev = STATE_TRACE.tracer
        STATE_TRACE.tracer = self
        return self

    def __exit__(self, *exc: object) -> None:
        STATE_TRACE.tracer = self._prev
        self._prev = None
        tracer_removed()

    # ------------------------------------------------------------------ values
    def add_input(self, t: Tensor) -> Var:
        """Make ``t`` a graph input (a dynamic value)."""
        v = Var(t._data.shape, t._data.dtype)
        self.graph.inputs.append(v)
        self.bind(t, v)
        if t._requires_grad and self._grad_roots:
            self._carry.add(id(v))
        return v

    def bind(self, t: Tensor, v: Var, dynamic: bool = True) -> None:
        """From now on ``t`` (and every tensor sharing its array) is the value ``v``."""
        arr = t._data
        self._env[id(arr)] = (_strong(arr), t._version_box, t._version_box[0], v)
        if dynamic:
            self._dynamic.add(id(v))

    def lookup(self, t: Tensor) -> Var | None:
        """The var bound to ``t``, or None (checking that it was not modified in place)."""
        arr = t._data
        entry = self._env.get(id(arr))
        if entry is None or entry[0]() is not arr:
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
            if t._requires_grad and id(v) in self._stand_ins:
                self._prefer(v, t)
            if not self.is_dynamic(v) and self.parent is None and _tangent_only(t):
                return self._implicit(t)
            return v
        if self.parent is not None:
            outer = self.parent._dynamic_var(t)
            if outer is not None:
                return self._capture(outer, t)
        elif self.implicit_inputs and _differentiated(t):
            v = self.add_input(t)
            self.implicit.append((t, v))
            return v
        return self.constant(t)

    def _dynamic_var(self, t: Tensor) -> Var | None:
        """The var of ``t`` if it is dynamic here (or in an enclosing trace)."""
        v = self.lookup(t)
        if v is not None:
            if not self.is_dynamic(v) and self.parent is None and _tangent_only(t):
                return self._implicit(t)
            return v if self.is_dynamic(v) else None
        if self.parent is not None:
            outer = self.parent._dynamic_var(t)
            if outer is not None:
                return self._capture(outer, t)
        elif self.implicit_inputs and _differentiated(t):
            v = self.add_input(t)
            self.implicit.append((t, v))
            return v
        return None

    def _implicit(self, t: Tensor) -> Var:
        """``t`` as an implicit input (read from the tensor at every run)."""
        v = self.add_input(t)
        self.implicit.append((t, v))
        return v

    def _capture(self, outer: Var, t: Tensor) -> Var:
        inner = self._captured.get(id(outer))
        if inner is None:
            inner = outer.like()
            self._captured[id(outer)] = inner
            if not t._requires_grad:  # e.g. a detach() of it: replaced by the first use
                self._stand_ins[id(inner)] = len(self.captures)  # that requires grad
            self.captures.append((outer, inner, t))
            self.graph.inputs.append(inner)
            self._dynamic.add(id(inner))
            if inner.dtype.kind in "fc":  # a body is differentiated by eager autograd
                self._carry.add(id(inner))  # too: w.r.t. whatever requires grad there
        self.bind(t, inner)
        return inner

    def _prefer(self, inner: Var, t: Tensor) -> None:
        """Make ``t`` (which requires grad) the tensor that a capture stands for: the
        loop's gradient goes to it, as eager mode's to the value the body differentiates."""
        k = self._stand_ins.pop(id(inner))
        outer, _, _ = self.captures[k]
        self.captures[k] = (outer, inner, t)

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
            else:  # (_big keeps the array alive: its id stays its own)
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
            v = self.graph.add_const(arr.copy_to_host())
            self._big[id(arr)] = (arr, version, v)
        if isinstance(t, Tensor):
            self.frozen.append((weakref.ref(t), t._version_box[0]))
        return v

    # ------------------------------------------------------------------ gradient cuts
    def carries(self, v: Var) -> bool:
        """Whether ``v`` carries a gradient when the graph is differentiated."""
        return id(v) in self._carry

    def _stop(self, v: Var, keep_tangent: bool = False) -> Var:
        """``v`` through a StopGradient marker (one per var and kind). ``keep_tangent``:
        the marker stands for an autograd cut (no_grad, a value that does not require
        grad), which forward mode passes through, not for a ``detach()``, which it stops."""
        s = self._stops.get((id(v), keep_tangent))
        if s is None:
            s = self._stops[(id(v), keep_tangent)] = v.like()
            attrs = {"keep_tangent": True} if keep_tangent else None
            self.graph.nodes.append(Node(STOP_GRADIENT, [v], [s], attrs))
            self._dynamic.add(id(s))
        return s

    def use(self, t: Tensor) -> Var:
        """The var an op recorded now reads for ``t``: :meth:`var_of`, cut by a marker
        where ``t`` carries a gradient in the graph but not eagerly (grad mode on)."""
        v = self.var_of(t)
        if self.cut_gradients and not t._requires_grad and id(v) in self._carry \
                and STATE.grad_enabled:
            return self._stop(v, keep_tangent=True)
        return v

    def detach(self, t: Tensor) -> Tensor | None:
        """``t.detach()`` when ``t`` carries a gradient here: a tensor on a new alias of
        its array, bound to a StopGradient marker (None: detach as usual)."""
        v = self.lookup(t) if self.cut_gradients else None
        if v is None or id(v) not in self._carry:
            return None
        arr = t._data
        alias = arr.view_as(arr.shape, arr.strides, arr.offset) if is_cuda_array(arr) \
            else arr.view()
        out = Tensor._make(alias, device=t._device, version_box=t._version_box, base=t)
        self.bind(out, self._stop(v))
        return out

    # ------------------------------------------------------------------ hooks
    def record(self, op, args: tuple, outputs: list[Tensor]) -> None:
        """Called by ``dispatch.apply`` after every op (it already ran eagerly)."""
        if op.has_lists:
            self._record_lists(op, args, outputs)
            return
        inputs: list[Var | None] = []
        env, dyn, carry = self._env, self._dynamic, self._carry
        dynamic = carried = False
        for i in op.tensor_pos:
            t = args[i]
            if t is None:
                inputs.append(None)
                continue
            # the common case of use(): a dynamic value bound here, unchanged, needing no
            # marker and standing in for no capture; anything else takes use() itself
            arr = t._data
            entry = env.get(id(arr))
            if entry is not None and entry[0]() is arr and entry[2] == entry[1][0] \
                    and id(entry[3]) in dyn:
                v = entry[3]
                if t._requires_grad:
                    if id(v) in self._stand_ins:
                        v = self.use(t)
                elif id(v) in carry and self.cut_gradients and STATE.grad_enabled:
                    v = self._stop(v, keep_tangent=True)
                dynamic = True
            else:
                v = self.use(t)
                dynamic = dynamic or id(v) in dyn
            carried = carried or id(v) in carry
            inputs.append(v)
        if not dynamic:
            return  # folded: the outputs are constants, snapshotted when first used
        outs = []
        for o in outputs:
            arr = o._data
            if type(arr) is np.ndarray:
                v = Var.of(arr.shape, arr.dtype)
                ref = weakref.ref(arr)
            else:
                v = Var(arr.shape, arr.dtype)
                ref = _strong(arr)
            outs.append(v)
            box = o._version_box
            env[id(arr)] = (ref, box, box[0], v)
            dyn.add(id(v))
        self.graph.nodes.append(Node.of(op.name, tuple(inputs), tuple(outs),
                                        {name: args[i] for i, name in op.attr_names}))
        if carried and op.differentiable:
            out_diff = op.out_diff  # as dispatch marks outputs that require grad
            carry.update(id(v) for k, v in enumerate(outs)
                         if (out_diff[k] if k < len(out_diff) else out_diff[-1]))

    def _record_lists(self, op, args: tuple, outputs: list[Tensor]) -> None:
        """:meth:`record` for an op with tensor-list parameters."""
        inputs: list[Var | None] = []
        dynamic = False
        attrs: dict[str, Any] = {}
        for i, p in enumerate(op.params):
            if p.is_tensor:
                t = args[i]
                v = None if t is None else self.use(t)
                inputs.append(v)
                dynamic = dynamic or (v is not None and id(v) in self._dynamic)
            elif p.is_tensor_list:
                ts = list(args[i])
                attrs["#" + p.name] = len(ts)
                for t in ts:
                    v = self.use(t)
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
        if op.differentiable and any(v is not None and id(v) in self._carry for v in inputs):
            out_diff = op.out_diff  # as dispatch marks outputs that require grad
            self._carry.update(id(v) for k, v in enumerate(outs)
                               if (out_diff[k] if k < len(out_diff) else out_diff[-1]))

    def add_node(self, node: Node, outputs: list[Tensor]) -> None:
        """Append a node built elsewhere (a loop, a custom Function) and bind its output
        tensors (its inputs should come from :meth:`use`)."""
        self.graph.nodes.append(node)
        for t, v in zip(outputs, node.outputs, strict=True):
            self.bind(t, v)
        if any(v is not None and id(v) in self._carry for v in node.inputs):
            self._carry.update(id(v) for v in node.outputs if v.dtype.kind in "fc")

    def is_traced(self, t: Tensor) -> bool:
        """Whether ``t``'s value depends on the inputs of a function being traced."""
        v = self.lookup(t)
        if v is not None:
            return self.is_dynamic(v)
        if self.parent is not None:
            return self.parent.is_traced(t)
        return self.implicit_inputs and _differentiated(t)

    def refuse(self, what: str) -> None:
        raise TracerError(
            f"{user_site()}: {what} needs the value of a tensor that nbgrad.jit is tracing, "
            "and values are not known when the graph is built. Use tensor ops instead of "
            "Python control flow: nbgrad.cond(pred, true_fn, false_fn, *operands) or "
            "nbgrad.where for an if, nbgrad.while_loop(cond_fn, body_fn, init) for a while, "
            "nbgrad.fori_loop or nbgrad.scan for a loop of known length, x[i] or "
            "nbgrad.dynamic_slice to read and x.at[i].set(v) to update at a traced integer; "
            "or pass the value as a static argument (static_argnums)")

    def wants_function(self, cls: type, args: tuple, kwargs: dict | None = None) -> bool:
        """Whether ``cls.apply(*args)`` must be recorded (see :mod:`.function_trace`)."""
        from .function_trace import wants_function  # cyclic: function_trace traces with us
        return wants_function(self, cls, args, kwargs)

    def trace_function(self, cls: type, args: tuple, kwargs: dict) -> Any:
        """Record a custom Function: natively or as a PythonOp (:mod:`.function_trace`)."""
        from .function_trace import trace_function  # cyclic (see wants_function)
        return trace_function(self, cls, args, kwargs)

    def traced_grad(self, outs: tuple, roots: list, implicit: list[bool], ins: tuple,
                    retain_graph: bool) -> list | None:
        """``autograd.grad`` of ``outs`` w.r.t. ``ins`` recorded from the re-rolled forward,
        or None: the engine runs (see :mod:`.traced_grad`)."""
        return GRAD_FROM_REROLL[0](self, outs, roots, implicit, ins, retain_graph) \
            if GRAD_FROM_REROLL else None

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


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (then as before). A trace allocates objects by
    the hundred thousand, and keeps most: each full collection would walk them all again
    (a third of the time of tracing a long unrolled loop). Garbage cycles made meanwhile
    are collected afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_traced(tracer: Tracer, fn: Callable, *args: Any, quiet: bool = False) -> Any:
    """Call ``fn(*args)`` with ``tracer`` installed (``quiet``: no NumPy warnings), with
    the garbage collector paused (:func:`gc_paused`)."""
    with tracer, gc_paused():
        if quiet:
            with np.errstate(all="ignore"):
                return fn(*args)
        return fn(*args)


def stop_gradient(x: Tensor, keep_tangent: bool = False) -> Tensor:
    """``x`` detached; under a tracer, its value through a StopGradient marker (how the
    marker replays, so that a graph recorded from a replay cuts the gradient too).
    ``keep_tangent``: forward-mode tangents pass (an autograd cut, not a ``detach()``)."""
    tracer = STATE_TRACE.tracer
    out = None
    if tracer is not None:
        v = tracer.lookup(x)
        if v is not None and tracer.is_dynamic(v):
            arr = x._data
            out = Tensor._make(arr.copy() if is_cuda_array(arr) else np.array(arr, copy=True),
                               device=x._device)
            s = v.like()
            attrs = {"keep_tangent": True} if keep_tangent else None
            tracer.graph.nodes.append(Node(STOP_GRADIENT, [v], [s], attrs))
            tracer.bind(out, s)
    if out is None:
        out = x.detach()
    if keep_tangent and forward.STATE.active:
        forward.transfer_tangent(x, out)
    return out
