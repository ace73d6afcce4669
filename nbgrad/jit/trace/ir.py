"""The graph IR of ``nbgrad.jit``: a flat, typed, printable dataflow graph.

This module is the contract between the tracer, the passes, the tier-1 tape
interpreter and tier-2 code generation. It is kept small and stable.

Values
    A :class:`Var` is one tensor value: ``shape`` (a tuple of ints) and ``dtype``
    (a NumPy dtype). Vars are compared by identity. Every var is defined exactly once:
    as a graph input, as a constant (``graph.consts[var]`` holds its array, never
    mutated), or as an output of one node.

Nodes
    A :class:`Node` applies ``op`` to ``inputs`` and defines ``outputs``.

    - For a table op (any name in ``formulas/derivatives.yaml``), ``inputs`` are the
      op's tensor arguments in table order, tensor lists flattened, ``None`` for an
      absent optional tensor; ``attrs`` maps the names of the op's other parameters to
      their values (ints, floats, bools, None, tuples, NumPy dtypes, strings, an
      ``Index``), in table order, plus ``"#name": length`` for each tensor list. The
      node computes exactly what ``nbgrad.ops.dispatch.apply(op, args)`` computes in
      eager mode (see :func:`node_args`), so replaying a graph with eager ops is the
      reference semantics.
    - ``op == "loop"`` is a structured loop (``fori_loop``, ``scan`` and re-rolled
      Python loops all become one): a generalised scan with affine indexing. See
      :class:`LoopInfo` for its attributes. Its ``attrs["body"]`` is a sub-graph.

    - Custom ``autograd.Function`` calls: ``op == "PythonOp"`` (inputs the Function's
      tensor arguments; outputs an int64 context handle, then its outputs) and
      ``"PythonOpGrad"`` (inputs the handle, the output gradients or ``None``, the
      forward outputs; outputs the input gradients) call the user's Python code, with
      ONNX Runtime's attributes (:mod:`nbgrad.jit.trace.pythonop`); ``"Function"`` is a
      Function that compiles, its forward a sub-graph in ``attrs["#forward"]`` that is
      inlined before lowering, and ``"OnceDifferentiable"`` an identity marker on the
      results of a ``once_differentiable`` backward (:mod:`nbgrad.jit.trace.function_trace`).
      Their semantics are their ``replay`` in :mod:`nbgrad.jit.trace.pythonop`.
    - ``op == "StopGradient"`` is the identity with no gradient: the tracer puts it where
      eager mode cuts the autograd graph (``detach()``, a value made under ``no_grad()``
      read with grad enabled, ...), so differentiating the graph cuts there too. It and
      ``OnceDifferentiable`` are *markers* (``MARKERS``): one value to one of the same
      type, the identity when run, removed before a graph is lowered or compiled.

Loops
    ``inputs = carry inits + xs stacks + invariants``; ``outputs = final carries + ys
    stacks``. Iteration ``j`` (``j = 0 .. count-1``) runs ``body`` on
    ``[index?] + carries + [xs_k[start_k + step_k * j]] + invariants`` and gets
    ``new carries + [y_k]``; ``y_k`` is stored at ``ys_k[start_k + step_k * j]`` of a
    stack of ``length_k`` rows (rows never written are zero). ``index``, when present,
    is an int64 scalar ``index_start + index_step * j``. Loops never unroll: tier 1
    lowers them to a LOOP instruction and tier 2 to a native loop.

Graph
    ``inputs`` (list of vars), ``consts`` (dict var -> array), ``nodes`` (a list in a
    valid execution order) and ``outputs`` (list of vars, repeats allowed).
    :func:`check` verifies well-formedness, :func:`format_graph` prints it and
    :func:`graph_hash` gives a stable content hash (same structure, shapes, dtypes,
    attributes and constant values give the same hash across processes).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import TracerError
from ...ops.registry import REGISTRY

LOOP = "loop"
#: custom ``autograd.Function`` nodes (see :mod:`nbgrad.jit.trace.pythonop` and
#: :mod:`nbgrad.jit.trace.function_trace`)
PYTHON_OP = "PythonOp"
PYTHON_OP_GRAD = "PythonOpGrad"
FUNCTION = "Function"
ONCE_DIFFERENTIABLE = "OnceDifferentiable"
#: the identity with no gradient, where eager mode cuts the autograd graph
STOP_GRADIENT = "StopGradient"
#: identity markers: removed before lowering, their meaning is their gradient
MARKERS = frozenset({ONCE_DIFFERENTIABLE, STOP_GRADIENT})
CUSTOM_KINDS = frozenset({PYTHON_OP, PYTHON_OP_GRAD, FUNCTION}) | MARKERS
#: nodes that call Python code with side effects: never evaluated at graph-build time
IMPURE = frozenset({PYTHON_OP, PYTHON_OP_GRAD})


class Var:
    """One tensor value of a graph (compared by identity)."""

    __slots__ = ("shape", "dtype", "__weakref__")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: np.dtype) -> Var:
        """``Var(shape, dtype)`` for a shape that is a tuple of ints and a NumPy dtype (an
        array's), without converting them."""
        v = object.__new__(cls)
        v.shape = shape
        v.dtype = dtype
        return v

    def like(self) -> Var:
        """A new var of the same shape and dtype."""
        return Var.of(self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"Var({type_str(self)})"


class Node:
    """``outputs = op(inputs; attrs)``."""

    __slots__ = ("op", "inputs", "outputs", "attrs")

    def __init__(self, op: str, inputs: Iterable[Var | None], outputs: Iterable[Var],
                 attrs: dict[str, Any] | None = None) -> None:
        self.op = op
        self.inputs: tuple[Var | None, ...] = tuple(inputs)
        self.outputs: tuple[Var, ...] = tuple(outputs)
        self.attrs: dict[str, Any] = dict(attrs or {})

    @classmethod
    def of(cls, op: str, inputs: tuple[Var | None, ...], outputs: tuple[Var, ...],
           attrs: dict[str, Any]) -> Node:
        """``Node(op, inputs, outputs, attrs)`` taking a tuple, a tuple and a new dict as
        they are (no copies)."""
        n = object.__new__(cls)
        n.op, n.inputs, n.outputs, n.attrs = op, inputs, outputs, attrs
        return n

    @property
    def is_loop(self) -> bool:
        return self.op == LOOP

    def __repr__(self) -> str:
        return f"Node({self.op}, {len(self.inputs)} in, {len(self.outputs)} out)"


class Graph:
    """Inputs, constants, nodes in execution order, and outputs."""

    __slots__ = ("inputs", "consts", "nodes", "outputs", "cache")

    def __init__(self, inputs: list[Var] | None = None, consts: dict[Var, np.ndarray] | None = None,
                 nodes: list[Node] | None = None, outputs: list[Var] | None = None) -> None:
        self.inputs: list[Var] = list(inputs or [])
        self.consts: dict[Var, np.ndarray] = dict(consts or {})
        self.nodes: list[Node] = list(nodes or [])
        self.outputs: list[Var] = list(outputs or [])
        #: derived data (plans, programs) keyed by their users; not part of the graph
        self.cache: dict[Any, Any] = {}

    def add_const(self, value: np.ndarray) -> Var:
        """A new constant var holding a private copy of ``value`` (never written)."""
        arr = np.array(value, copy=True)
        v = Var(arr.shape, arr.dtype)
        self.consts[v] = arr
        return v

    def copy(self) -> Graph:
        """A shallow copy: new lists and dicts, the same vars and nodes."""
        return Graph(list(self.inputs), dict(self.consts), list(self.nodes), list(self.outputs))

    def walk(self) -> Iterator[Node]:
        """Every node, loop bodies included (depth first)."""
        for node in self.nodes:
            yield node
            if node.op == LOOP:
                yield from node.attrs["body"].walk()

    def __str__(self) -> str:
        return format_graph(self)


@dataclass(frozen=True)
class LoopInfo:
    """The attributes of a ``loop`` node, read back (``LoopInfo.of(node)``).

    - ``count``: number of iterations (>= 0);
    - ``n_carry``, ``n_xs``: how many inputs are carries and stacks (the rest are
      invariants);
    - ``xs_index``: ``(start, step)`` per xs stack: iteration ``j`` reads row
      ``start + step * j``;
    - ``ys_index``: ``(start, step, length)`` per ys output: iteration ``j`` writes row
      ``start + step * j`` of a stack of ``length`` rows (other rows are zero);
    - ``index``: ``(start, step)`` when the body's first input is the int64 counter
      ``start + step * j``, else ``None``;
    - ``body``: the body graph;
    - ``remat``: the gradient stacks only the step inputs and recomputes the rest of
      the body during backward (a checkpointed loop, ``fori_loop(checkpoint=...)``).
    """

    count: int
    n_carry: int
    n_xs: int
    xs_index: tuple[tuple[int, int], ...]
    ys_index: tuple[tuple[int, int, int], ...]
    index: tuple[int, int] | None
    body: Graph
    remat: bool = False

    @staticmethod
    def of(node: Node) -> LoopInfo:
        a = node.attrs
        return LoopInfo(a["count"], a["n_carry"], a["n_xs"], a["xs_index"], a["ys_index"],
                        a["index"], a["body"], a.get("remat", False))

    @property
    def n_ys(self) -> int:
        return len(self.ys_index)

    def attrs(self) -> dict[str, Any]:
        return {"count": self.count, "n_carry": self.n_carry, "n_xs": self.n_xs,
                "xs_index": self.xs_index, "ys_index": self.ys_index, "index": self.index,
                "body": self.body, "remat": self.remat}

    def body_inputs(self) -> tuple[Var | None, list[Var], list[Var], list[Var]]:
        """(index var or None, carry vars, xs row vars, invariant vars) of the body."""
        ins = self.body.inputs
        k = 1 if self.index is not None else 0
        idx = ins[0] if k else None
        carry = ins[k:k + self.n_carry]
        xs = ins[k + self.n_carry:k + self.n_carry + self.n_xs]
        inv = ins[k + self.n_carry + self.n_xs:]
        return idx, list(carry), list(xs), list(inv)


def make_loop(inputs: list[Var], outputs: list[Var], info: LoopInfo) -> Node:
    return Node(LOOP, inputs, outputs, info.attrs())


def inline_graph(graph: Graph, m: dict[int, Var], nodes: list[Node], consts: dict
                 ) -> list[Var]:
    """Append copies of ``graph``'s nodes (fresh values) to ``nodes`` and of its constants
    to ``consts``, its inputs read from ``m`` (``id(input) -> value``, which the copies
    extend); its outputs among the new values."""
    for cv, arr in graph.consts.items():
        nv = cv.like()
        consts[nv] = arr
        m[id(cv)] = nv
    for n in graph.nodes:
        outs = [v.like() for v in n.outputs]
        for a, b in zip(n.outputs, outs, strict=True):
            m[id(a)] = b
        nodes.append(Node(n.op, [None if v is None else m[id(v)] for v in n.inputs], outs,
                          n.attrs))
    return [m[id(v)] for v in graph.outputs]


# ------------------------------------------------------------------ replay helpers
def node_args(node: Node, values: list) -> tuple:
    """The ``apply`` arguments of a table-op node, with ``values`` for its inputs."""
    op = REGISTRY[node.op]
    it = iter(values)
    args = []
    for p in op.params:
        if p.is_tensor:
            args.append(next(it))
        elif p.is_tensor_list:
            args.append([next(it) for _ in range(node.attrs["#" + p.name])])
        else:
            args.append(node.attrs[p.name])
    return tuple(args)


# ------------------------------------------------------------------ printing
_DT = {"float64": "f64", "float32": "f32", "int64": "i64", "int32": "i32", "bool": "bool",
       "int8": "i8", "uint8": "u8", "int16": "i16", "float16": "f16", "complex128": "c128"}


def type_str(v: Var) -> str:
    return f"{_DT.get(v.dtype.name, v.dtype.name)}[{','.join(map(str, v.shape))}]"


def _attr_str(value: Any) -> str:
    if isinstance(value, Graph):
        return "<graph>"
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name
    if isinstance(value, np.ndarray):
        return f"array{tuple(value.shape)}:{value.dtype.name}"
    return repr(value)


def _const_str(arr: np.ndarray) -> str:
    if arr.size <= 6:
        return np.array2string(arr, separator=", ", precision=17 if arr.dtype.kind == "f"
                               else None).replace("\n", "")
    return f"<{arr.size} values, sum={arr.sum()!r}>"


def format_graph(graph: Graph, name: str = "graph") -> str:
    """Readable text of ``graph`` (loop bodies nested and indented)."""
    names: dict[int, str] = {}
    lines: list[str] = []
    _format(graph, name, names, lines, "", [0])
    return "\n".join(lines)


def _format(graph: Graph, title: str, names: dict, lines: list, ind: str, counter: list) -> None:
    def nm(v: Var | None) -> str:
        if v is None:
            return "None"
        s = names.get(id(v))
        if s is None:
            s = names[id(v)] = f"%{counter[0]}"
            counter[0] += 1
        return s

    params = ", ".join(f"{nm(v)}: {type_str(v)}" for v in graph.inputs)
    lines.append(f"{ind}{title}({params}) {{")
    for v, arr in graph.consts.items():
        lines.append(f"{ind}  {nm(v)}: {type_str(v)} = const {_const_str(arr)}")
    for node in graph.nodes:
        ins = ", ".join(nm(v) for v in node.inputs)
        outs = ", ".join(f"{nm(v)}: {type_str(v)}" for v in node.outputs)
        if node.op == LOOP:
            info = LoopInfo.of(node)
            extra = (f"count={info.count}, carry={info.n_carry}, xs={info.xs_index}, "
                     f"ys={info.ys_index}, index={info.index}"
                     + (", remat=True" if info.remat else ""))
            lines.append(f"{ind}  {outs} = loop({ins}) {extra}")
            _format(info.body, "body", names, lines, ind + "    ", counter)
            continue
        attrs = ", ".join(f"{k}={_attr_str(v)}" for k, v in node.attrs.items()
                          if not k.startswith("#"))
        tail = f" {{{attrs}}}" if attrs else ""
        lines.append(f"{ind}  {outs} = {node.op}({ins}){tail}")
    lines.append(f"{ind}  return ({', '.join(nm(v) for v in graph.outputs)})")
    lines.append(f"{ind}}}")


# ------------------------------------------------------------------ checking
class _Where:
    """``node k (op)`` or ``output j of node k (op)``, formatted only for an error."""

    __slots__ = ("k", "of")

    def __init__(self, k: int, of: Any) -> None:
        self.k, self.of = k, of

    def __str__(self) -> str:
        if isinstance(self.of, _Where):
            return f"output {self.k} of {self.of}"
        return f"node {self.k} ({self.of})"


def check(graph: Graph, *, _defined: set | None = None) -> None:
    """Raise ``TracerError`` naming the problem unless ``graph`` is well formed."""
    defined: set[int] = set()

    def define(v: Any, what: str) -> None:
        if not isinstance(v, Var):
            raise TracerError(f"ill-formed graph: {what} is {v!r}, not a Var")
        if id(v) in defined:
            raise TracerError(f"ill-formed graph: {type_str(v)} defined twice ({what})")
        for s in v.shape:
            if not isinstance(s, int) or s < 0:
                raise TracerError(f"ill-formed graph: bad shape {v.shape} ({what})")
        defined.add(id(v))

    for i, v in enumerate(graph.inputs):
        define(v, f"input {i}")
    for v, arr in graph.consts.items():
        define(v, "a constant")
        if not isinstance(arr, np.ndarray) or arr.shape != v.shape or arr.dtype != v.dtype:
            raise TracerError(f"ill-formed graph: constant {type_str(v)} holds "
                              f"{getattr(arr, 'shape', None)} {getattr(arr, 'dtype', None)}")
    for k, node in enumerate(graph.nodes):
        where = _Where(k, node.op)
        for v in node.inputs:
            if v is not None and id(v) not in defined:
                raise TracerError(f"ill-formed graph: {where} reads a value defined later "
                                  "or nowhere")
        if node.op == LOOP:
            _check_loop(node, str(where))
        elif node.op in CUSTOM_KINDS:
            from .pythonop import check_node  # cyclic: pythonop builds on the IR
            check_node(node, str(where))
        else:
            op = REGISTRY.get(node.op)
            if op is None or op.entry is None:
                raise TracerError(f"ill-formed graph: {where}: unknown op")
            n_tensors = len(op.tensor_pos)
            attrs = node.attrs
            for i in op.list_pos:
                n_tensors += attrs.get("#" + op.params[i].name, -10**9)
            for _, name in op.attr_names:
                if name not in attrs:
                    raise TracerError(f"ill-formed graph: {where} lacks attribute {name!r}")
            if n_tensors != len(node.inputs):
                raise TracerError(f"ill-formed graph: {where} has {len(node.inputs)} inputs, "
                                  f"its op takes {n_tensors}")
        for j, v in enumerate(node.outputs):
            define(v, _Where(j, where))
    for i, v in enumerate(graph.outputs):
        if id(v) not in defined:
            raise TracerError(f"ill-formed graph: output {i} is not defined")


def _check_loop(node: Node, where: str) -> None:
    for key in ("count", "n_carry", "n_xs", "xs_index", "ys_index", "index", "body"):
        if key not in node.attrs:
            raise TracerError(f"ill-formed graph: {where} lacks attribute {key!r}")
    info = LoopInfo.of(node)
    body = info.body
    n_inv = len(node.inputs) - info.n_carry - info.n_xs
    k = 1 if info.index is not None else 0
    if n_inv < 0 or len(body.inputs) != k + len(node.inputs):
        raise TracerError(f"ill-formed graph: {where}: the body takes {len(body.inputs)} "
                          f"inputs for {len(node.inputs)} loop inputs")
    if len(body.outputs) != info.n_carry + info.n_ys or \
            len(node.outputs) != info.n_carry + info.n_ys:
        raise TracerError(f"ill-formed graph: {where}: outputs do not match carries + ys")
    if len(info.xs_index) != info.n_xs or info.count < 0:
        raise TracerError(f"ill-formed graph: {where}: bad xs_index or count")
    idx, carry, xs, inv = info.body_inputs()
    if idx is not None and (idx.shape != () or idx.dtype != np.int64):
        raise TracerError(f"ill-formed graph: {where}: the index must be an int64 scalar")
    for c, init, new, out in zip(carry, node.inputs[:info.n_carry], body.outputs,
                                 node.outputs, strict=False):
        if not (c.shape == init.shape == new.shape == out.shape
                and c.dtype == init.dtype == new.dtype == out.dtype):
            raise TracerError(f"ill-formed graph: {where}: a carry changes type "
                              f"({type_str(init)} -> {type_str(new)})")
    for x, stack, (start, step) in zip(xs, node.inputs[info.n_carry:info.n_carry + info.n_xs],
                                       info.xs_index,
                                       strict=True):
        if stack.shape[1:] != x.shape or stack.dtype != x.dtype or not stack.shape:
            raise TracerError(f"ill-formed graph: {where}: xs stack {type_str(stack)} does "
                              f"not match its row {type_str(x)}")
        if info.count and not (0 <= start < stack.shape[0]
                               and 0 <= start + step * (info.count - 1) < stack.shape[0]):
            raise TracerError(f"ill-formed graph: {where}: xs rows out of range")
    for y, out, (start, step, length) in zip(body.outputs[info.n_carry:],
                                             node.outputs[info.n_carry:], info.ys_index,
                                             strict=True):
        if out.shape != (length,) + y.shape or out.dtype != y.dtype:
            raise TracerError(f"ill-formed graph: {where}: ys stack {type_str(out)} does not "
                              f"match its row {type_str(y)}")
        if info.count and not (0 <= start < length
                               and 0 <= start + step * (info.count - 1) < length):
            raise TracerError(f"ill-formed graph: {where}: ys rows out of range")
    for v, b in zip(inv, node.inputs[info.n_carry + info.n_xs:], strict=True):
        if v.shape != b.shape or v.dtype != b.dtype:
            raise TracerError(f"ill-formed graph: {where}: invariant types differ")
    check(body)


# ------------------------------------------------------------------ hashing
def graph_hash(graph: Graph) -> str:
    """A stable hex digest of the graph's structure, types, attributes and constants."""
    h = hashlib.blake2b(digest_size=16)
    _hash_graph(graph, h)
    return h.hexdigest()


def _hash_graph(graph: Graph, h) -> None:
    ids: dict[int, int] = {}

    def var(v: Var | None) -> bytes:
        if v is None:
            return b"N"
        return struct.pack("<q", ids[id(v)])

    def define(v: Var) -> None:
        ids[id(v)] = len(ids)
        h.update(f"{v.dtype.str}{v.shape}".encode())

    h.update(b"G")
    for v in graph.inputs:
        define(v)
    h.update(b"C")
    for v, arr in graph.consts.items():
        define(v)
        h.update(np.ascontiguousarray(arr).tobytes())
    for node in graph.nodes:
        h.update(b"n" + node.op.encode() + b"(")
        for v in node.inputs:
            h.update(var(v))
        h.update(b")")
        for key, value in node.attrs.items():
            h.update(key.encode() + b"=")
            _hash_value(value, h)
        for v in node.outputs:
            define(v)
    h.update(b"R")
    for v in graph.outputs:
        h.update(var(v))


def _hash_value(value: Any, h) -> None:
    if isinstance(value, Graph):
        h.update(b"g")
        _hash_graph(value, h)
    elif isinstance(value, np.ndarray):
        h.update(f"a{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (tuple, list)):
        h.update(f"{type(value).__name__}{len(value)}[".encode())
        for item in value:
            _hash_value(item, h)
        h.update(b"]")
    elif isinstance(value, float):
        h.update(b"f" + struct.pack("<d", value))
    elif isinstance(value, np.dtype):
        h.update(b"d" + value.str.encode())
    elif isinstance(value, type) and issubclass(value, np.generic):
        h.update(b"d" + np.dtype(value).str.encode())
    elif isinstance(value, np.generic):
        h.update(f"s{value.dtype.str}".encode() + value.tobytes())
    else:
        h.update(f"{type(value).__name__}:{value!r}".encode())


def exact_key(value: Any) -> tuple:
    """A hashable key of a hashable value, equal only for values no op can tell apart:
    floats by their bits (``-0.0 == 0.0`` in Python, not to ``atan2``; NaN equals
    itself), and every item of a tuple or list with its type (``(1, 2) == (1.0, 2)``)."""
    if isinstance(value, (float, np.floating)):
        return (type(value).__name__, float(value).hex())
    if isinstance(value, (complex, np.complexfloating)):
        return (type(value).__name__, value.real.hex(), value.imag.hex())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(exact_key(v) for v in value)
    return (type(value), value)


# ------------------------------------------------------------------ small utilities
def users(graph: Graph) -> dict[int, list[Node]]:
    """id(var) -> nodes (of this graph, not bodies) reading it."""
    out: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            if v is not None:
                out.setdefault(id(v), []).append(node)
    return out


def producers(graph: Graph) -> dict[int, Node]:
    """id(var) -> the node defining it."""
    return {id(v): node for node in graph.nodes for v in node.outputs}
