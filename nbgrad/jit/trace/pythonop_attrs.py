"""The attributes of PythonOp nodes (:mod:`nbgrad.jit.trace.pythonop`): ONNX type codes,
the Function class and non-tensor arguments kept by reference with stable tags, and the
arguments of ``apply`` as ONNX Runtime's attribute kinds (and back)."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...tensor import Tensor

__all__ = ["FnRef", "ObjRef", "argument_attrs", "fn_ref", "kwargs_attr", "obj_ref",
           "onnx_type", "qualified_name", "rebuild_args"]

#: ONNX TensorProto data type codes of the dtypes nbgrad uses
ONNX_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6,
              "int64": 7, "bool": 9, "float16": 10, "float64": 11, "uint32": 12,
              "uint64": 13, "complex64": 14, "complex128": 15}




def onnx_type(dtype: np.dtype) -> int:
    """The ONNX TensorProto type code of ``dtype`` (0 if it has none)."""
    return ONNX_TYPES.get(np.dtype(dtype).name, 0)


# ------------------------------------------------------------------ attribute values
class FnRef:
    """The Function class of a node, by reference. Its ``repr`` (hashed with the graph) is
    ``<Function module.qualname#k>``: ``k`` counts earlier classes of the same name in
    this process, so redefining a class gives new graphs and the first definition gets
    the same hash in every process."""

    __slots__ = ("fn", "tag")

    def __init__(self, fn: type, tag: str) -> None:
        self.fn = fn
        self.tag = tag

    def __repr__(self) -> str:
        return self.tag


_FN_REFS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_FN_COUNT: dict[str, int] = {}
_REF_LOCK = threading.Lock()


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def fn_ref(cls: type) -> FnRef:
    with _REF_LOCK:
        ref = _FN_REFS.get(cls)
        if ref is None:
            name = qualified_name(cls)
            k = _FN_COUNT.get(name, 0)
            _FN_COUNT[name] = k + 1
            ref = _FN_REFS[cls] = FnRef(cls, f"<Function {name}#{k}>")
        return ref


class ObjRef:
    """A non-tensor argument kept by reference (ONNX Runtime's pointer scalars)."""

    __slots__ = ("obj", "tag")

    def __init__(self, obj: Any, tag: str) -> None:
        self.obj = obj
        self.tag = tag

    def __repr__(self) -> str:
        return self.tag


_STABLE_REPR = (type(None), bool, str, bytes, complex, int, float, np.generic)
_OBJ_TAGS: dict[int, tuple[Any, str]] = {}
_OBJ_COUNT = itertools.count()


def obj_ref(obj: Any) -> ObjRef:
    """``obj`` by reference; the same object gets the same tag within a process."""
    if isinstance(obj, _STABLE_REPR) or (isinstance(obj, tuple) and all(
            isinstance(x, _STABLE_REPR) for x in obj)):
        return ObjRef(obj, repr(obj))
    with _REF_LOCK:
        entry = _OBJ_TAGS.get(id(obj))
        if entry is not None:
            held = entry[0]() if isinstance(entry[0], weakref.ref) else entry[0]
            if held is obj:
                return ObjRef(obj, entry[1])
        tag = f"<{type(obj).__qualname__} object #{next(_OBJ_COUNT)}>"
        try:
            holder: Any = weakref.ref(obj)
        except TypeError:
            holder = obj  # not weakly referenceable: kept (traces are few)
        _OBJ_TAGS[id(obj)] = (holder, tag)
        return ObjRef(obj, tag)


def argument_attrs(args: Sequence[Any]) -> dict[str, Any]:
    """``input_convention`` and the non-tensor arguments by kind and position."""
    conv = []
    kinds: dict[str, list] = {k: [] for k in (
        "input_int_scalars", "input_int_scalar_positions", "input_float_scalars",
        "input_float_scalar_positions", "input_int_tuples", "input_int_tuple_positions",
        "input_int_tuple_begins", "input_float_tuples", "input_float_tuple_positions",
        "input_float_tuple_begins", "input_pointer_scalars",
        "input_pointer_scalar_positions")}
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            conv.append("d")
            continue
        conv.append("c")
        if type(a) is int:
            kinds["input_int_scalars"].append(a)
            kinds["input_int_scalar_positions"].append(i)
        elif type(a) is float:
            kinds["input_float_scalars"].append(a)
            kinds["input_float_scalar_positions"].append(i)
        elif type(a) is tuple and a and all(type(x) is int for x in a):
            kinds["input_int_tuple_begins"].append(len(kinds["input_int_tuples"]))
            kinds["input_int_tuples"].extend(a)
            kinds["input_int_tuple_positions"].append(i)
        elif type(a) is tuple and a and all(type(x) is float for x in a):
            kinds["input_float_tuple_begins"].append(len(kinds["input_float_tuples"]))
            kinds["input_float_tuples"].extend(a)
            kinds["input_float_tuple_positions"].append(i)
        else:
            kinds["input_pointer_scalars"].append(obj_ref(a))
            kinds["input_pointer_scalar_positions"].append(i)
    attrs: dict[str, Any] = {"input_convention": "".join(conv)}
    for k, v in kinds.items():
        if v:
            attrs[k] = tuple(v)
    return attrs


def _tuples(flat: Sequence, begins: Sequence[int]) -> list[tuple]:
    if not begins:
        return []
    ends = list(begins[1:]) + [len(flat)]
    return [tuple(flat[b:e]) for b, e in zip(begins, ends, strict=True)]


def rebuild_args(attrs: dict[str, Any], tensors: Sequence[Any]) -> tuple[tuple, dict]:
    """The ``apply`` arguments of a node: ``tensors`` at the ``'d'`` positions, the kept
    non-tensor values at the others."""
    conv = attrs["input_convention"]
    args: list[Any] = [None] * len(conv)
    it = iter(tensors)
    for i, c in enumerate(conv):
        if c == "d":
            args[i] = next(it)
    g = attrs.get
    for p, v in zip(g("input_int_scalar_positions", ()), g("input_int_scalars", ()),
                    strict=True):
        args[p] = v
    for p, v in zip(g("input_float_scalar_positions", ()), g("input_float_scalars", ()),
                    strict=True):
        args[p] = v
    for p, v in zip(g("input_int_tuple_positions", ()),
                    _tuples(g("input_int_tuples", ()), g("input_int_tuple_begins", ())),
                    strict=True):
        args[p] = v
    for p, v in zip(g("input_float_tuple_positions", ()),
                    _tuples(g("input_float_tuples", ()), g("input_float_tuple_begins", ())),
                    strict=True):
        args[p] = v
    for p, r in zip(g("input_pointer_scalar_positions", ()), g("input_pointer_scalars", ()),
                    strict=True):
        args[p] = r.obj
    kwargs = {k: r.obj for k, r in g("#kwargs", ())}
    return tuple(args), kwargs


def kwargs_attr(kwargs: dict) -> tuple:
    return tuple((k, obj_ref(v)) for k, v in kwargs.items())


def _needs_input_grad(attrs: dict[str, Any]) -> tuple[bool, ...]:
    req = iter(attrs["input_requires_grads"])
    return tuple(bool(next(req)) if c == "d" else False for c in attrs["input_convention"])
