"""The Python operators a formula or a backward helper may use, and the ops they call."""

from __future__ import annotations

import ast
import operator

#: attributes a formula may read from a tensor: metadata only
ALLOWED_ATTRIBUTES = frozenset({"shape", "ndim", "dtype"})

BINARY_OPS = {
    ast.Add: ("add", operator.add),
    ast.Sub: ("sub", operator.sub),
    ast.Mult: ("mul", operator.mul),
    ast.Div: ("div", operator.truediv),
    ast.Pow: ("pow", operator.pow),
    ast.MatMult: ("matmul", operator.matmul),
    ast.BitAnd: ("logical_and", operator.and_),
    ast.BitOr: ("logical_or", operator.or_),
}
COMPARE_OPS = {
    ast.Eq: ("eq", operator.eq),
    ast.NotEq: ("ne", operator.ne),
    ast.Lt: ("lt", operator.lt),
    ast.LtE: ("le", operator.le),
    ast.Gt: ("gt", operator.gt),
    ast.GtE: ("ge", operator.ge),
}
UNARY_OPS = {ast.USub: ("neg", operator.neg), ast.Invert: ("logical_not", operator.invert)}

#: every op a formula's operators can turn into
OPERATOR_OPS = frozenset(
    name for name, _ in [*BINARY_OPS.values(), *COMPARE_OPS.values(), *UNARY_OPS.values()]
)
