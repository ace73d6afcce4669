"""Derivative formulas: parsed with ``ast`` against an allowlist, compiled to functions.

A formula such as ``grad * cos(self)`` is parsed into an AST, every node is checked
against :data:`ALLOWED_NODES`, and operators and calls are rewritten into calls of
registered ops, metadata helpers (functions of shapes) or composite backward helpers
(Python over table ops, :mod:`nbgrad.table.composite`). The rewritten tree is
compiled into a small Python function whose parameters are the formula's free names.
Nothing from the table is ever passed to ``eval``: only trees that passed the
allowlist are compiled.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..errors import TableError
from .composite import helper_ops
from .operators import ALLOWED_ATTRIBUTES, BINARY_OPS, COMPARE_OPS, UNARY_OPS

ALLOWED_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Name, ast.Load,
    ast.Constant, ast.Attribute, ast.Subscript, ast.Tuple, ast.List, ast.IfExp,
    ast.keyword, ast.BoolOp, ast.And, ast.Or, ast.Not,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.MatMult, ast.BitAnd, ast.BitOr,
    ast.USub, ast.UAdd, ast.Invert,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Is, ast.IsNot,
)


@dataclass
class Formula:
    """One compiled derivative formula."""

    text: str
    func: Callable
    arg_names: tuple[str, ...]  # positional parameters of ``func``
    ops: frozenset[str]  # ops it calls (checked against the registry)
    tensor_names: frozenset[str] = field(default_factory=frozenset)  # need the values
    meta_names: frozenset[str] = field(default_factory=frozenset)  # need only metadata
    source: str = ""  # the compiled function's text (a function named ``formula``)
    called: frozenset[str] = field(default_factory=frozenset)  # ops called by name
    helpers_used: frozenset[str] = field(default_factory=frozenset)
    #: composite backward helpers it calls (their ops are in ``ops``)
    backward_helpers_used: frozenset[str] = field(default_factory=frozenset)


def _dotted_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


class _Rewriter(ast.NodeTransformer):
    """Turn operators and op calls into calls of ``__op`` helpers bound at compile time."""

    def __init__(self, where: str, scope: frozenset[str], is_op: Callable[[str], bool],
                 helpers: frozenset[str], backward_helpers: frozenset[str] = frozenset()):
        self.where = where
        self.scope = scope
        self.is_op = is_op
        self.helpers = helpers
        self.backward_helpers = backward_helpers
        self.helpers_used: set[str] = set()
        self.backward_used: set[str] = set()
        self._meta_depth = 0
        self.ops: set[str] = set()
        self.called: set[str] = set()
        self.names: set[str] = set()
        self.value_names: set[str] = set()
        self.meta_names: set[str] = set()

    def _fail(self, node: ast.AST, why: str) -> TableError:
        return TableError(f"{self.where}: {why} (at {ast.unparse(node)!r})")

    def _call(self, helper: str, args: list[ast.expr], keywords=()) -> ast.Call:
        return ast.Call(func=ast.Name(id=helper, ctx=ast.Load()), args=args,
                        keywords=list(keywords))

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        name, _ = BINARY_OPS[type(node.op)]
        self.ops.add(name)
        return self._call(f"__bin_{name}", [self.visit(node.left), self.visit(node.right)])

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        if isinstance(node.op, (ast.UAdd, ast.Not)):
            node.operand = self.visit(node.operand)
            return node
        name, _ = UNARY_OPS[type(node.op)]
        self.ops.add(name)
        return self._call(f"__una_{name}", [self.visit(node.operand)])

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        if len(node.ops) != 1:
            raise self._fail(node, "chained comparisons are not allowed")
        if isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            node.left = self.visit(node.left)
            node.comparators = [self.visit(c) for c in node.comparators]
            return node
        name, _ = COMPARE_OPS[type(node.ops[0])]
        self.ops.add(name)
        return self._call(f"__bin_{name}", [self.visit(node.left),
                                            self.visit(node.comparators[0])])

    def visit_Call(self, node: ast.Call) -> ast.AST:
        name = _dotted_name(node.func)
        if name is None:
            raise self._fail(node, "only named ops can be called")
        if name in self.helpers:
            # metadata helpers: the tensors they get are read for shapes only
            self.helpers_used.add(name)
            self._meta_depth += 1
            args = [self.visit(a) for a in node.args]
            self._meta_depth -= 1
            return self._call(f"__hlp_{name}", args)
        if name in self.backward_helpers:
            # composite backward helpers: their arguments count as values (like an op's)
            self.backward_used.add(name)
            target = f"__bwd_{name}"
        elif self.is_op(name):
            self.ops.add(name)
            self.called.add(name)
            target = f"__op_{name.replace('.', '__')}"
        else:
            raise self._fail(node, f"unknown op {name!r}")
        if any(k.arg is None for k in node.keywords):
            raise self._fail(node, "** arguments are not allowed")
        # an op or helper reads its tensors' values, even inside a metadata helper's call
        depth, self._meta_depth = self._meta_depth, 0
        args = [self.visit(a) for a in node.args]
        keywords = [ast.keyword(arg=k.arg, value=self.visit(k.value)) for k in node.keywords]
        self._meta_depth = depth
        return self._call(target, args, keywords)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if node.attr not in ALLOWED_ATTRIBUTES:
            raise self._fail(node, f"attribute {node.attr!r} is not allowed; "
                             f"use one of {sorted(ALLOWED_ATTRIBUTES)}")
        if isinstance(node.value, ast.Name):
            self._use(node.value, meta=True)
            return node
        node.value = self.visit(node.value)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        self._use(node, meta=self._meta_depth > 0)
        return node

    def _use(self, node: ast.Name, meta: bool) -> None:
        if node.id in ("True", "False", "None"):
            return
        if node.id not in self.scope:
            raise self._fail(node, f"unknown name {node.id!r}")
        self.names.add(node.id)
        (self.meta_names if meta else self.value_names).add(node.id)

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        node.value = self.visit(node.value)
        node.slice = self.visit(node.slice)
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if not isinstance(node, ALLOWED_NODES):
            raise self._fail(node, f"{type(node).__name__} is not allowed in a formula")
        return super().generic_visit(node)

    def visit(self, node: ast.AST) -> ast.AST:
        if not isinstance(node, ALLOWED_NODES):
            raise self._fail(node, f"{type(node).__name__} is not allowed in a formula")
        return super().visit(node)


def _python_or_op(op_name: str, py_op: Callable, resolve: Callable[[str], Callable],
                  is_tensor: Callable[[object], bool]) -> Callable:
    """Apply ``py_op`` to plain values and the registered op when a tensor is involved."""
    op_fn = None
    tensor_type = getattr(is_tensor, "tensor_type", None)

    def apply(*args):
        nonlocal op_fn
        if tensor_type is not None:
            involved = False
            for a in args:
                if isinstance(a, tensor_type):
                    involved = True
                    break
        else:
            involved = any(is_tensor(a) for a in args)
        if involved:
            if op_fn is None:
                op_fn = resolve(op_name)
            return op_fn(*args)
        return py_op(*args)

    apply.__name__ = f"formula_{op_name}"
    return apply


def bind_names(namespace: dict, called, helpers_used, resolve: Callable,
               helpers: Mapping[str, Callable], backward_used=(),
               backward_helpers: Mapping[str, Callable] | None = None) -> None:
    """Put the ops and the metadata and backward helpers a formula calls into its namespace."""
    for name in helpers_used:
        namespace[f"__hlp_{name}"] = helpers[name]
    for name in backward_used:
        namespace[f"__bwd_{name}"] = backward_helpers[name]
    for name in called:
        namespace[f"__op_{name.replace('.', '__')}"] = _LazyOp(name, resolve)


_NAMESPACES: dict[tuple, dict] = {}


def operator_namespace(resolve: Callable, is_tensor: Callable) -> dict:
    """The helpers that operators compile to (``__bin_add`` ...), shared by every formula
    of one table."""
    key = (resolve, is_tensor)
    namespace = _NAMESPACES.get(key)
    if namespace is None:
        namespace = {"__builtins__": {}}
        for name, py_op in [*BINARY_OPS.values(), *COMPARE_OPS.values()]:
            namespace[f"__bin_{name}"] = _python_or_op(name, py_op, resolve, is_tensor)
        for name, py_op in UNARY_OPS.values():
            namespace[f"__una_{name}"] = _python_or_op(name, py_op, resolve, is_tensor)
        _NAMESPACES.clear()  # only the latest table's
        _NAMESPACES[key] = namespace
    return namespace


def compile_formula(text: str, where: str, scope: frozenset[str],
                    is_op: Callable[[str], bool], resolve: Callable[[str], Callable],
                    is_tensor: Callable[[object], bool],
                    helpers: Mapping[str, Callable] | None = None,
                    backward_helpers: Mapping[str, Callable] | None = None) -> Formula:
    """Parse, check and compile one formula.

    ``scope`` is the set of names the formula may read; ``is_op`` says whether a
    called name is a registered op; ``resolve`` returns an op's function (looked up
    at the first call, so the table can load before the ops). ``helpers`` are plain
    functions of metadata (shapes, dims) that formulas may call; ``backward_helpers``
    are composites of table ops (:mod:`nbgrad.table.composite`), whose tensor
    arguments are saved as values and whose ops count as the formula's.
    """
    helpers = helpers or {}
    backward_helpers = backward_helpers or {}
    try:
        tree = ast.parse(str(text).strip(), mode="eval")
    except SyntaxError as exc:
        raise TableError(f"{where}: formula {text!r} is not an expression: {exc.msg}") from exc
    rewriter = _Rewriter(where, scope, is_op, frozenset(helpers), frozenset(backward_helpers))
    body = rewriter.visit(tree.body)
    for name in rewriter.backward_used:
        rewriter.ops |= helper_ops(name, backward_helpers, helpers, is_op, where)
    arg_names = tuple(sorted(rewriter.names))
    # The checked, rewritten tree is turned back into text and compiled (C-fast, and
    # the same code as compiling the tree; nothing of the raw table text is evaluated).
    source = f"def formula({', '.join(arg_names)}):\n    return {ast.unparse(body)}\n"
    namespace = dict(operator_namespace(resolve, is_tensor))
    bind_names(namespace, rewriter.called, rewriter.helpers_used, resolve, helpers,
               rewriter.backward_used, backward_helpers)
    code = compile(source, filename=f"<formula {where}>", mode="exec")
    exec(code, namespace)  # the tree passed the allowlist above  # noqa: S102
    return Formula(
        text=str(text),
        func=namespace["formula"],
        arg_names=arg_names,
        ops=frozenset(rewriter.ops),
        tensor_names=frozenset(rewriter.value_names),
        meta_names=frozenset(rewriter.meta_names - rewriter.value_names),
        source=source,
        called=frozenset(rewriter.called),
        helpers_used=frozenset(rewriter.helpers_used),
        backward_helpers_used=frozenset(rewriter.backward_used),
    )


class _LazyOp:
    """An op looked up on first use, so formulas compile before the ops are imported."""

    __slots__ = ("name", "resolve", "fn")

    def __init__(self, name: str, resolve: Callable[[str], Callable]):
        self.name = name
        self.resolve = resolve
        self.fn = None

    def __call__(self, *args, **kwargs):
        fn = self.fn
        if fn is None:
            fn = self.fn = self.resolve(self.name)
        return fn(*args, **kwargs)
