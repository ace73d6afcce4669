"""The one-way core (issue 13): nbgrad's layers and the imports between them, read by AST.

What is enforced:

(a) no module of ``nbgrad/ops/`` imports ``nbgrad.autograd``, and ``nbgrad/tensor.py``
    imports neither ``nbgrad.ops`` nor ``nbgrad.autograd``: not at module level and not
    inside functions (autograd installs its recorder into dispatch and ``backward`` /
    ``retain_grad`` into tensor; ops installs itself into tensor);
(b) at module level (imports that run at import time: ``if TYPE_CHECKING`` blocks and
    function bodies excepted), every module imports only from its own unit or from units
    of a lower layer of :data:`LAYERS`, so the import graph between units is acyclic;
    every unit of the package must be placed in :data:`LAYERS`;
(c) the number of imports inside functions (``def`` or ``async def`` bodies, nested
    ones included, each import statement once) stays within :data:`FUNCTION_IMPORT_BUDGET`.
    Those left are lazy on purpose: CUDA and numba.cuda, rich at CLI start, hypothesis,
    scipy.special, scipy.linalg's BLAS (nbgrad.kernels.blas, at the first triangular
    solve) and the records (via nbgrad.numpy_interop / nbgrad.testing.records).

A unit is a subpackage (``nbgrad.ops``) or a module at the package root
(``nbgrad.tensor``); ``nbgrad`` itself is the package's ``__init__`` (the public API).
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbgrad

ROOT = Path(nbgrad.__file__).resolve().parent

#: lowest layer first; a module may import (at module level) only from its own unit or
#: from a unit of a lower layer. Units in one layer do not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("nbgrad.errors", "nbgrad.version", "nbgrad.dtypes", "nbgrad.device", "nbgrad.grad_mode",
     "nbgrad.pytree", "nbgrad.cache_guard", "nbgrad.numba_init"),
    ("nbgrad.codegen",),
    ("nbgrad.table",),
    ("nbgrad.kernels",),
    ("nbgrad.backends",),
    ("nbgrad.tensor",),
    ("nbgrad.factories",),
    ("nbgrad.random",),
    ("nbgrad.ops",),
    ("nbgrad.autograd", "nbgrad.cuda"),  # both build on ops: the graph, the CUDA kernels
    ("nbgrad.functional", "nbgrad.linalg", "nbgrad.nn", "nbgrad.optim", "nbgrad.special",
     "nbgrad.recompute", "nbgrad.complex_tensor"),
    ("nbgrad.numpy_interop", "nbgrad.fft"),
    ("nbgrad.jit",),  # its CUDA tier (nbgrad.jit.cuda) uses nbgrad.cuda's kernels
    ("nbgrad.batching",),  # vmap: runs the jit tracer's graphs with batching rules
    ("nbgrad.testing",),
    ("nbgrad",),
    ("nbgrad.cli",),
    ("nbgrad.__main__",),
)

#: imports inside functions, per part of the package (issue 13: at most 98 in all, half
#: of the 197 counted when it was written). Lower these as imports move to module level.
FUNCTION_IMPORT_BUDGET = {"outside nbgrad/jit": 14, "whole package": 25}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _is_module(name: str, root: Path) -> bool:
    path = root.parent.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             root: Path) -> list[str]:
    """The modules an import statement loads (``from a import b``: ``a.b`` if a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    subs = [f"{source}.{a.name}" for a in node.names if _is_module(f"{source}.{a.name}", root)]
    return subs or [source]


def _imports(tree: ast.Module):
    """(import node, inside a function?) for every import statement of a module."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, in_function))
            elif (isinstance(child, ast.If) and not in_function
                  and "TYPE_CHECKING" in ast.unparse(child.test)):
                visit(ast.Module(body=child.orelse, type_ignores=[]), False)
                continue  # a block for type checkers only: never runs
            visit(child, in_function or isinstance(child, (ast.FunctionDef,
                                                           ast.AsyncFunctionDef)))

    visit(tree, False)
    return found


def scan(root: Path = ROOT) -> list[tuple[str, int, bool, list[str], str]]:
    """(module, line, inside a function?, nbgrad modules imported, file) of every import."""
    rows = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, in_function in _imports(tree):
            targets = [t for t in _targets(node, module, path.name == "__init__.py", root)
                       if t == "nbgrad" or t.startswith("nbgrad.")]
            rows.append((module, node.lineno, in_function, targets,
                         str(path.relative_to(root.parent))))
    return rows


def _rank() -> dict[str, int]:
    return {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


# ------------------------------------------------------------------ (a) ops and tensor
def core_violations(root: Path = ROOT) -> list[str]:
    bad = []
    for module, line, _, targets, file in scan(root):
        for t in targets:
            if _unit(module) == "nbgrad.ops" and _unit(t) == "nbgrad.autograd":
                bad.append(f"{file}:{line}: nbgrad.ops imports {t}")
            if module == "nbgrad.tensor" and _unit(t) in ("nbgrad.ops", "nbgrad.autograd"):
                bad.append(f"{file}:{line}: nbgrad.tensor imports {t}")
    return bad


def test_ops_never_import_autograd_and_tensor_imports_neither():
    assert core_violations() == []


# ------------------------------------------------------------------ (b) layer order
def layer_violations(root: Path = ROOT) -> list[str]:
    rank = _rank()
    bad = []
    for module, line, in_function, targets, file in scan(root):
        unit = _unit(module)
        if unit not in rank:
            bad.append(f"{file}: unit {unit} is in no layer of LAYERS")
            continue
        if in_function:
            continue
        for t in targets:
            target = _unit(t)
            if target == unit:
                continue
            if target not in rank:
                bad.append(f"{file}:{line}: imports {t}, whose unit {target} is in no layer")
            elif rank[target] >= rank[unit]:
                bad.append(f"{file}:{line}: {unit} (layer {rank[unit]}) imports {t} "
                           f"(layer {rank[target]}) at module level")
    return sorted(set(bad))


def test_module_level_imports_follow_the_layers():
    assert layer_violations() == []


def test_layers_name_each_unit_once():
    units = [u for layer in LAYERS for u in layer]
    assert len(units) == len(set(units))


# ------------------------------------------------------------------ (c) lazy imports
def function_imports(root: Path = ROOT) -> dict[str, list[str]]:
    """The imports inside functions, per part of :data:`FUNCTION_IMPORT_BUDGET`."""
    inside = [f"{file}:{line}" for _, line, in_function, _, file in scan(root) if in_function]
    return {"outside nbgrad/jit": [s for s in inside if not s.startswith("nbgrad/jit/")],
            "whole package": inside}


def budget_violations(root: Path = ROOT) -> list[str]:
    found = function_imports(root)
    return [f"{part}: {len(found[part])} imports inside functions, over the budget of "
            f"{limit}:\n  " + "\n  ".join(found[part])
            for part, limit in FUNCTION_IMPORT_BUDGET.items() if len(found[part]) > limit]


def test_imports_inside_functions_stay_within_the_budget():
    assert budget_violations() == []


# ------------------------------------------------------------------ the hooks themselves
def test_autograd_installs_the_recorder_and_anomaly_mode_the_observer():
    from nbgrad.autograd import detect_anomaly, record
    from nbgrad.ops import dispatch

    assert dispatch._recorder is record.record
    assert dispatch._observer is None
    with detect_anomaly():
        assert dispatch._observer is not None
    assert dispatch._observer is None
