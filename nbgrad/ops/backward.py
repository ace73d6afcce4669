"""Composite backward helpers: named pieces of gradient formulas, callable from the table.

Each helper is plain Python over table ops (called through ``ops``) and Python
operators on tensors, so its result is recorded like any formula's: double backward
and the jit's traced backward need no extra code. Register one with
:func:`~nbgrad.ops.registry.backward_helper`; formulas call it by name, and its tensor
arguments are saved as values (pass ``x.shape`` where only metadata is needed).
Helpers branch only on plain values (flags, dims, ``ndim``), never on tensor values.
"""

from __future__ import annotations

from ..table.composite import TableOps
from .nn import loss_divisor, trailing_dims
from .reduction import norm_kind
from .registry import backward_helper, resolve
from .shape import repeat_grad_dims, repeat_grad_shape

__all__: list[str] = []

#: the table's ops, as formulas call them (``ops.where``, ``ops.linalg.solve``)
ops = TableOps(resolve)


# -------------------------------------------------------------------- shapes and masks
@backward_helper
def mT(x):
    """``x`` with its last two dims swapped (the matrix transpose)."""
    return ops.transpose(x, -2, -1)


@backward_helper
def with_dim(x, dim, keepdim):
    """``x`` as a reduction over ``dim`` with ``keepdim=True`` would have returned it."""
    return x if keepdim else ops.unsqueeze(x, dim)


@backward_helper
def within(x, min, max):
    """Where ``min <= x <= max``; a bound that is None is not checked."""
    if max is None:
        return x >= min
    if min is None:
        return x <= max
    return (x >= min) & (x <= max)


@backward_helper
def div_or_zero(a, b):
    """``a / b``, and 0 where ``b`` is 0."""
    return ops.where(b == 0, 0.0, a / ops.where(b == 0, 1.0, b))


@backward_helper
def centered(x, dim):
    """``x`` minus its mean over ``dim``."""
    return x - ops.mean(x, dim, True)


@backward_helper
def sum_repeats(grad, repeats, shape):
    """The gradient of repeating (tiling) a tensor of ``shape``: the copies summed."""
    return ops.reshape(ops.sum(ops.reshape(grad, repeat_grad_shape(repeats, shape)),
                               repeat_grad_dims(repeats, shape)), shape)


# -------------------------------------------------------------------- reductions
@backward_helper
def exclusive_cumprod(x, dim, reverse=False):
    """Products along ``dim`` of the entries before each one (after it, with ``reverse``),
    exact with zeros."""
    if not reverse:
        return ops.shift_along(ops.cumprod(x, dim), dim, 1, 1.0)
    return ops.scan(1 - ops.shift_along(ops.ones_like(x), dim, -1, 0.0), x, dim, True)


@backward_helper
def share_ties(grad, x, result, dim, keepdim):
    """The gradient of a max-like reduction of ``x``: ``grad`` shared evenly by the
    entries equal to ``result``."""
    hit = x == ops.sum_backward(result, x.shape, dim, keepdim)
    count = ops.sum(hit, dim, keepdim, x.dtype)
    return ops.where(hit, ops.sum_backward(grad / count, x.shape, dim, keepdim), 0.0)


@backward_helper
def norm_grad(grad, x, result, p, dim, keepdim):
    """The gradient of the vector p-norm: 0 where the norm is 0, inf-norm ties share."""
    kind = norm_kind(p)
    if kind == "zero":
        return ops.zeros_like(x)
    if kind == "one":
        return ops.sign(x) * ops.sum_backward(grad, x.shape, dim, keepdim)
    if kind == "two":
        return x * ops.sum_backward(div_or_zero(grad, result), x.shape, dim, keepdim)
    if kind == "inf":
        return ops.sign(x) * share_ties(grad, ops.abs(x), result, dim, keepdim)
    scale = ops.where(x == 0, 0.0, ops.sign(x) * ops.pow(ops.where(x == 0, 1.0, ops.abs(x)),
                                                          p - 1))
    upstream = ops.where(result == 0, 0.0,
                         grad / ops.pow(ops.where(result == 0, 1.0, result), p - 1))
    return scale * ops.sum_backward(upstream, x.shape, dim, keepdim)


# -------------------------------------------------------------------- linear algebra
@backward_helper
def matmul_grad_self(grad, self_ndim, other):
    """The gradient of ``matmul(self, other)`` for ``self`` (1-d operands promoted)."""
    if self_ndim == 1 and other.ndim == 1:
        return grad * other
    if self_ndim == 1:
        return ops.squeeze(ops.matmul(ops.unsqueeze(grad, -2), ops.transpose(other, -1, -2)),
                           -2)
    if other.ndim == 1:
        return ops.unsqueeze(grad, -1) * other
    return ops.matmul(grad, ops.transpose(other, -1, -2))


@backward_helper
def matmul_grad_other(grad, self, other_ndim):
    """The gradient of ``matmul(self, other)`` for ``other`` (1-d operands promoted)."""
    if self.ndim == 1 and other_ndim == 1:
        return grad * self
    if other_ndim == 1:
        return ops.squeeze(ops.matmul(ops.transpose(self, -1, -2), ops.unsqueeze(grad, -1)),
                           -1)
    if self.ndim == 1:
        return ops.unsqueeze(self, -1) * ops.unsqueeze(grad, -2)
    return ops.matmul(ops.transpose(self, -1, -2), grad)


@backward_helper
def cholesky_z_of_sym(L, s):
    """``Phi(L^-1 s L^-T)`` for the symmetric ``s`` (see :func:`cholesky_backward_z`)."""
    y = ops.linalg.solve_triangular(L, s, upper=False)
    y = solve_triangular_adjoint(L, y, False, False, False)
    return 0.5 * (ops.tril(y) + ops.tril(y, -1))


@backward_helper
def cholesky_backward_z(L, grad):
    """``Phi(L^-1 sym(grad) L^-T)``: its lower triangle, the diagonal halved (the
    derivatives of ``cholesky_backward``; ``L Z`` is cholesky's JVP for ``sym(grad)``)."""
    return cholesky_z_of_sym(L, 0.5 * (grad + mT(grad)))


@backward_helper
def cholesky_backward_l(gL, L, result, grad):
    """The gradient of ``cholesky_backward`` for ``L``: ``tril(gL Z^T - 2 result sym(grad)
    L^-T)`` (only ``L``'s lower triangle is read)."""
    s = 0.5 * (grad + mT(grad))
    z = cholesky_z_of_sym(L, s)
    w = solve_triangular_adjoint(L, ops.matmul(result, s), False, False, False)
    return ops.tril(ops.matmul(gL, mT(z)) - 2 * w)


@backward_helper
def solve_triangular_adjoint(A, grad, upper, left, unitriangular):
    """``grad`` solved with ``A`` transposed: the gradient of ``solve_triangular`` for B."""
    return ops.linalg.solve_triangular(mT(A), grad, upper=not upper, left=left,
                                       unitriangular=unitriangular)


@backward_helper
def solve_outer(grad_b, x, left):
    """``grad_b @ x^T`` for ``A x = B`` (``left``), ``x^T @ grad_b`` for ``x A = B``."""
    if left:
        return ops.matmul(grad_b, ops.transpose(x, -2, -1))
    return ops.matmul(ops.transpose(x, -2, -1), grad_b)


@backward_helper
def triangular_part(x, upper, unitriangular):
    """The triangle of ``x`` that a triangular matrix uses (strict if unitriangular)."""
    if upper:
        return ops.triu(x, 1 if unitriangular else 0)
    return ops.tril(x, -1 if unitriangular else 0)


# -------------------------------------------------------------------- nn.functional
@backward_helper
def gelu_derivative(x, approximate):
    """d gelu(x) / dx, exact (``approximate='none'``) or of the tanh approximation."""
    if approximate == "none":
        return (0.5 * ops.erfc(x * -0.7071067811865476)
                + x * 0.3989422804014327 * ops.exp(-0.5 * x * x))
    t = ops.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))
    return (0.5 * (1 + t)
            + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 0.134145 * x * x))


@backward_helper
def log_softmax_grad(grad, x, dim):
    """The gradient of ``log_softmax(x, dim)`` for ``x``, given its output's ``grad``."""
    return grad - ops.softmax(x, dim) * ops.sum(grad, dim, True)


@backward_helper
def scaled_grad(grad, reduction, shape):
    """``grad`` divided by the count a ``'mean'`` loss over ``shape`` averaged."""
    return grad / loss_divisor(reduction, shape)


@backward_helper
def weighted_grad(grad, reduction, shape, weight):
    """:func:`scaled_grad` times the optional per-element ``weight``."""
    return scaled_grad(grad, reduction, shape) * (weight if weight is not None else 1.0)


@backward_helper
def layer_norm_grad(grad, x, normalized_shape, weight, eps):
    """The gradient of ``layer_norm`` for its input, from table ops (differentiable again)."""
    dims = trailing_dims(x.ndim, normalized_shape)
    g = grad if weight is None else grad * weight
    xhat = ops.layer_norm(x, normalized_shape, None, None, eps)
    return ops.rsqrt(ops.var(x, dims, 0.0, True) + eps) * (
        g - ops.mean(g, dims, True) - xhat * ops.mean(g * xhat, dims, True))
