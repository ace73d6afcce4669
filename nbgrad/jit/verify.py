"""Verified promotion: generated code's first result is checked against tier 1.

Before a graph runs on generated code (tier 2, or the fused kernels of a CUDA graph)
in the user's process, its first run is compared with the tier-1 interpreter on the
same inputs, synchronously, before the result is returned: :func:`checked` wraps the
new executable in a :class:`Checked` that does this once. Every output (values,
gradients, residuals) must agree: integer and bool outputs exactly, NaN and infinity at
the same positions, other floats to ``|a - b| <= rtol * max(|a|, |b|, scale)`` where
``scale`` is the largest finite magnitude of the tier-1 output or of the graph's float
inputs (rounding noise of a cancellation scales with the values that cancel; see
:func:`compare`; ``rtol`` in :data:`RTOL`). The inputs must be left unchanged and no
output may share memory with an input.

On a mismatch the call returns tier 1's result, the owner
(a :class:`~nbgrad.jit.program.Program`) keeps the graph in tier 1 for good, one
:class:`PromotionMismatchWarning` names the function and the first differing output,
and a reproducer (graph, inputs, ``replay.py``) is
written under the cache folder (:func:`write_reproducer`, :func:`replay`).

Exempt: graphs with PythonOp nodes (custom Functions whose Python code runs at every
call). Checking them would run the user's Python forward and backward twice, so side
effects (counters, logging, I/O) would happen twice and random or stateful Python code
would differ from itself. Random table ops (``dropout``) are checked: the generators in
node attributes and :mod:`nbgrad.random`'s generator are rewound between the two runs.

The switch: :func:`set_enabled` (``nbgrad.jit.set_promotion_check``), default on
unless the environment has ``NBGRAD_PROMOTION_CHECK=0``. The test suite turns it off,
so that a wrong tier-2 result fails the test that meets it.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import random as nb_random
from ..backends import is_cuda_array, to_device, to_host
from ..codegen import cache_dir
from . import timing
from .tier1.lowering import build_tape
from .tier2 import codegen
from .trace.function_trace import expand
from .trace.handles import has_python_ops, owning
from .trace.ir import Graph, format_graph, graph_hash

_ENABLED = os.environ.get("NBGRAD_PROMOTION_CHECK", "1").strip() != "0"

#: relative tolerance of the check by dtype (float64: 1e-12; others by their precision)
RTOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5,
        np.dtype(np.float16): 1e-2}
#: the tier of a program whose generated code disagreed with tier 1 (kept in tier 1)
TIER1_MISMATCH = "interpret (generated code differs)"
#: what one check cost, newest last (for measurements; bounded)
TIMINGS: list[dict[str, Any]] = []


class PromotionMismatchWarning(RuntimeWarning):
    """Generated code gave a different result from the tier-1 interpreter."""


def enabled() -> bool:
    """Whether a promotion's first result is checked against tier 1."""
    return _ENABLED


def set_enabled(flag: bool) -> bool:
    """Turn the promotion check on or off; returns the previous setting."""
    global _ENABLED
    previous, _ENABLED = _ENABLED, bool(flag)
    return previous


# ------------------------------------------------------------------ comparison
@dataclass
class Mismatch:
    """The first output (or input) where the two runs disagree."""

    output: int
    count: int
    what: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    index: tuple = ()

    def describe(self) -> str:
        text = f"output {self.output} (of {self.count}): {self.what}"
        if self.max_abs or self.max_rel:
            text += (f"; max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g} "
                     f"at index {self.index}")
        return text


def compare(expected: Sequence, got: Sequence, inputs: Sequence = (),
            reduced: Sequence[int] = ()) -> Mismatch | None:
    """The first output of ``got`` that differs from ``expected`` (tier 1), or None.

    ``inputs`` (the graph's inputs) set a floor under each output's scale: an output
    that is rounding noise (a gradient that is zero in exact arithmetic, a sum that
    cancels) differs between two correct programs by about the rounding of the values
    that cancelled, whose size the inputs give. ``reduced[k]`` is the most terms summed
    into one value on output ``k``'s way (:func:`reduction_lengths`): the rounding of a
    sum of ``R`` terms taken in another order (a GPU's tree, threads' chunks) grows with
    ``sqrt(R)`` and with its partial sums, up to ``R`` times the terms' size. So that
    output's ``rtol`` and its floor are both ``sqrt(R)`` times wider: a term of the
    inputs' size missing from a sum is still found.
    """
    n = len(expected)
    if len(got) != n:
        return Mismatch(0, n, f"{len(got)} outputs instead of {n}")
    floor = input_scale(inputs)
    for k, (a, b) in enumerate(zip(expected, got, strict=True)):
        a, b = np.asarray(to_host(a)), np.asarray(to_host(b))
        widen = max(1.0, float(reduced[k]) if k < len(reduced) else 1.0) ** 0.5
        bad = _compare_one(a, b, floor * widen, widen)
        if bad is not None:
            bad.output, bad.count = k, n
            return bad
    return None


def input_scale(inputs: Sequence) -> float:
    """The largest finite magnitude among the floating-point ``inputs`` (0 if none)."""
    scale = 0.0
    for x in inputs:
        x = np.asarray(to_host(x))
        if x.dtype.kind == "f" and x.size:
            with np.errstate(all="ignore"):
                top, low = x.max(), x.min()  # (two passes, no temporary)
                if np.isfinite(top) and np.isfinite(low):
                    scale = max(scale, float(top), -float(low))
                    continue
                mag = np.abs(x)
                top = mag.max()
                if not np.isfinite(top):
                    mag = mag[np.isfinite(mag)]
                    top = mag.max() if mag.size else 0.0
            scale = max(scale, float(top))
    return scale


def reduction_lengths(graph: Graph) -> list[int]:
    """For each output of ``graph``, the most elements that one node on its way combines
    into one element: a node's largest input size over its output size, the largest
    along the path (1 for an output that no reduction or product feeds)."""
    most: dict[int, int] = {}
    for node in graph.nodes:
        ins = [v for v in node.inputs if v is not None]
        ratio = 1
        if ins and node.outputs:
            ratio = max(v.size for v in ins) // max(1, min(o.size for o in node.outputs))
        if node.is_loop:
            ratio = max([ratio, *reduction_lengths(node.attrs["body"])])
        here = max([ratio, *(most.get(id(v), 1) for v in ins)])
        for o in node.outputs:
            most[id(o)] = here
    return [most.get(id(v), 1) for v in graph.outputs]


def _compare_one(a: np.ndarray, b: np.ndarray, floor: float = 0.0,
                 widen: float = 1.0) -> Mismatch | None:
    if a.shape != b.shape or a.dtype != b.dtype:
        return Mismatch(0, 0, f"{b.dtype}{list(b.shape)} instead of {a.dtype}{list(a.shape)}")
    if a.dtype.kind not in "fc":
        diff = a != b
        if diff.any():
            idx = _first(diff)
            return Mismatch(0, 0, f"{int(diff.sum())} of {a.size} values differ "
                            f"(expected {a[idx]!r}, got {b[idx]!r})", index=idx)
        return None
    if a.size == 0:
        return None
    rtol = RTOL.get(a.dtype, 1e-12) * widen
    tiny = np.finfo(a.dtype).tiny
    shape, a, b = a.shape, a.reshape(-1), b.reshape(-1)
    if a.dtype.kind == "f" and _within(a, b, floor, rtol, tiny):
        return None
    with np.errstate(all="ignore"):
        mag_a, mag_b = np.abs(a), np.abs(b)
        finite = np.isfinite(mag_a)
        scale = mag_a.max() if finite.all() else (mag_a[finite].max() if finite.any() else 0)
        scale = max(float(scale), floor)
        bound = np.maximum(mag_a, mag_b)
        np.maximum(bound, scale, out=bound)
        bound *= rtol
        bound += tiny
        err = np.abs(a - b)
        # NaN and infinite operands (a NaN error or an infinite bound) are looked at below
        over = ~(err <= bound) | np.isinf(bound)
        if not over.any():
            return None
        ia, ib = a[over], b[over]
        same = (np.isnan(ia) & np.isnan(ib)) | (np.isinf(ia) & (ia == ib))
        if same.all():
            return None
        over[over] = ~same
        k = int(np.argmax(over))
        x, y = a[k], b[k]
        if np.isnan(x) or np.isnan(y):
            what = "NaN at other positions"
        elif np.isinf(x) or np.isinf(y):
            what = "infinities differ"
        else:
            what = f"{int(over.sum())} of {a.size} values differ beyond rtol {rtol:g}"
        fin = over & np.isfinite(err)
        rel = err[fin] / np.maximum(np.maximum(mag_a[fin], mag_b[fin]), tiny)
        return Mismatch(0, 0, f"{what} (expected {x!r}, got {y!r})",
                        float(err[fin].max()) if fin.any() else float("inf"),
                        float(rel.max()) if fin.any() else float("inf"),
                        tuple(int(i) for i in np.unravel_index(k, shape)))


#: elements per block of :func:`_within` (a buffer of 8 MB at most, reused)
WITHIN_BLOCK = 1 << 20


def _within(a: np.ndarray, b: np.ndarray, floor: float, rtol: float, tiny) -> bool:
    """The common case of :func:`_compare_one` in three passes: ``a`` is finite and every
    ``|a - b|`` is within the smallest bound the full test allows (its scale times
    ``rtol``, rounded as it does), so that test would find no difference. False: run it.
    The differences are taken block by block in one buffer of :data:`WITHIN_BLOCK`
    elements, reused: no temporary the size of ``a`` (fresh pages cost more than the
    arithmetic)."""
    with np.errstate(all="ignore"):
        top, low = a.max(), a.min()
        if not (np.isfinite(top) and np.isfinite(low)):
            return False
        bound = np.array(max(float(top), -float(low), floor), a.dtype)
        bound *= rtol
        bound += tiny
        buf = np.empty(min(a.size, WITHIN_BLOCK), a.dtype)
        for start in range(0, a.size, WITHIN_BLOCK):
            err = buf[:min(WITHIN_BLOCK, a.size - start)]
            np.subtract(a[start:start + WITHIN_BLOCK], b[start:start + WITHIN_BLOCK], out=err)
            np.abs(err, out=err)
            if not err.max() <= bound:  # (also for a NaN in b)
                return False
        return True


def same_bits(a: np.ndarray, saved: np.ndarray) -> bool:
    """Whether ``a`` holds exactly the bits of ``saved`` (its copy from before a run): the
    sign of a zero and a NaN's payload count too. One pass, comparing words (a tenth of
    the time of ``np.array_equal(..., equal_nan=True)`` on a large float array)."""
    if a.shape != saved.shape or a.dtype != saved.dtype:
        return False
    a, saved = np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(saved).reshape(-1)
    size = a.dtype.itemsize
    word = f"u{size}" if size in (1, 2, 4, 8) else "u8" if size % 8 == 0 else "u1"
    return np.array_equal(a.view(word), saved.view(word))


def _first(mask: np.ndarray) -> tuple:
    """The index of the first True of ``mask``."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


# ------------------------------------------------------------------ random generators
def _generators(graph: Graph) -> list[np.random.Generator]:
    """The NumPy generators a run of ``graph`` may draw from."""
    gens = {id(nb_random._GENERATOR): nb_random._GENERATOR}
    for node in graph.walk():
        for value in node.attrs.values():
            if isinstance(value, np.random.Generator):
                gens[id(value)] = value
    return list(gens.values())


def _states(gens: list[np.random.Generator]) -> list[dict]:
    return [g.bit_generator.state for g in gens]


def _set_states(gens: list[np.random.Generator], states: list[dict]) -> None:
    for g, s in zip(gens, states, strict=True):
        g.bit_generator.state = s


# ------------------------------------------------------------------ the checked executable
def _copy(a):
    return a.copy() if is_cuda_array(a) else np.array(a, copy=True)


def _shares(out, arrays: Sequence) -> bool:
    if is_cuda_array(out):
        return any(out is a for a in arrays)
    return any(isinstance(a, np.ndarray) and np.may_share_memory(out, a) for a in arrays)


class OnHost:
    """Tier 1 for a graph of CUDA tensors: the tape runs on host copies, and each output
    goes back to where the generated code put it (device or host)."""

    tier = "interpret"
    native_calls = 1

    def __init__(self, tape, on_device: Sequence[bool]) -> None:
        self.inner = tape
        self.graph = tape.graph
        self.on_device = list(on_device)

    def run(self, arrays: Sequence) -> list:
        from .cuda.fusion import cuda_device  # optional: needs a CUDA runtime
        outs = self.inner.run([to_host(a) for a in arrays])
        # (a PythonOp context that is its own handle stays where it is)
        return [to_device(o, cuda_device()) if dev and isinstance(o, np.ndarray) else o
                for o, dev in zip(outs, self.on_device, strict=True)]

    def source(self) -> str:
        return "# tier 1 on host copies (the CUDA code differed)\n" + self.inner.source()


class Checked:
    """Generated code whose first run is checked against tier 1 (see the module doc).

    ``name`` says whose graph it is (for the warning); ``listener(checked, ok)`` is
    told the verdict once (a :class:`~nbgrad.jit.program.Program` swaps executables on
    it). After the verdict, ``run`` goes to the generated code (ok) or to tier 1 (mismatch).
    """

    def __init__(self, candidate, name: str = "a jitted function") -> None:
        self.candidate = candidate
        self.graph = candidate.graph
        self.name = name
        self.listener: Callable[[Checked, bool], None] | None = None
        self.verdict: bool | None = None
        #: the tier-1 executable the check runs (made on first need unless the owner set
        #: one: a tape that ran before, its pool warm) and that runs after a mismatch
        self.fallback = None
        #: seconds the check's tier-1 run took (Numba's compiler time left out), once run
        self.tier1_seconds: float | None = None
        self.reproducer: Path | None = None
        self._lock = threading.Lock()

    @property
    def tier(self) -> str:
        return (self.candidate or self.fallback).tier

    def reference(self):
        """The tier-1 executable of the graph (made on first need)."""
        if self.fallback is None:
            self.fallback = _tier1(self.graph)
        return self.fallback

    def run(self, arrays: Sequence) -> list:
        if self.verdict is None:
            if not _ENABLED:  # switched off after this was built: unchecked
                return self.candidate.run(arrays)
            with self._lock:  # one call checks; calls in other threads wait for it
                if self.verdict is None:
                    return self._check(arrays)
        return (self.candidate if self.verdict else self.fallback).run(arrays)

    def _check(self, arrays: Sequence) -> list:
        t0 = time.perf_counter()
        saved = [_copy(a) for a in arrays]
        gens = _generators(self.graph)
        before = _states(gens)
        try:
            got = self.candidate.run(arrays)
        except Exception as exc:  # noqa: BLE001 - tier 1 decides whether the inputs are bad
            got, failed = None, exc
        t1 = time.perf_counter()
        after = _states(gens)
        _set_states(gens, before)
        tape = self.reference()
        # its errors are the user's
        expected, self.tier1_seconds = timing.timed(tape.run, [to_host(a) for a in saved])
        t2 = time.perf_counter()
        if got is None:
            bad = Mismatch(0, len(expected), f"the generated code raised "
                           f"{type(failed).__name__}: {failed}")
            on_device = [True] * len(expected)
        else:
            on_device = [is_cuda_array(o) for o in got]
            _set_states(gens, after)
            bad = compare(expected, got, saved, reduction_lengths(self.graph))
        if bad is None:
            for k, (a, s) in enumerate(zip(arrays, saved, strict=True)):
                if not same_bits(np.asarray(to_host(a)), np.asarray(to_host(s))):
                    bad = Mismatch(0, len(got), f"the generated code modified input {k}")
                    break
        if bad is None:
            for k, o in enumerate(got):
                if _shares(o, arrays):
                    bad = Mismatch(k, len(got), "the output shares memory with an input")
                    break
        TIMINGS.append({"name": self.name, "generated_s": t1 - t0, "tier1_s": t2 - t1,
                        "compare_s": time.perf_counter() - t2, "ok": bad is None})
        del TIMINGS[:-100]
        if self.tier == "cuda":
            self.fallback = OnHost(tape, on_device)
            expected = [_back(e, dev) for e, dev in zip(expected, on_device, strict=True)]
        if bad is None:
            self._decide(True)
            return got
        try:
            self.reproducer = write_reproducer(self.graph, saved, bad, self.name, self.tier)
            where = f"Reproducer: {self.reproducer} (python {self.reproducer / 'replay.py'})"
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
            where = f"No reproducer could be written ({type(exc).__name__}: {exc})"
        warnings.warn(f"nbgrad.jit: the generated code ({self.tier}) of {self.name} gives a "
                      f"different result from the tier-1 interpreter on its first run: "
                      f"{bad.describe()}. The graph stays in tier 1 and this call returns "
                      f"tier 1's result. {where}", PromotionMismatchWarning, stacklevel=2)
        self._decide(False)
        return expected

    def _decide(self, ok: bool) -> None:
        self.verdict = ok
        if not ok:
            self.candidate = None  # never run again
        if self.listener is not None:
            self.listener(self, ok)

    def source(self) -> str:
        return (self.candidate or self.fallback).source()

    def __getattr__(self, name: str) -> Any:
        if name == "candidate":
            raise AttributeError(name)
        return getattr(self.candidate or self.fallback, name)

    def __repr__(self) -> str:
        return f"<checked {self.candidate or self.fallback!r}, verdict={self.verdict}>"


def _tier1(graph: Graph):
    """The tier-1 executable of ``graph`` (what :func:`nbgrad.jit.program.build` makes for
    ``"interpret"``): the reference every generated executable is checked against."""
    return owning(build_tape(expand(graph)))


def _back(expected: np.ndarray, on_device: bool):
    """A tier-1 output moved to the device where the generated code puts it there."""
    if not on_device:
        return expected
    from .cuda.fusion import cuda_device  # optional: needs a CUDA runtime
    return to_device(expected, cuda_device())


def checked(exe, name: str = "a jitted function"):
    """``exe`` wrapped in a :class:`Checked` when it is generated code that the check
    covers (the switch is on, the graph has no PythonOp), else ``exe``."""
    if not _ENABLED or getattr(exe, "tier", None) not in ("compile", "cuda") or \
            isinstance(exe, Checked) or has_python_ops(exe.graph):
        return exe
    return Checked(exe, name)


# ------------------------------------------------------------------ reproducers
class _GraphPickler(pickle.Pickler):
    """Pickles graphs without their caches (plans, tapes, locks)."""

    def reducer_override(self, obj):
        if isinstance(obj, Graph):
            return Graph, (obj.inputs, obj.consts, obj.nodes, obj.outputs)
        return NotImplemented


_REPLAY = '''"""Replay a promotion mismatch of nbgrad.jit: see README.md."""
import sys
from pathlib import Path

from nbgrad.jit.verify import replay

sys.exit(0 if replay(Path(__file__).parent) is None else 1)
'''


def reproducer_root() -> Path:
    """Where reproducers go: ``promotion-mismatch`` in the cache folder."""
    return cache_dir() / "promotion-mismatch"


def write_reproducer(graph: Graph, inputs: Sequence, bad: Mismatch, name: str,
                     tier: str) -> Path:
    """Write the graph and its inputs to a new folder under :func:`reproducer_root`."""
    folder = reproducer_root() / \
        f"{graph_hash(graph)[:16]}-{os.getpid()}-{time.time_ns() % 10**9}"
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "inputs.npz", *[np.asarray(to_host(a)) for a in inputs])
    buf = io.BytesIO()
    _GraphPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(graph)
    (folder / "graph.pkl").write_bytes(buf.getvalue())
    (folder / "graph.txt").write_text(format_graph(graph) + "\n")
    (folder / "tier.txt").write_text(tier + "\n")
    (folder / "replay.py").write_text(_REPLAY)
    (folder / "README.md").write_text(
        f"# nbgrad.jit promotion mismatch\n\nFunction: {name}\nGenerated code: {tier}\n"
        f"First difference: {bad.describe()}\n\n"
        "- `graph.txt`: the graph as text; `graph.pkl`: the graph (pickled IR);\n"
        "- `inputs.npz`: its inputs (`arr_0`, `arr_1`, ... in graph input order);\n"
        "- `python replay.py`: compiles the graph again (tier 2), runs it and tier 1 on the\n"
        "  inputs and prints the first difference (exit status 1) or that they agree (0).\n"
        "  In Python: `nbgrad.jit.verify.replay(folder)`. (`graph.pkl` is a pickle: replay\n"
        "  only reproducers you or nbgrad wrote.)\n")
    return folder


def load_reproducer(folder: str | os.PathLike) -> tuple[Graph, list[np.ndarray]]:
    """The graph and inputs of a reproducer folder."""
    folder = Path(folder)
    graph = pickle.loads((folder / "graph.pkl").read_bytes())
    with np.load(folder / "inputs.npz") as data:
        inputs = [data[f"arr_{k}"] for k in range(len(data.files))]
    return graph, inputs


def replay(folder: str | os.PathLike, verbose: bool = True) -> Mismatch | None:
    """Compile a reproducer's graph with tier 2, run it and tier 1 on its inputs, and
    return (and print) the first difference, or None when they agree."""
    graph, inputs = load_reproducer(folder)
    tier_file = Path(folder) / "tier.txt"
    tier = tier_file.read_text().strip() if tier_file.exists() else "compile"
    if tier == "cuda":
        from .cuda.fusion import CudaExecutable, cuda_device  # optional: a CUDA runtime
        got = CudaExecutable(graph).run([to_device(a, cuda_device()) for a in inputs])
    else:
        got = codegen.compile_graph(graph).run([np.array(a, copy=True) for a in inputs])
    expected = _tier1(graph).run(inputs)
    bad = compare(expected, got, inputs, reduction_lengths(graph))
    if verbose:
        print("tier 2 agrees with tier 1" if bad is None else
              f"tier 2 differs from tier 1: {bad.describe()}")
    return bad
