"""Clear errors for op arguments of the wrong type, found from the table's signatures.

Every public op function is wrapped by :func:`reporting_argument_errors` (installed by
:func:`nbgrad.ops.registry.op_function`). A call that succeeds costs one extra Python
call and nothing else. When the function raises, its arguments are compared with the
op's signature in ``formulas/derivatives.yaml``; an argument of the wrong type (a
string where a tensor goes, ``None`` for a required tensor, a list of mixed types, a
string or a float where an int ``dim`` goes, ...) is then reported as a ``TypeError``
naming the op, the parameter, its position and the type received, in place of the
internal error it caused (an ``AttributeError``, a NumPy conversion error, a Numba
typing error). Errors that the argument types do not explain, and the function's own
errors (whose message starts with the op's name), pass through unchanged.

Formulas call the unwrapped functions (``OpDef.fn``): their arguments are the
engine's own tensors.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import numpy as np

from ..tensor import Tensor

_NUMBER = (bool, int, float, np.number, np.bool_)
_INTEGER = (int, np.integer)


#: other spellings of a parameter (NumPy's and PyTorch's): a function with a parameter named
#: like a key also takes it by each alternative name it does not use itself
SPELLINGS: dict[str, tuple[str, ...]] = {
    "dim": ("axis", "dims"), "dims": ("axis", "dim"), "keepdim": ("keepdims",)}


def _respelling(fn: Callable) -> dict[str, str]:
    """{other spelling: ``fn``'s parameter} for the parameters of ``fn`` in SPELLINGS."""
    params = inspect.signature(fn).parameters
    renames: dict[str, str] = {name: name for name, p in params.items()  # flip(x, dims=(0,))
                               if p.kind == inspect.Parameter.VAR_POSITIONAL}
    for name, others in SPELLINGS.items():
        if name in params:
            for other in others:
                if other not in params:
                    renames.setdefault(other, name)
    return renames


def _respelled(op, fn: Callable, renames: dict[str, str], args: tuple, kwargs: dict):
    """``args, kwargs`` with other spellings renamed to ``fn``'s parameters (a
    ``*dims``-style parameter given by keyword goes after the positional arguments)."""
    kwargs = dict(kwargs)
    for other, name in renames.items():
        if other not in kwargs:
            continue
        if name in kwargs and name != other:
            raise TypeError(f"{op.name}(): got both '{name}' and its other spelling '{other}'")
        value = kwargs.pop(other)
        if inspect.signature(fn).parameters[name].kind == inspect.Parameter.VAR_POSITIONAL:
            args = (*args, *(value if isinstance(value, (list, tuple)) else (value,)))
        else:
            kwargs[name] = value
    return args, kwargs


def reporting_argument_errors(fn: Callable, op) -> Callable:
    """``fn`` with its failures on badly typed arguments turned into clear TypeErrors, and
    NumPy's and PyTorch's spellings of its parameters accepted (:data:`SPELLINGS`)."""
    renames = _respelling(fn)

    @functools.wraps(fn)
    def public(*args, **kwargs):
        if kwargs and renames and not renames.keys().isdisjoint(kwargs):
            args, kwargs = _respelled(op, fn, renames, args, kwargs)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            error = None if str(exc).startswith(op.name) else \
                argument_error(op, fn, args, kwargs)
            if error is None:
                raise
        raise error

    return public


def argument_error(op, fn: Callable, args: tuple, kwargs: dict) -> TypeError | None:
    """A TypeError for the first argument whose type the op's signature rules out."""
    try:
        return _first_mismatch(op, fn, args, kwargs)
    except Exception:  # never hide the original error behind one of this check's own
        return None


def _first_mismatch(op, fn: Callable, args: tuple, kwargs: dict) -> TypeError | None:
    entry = op.entry
    if entry is None:
        return None
    signature = inspect.signature(fn)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        return TypeError(f"{op.name}(): {exc}")
    if any(getattr(v, "is_complex_tensor", False) for v in bound.arguments.values()):
        return TypeError(f"nbgrad: {op.name} does not take complex tensors; use "
                         ".real/.imag/abs() or view_as_real")
    variadic = {p.name for p in signature.parameters.values() if p.kind == p.VAR_POSITIONAL}
    for position, param in enumerate(entry.schema.params, start=1):
        if param.name not in bound.arguments:
            continue
        value = bound.arguments[param.name]
        if param.name in variadic and len(value) == 1 and isinstance(value[0], (list, tuple)):
            value = value[0]  # reshape(x, (2, 3)) as well as reshape(x, 2, 3)
        wanted = _wanted(param, value)
        if wanted is not None:
            return TypeError(f"{op.name}(): argument '{param.name}' (position {position}) "
                             f"must be {wanted}, not {_describe(value)}")
    return None


def _wanted(param, value) -> str | None:
    """What ``param`` needs, when ``value`` does not fit it; else None."""
    if value is None:
        if param.optional or (param.has_default and param.default is None):
            return None
        return _NEEDS.get(param.base_type, "a value")
    check = _CHECKS.get(param.base_type)
    if check is None or check(value):
        return None
    return _NEEDS[param.base_type]


def _tensor_like(value) -> bool:
    if isinstance(value, (Tensor, *_NUMBER)):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biuf"
    if isinstance(value, (list, tuple)):
        try:
            return np.asarray(value).dtype.kind in "biuf"
        except (ValueError, TypeError):
            return False  # ragged
    return hasattr(value, "__array__") or hasattr(value, "__dlpack__")


def _int_like(value) -> bool:
    if isinstance(value, Tensor):
        return value.ndim == 0 and value.dtype.kind in "iu"
    return isinstance(value, _INTEGER)


def _ints_like(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_int_like(v) for v in value)
    return _int_like(value)


def _number_like(value) -> bool:
    if isinstance(value, Tensor):
        return value.ndim == 0
    return isinstance(value, _NUMBER)


_CHECKS: dict[str, Callable] = {
    "Tensor": _tensor_like,
    "Tensor[]": lambda v: isinstance(v, (list, tuple)) and all(_tensor_like(t) for t in v),
    "int": _int_like,
    "int[]": _ints_like,
    "float": _number_like,
    "Scalar": _number_like,
    "bool": lambda v: isinstance(v, (bool, np.bool_, int, np.integer)),
    "str": lambda v: isinstance(v, str),
}
_NEEDS: dict[str, str] = {
    "Tensor": "a tensor (or a number, a NumPy array or a nested list of numbers)",
    "Tensor[]": "a list or tuple of tensors",
    "int": "an int",
    "int[]": "an int or a sequence of ints",
    "float": "a number",
    "Scalar": "a number",
    "bool": "a bool",
    "str": "a string",
}


def _describe(value) -> str:
    """The type of ``value``, with a short repr where that helps (strings, lists)."""
    name = type(value).__name__
    if value is None:
        return "None"
    if isinstance(value, (str, list, tuple)):
        text = repr(value)
        return f"{name} {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(value, np.ndarray):
        return f"ndarray of dtype {value.dtype}"
    return name
