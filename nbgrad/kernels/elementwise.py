"""Elementwise ops as scalar expressions, and the Numba kernels generated from them.

Each op is one scalar expression: unary ones in ``x`` (and float parameters ``p0``,
``p1``), binary ones in ``a`` and ``b``. The same expressions feed the eager CPU
kernels generated here, the jit compiler's fused loops and the CUDA kernels, so an
op's arithmetic is written once.
"""

from __future__ import annotations

import contextvars
import hashlib
import re
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from numba import njit

from .. import codegen
from . import parallel, scalar, vecmath
from .layout import c_contiguous

#: CPU code calls these vectorisable versions (:mod:`nbgrad.kernels.vecmath`) instead of
#: the libm functions that expressions name (CUDA keeps the expressions as written:
#: libdevice); ``sigmoid`` and ``softplus`` are :mod:`nbgrad.kernels.scalar` helpers
VECTOR_MATH = {"math.exp": "vexp", "math.expm1": "vexpm1", "math.log": "vlog",
               "math.log1p": "vlog1p", "math.sin": "vsin", "math.cos": "vcos",
               "math.tan": "vtan", "math.tanh": "vtanh", "math.atan": "vatan",
               "math.erf": "verf", "sigmoid": "vsigmoid", "softplus": "vsoftplus"}
#: vectorised functions exact only for ``|x| <= vecmath.TRIG_MAX``: a loop that calls
#: them redoes larger arguments with the libm expression (see :func:`libm_expr`)
RANGE_LIMITED = ("vsin", "vcos", "vtan")
_VECTOR_CALL = re.compile(r"(?<![\w.])(" + "|".join(re.escape(k) for k in VECTOR_MATH)
                          + r")\(")
_LIBM_CALL = re.compile(r"\b(" + "|".join(VECTOR_MATH.values()) + r")\(")
_LIBM = {v: k for k, v in VECTOR_MATH.items()}


def vector_expr(expr: str) -> str:
    """``expr`` with libm calls replaced by their vectorisable versions (CPU code)."""
    return _VECTOR_CALL.sub(lambda m: VECTOR_MATH[m.group(1)] + "(", expr)


def libm_expr(text: str) -> str:
    """The inverse of :func:`vector_expr` on generated code: libm calls again."""
    return _LIBM_CALL.sub(lambda m: _LIBM[m.group(1)] + "(", text)


def scalar_cpu(op: ScalarOp) -> str:
    """The CPU expression for loops without a fix-up pass: libm where range-limited."""
    return op.expr if range_limited(op.cpu) else op.cpu


def range_limited(text: str) -> bool:
    """Whether CPU code ``text`` calls a function exact only up to ``TRIG_MAX``."""
    return any(re.search(rf"\b{f}\(", text) for f in RANGE_LIMITED)


@dataclass(frozen=True)
class ScalarOp:
    """One elementwise operation: its scalar expression and how executors treat it."""

    name: str
    expr: str
    params: tuple[str, ...] = ()  # op arguments passed as p0, p1
    kind: str = "float"  # "float": inputs become floating; "same": keeps ints; "bool": -> bool
    #: the tier-1 interpreter's treatment: "hot" (a dedicated loop), "generic" (the
    #: generic loop's sub-opcode) or "cold" (left out: large and slow to compile; the op
    #: runs as an eager step)
    tape: str = "generic"
    #: ``a op b == b op a`` (declared; no executor needs it at present)
    commutative: bool = False
    #: the CPU expression where it is not ``vector_expr(expr)``
    cpu_override: str | None = None
    #: a NumPy ufunc giving bit for bit the kernel's values on float operands of one dtype
    #: (IEEE-rounded arithmetic and comparisons): eager's general broadcast, and arrays under
    #: :data:`UFUNC_MAX` elements, call it rather than compiling ``bcast_<name>`` or
    #: ``binary_<name>`` (about 0.3 s per op on a cold start)
    ufunc: str | None = None
    #: sets of operand positions whose zeros, together, make the result zero whatever the
    #: other operands are, in exact arithmetic (``mul``: ``((0,), (1,))``; ``where``:
    #: ``((1, 2),)``): a reversed loop drops the cotangents that stay zero by them
    zeros: tuple[tuple[int, ...], ...] = ()
    #: ``(p, q)`` pairs: with operand ``p`` zero, the result is operand ``q`` (``a + 0``)
    zero_identity: tuple[tuple[int, int], ...] = ()

    @cached_property
    def cpu(self) -> str:
        """The expression CPU code compiles: vectorisable math (:data:`VECTOR_MATH`)."""
        return self.cpu_override or vector_expr(self.expr)


def _u(name, expr, params=(), kind="float", tape="generic", commutative=False, cpu=None,
       ufunc=None, zeros=(), zero_identity=()):
    return ScalarOp(name, expr, tuple(params), kind, tape, commutative, cpu, ufunc, zeros,
                    zero_identity)


UNARY: dict[str, ScalarOp] = {op.name: op for op in [
    _u("neg", "-x", kind="same", tape="hot", ufunc="negative", zeros=((0,),)),
    _u("abs", "abs(x)", kind="same", tape="hot"),
    _u("sign", "sign(x)", kind="same"),
    _u("square", "x * x", kind="same"),
    _u("exp", "math.exp(x)", tape="hot"),
    _u("expm1", "math.expm1(x)"),
    _u("log", "math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)", cpu="vlog(x)"),
    _u("log1p", "math.log1p(x) if x > -1 else (-math.inf if x == -1 else math.nan)",
       cpu="vlog1p(x)"),
    _u("log2", "math.log2(x) if x > 0 else (-math.inf if x == 0 else math.nan)"),
    _u("log10", "math.log10(x) if x > 0 else (-math.inf if x == 0 else math.nan)"),
    _u("sqrt", "math.sqrt(x) if x >= 0 else math.nan"),
    _u("rsqrt", "1.0 / math.sqrt(x) if x > 0 else (math.inf if x == 0 else math.nan)"),
    _u("reciprocal", "1.0 / x if x != 0 else math.copysign(math.inf, x)"),
    _u("sin", "math.sin(x)", tape="hot"),
    _u("cos", "math.cos(x)", tape="hot"),
    _u("tan", "math.tan(x)"),
    _u("asin", "math.asin(x) if -1 <= x <= 1 else math.nan"),
    _u("acos", "math.acos(x) if -1 <= x <= 1 else math.nan"),
    _u("atan", "math.atan(x)"),
    _u("sinh", "math.sinh(x)"),
    _u("cosh", "math.cosh(x)"),
    _u("tanh", "math.tanh(x)", tape="hot"),
    _u("asinh", "math.asinh(x)"),
    _u("acosh", "math.acosh(x) if x >= 1 else math.nan"),
    _u("atanh", "math.atanh(x) if -1 < x < 1 else "
                "(math.copysign(math.inf, x) if abs(x) == 1 else math.nan)"),
    _u("sigmoid", "sigmoid(x)"),
    _u("relu", "relu(x)"),
    _u("softplus", "softplus(x, p0, p1)", ("beta", "threshold")),
    _u("erf", "math.erf(x)"),
    _u("erfc", "math.erfc(x)"),
    # special functions (nbgrad.special); their helpers are long: eager steps in tier 1
    _u("erfinv", "erfinv(x)", tape="cold"),
    _u("erfcx", "erfcx(x)", tape="cold"),
    _u("ndtri", "ndtri(x)", tape="cold"),
    _u("log_ndtr", "log_ndtr(x)", tape="cold"),
    _u("i0", "bessel_i0(x)", tape="cold"),
    _u("i0e", "bessel_i0e(x)", tape="cold"),
    _u("i1", "bessel_i1(x)", tape="cold"),
    _u("i1e", "bessel_i1e(x)", tape="cold"),
    _u("floor", "np.floor(x)"),
    _u("ceil", "np.ceil(x)"),
    _u("round", "np.rint(x)"),
    _u("trunc", "np.trunc(x)"),
    _u("lgamma", "math.lgamma(x) if not (x <= 0 and x == np.floor(x)) else math.inf",
       tape="cold"),
    _u("digamma", "digamma(x)", tape="cold"),
    _u("polygamma", "polygamma(int(p0), x)", ("n",), tape="cold"),
    _u("clamp", "x if x != x else min(max(x, p0), p1)", ("min", "max"), kind="same"),
    _u("logical_not", "not x", kind="bool"),
    _u("bitwise_not", "~x", kind="same", tape="cold"),  # integers only (bools: logical_not)
    # activations of nbgrad.nn.functional (public functions in nbgrad/ops/nn.py)
    _u("leaky_relu", "x if x > 0 else x * p0", ("negative_slope",)),
    _u("elu", "x if x > 0 else p0 * math.expm1(x)", ("alpha",)),
    _u("gelu", "gelu(x, p0)", ("approximate",), tape="cold"),
    _u("silu", "x * sigmoid(x)"),
]}

BINARY: dict[str, ScalarOp] = {op.name: op for op in [
    _u("add", "a + b", kind="same", tape="hot", commutative=True, ufunc="add",
       zeros=((0, 1),), zero_identity=((0, 1), (1, 0))),
    _u("sub", "a - b", kind="same", tape="hot", ufunc="subtract", zeros=((0, 1),),
       zero_identity=((1, 0),)),
    _u("mul", "a * b", kind="same", tape="hot", commutative=True, ufunc="multiply",
       zeros=((0,), (1,))),
    _u("div", "a / b", tape="hot", ufunc="divide", zeros=((0,),)),
    _u("pow", "a ** b", cpu="vpow(a, b)"),
    _u("maximum", "a if (a > b or a != a) else b", kind="same"),
    _u("minimum", "a if (a < b or a != a) else b", kind="same"),
    _u("atan2", "math.atan2(a, b)"),
    _u("fmod", "np.fmod(a, b)"),
    # integer operands stay integers (exact; a zero divisor raises), see kernels.scalar
    _u("remainder", "remainder(a, b)", kind="same"),
    _u("floor_divide", "floor_divide(a, b)", kind="same"),
    _u("hypot", "math.hypot(a, b)"),
    _u("copysign", "math.copysign(a, b)"),
    _u("eq", "a == b", kind="bool", ufunc="equal"),
    _u("ne", "a != b", kind="bool", ufunc="not_equal"),
    _u("lt", "a < b", kind="bool", ufunc="less"),
    _u("le", "a <= b", kind="bool", ufunc="less_equal"),
    _u("gt", "a > b", kind="bool", ufunc="greater"),
    _u("ge", "a >= b", kind="bool", ufunc="greater_equal"),
    _u("logical_and", "bool(a) and bool(b)", kind="bool"),
    _u("logical_or", "bool(a) or bool(b)", kind="bool"),
    _u("logical_xor", "bool(a) != bool(b)", kind="bool"),
    # integer and bool operands only (the public functions refuse floats, as NumPy; the
    # interpreter's generic float loops cannot hold them, so they run as eager steps there)
    _u("bitwise_and", "a & b", kind="same", tape="cold", commutative=True),
    _u("bitwise_or", "a | b", kind="same", tape="cold", commutative=True),
    _u("bitwise_xor", "a ^ b", kind="same", tape="cold", commutative=True),
    # shifts by a negative count or by the width or more give what NumPy gives (C leaves
    # them undefined): 0, or -1 for a negative number shifted right
    _u("bitwise_left_shift", "a << b if 0 <= b < 64 else a * 0", kind="same", tape="cold"),
    _u("bitwise_right_shift", "a >> b if 0 <= b < 64 else (a * 0 - 1 if a < 0 else a * 0)",
       kind="same", tape="cold"),
]}

# ``where(cond, a, b)`` and ``lerp(a, b, w)``: three operands, broadcast together
TERNARY: dict[str, ScalarOp] = {op.name: op for op in [
    _u("where", "a if c else b", kind="same", zeros=((1, 2),)),
    _u("lerp", "a + c * (b - a)"),
]}

#: conversions that are no table op (the :class:`~nbgrad.ops.traits.Cast` kind's
#: ``to_dtype`` runs them): their scalar expressions, for executors that fuse them
CASTS: dict[str, ScalarOp] = {op.name: op for op in [
    _u("to_bool", "x != 0", kind="bool"),
]}



def _scalar_import() -> str:
    names = sorted(n for n, v in vars(scalar).items() if not n.startswith("_") and callable(v)
                   and getattr(v, "__module__", None) == scalar.__name__)
    # the digest makes a generated module's text (so its file and Numba cache) change with
    # the helpers' code, which Numba's cache of the importing module does not track
    digest = hashlib.sha256(Path(scalar.__file__).read_bytes()
                            + Path(vecmath.__file__).read_bytes()).hexdigest()[:16]
    return (f"# nbgrad.kernels.scalar {digest}\n"
            f"from nbgrad.kernels.scalar import {', '.join(names)}\n"
            f"from nbgrad.kernels.vecmath import {', '.join(sorted(vecmath.__all__))}")


#: the import lines of generated modules: every public helper of ``nbgrad.kernels.scalar``
#: and the vectorisable math of ``nbgrad.kernels.vecmath``
SCALAR_IMPORT = _scalar_import()

#: the Numba options of the generated kernels: the eager ones (:func:`kernel_function`)
#: and tier 1's interpreter (``OPTS`` in its module)
KERNEL_OPTS = dict(cache=True, nogil=True, error_model="numpy")
_OPTS_LINE = "OPTS = dict(" + ", ".join(f"{k}={v!r}".replace("'", '"')
                                      for k, v in KERNEL_OPTS.items()) + ")\n"
_IMPORTS = "import math\n\nimport numpy as np\n"

#: the start of a generated module of ``@njit(**OPTS)`` functions (tier 1's interpreter)
NJIT_PRELUDE = f"{_IMPORTS}from numba import njit\n\n{SCALAR_IMPORT}\n\n{_OPTS_LINE}"

_PRELUDE = f"""{_IMPORTS}
{SCALAR_IMPORT}

# Plain functions: nbgrad.kernels.elementwise.kernel_function makes each a Numba
# dispatcher when it is first asked for, with njit(**KERNEL_OPTS)
"""

_UNARY_TEMPLATE = '''

def unary_{name}(xs, out, p0, p1):
    for i in range(xs.size):
        x = xs[i]
        out[i] = {expr}
'''

# sin/cos/tan: the arguments beyond TRIG_MAX again through libm (a second cheap pass
# keeps the first loop vectorisable)
_UNARY_FIXUP = '''    for i in range(xs.size):
        x = xs[i]
        if abs(x) > TRIG_MAX:
            out[i] = {expr}
'''

# modes: 0 same size, 1 b is a scalar, 2 a is a scalar; the general broadcast (strides;
# ``idx``: zeros, one per dimension) is ``bcast_<name>``, a function of its own: most
# programs never need its code, which costs twice the rest to compile
_BINARY_TEMPLATE = '''

def binary_{name}(av, bv, out, mode, shape, sa, sb):
    n = out.size
    if n == 0:
        return
    if mode == 0:
        for i in range(n):
            a = av[i]
            b = bv[i]
            out[i] = {expr}
    elif mode == 1:
        b = bv[0]
        for i in range(n):
            a = av[i]
            out[i] = {expr}
    elif mode == 2:
        a = av[0]
        for i in range(n):
            b = bv[i]
            out[i] = {expr}
    else:
        raise ValueError("binary_{name}: the general broadcast is bcast_{name}")


def bcast_{name}(av, bv, out, shape, sa, sb, idx):
    n = out.size
    if n == 0:
        return
    nd = shape.size
    inner = shape[nd - 1]
    ia = sa[nd - 1]
    ib = sb[nd - 1]
    offa = 0
    offb = 0
    for o in range(n // inner):
        base = o * inner
        for j in range(inner):
            a = av[offa + j * ia]
            b = bv[offb + j * ib]
            out[base + j] = {expr}
        d = nd - 2
        while d >= 0:
            idx[d] += 1
            offa += sa[d]
            offb += sb[d]
            if idx[d] < shape[d]:
                break
            offa -= sa[d] * shape[d]
            offb -= sb[d] * shape[d]
            idx[d] = 0
            d -= 1
'''

# modes: 0 all the same shape, 1 like 0 but b is a scalar, 2 like 0 but a is a scalar,
# 3 general broadcast (strides)
_TERNARY_TEMPLATE = '''

def ternary_{name}(cv, av, bv, out, mode, shape, sc, sa, sb):
    n = out.size
    if n == 0:
        return
    if mode == 0:
        for i in range(n):
            c = cv[i]
            a = av[i]
            b = bv[i]
            out[i] = {expr}
        return
    if mode == 1:
        b = bv[0]
        for i in range(n):
            c = cv[i]
            a = av[i]
            out[i] = {expr}
        return
    if mode == 2:
        a = av[0]
        for i in range(n):
            c = cv[i]
            b = bv[i]
            out[i] = {expr}
        return
    nd = shape.size
    inner = shape[nd - 1]
    ic = sc[nd - 1]
    ia = sa[nd - 1]
    ib = sb[nd - 1]
    idx = np.zeros(nd, np.int64)
    offc = 0
    offa = 0
    offb = 0
    for o in range(n // inner):
        base = o * inner
        for j in range(inner):
            c = cv[offc + j * ic]
            a = av[offa + j * ia]
            b = bv[offb + j * ib]
            out[base + j] = {expr}
        d = nd - 2
        while d >= 0:
            idx[d] += 1
            offc += sc[d]
            offa += sa[d]
            offb += sb[d]
            if idx[d] < shape[d]:
                break
            offc -= sc[d] * shape[d]
            offa -= sa[d] * shape[d]
            offb -= sb[d] * shape[d]
            idx[d] = 0
            d -= 1
'''


def kernel_source() -> str:
    """The readable source of every eager elementwise kernel."""
    parts = [_PRELUDE]
    for op in UNARY.values():
        parts.append(_UNARY_TEMPLATE.format(name=op.name, expr=op.cpu))
        if range_limited(op.cpu):
            if not re.fullmatch(r"\w+\(x\)", op.cpu):  # the fix-up tests x itself
                raise RuntimeError(f"elementwise op {op.name!r}: {op.cpu!r} calls a "
                                   "range-limited function on something other than x")
            parts.append(_UNARY_FIXUP.format(expr=op.expr))
    for table, template in ((BINARY, _BINARY_TEMPLATE), (TERNARY, _TERNARY_TEMPLATE)):
        for op in table.values():
            if range_limited(op.cpu):
                raise RuntimeError(f"elementwise op {op.name!r}: range-limited {op.cpu!r} "
                                   "has no fix-up pass in binary or ternary kernels")
            parts.append(template.format(name=op.name, expr=op.cpu))
    return "".join(parts)


_MODULE = None


def kernels():
    """The generated kernel module (written to the cache folder on first use)."""
    global _MODULE
    if _MODULE is None:
        _MODULE = codegen.load_module("elementwise", kernel_source())
    return _MODULE


EMPTY = np.zeros(0, np.int64)


def broadcast_strides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> np.ndarray:
    """Element strides of a C-contiguous array of ``shape`` read as ``out_shape``."""
    nd = len(out_shape)
    padded = (1,) * (nd - len(shape)) + tuple(shape)
    strides = np.zeros(nd, np.int64)
    step = 1
    for d in range(nd - 1, -1, -1):
        strides[d] = 0 if padded[d] == 1 else step
        step *= padded[d]
    return strides


def broadcast_shape(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy's broadcast of ``shapes``, or a RuntimeError naming the op and the shapes."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        listed = " and ".join(str(tuple(s)) for s in shapes)
        raise RuntimeError(f"{op}: shapes {listed} cannot be broadcast together") from None


try:  # NumPy's error state for one call, without np.errstate's cost (~2 us a use)
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    _QUIET = _make_extobj(all="ignore")
    #: ``(set, reset, state)``: ``token = set(state)`` turns NumPy's floating-point
    #: warnings off for this context until ``reset(token)`` (as the kernels: no
    #: warnings); None on a NumPy without that context variable
    QUIET = (_extobj_contextvar.set, _extobj_contextvar.reset, _QUIET)
    _QUIET_CONTEXT = contextvars.Context()  # empty, but for QUIET's error state
    _QUIET_CONTEXT.run(_extobj_contextvar.set, _QUIET)
    #: ``run(ufunc, *arrays)``: the call in a context whose error state is QUIET's, a
    #: tenth of the cost of setting and resetting the variable around it; for NumPy's
    #: ufuncs on plain arrays only (no Python code runs in that shared context). One
    #: thread at a time enters it: where another is inside (a ufunc that released the
    #: GIL), it raises RuntimeError, and the caller sets the error state itself.
    QUIET_RUN = _QUIET_CONTEXT.run
except Exception:  # noqa: BLE001 - another NumPy layout: np.errstate then
    _extobj_contextvar = QUIET = QUIET_RUN = None


def _quieted(ufunc):
    """``call(*arrays, out=None)``: ``ufunc`` with floating-point warnings off (as the
    kernels), setting NumPy's error state around the call. A closure, not a partial of a
    generic helper: on 100-element arrays that costs a third of a small op (issue 15)."""
    if _extobj_contextvar is None:  # pragma: no cover

        def call(*args, out=None):
            with np.errstate(all="ignore"):
                return ufunc(*args, out=out)
        return call
    setvar, reset, quiet = QUIET

    def call(*args, out=None):
        token = setvar(quiet)
        try:  # (no ``out`` keyword unless given: the ufunc parses fewer arguments)
            return ufunc(*args) if out is None else ufunc(*args, out=out)
        finally:
            reset(token)
    call.__name__ = f"quiet_{ufunc.__name__}"
    return call


_FUNCS: dict[str, object] = {}
_FUNCS_LOCK = threading.Lock()
#: binary op name -> its NumPy ufunc (:attr:`ScalarOp.ufunc`), warnings off (:func:`_quieted`)
_UFUNCS = {name: _quieted(getattr(np, op.ufunc)) for name, op in BINARY.items() if op.ufunc}
#: unary op name -> its NumPy ufunc (:attr:`ScalarOp.ufunc`), warnings off
_UNARY_UFUNCS = {name: _quieted(getattr(np, op.ufunc)) for name, op in UNARY.items()
                 if op.ufunc}
#: float arrays of fewer elements run an op's ufunc (no compile; as fast as the kernel
#: there, which is faster on larger ones)
UFUNC_MAX = 1024


def exact_ufunc(name: str):
    """The op ``name``'s exact NumPy ufunc (:attr:`ScalarOp.ufunc`), or None: callers
    that inline its call turn warnings off around it with :data:`QUIET`."""
    op = BINARY[name] if name in BINARY else UNARY.get(name)
    return getattr(np, op.ufunc) if op is not None and op.ufunc else None


def quiet_ufunc(name: str):
    """``call(*arrays)``: the op ``name``'s exact ufunc (:attr:`ScalarOp.ufunc`) returning a
    new array, floating-point warnings off (:func:`_quieted`); None for an op without one.
    For the eager lean path on float arrays of one dtype, at least 1-d, under
    :data:`UFUNC_MAX` elements."""
    return _UFUNCS.get(name) if name in BINARY else _UNARY_UFUNCS.get(name)


def kernel_function(prefix: str, name: str):
    """The compiled dispatcher of the generated module's ``<prefix>_<name>`` (made on
    first use: the module's 108 kernels as dispatchers cost 20 ms at its import, and a
    process uses a few of them; Numba's cache keys each by its function, as before)."""
    key = f"{prefix}_{name}"
    fn = _FUNCS.get(key)
    if fn is None:
        with _FUNCS_LOCK:
            fn = _FUNCS.get(key)
            if fn is None:
                fn = _FUNCS[key] = njit(**KERNEL_OPTS)(getattr(kernels(), key))
    return fn


def _split(fn, n: int, args: tuple, sliced: tuple[int, ...]) -> bool:
    """Run ``fn(*args)`` on several threads if ``n`` elements should (the arrays at the
    positions ``sliced`` cut into blocks, :mod:`nbgrad.kernels.parallel`); else False."""
    threads = parallel.threads(n)
    if threads <= 1:
        return False

    def part(lo: int, hi: int) -> None:
        fn(*(a[lo:hi] if k in sliced else a for k, a in enumerate(args)))

    parallel.run_blocks(part, n, threads)
    return True


def run_unary(name: str, x: np.ndarray, out_dtype: np.dtype, p0: float = 0.0,
              p1: float = 0.0) -> np.ndarray:
    if x.size < UFUNC_MAX and name in _UNARY_UFUNCS and x.dtype == out_dtype \
            and x.dtype.kind == "f":
        out = np.empty(x.shape, out_dtype)
        _UNARY_UFUNCS[name](x, out=out)
        return out
    fn = _FUNCS.get("unary_" + name) or kernel_function("unary", name)
    xs = x if x.flags.c_contiguous else c_contiguous(x)
    out = np.empty(xs.shape, out_dtype)
    args = (xs.reshape(-1), out.reshape(-1), p0, p1)
    if xs.size < parallel.MIN_SIZE or not _split(fn, xs.size, args, (0, 1)):
        fn(*args)
    return out


def _one(x: np.ndarray) -> np.ndarray:
    """A one-element operand as a 1-d array, writable: a read-only one (a scalar constant)
    would make Numba compile a second variant of the kernel."""
    v = x.reshape(1)
    return v if v.flags.writeable else v.copy()


def run_binary(name: str, a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    if a.size < UFUNC_MAX and b.size < UFUNC_MAX and name in _UFUNCS \
            and a.dtype == b.dtype and a.dtype.kind == "f" \
            and (out_dtype == a.dtype or out_dtype == np.bool_):
        shape = a.shape if a.shape == b.shape else broadcast_shape(name, a.shape, b.shape)
        out = np.empty(shape, out_dtype)
        if out.size:
            _UFUNCS[name](a, b, out=out)
        return out
    fn = _FUNCS.get("binary_" + name) or kernel_function("binary", name)
    if not a.flags.c_contiguous:
        a = c_contiguous(a)
    if not b.flags.c_contiguous:
        b = c_contiguous(b)
    ashape, bshape = a.shape, b.shape
    if ashape == bshape:
        out = np.empty(ashape, out_dtype)
        args = (a.reshape(-1), b.reshape(-1), out.reshape(-1), 0, EMPTY, EMPTY, EMPTY)
        if out.size < parallel.MIN_SIZE or not _split(fn, out.size, args, (0, 1, 2)):
            fn(*args)
        return out
    if not bshape:  # array op scalar
        out = np.empty(ashape, out_dtype)
        args = (a.reshape(-1), _one(b), out.reshape(-1), 1, EMPTY, EMPTY, EMPTY)
        if out.size < parallel.MIN_SIZE or not _split(fn, out.size, args, (0, 2)):
            fn(*args)
        return out
    shape = broadcast_shape(name, ashape, bshape)
    out = np.empty(shape, out_dtype)
    if b.size == 1 and ashape == shape:
        args = (a.reshape(-1), _one(b), out.reshape(-1), 1, EMPTY, EMPTY, EMPTY)
        if out.size < parallel.MIN_SIZE or not _split(fn, out.size, args, (0, 2)):
            fn(*args)
    elif a.size == 1 and bshape == shape:
        args = (_one(a), b.reshape(-1), out.reshape(-1), 2, EMPTY, EMPTY, EMPTY)
        if out.size < parallel.MIN_SIZE or not _split(fn, out.size, args, (1, 2)):
            fn(*args)
    elif out.size and a.dtype == b.dtype and a.dtype.kind == "f" and name in _UFUNCS:
        _UFUNCS[name](a, b, out=out)  # the general broadcast: the same IEEE values
    elif out.size:  # the general broadcast: serial
        fn = _FUNCS.get("bcast_" + name) or kernel_function("bcast", name)
        fn(a.reshape(-1), b.reshape(-1), out.reshape(-1), np.asarray(shape, np.int64),
           broadcast_strides(ashape, shape), broadcast_strides(bshape, shape),
           np.zeros(len(shape), np.int64))
    return out


def run_ternary(name: str, c: np.ndarray, a: np.ndarray, b: np.ndarray,
                out_dtype: np.dtype) -> np.ndarray:
    fn = _FUNCS.get("ternary_" + name) or kernel_function("ternary", name)
    c, a, b = (v if v.flags.c_contiguous else c_contiguous(v) for v in (c, a, b))
    if c.shape == a.shape and (a.shape == b.shape or not b.shape):
        out = np.empty(a.shape, out_dtype)
        mode = 0 if a.shape == b.shape else 1
        args = (c.reshape(-1), a.reshape(-1), b.reshape(-1), out.reshape(-1), mode,
                EMPTY, EMPTY, EMPTY, EMPTY)
        if out.size < parallel.MIN_SIZE or \
                not _split(fn, out.size, args, (0, 1, 2, 3) if mode == 0 else (0, 1, 3)):
            fn(*args)
        return out
    if c.shape == b.shape and not a.shape:
        out = np.empty(b.shape, out_dtype)
        args = (c.reshape(-1), a.reshape(-1), b.reshape(-1), out.reshape(-1), 2,
                EMPTY, EMPTY, EMPTY, EMPTY)
        if out.size < parallel.MIN_SIZE or not _split(fn, out.size, args, (0, 2, 3)):
            fn(*args)
        return out
    shape = broadcast_shape(name, c.shape, a.shape, b.shape)
    out = np.empty(shape, out_dtype)
    if out.size:
        full = shape if shape else (1,)
        fn(c.reshape(-1), a.reshape(-1), b.reshape(-1), out.reshape(-1), 3,
           np.asarray(full, np.int64), broadcast_strides(c.shape, full),
           broadcast_strides(a.shape, full), broadcast_strides(b.shape, full))
    return out
