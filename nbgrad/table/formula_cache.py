"""Compiled formulas kept between processes, so ``import nbgrad`` does not recompile them.

The first import after a change to the table (or to the formula compiler) checks and
compiles every formula as usual, then writes them all as one generated module into
the cache folder (``nbgrad.codegen``), keyed by a digest of everything that decides
the result: the table's text, the compiler's source, and the metadata helpers' names.
Later imports load that module, bind the ops into its namespace, and skip parsing.
A missing or damaged module only means compiling again.
"""

from __future__ import annotations

import hashlib
import pprint
import warnings
from collections.abc import Callable
from pathlib import Path

from .. import codegen
from . import formula as formula_module
from . import loader as loader_module
from .formula import Formula, bind_names, compile_formula, operator_namespace

MODULE_NAME = "formulas"


def table_digest(table_text: str, helpers: dict[str, Callable]) -> str:
    """A digest of the table text, the compiler's code and the helper names."""
    h = hashlib.sha256()
    for part in (table_text, Path(formula_module.__file__).read_text(),
                 Path(loader_module.__file__).read_text(), ",".join(sorted(helpers))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


class FormulaCache:
    """A ``compile_fn`` for :func:`~nbgrad.table.loader.load_table` that reuses the
    formulas compiled by an earlier process for the same digest."""

    def __init__(self, digest: str, resolve: Callable, is_tensor: Callable,
                 helpers: dict[str, Callable]) -> None:
        self.digest = digest
        self.resolve = resolve
        self.is_tensor = is_tensor
        self.helpers = helpers
        self.compiled: dict[str, Formula] = {}
        self.missed = False
        self.cached = self._load()

    def _load(self) -> dict[str, Formula]:
        try:
            return self._read()
        except Exception as exc:  # a damaged file: compile again and rewrite it
            warnings.warn(f"nbgrad: cached formulas were damaged ({type(exc).__name__}: "
                          f"{exc}); recompiling", RuntimeWarning, stacklevel=4)
            self.missed = True
            return {}

    def _read(self) -> dict[str, Formula]:
        module = codegen.find_module(MODULE_NAME, self.digest)
        if module is None:
            return {}
        namespace = module.__dict__
        namespace.update(operator_namespace(self.resolve, self.is_tensor))
        out = {}
        for where, info in module.FORMULAS.items():
            bind_names(namespace, info["called"], info["helpers"], self.resolve, self.helpers)
            out[where] = Formula(
                text=info["text"], func=namespace[info["func"]],
                arg_names=tuple(info["args"]), ops=frozenset(info["ops"]),
                tensor_names=frozenset(info["tensor"]), meta_names=frozenset(info["meta"]),
                source=info["source"], called=frozenset(info["called"]),
                helpers_used=frozenset(info["helpers"]))
        return out

    def __call__(self, text: str, where: str, scope, is_op, resolve, is_tensor,
                 helpers) -> Formula:
        hit = self.cached.get(where)
        if hit is not None and hit.text == text:
            self.compiled[where] = hit
            return hit
        self.missed = True
        result = compile_formula(text, where, scope, is_op, resolve, is_tensor, helpers)
        self.compiled[where] = result
        return result

    def save(self) -> None:
        """Write every formula of this table, if any had to be compiled."""
        if not self.missed:
            return
        parts = ['"""Compiled derivative formulas (see nbgrad/table/formula_cache.py)."""\n']
        index = {}
        for i, (where, f) in enumerate(self.compiled.items()):
            name = f"formula_{i}"
            parts.append("\n\n" + f.source.replace("def formula(", f"def {name}(", 1))
            index[where] = {"text": f.text, "func": name, "args": list(f.arg_names),
                            "ops": sorted(f.ops), "tensor": sorted(f.tensor_names),
                            "meta": sorted(f.meta_names), "source": f.source,
                            "called": sorted(f.called), "helpers": sorted(f.helpers_used)}
        parts.append(f"\n\nFORMULAS = {pprint.pformat(index, width=100)}\n")
        try:
            codegen.write_module(MODULE_NAME, self.digest, "".join(parts))
        except OSError:
            pass  # an unwritable cache only means compiling at the next import
