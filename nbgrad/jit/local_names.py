"""Local names in generated functions that Numba's bytecode frontend cannot confuse.

Numba names the temporary a ``LOAD_FAST`` pushes ``"$" + name + offset`` (the
instruction's offset, :meth:`numba.core.byteflow.State.make_temp`), so two locals of which
one is the other plus digits can meet: ``v14`` loaded at offset 18166 and ``v141`` at 8166
both pushed ``$v1418166.8``. Generated code numbers its values (``v14``, ``v141``,
``acc7``, ``x68_1``), and a large function has offsets of five digits. In the graph that
found it (fuzz seeds 680036-680041) the merged temporary failed typing
(``Undecided type``).

:func:`unambiguous_locals` appends ``_`` to every local name that ends in a digit. A
name and an offset then split at the name's last character, so no two loads share a
temporary. :func:`digit_extended_locals` is the quick check of that rule (the fuzzer
runs it on every function it compiles); :func:`shared_temporaries` asks Numba's own flow
analysis.
"""

from __future__ import annotations

import ast
import types

from numba.core.bytecode import ByteCode, FunctionIdentity
from numba.core.byteflow import Flow


def unambiguous_locals(source: str) -> str:
    """``source`` (a module or a fragment of top-level functions) with every parameter
    and assigned local of its functions that ends in a digit renamed to end in ``_``
    (``v141`` to ``v141_``; a name already taken gets another ``_``). Keywords of
    ``objmode(...)``, which name locals, are renamed with them."""
    tree = ast.parse(source)
    edits: list[tuple[int, int, int, str]] = []  # (line, start, end, new name)
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            edits += _function_edits(fn)
    if not edits:
        return source
    lines = source.split("\n")
    for line, start, end, new in sorted(edits, reverse=True):
        raw = lines[line - 1].encode()  # ast's columns count UTF-8 bytes
        lines[line - 1] = (raw[:start] + new.encode() + raw[end:]).decode()
    return "\n".join(lines)


def _function_edits(fn: ast.FunctionDef) -> list[tuple[int, int, int, str]]:
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    names: list[ast.Name] = []
    keywords: list[ast.keyword] = []  # of objmode(...) calls
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            names.append(node)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "objmode":
            keywords += node.keywords
    local = {a.arg for a in args} | {n.id for n in names if not isinstance(n.ctx, ast.Load)}
    taken = local | {n.id for n in names}
    rename: dict[str, str] = {}
    for name in sorted(local):
        if name[-1].isdigit():
            new = name + "_"
            while new in taken:
                new += "_"
            taken.add(new)
            rename[name] = new
    edits = [(n.lineno, n.col_offset, n.end_col_offset, rename[n.id])
             for n in names if n.id in rename]
    edits += [(a.lineno, a.col_offset, a.col_offset + len(a.arg), rename[a.arg])
              for a in [*args, *keywords] if a.arg in rename]
    return edits


def function_codes(source: str) -> list[types.CodeType]:
    """The code objects of the top-level functions of ``source`` (compiled, not run)."""
    return [c for c in compile(source, "<generated>", "exec").co_consts
            if isinstance(c, types.CodeType)]


def digit_extended_locals(source: str) -> list[tuple[str, str]]:
    """Pairs of locals of one function of ``source`` of which the second is the first plus
    digits (``("v14", "v141")``): the loads that may share a temporary. A quick check
    (no Numba): empty wherever :func:`unambiguous_locals` named the locals."""
    pairs = []
    for code in function_codes(source):
        names = set(code.co_varnames)
        for name in sorted(names):
            k = len(name)
            while k > 1 and name[k - 1].isdigit():
                k -= 1
                if name[:k] in names:
                    pairs.append((name[:k], name))
    return pairs


def shared_temporaries(source: str) -> dict[str, set[str]]:
    """The temporaries Numba's bytecode frontend would give loads of two different locals
    in the top-level functions of ``source`` (``{temporary: locals}``; empty where every
    load has its own). Runs Numba's own flow analysis, so it names what Numba names."""
    found: dict[str, set[str]] = {}
    for code in function_codes(source):
        bc = ByteCode(FunctionIdentity.from_function(types.FunctionType(code, {})))
        flow = Flow(bc)
        flow.run()
        loads: dict[str, set[str]] = {}
        for info in flow.block_infos.values():
            for offset, kwargs in info.insts:
                inst = bc[offset]
                if inst.opname == "LOAD_FAST_LOAD_FAST":  # Python 3.13: two in one
                    pairs = [("res1", inst.arg >> 4), ("res2", inst.arg & 15)]
                elif inst.opname == "STORE_FAST_LOAD_FAST":
                    pairs = [("load_res", inst.arg & 15)]
                elif inst.opname.startswith("LOAD_FAST"):
                    pairs = [("res", inst.arg)]
                else:
                    continue
                for key, arg in pairs:
                    loads.setdefault(kwargs[key], set()).add(bc.co_varnames[arg])
        found.update({t: names for t, names in loads.items() if len(names) > 1})
    return found
