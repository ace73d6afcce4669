"""``nbgrad.jit``: trace once per signature, then run the graph natively.

A call looks up the signature of its arguments (the structure of nested
tuples/lists/dicts, each tensor's shape, dtype, requires_grad flag and device type,
the values of static arguments and of every non-tensor leaf, and the grad mode) in a
bounded LRU cache. On a miss the function is traced (see :mod:`nbgrad.jit.trace.tracer`):
that first call runs eagerly and its results are returned. Later calls run the
optimised graph through an :class:`~nbgrad.jit.program.Executable` (tier 1: the
precompiled tape interpreter, one native call when every op is supported). A graph
of CUDA tensors runs on :class:`nbgrad.jit.cuda.fusion.CudaExecutable` instead: one
generated ``@cuda.jit`` kernel per fused elementwise region, eager CUDA kernels for
the other nodes (its backward graph alike). Generated code (tier 2, CUDA kernels) is
trusted only after its first result agreed with tier 1 on the same inputs
(:mod:`nbgrad.jit.verify`): on a mismatch the entry stays in tier 1, with a warning.

Outputs that require grad get one autograd node, :class:`JitBackward`. Its backward
runs a backward graph natively; the forward then runs a graph that also returns the
values the backward reads. Both come from :func:`nbgrad.jit.trace.autodiff.split_vjp`,
i.e. from the derivative table. Under ``create_graph=True`` the backward replays the
joint forward/backward graph with eager ops, so it is differentiable again.

Tensors a jitted function reads from its closure are constants, captured when it is
traced (modifying one in place, which bumps its version, makes the next call trace
again), except tensors that require grad: those are implicit inputs, read at every
call and differentiated like arguments. Python numbers in the arguments are static
(a new value traces again).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import dtypes, pytree
from ..autograd import forward
from ..autograd.node import RETAIN_GRAPH_MESSAGE, Node, SavedTensor, gradient_edge
from ..backends import is_cuda_array, to_host
from ..errors import TracerError
from ..grad_mode import STATE
from ..tensor import STATE_TRACE, Tensor, wrap_array
from . import timing
from .executable import Executable
from .program import Program
from .reference import replay
from .trace.autodiff import reached_inputs, split_vjp
from .trace.ir import Graph, check, exact_key, format_graph
from .trace.passes import BEFORE_AUTODIFF, dce, optimize
from .trace.reroll import reroll
from .trace.traced_grad import traced_grad  # noqa: F401 - registers with the tracer
from .trace.tracer import Tracer, gc_paused, run_traced

MODES = ("auto", "interpret", "compile", "reference")


class _Static:
    """Wraps a ``static_argnums`` argument so that it is one leaf, keyed by value."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _leaf_key(leaf: Any, grad_enabled: bool, where: str) -> tuple:
    if isinstance(leaf, Tensor):
        return ("T", leaf._data.shape, leaf._data.dtype.str,
                grad_enabled and leaf._requires_grad, leaf._device.type)
    if isinstance(leaf, np.ndarray):
        dtypes.as_dtype(leaf.dtype)  # float16 and other unsupported dtypes: a clear TypeError
        return ("A", leaf.shape, leaf.dtype.str)
    value = leaf.value if isinstance(leaf, _Static) else leaf
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"nbgrad.jit: {where} is a {type(value).__name__}, which is not "
                        "hashable; static arguments must be hashable (tuples, numbers, "
                        "strings)") from None
    return ("S",) + exact_key(value)  # -0.0 and 0.0 (or 1 and 1.0) trace apart


class _Signature:
    __slots__ = ("key", "leaves", "spec")

    def __init__(self, key: tuple, leaves: list, spec: tuple) -> None:
        self.key = key
        self.leaves = leaves
        self.spec = spec


class Jitted:
    """A jit-compiled function; call it like the original."""

    def __init__(self, fn: Callable, static_argnums: Sequence[int] | int = (),
                 mode: str = "auto", cache_size: int = 64) -> None:
        if mode not in MODES:
            raise ValueError(f"nbgrad.jit: mode must be one of {MODES[:3]}, got {mode!r}")
        if not callable(fn):
            raise TypeError(f"nbgrad.jit: expected a function, got {type(fn).__name__}")
        if isinstance(static_argnums, int):
            static_argnums = (static_argnums,)
        self.fn = fn
        self.static_argnums = tuple(int(i) for i in static_argnums)
        self.mode = mode
        self.cache_size = max(int(cache_size), 1)
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.RLock()
        self._pending: dict[tuple, threading.Event] = {}  # signatures being traced now
        #: entries of calls whose positional arguments are all plain tensors, by
        #: :meth:`_fast_key` (no flattening); emptied when the cache drops an entry
        self._fast: dict[tuple, _Entry] = {}
        self.traces = 0  # how many times the function was traced
        functools.update_wrapper(self, fn)

    # ------------------------------------------------------------------ calling
    def _signature(self, args: tuple, kwargs: dict) -> _Signature:
        n = len(args)
        static = {i % n if n else i for i in self.static_argnums}
        for i in self.static_argnums:
            if not -n <= i < n:
                raise TypeError(f"nbgrad.jit: static_argnums has {i}, but the function was "
                                f"called with {n} positional arguments")
        tree = (tuple(_Static(a) if i in static else a for i, a in enumerate(args)), kwargs)
        leaves, spec = pytree.flatten(tree)
        grad = STATE.grad_enabled
        key = (spec, grad, tuple(_leaf_key(leaf, grad, f"argument leaf {k}")
                                 for k, leaf in enumerate(leaves)))
        return _Signature(key, leaves, spec)

    def _fast_key(self, args: tuple) -> tuple | None:
        """What :meth:`_signature` keys on, for positional arguments that are all plain
        tensors and none static; None for any other call."""
        if self.static_argnums:
            return None
        grad = STATE.grad_enabled
        key: list = [grad]
        for a in args:
            if type(a) is not Tensor:
                return None
            d = a._data
            # the dtype itself: equal dtypes are equal keys (``dtype.str`` builds a string)
            key.append((d.shape, d.dtype, grad and a._requires_grad, a._device.type))
        return tuple(key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if STATE_TRACE.tracer is not None or forward.STATE.active:
            # called while an outer jit (or a loop body) traces: inline, as JAX does, so
            # the outer graph records these ops and differentiates through them; inside
            # jvp, run the ops eagerly, since forward mode pushes tangents op by op (a
            # compiled graph would drop them; jit(jvp(f)) compiles both)
            return self.fn(*args, **kwargs)
        fast = None if kwargs else self._fast_key(args)
        if fast is not None:  # (the leaves are the arguments, all of them dynamic)
            entry = self._fast.get(fast)
            if entry is not None and entry.valid():
                return entry.call(list(args))
        sig = self._signature(args, kwargs)
        while True:
            with self._lock:
                entry = self._cache.get(sig.key)
                if entry is not None and entry.valid():
                    self._cache.move_to_end(sig.key)
                    break
                entry = None
                pending = self._pending.get(sig.key)
                if pending is None:  # this thread traces the signature; others wait
                    pending = self._pending[sig.key] = threading.Event()
                    break
            pending.wait()  # another thread is tracing this signature: use its result
        if entry is not None:
            if fast is not None:
                self._fast[fast] = entry
            return entry.call(sig.leaves)
        try:
            with gc_paused():  # (the trace's garbage is freed before a collection)
                entry, result = self._trace(sig)
            with self._lock:
                self._cache[sig.key] = entry
                self._cache.move_to_end(sig.key)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
                    self._fast.clear()
        finally:
            with self._lock:
                del self._pending[sig.key]
            pending.set()
        return result

    def _entry(self, args: tuple, kwargs: dict) -> _Entry:
        sig = self._signature(args, kwargs)
        entry = self._cache.get(sig.key)
        if entry is None or not entry.valid():
            self(*args, **kwargs)
            entry = self._cache[sig.key]
        return entry

    def _trace(self, sig: _Signature) -> tuple[_Entry, Any]:
        tracer = Tracer()
        grad = STATE.grad_enabled
        trace_leaves: list = []
        dynamic: list[int] = []
        rg: list[bool] = []
        for k, leaf in enumerate(sig.leaves):
            if isinstance(leaf, (Tensor, np.ndarray)):
                arr = leaf._data if isinstance(leaf, Tensor) else np.asarray(leaf)
                r = bool(grad and isinstance(leaf, Tensor) and leaf._requires_grad)
                t = Tensor._make(arr, requires_grad=r, device=leaf._device) \
                    if isinstance(leaf, Tensor) else Tensor._make(arr, requires_grad=r)
                tracer.add_input(t)
                trace_leaves.append(t)
                dynamic.append(k)
                rg.append(r)
            else:
                trace_leaves.append(leaf.value if isinstance(leaf, _Static) else leaf)
        args, kwargs = pytree.unflatten(sig.spec, trace_leaves)
        self.traces += 1
        out, traced_s = timing.timed(run_traced, tracer, lambda: self.fn(*args, **kwargs))
        out_leaves, out_spec = pytree.flatten(out)
        graph = tracer.graph
        out_pos: list[int] = []
        diff: list[bool] = []
        with tracer:
            for k, leaf in enumerate(out_leaves):
                if isinstance(leaf, Tensor):
                    graph.outputs.append(tracer.var_of(leaf))
                    out_pos.append(k)
                    diff.append(bool(leaf._requires_grad and leaf.dtype.kind == "f"))
        implicit = [t for t, _ in tracer.implicit]
        rg += [bool(grad and t._requires_grad) for t in implicit]
        cuda = any(isinstance(leaf, Tensor) and leaf._device.type == "cuda"
                   for leaf in sig.leaves) or any(t._device.type == "cuda" for t in implicit)
        check(graph)
        if not cuda:  # (the CUDA executor runs no loop nodes)
            # dead code first: e.g. the unrolled forward whose gradient was taken from
            # its re-rolled copy (nbgrad.jit.trace.traced_grad) is not re-rolled again
            graph = reroll(dce(graph))
            check(graph)
        entry = _Entry(self, graph, dynamic, implicit, tuple(rg), out_spec, out_leaves,
                       out_pos, tuple(diff), tracer.frozen_alive(), cuda)
        entry.program.traced(traced_s, len(tracer.graph.nodes))  # (heavy: compiled sooner)
        # the first call returns what the trace computed
        arrays = [out_leaves[k]._data.copy() if is_cuda_array(out_leaves[k]._data)
                  else np.array(out_leaves[k]._data, copy=True) for k in out_pos]
        user_inputs = [sig.leaves[k] for k in dynamic] + implicit
        return entry, entry.finish(user_inputs, arrays, None)

    # ------------------------------------------------------------------ inspection
    def graph(self, *args: Any, **kwargs: Any) -> str:
        """The traced graph for these arguments (tracing them if needed), as text."""
        return self._entry(args, kwargs).describe()

    def source(self, *args: Any, **kwargs: Any) -> str:
        """The tier-1 tape (or tier-2 generated code, or the fused CUDA kernels of a graph
        of CUDA tensors) that runs for these arguments."""
        return self._entry(args, kwargs).source()

    def cache_info(self) -> dict:
        """Number of cached signatures, the bound, and how many traces ran."""
        return {"entries": len(self._cache), "maxsize": self.cache_size,
                "traces": self.traces}

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
            self._fast.clear()

    def __repr__(self) -> str:
        return f"<nbgrad.jit of {getattr(self.fn, '__qualname__', self.fn)!r}, mode={self.mode}>"


class _Entry:
    """One traced signature: its graph, executables and gradient plan."""

    def __init__(self, owner: Jitted, graph: Graph, dynamic: list[int], implicit: list[Tensor],
                 rg: tuple[bool, ...], out_spec: tuple, out_leaves: list, out_pos: list[int],
                 diff: tuple[bool, ...], frozen: list, cuda: bool = False) -> None:
        self.owner = owner
        self.traced = graph
        self.graph = optimize(graph)
        self.dynamic = dynamic
        self.implicit = implicit
        self.implicit_meta = [(t._data.shape, t._data.dtype) for t in implicit]
        self.rg = rg
        self.out_spec = out_spec
        self.static_out = [None if isinstance(x, Tensor) else x for x in out_leaves]
        self.out_pos = out_pos
        self.diff = diff
        self.frozen = frozen
        #: a graph of CUDA tensors (run by nbgrad.jit.cuda.fusion, never promoted to tier 2)
        self.cuda = cuda
        fn = owner.fn
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        #: the executables by role and their tier (promotion, fallback: nbgrad.jit.program)
        self.program = Program(owner.mode, cuda, name)
        self._split = None
        #: whether calls may attach a JitBackward node (inputs and outputs that need it)
        self.grad_out = any(rg) and any(diff)
        #: the results' structure from the output tensors (see :func:`_rebuild`)
        self.rebuild = _rebuild(out_spec, self.static_out, out_pos)

    # ------------------------------------------------------------------ validity
    def valid(self) -> bool:
        for ref, version in self.frozen:
            t = ref()
            if t is not None and t._version_box[0] != version:
                return False
        for t, (shape, dtype) in zip(self.implicit, self.implicit_meta, strict=True):
            if t._data.shape != shape or t._data.dtype != dtype:
                return False
        return True

    # ------------------------------------------------------------------ executables
    @property
    def tier(self) -> str:
        """The tier this signature runs in (see :class:`~nbgrad.jit.program.Program`)."""
        return self.program.tier

    def executable(self, which: str) -> Executable:
        """The executable of role ``which`` ("main", "fwd" or "bwd")."""
        return self.program.executable(which, self._graph_of)

    def _graph_of(self, which: str) -> Graph:
        if which == "main":
            return self.graph
        split = self.split()
        return optimize(split.fwd if which == "fwd" else split.bwd)

    def split(self, example: list | None = None):
        """The forward-with-residuals and backward graphs (built on first need, by
        differentiating the graph on ``example`` input values: arrays or tensors)."""
        if self._split is None:
            if example is None:
                example = [np.zeros(v.shape, v.dtype) for v in self.graph.inputs]
            example = [a._data if isinstance(a, Tensor) else a for a in example]
            if self.cuda:  # the joint graph is traced on the CPU (ops are device-neutral)
                example = [to_host(a) for a in example]
            self._split = split_vjp(optimize(self.traced, BEFORE_AUTODIFF), self.rg, example)
        return self._split

    # ------------------------------------------------------------------ running
    def call(self, leaves: list) -> Any:
        user_inputs = [leaves[k] for k in self.dynamic] + self.implicit
        arrays = [t._data if isinstance(t, Tensor) else np.asarray(t) for t in user_inputs]
        if self.grad_out and self._split is not None:
            outs = self.program.run("fwd", self._graph_of, arrays)  # timed for the policy
            n = len(self.graph.outputs)
            return self.finish(user_inputs, outs[:n], outs[n:])
        return self.finish(user_inputs, self.program.run("main", self._graph_of, arrays), None)

    def finish(self, user_inputs: list, arrays: list[np.ndarray],
               residuals: list[np.ndarray] | None) -> Any:
        """Wrap output arrays as tensors (with a JitBackward node when needed)."""
        outs = [wrap_array(_own_dtype(a)) for a in arrays] if not self.cuda else \
            [Tensor._make(a, device=_device_of(a)) for a in arrays]
        if self.grad_out and STATE.grad_enabled:
            edges = [gradient_edge(t) if r else None
                     for t, r in zip(user_inputs, self.rg, strict=True)]
            node = JitBackward(edges)
            node.entry = self
            node.saved = [SavedTensor(t, "jit input") if isinstance(t, Tensor)
                          else SavedTensor(Tensor._make(np.asarray(t)), "jit input")
                          for t in user_inputs]
            node.residuals = residuals
            node.out_meta = [(a.shape, a.dtype, t._device) for a, t in zip(arrays, outs,
                                                                           strict=True)]
            for k, t in enumerate(outs):
                if self.diff[k]:
                    t._requires_grad = True
                    t.grad_fn = node
                    t._output_nr = k
        return self.rebuild(outs)

    # ------------------------------------------------------------------ text
    def describe(self) -> str:
        text = format_graph(self.graph)
        if self._split is not None:
            text += "\n" + format_graph(self.split().fwd, "forward") + "\n" + \
                format_graph(self.split().bwd, "backward")
        return text

    def source(self) -> str:
        parts = [self.executable("main").source()]
        if self._split is not None:
            parts += [self.executable("fwd").source(), self.executable("bwd").source()]
        return "\n\n".join(parts)


class JitBackward(Node):
    """The autograd node of a jitted call: one native backward (or an eager replay)."""

    __slots__ = ("entry", "saved", "residuals", "out_meta")

    def name(self) -> str:
        fn = self.entry.owner.fn
        return f"JitBackward({getattr(fn, '__name__', 'fn')})"

    def release(self) -> None:
        self.saved = None
        self.residuals = None

    def apply(self, grads: list, create_graph: bool) -> list:
        if self.saved is None:
            raise RuntimeError(RETAIN_GRAPH_MESSAGE)
        entry = self.entry
        inputs = [s.unpack(self) for s in self.saved]
        split = entry.split(inputs)
        joint = split.joint
        cts = []
        for k in joint.diff:
            g = grads[k] if k < len(grads) else None
            if g is None:
                shape, dtype, device = self.out_meta[k]
                g = Tensor._make(np.zeros(shape, dtype))
                if device.type != "cpu":
                    g = g.to(device)
            cts.append(g)
        out: list = [None] * len(inputs)
        # as eager autograd: an input no output with a gradient reaches gets None
        reached = reached_inputs(joint, [g is not None for g in grads])
        if not reached:
            return out
        if create_graph:
            jg = _grad_graph(split)
            grads_t = replay(jg, inputs + cts)
            for i, g in zip(joint.wrt, grads_t, strict=True):
                out[i] = g if i in reached else None
            return out
        res = self.residuals
        arrays = [t._data for t in inputs]
        if res is None:  # the first call ran the trace: recompute the saved values once
            res = entry.executable("fwd").run(arrays)[split.n_out:]
        vals = []
        ct_of = dict(zip(joint.diff, cts, strict=True))
        for kind, k in split.bwd_inputs:
            vals.append(res[k] if kind == "res" else arrays[k] if kind == "in"
                        else ct_of[k]._data)
        gs = entry.program.run("bwd", entry._graph_of, vals, count=False)
        for i, g in zip(joint.wrt, gs, strict=True):
            if i in reached:
                out[i] = Tensor._make(_own_dtype(g)) if not entry.cuda else \
                    Tensor._make(g, device=_device_of(g))
        return out


_F64, _F32 = np.dtype(np.float64), np.dtype(np.float32)


def _rebuild(spec: tuple, static_out: list, out_pos: list[int]) -> Callable[[list], Any]:
    """``outs -> results``: the output tensors ``outs`` (in ``out_pos`` order) and the
    static leaves ``static_out`` in the structure ``spec``. Planned once per signature:
    nested tuples of output tensors (the common case) are sliced, not walked leaf by
    leaf (:func:`nbgrad.pytree.unflatten`, which every other structure takes)."""
    planned = _plan(spec, 0) if out_pos == list(range(len(static_out))) else None
    if planned is not None and planned[1] == len(out_pos):
        return planned[0]

    def general(outs: list) -> Any:
        leaves = list(static_out)
        for k, t in zip(out_pos, outs, strict=True):
            leaves[k] = t
        return pytree.unflatten(spec, leaves)
    return general


def _plan(s: tuple, start: int) -> tuple[Callable[[list], Any], int] | None:
    """``(build, n)``: ``build(outs)`` is the tuple structure ``s`` of ``outs[start:start +
    n]``; None for any other structure."""
    if s[0] == "leaf":
        return (lambda outs: outs[start]), 1
    if s[0] != "tuple":
        return None
    if all(k[0] == "leaf" for k in s[1]):
        stop = start + len(s[1])
        return (lambda outs: tuple(outs[start:stop])), len(s[1])
    kids, n = [], 0
    for k in s[1]:
        sub = _plan(k, start + n)
        if sub is None:
            return None
        kids.append(sub[0])
        n += sub[1]
    return (lambda outs: tuple([f(outs) for f in kids])), n


#: ``id(dtype) -> (dtype, its canonical object)`` for the dtype objects of results: code
#: Numba loaded from its disk cache gives its arrays one equal copy per dtype (the entry
#: keeps the object alive, so its id is not reused); cleared when it grows large
_CANON: dict[int, tuple[np.dtype, np.dtype]] = {}


def _own_dtype(a: np.ndarray) -> np.ndarray:
    """``a`` with NumPy's own dtype object (:func:`nbgrad.dtypes.canonical`), or a
    jitted function's results would take the slow path in every later eager op."""
    dt = a.dtype
    if dt is _F64 or dt is _F32:
        return a
    seen = _CANON.get(id(dt))
    if seen is None or seen[0] is not dt:
        if len(_CANON) >= 256:
            _CANON.clear()
        seen = _CANON[id(dt)] = (dt, dtypes.canonical(dt))
    return a if seen[1] is dt else a.view(seen[1])


def _device_of(array):
    """The device of an output array of a CUDA graph (CUDA data, or a host array)."""
    from .cuda.fusion import device_of_array  # optional: needs a CUDA runtime
    return device_of_array(array)


def _grad_graph(split) -> Graph:
    """The joint graph with the gradients as outputs (cached on the split)."""
    jg = getattr(split, "_grad_graph", None)
    if jg is None:
        joint = split.joint
        g = joint.graph
        consts = dict(g.consts)
        outs = []
        for i, gv in zip(joint.wrt, joint.grads, strict=True):
            if gv is None:
                gv = joint.inputs[i].like()
                consts[gv] = np.zeros(gv.shape, gv.dtype)
            outs.append(gv)
        jg = Graph(list(g.inputs), consts, list(g.nodes), outs)
        split._grad_graph = jg
    return jg


def jit(fn: Callable | None = None, *, static_argnums: Sequence[int] | int = (),
        mode: str = "auto", cache_size: int = 64) -> Any:
    """Compile ``fn`` on its first call for each signature; see :mod:`nbgrad.jit.api`.

    ``mode``: ``"interpret"`` (tier 1: the precompiled tape interpreter, nothing to
    compile per graph), ``"compile"`` (tier 2: generated fused code, when available),
    ``"auto"`` (tier 1, promoting to tier 2 in the background a graph that has run about
    as long as compiling it is expected to take, or a slow one after its first call in
    tier 1). ``"auto"`` and ``"compile"`` keep tier 2 only where its calls measured
    faster than tier 1's (see :mod:`nbgrad.jit.program`). ``static_argnums``:
    positions of arguments whose values (hashable) are part of the signature.
    ``cache_size``: how many signatures are kept (least recently used dropped).
    Usable as ``@nbgrad.jit`` or ``@nbgrad.jit(static_argnums=...)``.
    """
    if fn is None:
        return lambda f: Jitted(f, static_argnums, mode, cache_size)
    return Jitted(fn, static_argnums, mode, cache_size)


__all__ = ["Jitted", "JitBackward", "TracerError", "jit"]
