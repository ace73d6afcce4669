"""Runs fuzz programs through every executor and reports where they disagree.

Executors: ``eager`` (float64 reference; float32 programs are also compared with their
float64 twin), ``fd`` (the eager gradient against central finite differences in
float64, along random directions), ``jvp`` (forward mode: the directional derivative of
the loss by ``nbgrad.jvp`` against the eager gradient), ``vmap`` (the program and its
gradient under ``nbgrad.vmap`` over two input sets against eager on each), ``reference``
(``nbgrad.jit(mode="reference")``: the traced graph replayed with eager ops, as tier 1
runs it while its interpreter builds), ``interpret``
(``nbgrad.jit(mode="interpret")``, tier 1), ``compile`` (``mode="compile"``, tier 2)
``auto`` (``mode="auto"`` after the background promotion to tier 2), and, when named,
``grad`` (``nbgrad.jit(nbgrad.value_and_grad(loss))`` in tier 1: the gradient taken
inside the jit, traced from eager's backward or, where the traced forward re-rolls, from
the re-rolled forward (:mod:`nbgrad.jit.trace.traced_grad`, also forced on the fuzzer's
small programs), against eager's loss and gradients, unreached leaves' zeros included),
``blocked`` (tier 2 with every region it can block written as a loop over small blocks,
the code that runs arrays of ``nbgrad.kernels.parallel.MIN_SIZE`` elements and more),
``strips`` (tier 1 as it runs large arrays: every chain of elementwise instructions it
can strip run over strips of a few elements, every input and output it can in a slot). Every jitted
function is called :data:`CALLS` times (the first call may take another path than later
ones), the last time on slightly moved inputs; values, output dtypes and gradients must
match eager each time.

Tier 2 compiles are the expensive part, so ``compile`` and ``auto`` run programs in
batches: one jitted function returns every program's result (their leaves are disjoint,
so results and gradients stay separate). A disagreement is then confirmed on the
program alone, which gives its reproducer. The promotion check (tier 2's first result
verified against tier 1) is turned off while programs run: it would hide what we test.

After those calls, ``interpret`` and ``compile`` call their jitted function once more
(:data:`SPECIAL_CALL`, no new compile) on inputs with special values mixed in (see
:mod:`.special`): values and gradients must then match eager's, IEEE-aware.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ... import functional, jit
from ...batching import vmap
from ...errors import TracerError
from ...jit import program as tiers
from ...jit.local_names import digit_extended_locals
from ...jit.tier1 import interpreter, storage, strips
from ...jit.trace import traced_grad
from ...kernels import parallel
from ...tensor import Tensor
from . import layouts
from .program import Program, to_source
from .special import (
    SPECIAL_RTOL,
    array_code,
    blas_products,
    compare_gradients,
    elementwise_only,
    ieee_difference,
    largest_finite,
    special_inputs,
)
from .watchdog import watching

EXECUTORS = ("eager", "fd", "jvp", "vmap", "reference", "interpret", "compile", "auto")
#: executors run only when named: ``grad`` differentiates inside the jit
#: (:func:`grad_in_jit`); ``blocked`` is tier 2 with every fused region that can
#: be written as a loop over blocks written so (:func:`blocked_everywhere`); ``cuda`` is
#: eager and jit on CUDA tensors (:mod:`.on_device`); ``strips`` is tier 1 as it runs
#: large arrays, in strips of a few elements and slots (:func:`strips_everywhere`)
EXTRA_EXECUTORS = ("grad", "blocked", "strips", "cuda")
#: executors on another device, by name: ``run(program, refs) -> (mismatches, whether
#: fused device kernels ran)``; :mod:`.on_device` registers ``cuda``
DEVICE_RUNS: dict[str, Callable[[Program, list[Result]], tuple[list[Mismatch], bool]]] = {}
#: rows per block under ``blocked``, by seed: whole and ragged last blocks, one row each
BLOCK_SIZES = (1, 2, 3, 5, 8)
#: elements per strip under ``strips``, by seed: whole and ragged last strips
STRIP_SIZES = (1, 2, 3, 7)
#: the jit mode each executor of the jit runs in
MODES = {"reference": "reference", "interpret": "interpret", "compile": "compile",
         "auto": "auto", "blocked": "compile", "strips": "interpret"}
#: calls of each jitted function (the first traces; later ones run the compiled graph)
CALLS = 3
#: how far the inputs of the last call move (well inside the generator's GAP)
NUDGE = 0.004
#: programs per tier-2 compile (see the module docstring)
BATCH = 6
#: the call number of the extra call on special inputs (interpret and compile)
SPECIAL_CALL = CALLS + 1
TOLERANCE = {"float64": (1e-9, 1e-9), "float32": (2e-4, 2e-4)}  # (rtol, atol per |max|)


@dataclass
class Mismatch:
    """One disagreement: ``executor`` on ``call`` (1-based; 0 when not a call) got
    ``what`` wrong (``detail`` says by how much, or the exception)."""

    executor: str
    program: Program
    call: int
    what: str
    detail: str
    batch: tuple[Program, ...] = field(default=())
    #: the node count of the program this one was shrunk from (0: not shrunk)
    shrunk_from: int = 0

    def headline(self) -> str:
        call = f", call {self.call}" if self.call else ""
        if self.call == SPECIAL_CALL:
            call = ", on special inputs"
        if self.call and self.executor == "auto":
            call += " after the promotion"
        return (f"seed {self.program.seed} ({self.program.dtype}): {self.executor}{call}: "
                f"{self.what}: {self.detail}")

    def report(self) -> str:
        """The headline and a reproducer: the program as nbgrad code and as a Program."""
        mode = MODES.get(self.executor)
        lines = [self.headline(), "", "# reproducer", to_source(self.program)]
        if self.shrunk_from:
            lines[2] += (f" (shrunk from the {self.shrunk_from} nodes of seed "
                         f"{self.program.seed}'s program to {len(self.program.nodes)})")
        if mode:
            promote = ("  # mode='auto' promotes a hot graph: set "
                       "nbgrad.jit.program.PROMOTE_SECONDS = 0, call it 3 times, then "
                       "nbgrad.jit.program.wait_for_promotions()") if mode == "auto" else ""
            if self.executor == "blocked":
                rows = BLOCK_SIZES[self.program.seed % len(BLOCK_SIZES)]
                lines += ["from nbgrad.kernels import parallel  # every region blocked",
                          f"parallel.MIN_SIZE, parallel.BLOCK = 1, {rows}"]
            if self.executor == "strips":
                size = STRIP_SIZES[self.program.seed % len(STRIP_SIZES)]
                lines += ["from nbgrad.jit.tier1 import storage, strips  # as large arrays",
                          f"strips.MIN_ELEMENTS, strips.STRIP = 1, {size}",
                          "storage.OUTSIDE_MIN = 1"]
            lines += ["nb.jit.set_promotion_check(False)",
                      f"jf = nb.jit(f, mode={mode!r}){promote}",
                      f"for call in range({CALLS}):",
                      "    for x in inputs:", "        x.grad = None",
                      "    out, loss = jf(*inputs)", "    loss.backward()",
                      "    print(out, [x.grad for x in inputs])",
                      "print('eager:', f(*inputs)[0])"]
            if self.call == SPECIAL_CALL:
                dt = f"np.{self.program.dtype}"
                special = [f"nb.tensor({array_code(a)}, dtype={dt}, requires_grad=True)"
                           for a in special_inputs(self.program, inputs(self.program, 1))]
                lines += ["# then, on special inputs (np.errstate(all='ignore')):",
                          "inputs = [" + ", ".join(special) + "]",
                          "out, loss = jf(*inputs)", "loss.backward()",
                          "print(out, [x.grad for x in inputs])",
                          "for x in inputs:", "    x.grad = None",
                          "out, loss = f(*inputs)", "loss.backward()",
                          "print('eager:', out, [x.grad for x in inputs])"]
        if self.executor == "grad":
            n = sum(1 for _ in self.program.leaves(requires_grad=False))
            if FORCED in self.what:
                lines += ["from nbgrad.jit.trace import traced_grad  # re-roll small graphs",
                          "traced_grad.MIN_FORWARD = 0"]
            lines += [f"jf = nb.jit(nb.value_and_grad(lambda *xs: f(*xs)[1], "
                      f"argnums=tuple(range({n}))), mode='interpret')",
                      f"for call in range({CALLS}):", "    print(jf(*inputs))",
                      "for x in inputs:", "    x.grad = None",
                      "out, loss = f(*inputs)", "loss.backward()",
                      "print('eager:', loss, [x.grad for x in inputs])"]
        lines += ["", f"# as a Program: {self.program!r}".replace("\n", " ")]
        if self.batch:
            lines += ["", f"# seen only with {len(self.batch)} programs in one jitted "
                      "function (seeds " + ", ".join(str(p.seed) for p in self.batch) + ")"]
        return "\n".join(lines)


@contextlib.contextmanager
def no_promotion_check() -> Iterator[None]:
    """Tier 2 runs unverified (``nbgrad.jit.set_promotion_check(False)``) and unmeasured
    (``nbgrad.jit.program.MEASURE``: it is not swapped back for tier 1 on its timings),
    and tier 1 runs the interpreter even before it is built (``interpreter.BACKGROUND``
    off: no eager ops in its place, which ``reference`` checks), all restored after."""
    switch = getattr(jit, "set_promotion_check", None)
    previous = switch(False) if switch is not None else None
    measure, tiers.MEASURE = tiers.MEASURE, False
    background, interpreter.BACKGROUND = interpreter.BACKGROUND, False
    try:
        yield
    finally:
        tiers.MEASURE = measure
        interpreter.BACKGROUND = background
        if switch is not None:
            switch(previous)


# ------------------------------------------------------------------ references
@dataclass
class Result:
    """What one run gave: the result (None: not asked, ``grad``), the loss and the
    gradients of the leaves."""

    out: np.ndarray | None
    loss: np.ndarray
    grads: list[np.ndarray | None]
    #: how the leaves were laid out in memory (:mod:`.layouts`; empty: fresh arrays)
    layout: str = ""


def inputs(program: Program, call: int, dtype: str | None = None) -> list[np.ndarray]:
    """Leaf values for ``call`` (1-based): the program's own, moved for the last call."""
    leaves = [t.numpy() for t in program.leaves(dtype, requires_grad=False)]
    if call < CALLS:
        return leaves
    rng = np.random.default_rng([program.seed, 5])
    return [(a + NUDGE * rng.uniform(-1, 1, a.shape)).astype(a.dtype) for a in leaves]


def _run(fn, programs: Sequence[Program], arrays: list[list[np.ndarray]],
         layout: np.random.Generator | None = None, device: str = "cpu") -> list[Result]:
    """Call ``fn`` (a batch function) on fresh leaves (on ``device``), backward the summed
    losses. With ``layout``, the leaves of all programs share one buffer in drawn layouts
    (:mod:`.layouts`); else each is a new contiguous tensor."""
    names: list[str] = []
    if layout is None:
        leaves = [[Tensor(a, requires_grad=True, device=device) for a in group]
                  for group in arrays]
    else:
        flat, kinds = layouts.leaves([a for group in arrays for a in group], layout)
        it, kind = iter(flat), iter(kinds)
        leaves = [[next(it) for _ in group] for group in arrays]
        names = [layouts.describe([next(kind) for _ in group]) for group in arrays]
    outs = fn(*[t for group in leaves for t in group])
    total = None
    for _out, loss in outs:
        total = loss if total is None else total + loss
    total.backward()
    return [Result(out.numpy(), loss.numpy(),
                   [None if t.grad is None else t.grad.numpy() for t in group],
                   names[k] if names else "")
            for k, ((out, loss), group) in enumerate(zip(outs, leaves, strict=True))]


def batch_function(programs: Sequence[Program]):
    """One function of all the programs' leaves returning each program's (result, loss)."""
    counts = [sum(1 for _ in p.leaves(requires_grad=False)) for p in programs]

    def fn(*xs):
        out, k = [], 0
        for p, n in zip(programs, counts, strict=True):
            out.append(p.both(*xs[k:k + n]))
            k += n
        return tuple(out)

    return fn


def _compare(got: Result, want: Result, program: Program, executor: str, call: int
             ) -> list[Mismatch]:
    rtol, atol = TOLERANCE[program.dtype]
    found = []
    pairs = [("result", got.out, want.out), ("loss", got.loss, want.loss)] + [
        (f"gradient of x{k}", g, w) for k, (g, w) in enumerate(zip(got.grads, want.grads,
                                                                   strict=True))]
    for what, g, w in pairs:
        if (g is None) != (w is None):
            found.append(Mismatch(executor, program, call, what,
                                  f"got {'None' if g is None else 'a tensor'}, eager "
                                  f"{'None' if w is None else 'a tensor'}"))
            continue
        if g is None:
            continue
        if g.shape != w.shape or g.dtype != w.dtype:
            found.append(Mismatch(executor, program, call, what,
                                  f"got {g.dtype}{list(g.shape)}, eager "
                                  f"{w.dtype}{list(w.shape)}"))
            continue
        scale = 1.0 + float(np.max(np.abs(w), initial=0.0))
        err = np.abs(g.astype(np.float64) - w.astype(np.float64))
        agree = (g == w) | (err <= atol * scale + rtol * np.abs(w)) | \
            (np.isnan(g) & np.isnan(w))  # equal infinities; NaN in both
        bad = ~agree | (np.isnan(g) != np.isnan(w))
        if np.any(bad):
            k = int(np.argmax(np.where(np.isnan(err), np.inf, err)))
            found.append(Mismatch(executor, program, call, what,
                                  f"max |difference| {float(np.nanmax(err)):.3g} at flat "
                                  f"index {k}: got {g.ravel()[k]!r}, eager {w.ravel()[k]!r} "
                                  f"({int(np.sum(bad))} of {w.size} elements off)"))
    if got.layout:
        found = [replace(m, detail=f"{m.detail} [arguments: {got.layout}]") for m in found]
    return found


def _compare_special(got: Result, want: Result, program: Program, executor: str,
                     arrays: list[np.ndarray]) -> list[Mismatch]:
    """IEEE-aware comparison on special inputs (``arrays``); the sign of a zero is
    checked only for the result of an elementwise program (a reassociated sum may give
    +0 where NumPy gives -0)."""
    rtol = SPECIAL_RTOL[program.dtype]
    blas = blas_products(program)
    pairs = [("result", got.out, want.out, elementwise_only(program)),
             ("loss", got.loss, want.loss, False)]
    if compare_gradients(program):
        pairs += [(f"gradient of x{k}", g, w, False)
                  for k, (g, w) in enumerate(zip(got.grads, want.grads, strict=True))]
    found = []
    for what, g, w, signs in pairs:
        if g is None and w is None:
            continue
        if g is None or w is None or g.shape != w.shape or g.dtype != w.dtype:
            found.append(Mismatch(executor, program, SPECIAL_CALL, what,
                                  "another kind of value than eager's (None, shape or "
                                  "dtype)"))
            continue
        why = ieee_difference(g, w, rtol, largest_finite(w, *arrays), signs,
                              nan_places=not blas)
        if why:
            found.append(Mismatch(executor, program, SPECIAL_CALL, what, why))
    return found


def _special_run(fn, programs: Sequence[Program]) -> tuple[list[Result],
                                                           list[list[np.ndarray]]]:
    """:func:`_run` on the programs' special inputs (NumPy warnings off)."""
    arrays = [special_inputs(p, inputs(p, 1)) for p in programs]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(fn, programs, arrays), arrays


def _raised(exc: BaseException, program: Program, executor: str, call: int) -> Mismatch:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename.split('/')[-1]}:{frames[-1].lineno})" if frames \
        else ""
    text = " ".join(str(exc).split())[:400]
    return Mismatch(executor, program, call, "raised", f"{type(exc).__name__}: {text}{where}")


# ------------------------------------------------------------------ executors
def eager_reference(program: Program) -> tuple[list[Result] | None, list[Mismatch]]:
    """Eager results for every call's inputs, and what is wrong with them (float32
    against float64; a raising program is rejected: ``None`` and a mismatch)."""
    refs = []
    try:
        for call in range(1, CALLS + 1):
            refs.append(_run(batch_function([program]), [program],
                             [inputs(program, call)])[0])
    except Exception as exc:  # the program is invalid: every executor must say so too
        return None, [_raised(exc, program, "eager", 0)]
    try:
        refs.append(_special_run(batch_function([program]), [program])[0][0])
    except Exception:  # eager may refuse special values: then the jit is not asked
        refs.append(None)
    found = []
    kinds = [("result", refs[0].out)] + [(f"gradient of x{k}", g)
                                         for k, g in enumerate(refs[0].grads) if g is not None]
    for what, a in kinds:  # a float32 program stays float32 (float64 likewise)
        if a.dtype != np.dtype(program.dtype):
            found.append(Mismatch("eager", program, 0, f"dtype of the {what}",
                                  f"{a.dtype} from {program.dtype} inputs"))
    if program.dtype == "float32":
        twin = Program(program.nodes, program.seed, "float64")
        want = _run(batch_function([twin]), [twin], [inputs(twin, 1)])[0]
        got = refs[0]
        for what, g, w in [("result (float32 vs float64)", got.out, want.out)] + [
                (f"gradient of x{k} (float32 vs float64)", g, w)
                for k, (g, w) in enumerate(zip(got.grads, want.grads, strict=True))]:
            if g is not None and w is not None and not np.allclose(
                    g, w, rtol=2e-3, atol=2e-3 * (1 + np.max(np.abs(w), initial=0.0))):
                found.append(Mismatch("eager", program, 0, what,
                                      f"max |difference| {np.max(np.abs(g - w)):.3g}"))
    return refs, found


def finite_differences(program: Program, eps: float = 1e-6, directions: int = 2
                       ) -> list[Mismatch]:
    """The eager gradient of the float64 program along random directions against central
    differences of its loss."""
    twin = Program(program.nodes, program.seed, "float64")
    base = inputs(twin, 1)
    grads = _run(batch_function([twin]), [twin], [base])[0].grads

    def loss(arrays):
        return float(twin.loss(*[Tensor(a) for a in arrays]).numpy())

    rng = np.random.default_rng([program.seed, 6])
    found = []
    for _ in range(directions):
        v = [rng.standard_normal(a.shape) for a in base]
        plus = loss([a + eps * d for a, d in zip(base, v, strict=True)])
        minus = loss([a - eps * d for a, d in zip(base, v, strict=True)])
        fd = (plus - minus) / (2 * eps)
        an = sum(float(np.sum(g * d)) for g, d in zip(grads, v, strict=True) if g is not None)
        if math.isnan(an):  # not differentiable here (hypot(0, 0), as PyTorch): nothing to
            break           # compare; the executors must still agree on the NaN
        scale = 1.0 + abs(an) + abs(plus) * 1e-3
        if not abs(fd - an) <= 2e-5 * scale:
            found.append(Mismatch("fd", program, 0, "directional derivative",
                                  f"eager gradient gives {an!r}, finite differences "
                                  f"{fd!r}"))
            break
    return found


def forward_mode(program: Program, ref: Result) -> list[Mismatch]:
    """The loss's directional derivative by forward mode (``nbgrad.jvp``) against the
    eager (reverse-mode) gradient, along a random direction, on the first call's inputs."""
    base = inputs(program, 1)
    floats = [k for k, a in enumerate(base) if a.dtype.kind == "f"]
    rng = np.random.default_rng([program.seed, 7])
    v = {k: rng.standard_normal(base[k].shape).astype(base[k].dtype) for k in floats}

    def loss(*xs):
        full = [Tensor(a) for a in base]
        for k, x in zip(floats, xs, strict=True):
            full[k] = x
        return program.loss(*full)

    try:
        _, tangent = functional.jvp(loss, [Tensor(base[k]) for k in floats],
                                    [Tensor(v[k]) for k in floats])
    except Exception as exc:
        if str(exc).startswith("forward mode"):  # a clear refusal (a NumPy backward)
            return []
        return [_raised(exc, program, "jvp", 1)]
    got = float(tangent.numpy())
    want = sum(float(np.sum(ref.grads[k].astype(np.float64) * v[k])) for k in floats
               if ref.grads[k] is not None)
    rtol, atol = TOLERANCE[program.dtype]
    scale = sum(float(np.sum(np.abs(ref.grads[k]) * np.abs(v[k]))) for k in floats
                if ref.grads[k] is not None)
    if (math.isnan(got) and math.isnan(want)) or abs(got - want) <= rtol * abs(want) + \
            atol * (1.0 + scale):
        return []
    return [Mismatch("jvp", program, 1, "directional derivative",
                     f"forward mode gives {got!r}, the eager gradient {want!r}")]


def vmapped(program: Program, refs: list[Result]) -> list[Mismatch] | None:
    """The program and its gradient under ``nbgrad.vmap`` over two input sets (the first
    and the last call's) against eager on each; an op with no batching rule (a clear
    ``NotImplementedError``) or a value the trace cannot read (``TracerError``) is a
    refusal (None), not a mismatch."""
    sets = (inputs(program, 1), inputs(program, CALLS))
    xs = [Tensor(np.stack([u, v])) for u, v in zip(*sets, strict=True)]
    try:
        outs, _ = vmap(program.both)(*xs)
        grads = vmap(functional.grad(program.loss, argnums=tuple(range(len(xs)))))(*xs) \
            if xs else ()
    except (NotImplementedError, TracerError):
        return None
    except Exception as exc:
        return [_raised(exc, program, "vmap", 1)]
    rtol, atol = TOLERANCE[program.dtype]
    for b, ref in enumerate((refs[0], refs[CALLS - 1])):
        pairs = [("result", outs.numpy()[b], ref.out)] + [
            (f"gradient of x{k}", g.numpy()[b], np.zeros_like(g.numpy()[b]) if w is None else w)
            for k, (g, w) in enumerate(zip(grads, ref.grads, strict=True))]
        for what, got, want in pairs:
            scale = atol * (1.0 + float(np.max(np.abs(want), initial=0.0)))
            if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=scale,
                                                          equal_nan=True):
                return [Mismatch("vmap", program, b + 1, f"{what} of example {b}",
                                 f"max |difference| {np.max(np.abs(got - want)):.3g}"
                                 if got.shape == want.shape else
                                 f"shape {got.shape} != {want.shape}")]
    return []


#: what a ``grad`` mismatch says when the re-rolled path was forced on a small graph
FORCED = "(traced_grad.MIN_FORWARD = 0)"


@contextlib.contextmanager
def min_forward(n: int) -> Iterator[None]:
    """:data:`nbgrad.jit.trace.traced_grad.MIN_FORWARD` set to ``n``; restored after."""
    saved, traced_grad.MIN_FORWARD = traced_grad.MIN_FORWARD, n
    try:
        yield
    finally:
        traced_grad.MIN_FORWARD = saved


def grad_in_jit(program: Program, refs: list[Result], stats: dict | None = None
                ) -> list[Mismatch]:
    """``nbgrad.jit(nbgrad.value_and_grad(program.loss, argnums=all leaves))`` (tier 1)
    called :data:`CALLS` times, against eager's loss and gradients (zeros where eager's is
    None: the leaf does not reach the loss); once as it is and once with the re-rolled
    forward's gradient forced on small graphs (:data:`FORCED`). ``stats`` counts the
    programs whose gradient came from a re-rolled forward (``grad re-rolled``)."""
    n = sum(1 for _ in program.leaves(requires_grad=False))
    if not n:
        return []
    found: list[Mismatch] = []
    for least, note in ((traced_grad.MIN_FORWARD, ""), (0, f" {FORCED}")):
        before = traced_grad.STATS["rerolled"]
        with min_forward(least):
            found += _grad_calls(program, refs, n, note)
        if stats is not None and note and traced_grad.STATS["rerolled"] > before:
            _count(stats, "grad re-rolled")
        if found:
            break
    return found


def _grad_calls(program: Program, refs: list[Result], n: int, note: str) -> list[Mismatch]:
    jitted = jit(functional.value_and_grad(program.loss, argnums=tuple(range(n))),
                 mode="interpret")
    found: list[Mismatch] = []
    kept: list[Result] = []
    call = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for call in range(1, CALLS + 1):
                loss, grads = jitted(*[Tensor(a) for a in inputs(program, call)])
                kept.append(Result(None, loss.numpy(), [g.numpy() for g in grads]))
                found += _compare_grads(kept[-1], refs[call - 1], program, call)
                if found:
                    break
            if not found:
                found += overwritten(kept, lambda got, call: _compare_grads(
                    got, refs[call - 1], program, CALLS))
        except Exception as exc:
            found.append(_raised(exc, program, "grad", call))
    return [replace(m, what=m.what + note) for m in found]


def _compare_grads(got: Result, ref: Result, program: Program, call: int) -> list[Mismatch]:
    """:func:`_compare` of ``value_and_grad``'s loss and gradients (no result)."""
    leaves = inputs(program, 1)
    want = Result(None, ref.loss, [np.zeros_like(a) if w is None else w
                                   for a, w in zip(leaves, ref.grads, strict=True)])
    return _compare(got, want, program, "grad", call)


@contextlib.contextmanager
def blocked_everywhere(elements: int) -> Iterator[None]:
    """Tier 2 writes every region it can block as a loop over blocks of about
    ``elements`` elements (:mod:`nbgrad.jit.tier2.blocked`), as it does for arrays of
    :data:`~nbgrad.kernels.parallel.MIN_SIZE` elements and more; restored after."""
    saved = parallel.MIN_SIZE, parallel.BLOCK
    parallel.MIN_SIZE, parallel.BLOCK = 1, elements
    try:
        yield
    finally:
        parallel.MIN_SIZE, parallel.BLOCK = saved


@contextlib.contextmanager
def strips_everywhere(elements: int) -> Iterator[None]:
    """Tier 1 runs as it runs large arrays: every chain it can strip over strips of
    ``elements`` elements (:mod:`nbgrad.jit.tier1.strips`, for chains over
    :data:`~nbgrad.jit.tier1.strips.MIN_ELEMENTS` elements and more), every input and
    output it can in a slot (:func:`nbgrad.jit.tier1.storage.place_outside`, for
    :data:`~nbgrad.jit.tier1.storage.OUTSIDE_MIN` elements and more); restored after."""
    saved = strips.MIN_ELEMENTS, strips.STRIP, storage.OUTSIDE_MIN
    strips.MIN_ELEMENTS, strips.STRIP, storage.OUTSIDE_MIN = 1, elements, 1
    try:
        yield
    finally:
        strips.MIN_ELEMENTS, strips.STRIP, storage.OUTSIDE_MIN = saved


def run_jit(programs: Sequence[Program], refs: Sequence[list[Result]], executor: str
            ) -> tuple[list[Mismatch], bool]:
    """The programs in one jitted function under ``executor``; (mismatches, whether tier
    2 ran: for ``auto``, whether the promotion happened; for ``blocked``, whether it
    wrote a region as a loop over blocks; for ``strips``, whether a tape ran a strip)."""
    if executor == "blocked":
        with blocked_everywhere(BLOCK_SIZES[programs[0].seed % len(BLOCK_SIZES)]):
            return _run_jit(programs, refs, executor)
    if executor == "strips":
        with strips_everywhere(STRIP_SIZES[programs[0].seed % len(STRIP_SIZES)]):
            return _run_jit(programs, refs, executor)
    return _run_jit(programs, refs, executor)


def _run_jit(programs: Sequence[Program], refs: Sequence[list[Result]], executor: str
             ) -> tuple[list[Mismatch], bool]:
    fn = batch_function(programs)
    jitted = jit(fn, mode=MODES[executor])
    found: list[Mismatch] = []
    call = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if executor == "auto":
                # promote by calls alone: the fuzzer's graphs run too briefly to be hot
                seconds, tiers.PROMOTE_SECONDS = tiers.PROMOTE_SECONDS, 0.0
                try:
                    for _ in range(tiers.PROMOTE_AFTER + 2):  # until the promotion starts
                        _run(jitted, programs, [inputs(p, 1) for p in programs])
                        if any(e.tier != "interpret" for e in jitted._cache.values()):
                            break
                finally:
                    tiers.PROMOTE_SECONDS = seconds
                tiers.wait_for_promotions(300)
            # the calls' arguments in drawn layouts; their results are kept and checked
            # again after the last call: a later call must not write into them
            draw = np.random.default_rng([programs[0].seed, 11, sum(map(ord, executor))])
            kept = []
            for call in range(1, CALLS + 1):
                got = _run(jitted, programs, [inputs(p, call) for p in programs], draw)
                for g, ref, p in zip(got, refs, programs, strict=True):
                    found += _compare(g, ref[call - 1], p, executor, call)
                if found:
                    break
                kept.append(got)
            if not found:
                found += overwritten(kept, lambda got, call: [
                    m for g, ref, p in zip(got, refs, programs, strict=True)
                    for m in _compare(g, ref[call - 1], p, executor, CALLS)])
            if not found and executor in ("interpret", "strips", "compile", "blocked") and all(
                    len(ref) > CALLS and ref[CALLS] is not None for ref in refs):
                call = SPECIAL_CALL
                got, arrays = _special_run(jitted, programs)
                for g, ref, p, xs in zip(got, refs, programs, arrays, strict=True):
                    found += _compare_special(g, ref[CALLS], p, executor, xs)
        except Exception as exc:
            found.append(_raised(exc, programs[0], executor, call))
    found += _ambiguous_locals(jitted, programs[0], executor)
    tier2 = ran_tier2(jitted)
    if executor == "blocked":  # counted only where tier 2 wrote a loop over blocks
        tier2 = tier2 and any(getattr(getattr(x, "inner", x), "stats", {}).get("blocked")
                              for e in jitted._cache.values()
                              for x in e.program.executables().values())
    if executor == "strips":  # whether a tape ran a STRIP block
        tapes = [getattr(x, "inner", x) for e in jitted._cache.values()
                 for x in e.program.executables().values()]
        tier2 = any(interpreter.OP_STRIP in t.ins[:, 0] for t in tapes if hasattr(t, "ins"))
    return found, tier2


def _ambiguous_locals(jitted, program: Program, executor: str) -> list[Mismatch]:
    """Generated code (tier 2's, the CUDA tier's) in which Numba's frontend may give loads
    of two locals one temporary (:mod:`nbgrad.jit.local_names`)."""
    found = []
    for x in (x for e in jitted._cache.values() for x in e.program.executables().values()):
        x = getattr(x, "inner", x)
        source = getattr(getattr(x, "generated", None), "source", None) or \
            getattr(x, "module_source", None)
        pairs = source and digit_extended_locals(source)
        if pairs:
            found.append(Mismatch(executor, program, 0, "generated code", "locals that "
                                  f"are other locals plus digits: {pairs[:4]}"))
    return found


def overwritten(kept: list, compare: Callable[[object, int], list[Mismatch]]
                ) -> list[Mismatch]:
    """The results of earlier calls (``kept[k]``: call ``k + 1``'s) read again after the
    last call: ``compare(result, call)``'s mismatches of the first call that differs
    (a later call wrote into a result it had handed out)."""
    for call, got in enumerate(kept, start=1):
        found = [replace(m, what=f"{m.what} of call {call}, read after call {CALLS} "
                         "(a later call wrote into it)") for m in compare(got, call)]
        if found:
            return found
    return []


def executable_tiers(jitted) -> list[str | None]:
    """The tier of each executable a jitted function built ("interpret", "compile",
    "cuda", ...; None where it has none)."""
    return [getattr(getattr(x, "inner", x), "tier", None)
            for e in getattr(jitted, "_cache", {}).values()
            for x in e.program.executables().values()]


def ran_tier2(jitted) -> bool:
    """Whether a jitted function's executables are generated code (tier 2)."""
    tiers = executable_tiers(jitted)
    return bool(tiers) and all(t == "compile" for t in tiers)


def raises_like_eager(program: Program, eager_error: str, executor: str) -> list[Mismatch]:
    """Where eager raises (``eager_error``: "Type: message"), the jit must raise an error
    of the same type (not return a result, nor fail in another way)."""
    jitted = jit(batch_function([program]), mode=executor)
    kind = eager_error.split(":", 1)[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _run(jitted, [program], [inputs(program, 1)])
    except Exception as exc:
        if type(exc).__name__ == kind:
            return []
        m = _raised(exc, program, executor, 1)
        m.what = f"raised another error than eager ({eager_error[:200]})"
        return [m]
    return [Mismatch(executor, program, 1, "returned a result", f"eager raised "
                     f"{eager_error[:300]}")]


def check_programs(programs: Sequence[Program], executors: Sequence[str] = EXECUTORS,
                   batch: int = BATCH, stats: dict | None = None) -> list[Mismatch]:
    """Every executor on every program; the mismatches found. ``stats`` (if given)
    counts graphs per executor (``tried``), rejected programs and tier-2 runs."""
    stats = {} if stats is None else stats
    clock = stats.setdefault("seconds", {})
    found: list[Mismatch] = []
    valid: list[tuple[Program, list[Result]]] = []
    with no_promotion_check():
        for p in programs:
            with watching([p.seed], "the program"):
                _check_one(p, executors, stats, found, valid)
        for executor in ("compile", "auto", "blocked"):
            if executor not in executors:
                continue
            start = time.perf_counter()
            for k in range(0, len(valid), batch):
                group = valid[k:k + batch]
                with watching([q.seed for q, _ in group], f"the {executor} executor's batch"):
                    found += _batched(group, executor, stats)
            clock[executor] = clock.get(executor, 0.0) + time.perf_counter() - start
    return found


def _check_one(p: Program, executors: Sequence[str], stats: dict, found: list[Mismatch],
               valid: list[tuple[Program, list[Result]]]) -> None:
    """The unbatched executors on one program (:func:`check_programs`)."""
    refs, bad = eager_reference(p)
    if refs is None:
        stats["rejected"] = stats.get("rejected", 0) + 1
        stats.setdefault("rejections", []).append(bad[0].headline())
        for executor in ("interpret", "compile"):
            if executor in executors:
                found += raises_like_eager(p, bad[0].detail, executor)
        return
    valid.append((p, refs))
    _count(stats, "eager")
    if "eager" in executors:
        found += bad
    if "fd" in executors:
        _count(stats, "fd")
        found += finite_differences(p)
    if "jvp" in executors:
        _count(stats, "jvp")
        found += forward_mode(p, refs[0])
    if "vmap" in executors:
        bad = vmapped(p, refs)
        _count(stats, "vmap" if bad is not None else "vmap refused")
        found += bad or []
    for executor in ("reference", "interpret", "strips"):
        if executor in executors:
            _count(stats, executor)
            bad, stripped = run_jit([p], [refs], executor)
            found += bad
            if executor == "strips" and stripped:
                _count(stats, "strips on strips")
    if "grad" in executors:
        _count(stats, "grad")
        found += grad_in_jit(p, refs, stats)
    for executor, run in DEVICE_RUNS.items():
        if executor in executors:
            bad, fused = run(p, refs)
            _count(stats, executor)
            if fused:
                _count(stats, f"{executor} on fused kernels")
            found += bad


def _count(stats: dict, key: str, n: int = 1) -> None:
    tried = stats.setdefault("tried", {})
    tried[key] = tried.get(key, 0) + n


def _batched(group: list[tuple[Program, list[Result]]], executor: str, stats: dict
             ) -> list[Mismatch]:
    progs = [p for p, _ in group]
    bad, tier2 = run_jit(progs, [r for _, r in group], executor)
    _count(stats, executor, len(group))
    if tier2:
        _count(stats, f"{executor} on tier 2", len(group))
    if not bad:
        return []
    # confirm on each suspect alone (all of them when the batch raised)
    suspects = {id(m.program) for m in bad} if bad[0].what != "raised" else \
        {id(p) for p in progs}
    found = []
    for p, refs in group:
        if id(p) in suspects:
            alone, _ = run_jit([p], [refs], executor)
            found += alone[:1]
    if not found:
        m = bad[0]
        found.append(Mismatch(m.executor, m.program, m.call, m.what, m.detail, tuple(progs)))
    return found


def check_program(program: Program, executors: Sequence[str] = EXECUTORS
                  ) -> list[Mismatch]:
    """:func:`check_programs` of one program."""
    return check_programs([program], executors)
