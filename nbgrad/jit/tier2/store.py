"""Values and buffers of tier-2 generated code (used by :mod:`nbgrad.jit.tier2.emit`).

- literals and dtypes as source text; each elementwise node's scalar expression,
  composed from :mod:`nbgrad.kernels.elementwise` (the one source of the arithmetic);
- :class:`Store`: where a value lives in the generated function (a local, a constant
  expression, an array, or an alias that reads another array in place);
- :class:`Pool`: the named buffers of one scope, reused when their values die;
- :class:`Scope`: the stores and the pool of the function or of one loop body.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...kernels import elementwise as ew
from ...ops.traits import Elementwise, Fill, Matmul
from ..trace.ir import Graph, Node, Var
from .fusion import kind_of

if TYPE_CHECKING:
    from .emit import FunctionEmitter


class Tier2Unsupported(NotImplementedError):
    """Tier 2 cannot compile this graph (the graph stays in tier 1)."""


#: the names generated modules import :func:`nbgrad.jit.tier2.alloc.empty`,
#: :func:`~nbgrad.jit.tier2.alloc.fill`, :func:`~nbgrad.jit.tier2.alloc.permuted` and
#: :func:`~nbgrad.jit.tier2.alloc.unicode` under
ALLOC, FILL, PERMUTE, UNICODE = "nb_empty", "nb_fill", "nb_permuted", "nb_unicode"


# ------------------------------------------------------------------ literals and types
def np_type(dtype: np.dtype) -> str:
    """``np.float64``-style name of a dtype in generated code."""
    dtype = np.dtype(dtype)
    return "np.bool_" if dtype == np.bool_ else f"np.{dtype.name}"


def literal(value, dtype: np.dtype) -> str:
    """Source text of a scalar constant of ``dtype`` (exact: floats by ``repr``)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "True" if bool(value) else "False"
    if dtype.kind == "f":
        x = float(value)
        if math.isnan(x):
            text = "math.nan"
        elif math.isinf(x):
            text = "math.inf" if x > 0 else "-math.inf"
        else:
            text = repr(x)
        return text if dtype == np.float64 else f"{np_type(dtype)}({text})"
    if dtype.kind in "iu":
        return f"{np_type(dtype)}({int(value)})"
    raise Tier2Unsupported(f"constants of dtype {dtype} are not supported by tier 2")


def empty(shape: tuple[int, ...] | int, dtype: np.dtype) -> str:
    """An expression allocating a C-ordered array in generated code: the intrinsic of
    :mod:`nbgrad.jit.tier2.alloc` (``np.empty`` would compile once per signature and
    process)."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    return f"{ALLOC}({dims!r}, {np_type(dtype)})"


def fill(name: str, shape: tuple[int, ...], value: str) -> str:
    """A statement setting every element of array ``name`` to ``value``: the intrinsic of
    :mod:`nbgrad.jit.tier2.alloc` (``ndarray.fill`` would compile once per signature and
    process; ``shape`` is that of the array, any, 0-d included)."""
    return f"{FILL}({name}, {value})"


def uniform_value(arr: np.ndarray):
    """The one value of an array whose elements are all equal, else None."""
    if arr.size == 0:
        return None
    flat = arr.reshape(-1)
    first = flat[0]
    if arr.size == 1 or bool(np.all(flat == first)):
        return first
    return None


def objmode_type(dtype: np.dtype, ndim: int) -> str:
    """Numba's type string of a C-contiguous array, for ``objmode`` annotations."""
    dtype = np.dtype(dtype)
    name = "boolean" if dtype == np.bool_ else dtype.name
    dims = [":"] * (ndim - 1) + ["::1"]
    return f"{name}[{', '.join(dims)}]"


def _subst(expr: str, names: dict[str, str]) -> str:
    """``expr`` with the names in ``names`` replaced by expressions (via the AST)."""
    tree = ast.parse(expr, mode="eval")
    parsed = {k: ast.parse(v, mode="eval").body for k, v in names.items()}

    class Sub(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return parsed.get(node.id, node)

    return ast.unparse(Sub().visit(tree))


def _param_values(node: Node, kind: Elementwise) -> dict[str, str]:
    """``p0, p1...``: the op's parameters (through the kind's ``encode`` when declared)."""
    values = [node.attrs[name] for name in kind.spec.params]
    if kind.encode is not None:
        values = list(kind.encode(*values))
    return {f"p{k}": literal(float(v), np.float64) for k, v in enumerate(values)}


def cast(expr: str, src: np.dtype, dst: np.dtype) -> str:
    """``expr`` (of dtype ``src``) converted as ``ndarray.astype(dst)`` does."""
    if src == dst:
        return expr
    if dst == np.bool_:
        return f"({expr}) != 0"
    return f"{np_type(dst)}({expr})"


def scalar_expr(node: Node, args: list[str], arg_dtypes: list[np.dtype], cpu: bool = True) -> str:
    """The scalar expression of elementwise ``node`` over operand expressions ``args``;
    ``cpu``: with the vectorisable math (``ScalarOp.cpu``), else as written (CUDA)."""
    out = node.outputs[0].dtype
    kind = kind_of(node)
    if isinstance(kind, Fill):
        return literal(kind.value, out)
    if isinstance(kind, Elementwise):
        spec = kind.spec
        names = dict(zip(kind.operand_names(len(args)), args, strict=True))
        names.update(_param_values(node, kind))
    elif isinstance(kind, Matmul):  # outer: a[i] * b[j]
        spec = ew.BINARY["mul"]
        names = {"a": args[0], "b": args[1]}
    else:  # a cast, broadcast, copy or basic index: the operand, converted
        return cast(args[0], arg_dtypes[0], out)
    text = _subst(spec.cpu if cpu else spec.expr, names)
    if spec.kind == "bool":
        return text
    if spec.kind == "same":  # a boolean operand (``where``'s condition) is no value
        arg_dtypes = [d for d in arg_dtypes if d != np.bool_]
    if out == np.float64 and all(d == np.float64 for d in arg_dtypes):
        return text
    if out == np.bool_:
        return f"bool({text})"
    return f"{np_type(out)}({text})"


# ------------------------------------------------------------------ storage
@dataclass
class Store:
    """Where a value lives in the generated function.

    ``kind``: "scalar" (a local), "literal" (a constant expression, ``shape`` may be
    non-empty for a uniform constant array) or "array". ``slot``: the pool buffer an
    array lives in (views share their base's slot), None for arrays the pool does not
    own (inputs, constants, loop carries seen from a body). ``fresh``: an array this
    call allocated for exactly this value (may be returned without a copy).
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: np.dtype
    slot: str | None = None
    fresh: bool = False
    layout: str = "C"
    #: an *alias* reads another array in place, without making a view object (views
    #: made in a hot loop cost reference counting): ``prefix`` indexes lead (a row of a
    #: stack), ``dim_map[k]`` is the array dimension behind dimension ``k`` (None: an
    #: added unit dimension) of ``base_ndim`` dimensions; ``view_expr`` makes the view
    prefix: tuple[str, ...] = ()
    dim_map: tuple[int | None, ...] | None = None
    base_ndim: int = 0
    view_expr: str | None = None

    @property
    def array(self) -> str:
        """An expression for the value as an array (a view for an alias)."""
        return self.view_expr or self.name

    def ref(self, idx: Sequence[str]) -> str:
        """The element at index ``idx`` (one expression per dimension)."""
        idx = list(idx)
        if self.dim_map is not None:
            base = ["0"] * self.base_ndim
            for k, d in enumerate(self.dim_map):
                if d is not None:
                    base[d] = idx[k]
            idx = base
        full = list(self.prefix) + idx
        return f"{self.name}[{', '.join(full)}]" if full else f"{self.name}[()]"


class Pool:
    """Named buffers of one scope, reused by (shape, dtype) when their values die."""

    def __init__(self, fn: FunctionEmitter) -> None:
        self.fn = fn
        self.free: dict[tuple, list[str]] = {}
        self.refs: dict[str, set[int]] = {}
        self.pinned: set[str] = set()
        self.key_of: dict[str, tuple] = {}

    def alloc(self, var: Var, hint: str, zero: bool = False) -> str:
        key = (var.shape, var.dtype.str)
        free = self.free.get(key)
        if free:
            slot = free.pop()
        else:
            slot = self.fn.fresh_name(hint)
            line = f"{slot} = {empty(var.shape, var.dtype)}"
            self.fn.prologue.append(line)
            self.fn.allocs[slot] = (var.shape, var.dtype, line)
            self.key_of[slot] = key
        if zero:  # here, not in the prologue: a loop body runs this every step
            self.fn.line(fill(slot, var.shape, "0"))
        self.refs[slot] = {id(var)}
        return slot

    def owns(self, slot: str | None) -> bool:
        return slot is not None and slot in self.refs

    def add_ref(self, slot: str, var: Var) -> None:
        self.refs[slot].add(id(var))

    def release(self, slot: str, var: Var) -> None:
        refs = self.refs.get(slot)
        if refs is None or id(var) not in refs:
            return
        refs.discard(id(var))
        if not refs and slot not in self.pinned:
            del self.refs[slot]
            self.free.setdefault(self.key_of[slot], []).append(slot)


class Scope:
    """The values of one graph (the function or a loop body) and its buffer pool."""

    def __init__(self, fn: FunctionEmitter, graph: Graph, parent: Scope | None) -> None:
        self.fn = fn
        self.graph = graph
        self.parent = parent
        self.stores: dict[int, Store] = {}
        self.pool = Pool(fn)
        #: id(var) -> an array view the value is written into directly (a ys row)
        self.dest: dict[int, str] = {}

    def get(self, v: Var) -> Store:
        s = self.stores.get(id(v))
        if s is None:
            raise RuntimeError(f"nbgrad.jit tier 2: a value of type {v.dtype.name}"
                               f"{list(v.shape)} has no storage (a code generator bug)")
        return s


def _unit_dim_map(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[int | None, ...] | None:
    """For a reshape from ``src`` to ``dst`` that only adds or drops size-1 dimensions:
    the ``src`` dimension behind each ``dst`` one (None for an added one)."""
    big_src = [d for d, n in enumerate(src) if n != 1]
    if [src[d] for d in big_src] != [n for n in dst if n != 1]:
        return None
    it = iter(big_src)
    return tuple(None if n == 1 else next(it) for n in dst)


def _contiguous(s: Store) -> str:
    return s.array if s.layout == "C" else f"np.ascontiguousarray({s.array})"


def _affine(start: int, step: int, j: str) -> str:
    if step == 0:
        return str(start)
    term = j if step == 1 else (f"-{j}" if step == -1 else f"{step} * {j}")
    if start == 0:
        return term
    if term.startswith("-"):
        return f"{start} - {term[1:]}"
    return f"{start} + {term}"


def _short(value) -> str:
    """A short attribute text for a comment; never an address (the generated source
    must be the same in every process, or the disk cache would miss)."""
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name
    if isinstance(value, Graph):
        return "<graph>"
    if callable(value) or isinstance(value, type):
        return f"<{getattr(value, '__qualname__', type(value).__name__)}>"
    text = repr(value)
    if " at 0x" in text or " object at " in text:
        return f"<{type(value).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."


# ------------------------------------------------------------------ scratch
#: pool buffers of at least this many bytes that no result can reach become arguments
#: the caller keeps between calls: allocated per call, a large buffer comes from mmap
#: and costs a page fault per 4 KiB every call (W5's 40 MB stack of saved values)
SCRATCH_MIN_BYTES = 1 << 20


def scratch_slots(allocs: dict[str, tuple], swaps: Sequence[tuple[str, str]],
                  escaped: set[str]) -> list[str]:
    """The pool buffers of ``allocs`` (slot -> (shape, dtype, line)) that may live across
    calls: of at least :data:`SCRATCH_MIN_BYTES`, and neither returned (``escaped``: the
    names of the results and their buffers) nor exchanged by a carry swap with a buffer
    that is, or with a name the pool does not own."""
    parent: dict[str, str] = {}

    def root(a: str) -> str:
        while parent.get(a, a) != a:
            a = parent[a]
        return a

    for a, b in swaps:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
    bad = {root(n) for n in escaped}
    bad |= {root(n) for pair in swaps for n in pair if n not in allocs}
    return [slot for slot, (shape, dtype, _) in allocs.items()
            if root(slot) not in bad
            and int(np.prod(shape, dtype=np.int64)) * dtype.itemsize >= SCRATCH_MIN_BYTES]
