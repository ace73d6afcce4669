"""Matrix products and diagonals: ``matmul``, ``mm``, ``bmm``, ``dot``, ``outer``,
``einsum``, ``diagonal``, ``diag``, ``trace``.

Decompositions and solvers (``nbgrad.linalg``) live in :mod:`nbgrad.ops.decomp`.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

import numpy as np

from ..kernels import blas
from ..kernels import matrix as mk
from ..kernels.layout import call_native
from ..tensor import Tensor
from .convert import to_dtype
from .decomp import det as _det
from .decomp import inv
from .decomp import slogdet as _slogdet
from .dispatch import apply, promote_operands
from .reduction import sum as _sum
from .registry import formula_helper, get, kernel, op_function
from .shape import expand, permute
from .traits import Matmul, Move, NativePlan, Opaque, batching

__all__ = ["bmm", "det", "diag", "diagonal", "diagonal_backward", "dot", "einsum", "inverse",
           "matmul", "mm", "outer", "slogdet", "trace"]


def _floats(op: str, a, b) -> tuple[Tensor, Tensor]:
    """The operands promoted, integers to float64; bools are refused (NumPy's product of
    bools is a logical one, which a float product would silently get wrong)."""
    a, b = promote_operands(a, b)
    if a.dtype.kind == "b":
        raise TypeError(f"{op}: products of bool tensors are not supported (shapes "
                        f"{tuple(a.shape)} and {tuple(b.shape)}); convert them with .int() "
                        "or .double() first")
    if a.dtype.kind != "f":
        a, b = to_dtype(a, "float64"), to_dtype(b, "float64")
    return a, b


def _shape_error(op: str, a, b, why: str) -> RuntimeError:
    return RuntimeError(
        f"{op}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied ({why})"
    )


@kernel("matmul", kind=Matmul())
def _matmul_kernel(a, b):
    return blas.matmul_nd(a, b)


@op_function("matmul")
def matmul(self: Tensor, other: Tensor) -> Tensor:
    """NumPy's ``matmul``: 1-D operands are promoted, batch dimensions broadcast."""
    a, b = _floats("matmul", self, other)
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError(f"matmul: both arguments to matmul need to be at least 1D, got "
                           f"shapes {tuple(a.shape)} and {tuple(b.shape)}")
    ka = a.shape[-1]
    kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise _shape_error("matmul", a, b, f"{ka} != {kb}")
    if a.ndim > 2 or b.ndim > 2:
        try:
            np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            raise _shape_error("matmul", a, b, "batch dimensions do not broadcast") from None
    return apply(get("matmul"), (a, b))


@kernel("mm", kind=Matmul())
def _mm_kernel(a, b):
    return blas.matmul2d(a, b)


@op_function("mm")
def mm(self: Tensor, mat2: Tensor) -> Tensor:
    """Product of two matrices."""
    a, b = _floats("mm", self, mat2)
    if a.ndim != 2 or b.ndim != 2:
        raise _shape_error("mm", a, b, "both must be 2-D")
    if a.shape[1] != b.shape[0]:
        raise _shape_error("mm", a, b, f"{a.shape[1]} != {b.shape[0]}")
    return apply(get("mm"), (a, b))


@kernel("bmm", kind=Matmul())
def _bmm_kernel(a, b):
    return blas.matmul3d(a, b)


@op_function("bmm")
def bmm(self: Tensor, mat2: Tensor) -> Tensor:
    """Batched product of (b, n, m) and (b, m, p) tensors."""
    a, b = _floats("bmm", self, mat2)
    if a.ndim != 3 or b.ndim != 3:
        raise _shape_error("bmm", a, b, "both must be 3-D")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise _shape_error("bmm", a, b, "batch sizes or inner sizes differ")
    return apply(get("bmm"), (a, b))


@kernel("dot", kind=Matmul())
def _dot_kernel(a, b):
    return blas.matmul_nd(a, b)


@op_function("dot")
def dot(self: Tensor, other: Tensor) -> Tensor:
    """Inner product of two 1-D tensors."""
    a, b = _floats("dot", self, other)
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise _shape_error("dot", a, b, "both must be 1-D of one length")
    return apply(get("dot"), (a, b))


@kernel("outer", kind=Matmul(outer=True))
def _outer_kernel(a, b):
    return blas.matmul2d(a.reshape(-1, 1), b.reshape(1, -1))


@op_function("outer")
def outer(self: Tensor, vec2: Tensor) -> Tensor:
    """Outer product of two 1-D tensors."""
    a, b = _floats("outer", self, vec2)
    if a.ndim != 1 or b.ndim != 1:
        raise _shape_error("outer", a, b, "both must be 1-D")
    return apply(get("outer"), (a, b))


# ------------------------------------------------------------------ einsum
def _parse_equation(equation: str, ndims: Sequence[int]) -> tuple[list[str], str]:
    """Operand labels and output labels, with ``...`` replaced by fresh letters."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise RuntimeError(f"einsum: equation {equation!r} has more than one '->'")
    lhs, rhs = eq.split("->") if "->" in eq else (eq, None)
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise RuntimeError(f"einsum: equation {equation!r} names {len(terms)} operand(s), "
                           f"got {len(ndims)}")
    for term in [*terms, rhs or ""]:
        rest = term.replace("...", "", 1)
        if "." in rest or any(c not in string.ascii_letters for c in rest):
            raise RuntimeError(f"einsum: invalid subscript {term!r} in {equation!r} (use "
                               "letters and at most one '...')")
    used = set(eq)
    fresh = [c for c in string.ascii_letters if c not in used]
    n_ell = 0
    for term, nd in zip(terms, ndims, strict=True):
        named = len(term.replace("...", ""))
        if ("..." in term and named > nd) or ("..." not in term and named != nd):
            raise RuntimeError(f"einsum: subscript {term!r} does not fit an operand of "
                               f"{nd} dimension(s)")
        if "..." in term:
            n_ell = max(n_ell, nd - named)
    ell = "".join(fresh[:n_ell])
    labels = []
    for term, nd in zip(terms, ndims, strict=True):
        k = nd - len(term.replace("...", ""))
        labels.append(term.replace("...", ell[n_ell - k:]) if "..." in term else term)
    if rhs is None:
        counts = {c: lhs.count(c) for c in set(lhs) - {".", ","}}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1))
    else:
        out = rhs.replace("...", ell)
        for c in out:
            if out.count(c) > 1:
                raise RuntimeError(f"einsum: output subscript {c!r} appears more than once "
                                   f"in {equation!r}")
            if not any(c in t for t in labels):
                raise RuntimeError(f"einsum: output subscript {c!r} of {equation!r} does not "
                                   "appear in any operand")
    return labels, out


def _einsum_prepare(tensors: list[Tensor], labels: list[str], out: str
                    ) -> tuple[list[Tensor], list[str]]:
    """Take diagonals of repeated labels, broadcast size-1 dimensions and sum labels that
    only one operand has, so that the remaining contractions are clean."""
    ts, ls = [], []
    for t, s in zip(tensors, labels, strict=True):
        while len(set(s)) < len(s):
            c = next(c for c in s if s.count(c) > 1)
            i = s.index(c)
            j = s.index(c, i + 1)
            if t.shape[i] != t.shape[j]:
                raise RuntimeError(f"einsum: subscript {c!r} is repeated in an operand of "
                                   f"shape {t.shape} with sizes {t.shape[i]} and {t.shape[j]}")
            t = diagonal(t, 0, i, j)
            s = s[:i] + s[i + 1:j] + s[j + 1:] + c
        ts.append(t)
        ls.append(s)
    size: dict[str, int] = {}
    for t, s in zip(ts, ls, strict=True):
        for c, n in zip(s, t.shape, strict=True):
            if size.get(c, 1) != 1 and n not in (1, size[c]):
                shapes = [tuple(x.shape) for x in tensors]
                raise RuntimeError(f"einsum: subscript {c!r} has sizes {size[c]} and {n} "
                                   f"(operand shapes {shapes})")
            size[c] = max(size.get(c, 1), n)
    for k, (t, s) in enumerate(zip(ts, ls, strict=True)):
        full = tuple(size[c] for c in s)
        if full != t.shape:
            t = expand(t, full)
        alone = [i for i, c in enumerate(s) if c not in out and
                 not any(c in other for m, other in enumerate(ls) if m != k)]
        if alone:
            t = _sum(t, tuple(alone))
            s = "".join(c for i, c in enumerate(s) if i not in alone)
        ts[k], ls[k] = t, s
    return ts, ls


@op_function("einsum")
def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation, ``einsum("ij,jk->ik", a, b)`` (``...`` and the implicit output
    form included; size-1 dimensions broadcast).

    Repeated labels become ``diagonal`` ops, labels of one operand only become ``sum``
    ops, and the remaining contractions run pairwise, left to right, as the table op
    ``einsum`` of two operands (one batched BLAS product each).
    """
    if not isinstance(equation, str) and len(operands) % 2 in (0, 1) and operands \
            and isinstance(operands[0], (list, tuple)):  # einsum(a, [0, 1], b, [1, 2], [0, 2])
        equation, operands = _sublist_equation((equation, *operands))
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        raise TypeError(f"einsum: the equation must be a str, got {type(equation).__name__}")
    if not operands:
        raise RuntimeError("einsum: needs at least one operand")
    tensors = promote_operands(*operands)
    if tensors[0].dtype.kind != "f":
        tensors = [to_dtype(t, "float64") for t in tensors]
    labels, out = _parse_equation(equation, [t.ndim for t in tensors])
    ts, ls = _einsum_prepare(tensors, labels, out)
    acc, acc_labels = ts[0], ls[0]
    for k in range(1, len(ts)):
        later = set(out).union(*ls[k + 1:])
        seen = acc_labels + "".join(c for c in ls[k] if c not in acc_labels)
        keep = "".join(c for c in seen if c in later)
        if k == len(ts) - 1:
            keep = out
        acc = apply(get("einsum"), (f"{acc_labels},{ls[k]}->{keep}", [acc, ts[k]]))
        acc_labels = keep
    if acc_labels != out:
        acc = permute(acc, tuple(acc_labels.index(c) for c in out))
    return acc


def _einsum_static(attrs: dict, shapes: tuple) -> NativePlan:
    lhs, out = attrs["equation"].split("->")
    a_labels, b_labels = lhs.split(",")
    consts, shape = blas.einsum_plan(shapes[0], a_labels, shapes[1], b_labels, out)
    return NativePlan(consts, (shape,))


@kernel("einsum", kind=Opaque(native=blas.einsum_native, static=_einsum_static),
        batch=batching("einsum"))
def _einsum_kernel(equation, operands):
    lhs, out = equation.split("->")
    a_labels, b_labels = lhs.split(",")
    return blas.einsum_pair(operands[0], a_labels, operands[1], b_labels, out)


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _sublist_equation(args: tuple) -> tuple[str, tuple]:
    """NumPy's and PyTorch's sublist form, ``(a, [0, 1], b, [1, 2], [0, 2])``, as an
    equation and its operands."""
    def labels(sub) -> str:
        out = []
        for s in sub:
            if s is Ellipsis:
                out.append("...")
            elif isinstance(s, (int, np.integer)) and 0 <= int(s) < len(_LETTERS):
                out.append(_LETTERS[int(s)])
            else:
                raise ValueError(f"einsum: sublist labels must be ints in [0, 52) or ..., "
                                 f"got {s!r}")
        return "".join(out)

    pairs = args[:len(args) - len(args) % 2]
    operands = pairs[0::2]
    equation = ",".join(labels(sub) for sub in pairs[1::2])
    if len(args) % 2:
        equation += "->" + labels(args[-1])
    return equation, operands


@formula_helper
def einsum_grad_equation(equation: str, which: int) -> str:
    """The equation giving the gradient of operand ``which`` of a two-operand einsum."""
    lhs, out = equation.split("->")
    a, b = lhs.split(",")
    return f"{out},{b}->{a}" if which == 0 else f"{a},{out}->{b}"


# ------------------------------------------------------------------ diagonals
def _dim(d: int, ndim: int, op: str) -> int:
    if not -ndim <= d < ndim:
        raise IndexError(f"{op}: dim {d} is out of range for a tensor of {ndim} dimension(s)")
    return int(d) % ndim


def _diag_positions(n1: int, n2: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    if offset >= 0:
        k = max(0, min(n1, n2 - offset))
        return np.arange(k), np.arange(k) + offset
    k = max(0, min(n1 + offset, n2))
    return np.arange(k) - offset, np.arange(k)


@kernel("diagonal", view_of=0, kind=Move())
def _diagonal_kernel(x, offset, dim1, dim2):
    return np.diagonal(x, offset, dim1, dim2)


@op_function("diagonal")
def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of the (``dim1``, ``dim2``) planes, as a last dimension (a view)."""
    if self.ndim < 2:
        raise RuntimeError(f"diagonal: needs at least 2 dimensions, got shape {self.shape}")
    d1, d2 = _dim(dim1, self.ndim, "diagonal"), _dim(dim2, self.ndim, "diagonal")
    if d1 == d2:
        raise RuntimeError(f"diagonal: dim1 and dim2 are the same dimension ({d1})")
    return apply(get("diagonal"), (self, int(offset), d1, d2))


def _diagonal_backward_static(attrs: dict, shapes: tuple) -> NativePlan:
    sizes = tuple(attrs["input_sizes"])
    d1, d2, offset = attrs["dim1"], attrs["dim2"], attrs["offset"]
    strides = tuple(math.prod(sizes[d + 1:]) for d in range(len(sizes)))
    outer = tuple(d for d in range(len(sizes)) if d not in (d1, d2))
    rows, cols = _diag_positions(sizes[d1], sizes[d2], offset)
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    return NativePlan((math.prod(sizes), tuple(sizes[d] for d in outer) or (1,),
                       tuple(strides[d] for d in outer) or (0,), len(rows), r0, c0,
                       strides[d1], strides[d2]), (sizes,))


_DIAGONAL_BACKWARD = Opaque(native=mk.diagonal_backward_native,
                            static=_diagonal_backward_static)


@kernel("diagonal_backward", kind=_DIAGONAL_BACKWARD, batch=batching("diagonal_backward"))
def _diagonal_backward_kernel(g, input_sizes, offset, dim1, dim2):
    return call_native(_DIAGONAL_BACKWARD, (g,), {"input_sizes": input_sizes,
                                                  "offset": offset, "dim1": dim1,
                                                  "dim2": dim2})


@op_function("diagonal_backward")
def diagonal_backward(self: Tensor, input_sizes, offset: int, dim1: int, dim2: int) -> Tensor:
    """Zeros of shape ``input_sizes`` with ``self`` written on a diagonal (the backward
    of ``diagonal``); negative dims count from the end of ``input_sizes``."""
    sizes = tuple(int(s) for s in input_sizes)
    d1, d2 = (_dim(d, len(sizes), "diagonal_backward") for d in (dim1, dim2))
    return apply(get("diagonal_backward"), (self, sizes, int(offset), d1, d2))


def _diag_static(attrs: dict, shapes: tuple) -> NativePlan:
    shape, k = tuple(shapes[0]), int(attrs["diagonal"])
    if len(shape) == 1:
        n = shape[0] + abs(k)
        return NativePlan((k, 1, shape[0], True), ((n, n),))
    rows, cols = shape
    count = max(0, min(rows, cols - k)) if k >= 0 else max(0, min(rows + k, cols))
    return NativePlan((k, rows, cols, False), ((count,),))


_DIAG = Opaque(native=mk.diag_native, static=_diag_static)


@kernel("diag", kind=_DIAG, batch=batching("diag"))
def _diag_kernel(x, diagonal):
    return call_native(_DIAG, (x,), {"diagonal": diagonal})


@op_function("diag")
def diag(self: Tensor, diagonal: int = 0) -> Tensor:
    """A 1-D tensor as the ``diagonal``-th diagonal of a square matrix, or the
    ``diagonal``-th diagonal of a 2-D tensor as a 1-D tensor."""
    if self.ndim not in (1, 2):
        raise RuntimeError(f"diag: expects a 1-D or 2-D tensor, got shape {self.shape}")
    return apply(get("diag"), (self, int(diagonal)))


_TRACE = Opaque(native=mk.trace_native,
                static=lambda attrs, shapes: NativePlan(tuple(shapes[0]), ((),)))


@kernel("trace", kind=_TRACE, batch=batching("trace"))
def _trace_kernel(x):
    return call_native(_TRACE, (x,), {})


@op_function("trace")
def trace(self: Tensor) -> Tensor:
    """Sum of the main diagonal of a 2-D tensor."""
    if self.ndim != 2:
        raise RuntimeError(f"trace: expects a 2-D tensor, got shape {self.shape}")
    return apply(get("trace"), (self,))


@formula_helper
def diagonal_shape(shape) -> tuple[int]:
    """The shape of the main diagonal of a matrix of ``shape``."""
    return (min(shape[-2], shape[-1]),)


# ------------------------------------------------------------------ torch's top-level names
def det(self: Tensor) -> Tensor:
    """``torch.det`` / ``Tensor.det``: :func:`nbgrad.linalg.det`."""
    return _det(self)


def slogdet(self: Tensor):
    """``torch.slogdet`` / ``Tensor.slogdet``: :func:`nbgrad.linalg.slogdet`."""
    return _slogdet(self)


def inverse(self: Tensor) -> Tensor:
    """``torch.inverse`` / ``Tensor.inverse``: :func:`nbgrad.linalg.inv`."""
    return inv(self)
