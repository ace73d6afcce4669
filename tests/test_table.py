"""The derivative table: schema parsing, the formula allowlist, and the import cross-check."""

from __future__ import annotations

import pytest

import nbgrad as nb
from nbgrad.errors import TableError
from nbgrad.ops import registry
from nbgrad.table import parse_schema
from nbgrad.table.formula import compile_formula
from nbgrad.table.loader import build_entry, table_path


def _compile(text, scope=("grad", "self", "other", "dim")):
    return compile_formula(text, "test", frozenset(scope), is_op=lambda n: n in {"mul", "cos"},
                           resolve=registry.resolve, is_tensor=lambda v: False)


def test_schema_parses_types_defaults_and_returns():
    s = parse_schema("sum(Tensor self, int[]? dim=None, bool keepdim=False, *, "
                     "ScalarType? dtype=None) -> Tensor")
    assert s.name == "sum"
    assert [p.name for p in s.params] == ["self", "dim", "keepdim", "dtype"]
    assert s.params[1].optional and s.params[1].default is None
    assert s.params[2].default is False and s.params[3].kw_only
    multi = parse_schema("max_dim(Tensor self, int dim) -> (Tensor values, Tensor indices)")
    assert multi.returns == ("result0", "result1")
    assert parse_schema("split(Tensor self, int dim=0) -> Tensor[]").returns_list


@pytest.mark.parametrize("bad", [
    "grad.__class__",                 # attribute outside the allowlist
    "__import__('os').system('true')",  # a call of a name that is no op
    "lambda: grad",                   # lambdas are not expressions we allow
    "[g for g in grad]",              # comprehensions
    "grad if True else (yield)",      # yield
    "open('/etc/passwd')",            # unknown function
    "unknown_name * grad",            # a name outside the scope
])
def test_formula_allowlist_rejects(bad):
    with pytest.raises(TableError):
        _compile(bad)


def test_formula_records_value_and_metadata_uses():
    f = _compile("mul(grad, cos(self)) * other.shape[0]")
    assert f.tensor_names == {"grad", "self"}
    assert f.meta_names == {"other"}
    assert f.ops == {"mul", "cos"}


def test_table_ships_and_every_entry_is_bound():
    assert table_path().name == "derivatives.yaml"
    for name, entry in registry.table().items():
        op = registry.REGISTRY[name]
        assert op.entry is entry and "cpu" in op.kernels and op.fn is not None


def _raw(name, **formulas):
    return {"name": name, **formulas}


def _build(raw):
    return build_entry(raw, is_op=lambda n: n in registry.REGISTRY, resolve=registry.resolve,
                       is_tensor=lambda v: isinstance(v, nb.Tensor))


def test_cross_check_errors_name_the_entry():
    with pytest.raises(TableError, match="'frob'.*unknown op 'frobnicate'"):
        _build(_raw("frob(Tensor self) -> Tensor", self="frobnicate(grad)"))
    with pytest.raises(TableError, match="'frob'.*unknown name 'other'"):
        _build(_raw("frob(Tensor self) -> Tensor", self="grad * other"))
    with pytest.raises(TableError, match="'frob'.*no formula for tensor input"):
        _build(_raw("frob(Tensor self, Tensor other) -> Tensor", self="grad"))
    with pytest.raises(TableError, match="'frob'.*'alpha' is not a tensor argument"):
        _build(_raw("frob(Tensor self, float alpha) -> Tensor", self="grad", alpha="grad"))


def test_bind_table_rejects_entry_without_kernel(tmp_path):
    path = tmp_path / "derivatives.yaml"
    path.write_text(table_path().read_text() + "\n- name: no_such_op(Tensor self) -> Tensor\n"
                    "  self: grad\n")
    with pytest.raises(TableError, match="'no_such_op' has no CPU kernel"):
        registry.bind_table(path)
    registry.bind_table()  # restore


def test_bind_table_rejects_kernel_without_entry(tmp_path):
    text = table_path().read_text().replace("- name: hypot(", "- name: hypot_renamed(")
    path = tmp_path / "derivatives.yaml"
    path.write_text(text)
    with pytest.raises(TableError):
        registry.bind_table(path)
    registry.bind_table()
    assert registry.REGISTRY["hypot"].entry is not None


def test_higher_order_comes_from_the_table():
    x = nb.tensor(0.7, requires_grad=True)
    y = nb.sin(x)
    g1, = nb.autograd.grad(y, x, create_graph=True)
    g2, = nb.autograd.grad(g1, x, create_graph=True)
    g3, = nb.autograd.grad(g2, x, create_graph=True)
    g4, = nb.autograd.grad(g3, x)
    import math
    assert g1.item() == pytest.approx(math.cos(0.7), rel=1e-14)
    assert g2.item() == pytest.approx(-math.sin(0.7), rel=1e-14)
    assert g3.item() == pytest.approx(-math.cos(0.7), rel=1e-14)
    assert g4.item() == pytest.approx(math.sin(0.7), rel=1e-14)
