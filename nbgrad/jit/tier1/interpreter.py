"""Tier 1: one precompiled ``@njit`` tape interpreter, generated once per install.

The interpreter (``run``) executes a flat instruction array over a buffer pool: one
1-d float array (float64 or float32; booleans are stored as 0/1 and a loop counter
as a float). Each instruction is a row of :data:`WIDTH` int64 fields (see the ``F_*``
constants): an opcode, operand offsets into the pool, per-iteration strides for those
offsets (an operand's address is ``offset + it * stride`` with ``it`` the counter of
the innermost enclosing LOOP), sizes and modes. Float parameters live in ``fp`` and
integer tables (shapes, strides, positions) in ``ia``. Large inputs and outputs live
outside the pool, in *slots*: an offset of at least :data:`SLOT` is in slot
``offset >> SLOT_SHIFT``, whose address and length are a row of the ``ext`` table filled
per call (the caller's input, read in place; a fresh output array, handed to the
caller), so they are neither copied in nor out (:func:`.storage.place_outside`).

Instructions operate on sliced views of the pool (``buf[o:o + n]``), never on
``buf[o + j]`` index arithmetic, which blocks vectorisation (DESIGN-NOTES point 4).
A LOOP instruction repeats the instructions up to its ENDLOOP ``count`` times (loops
nest), so ``fori_loop``, ``scan`` and re-rolled Python loops run without Python. A
STRIP instruction runs a chain of elementwise instructions up to its ENDSTRIP over
strips of ``k`` elements of their ``n`` (:mod:`.strips`), so a chain's intermediates
stay in cache; strips do not nest and hold no loop.

The elementwise opcodes are generated from the scalar expressions of
:mod:`nbgrad.kernels.elementwise` (the eager kernels' single source of truth): hot
ops get a dedicated loop each, every other op goes through one generic loop that
switches on a sub-opcode per element (compiled once, cheap to compile). The module
is written to the cache folder by :func:`nbgrad.codegen.load_module`, so Numba's
``cache=True`` makes the compile a once-per-install cost: a new graph or a new shape
only builds a new tape.

That one compile takes many seconds, so it never delays a result: while ``run`` for
a pool type is neither compiled in this process nor in Numba's disk cache
(:func:`ready`), tapes run their graphs with eager ops and the pool type waits in
:data:`PENDING` until :func:`build_pending` compiles it (``nbgrad.jit.program`` calls
it in a background thread once a call has returned). Once the eager runs have cost
:data:`FALLBACK_BUDGET_S`, tapes wait for the build instead.
"""

from __future__ import annotations

import os
import threading

from ... import codegen
from ...kernels import elementwise as _ew
from ...kernels.elementwise import (
    BINARY,
    CASTS,
    TERNARY,
    UNARY,
    ScalarOp,
    libm_expr,
    range_limited,
    scalar_cpu,
)

WIDTH = 17
(F_OP, F_O, F_A, F_B, F_C, F_SO, F_SA, F_SB, F_SC, F_N, F_M, F_K, F_P, F_F, F_G,
 F_H, F_T) = range(WIDTH)
#: bits of an instruction's ``F_T`` field inside a STRIP block (:mod:`.strips`): which
#: operands move by the strip's offset (``T_O`` ... ``T_C``; the others are scratch or
#: scalars), and ``T_N``: the instruction runs over the strip's length, not ``F_N``
T_O, T_A, T_B, T_C, T_N = 1, 2, 4, 8, 16

# Which scalar operations get which loop is declared with each ScalarOp (its ``tape``):
#: unary operations with a dedicated loop (the rest use the generic one)
HOT_UNARY = tuple(name for name, op in UNARY.items() if op.tape == "hot")
#: hot unary operations whose vectorised math is exact only up to ``TRIG_MAX``: their
#: loop runs a second pass over the input (libm beyond it, as the eager kernels do)
HOT_FIXUP = frozenset(name for name in HOT_UNARY if range_limited(UNARY[name].cpu))
#: hot unary operations whose output never shares the input's storage: those calling
#: vectorised math (LLVM runs the vector loop only where output and input do not
#: overlap: in place, ``exp`` at 4e6 took 2.5x as long) and those with a fix-up pass
#: (it reads the input again)
HOT_APART = HOT_FIXUP | frozenset(
    name for name in HOT_UNARY if libm_expr(UNARY[name].cpu) != UNARY[name].cpu)
#: binary operations with dedicated loops for three operand modes: both vectors, a
#: vector and a scalar second operand, a scalar and a vector second operand
HOT_BINARY = tuple(name for name, op in BINARY.items() if op.tape == "hot")
#: the generic loops' operations: the table's (but the ``cold`` ones, whose code is
#: large and slow to compile: they run as eager steps between native segments), and for
#: one operand the conversions that are no table op
GENERIC_UNARY: dict[str, ScalarOp] = {
    **{name: op for name, op in UNARY.items() if op.tape != "cold"}, **CASTS}
GENERIC_BINARY = {name: op for name, op in BINARY.items() if op.tape != "cold"}
GENERIC_TERNARY = {name: op for name, op in TERNARY.items() if op.tape != "cold"}

# structural opcodes
OP_LOOP = 1
OP_ENDLOOP = 2
OP_SETITER = 3
OP_FILL = 4
OP_COPY = 5
OP_UGEN = 6
OP_BGEN = 7
OP_TGEN = 8
OP_SUM = 9
OP_STRIP = 10
OP_MATMUL = 11
OP_STRIDED = 12
OP_ENDSTRIP = 13
OP_GATHER = 14
OP_SCATTER_ADD = 15
OP_FIRST_HOT = 32

UNARY_CODE: dict[str, int] = {}
BINARY_CODE: dict[str, int] = {}
for _k, _name in enumerate(HOT_UNARY):
    UNARY_CODE[_name] = OP_FIRST_HOT + _k
for _k, _name in enumerate(HOT_BINARY):
    BINARY_CODE[_name] = OP_FIRST_HOT + len(HOT_UNARY) + _k

#: sub-opcodes of the generic loops
UNARY_SUB: dict[str, int] = {name: k for k, name in
                             enumerate(list(UNARY) + list(CASTS))}
BINARY_SUB: dict[str, int] = {name: k for k, name in enumerate(BINARY)}
TERNARY_SUB: dict[str, int] = {name: k for k, name in enumerate(TERNARY)}
#: per operand count: the scalar operations the interpreter runs
SCALAR_OPS: dict[int, dict[str, ScalarOp]] = {1: GENERIC_UNARY, 2: GENERIC_BINARY,
                                              3: GENERIC_TERNARY}

OP_NAMES = {OP_LOOP: "LOOP", OP_ENDLOOP: "ENDLOOP", OP_SETITER: "SETITER", OP_FILL: "FILL",
            OP_COPY: "COPY", OP_UGEN: "UNARY", OP_BGEN: "BINARY", OP_TGEN: "TERNARY",
            OP_SUM: "SUM", OP_MATMUL: "MATMUL", OP_STRIDED: "STRIDED", OP_GATHER: "GATHER",
            OP_SCATTER_ADD: "SCATTER_ADD", OP_STRIP: "STRIP", OP_ENDSTRIP: "ENDSTRIP"}
OP_NAMES.update({code: name.upper() for name, code in UNARY_CODE.items()})
OP_NAMES.update({code: name.upper() for name, code in BINARY_CODE.items()})

MAX_DEPTH = 32  # loop nesting
#: operand offsets at or above SLOT address slot ``offset >> SLOT_SHIFT`` (not the pool)
SLOT_SHIFT = 40
SLOT = 1 << SLOT_SHIFT

#: the eager kernels' prelude: the same imports and Numba options
_HEADER = _ew.NJIT_PRELUDE + "from nbgrad.jit.tier1.pointers import view_at\n"


def _scalar_fn(name: str, params: str, cases: list[tuple[int, str, str]], default: str) -> str:
    lines = ["", "", "@njit(**OPTS)", f"def {name}(op, {params}):"]
    for k, (code, expr, kind) in enumerate(cases):
        kw = "if" if k == 0 else "elif"
        lines.append(f"    {kw} op == {code}:")
        lines.append(f"        return 1.0 if ({expr}) else 0.0" if kind == "bool"
                     else f"        return {expr}")
    lines.append(f"    return {default}")
    return "\n".join(lines) + "\n"


_RUN_HEAD = '''

@njit(**OPTS)
def run(ins, start, stop, buf, fp, ia, ext):
    """Execute instructions [start, stop) of a tape (see nbgrad.jit.tier1.interpreter)."""
    loop_pc = np.zeros({depth}, np.int64)
    loop_it = np.zeros({depth}, np.int64)
    loop_n = np.zeros({depth}, np.int64)
    sp = -1
    it = 0
    so = 0   # the strip's offset
    sl = 0   # the strip's length
    spc = 0  # the pc of the STRIP
    pc = start
    while pc < stop:
        op = ins[pc, 0]
        if op == {STRIP}:
            spc = pc
            so = 0
            sl = min(ins[pc, 11], ins[pc, 9])
            pc += 1
            continue
        if op == {ENDSTRIP}:
            so += ins[spc, 11]
            if so < ins[spc, 9]:
                sl = min(ins[spc, 11], ins[spc, 9] - so)
                pc = spc + 1
            else:
                pc += 1
            continue
        if op == {LOOP}:
            if ins[pc, 9] <= 0:
                pc = ins[pc, 10] + 1
                continue
            sp += 1
            loop_pc[sp] = pc
            loop_it[sp] = 0
            loop_n[sp] = ins[pc, 9]
            it = 0
            pc += 1
            continue
        if op == {ENDLOOP}:
            nxt = loop_it[sp] + 1
            if nxt < loop_n[sp]:
                loop_it[sp] = nxt
                it = nxt
                pc = loop_pc[sp] + 1
            else:
                sp -= 1
                it = loop_it[sp] if sp >= 0 else 0
                pc += 1
            continue
        oo = ins[pc, 1] + it * ins[pc, 5]
        oa = ins[pc, 2] + it * ins[pc, 6]
        ob = ins[pc, 3] + it * ins[pc, 7]
        oc = ins[pc, 4] + it * ins[pc, 8]
        n = ins[pc, 9]
        m = ins[pc, 10]
        k = ins[pc, 11]
        pp = ins[pc, 12]
        f = ins[pc, 13]
        g = ins[pc, 14]
        h = ins[pc, 15]
        t = ins[pc, 16]
        pc += 1
        O = buf
        A = buf
        B = buf
        C = buf
        if oo >= {SLOT}:
            O = view_at(ext, oo >> {SHIFT}, buf)
            oo = oo & {MASK}
        if oa >= {SLOT}:
            A = view_at(ext, oa >> {SHIFT}, buf)
            oa = oa & {MASK}
        if ob >= {SLOT}:
            B = view_at(ext, ob >> {SHIFT}, buf)
            ob = ob & {MASK}
        if oc >= {SLOT}:
            C = view_at(ext, oc >> {SHIFT}, buf)
            oc = oc & {MASK}
        if t != 0:
            if t & 1:
                oo += so
            if t & 2:
                oa += so
            if t & 4:
                ob += so
            if t & 8:
                oc += so
            n = sl
'''

_UNARY_HOT = '''        elif op == {code}:  # {name}
            out = O[oo:oo + n]
            xs = A[oa:oa + n]
            p0 = fp[pp]
            p1 = fp[pp + 1]
            for i in range(n):
                x = xs[i]
                out[i] = {expr}
{fixup}'''

#: the second pass of a :data:`HOT_FIXUP` loop
_FIXUP = '''            for i in range(n):
                x = xs[i]
                if abs(x) > TRIG_MAX:
                    out[i] = {expr}
'''

_BINARY_HOT = '''        elif op == {code}:  # {name}
            for r in range(m):
                out = O[oo + r * n:oo + r * n + n]
                if f == 0:
                    av = A[oa + r * g:oa + r * g + n]
                    bv = B[ob + r * h:ob + r * h + n]
                    for i in range(n):
                        a = av[i]
                        b = bv[i]
                        out[i] = {expr}
                elif f == 1:
                    av = A[oa + r * g:oa + r * g + n]
                    b = B[ob + r * h]
                    for i in range(n):
                        a = av[i]
                        out[i] = {expr}
                else:
                    a = A[oa + r * g]
                    bv = B[ob + r * h:ob + r * h + n]
                    for i in range(n):
                        b = bv[i]
                        out[i] = {expr}
'''

_RUN_BODY = '''        elif op == {UGEN}:
            out = O[oo:oo + n]
            xs = A[oa:oa + n]
            p0 = fp[pp]
            p1 = fp[pp + 1]
            for i in range(n):
                out[i] = uscalar(k, xs[i], p0, p1)
        elif op == {BGEN}:
            for r in range(m):
                out = O[oo + r * n:oo + r * n + n]
                if f == 0:
                    av = A[oa + r * g:oa + r * g + n]
                    bv = B[ob + r * h:ob + r * h + n]
                    for i in range(n):
                        out[i] = bscalar(k, av[i], bv[i])
                elif f == 1:
                    av = A[oa + r * g:oa + r * g + n]
                    b = B[ob + r * h]
                    for i in range(n):
                        out[i] = bscalar(k, av[i], b)
                else:
                    a = A[oa + r * g]
                    bv = B[ob + r * h:ob + r * h + n]
                    for i in range(n):
                        out[i] = bscalar(k, a, bv[i])
        elif op == {TGEN}:
            out = O[oo:oo + n]
            sa_ = 0 if f & 1 else 1
            sb_ = 0 if f & 2 else 1
            sc_ = 0 if f & 4 else 1
            for i in range(n):
                out[i] = tscalar(k, C[oc + i * sc_], A[oa + i * sa_], B[ob + i * sb_])
        elif op == {FILL}:
            out = O[oo:oo + n]
            v = fp[pp]
            for i in range(n):
                out[i] = v
        elif op == {COPY}:
            out = O[oo:oo + n]
            xs = A[oa:oa + n]
            for i in range(n):
                out[i] = xs[i]
        elif op == {SETITER}:
            O[oo] = n + m * it
        elif op == {SUM}:
            # (A, R, B) = (n, m, k); f == 1: mean (divide by R)
            if k == 1:
                for a_ in range(n):
                    row = A[oa + a_ * m:oa + (a_ + 1) * m]
                    s = 0.0
                    for r in range(m):
                        s += row[r]
                    O[oo + a_] = s
                    if f == 1:
                        O[oo + a_] = O[oo + a_] / m
            else:
                acc = np.zeros(k, np.float64)
                for a_ in range(n):
                    for j in range(k):
                        acc[j] = 0.0
                    for r in range(m):
                        row = A[oa + (a_ * m + r) * k:oa + (a_ * m + r + 1) * k]
                        for j in range(k):
                            acc[j] += row[j]
                    o = O[oo + a_ * k:oo + (a_ + 1) * k]
                    for j in range(k):
                        o[j] = acc[j]
                    if f == 1:
                        for j in range(k):
                            o[j] = o[j] / m
        elif op == {MATMUL}:
            # C[n, m] = A[n, k] @ B[k, m], g batches; A is read with strides (ia[pp + 2],
            # ia[pp + 3]) over (i, t) and B with (ia[pp + 4], ia[pp + 5]) over (t, j), so
            # a transposed A needs no copy for a matrix-vector product; batch strides
            # ia[pp], ia[pp + 1]. f == 1: both operands plain row-major: np.dot
            sa_ = ia[pp]
            sb_ = ia[pp + 1]
            ai = ia[pp + 2]
            at = ia[pp + 3]
            bt = ia[pp + 4]
            bj = ia[pp + 5]
            for q in range(g):
                a0 = oa + q * sa_
                b0 = ob + q * sb_
                c0 = oo + q * n * m
                if f == 1:
                    np.dot(A[a0:a0 + n * k].reshape((n, k)),
                           B[b0:b0 + k * m].reshape((k, m)),
                           O[c0:c0 + n * m].reshape((n, m)))
                elif m == 1 and at == 1 and bt == 1:
                    # matrix-vector, rows of A contiguous
                    xv = B[b0:b0 + k]
                    cv = O[c0:c0 + n]
                    for i in range(n):
                        row = A[a0 + i * ai:a0 + i * ai + k]
                        s = 0.0
                        for t in range(k):
                            s += row[t] * xv[t]
                        cv[i] = s
                elif m == 1 and ai == 1 and bt == 1:
                    # transposed matrix-vector: A stored (k, n)
                    cv = O[c0:c0 + n]
                    for i in range(n):
                        cv[i] = 0.0
                    for t in range(k):
                        row = A[a0 + t * at:a0 + t * at + n]
                        xt = B[b0 + t]
                        for i in range(n):
                            cv[i] += row[i] * xt
        elif op == {STRIDED}:
            # out (contiguous) <- a read with 4-d shape ia[pp:pp+4], strides ia[pp+4:pp+8]
            s0 = ia[pp]
            s1 = ia[pp + 1]
            s2 = ia[pp + 2]
            s3 = ia[pp + 3]
            t0 = ia[pp + 4]
            t1 = ia[pp + 5]
            t2 = ia[pp + 6]
            t3 = ia[pp + 7]
            q = oo
            for i0 in range(s0):
                for i1 in range(s1):
                    for i2 in range(s2):
                        src = oa + i0 * t0 + i1 * t1 + i2 * t2
                        out = O[q:q + s3]
                        if t3 == 1:
                            xs = A[src:src + s3]
                            for j in range(s3):
                                out[j] = xs[j]
                        else:
                            for j in range(s3):
                                out[j] = A[src + j * t3]
                        q += s3
        elif op == {GATHER}:
            out = O[oo:oo + n]
            pos = ia[pp:pp + n]
            for i in range(n):
                out[i] = A[oa + pos[i]]
        elif op == {SCATTER_ADD}:
            # f & 1: zero m elements of out first; then out[pos[i]] += a[i], or
            # out[pos[i]] = a[i] when f & 2
            if f & 1:
                out = O[oo:oo + m]
                for i in range(m):
                    out[i] = 0.0
            pos = ia[pp:pp + n]
            src = A[oa:oa + n]
            if f & 2:
                for i in range(n):
                    O[oo + pos[i]] = src[i]
            else:
                for i in range(n):
                    O[oo + pos[i]] += src[i]
        else:
            raise ValueError("nbgrad.jit: bad opcode in tape")
'''


def source() -> str:
    """The interpreter module's source (deterministic: its hash names the cache file)."""
    parts = [_HEADER]
    ucases = [(UNARY_SUB[n], scalar_cpu(op), op.kind) for n, op in GENERIC_UNARY.items()]
    parts.append(_scalar_fn("uscalar", "x, p0, p1", ucases, "x"))
    parts.append(_scalar_fn("bscalar", "a, b", [(BINARY_SUB[n], scalar_cpu(op), op.kind)
                                                 for n, op in GENERIC_BINARY.items()], "a"))
    parts.append(_scalar_fn("tscalar", "c, a, b", [(TERNARY_SUB[n], scalar_cpu(op), op.kind)
                                                    for n, op in GENERIC_TERNARY.items()],
                            "a"))
    consts = dict(LOOP=OP_LOOP, ENDLOOP=OP_ENDLOOP, SETITER=OP_SETITER, FILL=OP_FILL,
                  COPY=OP_COPY, UGEN=OP_UGEN, BGEN=OP_BGEN, TGEN=OP_TGEN, SUM=OP_SUM,
                  MATMUL=OP_MATMUL, STRIDED=OP_STRIDED, GATHER=OP_GATHER,
                  SCATTER_ADD=OP_SCATTER_ADD, STRIP=OP_STRIP, ENDSTRIP=OP_ENDSTRIP,
                  depth=MAX_DEPTH, SLOT=SLOT,
                  SHIFT=SLOT_SHIFT, MASK=SLOT - 1)
    parts.append(_RUN_HEAD.format(**consts))
    first = True
    for name in HOT_UNARY:
        op = UNARY[name]
        text = _UNARY_HOT.format(code=UNARY_CODE[name], name=name,
                                 expr=op.cpu if name in HOT_FIXUP else scalar_cpu(op),
                                 fixup=_FIXUP.format(expr=op.expr) if name in HOT_FIXUP
                                 else "")
        if first:
            text = text.replace("        elif", "        if", 1)
            first = False
        parts.append(text)
    for name in HOT_BINARY:
        parts.append(_BINARY_HOT.format(code=BINARY_CODE[name], name=name,
                                        expr=scalar_cpu(BINARY[name])))
    parts.append(_RUN_BODY.format(**consts))
    return "".join(parts)


_MODULE = None
_LOCK = threading.Lock()


def module():
    """The generated interpreter module (written to the cache folder on first use)."""
    global _MODULE
    if _MODULE is None:
        with _LOCK:
            if _MODULE is None:
                _MODULE = codegen.load_module("jit_interpreter", source())
    return _MODULE


def run_function():
    """The ``run(ins, start, stop, buf, fp, ia, ext)`` dispatcher."""
    return module().run


#: argument types of ``run`` that a tape needed while they were not compiled (see
#: :func:`ready`), for :func:`build_pending`
PENDING: dict[tuple, None] = {}
#: whether a tape whose ``run`` is not built runs eager ops meanwhile (False: it compiles
#: ``run`` first, as ``NBGRAD_TIER1_BACKGROUND=0`` asks, the test suite for one, and as
#: happens after a background build failed)
BACKGROUND = os.environ.get("NBGRAD_TIER1_BACKGROUND", "1") != "0"
#: seconds of eager stand-in runs after which tapes wait for the build instead (it costs
#: about ten seconds; a program that keeps calling would run slow eager replays, and
#: hold the GIL that the build needs, for as long as it kept calling)
FALLBACK_BUDGET_S = 1.0
#: seconds spent in eager stand-in runs so far (``[seconds]``, added to by the tapes)
FALLBACK_SPENT = [0.0]


def ready(args: tuple) -> bool:
    """Whether ``run(*args)`` runs without compiling: its types are compiled in this
    process or load from Numba's disk cache (loaded now). Otherwise the types join
    :data:`PENDING` and the caller runs its graph another way."""
    run = run_function()
    tys = tuple(run.typeof_pyval(a) for a in args)
    if tys in run.overloads or not BACKGROUND:
        return True
    try:  # Numba's cache index, read without compiling (private API: see except)
        cache = run._cache
        cached = cache._index_key(tys, run.targetctx.codegen()) in \
            cache._cache_file._load_index()
    except Exception:  # a Numba without these internals: compile on first run
        return True
    if cached or FALLBACK_SPENT[0] >= FALLBACK_BUDGET_S:
        # a load (a stale entry compiles here, as it used to); past the budget, the
        # compile, or the wait for the background build (Numba's compiler lock)
        run.compile(tys)
        PENDING.pop(tys, None)
        return True
    PENDING.setdefault(tys, None)
    return False


def build_pending() -> None:
    """Compile ``run`` for every type in :data:`PENDING` (slow: run it in a thread)."""
    run = run_function()
    while PENDING:
        tys = next(iter(PENDING))
        run.compile(tys)
        PENDING.pop(tys, None)
