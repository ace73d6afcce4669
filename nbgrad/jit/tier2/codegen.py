"""Tier 2 of ``nbgrad.jit``: generated, fused Numba code for a whole graph.

:func:`compile_graph` turns a graph (forward, or forward and backward traced
together) into one ``@njit(cache=True)`` function in a generated module: fused
elementwise regions with their reductions (:mod:`nbgrad.jit.tier2.fusion`), loops as
native loops, small matrix products as loops and large ones through BLAS (see
:mod:`nbgrad.jit.tier2.emit`). The module is written to the cache folder through
:func:`nbgrad.codegen.load_module` (real files, so Numba's ``cache=True`` works;
Numba cannot cache code made by ``exec``), named after :func:`~nbgrad.jit.trace.ir.graph_hash`;
the folder is keyed by the nbgrad, Numba and Python versions. A second process that
builds the same graph therefore finds the module and Numba's compiled code on disk and
compiles nothing. A damaged module file is rewritten (one warning); a damaged or
unwritable Numba cache recompiles or runs uncached (one warning, see
:mod:`nbgrad.cache_guard`).

The entry function has exactly one signature (C-contiguous, writeable arrays of the
graph's dtypes and shapes; 0-d inputs as 0-d arrays); :meth:`CompiledGraph.run`
converts its arguments to it, so no call ever compiles a second specialisation.
"""

from __future__ import annotations

import re
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from ... import codegen as _files
from ...kernels import parallel
from ...kernels.elementwise import SCALAR_IMPORT
from ...ops.registry import REGISTRY
from ..executable import Executable
from ..local_names import unambiguous_locals
from ..tier1.lowering import build_tape
from ..trace.handles import as_handle
from ..trace.ir import CUSTOM_KINDS, LOOP, Graph, Node, format_graph, graph_hash, node_args
from ..trace.pythonop_run import fallback_callable
from .emit import FunctionEmitter, Tier2Unsupported
from .fusion import unstack_invariants
from .moves import native_digest
from .store import ALLOC, FILL, PERMUTE, UNICODE

__all__ = ["CompiledGraph", "FASTMATH", "Tier2Unsupported", "compile_graph", "generate"]

#: LLVM fast-math of generated code: none. Each flag changed results that eager mode
#: computes as written: ``arcp`` turned ``0 / 5e-324`` into ``0 * inf = nan``, ``nsz``
#: flipped ``atan2(-0.0, -1)``, ``contract`` (FMA) gave 1e308 where eager overflows to
#: inf, and ``reassoc`` rewrote ``(x / d) * w`` as ``(x * w) / d`` (inf / inf = nan).
#: Measured without them: W1 ``fori_loop`` about 1.13x the time, W3 and W4 unchanged.
FASTMATH: frozenset[str] | bool = False
_SUPPORTED_KINDS = "biuf"
_MAX_IR_LINES = 400
_LOCK = threading.Lock()

_HEADER = '''"""nbgrad.jit tier 2: generated code of one graph (do not edit; made from the graph).

Graph hash {ghash}. The graph (``compiled.graph(...)`` prints the same numbering):

{graph}
"""
import math

import numpy as np
from numba import njit, objmode, prange

from nbgrad.jit.tier2.alloc import empty as {alloc}, fill as {fill}
from nbgrad.jit.tier2.alloc import permuted as {permute}, unicode as {unicode}
{scalar_import}

#: eager kernels of ops run through objmode, filled in when the module is loaded
FALLBACK = {{}}


def _fallback(key, *args):
    return FALLBACK[key](*args)

'''


def number_vars(graph: Graph) -> dict[int, int]:
    """``id(var) -> n`` as :func:`~nbgrad.jit.trace.ir.format_graph` numbers them (``%n``)."""
    numbers: dict[int, int] = {}

    def nm(v) -> None:
        if v is not None and id(v) not in numbers:
            numbers[id(v)] = len(numbers)

    def walk(g: Graph) -> None:
        for v in g.inputs:
            nm(v)
        for v in g.consts:
            nm(v)
        for node in g.nodes:
            for v in node.inputs:
                nm(v)
            for v in node.outputs:
                nm(v)
            if node.op == LOOP:
                walk(node.attrs["body"])
        for v in g.outputs:
            nm(v)

    walk(graph)
    return numbers


def _check_types(graph: Graph) -> None:
    def vars_of(g: Graph):
        yield from g.inputs
        yield from g.consts
        for node in g.nodes:
            yield from (v for v in node.inputs if v is not None)
            yield from node.outputs
            if node.op == LOOP:
                yield from vars_of(node.attrs["body"])

    for v in vars_of(graph):
        if v.dtype.kind not in _SUPPORTED_KINDS:
            raise Tier2Unsupported(f"tier 2 does not support dtype {v.dtype} "
                                   f"(a value of type {v.dtype}{list(v.shape)})")


class Generated:
    """The generated module text of a graph and what running it needs."""

    def __init__(self, graph: Graph, source: str, entry: str,
                 const_args: list[np.ndarray], fallbacks: list[tuple[int, Node]],
                 ghash: str, stats: dict[str, Any]) -> None:
        self.graph = graph
        self.source = source
        self.entry = entry
        self.const_args = const_args
        self.fallbacks = fallbacks
        #: (global name, @njit function) bound in the module before it compiles
        self.natives: list[tuple[str, Any]] = []
        #: the entry whose block loops run in parallel (``prange``), if any
        self.par_entry: str | None = None
        #: (shape, dtype) of the scratch buffers the caller passes last and keeps
        self.scratch: list[tuple[tuple[int, ...], np.dtype]] = []
        self.hash = ghash
        self.stats = stats


def generate(graph: Graph, fastmath: frozenset[str] | bool = FASTMATH) -> Generated:
    """The generated module source of ``graph`` (nothing is compiled or written)."""
    _check_types(graph)
    ghash = graph_hash(graph)
    numbers = number_vars(graph)  # the numbering of the graph as traced and printed
    ir_lines = format_graph(graph).splitlines()
    em = FunctionEmitter(unstack_invariants(graph), numbers)
    entry = "run_graph"
    params, body = em.emit_entry(entry)
    fm = fastmath if isinstance(fastmath, bool) else "{" + ", ".join(
        repr(f) for f in sorted(fastmath)) + "}"
    if len(ir_lines) > _MAX_IR_LINES:
        ir_lines = ir_lines[:_MAX_IR_LINES] + [f"... ({len(ir_lines) - _MAX_IR_LINES} more "
                                               "lines)"]
    doc = "\n".join(ir_lines).replace("\\", "\\\\").replace('"""', "'''")
    doc = re.sub(r" at 0x[0-9a-fA-F]+", "", doc)  # addresses differ between processes
    text = _HEADER.format(ghash=ghash, graph=doc, scalar_import=SCALAR_IMPORT, alloc=ALLOC,
                          fill=FILL, permute=PERMUTE, unicode=UNICODE)
    if em.natives:  # the digest: the text (so the module and its cache) follows their code
        text += "# native functions of opaque ops, bound when the module is loaded:\n"
        text += "".join(f"#   {key} = {_qualified(fn)}  (source {native_digest(fn)})\n"
                        for key, fn in em.natives)
    text += "".join(line + "\n" for line in em.globals_lines)
    # objmode blocks take the GIL: Numba warns about nogil=True with them
    nogil = "" if em.fallbacks else "nogil=True, "
    function = unambiguous_locals(f"def {entry}({', '.join(params)}):\n" + "\n".join(body)
                                  + "\n")
    text += f"\n@njit(cache=True, {nogil}error_model=\"numpy\", fastmath={fm})\n" + function
    par_entry = None
    if em.blocked and not em.fallbacks:  # the same code, its block loops on Numba's threads
        par_entry = entry + "_parallel"
        text += (f"\n\n@njit(cache=True, nogil=True, error_model=\"numpy\", fastmath={fm}, "
                 f"parallel={parallel.OPTIONS!r})\n")
        text += function.replace(f"def {entry}(", f"def {par_entry}(", 1)
    stats = {"regions": em.regions, "fused_nodes": em.fused_nodes, "blocked": em.blocked,
             "fallbacks": [n.op for _, n in em.fallbacks],
             "nodes": sum(1 for _ in graph.walk())}
    gen = Generated(graph, text, entry, [a for _, a in em.const_args],
                    em.fallbacks, ghash, stats)
    gen.natives = list(em.natives)
    gen.par_entry = par_entry
    gen.scratch = list(em.scratch)
    return gen


def _qualified(fn) -> str:
    py = getattr(fn, "py_func", fn)
    return f"{getattr(py, '__module__', '?')}.{getattr(py, '__qualname__', '?')}"


def _fallback_callable(node: Node):
    """A Python function running ``node``'s eager CPU kernel on arrays (for objmode)."""
    if node.op in CUSTOM_KINDS:  # a custom Function's Python code (PythonOp, PythonOpGrad)
        return fallback_callable(node)
    kernel = REGISTRY[node.op].kernel_for("cpu")
    ins = [(v.shape, v.dtype) if v is not None else None for v in node.inputs]
    outs = [(v.shape, v.dtype) for v in node.outputs]

    def call(*args):
        it = iter(args)
        values = [None if spec is None else
                  np.asarray(next(it), dtype=spec[1]).reshape(spec[0]) for spec in ins]
        with np.errstate(all="ignore"):
            result = kernel(*node_args(node, values))
        results = result if isinstance(result, (tuple, list)) else (result,)
        return tuple(np.array(r, dtype=dt, order="C", copy=True).reshape(s if s else (1,))
                     for r, (s, dt) in zip(results, outs, strict=True))

    call.__name__ = f"fallback_{node.op}"
    return call


class CompiledGraph(Executable):
    """A graph compiled by tier 2: ``run(arrays) -> arrays`` is one native call.

    ``source()`` is the generated module text; ``stats`` says how many fused regions
    it has, which ops went through the eager-kernel fallback, the compile time and
    whether Numba's disk cache was hit.
    """

    tier = "compile"
    native_calls = 1

    def __init__(self, gen: Generated, module, fastmath) -> None:
        super().__init__(gen.graph)
        self.generated = gen
        self.module = module
        self.serial_entry = getattr(module, gen.entry)
        #: the entry calls run: the parallel one where the graph has blocked loops and
        #: Numba may use several threads (its results equal the serial entry's)
        self.entry = self.serial_entry
        if gen.par_entry and parallel.pool_size() > 1:
            self.entry = getattr(module, gen.par_entry)
        self.const_args = gen.const_args
        self.scratch_specs = gen.scratch
        #: the scratch buffers, made on first use; a call that finds them in use (another
        #: thread, or a call back into this graph) allocates its own
        self._scratch: list[np.ndarray] | None = None
        self._scratch_lock = threading.Lock()
        self.in_specs = [(v.shape, v.dtype) for v in gen.graph.inputs]
        self.scalar_out = [v.shape == () for v in gen.graph.outputs]
        #: positions of the 0-d outputs (the entry returns them as 1-element arrays)
        self._scalar_pos = [k for k, s in enumerate(self.scalar_out) if s]
        self.stats = dict(gen.stats)
        self.fastmath = fastmath
        self._compiled = False

    # -------------------------------------------------------------- compile
    def signature(self) -> tuple:
        types = [numba.typeof(np.empty(shape, dtype)) for shape, dtype in self.in_specs]
        types += [numba.typeof(np.ascontiguousarray(a)) for a in self.const_args]
        types += [numba.typeof(np.empty(shape, dtype)) for shape, dtype in self.scratch_specs]
        return tuple(types)

    def compile(self) -> CompiledGraph:
        """Compile (or load from Numba's disk cache) the one signature; idempotent."""
        if self._compiled:
            return self
        sig = self.signature()
        t0 = time.perf_counter()
        loaded = True
        with _LOCK:
            if not self._compiled:
                # the module (and its dispatcher) is shared by every CompiledGraph of the
                # same graph in this process: compile its one signature once
                loaded = tuple(sig) in self.entry.overloads
                if not loaded:
                    self.entry.compile(sig)
                self.entry.disable_compile()
                self._compiled = True
        self.stats["compile_s"] = time.perf_counter() - t0
        st = self.entry.stats
        # "cache_hit": nothing was compiled (found on disk, or already in this process)
        self.stats["cache_hit"] = loaded or (bool(sum(st.cache_hits.values()))
                                             and not sum(st.cache_misses.values()))
        return self

    def _serial(self):
        """The serial entry, compiled on first use (where Numba's threads cannot run)."""
        with _LOCK:
            if not self.serial_entry.overloads:
                self.serial_entry.compile(self.signature())
                self.serial_entry.disable_compile()
        return self.serial_entry

    # -------------------------------------------------------------- run
    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if not self._compiled:
            self.compile()
        specs = self.in_specs
        if len(arrays) != len(specs):
            raise TypeError(f"compiled graph: expected {len(specs)} inputs, got "
                            f"{len(arrays)}")
        args = list(arrays)
        for k, (shape, dtype) in enumerate(specs):
            a = args[k]
            # the common case in one test (flags.carray: C-contiguous, aligned, writeable)
            if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype or \
                    not a.flags.carray:
                args[k] = _prepare(k, a, shape, dtype)
        entry = self.entry
        if entry is not self.serial_entry and not parallel.numba_pool_usable():
            entry = self._serial()
        if not self.scratch_specs:
            outs = entry(*args, *self.const_args)
        elif self._scratch_lock.acquire(blocking=False):
            try:
                if self._scratch is None:
                    self._scratch = [np.empty(s, d) for s, d in self.scratch_specs]
                outs = entry(*args, *self.const_args, *self._scratch)
            finally:
                self._scratch_lock.release()
        else:
            outs = entry(*args, *self.const_args,
                         *[np.empty(s, d) for s, d in self.scratch_specs])
        outs = list(outs)
        for k in self._scalar_pos:
            outs[k] = outs[k].reshape(())
        return outs

    def source(self) -> str:
        return self.generated.source

    @property
    def path(self) -> str | None:
        return getattr(self.module, "__file__", None)


def _prepare(k: int, a, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Input ``k`` as the C-contiguous, writeable array of ``shape`` and ``dtype`` that the
    entry's signature takes (a copy where it is not one); ValueError for another shape.
    A PythonOp's context given as itself (a backward that no gradient of it flows
    through has no PythonOpGrad to read it) becomes a handle array."""
    if type(a) is not np.ndarray:
        a = np.asarray(as_handle(a))
    if a.shape != shape:
        raise ValueError(f"compiled graph: input {k} has shape {a.shape}, the graph "
                         f"was built for {shape}")
    if a.dtype != dtype or not a.flags.carray:
        a = np.array(a, dtype=dtype, order="C", copy=True)
    return a


_REFUSED_WARNED: set[str] = set()


def compile_graph(graph: Graph, *, fastmath: frozenset[str] | bool = FASTMATH,
                  lazy: bool = False, strict: bool = False) -> Executable:
    """Generate, write, load and compile ``graph`` (see the module docstring).

    A graph tier 2 cannot run (:class:`Tier2Unsupported`: a dtype it does not handle,
    or an unrolled trace too large to compile quickly) stays in tier 1: the tier-1
    executable is returned, with one warning per reason, or, with ``strict=True``,
    the exception is raised. ``lazy=True`` defers the Numba compile to the first
    ``run`` (or :meth:`CompiledGraph.compile`).
    """
    try:
        gen = generate(graph, fastmath)
    except Tier2Unsupported as exc:
        if strict:
            raise
        reason = str(exc)
        if reason not in _REFUSED_WARNED:
            _REFUSED_WARNED.add(reason)
            warnings.warn(f"nbgrad.jit: tier 2 does not compile this graph ({reason}); it "
                          "runs in tier 1 (the tape interpreter)", RuntimeWarning, stacklevel=3)
        exe = build_tape(graph)
        exe.tier2_refused = reason
        return exe
    module = _files.load_module(f"jit_{gen.hash}", gen.source)
    for key, fn in gen.natives:  # before Numba compiles: it resolves globals then
        setattr(module, key, fn)
    for key, node in gen.fallbacks:
        module.FALLBACK[key] = _fallback_callable(node)
    compiled = CompiledGraph(gen, module, fastmath)
    if not lazy:
        compiled.compile()
    return compiled


def generated_before(graph: Graph) -> bool:
    """Whether the cache folder holds a module :func:`compile_graph` wrote for ``graph``
    (a hint that Numba's disk cache has its code: promoting it then costs little)."""
    try:
        return any(_files.cache_dir().glob(f"jit_{graph_hash(graph)}_*.py"))
    except (OSError, TypeError, ValueError):  # an unhashable attribute, an unreadable folder
        return False
