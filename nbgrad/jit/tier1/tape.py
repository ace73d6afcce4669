"""Tier-1 runtime: :class:`TapeExecutable` runs the encoded tape (native segments of the
precompiled interpreter, eager steps between them) and prints it."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...ops.registry import REGISTRY
from ..executable import Executable
from ..trace.ir import CUSTOM_KINDS, LOOP, Graph, LoopInfo, format_graph, node_args, type_str
from ..trace.loops import execute_loop_eager
from ..trace.pythonop_run import RunPlan, run_node, run_plan
from . import interpreter as I
from .operands import EagerStep, Instr, Loc
from .storage import _assign, place_outside
from .strips import strip_chains

if TYPE_CHECKING:
    from .lowering import Lowering

#: pools of at least this many bytes are made afresh rather than copied (:meth:`_new_pool`)
POOL_AFRESH_BYTES = 1 << 20


class TapeExecutable(Executable):
    """A lowered graph: native segments of the interpreter and eager steps."""

    tier = "interpret"

    def __init__(self, graph: Graph, dtype: np.dtype, lw: Lowering, in_locs: list,
                 out_locs: list) -> None:
        super().__init__(graph)
        self.dtype = np.dtype(dtype)
        self.lw = lw
        inputs_st = [loc.st for loc in in_locs if isinstance(loc, Loc)]
        outputs_st = [loc.st for loc in out_locs if isinstance(loc, Loc)]
        #: per input and output: its slot (an array outside the pool), or 0
        self.in_slots, self.out_slots = place_outside(lw.code, graph, in_locs, out_locs,
                                                      self.dtype)
        lw.code = strip_chains(lw.code, {id(st) for st in inputs_st + outputs_st})
        slots = sum(1 for s in self.in_slots + self.out_slots if s)
        #: the ``ext`` table of the interpreter: per slot (address, length)
        self.ext = np.zeros((slots + 1, 2), np.int64)
        for loc, slot in zip(in_locs + out_locs, self.in_slots + self.out_slots,
                             strict=True):
            if slot:
                self.ext[slot, 1] = loc.st.size
        self.size = _assign(lw.code, lw.storages, inputs_st, outputs_st)
        self._encode(lw.code)
        self.in_locs = in_locs
        self.out_locs = out_locs
        self.side_consts = {id(v): a for v, a in graph.consts.items() if id(v) in lw.side}
        self.template = self._fresh_pool()
        #: reuse one pool across calls (False: a fresh pool per call, freed after it; for
        #: loops run once while a graph is traced, so large pools do not stay resident)
        self.keep_pool = True
        self._pool: np.ndarray | None = None
        self._lock = threading.Lock()
        self.native_calls = sum(1 for s in self.steps if s[0] == "native")
        self._ready = self.native_calls == 0  # the interpreter is compiled (or unneeded)
        self.fell_back = False

    def _encode(self, code: list) -> None:
        rows = []
        fp: list[float] = [0.0, 0.0]
        ia: list[np.ndarray] = []
        ia_len = 0
        steps: list = []
        seg_start = 0
        for item in code:
            if isinstance(item, EagerStep):
                if len(rows) > seg_start:
                    steps.append(("native", seg_start, len(rows)))
                steps.append(("eager", item, run_plan(item.node)))
                seg_start = len(rows)
                continue
            row = np.zeros(I.WIDTH, np.int64)
            row[I.F_OP] = item.op
            for field, sfield, loc in ((I.F_O, I.F_SO, item.o), (I.F_A, I.F_SA, item.a),
                                       (I.F_B, I.F_SB, item.b), (I.F_C, I.F_SC, item.c)):
                if loc is not None:
                    row[field] = (loc.st.slot << I.SLOT_SHIFT) + loc.st.offset + loc.off
                    row[sfield] = loc.stride
            row[I.F_N], row[I.F_M], row[I.F_K] = item.n, item.m, item.k
            row[I.F_F], row[I.F_G], row[I.F_H] = item.f, item.g, item.h
            row[I.F_T] = item.strip
            if item.fp:
                row[I.F_P] = len(fp)
                fp.extend(item.fp)
                fp.extend([0.0] * max(0, 2 - len(item.fp)))
            elif len(item.ia):
                row[I.F_P] = ia_len
                arr = np.asarray(item.ia, np.int64)
                ia.append(arr)
                ia_len += arr.size
            item.pos = len(rows)
            rows.append(row)
        if len(rows) > seg_start:
            steps.append(("native", seg_start, len(rows)))
        for item in code:
            if isinstance(item, Instr) and item.target is not None:  # LOOP, STRIP, ENDs
                rows[item.pos][I.F_M] = item.target.pos
        self.ins = np.array(rows, np.int64).reshape(-1, I.WIDTH)
        self.fp = np.array(fp, np.float64)
        self.ia = np.concatenate(ia) if ia else np.zeros(1, np.int64)
        self.steps = steps
        self.code = code

    # -------------------------------------------------------------- running
    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self.keep_pool and self._lock.acquire(blocking=False):
            try:
                if self._pool is None:
                    self._pool = self._new_pool()
                return self._run(self._pool, arrays)
            finally:
                self._lock.release()
        return self._run(self._new_pool(), arrays)

    def _fresh_pool(self) -> np.ndarray:
        """A pool as a run starts from: zeros but for the constants."""
        pool = np.zeros(self.size, self.dtype)
        for st, arr in self.lw.consts:
            pool[st.offset:st.offset + arr.size] = arr  # storages hold >= 1
        return pool

    def _new_pool(self) -> np.ndarray:
        """A copy of :attr:`template` to run in. A large pool is made afresh instead:
        zeroed memory comes from the system untouched, and copying the template would
        write every page before the run does (W3's 192 MB pool: a quarter of a run)."""
        if self.template.nbytes >= POOL_AFRESH_BYTES:
            return self._fresh_pool()
        return self.template.copy()

    def native_ready(self) -> bool:
        """Whether the interpreter runs this tape without compiling first (see
        :func:`nbgrad.jit.tier1.interpreter.ready`)."""
        if not self._ready:
            self._ready = I.ready((self.ins, 0, 0, self.template, self.fp, self.ia,
                                   self.ext))
        return self._ready

    def _run(self, buf: np.ndarray, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        #: whether the last run used eager ops because the interpreter is not built yet
        self.fell_back = not self.native_ready()
        if self.fell_back:
            start = time.perf_counter()
            outs = Executable.run(self, arrays)
            I.FALLBACK_SPENT[0] += time.perf_counter() - start
            return outs
        side: dict[int, np.ndarray] = dict(self.side_consts)
        ext = self.ext.copy() if len(self.ext) > 1 else self.ext
        # per slot the array it stands for (kept alive while the tape runs)
        views: list[np.ndarray] = [buf] * len(ext)
        for loc, arr, slot in zip(self.in_locs, arrays, self.in_slots, strict=True):
            if slot:  # read in place (a contiguous copy of another layout or dtype)
                a = np.asarray(arr)
                if a.size != loc.st.size:
                    raise ValueError(f"nbgrad.jit: tier-1 input of {a.size} elements where "
                                     f"the tape expects {loc.st.size}")
                if a.dtype != self.dtype or not (a.flags.c_contiguous and a.flags.aligned):
                    a = np.ascontiguousarray(a, dtype=self.dtype)
                views[slot] = a.reshape(-1)
                ext[slot, 0] = a.ctypes.data
            elif isinstance(loc, Loc):
                o = loc.st.offset
                buf[o:o + arr.size] = np.asarray(arr).reshape(-1)
            else:
                side[id(loc[1])] = np.asarray(arr)
        for slot in self.out_slots:
            if slot:  # a fresh array per call: handed out, never written again
                views[slot] = np.empty(ext[slot, 1], self.dtype)
                ext[slot, 0] = views[slot].ctypes.data
        run = I.run_function()
        for step in self.steps:
            if step[0] == "native":
                run(self.ins, step[1], step[2], buf, self.fp, self.ia, ext)
            else:
                self._eager(step[1], views, side, step[2])
        outs = []
        for loc, v, slot in zip(self.out_locs, self.graph.outputs, self.out_slots,
                                strict=True):
            if slot:
                outs.append(views[slot].reshape(v.shape))
            elif isinstance(loc, Loc):
                o = loc.st.offset + loc.off
                outs.append(views[loc.st.slot][o:o + v.size].reshape(v.shape)
                            .astype(v.dtype))
            else:
                outs.append(np.array(side[id(v)], copy=True))
        return outs

    def _eager(self, step: EagerStep, views: list[np.ndarray], side: dict,
               plan: RunPlan | None) -> None:
        """Runs one node's kernel on copies of its operands (``views``: the pool, then
        the array of each slot)."""
        node = step.node
        vals = []
        for v, loc in zip(node.inputs, step.ins, strict=True):
            if v is None:
                vals.append(None)
            elif isinstance(loc, Loc):
                o = loc.st.offset + loc.off
                arr = views[loc.st.slot][o:o + v.size].reshape(v.shape)
                vals.append(arr.astype(v.dtype) if v.dtype != arr.dtype else arr.copy())
            else:
                vals.append(side[id(v)])
        if node.op == LOOP:
            outs = execute_loop_eager(LoopInfo.of(node), vals)
        elif node.op in CUSTOM_KINDS:  # custom Functions: Python code (pythonop.run_node)
            outs = run_node(node, vals, plan)
        else:
            op = REGISTRY[node.op]
            out = op.kernel_for("cpu")(*node_args(node, vals))
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for v, loc, arr in zip(node.outputs, step.outs, outs, strict=True):
            if isinstance(loc, Loc):
                o = loc.st.offset + loc.off
                views[loc.st.slot][o:o + v.size] = np.asarray(arr).reshape(-1)
            else:
                side[id(v)] = np.asarray(arr)

    # -------------------------------------------------------------- text
    def source(self) -> str:
        lines = [f"# tier-1 tape: {len(self.ins)} instructions, pool of {self.size} "
                 f"{self.dtype.name}, {len(self.ext) - 1} slot(s), "
                 f"{self.native_calls} native segment(s), "
                 f"{sum(1 for s in self.steps if s[0] == 'eager')} eager step(s)"]
        depth = 0
        for step in self.steps:
            if step[0] == "eager":
                node = step[1].node
                types = ", ".join(type_str(v) for v in node.inputs if v is not None)
                lines.append(f"  EAGER {node.op}({types})")
                continue
            lines.append(f"  -- native segment [{step[1]}, {step[2]})")
            for pc in range(step[1], step[2]):
                row = self.ins[pc]
                op = int(row[I.F_OP])
                name = I.OP_NAMES.get(op, str(op))
                if op in (I.OP_ENDLOOP, I.OP_ENDSTRIP):
                    depth -= 1
                pad = "  " * depth
                if op == I.OP_LOOP:
                    lines.append(f"  {pc:5d} {pad}LOOP x{row[I.F_N]} (to {row[I.F_M]})")
                    depth += 1
                    continue
                if op == I.OP_STRIP:
                    lines.append(f"  {pc:5d} {pad}STRIP {row[I.F_N]} by {row[I.F_K]} "
                                 f"(to {row[I.F_M]})")
                    depth += 1
                    continue
                if op in (I.OP_ENDLOOP, I.OP_ENDSTRIP):
                    lines.append(f"  {pc:5d} {pad}{I.OP_NAMES[op]}")
                    continue
                ops = []
                for label, f, s, bit in (("o", I.F_O, I.F_SO, I.T_O), ("a", I.F_A, I.F_SA, I.T_A),
                                         ("b", I.F_B, I.F_SB, I.T_B),
                                         ("c", I.F_C, I.F_SC, I.T_C)):
                    if row[f] or row[s] or label in ("o",):
                        at = int(row[f])  # a slot's operand: slot and offset
                        where = f"s{at >> I.SLOT_SHIFT}:{at & (I.SLOT - 1)}" if at >= I.SLOT \
                            else str(at)
                        ops.append(f"{label}=@{where}" + (f"+{row[s]}i" if row[s] else "")
                                   + ("+s" if row[I.F_T] & bit else ""))
                sub = ""
                if op == I.OP_UGEN:
                    sub = _name_of(I.UNARY_SUB, row[I.F_K])
                elif op == I.OP_BGEN:
                    sub = _name_of(I.BINARY_SUB, row[I.F_K])
                elif op == I.OP_TGEN:
                    sub = _name_of(I.TERNARY_SUB, row[I.F_K])
                sizes = f"n={row[I.F_N]} m={row[I.F_M]} k={row[I.F_K]} f={row[I.F_F]}"
                lines.append(f"  {pc:5d} {pad}{name}{'.' + sub if sub else ''} "
                             f"{' '.join(ops)} {sizes}")
        return "\n".join(lines)


def _name_of(table: dict, code: int) -> str:
    for k, v in table.items():
        if v == code:
            return k
    return str(code)


def describe(exe: TapeExecutable) -> str:
    return format_graph(exe.graph) + "\n" + exe.source()
