"""Parse operator signatures written in PyTorch's schema syntax.

``sum(Tensor self, int[]? dim=None, bool keepdim=False) -> Tensor`` becomes a
:class:`Schema` with one :class:`Param` per argument. Defaults are read with
``ast.literal_eval``; nothing is evaluated.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from ..errors import TableError

_SIGNATURE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*\((.*?)\)\s*(?:->\s*(.+))?$")
_PARAM = re.compile(
    r"^([A-Za-z][A-Za-z0-9_]*(?:\[\d*\])?\??)\s+([A-Za-z_][A-Za-z0-9_]*)(?:\s*=\s*(.+))?$")

TENSOR_TYPES = {"Tensor", "Tensor?"}
TENSOR_LIST_TYPES = {"Tensor[]"}
KNOWN_TYPES = {
    "Tensor", "Tensor[]", "Scalar", "int", "int[]", "float", "float[]", "bool", "str",
    "ScalarType", "Index", "Any",
}


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: object = None
    has_default: bool = False
    kw_only: bool = False
    # derived from ``type`` once (dispatch reads these on every call)
    base_type: str = field(init=False)
    optional: bool = field(init=False)
    is_tensor: bool = field(init=False)
    is_tensor_list: bool = field(init=False)

    def __post_init__(self) -> None:
        base = re.sub(r"\[\d+\]", "[]", self.type.rstrip("?"))
        object.__setattr__(self, "base_type", base)
        object.__setattr__(self, "optional", self.type.endswith("?"))
        object.__setattr__(self, "is_tensor", base == "Tensor")
        object.__setattr__(self, "is_tensor_list", base == "Tensor[]")


@dataclass(frozen=True)
class Schema:
    name: str
    params: tuple[Param, ...]
    returns: tuple[str, ...]  # one name per output ("result" for a single output)
    returns_list: bool = False  # "-> Tensor[]": a variable number of outputs

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def tensor_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.is_tensor or p.is_tensor_list)

    @property
    def num_outputs(self) -> int:
        return len(self.returns)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    tail = "".join(current).strip()
    if tail:
        parts.append(tail)
    return parts


def _parse_default(text: str, where: str) -> object:
    text = text.strip()
    if text in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[text]
    if text in ("inf", "-inf"):
        return float(text)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError) as exc:
        raise TableError(f"{where}: cannot read default value {text!r}") from exc


def _parse_returns(text: str | None, where: str) -> tuple[tuple[str, ...], bool]:
    if text is None or text.strip() in ("Tensor", ""):
        return ("result",), False
    text = text.strip()
    if text == "Tensor[]":
        return ("result",), True
    if text.startswith("(") and text.endswith(")"):
        names = []
        for i, item in enumerate(_split_top_level(text[1:-1])):
            bits = item.split()
            if bits[0] != "Tensor":
                raise TableError(f"{where}: outputs must be tensors, got {item!r}")
            names.append(f"result{i}")
        return tuple(names), False
    raise TableError(f"{where}: cannot read return type {text!r}")


def parse_schema(signature: str) -> Schema:
    """Parse ``name(Type arg=default, ...) -> Returns``."""
    match = _SIGNATURE.match(signature)
    if not match:
        raise TableError(f"cannot read signature {signature!r}")
    name, body, returns = match.groups()
    params: list[Param] = []
    kw_only = False
    seen: set[str] = set()
    for item in _split_top_level(body):
        if item == "*":
            kw_only = True
            continue
        pmatch = _PARAM.match(item)
        if not pmatch:
            raise TableError(f"{name}: cannot read parameter {item!r}")
        ptype, pname, default = pmatch.groups()
        param = Param(
            name=pname,
            type=ptype,
            default=_parse_default(default, name) if default is not None else None,
            has_default=default is not None,
            kw_only=kw_only,
        )
        if param.base_type not in KNOWN_TYPES:
            raise TableError(f"{name}: unknown type {ptype!r} of parameter {pname!r}")
        if pname in seen:
            raise TableError(f"{name}: parameter {pname!r} appears twice")
        seen.add(pname)
        params.append(param)
    outs, is_list = _parse_returns(returns, name)
    return Schema(name=name, params=tuple(params), returns=outs, returns_list=is_list)
