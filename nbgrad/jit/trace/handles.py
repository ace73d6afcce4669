"""The handle table of PythonOp contexts and who owns each handle.

Context lifetime (ONNX Runtime kept the ctx by raw, once truncated, address and
segfaulted or leaked: onnxruntime issues 8901, 15121, 16828). Contexts live in
:data:`HANDLES`, a table keyed by a counter. Each entry has owners; it is released when
the last one goes:

- an executable run of a graph with PythonOps is an *owner scope* (:class:`OwningExecutable`,
  and :func:`run_owned` around eager loop runs). Handles created in the run that leave it
  through an output (the residuals a forward graph returns for the backward graph) are
  handed to the output arrays, with a weak reference and callback on each: the ``JitBackward``
  node keeps those arrays until its backward ran (``release()`` drops them unless
  ``retain_graph``) or until it dies with the outputs. Handles that do not leave the run
  are released when it ends;
- outside a scope (eager replays, tracing) the handle array itself is the owner;
- where a segmented run's PythonOp handle leaves the run only as itself and no native
  code reads it (``SegmentedExecutable.arrays_own``, the common case) there is no table
  entry: the handle *is* the context, a :class:`SelfHandle`, which lives as long as the
  values that hold it (the ``JitBackward`` node's residuals). An executable whose native
  code may read a handle converts a ``SelfHandle`` it is given into a table entry owned
  by a handle array (:func:`as_handle`, :class:`HandleInputs`).

Numbers, never addresses: a released handle is an error naming the Function (a second
backward without ``retain_graph``), never a crash.
"""

from __future__ import annotations

import gc
import itertools
import threading
import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ...autograd.function import FunctionCtx
from ...autograd.node import RETAIN_GRAPH_MESSAGE
from .ir import FUNCTION, LOOP, PYTHON_OP, PYTHON_OP_GRAD, Graph

__all__ = ["HANDLES", "HandleInputs", "HandleTable", "OwningExecutable", "SelfHandle",
           "as_handle", "has_python_ops", "live_contexts", "owning", "run_owned"]


# ------------------------------------------------------------------ the handle table
class HandleTable:
    """Autograd contexts of PythonOp calls, keyed by a counter (never by an address).

    Every entry counts its owners; :meth:`release` drops one and removes the entry at
    zero. ``created``/``released`` count entries over the table's life.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # finalizers may run while this thread holds it
        self._counter = itertools.count(1)
        # handle -> [ctx, name, owners] (+ the owning array's weak reference: owned())
        self._live: dict[int, list] = {}
        self.released = 0

    def register(self, ctx: FunctionCtx, name: str) -> int:
        """A new handle for ``ctx``, with one owner (the caller). No lock: taking a
        number and storing a new entry are atomic (a PythonOp makes one per call)."""
        h = next(self._counter)
        self._live[h] = [ctx, name, 1]
        return h

    def owned(self, ctx: FunctionCtx, name: str) -> np.ndarray:
        """A new handle for ``ctx`` as a 0-d int64 array, its one owner: the entry is
        released when the array dies. The entry keeps the weak reference whose callback
        does that (no :data:`_OWNER_REFS` entry, no tuple of handles: a PythonOp makes
        one per call). No lock, as :meth:`register`."""
        h = self.register(ctx, name)
        arr = np.array(h, _INT64)
        ref = _HandleRef(arr, _handle_died)
        ref.handle = h
        self._live[h].append(ref)
        return arr

    @property
    def created(self) -> int:
        """How many entries were registered (the released ones and the live ones)."""
        with self._lock:
            return self.released + len(self._live)

    def get(self, handle: int, name: str) -> FunctionCtx:
        """The context of ``handle``; a released one raises ``RuntimeError``."""
        entry = self._live.get(handle)
        if entry is None:
            raise RuntimeError(f"PythonOpGrad of {name}: its autograd context (handle "
                               f"{handle}) was already released. {RETAIN_GRAPH_MESSAGE}")
        return entry[0]

    def retain(self, *handles: int) -> None:
        """Add one owner to each of ``handles``."""
        with self._lock:
            for h in handles:
                entry = self._live.get(h)
                if entry is not None:
                    entry[2] += 1

    def release(self, *handles: int) -> None:
        """Drop one owner of each of ``handles`` (removing entries left without one)."""
        with self._lock:
            for h in handles:
                entry = self._live.get(h)
                if entry is None:
                    continue
                entry[2] -= 1
                if entry[2] <= 0:
                    del self._live[h]
                    self.released += 1

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, handle: int) -> bool:
        return handle in self._live

    def stats(self) -> dict[str, int]:
        """``{"live", "created", "released"}``."""
        with self._lock:
            live, released = len(self._live), self.released
        return {"live": live, "created": released + live, "released": released}


class _HandleRef(weakref.ref):
    """A weak reference to the array that owns ``handle`` (:meth:`HandleTable.owned`)."""

    __slots__ = ("handle",)


def _handle_died(ref: _HandleRef) -> None:
    HANDLES.release(ref.handle)


_INT64 = np.dtype(np.int64)

#: the process-wide table of PythonOp contexts
HANDLES = HandleTable()


class SelfHandle(FunctionCtx):
    """The context of a PythonOp that is its own handle (no table entry): what a segmented
    run returns in the handle's place where the handle leaves the run only as itself
    (:mod:`nbgrad.jit.segments`). :func:`live_contexts` finds them by a scan; nothing counts
    them on the hot path (a PythonOp makes one per call)."""


def live_contexts() -> int:
    """How many PythonOp contexts are alive: the entries of :data:`HANDLES` and the
    contexts that are their own handles (:class:`SelfHandle`, found among the objects the
    cyclic collector tracks: a diagnostic for tests, not for a hot path)."""
    return len(HANDLES) + sum(type(o) is SelfHandle for o in gc.get_objects())


def as_handle(value: Any) -> Any:
    """``value``, or for a :class:`SelfHandle` a new handle array owning a table entry of
    that context (for code that reads handles as numbers)."""
    return HANDLES.owned(value, "PythonOp") if type(value) is SelfHandle else value


def reads_handles(graph: Graph) -> bool:
    """Whether ``graph`` may be given context handles: it has a 0-d int64 input and a
    PythonOpGrad node (loop bodies and native Function bodies included)."""
    def compute() -> bool:
        return any(v.dtype == np.int64 and v.shape == () for v in graph.inputs) and any(
            n.op == PYTHON_OP_GRAD for n in graph.walk())
    return _cached(graph, "reads", compute)


class HandleInputs:
    """An executable whose native code may read context handles given as
    :class:`SelfHandle` objects: each becomes a handle array first (:func:`as_handle`).

    Everything else is the wrapped executable's (as :class:`OwningExecutable`).
    """

    def __init__(self, inner) -> None:
        self.inner = inner

    def run(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        return self.inner.run([as_handle(a) for a in arrays])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<handle inputs {self.inner!r}>"


def handle_inputs(exe):
    """``exe``, wrapped in :class:`HandleInputs` when its graph may be given handles."""
    return HandleInputs(exe) if reads_handles(exe.graph) else exe


# ------------------------------------------------------------------ owner scopes
class _Scope:
    __slots__ = ("created", "parent")

    def __init__(self, parent: _Scope | None) -> None:
        self.created: list[int] = []
        self.parent = parent


_TLS = threading.local()


def _scope() -> _Scope | None:
    return getattr(_TLS, "scope", None)


@contextmanager
def owner_scope():
    """Collect the handles created in this thread until :func:`settle` decides their owners.

    On an exception every handle created inside is released.
    """
    scope = _Scope(_scope())
    _TLS.scope = scope
    try:
        yield scope
    except BaseException:
        _TLS.scope = scope.parent
        HANDLES.release(*scope.created)
        raise
    _TLS.scope = scope.parent


def settle(scope: _Scope, outputs: Sequence[Any], mask: Sequence[bool]) -> None:
    """Give the handles of ``scope`` that appear in ``outputs[k]`` (where ``mask[k]``) to
    those arrays (or to the enclosing scope); release the others."""
    if not scope.created:
        return
    created = set(scope.created)
    claimed: set[int] = set()
    owners = []
    for arr, m in zip(outputs, mask, strict=False):
        if not m or not isinstance(arr, np.ndarray) or arr.dtype != np.int64:
            continue
        hs = created.intersection(arr.ravel().tolist())
        if hs:
            claimed |= hs
            owners.append((arr, tuple(hs)))
    if scope.parent is not None:
        scope.parent.created.extend(claimed)
    elif len(owners) == 1:  # the scope's one owner of these: its reference passes to it
        _release_with(*owners[0])
    else:
        for arr, hs in owners:
            HANDLES.retain(*hs)
            _release_with(arr, hs)
        HANDLES.release(*claimed)
    if len(claimed) < len(created):
        HANDLES.release(*(created - claimed))


#: weak references to arrays that own handles, by id (kept here so that their callbacks
#: run), with those handles
_OWNER_REFS: dict[int, tuple[weakref.ref, tuple[int, ...]]] = {}


def _owner_died(ref: weakref.ref) -> None:
    handles = _OWNER_REFS.pop(id(ref), None)
    if handles is not None:
        HANDLES.release(*handles[1])


def _release_with(arr: np.ndarray, handles: tuple[int, ...]) -> None:
    """Release ``handles`` when ``arr`` dies (a weak reference with a callback: cheaper
    than ``weakref.finalize`` per call, and nothing to do at interpreter exit). The
    table keeps the reference (by its id: alive, so never reused) and the handles."""
    ref = weakref.ref(arr, _owner_died)
    _OWNER_REFS[id(ref)] = (ref, handles)


def own(h: int, arr: np.ndarray, by_array: bool = False) -> None:
    """The first owner of a new handle: the current scope, else the handle array."""
    scope = None if by_array else _scope()
    if scope is not None:
        scope.created.append(h)
    else:
        weakref.finalize(arr, HANDLES.release, h)


def _cached(graph: Graph, key: str, compute: Callable[[], Any]) -> Any:
    k = ("pythonop", key)
    value = graph.cache.get(k)
    if value is None:
        value = graph.cache[k] = compute()
    return value


def has_python_ops(graph: Graph) -> bool:
    """Whether ``graph`` (loop bodies and native Function bodies included) has a PythonOp."""
    def compute() -> bool:
        for node in graph.walk():
            if node.op == PYTHON_OP or (node.op == FUNCTION
                                        and has_python_ops(node.attrs["#forward"])):
                return True
        return False
    return _cached(graph, "has", compute)


def handle_mask(graph: Graph) -> list[bool]:
    """Per graph output: whether it may hold context handles made by this graph's PythonOps
    (int64 values that depend on a handle)."""
    def compute() -> list[bool]:
        h: set[int] = set()
        for node in graph.nodes:
            if node.op == PYTHON_OP:
                h.add(id(node.outputs[0]))
                continue
            inner = (node.op == LOOP and has_python_ops(node.attrs["body"])) or (
                node.op == FUNCTION and has_python_ops(node.attrs["#forward"]))
            if inner or any(v is not None and id(v) in h for v in node.inputs):
                h.update(id(v) for v in node.outputs if v.dtype == np.int64)
        return [id(v) in h for v in graph.outputs]
    return _cached(graph, "mask", compute)


class OwningExecutable:
    """An executable of a graph with PythonOps, run as an owner scope of its handles.

    Everything else (``graph``, ``tier``, ``source()``...) is the wrapped executable's.
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.mask = handle_mask(inner.graph)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        # owner_scope() inlined (a generator-based context manager costs a few us a call)
        parent = getattr(_TLS, "scope", None)
        scope = _TLS.scope = _Scope(parent)
        try:
            outs = self.inner.run(arrays)
        except BaseException:
            _TLS.scope = parent
            HANDLES.release(*scope.created)
            raise
        _TLS.scope = parent
        settle(scope, outs, self.mask)
        return outs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<owning {self.inner!r}>"


def owning(exe):
    """``exe``, wrapped in an :class:`OwningExecutable` when its graph has PythonOps
    (a :class:`HandleInputs` wraps what this gave already)."""
    if isinstance(exe, (OwningExecutable, HandleInputs)) or not has_python_ops(exe.graph):
        return exe
    return OwningExecutable(exe)


def run_owned(graph: Graph, thunk: Callable[[], list]) -> list:
    """``thunk()`` (which computes ``graph``'s outputs) as an owner scope of its handles."""
    if not has_python_ops(graph):
        return thunk()
    with owner_scope() as scope:
        outs = thunk()
    settle(scope, outs, handle_mask(graph))
    return outs
