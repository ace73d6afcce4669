"""Composite backward helpers: the table stays readable, and what helpers compute is
differentiated again (eagerly and under nbgrad.jit) like any formula."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.nn.functional as F
from nbgrad.autograd import gradcheck, gradgradcheck
from nbgrad.errors import TableError
from nbgrad.ops import registry
from nbgrad.ops.backward import ops
from nbgrad.table.formula import compile_formula
from nbgrad.table.loader import load_table, parse_raw, table_path

COLUMNS = 100


def _long_lines(text: str, limit: int = COLUMNS) -> list[str]:
    return [f"line {i}: {len(line)} columns" for i, line in enumerate(text.splitlines(), 1)
            if len(line) > limit]


def test_every_line_of_the_table_fits_in_100_columns():
    assert _long_lines("x" * COLUMNS) == []
    assert _long_lines("ok\n  self: " + "y" * (COLUMNS - 7)) == ["line 2: 101 columns"]
    assert _long_lines(table_path().read_text()) == []


def test_formulas_call_backward_helpers():
    uses = {name for entry in registry.table().values() for f in entry.formulas.values()
            for name in f.backward_helpers_used}
    assert {"norm_grad", "gelu_derivative", "layer_norm_grad", "share_ties"} <= uses
    # a helper's ops count as the formula's (the CUDA coverage report reads them)
    norm = registry.table()["norm"].formulas["self"]
    assert {"sign", "sum_backward", "where", "pow", "abs"} <= norm.ops


# ------------------------------------------------------------------ one helper, by hand
def twice_scaled(grad, x, shape):
    """A helper used only here: 2 * grad * x, reshaped to ``shape``."""
    return ops.reshape(2 * grad * x, shape)


def reads_data(grad, x):
    return grad * x._data


def calls_numpy(grad, x):
    return np.exp(grad)


def calls_unknown_op(grad, x):
    return ops.frobnicate(grad, x)


def _compile(text, **backward_helpers):
    return compile_formula(text, "test", frozenset({"grad", "self", "other"}),
                           is_op=registry.REGISTRY.__contains__, resolve=registry.resolve,
                           is_tensor=lambda v: isinstance(v, nb.Tensor),
                           helpers=registry.FORMULA_HELPERS, backward_helpers=backward_helpers)


def test_helper_arguments_are_saved_as_values_and_its_ops_counted():
    f = _compile("twice_scaled(grad, self, other.shape)", twice_scaled=twice_scaled)
    assert f.tensor_names == {"grad", "self"}
    assert f.meta_names == {"other"}  # read only through .shape: saved as metadata
    assert f.ops == {"mul", "reshape"} and f.called == frozenset()
    assert f.backward_helpers_used == {"twice_scaled"}
    # inside a metadata helper's call too: the helper needs the values
    h = _compile("grad * reduced_count(twice_scaled(grad, self, other.shape).shape, None)",
                 twice_scaled=twice_scaled)
    assert h.tensor_names == {"grad", "self"} and h.meta_names == {"other"}
    g, x, o = nb.ones(2, 3), nb.full((2, 3), 3.0), nb.zeros(6)
    np.testing.assert_array_equal(f.func(g, o, x).numpy(), np.full(6, 6.0))


@pytest.mark.parametrize(("helper", "why"), [
    (reads_data, "not a plain function of table ops.*'x._data'"),
    (calls_numpy, "not a plain function of table ops.*'np.exp'"),
    (calls_unknown_op, r"calls unknown op\(s\) \['frobnicate'\]"),
])
def test_helpers_that_leave_the_table_are_refused(helper, why):
    with pytest.raises(TableError, match=why):
        _compile(f"{helper.__name__}(grad, self)", **{helper.__name__: helper})


def test_a_helper_may_not_take_an_op_name():
    raw = parse_raw("- name: mul(Tensor self, Tensor other) -> Tensor\n"
                    "  self: grad * other\n  other: grad * self\n")
    with pytest.raises(TableError, match="backward helper 'mul' has the name of an op"):
        load_table(registry.REGISTRY.__contains__, registry.resolve, lambda v: False,
                   raw_entries=raw, backward_helpers={"mul": twice_scaled})


def test_bind_table_rejects_a_formula_calling_an_unknown_helper(tmp_path):
    text = table_path().read_text().replace("norm_grad(grad, self", "norm_gradd(grad, self")
    path = tmp_path / "derivatives.yaml"
    path.write_text(text)
    with pytest.raises(TableError, match="'norm'.*unknown op 'norm_gradd'"):
        registry.bind_table(path)
    registry.bind_table()  # restore
    assert registry.REGISTRY["norm"].entry.formulas["self"].backward_helpers_used


# ------------------------------------------------------------------ double backward
def _cases():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 4)) + np.sign(rng.standard_normal((3, 4)))
    w = rng.standard_normal(4)
    return [
        ("norm_p3", lambda t: nb.norm(t, 3.0, dim=1), [x]),
        ("norm_inf", lambda t: nb.norm(t, float("inf"), dim=0), [x]),
        ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"), [x]),
        ("var", lambda t: nb.var(t, dim=1), [x]),
        ("layer_norm", lambda t, wt: F.layer_norm(t, (4,), wt, None, 1e-5), [x, w]),
    ]


CASES = {name: (fn, arrays) for name, fn, arrays in _cases()}


def _inputs(arrays):
    return tuple(nb.tensor(a, requires_grad=True) for a in arrays)


@pytest.mark.parametrize("name", sorted(CASES))
def test_helper_formulas_double_differentiate_eagerly(name):
    fn, arrays = CASES[name]
    assert gradcheck(fn, _inputs(arrays))
    assert gradgradcheck(fn, _inputs(arrays))


@pytest.mark.parametrize("mode", ["interpret", "compile"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_helper_formulas_double_differentiate_under_jit(name, mode):
    fn, arrays = CASES[name]
    jitted = nb.jit(fn, mode=mode)
    assert gradgradcheck(jitted, _inputs(arrays))  # create_graph through the jitted function

    def loss(*ts):
        return (fn(*ts) ** 2).sum()

    want = nb.hessian(loss)(*[nb.tensor(a) for a in arrays])
    hess = nb.jit(nb.hessian(loss), mode=mode)  # the traced double backward, compiled
    for _ in range(2):
        got = hess(*[nb.tensor(a) for a in arrays])
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
