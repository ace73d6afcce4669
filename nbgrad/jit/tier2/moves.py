"""Tier-2 lowering of data movement and of native opaque ops.

- a :class:`~nbgrad.ops.traits.Move` op (``flip``, ``roll``, ``repeat``, ``split``, an
  integer-array index...): the source position of every output element is found when
  the code is generated, by running the op's CPU kernel on an ``arange`` of the input's
  shape; the output is then a strided loop nest (positions in arithmetic progression)
  or a gather loop over a constant index array (written into the module when small);
- :class:`~nbgrad.ops.traits.Join` (``cat``, ``stack``) and
  :class:`~nbgrad.ops.traits.IndexScatter` (``index_backward``, ``index_put``): the
  same positions, written (or accumulated) into the output;
- an :class:`~nbgrad.ops.traits.Opaque` op with a ``native`` ``@njit`` function: a
  direct call, bound as a global of the generated module (never ``objmode``).

:class:`MovesEmitter` is a part of :class:`~nbgrad.jit.tier2.emit.FunctionEmitter`.
"""

from __future__ import annotations

import hashlib
import inspect
import math

import numpy as np

from ...ops.registry import REGISTRY
from ...ops.traits import NativePlan, Opaque
from ..trace.ir import Node, Var, node_args
from .store import UNICODE, Scope, Store, _contiguous, cast, empty, fill, literal, np_type

#: index arrays with at most this many entries are written into the generated module
#: (readable in ``compiled.source()``); larger ones are passed as arguments
INLINE_POSITIONS = 4096
#: inputs larger than this are not mapped (running the kernel on their positions costs
#: memory); the op goes through objmode
MAX_MAPPED = 50_000_000


class NotNative(Exception):
    """A rule of this module does not apply: the node goes through objmode (the
    message is the reason shown in the generated source)."""


def positions_of(node: Node, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Run ``node``'s CPU kernel on the flat positions of its inputs (numbered one after
    the other); returns the position arrays of its outputs."""
    if sum(math.prod(s) for s in shapes) > MAX_MAPPED:
        raise NotNative("too large to map the element positions")
    base, values = 0, []
    for s in shapes:
        n = math.prod(s)
        values.append(np.arange(base, base + n, dtype=np.int64).reshape(s))
        base += n
    try:
        with np.errstate(all="ignore"):
            out = REGISTRY[node.op].kernel_for("cpu")(*node_args(node, values))
    except Exception as exc:  # the kernel refused these shapes: run it eagerly
        raise NotNative(f"its kernel did not map positions ({type(exc).__name__})") from None
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return [np.asarray(o) for o in outs]


def strided(pos: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """``(offset, strides)`` when ``pos[i0, i1, ...] == offset + sum(i_d * strides[d])``."""
    if pos.size == 0:
        return None
    flat = pos.reshape(-1)
    off = int(flat[0])
    strides = []
    for d, n in enumerate(pos.shape):
        unit = [0] * pos.ndim
        if n > 1:
            unit[d] = 1
        strides.append(int(pos[tuple(unit)]) - off if n > 1 else 0)
    want = np.full(pos.shape, off, dtype=np.int64)
    for d, s in enumerate(strides):
        shape = [1] * pos.ndim
        shape[d] = pos.shape[d]
        want = want + np.arange(pos.shape[d], dtype=np.int64).reshape(shape) * s
    return (off, tuple(strides)) if np.array_equal(want, pos) else None


def affine_text(off: int, steps: tuple[int, ...]) -> str:
    """``off + steps[0] * i0 + ...`` as source text."""
    text = str(off) if off else ""
    for d, st in enumerate(steps):
        if st:
            term = f"i{d}" if abs(st) == 1 else f"{abs(st)} * i{d}"
            text = (f"{text} - {term}" if text else f"-{term}") if st < 0 else \
                (f"{text} + {term}" if text else term)
    return text or "0"


def const_text(value, array: bool = False) -> str:
    """Source text of a constant argument of a native call.

    Integers, booleans and strings are written as ``np.int64(3)``/``np.bool_(True)``/
    ``nb_unicode('...')`` (:func:`nbgrad.jit.tier2.alloc.unicode`; ``str('...')`` would
    compile ``str``'s overload in every process): a bare literal would type as
    ``Literal[int](3)`` (``Literal[str]``) and compile the native once per value (an error
    message names the shapes, so once per graph).
    """
    if value is None:
        return "None"
    if isinstance(value, (bool, np.bool_)):
        return f"np.bool_({bool(value)})"
    if isinstance(value, (int, np.integer)):
        return f"np.int64({int(value)})"
    if isinstance(value, (float, np.floating)):
        return literal(float(value), np.dtype(np.float64))
    if isinstance(value, str):  # unicode_type, not a Literal[str] per message
        return f"{UNICODE}({value!r})"
    if isinstance(value, (tuple, list)):
        if array:  # a NativePlan's tuple: an int64 array, whatever its length
            return (f"np.array([{', '.join(str(int(v)) for v in value)}], np.int64)"
                    if value else empty(0, np.int64))
        return "(" + "".join(f"{const_text(v)}, " for v in value).rstrip(" ") + ")"
    if isinstance(value, np.dtype) or (isinstance(value, type) and
                                       issubclass(value, np.generic)):
        return np_type(np.dtype(value))
    raise NotNative(f"a constant argument of type {type(value).__name__}")


def native_digest(fn) -> str:
    """A digest of the file defining ``fn`` (Numba's cache of the generated module does
    not track the code it calls: the module's text changes with it instead)."""
    py = getattr(fn, "py_func", fn)
    try:
        with open(inspect.getsourcefile(py) or "", "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except (OSError, TypeError):
        return "unknown"


class MovesEmitter:
    """Move, join, index-scatter and native-call lowering; relies on the helpers of
    ``FunctionEmitter`` (``line``, ``fresh_name``, ``store_array``...)."""

    def flat_source(self, v: Var, scope: Scope) -> str:
        """A 1-d C-contiguous view of array value ``v`` (C order)."""
        s = scope.get(v)
        name = self.fresh_name(f"flat{self.num(v)}")
        self.line(f"{name} = {_contiguous(s)}.reshape({v.size})")
        return name

    def positions_text(self, pos: np.ndarray, hint: str) -> str:
        """The name of a constant int64 index array (a module global when small)."""
        flat = np.ascontiguousarray(pos.reshape(-1), dtype=np.int64)
        name = self.fresh_name(hint)
        if flat.size <= INLINE_POSITIONS:
            self.globals_lines.append(
                f"{name} = np.array([{', '.join(map(str, flat.tolist()))}], np.int64)")
        else:
            self.const_args.append((name, flat))
        return name

    def gather(self, y: Var, pos: np.ndarray, src: str, src_dt: np.dtype,
               scope: Scope) -> None:
        """``y[k] = src[pos[k]]`` for every element ``k`` of ``y`` (``src``: a flat array)."""
        def read(i: str) -> str:
            return cast(f"{src}[{i}]", src_dt, y.dtype)

        if y.shape == ():
            self.line(f"{self.define_scalar(y, scope).name} = {read(str(int(pos.flat[0])))}")
            return
        s = self.store_array(y, scope)
        pat = strided(pos)
        if pat is not None:  # positions in arithmetic progression: a loop nest
            for d, n in enumerate(y.shape):
                self.line(f"for i{d} in range({n}):", d)
            idx = [f"i{d}" for d in range(y.ndim)]
            self.line(f"{s.ref(idx)} = {read(affine_text(*pat))}", y.ndim)
            return
        n = y.shape[-1]
        if n > 1 and np.array_equal(pos - pos[..., :1], np.broadcast_to(
                np.arange(n, dtype=np.int64), pos.shape)):
            # whole rows move: gather the rows (a contiguous inner loop)
            rows = y.size // n
            ia = self.positions_text(pos[..., 0], f"pos{self.num(y)}")
            out = self.fresh_name(f"rows{self.num(y)}")
            self.line(f"{out} = {s.name}.reshape(({rows}, {n}))")
            start = self.fresh_name(f"start{self.num(y)}")
            self.line(f"for q in range({rows}):")
            self.line(f"{start} = {ia}[q]", 1)
            self.line(f"for j in range({n}):", 1)
            self.line(f"{out}[q, j] = {read(f'{start} + j')}", 2)
            return
        ia = self.positions_text(pos, f"pos{self.num(y)}")
        out = self.fresh_name(f"flat{self.num(y)}")
        self.line(f"{out} = {s.name}.reshape({y.size})")
        self.line(f"for q in range({y.size}):")
        self.line(f"{out}[q] = {read(f'{ia}[q]')}", 1)

    def scatter(self, out: str, out_dt: np.dtype, pos: np.ndarray, v: Var, scope: Scope,
                op: str) -> None:
        """``out[pos[k]] (op)= v[k]`` for every element ``k`` of ``pos`` (``v`` broadcast
        to ``pos``'s shape; ``out``: a flat array), in C order."""
        s = scope.get(v)
        nd = pos.ndim
        if s.kind != "array":
            value = cast(s.name, v.dtype, out_dt)
        else:
            lead = nd - v.ndim
            value = cast(s.ref(["0" if (n == 1 and pos.shape[lead + k] != 1) else f"i{lead + k}"
                                for k, n in enumerate(v.shape)]), v.dtype, out_dt)
        pat = strided(pos)
        if pat is not None:
            for d, n in enumerate(pos.shape):
                self.line(f"for i{d} in range({n}):", d)
            self.line(f"{out}[{affine_text(*pat)}] {op} {value}", nd)
            return
        ia = self.positions_text(pos, "pos")
        if s.kind == "array" and v.shape != pos.shape:  # broadcast: a loop nest
            for d, n in enumerate(pos.shape):
                self.line(f"for i{d} in range({n}):", d)
            size, terms = 1, []  # the flat (C order) index of element (i0, i1, ...)
            for d in range(nd - 1, -1, -1):
                terms.insert(0, f"i{d}" if size == 1 else f"{size} * i{d}")
                size *= pos.shape[d]
            self.line(f"{out}[{ia}[{' + '.join(terms) or '0'}]] {op} {value}", nd)
            return
        if s.kind == "array":
            src = self.flat_source(v, scope)
            value = cast(f"{src}[q]", v.dtype, out_dt)
        self.line(f"for q in range({pos.size}):")
        self.line(f"{out}[{ia}[q]] {op} {value}", 1)

    # ------------------------------------------------------------------ joins, scatters
    def emit_join(self, node: Node, scope: Scope) -> None:
        """``cat``/``stack``: every input written at its positions in the output."""
        y = node.outputs[0]
        ins = list(node.inputs)
        if any(v is None for v in ins):
            raise NotNative("an absent input")
        (pos,) = positions_of(node, [v.shape for v in ins])
        if pos.shape != y.shape:
            raise NotNative("its kernel did not map positions to its output")
        self.line(f"# {self.comment_node(node)}  [positions from its kernel]")
        if y.shape == ():
            v = ins[0]
            self.line(f"{self.define_scalar(y, scope).name} = "
                      f"{cast(scope.get(v).name, v.dtype, y.dtype)}")
            return
        s = self.store_array(y, scope)
        out = self.fresh_name(f"flat{self.num(y)}")
        self.line(f"{out} = {s.name}.reshape({y.size})")
        order = np.argsort(pos.reshape(-1), kind="stable")  # source element -> output
        base = 0
        for v in ins:
            dst = order[base:base + v.size].reshape(v.shape)
            base += v.size
            if v.size:
                self.scatter(out, y.dtype, dst, v, scope, "=")

    def emit_index_scatter(self, node: Node, scope: Scope, put: bool) -> None:
        """``index_backward`` (zeros, the gradient added at the index) or ``index_put``
        (a copy of ``self``, values written or added at the index)."""
        y = node.outputs[0]
        idx = node.attrs["indices"]
        sel = np.arange(y.size, dtype=np.int64).reshape(y.shape)[idx]
        v = node.inputs[1] if put else node.inputs[0]
        if v is None or (put and node.inputs[0] is None):
            raise NotNative("an absent input")
        try:
            np.broadcast_shapes(v.shape, sel.shape)
        except ValueError:
            raise NotNative("values that do not broadcast to the index") from None
        if v.ndim > sel.ndim or np.broadcast_shapes(v.shape, sel.shape) != sel.shape:
            raise NotNative("values that do not broadcast to the index")
        if y.shape == ():
            raise NotNative("a 0-d result")
        self.line(f"# {self.comment_node(node)}  [positions of the index]")
        if put:
            s = self.store_array(y, scope)
            self.copy(s.name, "", scope.get(node.inputs[0]), y.shape)
        else:
            s = self.store_array(y, scope, zero=True)
        out = self.fresh_name(f"flat{self.num(y)}")
        self.line(f"{out} = {s.name}.reshape({y.size})")
        add = not put or bool(node.attrs.get("accumulate"))
        if sel.size:
            self.scatter(out, y.dtype, sel, v, scope, "+=" if add else "=")

    # ------------------------------------------------------------------ moves
    def emit_move(self, node: Node, scope: Scope) -> None:
        x = node.inputs[0]
        if x is None or any(v is not None for v in node.inputs[1:]):
            raise NotNative("a move of more than one tensor")
        positions = positions_of(node, [x.shape])
        if len(positions) != len(node.outputs) or any(
                p.shape != y.shape or p.dtype.kind not in "iu"
                for p, y in zip(positions, node.outputs, strict=True)):
            raise NotNative("its kernel did not map positions to its outputs")
        s = scope.get(x)
        self.line(f"# {self.comment_node(node)}  [positions from its kernel]")
        if s.kind in ("literal", "scalar"):  # one value (a uniform constant or a 0-d one)
            for y in node.outputs:
                if s.kind == "literal":
                    scope.stores[id(y)] = Store(s.name, "literal", y.shape, y.dtype)
                elif y.shape == ():
                    self.line(f"{self.define_scalar(y, scope).name} = {s.name}")
                else:
                    self.line(fill(self.store_array(y, scope).name, y.shape, s.name))
            return
        src = self.flat_source(x, scope)
        for pos, y in zip(positions, node.outputs, strict=True):
            self.gather(y, pos, src, x.dtype, scope)

    # ------------------------------------------------------------------ natives
    def native_plan(self, node: Node, kind: Opaque) -> NativePlan:
        """The :class:`~nbgrad.ops.traits.NativePlan` of ``node``'s native call (raises
        NotNative)."""
        shapes = tuple(None if v is None else v.shape for v in node.inputs)
        try:
            return kind.static(node.attrs, shapes)
        except Exception as exc:  # noqa: BLE001 - any refusal: the kernel runs instead
            raise NotNative(f"its static() refused these arguments ({exc})") from None

    def emit_native(self, node: Node, scope: Scope, kind: Opaque) -> None:
        """``outs = native(flat arrays..., constants...)``: a direct call (see
        :class:`~nbgrad.ops.traits.NativePlan`), its flat results reshaped."""
        plan = self.native_plan(node, kind)
        consts = [const_text(c, array=True) for c in plan.consts]
        op = REGISTRY[node.op]
        like = next(v for v in node.inputs if v is not None).dtype
        args: list[str] = []
        it = iter(node.inputs)
        for p in op.params:
            if p.is_tensor:
                v = next(it)
                args.append(empty(0, like) if v is None else
                            f"{self.native_array(v, scope)}.reshape(-1)")
            elif p.is_tensor_list:
                items = [f"{self.native_array(next(it), scope)}.reshape(-1)"
                         for _ in range(node.attrs["#" + p.name])]
                args.append("(" + "".join(f"{a}, " for a in items).rstrip(" ") + ")")
        res = self.call_native_fn(node, kind, args + consts)
        results = [res] if len(node.outputs) == 1 else \
            [f"{res}[{k}]" for k in range(len(node.outputs))]
        for r, v, shape in zip(results, node.outputs, plan.shapes, strict=True):
            if tuple(shape) != tuple(v.shape):
                raise NotNative(f"its plan gives output shape {tuple(shape)}, the trace "
                                f"{tuple(v.shape)}")
            if v.shape == ():
                o = self.define_scalar(v, scope)
                self.line(f"{o.name} = {np_type(v.dtype)}({r}[0])")
                continue
            name = self.fresh_name(f"v{self.num(v)}")
            # its dtype as traced (a no-op when the native returns it)
            self.line(f"{name} = np.asarray({r}, {np_type(v.dtype)})"
                      f".reshape({const_text(tuple(v.shape))})")
            scope.stores[id(v)] = Store(name, "array", v.shape, v.dtype)

    def call_native_fn(self, node: Node, kind: Opaque, args: list[str]) -> str:
        """``r = native(args)``; returns the result's name."""
        fn = kind.native
        key = next((k for k, f in self.natives if f is fn), None)
        if key is None:
            key = f"_native_{len(self.natives)}"
            self.natives.append((key, fn))
        self.line(f"# {self.comment_node(node)}  [native: "
                  f"{getattr(fn, '__qualname__', node.op)}]")
        res = self.fresh_name(f"r{self.num(node.outputs[0])}")
        self.line(f"{res} = {key}({', '.join(args)})")
        return res

    def native_array(self, v: Var | None, scope: Scope) -> str:
        """A tensor argument of a native call: a C-contiguous array (None if absent)."""
        if v is None:
            return "None"
        s = scope.get(v)
        if s.kind == "literal":
            return self.array_of(v, scope)
        if s.kind == "scalar":
            return f"np.asarray({s.name})"
        return _contiguous(s)
