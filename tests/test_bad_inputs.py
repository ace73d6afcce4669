"""The bad-input catalogue: every wrong input gets the exact exception type and a message
naming the op and the shapes or types involved, never a Numba typing error, a NumPy
error or an AttributeError from inside nbgrad. Edge inputs that are valid (empty and
0-d tensors, non-contiguous and negative-stride NumPy arrays) give NumPy's results.
"""

from __future__ import annotations

import contextlib
import operator
import sys
import warnings

import numpy as np
import pytest

import nbgrad as nb
import nbgrad.nn.functional as F
from nbgrad.autograd import gradcheck
from nbgrad.ops.registry import REGISTRY
from nbgrad.testing import all_records, make_inputs
from nbgrad.testing.records.elementwise import _BINARY, _COMPARE, _LOGICAL, _UNARY

RECORDS = all_records()
USER_ERRORS = (TypeError, RuntimeError, ValueError, IndexError)


def T(value, **kwargs) -> nb.Tensor:
    return nb.tensor(np.asarray(value, dtype=float) if not isinstance(value, np.ndarray)
                     else value, **kwargs)


def ones(*shape) -> nb.Tensor:
    return nb.ones(*shape)


def ints(*values) -> nb.Tensor:
    return nb.tensor(np.array(values, dtype=np.int64))


@contextlib.contextmanager
def raises(exc_type, *fragments):
    """``pytest.raises`` that also checks that each fragment appears in the message and
    that the exception is not one of Numba's."""
    with pytest.raises(exc_type) as info:
        yield info
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert not type(info.value).__module__.startswith("numba")


def public_functions() -> dict[str, object]:
    """The public function of every op (what ``nbgrad.NAME`` and methods call)."""
    found = {}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("nbgrad.ops.") or module is None:
            continue
        for value in vars(module).values():
            wrapped = getattr(value, "__wrapped__", None)
            if wrapped is None:
                continue
            for name, op in REGISTRY.items():
                if op.fn is wrapped:
                    found[name] = value
    return found


PUBLIC = public_functions()


# ------------------------------------------------------------------ shape mismatch
BINARY_OPS = sorted([*_BINARY, *_COMPARE, *_LOGICAL])


@pytest.mark.parametrize("name", BINARY_OPS)
def test_every_binary_elementwise_op_names_itself_and_both_shapes(name):
    a = T(np.ones((2, 3)))
    b = T(np.ones(4))
    if name.startswith("logical"):
        a, b = a > 0, b > 0
    with raises(RuntimeError, f"{name}:", "(2, 3)", "(4,)", "cannot be broadcast"):
        getattr(nb, name)(a, b)


@pytest.mark.parametrize(("op", "name"), [
    (operator.add, "add"), (operator.sub, "sub"), (operator.mul, "mul"),
    (operator.truediv, "div"), (operator.pow, "pow"), (operator.lt, "lt"),
    (operator.eq, "eq")])
def test_operators_name_the_op_and_both_shapes(op, name):
    with raises(RuntimeError, f"{name}:", "(2, 3)", "(4,)"):
        op(ones(2, 3), ones(4))


def test_where_lerp_and_in_place_ops_name_all_shapes():
    with raises(RuntimeError, "where:", "(2, 3)", "(4,)"):
        nb.where(ones(2, 3) > 0, ones(2, 3), ones(4))
    with raises(RuntimeError, "lerp:", "(2, 3)", "(4,)"):
        nb.lerp(ones(2, 3), ones(4), 0.5)
    x = ones(2, 3)
    with raises(RuntimeError, "(2, 3)", "(4,)"):
        x.add_(ones(4))
    with raises(RuntimeError, "index_put:", "(4,)", "(3,)"):
        x[0] = ones(4)


@pytest.mark.parametrize(("call", "fragments"), [
    (lambda: nb.matmul(ones(2, 3), ones(4)), ("matmul:", "(2, 3)", "(4,)", "3 != 4")),
    (lambda: ones(2, 3) @ ones(2, 3), ("matmul:", "(2, 3)", "3 != 2")),
    (lambda: nb.matmul(ones(2, 2, 3), ones(3, 3, 2)), ("matmul:", "(2, 2, 3)", "(3, 3, 2)")),
    (lambda: nb.matmul(T(1.0), ones(2)), ("matmul:", "()", "(2,)")),
    (lambda: nb.mm(ones(2, 3), ones(2, 3)), ("mm:", "(2, 3)", "3 != 2")),
    (lambda: nb.mm(ones(3), ones(3, 2)), ("mm:", "(3,)", "2-D")),
    (lambda: nb.bmm(ones(2, 2, 3), ones(2, 4, 3)), ("bmm:", "(2, 2, 3)", "(2, 4, 3)")),
    (lambda: nb.bmm(ones(2, 2, 3), ones(3, 3, 3)), ("bmm:", "(3, 3, 3)")),
    (lambda: nb.bmm(ones(2, 3), ones(3, 4)), ("bmm:", "3-D")),
    (lambda: nb.dot(ones(3), ones(4)), ("dot:", "(3,)", "(4,)")),
    (lambda: nb.dot(ones(2, 3), ones(3)), ("dot:", "(2, 3)")),
    (lambda: nb.outer(ones(2, 3), ones(3)), ("outer:", "(2, 3)", "1-D")),
    (lambda: nb.einsum("ij,jk->ik", ones(4, 5), ones(4, 5)), ("einsum:", "'j'", "(4, 5)")),
    (lambda: F.linear(ones(4, 5), ones(3, 4)), ("linear:", "(4, 5)", "(3, 4)")),
    (lambda: F.conv2d(ones(1, 2, 5, 5), ones(3, 3, 3, 3)),
     ("conv2d:", "(1, 2, 5, 5)", "(3, 3, 3, 3)")),
    (lambda: F.conv2d(ones(1, 2, 2, 2), ones(3, 2, 3, 3)), ("conv2d:", "larger than the input")),
    (lambda: F.conv2d(ones(5, 5), ones(1, 1, 3, 3)), ("conv2d:", "(5, 5)", "4-D")),
    (lambda: F.conv1d(ones(1, 2, 5), ones(3, 3, 2)), ("conv1d:", "(1, 2, 5)", "(3, 3, 2)")),
    (lambda: nb.cat([ones(2, 3), ones(3, 4)]), ("cat:", "(2, 3)", "(3, 4)")),
    (lambda: nb.cat([ones(2, 3), ones(3)]), ("cat:", "(2, 3)", "(3,)")),
    (lambda: nb.cat([T(1.0), T(2.0)]), ("cat:", "zero-dimensional", "stack")),
    (lambda: nb.stack([ones(2, 3), ones(3, 4)]), ("stack:", "(2, 3)", "(3, 4)")),
    (lambda: nb.reshape(ones(2, 3), (4, 2)), ("reshape:", "(4, 2)", "(2, 3)")),
    (lambda: nb.expand(ones(2, 3), (3, 3)), ("expand:", "(2, 3)", "(3, 3)")),
    (lambda: F.mse_loss(ones(4, 5), ones(3, 5)), ("mse_loss:", "(4, 5)", "(3, 5)")),
    (lambda: F.cross_entropy(ones(4, 5), ints(0, 1, 2)), ("cross_entropy:", "(3,)", "(4, 5)")),
    (lambda: nb.linalg.solve(T(np.eye(3)), ones(4)), ("linalg.solve:", "(3, 3)", "(4,)")),
    (lambda: nb.linalg.inv(ones(4, 5)), ("linalg.inv:", "(4, 5)")),
    (lambda: nb.masked_fill(ones(4, 5), ones(3) > 0, 1.0), ("masked_fill:", "(3,)", "(4, 5)")),
], ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_shape_mismatch_in_products_and_joins(call, fragments):
    with raises(RuntimeError, *fragments):
        call()


# ------------------------------------------------------------------ bad dim
DIM_OPS = {
    "sum": lambda x, d: nb.sum(x, d), "mean": lambda x, d: nb.mean(x, d),
    "prod": lambda x, d: nb.prod(x, d), "amax": lambda x, d: nb.amax(x, d),
    "amin": lambda x, d: nb.amin(x, d), "argmax": lambda x, d: nb.argmax(x, d),
    "argmin": lambda x, d: nb.argmin(x, d), "var": lambda x, d: nb.var(x, d),
    "std": lambda x, d: nb.std(x, d), "logsumexp": lambda x, d: nb.logsumexp(x, d),
    "norm": lambda x, d: nb.norm(x, 2, d), "cumsum": lambda x, d: nb.cumsum(x, d),
    "cumprod": lambda x, d: nb.cumprod(x, d), "max": lambda x, d: nb.max(x, d),
    "min": lambda x, d: nb.min(x, d), "softmax": lambda x, d: F.softmax(x, d),
    "log_softmax": lambda x, d: F.log_softmax(x, d), "sort": lambda x, d: nb.sort(x, d),
    "topk": lambda x, d: nb.topk(x, 1, d), "cat": lambda x, d: nb.cat([x, x], d),
    "transpose": lambda x, d: nb.transpose(x, 0, d), "squeeze": lambda x, d: nb.squeeze(x, d),
    "flip": lambda x, d: nb.flip(x, (d,)), "roll": lambda x, d: nb.roll(x, 1, d),
    "split": lambda x, d: nb.split(x, 1, d), "chunk": lambda x, d: nb.chunk(x, 2, d),
    "unbind": lambda x, d: nb.unbind(x, d), "flatten": lambda x, d: nb.flatten(x, 0, d),
    "gather": lambda x, d: nb.gather(x, d, nb.zeros(2, 3, dtype=nb.int64)),
    "index_select": lambda x, d: nb.index_select(x, d, ints(0)),
}


@pytest.mark.parametrize("name", sorted(DIM_OPS))
@pytest.mark.parametrize("dim", [2, 5, -3])
def test_dim_out_of_range_names_op_dim_and_rank(name, dim):
    with raises(IndexError, f"{name}:", f"dim {dim}", "2 dimension(s)", "[-2, 1]"):
        DIM_OPS[name](ones(2, 3), dim)


def test_dim_out_of_range_for_new_dimension_ops():
    with raises(IndexError, "unsqueeze:", "dim 4", "3 dimension(s)"):
        nb.unsqueeze(ones(2, 3), 4)
    with raises(IndexError, "stack:", "dim -4", "3 dimension(s)"):
        nb.stack([ones(2, 3), ones(2, 3)], -4)
    with raises(IndexError, "sum:", "dim 1", "0 dimension(s)", "[-1, 0]"):
        nb.sum(T(1.0), 1)


@pytest.mark.parametrize("name", ["sum", "mean", "amax", "logsumexp", "var"])
def test_bad_dim_types_and_repeats(name):
    fn = getattr(nb, name)
    with raises(TypeError, f"{name}(", "'dim'", "str 'a'"):
        fn(ones(2, 3), "a")
    with raises(TypeError, f"{name}(", "'dim'", "float"):
        fn(ones(2, 3), 1.5)
    with raises(TypeError, name, "dim"):
        fn(ones(2, 3), (0, 1.5))
    with raises(RuntimeError, f"{name}:", "dim 0 appears more than once", "(0, -2)"):
        fn(ones(2, 3), (0, -2))


def test_bad_permutation_and_shape_arguments():
    with raises(RuntimeError, "permute:", "(0, 0)", "(2, 3)"):
        nb.permute(ones(2, 3), (0, 0))
    with raises(TypeError, "permute", "(0, 'a')"):
        nb.permute(ones(2, 3), 0, "a")
    with raises(TypeError, "reshape", "(2.5, 2)"):
        nb.reshape(ones(2, 3), (2.5, 2))
    with raises(IndexError, "flatten:", "start_dim 1", "end_dim 0"):
        nb.flatten(ones(2, 3), 1, 0)
    with raises(RuntimeError, "view:", "contiguous"):
        nb.view(nb.transpose(ones(4, 5), 0, 1), (20,))


# ------------------------------------------------------------------ index out of range
@pytest.mark.parametrize(("call", "fragments"), [
    (lambda x: nb.gather(x, 1, nb.tensor(np.array([[0, 5], [0, 1]]))),
     ("gather:", "index 5", "dim 1 of size 3", "(2, 3)", "(2, 2)")),
    (lambda x: nb.gather(x, 1, nb.tensor(np.array([[0, -1], [0, 1]]))),
     ("gather:", "index -1", "(2, 3)")),
    (lambda x: nb.index_select(x, 1, ints(0, 3)),
     ("index_select:", "index 3", "dim 1 of size 3", "(2, 3)")),
    (lambda x: nb.index_select(x, 0, ints(-3)), ("index_select:", "index -3", "size 2")),
    (lambda x: nb.take(x, ints(6)), ("take:", "index 6", "6 elements", "(2, 3)")),
    (lambda x: nb.take(x, ints(-7)), ("take:", "index -7", "(2, 3)")),
    (lambda x: nb.scatter(x, 1, nb.tensor(np.array([[0, 4]])), ones(1, 2)),
     ("scatter:", "index 4", "dim 1 of size 3", "(1, 2)")),
    (lambda x: nb.scatter_add(x, 0, nb.tensor(np.array([[2, 0, 0]])), ones(1, 3)),
     ("scatter_add:", "index 2", "dim 0 of size 2")),
    (lambda x: F.embedding(ints(0, 5), ones(5, 3)),
     ("embedding:", "index 5", "5 rows", "(2,)", "(5, 3)")),
    (lambda x: F.embedding(ints(-1), ones(5, 3)), ("embedding:", "index -1", "(5, 3)")),
    (lambda x: F.cross_entropy(ones(2, 3), ints(0, 3)), ("cross_entropy:", "target 3", "3")),
    (lambda x: F.nll_loss(ones(2, 3), ints(0, -2)), ("nll_loss:", "target -2")),
    (lambda x: x[ints(0, 2)], ("index:", "(2, 3)", "index 2", "axis 0 with size 2")),
    (lambda x: x[np.array([0, 2])], ("index:", "(2, 3)", "index 2")),
    (lambda x: x[[0, 2]], ("index:", "(2, 3)", "index 2")),
    (lambda x: x[2], ("index:", "[2]", "(2, 3)")),
    (lambda x: x[-3], ("index:", "[-3]", "(2, 3)")),
    (lambda x: x[0, 3], ("index:", "(2, 3)", "index 3", "axis 1")),
    (lambda x: x[:, [1, 3]], ("index:", "(2, 3)", "index 3")),
    (lambda x: x[0, 0, 0], ("index:", "(2, 3)", "too many indices")),
    (lambda x: x[np.array([True, False, True])], ("index:", "(2, 3)", "boolean index")),
    (lambda x: nb.index_put(x, (np.array([5]),), T(1.0)), ("index_put:", "(2, 3)", "index 5")),
    (lambda x: nb.index_put(x, (np.array([9]),), T(1.0), True), ("index_put:", "index 9")),
], ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_index_out_of_range_names_op_index_and_shapes(call, fragments):
    with raises(IndexError, *fragments):
        call(T(np.arange(6.0).reshape(2, 3)))


def test_setitem_out_of_range_leaves_the_tensor_unchanged():
    x = T(np.arange(6.0).reshape(2, 3))
    with raises(IndexError, "index_put:", "[5]", "(2, 3)"):
        x[5] = 1.0
    np.testing.assert_array_equal(x.numpy(), np.arange(6.0).reshape(2, 3))


def test_index_arguments_of_the_wrong_dtype_or_rank():
    x = ones(2, 3)
    with raises(TypeError, "gather:", "integer", "float64"):
        nb.gather(x, 1, T([[0.0, 1.0]]))
    with raises(RuntimeError, "gather:", "(2, 3)", "(3,)"):
        nb.gather(x, 1, ints(0, 0, 0))
    with raises(RuntimeError, "index_select:", "0-D or 1-D", "(2, 2)"):
        nb.index_select(x, 1, nb.zeros(2, 2, dtype=nb.int64))
    with raises(TypeError, "masked_fill:", "bool", "float64"):
        nb.masked_fill(x, ones(3), 1.0)
    with raises(TypeError, "embedding:", "integer", "float64"):
        F.embedding(T([0.0]), ones(5, 3))


# ------------------------------------------------------------------ integer tensors
@pytest.mark.parametrize(("make", "dtype"), [
    (lambda: nb.tensor([1, 2, 3], requires_grad=True), "int64"),
    (lambda: nb.tensor(np.arange(3, dtype=np.int32), requires_grad=True), "int32"),
    (lambda: nb.tensor([True, False], requires_grad=True), "bool"),
    (lambda: nb.tensor([1, 2]).requires_grad_(), "int64"),
    (lambda: nb.zeros(3, dtype=nb.int64, requires_grad=True), "int64"),
    (lambda: nb.arange(3, requires_grad=True), "int64"),
    (lambda: nb.ones(2, 2).to(nb.int64).requires_grad_(), "int64"),
])
def test_integer_and_bool_tensors_cannot_require_grad(make, dtype):
    with raises(TypeError, "floating-point", dtype):
        make()


def test_integer_inputs_flow_through_float_ops_without_gradients():
    i = nb.tensor([1, 2, 3])
    x = nb.tensor([0.5, 0.5, 0.5], requires_grad=True)
    (nb.exp(i) * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([1, 2, 3]))
    assert not nb.exp(i).requires_grad and nb.exp(i).dtype == np.float64


# ------------------------------------------------------------------ wrong argument types
WRONG = [("str", "abc", "str 'abc'"), ("None", None, "None"),
         ("mixed-list", [1.0, "a"], "list [1.0, 'a']")]


def _record_cases():
    cases = []
    for name in sorted(RECORDS):
        op = REGISTRY[name]
        sample = RECORDS[name].samples(np.random.default_rng(0))[0]
        for pos, param in enumerate(op.params[:len(sample.args)]):
            if param.is_tensor or param.is_tensor_list:
                for label, value, _ in WRONG:
                    if value is None and param.optional:
                        continue
                    cases.append(pytest.param(name, pos, value,
                                              id=f"{name}-{param.name}-{label}"))
    return cases


@pytest.mark.parametrize(("name", "pos", "value"), _record_cases())
def test_every_op_refuses_wrong_argument_types_by_name(name, pos, value):
    """Every table op, a string, None or a mixed list in place of each tensor argument:
    a user-facing exception that names the op (never AttributeError or a Numba error)."""
    sample = RECORDS[name].samples(np.random.default_rng(0))[0]
    args, kwargs = make_inputs(sample, requires_grad=False)
    args = list(args)
    args[pos] = [args[pos][0], value] if REGISTRY[name].params[pos].is_tensor_list else value
    with pytest.raises(USER_ERRORS) as info:
        PUBLIC[name](*args, **kwargs)
    assert not type(info.value).__module__.startswith("numba")
    assert name in str(info.value)


def test_every_op_has_a_public_function_checked_here():
    assert set(RECORDS) <= set(PUBLIC)


@pytest.mark.parametrize(("call", "fragments"), [
    (lambda: nb.exp("abc"), ("exp(", "'self'", "must be a tensor", "str 'abc'")),
    (lambda: nb.add(ones(2), None), ("add(", "'other'", "None")),
    (lambda: ones(2) + "abc", ("add(", "str 'abc'")),
    (lambda: ones(2) * [1.0, "a"], ("mul(", "list [1.0, 'a']")),
    (lambda: nb.matmul(ones(2, 2), "x"), ("matmul(", "'other'", "str 'x'")),
    (lambda: nb.sum(None), ("sum(", "'self'", "None")),
    (lambda: nb.cat([ones(2), "a"]), ("cat(", "'tensors'", "list or tuple of tensors")),
    (lambda: nb.cat(ones(2)), ("cat:", "list of tensors")),
    (lambda: nb.reshape(ones(2, 3), "x"), ("reshape", "('x',)")),
    (lambda: nb.clamp(ones(2), "a"), ("clamp(", "'min'", "number", "str 'a'")),
    (lambda: F.softmax(ones(2), "a"), ("softmax(", "'dim'", "int", "str 'a'")),
    (lambda: nb.masked_fill(ones(2), ones(2) > 0, None), ("masked_fill", "value", "None")),
    (lambda: nb.scatter_add(ones(2), 0, ints(0), None), ("scatter_add", "src", "None")),
    (lambda: nb.scatter(ones(2), 0, ints(0), "a"), ("scatter", "src", "str")),
    (lambda: nb.jit(lambda a: nb.exp(a))("abc"), ("exp(", "str 'abc'")),
], ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_wrong_types_to_ops_name_op_argument_and_type(call, fragments):
    with raises(TypeError, *fragments):
        call()


@pytest.mark.parametrize(("call", "exc", "fragments"), [
    (lambda: nb.tensor("abc"), TypeError, ("nbgrad.tensor()", "string 'abc'")),
    (lambda: nb.tensor(None), TypeError, ("nbgrad.tensor()", "None")),
    (lambda: nb.tensor([1, "a"]), TypeError, ("nbgrad.tensor()", "mixed types")),
    (lambda: nb.tensor([1.0, None]), TypeError, ("nbgrad.tensor()", "object")),
    (lambda: nb.tensor([[1.0, 2.0], [3.0]]), TypeError, ("nbgrad.tensor()", "list")),
    (lambda: nb.tensor(np.array([1j], np.clongdouble)), TypeError,
     (str(np.dtype(np.clongdouble)), "not supported")),
    (lambda: nb.zeros(2, dtype=np.complex128), TypeError, ("complex128", "not supported")),
    (lambda: nb.tensor([1.0], dtype="foo"), TypeError, ("'foo'", "not a dtype")),
    (lambda: nb.zeros("a"), TypeError, ("zeros:", "size must be ints", "'a'")),
    (lambda: nb.zeros(None), TypeError, ("zeros:", "None")),
    (lambda: nb.zeros([2, "a"]), TypeError, ("zeros:", "(2, 'a')")),
    (lambda: nb.zeros(2.5), TypeError, ("zeros:", "2.5")),
    (lambda: nb.zeros(-1), ValueError, ("zeros:", "negative", "(-1,)")),
    (lambda: nb.ones(2, "a"), TypeError, ("ones:", "'a'")),
    (lambda: nb.empty(None), TypeError, ("empty:", "None")),
    (lambda: nb.full((2,), "a"), TypeError, ("full:", "fill_value", "str")),
    (lambda: nb.full("a", 1.0), TypeError, ("full:", "'a'")),
    (lambda: nb.arange("a"), TypeError, ("arange:", "end", "str")),
    (lambda: nb.arange(0, 5, 0), ValueError, ("arange:", "step")),
    (lambda: nb.linspace(0, "a", 3), TypeError, ("linspace:", "end", "str")),
    (lambda: nb.linspace(0, 1, 2.5), TypeError, ("linspace:", "2.5")),
    (lambda: nb.eye("a"), TypeError, ("eye:", "'a'")),
    (lambda: nb.eye(-1), ValueError, ("eye:", "negative")),
    (lambda: nb.zeros(2, dtype="foo"), TypeError, ("'foo'", "not a dtype")),
    (lambda: nb.random.normal("a", seed=0), TypeError, ("random.normal:", "'a'")),
    (lambda: nb.random.uniform((2, None), seed=0), TypeError, ("random.uniform:", "None")),
    (lambda: nb.from_numpy([1.0, 2.0]), TypeError, ("from_numpy:", "NumPy array", "list")),
], ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_wrong_types_to_factories(call, exc, fragments):
    with raises(exc, *fragments):
        call()


# ------------------------------------------------------------------ empty tensors
def _quiet(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with np.errstate(all="ignore"):
            return fn()


def test_empty_tensors_through_elementwise_ops_and_backward():
    x = nb.zeros(0, 3, requires_grad=True)
    y = nb.exp(x) * 2 + ones(3)
    assert y.shape == (0, 3)
    y.sum().backward()
    assert x.grad.shape == (0, 3)


@pytest.mark.parametrize(("name", "fn", "want"), [
    ("sum", nb.sum, 0.0), ("prod", nb.prod, 1.0), ("norm", nb.norm, 0.0),
    ("logsumexp", nb.logsumexp, -np.inf), ("mean", nb.mean, np.nan),
    ("var", nb.var, np.nan), ("std", nb.std, np.nan)])
def test_reductions_of_empty_tensors_follow_numpy(name, fn, want):
    got = _quiet(lambda: fn(nb.zeros(0, 3))).item()
    np.testing.assert_equal(got, want)


def test_reductions_of_empty_tensors_along_dims():
    e = nb.zeros(0, 3)
    np.testing.assert_array_equal(nb.sum(e, 0).numpy(), np.zeros(3))
    assert nb.sum(e, 1).shape == (0,)
    assert np.all(np.isnan(_quiet(lambda: nb.mean(e, 0)).numpy()))
    assert nb.amax(e, 1).shape == (0,)
    assert nb.cumsum(e, 0).shape == (0, 3) and F.softmax(e, 0).shape == (0, 3)


@pytest.mark.parametrize("name", ["max", "min", "amax", "amin", "argmax", "argmin"])
def test_max_of_empty_is_a_clear_error(name):
    with raises(IndexError, f"{name}:", "zero-size", "(0, 3)"):
        getattr(nb, name)(nb.zeros(0, 3))
    with raises(IndexError, f"{name}:", "(0, 3)"):
        getattr(nb, name)(nb.zeros(0, 3), 0)


def test_empty_matmul_and_joins():
    assert nb.matmul(nb.zeros(0, 3), ones(3, 2)).shape == (0, 2)
    np.testing.assert_array_equal(nb.mm(nb.zeros(2, 0), nb.zeros(0, 3)).numpy(), np.zeros((2, 3)))
    assert nb.dot(nb.zeros(0), nb.zeros(0)).item() == 0.0
    assert nb.cat([nb.zeros(0, 3), ones(2, 3)]).shape == (2, 3)
    x = nb.zeros(2, 0, requires_grad=True)
    w = nb.ones(0, 3, requires_grad=True)
    nb.matmul(x, w).sum().backward()
    assert x.grad.shape == (2, 0) and w.grad.shape == (0, 3)
    big = ones(2, 3)
    assert big[np.array([], dtype=np.int64)].shape == (0, 3)
    assert nb.take(big, nb.zeros(0, dtype=nb.int64)).shape == (0,)


# ------------------------------------------------------------------ 0-d tensors
@pytest.mark.parametrize("name", sorted(_UNARY))
def test_unary_ops_on_0d_tensors_match_numpy_with_0d_gradients(name):
    rec = RECORDS[name]
    value = next(s.args[0] for s in rec.samples(np.random.default_rng(0))
                 if s.args[0].ndim == 0)
    x = nb.tensor(value, requires_grad=True)
    y = getattr(nb, name)(x)
    assert y.shape == ()
    np.testing.assert_allclose(y.numpy(), rec.ref(value), rtol=1e-10)
    y.backward()
    assert x.grad.shape == ()


@pytest.mark.parametrize("name", sorted(_BINARY))
def test_binary_ops_on_0d_tensors_and_scalars(name):
    rec = RECORDS[name]
    a, b = (np.asarray(v.reshape(-1)[0]) for v in rec.samples(np.random.default_rng(1))[0].args)
    x, y = nb.tensor(a, requires_grad=True), nb.tensor(b, requires_grad=True)
    out = getattr(nb, name)(x, y)
    assert out.shape == ()
    np.testing.assert_allclose(out.numpy(), rec.ref(a, b), rtol=1e-10)
    assert gradcheck(getattr(nb, name), (x, y))
    assert getattr(nb, name)(x, ones(2, 2)).shape == (2, 2)


def test_reductions_and_shape_ops_accept_0d_tensors():
    s = nb.tensor(2.0, requires_grad=True)
    for fn in (nb.sum, nb.mean, nb.prod, nb.amax, nb.amin, nb.logsumexp, nb.norm):
        for dim in (None, 0, -1):
            out = fn(s, dim=dim)
            assert out.shape == () and out.item() == pytest.approx(2.0)
    assert nb.argmax(s).item() == 0 and nb.max(s, 0).values.item() == 2.0
    assert nb.cumsum(s, 0).shape == () and F.softmax(s, 0).item() == 1.0
    assert nb.transpose(s, 0, -1).shape == () and nb.squeeze(s).shape == ()
    assert nb.unsqueeze(s, 0).shape == (1,) and nb.reshape(s, (1, 1)).shape == (1, 1)
    assert nb.flatten(s).shape == (1,) and nb.expand(s, (2, 3)).shape == (2, 3)
    assert nb.stack([s, s]).shape == (2,) and s[()].shape == () and s[None].shape == (1,)
    assert nb.sort(s).values.shape == () and nb.gather(s, 0, ints(0)[0]).shape == ()
    assert F.mse_loss(s, nb.tensor(3.0)).item() == 1.0
    (s * s).exp().sum().backward()
    assert s.grad.shape == () and s.grad.item() == pytest.approx(4.0 * np.exp(4.0))


def test_0d_tensors_where_ops_need_dimensions():
    s = T(2.0)
    with raises(RuntimeError, "matmul:", "()"):
        nb.matmul(s, s)
    with raises(RuntimeError, "dot:", "()"):
        nb.dot(s, s)
    with raises(RuntimeError, "tril:", "()"):
        nb.tril(s)
    with raises(IndexError, "index:", "()", "too many indices"):
        s[0]


# ------------------------------------------------------------------ NumPy memory layouts
BASE = np.arange(12.0).reshape(3, 4)
LAYOUTS = {"transposed": BASE.T, "negative-stride": BASE[::-1, ::-2],
           "fortran": np.asfortranarray(BASE), "strided-view": BASE[:, 1::2],
           "negative-1d": BASE[1, ::-1], "broadcast": np.broadcast_to(BASE[0], (3, 4))}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_tensor_copies_any_numpy_layout(layout):
    a = LAYOUTS[layout]
    t = nb.tensor(a, requires_grad=True)
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.numpy().flags.c_contiguous and not np.shares_memory(t.numpy(), a)
    np.testing.assert_allclose(nb.exp(t).numpy(), np.exp(a))
    np.testing.assert_allclose((t @ nb.tensor(a.T)).numpy(), a @ a.T)
    (nb.sin(t) * nb.tensor(a)).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), np.cos(a) * a)


@pytest.mark.parametrize("layout", sorted(set(LAYOUTS) - {"fortran"}))
def test_from_numpy_refuses_non_contiguous_arrays_naming_shape_and_strides(layout):
    a = LAYOUTS[layout]
    assert not a.flags.c_contiguous
    with raises(TypeError, "from_numpy:", str(a.shape), str(a.strides), "nbgrad.tensor"):
        nb.from_numpy(a)


def test_from_numpy_shares_memory_with_contiguous_arrays():
    a = np.arange(6.0).reshape(2, 3)
    t = nb.from_numpy(a)
    a[0, 0] = 42.0
    assert t.numpy()[0, 0] == 42.0
    with raises(TypeError, "from_numpy:", "strides"):
        nb.from_numpy(np.asfortranarray(a))


# ------------------------------------------------------------------ float16
@pytest.mark.parametrize(("label", "call"), [
    ("array", lambda: nb.tensor(np.ones(2, np.float16))),
    ("scalar", lambda: nb.tensor(np.float16(1.0))),
    ("dtype-argument", lambda: nb.tensor([1.0], dtype=np.float16)),
    ("dtype-string", lambda: nb.tensor([1.0], dtype="float16")),
    ("from_numpy", lambda: nb.from_numpy(np.ones(2, np.float16))),
    ("as_tensor", lambda: nb.as_tensor(np.ones(2, np.float16))),
    ("factory", lambda: nb.zeros(2, dtype=np.float16)),
    ("cast", lambda: nb.ones(2).to(np.float16)),
    ("operand", lambda: nb.ones(2) + np.ones(2, np.float16)),
    ("jit-argument", lambda: nb.jit(lambda a: (a * 2.0).sum())(np.ones(2, np.float16))),
])
def test_float16_is_refused_naming_float16(label, call):
    with raises(TypeError, "float16", "float32"):
        call()
