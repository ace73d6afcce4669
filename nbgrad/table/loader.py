"""Load ``formulas/derivatives.yaml`` into :class:`Entry` records."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import yaml

from ..errors import TableError
from .formula import Formula, compile_formula
from .schema import Schema, parse_schema

NON_DIFFERENTIABLE = "non_differentiable"
ENTRY_KEYS = frozenset({"name", "output_differentiability", "not_differentiable", "doc",
                        "result"})
#: ``result:`` values that derive the forward derivative from the backward formulas, as
#: PyTorch's table spells them (the op's kind picks one when an entry gives none)
AUTO_FORWARD = frozenset({"auto_element_wise", "auto_linear"})


@dataclass
class Entry:
    """One op of the derivative table."""

    schema: Schema
    formulas: dict[str, Formula]  # differentiable input -> formula
    non_differentiable_inputs: frozenset[str]
    output_differentiability: tuple[bool, ...]
    not_differentiable: bool
    doc: str = ""
    #: the forward derivative (``result:``): a formula over the inputs, their tangents
    #: ``<name>_t`` and ``result``; one of :data:`AUTO_FORWARD`; or None (the op's kind
    #: decides, see :mod:`nbgrad.autograd.forward`)
    forward: Formula | str | None = None

    @property
    def name(self) -> str:
        return self.schema.name

    @cached_property
    def zero_derivative(self) -> bool:
        """Every formula is ``zeros_like(grad)`` and no forward one is given (floor, sign,
        round...): the derivative is zero wherever there is one, so forward mode gives
        the outputs no tangent, a symbolic zero as JAX's ``defjvp_zero`` (a materialised
        zero tangent turned into NaN at a later op's singular point, ``sqrt(0)``, where
        reverse mode gives 0)."""
        return bool(self.formulas) and self.forward is None and all(
            f.text.replace(" ", "") == "zeros_like(grad)" for f in self.formulas.values())

    @property
    def saved_values(self) -> frozenset[str]:
        """Names whose values some formula needs (they are saved for backward)."""
        out: set[str] = set()
        for f in self.formulas.values():
            out |= f.tensor_names
        return frozenset(out)

    @property
    def saved_meta(self) -> frozenset[str]:
        """Names of which the formulas only need shape, ndim or dtype."""
        out: set[str] = set()
        for f in self.formulas.values():
            out |= f.meta_names
        return frozenset(out) - self.saved_values

    @property
    def called_ops(self) -> frozenset[str]:
        out: set[str] = set()
        for f in self.formulas.values():
            out |= f.ops
        return frozenset(out)


def table_path() -> Path:
    """Where the table lives: inside the installed package, or beside it in a checkout."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "formulas" / "derivatives.yaml",
                      here.parent / "formulas" / "derivatives.yaml"):
        if candidate.is_file():
            return candidate
    raise TableError(f"formulas/derivatives.yaml not found near {here}")


def read_raw(path: Path | None = None) -> list[dict]:
    return parse_raw((path or table_path()).read_text())


def parse_raw(text: str) -> list[dict]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    if not isinstance(data, list):
        raise TableError("derivatives.yaml must be a list of entries")
    return data


def _scope(schema: Schema) -> frozenset[str]:
    names = set(schema.param_names) | {"grad", "grads", "grad_input_mask", "result"}
    names |= {f"result{i}" for i in range(max(len(schema.returns), 1))}
    return frozenset(names)


def _forward_scope(schema: Schema) -> frozenset[str]:
    tangents = {f"{p.name}_t" for p in schema.params if p.is_tensor or p.is_tensor_list}
    return _scope(schema) - {"grad", "grads", "grad_input_mask"} | tangents


def build_entry(raw: dict, is_op: Callable[[str], bool], resolve: Callable[[str], Callable],
                is_tensor: Callable[[object], bool],
                helpers: Mapping[str, Callable] | None = None,
                compile_fn: Callable = compile_formula,
                backward_helpers: Mapping[str, Callable] | None = None) -> Entry:
    if not isinstance(raw, dict) or "name" not in raw:
        raise TableError(f"table entry without a name: {raw!r}")
    schema = parse_schema(str(raw["name"]))
    where = f"derivatives.yaml entry {schema.name!r}"
    tensor_params = {p.name for p in schema.tensor_params}
    not_diff = bool(raw.get("not_differentiable", False))
    formulas: dict[str, Formula] = {}
    nondiff_inputs: set[str] = set()
    scope = _scope(schema)
    for key, value in raw.items():
        if key in ENTRY_KEYS:
            continue
        if key not in schema.param_names:
            raise TableError(f"{where}: key {key!r} is neither an argument nor one of "
                             f"{sorted(ENTRY_KEYS)}")
        if key not in tensor_params:
            raise TableError(f"{where}: {key!r} is not a tensor argument; only tensor "
                             "arguments have formulas")
        if value == NON_DIFFERENTIABLE:
            nondiff_inputs.add(key)
            continue
        formulas[key] = compile_fn(str(value), f"{where}, input {key!r}", scope,
                                   is_op, resolve, is_tensor, helpers, backward_helpers)
    if not not_diff:
        missing = tensor_params - set(formulas) - nondiff_inputs
        if missing:
            raise TableError(f"{where}: no formula for tensor input(s) {sorted(missing)}; "
                             f"give one or write '{NON_DIFFERENTIABLE}'")
    elif formulas:
        raise TableError(f"{where}: marked not_differentiable but has formulas")
    out_diff = raw.get("output_differentiability")
    if out_diff is None:
        out_diff = [not not_diff] * len(schema.returns)
    elif len(out_diff) != len(schema.returns):
        raise TableError(f"{where}: output_differentiability has {len(out_diff)} entries, "
                         f"the op has {len(schema.returns)} outputs")
    forward = raw.get("result")
    if forward is not None and str(forward) not in AUTO_FORWARD:
        if not_diff:
            raise TableError(f"{where}: marked not_differentiable but has a 'result' formula")
        forward = compile_fn(str(forward), f"{where}, forward formula 'result'",
                             _forward_scope(schema), is_op, resolve, is_tensor, helpers,
                             backward_helpers)
    return Entry(schema=schema, formulas=formulas,
                 non_differentiable_inputs=frozenset(nondiff_inputs),
                 output_differentiability=tuple(bool(x) for x in out_diff),
                 not_differentiable=not_diff, doc=str(raw.get("doc", "")),
                 forward=str(forward) if isinstance(forward, str) else forward)


def _check_helper_names(is_op: Callable[[str], bool], helpers: Mapping[str, Callable],
                       backward_helpers: Mapping[str, Callable]) -> None:
    """A name calls one thing: an op, a metadata helper or a backward helper."""
    for name in backward_helpers:
        if is_op(name) or name in helpers:
            what = "an op" if is_op(name) else "a metadata helper"
            raise TableError(f"backward helper {name!r} has the name of {what}")
    for name in helpers:
        if is_op(name):
            raise TableError(f"metadata helper {name!r} has the name of an op")


def load_table(is_op: Callable[[str], bool], resolve: Callable[[str], Callable],
               is_tensor: Callable[[object], bool], path: Path | None = None,
               helpers: Mapping[str, Callable] | None = None,
               raw_entries: list[dict] | None = None,
               compile_fn: Callable = compile_formula,
               backward_helpers: Mapping[str, Callable] | None = None) -> dict[str, Entry]:
    """Build every entry; ``helpers`` and ``backward_helpers`` are what formulas may call
    besides ops (metadata functions, and composites of table ops)."""
    _check_helper_names(is_op, helpers or {}, backward_helpers or {})
    entries: dict[str, Entry] = {}
    for raw in raw_entries if raw_entries is not None else read_raw(path):
        entry = build_entry(raw, is_op, resolve, is_tensor, helpers, compile_fn,
                            backward_helpers)
        if entry.name in entries:
            raise TableError(f"derivatives.yaml: entry {entry.name!r} appears twice")
        entries[entry.name] = entry
    return entries
