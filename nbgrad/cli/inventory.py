"""``nbgrad ops``: the derivative table as a list, one row per entry."""

from __future__ import annotations

from .. import ops, testing
from ..cuda import coverage
from ..ops.registry import kind_of, table
from ..ops.traits import Opaque


def table_rows() -> list[dict]:
    """Op, kind, differentiable inputs, formulas, double-backward coverage and CUDA kernel
    per entry (``kind``: the op's declared kind; an opaque op with a native function is
    ``opaque (native)``).

    Double backward counts as covered when the op's record runs gradgradcheck on it
    (``grad=True`` and ``second_order=True``); entries marked not differentiable say so.
    """
    records = testing.all_records()  # looked up per call (tests replace it)
    cuda = coverage()  # registers the CUDA kernels (they load lazily)
    rows = []
    for name, entry in table().items():
        rec = records.get(name)
        if entry.not_differentiable:
            double = "n/a"
        elif rec is None:
            double = "no record"
        elif rec.grad and rec.second_order:
            double = "yes"
        else:
            double = "no"
        outputs = list(entry.schema.returns)
        rows.append({
            "op": name,
            "kind": _kind_label(name),
            "signature": _signature(entry),
            "differentiable_inputs": [p for p in entry.schema.param_names
                                      if p in entry.formulas],
            "non_differentiable_inputs": sorted(entry.non_differentiable_inputs),
            "formulas": {k: f.text for k, f in entry.formulas.items()},
            "differentiable": not entry.not_differentiable,
            "outputs": outputs,
            "double_backward": double,
            "cuda": cuda.get(name, False),
            "jit_native": _kind_label(name) != "opaque",
        })
    return rows


def _kind_label(name: str) -> str:
    kind = kind_of(name)
    if isinstance(kind, Opaque) and kind.native is not None:
        return "opaque (native)"
    return kind.label


def _signature(entry) -> str:
    params = ", ".join(p.name for p in entry.schema.params)
    return f"{entry.name}({params})"


def composite_functions() -> list[str]:
    """Public op functions with no table entry of their own: composites of table ops
    (they differentiate and lower through the ops they call)."""
    entries = set(table())
    return sorted(n for n in ops.__all__ if n not in entries and callable(getattr(ops, n))
                  and not isinstance(getattr(ops, n), type))
