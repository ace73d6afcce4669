"""Composite backward helpers: Python functions over table ops that formulas may call.

A helper calls ops through a :class:`TableOps` namespace (``ops.where(c, g, 0.0)``,
``ops.linalg.solve(A, B)``) and Python operators on tensors, so everything it computes
is recorded like a formula's own op calls: double backward and the jit's traced
backward need nothing more. :func:`helper_ops` reads a helper's source once to list
the ops it calls (for the table's cross-check and :attr:`Formula.ops`) and to refuse
what would escape the table: attributes other than ``shape``, ``ndim``, ``dtype``, and
calls of anything but ops, other helpers, metadata helpers and a few builtins.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Mapping

from ..errors import TableError
from .operators import ALLOWED_ATTRIBUTES, BINARY_OPS, COMPARE_OPS, UNARY_OPS

#: builtins a helper may call (on shapes, dims and flags)
ALLOWED_BUILTINS = frozenset({"len", "tuple", "list", "range", "int", "float", "bool", "zip",
                              "enumerate", "isinstance", "min", "max"})


class TableOps:
    """Attribute access to the functions of table ops: ``ops.mul``, ``ops.linalg.inv``
    (each looked up once, at its first use, as formulas' ops are)."""

    def __init__(self, resolve: Callable[[str], Callable], prefix: str = "") -> None:
        self._resolve = resolve
        self._prefix = prefix

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        full = self._prefix + name
        try:
            found = self._resolve(full)
        except TableError:
            found = TableOps(self._resolve, full + ".")  # e.g. ``linalg``
        setattr(self, name, found)
        return found

    def __call__(self, *args, **kwargs):
        raise TableError(f"no table op is named {self._prefix[:-1]!r}")


_SCANS: dict[Callable, tuple[frozenset[str], frozenset[str]]] = {}


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``['a', 'b', 'c']`` (None for anything but names and attributes)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _operator_op(node: ast.AST) -> str | None:
    """The table op an operator node calls on tensors."""
    if isinstance(node, ast.BinOp):
        table = BINARY_OPS
        key = type(node.op)
    elif isinstance(node, ast.UnaryOp):
        if isinstance(node.op, (ast.Not, ast.UAdd)) or isinstance(node.operand, ast.Constant):
            return None
        table, key = UNARY_OPS, type(node.op)
    elif isinstance(node, ast.Compare):
        if any(isinstance(o, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for o in node.ops):
            return None
        if len(node.ops) != 1:
            raise ValueError("chained comparisons")
        if any(isinstance(c, ast.Constant) and isinstance(c.value, str)
               for c in (node.left, *node.comparators)):
            return None  # a flag such as ``kind == 'inf'``
        table, key = COMPARE_OPS, type(node.ops[0])
    else:
        return None
    if key not in table:
        raise ValueError(f"operator {key.__name__}")
    return table[key][0]


def _scan(fn: Callable) -> tuple[frozenset[str], frozenset[str]]:
    """(ops, helper names) that ``fn``'s body calls; ValueError for what is not allowed."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    scope = fn.__globals__
    ops: set[str] = set()
    called: set[str] = set()
    chains: set[int] = set()  # attribute nodes inside an ``ops.x.y`` chain
    for node in ast.walk(tree):
        name = _operator_op(node)
        if name:
            ops.add(name)
        if isinstance(node, ast.Attribute) and id(node) not in chains:
            parts = _chain(node)
            if parts and isinstance(scope.get(parts[0]), TableOps):
                ops.add(".".join(parts[1:]))
                inner = node.value
                while isinstance(inner, ast.Attribute):
                    chains.add(id(inner))
                    inner = inner.value
            elif node.attr not in ALLOWED_ATTRIBUTES:
                raise ValueError(f"attribute {ast.unparse(node)!r}")
        elif isinstance(node, ast.Call):
            parts = _chain(node.func)
            if parts is None:
                raise ValueError(f"call of {ast.unparse(node.func)!r}")
            if len(parts) == 1 and not isinstance(scope.get(parts[0]), TableOps):
                called.add(parts[0])
    return frozenset(ops), frozenset(called)


def helper_ops(name: str, helpers: Mapping[str, Callable], meta_helpers: Mapping[str, Callable],
               is_op: Callable[[str], bool], where: str) -> frozenset[str]:
    """The table ops backward helper ``name`` calls, its callees' included (operators
    count as their ops even where they may act on plain numbers: a superset).

    Raises :class:`TableError` naming ``where`` when the helper calls an unknown op or
    function, or reads an attribute other than shape, ndim or dtype.
    """
    out: set[str] = set()
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        fn = helpers[current]
        scan = _SCANS.get(fn)
        if scan is None:
            try:
                scan = _SCANS[fn] = _scan(fn)
            except (OSError, TypeError, ValueError) as exc:
                raise TableError(f"{where}: backward helper {current!r} is not a plain "
                                 f"function of table ops ({exc})") from exc
        ops, called = scan
        unknown = sorted(o for o in ops if not is_op(o))
        if unknown:
            raise TableError(f"{where}: backward helper {current!r} calls unknown op(s) "
                             f"{unknown}")
        out |= ops
        for callee in called:
            if callee in helpers:
                todo.append(callee)
            elif callee not in meta_helpers and callee not in ALLOWED_BUILTINS:
                raise TableError(f"{where}: backward helper {current!r} calls {callee!r}, "
                                 "which is no op, helper or allowed builtin")
    return frozenset(out)
