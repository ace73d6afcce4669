"""The step kinds of fuzz programs: how each runs with nbgrad's public API and the
nbgrad source it stands for, plus the value domains and the adapters into them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ... import fft
from ... import ops as nb  # the op functions, called as ``nb.NAME`` like nbgrad's own
from ...factories import tensor
from ...nn import functional as F
from ...numpy_interop import UFUNCS
from ...tensor import Tensor
from ..core import all_records
from ..records.elementwise import _BINARY, _UNARY
from . import constructs


# ------------------------------------------------------------------ domains
def _frac_ok(a: np.ndarray, halves: bool = False) -> bool:
    f = np.abs(a - np.round(a))
    if halves:
        f = np.minimum(f, np.abs(np.abs(a - np.floor(a)) - 0.5))
    return bool(np.all(f >= 0.05))


#: whether values lie safely inside a domain (also away from kinks at 0 and integers)
DOMAIN_OK: dict[str, Callable[[np.ndarray], bool]] = {
    "real": lambda a: bool(np.all(np.abs(a) <= 5)),
    "small": lambda a: bool(np.all(np.abs(a) <= 1.5)),
    "positive": lambda a: bool(np.all((a >= 0.2) & (a <= 5))),
    "unit": lambda a: bool(np.all(np.abs(a) <= 0.9)),
    "gt1": lambda a: bool(np.all((a >= 1.1) & (a <= 5))),
    "nonzero": lambda a: bool(np.all((np.abs(a) >= 0.2) & (np.abs(a) <= 5))),
    "nonint": lambda a: bool(np.all(np.abs(a) <= 5)) and _frac_ok(a, halves=True),
    "prob": lambda a: bool(np.all((a >= 0.05) & (a <= 0.95))),
}

#: smooth maps of any real value into a domain: (function, source with ``{0}``)
ADAPTERS: dict[str, tuple[Callable[[Tensor], Tensor], str]] = {
    "real": (lambda x: 3.0 * nb.tanh(x / 3.0), "3.0 * nb.tanh({0} / 3.0)"),
    "small": (lambda x: 1.5 * nb.tanh(x / 1.5), "1.5 * nb.tanh({0} / 1.5)"),
    "positive": (lambda x: 0.5 + 1.5 * nb.sigmoid(x), "0.5 + 1.5 * nb.sigmoid({0})"),
    "unit": (lambda x: 0.85 * nb.tanh(x), "0.85 * nb.tanh({0})"),
    "gt1": (lambda x: 1.2 + 1.8 * nb.sigmoid(x), "1.2 + 1.8 * nb.sigmoid({0})"),
    "nonzero": (lambda x: 0.5 + 1.5 * nb.sigmoid(x), "0.5 + 1.5 * nb.sigmoid({0})"),
    "nonint": (lambda x: 0.1 + 0.3 * nb.sigmoid(x), "0.1 + 0.3 * nb.sigmoid({0})"),
    "prob": (lambda x: 0.1 + 0.8 * nb.sigmoid(x), "0.1 + 0.8 * nb.sigmoid({0})"),
}


# ------------------------------------------------------------------ the op catalogue
@dataclass(frozen=True)
class FuzzOp:
    """How a program step runs (``run(inputs, params)``) and reads as nbgrad source
    (``code(input names, params)``). ``entry`` is the derivative-table entry the step
    exercises (checked against the op records); ``None`` for adapters, loops and
    custom Functions."""

    run: Callable[[list[Tensor], tuple], Tensor]
    entry: str | None
    code: Callable[[list[str], tuple], str]


FUZZ_OPS: dict[str, FuzzOp] = {}


def _fmt(template: str) -> Callable[[list[str], tuple], str]:
    """Source from a template: ``{0}``, ``{1}``... are inputs, ``{p0}``... params;
    ``{xs}`` is all inputs as a list."""
    def code(args: list[str], params: tuple) -> str:
        named = {f"p{k}": v for k, v in enumerate(params)}
        return template.format(*args, xs="[" + ", ".join(args) + "]", **named)
    return code


def _op(name: str, entry: str | None = "", run: Callable | None = None,
        code: str | Callable = "") -> None:
    """Register step kind ``name`` exercising table entry ``entry`` (default: ``name``)."""
    how = code if callable(code) else _fmt(code)
    FUZZ_OPS[name] = FuzzOp(run, name if entry == "" else entry, how)


def _where(name: str) -> str:
    return "nb" if hasattr(nb, name) else "F"


def _fn(name: str) -> Callable:
    return getattr(nb, name, None) or getattr(F, name)


for _d, (_f, _src) in ADAPTERS.items():
    _op(f"adapt_{_d}", None, lambda xs, p, _f=_f: _f(xs[0]), _src)

_UNARY_DOMAINS = {name: domain for name, (domain, _ref) in _UNARY.items()}
_UNARY_DOMAINS.update({"softplus": "real", "gelu": "real", "silu": "real",
                       "elu": "nonzero", "leaky_relu": "nonzero"})
for _name in _UNARY_DOMAINS:
    _op(_name, run=lambda xs, p, _n=_name: _fn(_n)(xs[0]),
        code=f"{_where(_name)}.{_name}({{0}})")

_BINARY_DOMAINS = {name: (da, db) for name, (da, db, _ref) in _BINARY.items()}
# any dividend: the steps keep the quotient away from the jumps (see _binary_ok)
_BINARY_DOMAINS["fmod"] = _BINARY_DOMAINS["remainder"] = ("real", "positive")


def _run_binary(fn: Callable) -> Callable:
    def run(xs, params):
        if len(xs) == 2:
            return fn(xs[0], xs[1])
        scalar, side = params  # a Python number on the left or the right
        return fn(scalar, xs[0]) if side == "left" else fn(xs[0], scalar)

    return run


def _binary_code(spelling: str) -> Callable:
    def code(args, params):
        if len(args) == 2:
            return f"{spelling}({args[0]}, {args[1]})"
        scalar, side = params
        return f"{spelling}({scalar!r}, {args[0]})" if side == "left" else \
            f"{spelling}({args[0]}, {scalar!r})"
    return code


for _name in _BINARY_DOMAINS:
    _op(_name, run=_run_binary(_fn(_name)), code=_binary_code(f"nb.{_name}"))
_op("where", run=lambda xs, p: nb.where(_beside(np.array(p[0], dtype=bool), xs[0]), xs[0],
                                         xs[1]),
    code="nb.where(nb.tensor(np.array({p0!r}, dtype=bool)), {0}, {1})")
_op("lerp", run=lambda xs, p: nb.lerp(xs[0], xs[1], p[0]), code="nb.lerp({0}, {1}, {p0!r})")
_op("clamp", run=lambda xs, p: nb.clamp(xs[0], p[0], p[1]),
    code="nb.clamp({0}, {p0!r}, {p1!r})")

# reductions: params = (dim, keepdim) or op-specific
for _name in ("sum", "mean", "prod", "amax", "amin", "logsumexp"):
    _op(_name, run=lambda xs, p, _n=_name: _fn(_n)(xs[0], dim=p[0], keepdim=p[1]),
        code=f"nb.{_name}({{0}}, dim={{p0!r}}, keepdim={{p1!r}})")
_op("var", run=lambda xs, p: nb.var(xs[0], dim=p[0], keepdim=p[1], correction=p[2]),
    code="nb.var({0}, dim={p0!r}, keepdim={p1!r}, correction={p2!r})")
_op("std", run=lambda xs, p: nb.std(xs[0], dim=p[0], keepdim=p[1], correction=p[2]),
    code="nb.std({0}, dim={p0!r}, keepdim={p1!r}, correction={p2!r})")
_op("norm", run=lambda xs, p: nb.norm(xs[0], float(p[2]), dim=p[0], keepdim=p[1]),
    code="nb.norm({0}, float({p2!r}), dim={p0!r}, keepdim={p1!r})")
_op("max_dim", run=lambda xs, p: nb.max(xs[0], p[0], p[1]).values,
    code="nb.max({0}, {p0!r}, {p1!r}).values")
_op("min_dim", run=lambda xs, p: nb.min(xs[0], p[0], p[1]).values,
    code="nb.min({0}, {p0!r}, {p1!r}).values")
for _name in ("cumsum", "cumprod", "softmax", "log_softmax"):
    _op(_name, run=lambda xs, p, _n=_name: _fn(_n)(xs[0], p[0]),
        code=f"{_where(_name)}.{_name}({{0}}, {{p0!r}})")
_op("sort", run=lambda xs, p: nb.sort(xs[0], p[0], p[1]).values,  # (dim, descending)
    code="nb.sort({0}, {p0!r}, {p1!r}).values")
_op("topk", run=lambda xs, p: nb.topk(xs[0], p[2], p[0], p[1]).values,  # (dim, largest, k)
    code="nb.topk({0}, {p2!r}, {p0!r}, {p1!r}).values")
_op("layer_norm", run=lambda xs, p: F.layer_norm(xs[0], p[0], *xs[1:]),
    code=lambda a, p: f"F.layer_norm({a[0]}, {p[0]!r}{''.join(', ' + x for x in a[1:])})")

# NumPy's spellings: step kind ``np_<name>`` calls NumPy's ufunc or function on the
# tensors (``np.sin(x)``), which nbgrad.numpy_interop routes to the op of ``<name>``; the
# families draw them in place of the op (families.spelled), so every executor checks
# that route too
def _numpy_ufunc(name: str) -> np.ufunc | None:
    """NumPy's ufunc computing the op of step kind ``name`` (None where it has none)."""
    fn = _fn(name)
    return next((u for u, op in UFUNCS.items() if op is fn and
                 getattr(np, getattr(u, "__name__", ""), None) is u), None)


for _name in _UNARY_DOMAINS:
    if (_u := _numpy_ufunc(_name)) is not None:
        _op(f"np_{_name}", _name, run=lambda xs, p, _u=_u: _u(xs[0]),
            code=f"np.{_u.__name__}({{0}})")
for _name in _BINARY_DOMAINS:
    if (_u := _numpy_ufunc(_name)) is not None:
        _op(f"np_{_name}", _name, run=_run_binary(_u), code=_binary_code(f"np.{_u.__name__}"))
for _name, _f in (("sum", np.sum), ("mean", np.mean), ("prod", np.prod), ("amax", np.max),
                  ("amin", np.min)):
    _op(f"np_{_name}", _name,
        run=lambda xs, p, _f=_f: _f(xs[0], axis=p[0], keepdims=p[1]),
        code=f"np.{_f.__name__}({{0}}, axis={{p0!r}}, keepdims={{p1!r}})")
for _name, _f in (("var", np.var), ("std", np.std)):
    _op(f"np_{_name}", _name,
        run=lambda xs, p, _f=_f: _f(xs[0], axis=p[0], keepdims=p[1], ddof=p[2]),
        code=f"np.{_name}({{0}}, axis={{p0!r}}, keepdims={{p1!r}}, ddof={{p2!r}})")
for _name, _f in (("cumsum", np.cumsum), ("cumprod", np.cumprod)):
    _op(f"np_{_name}", _name, run=lambda xs, p, _f=_f: _f(xs[0], axis=p[0]),
        code=f"np.{_name}({{0}}, axis={{p0!r}})")
#: the step kinds that have a NumPy spelling (``name -> np_<name>``)
NUMPY_SPELLINGS: dict[str, str] = {n[3:]: n for n in FUZZ_OPS if n.startswith("np_")}


# spectral steps (nbgrad.fft; params (dim, norm)): real in, real out, through each of the
# table's three transforms (fft_r2c, fft_c2c, fft_c2r)
def _spectral(name: str) -> Callable:
    def run(xs, p):
        if name == "fft_real":
            return fft.fft(xs[0], dim=p[0], norm=p[1]).real
        if name == "ifft_rfft_imag":
            return fft.ifft(fft.rfft(xs[0], dim=p[0]), dim=p[0], norm=p[1]).imag
        return fft.irfft(fft.rfft(xs[0], dim=p[0], norm=p[1]) * 0.5, dim=p[0])

    return run


_op("fft_real", "fft_r2c", _spectral("fft_real"),
    "nb.fft.fft({0}, dim={p0!r}, norm={p1!r}).real")
_op("ifft_rfft_imag", "fft_c2c", _spectral("ifft_rfft_imag"),
    "nb.fft.ifft(nb.fft.rfft({0}, dim={p0!r}), dim={p0!r}, norm={p1!r}).imag")
_op("irfft_rfft", "fft_c2r", _spectral("irfft_rfft"),
    "nb.fft.irfft(nb.fft.rfft({0}, dim={p0!r}, norm={p1!r}) * 0.5, dim={p0!r})")

# shape ops
for _name in ("reshape", "permute", "unsqueeze", "squeeze", "flip", "expand", "repeat",
              "tile", "tril", "triu"):
    _op(_name, run=lambda xs, p, _n=_name: _fn(_n)(xs[0], p[0]),
        code=f"nb.{_name}({{0}}, {{p0!r}})")
for _name in ("flatten", "transpose", "roll"):
    _op(_name, run=lambda xs, p, _n=_name: _fn(_n)(xs[0], p[0], p[1]),
        code=f"nb.{_name}({{0}}, {{p0!r}}, {{p1!r}})")
_op("cat", run=lambda xs, p: nb.cat(list(xs), p[0]), code="nb.cat({xs}, {p0!r})")
_op("stack", run=lambda xs, p: nb.stack(list(xs), p[0]), code="nb.stack({xs}, {p0!r})")
_op("split", run=lambda xs, p: nb.split(xs[0], p[0], p[1])[p[2]],
    code="nb.split({0}, {p0!r}, {p1!r})[{p2!r}]")
_op("chunk", run=lambda xs, p: nb.chunk(xs[0], p[0], p[1])[p[2]],
    code="nb.chunk({0}, {p0!r}, {p1!r})[{p2!r}]")
_op("pad", run=lambda xs, p: nb.pad(xs[0], p[0], "constant", p[1]),
    code="nb.pad({0}, {p0!r}, 'constant', {p1!r})")


# indexing: index arrays are stored as (nested) lists so that a program's repr is Python
def _index_value(item):
    if isinstance(item, list):
        return np.array(item, dtype=bool if item and isinstance(_first(item), bool)
                        else np.int64)
    return item


def _first(item):
    while isinstance(item, list) and item:
        item = item[0]
    return item


def _ints(p, like: Tensor) -> Tensor:
    return _beside(np.array(p, dtype=np.int64), like)


def _beside(a: np.ndarray, like: Tensor) -> Tensor:
    """A constant of a step, on the device of the step's first input ``like``."""
    return tensor(a, device=like.device)


def _slice_code(s: slice) -> str:
    text = ("" if s.start is None else str(s.start)) + ":" + \
        ("" if s.stop is None else str(s.stop))
    return text + ("" if s.step is None else f":{s.step}")


def index_code(items: tuple) -> str:
    """``items`` as the text between the brackets of ``t[...]``."""
    parts = []
    for item in items:
        if isinstance(item, slice):
            parts.append(_slice_code(item))
        elif item is Ellipsis:
            parts.append("...")
        elif isinstance(item, list):
            dtype = "bool" if item and isinstance(_first(item), bool) else "np.int64"
            parts.append(f"np.array({item!r}, dtype={dtype})")
        else:
            parts.append(repr(item))
    return ", ".join(parts)


_op("index", run=lambda xs, p: xs[0][tuple(_index_value(i) for i in p[0])],
    code=lambda a, p: f"{a[0]}[{index_code(p[0])}]" if p[0] else f"{a[0]}[()]")
_op("gather", run=lambda xs, p: nb.gather(xs[0], p[0], _ints(p[1], xs[0])),
    code="nb.gather({0}, {p0!r}, nb.tensor(np.array({p1!r}, dtype=np.int64)))")
_op("index_select", run=lambda xs, p: nb.index_select(xs[0], p[0], _ints(p[1], xs[0])),
    code="nb.index_select({0}, {p0!r}, nb.tensor(np.array({p1!r}, dtype=np.int64)))")
_op("take", run=lambda xs, p: nb.take(xs[0], _ints(p[0], xs[0])),
    code="nb.take({0}, nb.tensor(np.array({p0!r}, dtype=np.int64)))")
_op("masked_fill", run=lambda xs, p: nb.masked_fill(xs[0], _beside(np.array(p[0], bool),
                                                                             xs[0]), p[1]),
    code="nb.masked_fill({0}, nb.tensor(np.array({p0!r}, dtype=bool)), {p1!r})")
_op("scatter_add", run=lambda xs, p: nb.scatter_add(xs[0], p[0], _ints(p[1], xs[0]), xs[1]),
    code="nb.scatter_add({0}, {p0!r}, nb.tensor(np.array({p1!r}, dtype=np.int64)), {1})")
_op("diagonal", run=lambda xs, p: nb.diagonal(xs[0], p[0], p[1], p[2]),
    code="nb.diagonal({0}, {p0!r}, {p1!r}, {p2!r})")
_op("trace", run=lambda xs, p: nb.trace(xs[0]), code="nb.trace({0})")

# products
_op("matmul", run=lambda xs, p: nb.matmul(xs[0], xs[1]) if not p else xs[0] @ xs[1],
    code=lambda a, p: f"{a[0]} @ {a[1]}" if p else f"nb.matmul({a[0]}, {a[1]})")
for _name in ("mm", "bmm", "dot", "outer"):
    _op(_name, run=lambda xs, p, _n=_name: _fn(_n)(xs[0], xs[1]),
        code=f"nb.{_name}({{0}}, {{1}})")
_op("einsum", run=lambda xs, p: nb.einsum(p[0], *xs),
    code=lambda a, p: f"nb.einsum({p[0]!r}, {', '.join(a)})")
_op("linear", run=lambda xs, p: F.linear(*xs), code=lambda a, p: f"F.linear({', '.join(a)})")
_op("mse_loss", run=lambda xs, p: F.mse_loss(xs[0], xs[1], reduction=p[0]),
    code="F.mse_loss({0}, {1}, reduction={p0!r})")

# beyond the table: loops (fori_loop, scan, a Python loop) and custom autograd Functions
# (see constructs)
_op("fori_loop", None, constructs.fori, constructs.fori_code)
_op("scan", None, constructs.scan, constructs.scan_code)
_op("unrolled", None, constructs.unrolled, constructs.unrolled_code)
for _name, (_run, _src) in constructs.FUNCTIONS.items():
    _op(_name, None, _run, _src)


def catalogue_entries() -> set[str]:
    """The table entries the fuzzer exercises."""
    return {op.entry for op in FUZZ_OPS.values() if op.entry is not None}


def check_catalogue() -> list[str]:
    """Names the fuzzer exercises that are not table entries with an op record."""
    records = all_records()
    return sorted(e for e in catalogue_entries() if e not in records)
