"""The derivative table: schema parsing, safe formula compilation, loading."""

from .formula import Formula, compile_formula
from .loader import Entry, load_table, table_path
from .schema import Param, Schema, parse_schema

__all__ = ["Entry", "Formula", "Param", "Schema", "compile_formula", "load_table",
           "parse_schema", "table_path"]
