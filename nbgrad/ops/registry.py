"""The op registry: one record per op, kernels per target, bound to the table at import.

Kernels register with :func:`kernel` (``target="cpu"`` or ``"cuda"``); each op's
Python function registers with :func:`op_function`. :func:`bind_table` loads
``formulas/derivatives.yaml`` and checks both sides: an entry without a CPU kernel, a
kernel without an entry, a formula calling an unknown op or naming an unknown
argument, and a function whose parameters differ from the table's signature all
raise :class:`~nbgrad.errors.TableError` naming the entry.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace

from ..errors import TableError
from ..table import Entry, load_table
from ..table.loader import parse_raw, table_path
from ..table.schema import Param
from ..tensor import Tensor
from .arguments import reporting_argument_errors
from .traits import OPAQUE, Batching, Kind, Opaque

TARGETS = ("cpu", "cuda")


def not_lean(*args) -> None:
    """The lean path of an op without one: always the general path."""
    return None


class OpDef:
    """Everything nbgrad knows about one op."""

    __slots__ = ("name", "entry", "kernels", "view_of", "fn", "tensor_pos", "list_pos",
                 "attr_pos", "params", "diff_pos", "save_plan", "save_outputs", "save_users",
                 "out_diff", "differentiable", "has_lists", "list_names", "record_plan",
                 "attr_names", "all_tensors", "formula_names", "kind", "lean",
                 "lean_apply", "lean_reflected", "record_slots", "run_backward",
                 "run_record")

    def __init__(self, name: str) -> None:
        self.name = name
        self.entry: Entry | None = None
        self.kernels: dict[str, Callable] = {}
        self.view_of: int | None = None
        self.fn: Callable | None = None
        #: what executors need to know about the op (:mod:`nbgrad.ops.traits`)
        self.kind: Kind = OPAQUE
        #: the CPU kernel of an elementwise op for dispatch's lean path (set where the op
        #: registers): arrays in, array out, for the common case of its lean path
        self.lean: Callable | None = None
        #: ``(self[, other]) -> Tensor | None``: the op applied in the common case, else
        #: None (``dispatch.lean_path``; set where an elementwise op registers), and
        #: ``(self, scalar)`` for ``scalar op self``; answer None for every other op
        self.lean_apply: Callable = not_lean
        self.lean_reflected: Callable = not_lean
        #: ``(node, grads) -> grads``: the backward of its nodes, set by nbgrad.autograd
        #: on first use (``record.compile_backward``)
        self.run_backward: Callable | None = None
        #: ``(op, args, outputs) -> None``: records its applications, set by
        #: nbgrad.autograd on first use (``record.compile_record``)
        self.run_record: Callable | None = None

    def kernel_for(self, target: str) -> Callable:
        k = self.kernels.get(target)
        if k is None:
            raise RuntimeError(f"op '{self.name}' has no {target.upper()} kernel; "
                               f"move the tensors to a device that has one")
        return k

    def bind(self, entry: Entry) -> None:
        """Precompute what dispatch needs from the table entry."""
        self.entry = entry
        self.run_backward = self.run_record = None
        params = entry.schema.params
        self.params: tuple[Param, ...] = params
        self.tensor_pos = tuple(i for i, p in enumerate(params) if p.is_tensor)
        self.list_pos = tuple(i for i, p in enumerate(params) if p.is_tensor_list)
        self.has_lists = bool(self.list_pos)
        self.list_names = frozenset(params[i].name for i in self.list_pos)
        self.attr_pos = tuple(i for i, p in enumerate(params)
                              if not (p.is_tensor or p.is_tensor_list))
        self.differentiable = not entry.not_differentiable
        self.diff_pos = frozenset(i for i, p in enumerate(params)
                                  if p.name in entry.formulas)
        values, meta = entry.saved_values, entry.saved_meta
        self.save_plan = tuple(
            (i, p.name, p.name in values)
            for i, p in enumerate(params)
            if (p.is_tensor or p.is_tensor_list) and (p.name in values or p.name in meta))
        outs = entry.schema.returns
        self.save_outputs = tuple(
            (k, name) for k, name in enumerate(outs)
            if name in values or (len(outs) == 1 and "result" in values))
        self.out_diff = entry.output_differentiability
        #: (position, name, is_list, has_formula) of every tensor parameter
        self.record_plan = tuple((i, p.name, p.is_tensor_list, p.name in entry.formulas)
                                 for i, p in enumerate(params)
                                 if p.is_tensor or p.is_tensor_list)
        self.attr_names = tuple((i, params[i].name) for i in self.attr_pos)
        #: {name: range(k, k + 1)}: the k-th tensor input is the one of formula ``name``
        #: (shared by the backward nodes of an op without tensor lists)
        self.record_slots = {name: range(k, k + 1)
                             for k, (_i, name, _l, has_formula) in enumerate(self.record_plan)
                             if has_formula}
        #: every name some formula of this op reads (run_formulas sets only these)
        self.formula_names = frozenset(n for f in entry.formulas.values() for n in f.arg_names)
        #: per saved name (``save_plan`` then ``save_outputs``), the ``record_plan`` indices
        #: of the inputs whose formulas read it, or None when every input with a formula
        #: does: a node saves the name only if one of those inputs needs a gradient
        #: (``x * 2`` keeps no ``x`` alive, as in PyTorch)
        with_formula = [k for k, (*_r, has_formula) in enumerate(self.record_plan) if has_formula]
        reads = {k: set(entry.formulas[self.record_plan[k][1]].arg_names) for k in with_formula}
        users = []
        for name in [n for _i, n, _v in self.save_plan] + [n for _k, n in self.save_outputs]:
            names = {name, "result"} if len(outs) == 1 and name == outs[0] else {name}
            readers = tuple(k for k in with_formula if reads[k] & names)
            users.append(None if len(readers) == len(with_formula) else readers)
        self.save_users = tuple(users)
        #: every parameter is a single tensor: the args tuple is the list of inputs
        self.all_tensors = bool(params) and len(self.tensor_pos) == len(params)


REGISTRY: dict[str, OpDef] = {}
_TABLE: dict[str, Entry] = {}
#: target -> ``adapt(op, fn)``, the callable stored for a kernel ``fn`` of that target (set
#: by the target's package: CUDA kernels upload host constants first)
ADAPTERS: dict[str, Callable[[OpDef, Callable], Callable]] = {}
#: plain functions of metadata (shapes, dims) that formulas may call
FORMULA_HELPERS: dict[str, Callable] = {}


def formula_helper(fn: Callable) -> Callable:
    """Let formulas call ``fn`` (a function of shapes and dims, never of tensor values)."""
    FORMULA_HELPERS[fn.__name__] = fn
    return fn


#: composite backward helpers: Python functions over table ops that formulas may call
BACKWARD_HELPERS: dict[str, Callable] = {}


def backward_helper(fn: Callable) -> Callable:
    """Let formulas call ``fn``, a composite of table ops (:mod:`nbgrad.ops.backward`)."""
    BACKWARD_HELPERS[fn.__name__] = fn
    return fn


def get(name: str) -> OpDef:
    op = REGISTRY.get(name)
    if op is None:
        op = REGISTRY[name] = OpDef(name)
    return op


def kind_of(name: str) -> Kind:
    """The declared kind of op ``name``; :data:`~nbgrad.ops.traits.OPAQUE` for a name
    that is no registered op (a jit loop, a custom Function)."""
    op = REGISTRY.get(name)
    return OPAQUE if op is None else op.kind


def kernel(name: str, target: str = "cpu", view_of: int | None = None,
           kind: Kind | None = None, batch: Batching | None = None):
    """Register ``fn`` as the ``target`` kernel of op ``name``.

    A kernel takes the op's arguments in table order, with arrays in place of
    tensors, and returns an array or a tuple of arrays. ``view_of=i`` says the
    output shares memory with argument ``i`` (it then shares its version counter).
    Kernels of other targets may load after :func:`bind_table` (CUDA's do): one for an
    op without a table entry then raises :class:`~nbgrad.errors.TableError` at once.
    ``kind`` (with the CPU kernel) declares what executors need to know about the op
    (:mod:`nbgrad.ops.traits`); an op without one is :class:`~nbgrad.ops.traits.Opaque`.
    ``batch`` gives an Opaque op its batching rule (``Opaque.batch``); other kinds batch
    by their kind.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}")
    if (kind is not None or batch is not None) and target != "cpu":
        raise ValueError(f"kernel {name!r}: declare the op's kind with its CPU kernel")
    if batch is not None:
        if not isinstance(kind or OPAQUE, Opaque):
            raise TypeError(f"kernel {name!r}: batch= is for Opaque ops; a "
                            f"{type(kind).__name__} op batches by its kind")
        kind = replace(kind or OPAQUE, batch=batch)

    def register(fn: Callable) -> Callable:
        if target != "cpu" and _TABLE and name not in _TABLE:  # loaded after bind_table
            raise TableError(f"{target.upper()} kernel for op {name!r} has no "
                             "derivatives.yaml entry")
        op = get(name)
        adapt = ADAPTERS.get(target)
        op.kernels[target] = fn if adapt is None else adapt(op, fn)
        if view_of is not None:
            op.view_of = view_of
        if kind is not None:
            op.kind = kind
        return fn

    return register


def op_function(name: str):
    """Register the public Python function of op ``name`` (used by formulas too).

    Formulas call ``fn`` itself; the public name gets ``fn`` wrapped so that a call
    failing on a badly typed argument raises a TypeError naming the op and the argument
    (:mod:`nbgrad.ops.arguments`).
    """

    def register(fn: Callable) -> Callable:
        op = get(name)
        op.fn = fn
        return reporting_argument_errors(fn, op)

    return register


def table() -> dict[str, Entry]:
    return _TABLE


def resolve(name: str) -> Callable:
    op = REGISTRY.get(name)
    if op is None or op.fn is None:
        raise TableError(f"formula calls op {name!r}, which has no function")
    return op.fn


def _check_function(op: OpDef, entry: Entry) -> None:
    if op.fn is None:
        raise TableError(f"derivatives.yaml entry {entry.name!r}: no nbgrad function "
                         "implements it")
    sig = inspect.signature(op.fn)
    names = [p.name for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
    wanted = list(entry.schema.param_names)
    if names[:len(wanted)] != wanted:
        raise TableError(f"derivatives.yaml entry {entry.name!r}: function parameters "
                         f"{names} differ from the table's {wanted}")


def _is_tensor(value: object) -> bool:
    return isinstance(value, Tensor)


def bind_table(path=None) -> dict[str, Entry]:
    """Load the table and cross-check it against the registered kernels and functions."""
    _is_tensor.tensor_type = Tensor  # lets formulas test types without a call
    text = (path or table_path()).read_text()
    raw_entries = parse_raw(text)
    names = {str(raw["name"]).split("(")[0].strip()
             for raw in raw_entries if isinstance(raw, dict) and "name" in raw}
    entries = load_table(is_op=names.__contains__, resolve=resolve,
                         is_tensor=_is_tensor, path=path,
                         helpers=FORMULA_HELPERS, raw_entries=raw_entries,
                         backward_helpers=BACKWARD_HELPERS)
    for name, entry in entries.items():
        op = REGISTRY.get(name)
        if op is None or "cpu" not in op.kernels:
            raise TableError(f"derivatives.yaml entry {name!r} has no CPU kernel")
        _check_function(op, entry)
        op.bind(entry)
    for name, op in REGISTRY.items():
        if op.kernels and name not in entries:
            raise TableError(f"kernel for op {name!r} has no derivatives.yaml entry")
    _TABLE.clear()
    _TABLE.update(entries)
    return entries


#: ops added by :func:`register_entries` (the only ones :func:`remove_ops` removes)
_ADDED: set[str] = set()


def register_entries(text: str) -> dict[str, Entry]:
    """Add table entries for ops defined outside nbgrad; returns them by name.

    ``text`` is YAML in the format of ``formulas/derivatives.yaml`` (a list of entries).
    Each op needs its CPU kernel (``@kernel(name, kind=...)``) and its function
    (``@op_function(name)``) registered first. The entries are checked as
    :func:`bind_table` checks the table (formulas may call the table's ops and the ops
    of ``text``); any failure raises :class:`~nbgrad.errors.TableError` naming the entry
    and adds nothing. An op of the table cannot be registered again.
    """
    raw_entries = parse_raw(text)
    names = {str(raw["name"]).split("(")[0].strip()
             for raw in raw_entries if isinstance(raw, dict) and "name" in raw}
    entries = load_table(is_op=lambda n: n in _TABLE or n in names, resolve=resolve,
                         is_tensor=_is_tensor, helpers=FORMULA_HELPERS,
                         raw_entries=raw_entries, backward_helpers=BACKWARD_HELPERS)
    for name, entry in entries.items():
        if name in _TABLE:
            raise TableError(f"derivatives.yaml entry {name!r}: the table has this op "
                             "already")
        op = REGISTRY.get(name)
        if op is None or "cpu" not in op.kernels:
            raise TableError(f"derivatives.yaml entry {name!r} has no CPU kernel")
        _check_function(op, entry)
    for name, entry in entries.items():
        REGISTRY[name].bind(entry)
    _TABLE.update(entries)
    _ADDED.update(entries)
    return entries


def remove_ops(*names: str) -> None:
    """Forget ops added by :func:`register_entries` (or registered without an entry):
    their entries, kernels, functions and kinds, e.g. a test's ops once it is done. An
    op of nbgrad's own table raises ``ValueError``."""
    unknown = [n for n in names if n not in _ADDED and n in _TABLE]
    if unknown:
        raise ValueError(f"remove_ops: {unknown} are ops of nbgrad's table")
    for name in names:
        _TABLE.pop(name, None)
        REGISTRY.pop(name, None)
        _ADDED.discard(name)
