"""Finite-difference gradient checks: ``gradcheck`` and ``gradgradcheck``."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..tensor import Tensor
from .run import grad


class GradcheckError(RuntimeError):
    """Analytic and numerical Jacobians differ."""


@dataclass
class Mismatch:
    output: int
    input: int
    out_index: tuple
    in_index: tuple
    analytic: float
    numeric: float


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _float_outputs(outputs) -> list[Tensor]:
    return [o for o in _as_tuple(outputs) if isinstance(o, Tensor) and o.dtype.kind == "f"]


def _diff_inputs(inputs: tuple) -> list[int]:
    return [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]


def _evaluate(fn: Callable, inputs: tuple) -> list[np.ndarray]:
    """Flat float64 copies of fn's floating outputs (run with grad mode as it is, so
    that a function which itself differentiates, as in gradgradcheck, works)."""
    return [o.numpy().astype(np.float64).reshape(-1).copy()
            for o in _float_outputs(fn(*inputs))]


def numerical_jacobian(fn: Callable, inputs: tuple, eps: float) -> list[list[np.ndarray]]:
    """J[o][i] of shape (out_o.size, in_i.size) by central differences."""
    diff = _diff_inputs(inputs)
    outs = _float_outputs(fn(*inputs))
    jac = [[np.zeros((o.size, inputs[i].size)) for i in diff] for o in outs]
    for col, i in enumerate(diff):
        data = inputs[i]._data
        flat = data.reshape(-1)
        for j in range(flat.size):
            orig = flat[j].item()
            flat[j] = orig + eps
            plus = _evaluate(fn, inputs)
            flat[j] = orig - eps
            minus = _evaluate(fn, inputs)
            flat[j] = orig
            for o, (p, m) in enumerate(zip(plus, minus, strict=True)):
                jac[o][col][:, j] = (p - m) / (2 * eps)
    return jac


def analytical_jacobian(fn: Callable, inputs: tuple) -> list[list[np.ndarray]]:
    """J[o][i] from one backward per output element."""
    diff = _diff_inputs(inputs)
    outs = _float_outputs(fn(*inputs))
    jac = [[np.zeros((o.size, inputs[i].size)) for i in diff] for o in outs]
    for o, out in enumerate(outs):
        if not out.requires_grad:
            continue
        for k in range(out.size):
            seed = np.zeros(out.shape, out.dtype)
            seed.reshape(-1)[k] = 1
            grads = grad(out, [inputs[i] for i in diff], Tensor._make(seed),
                         retain_graph=True, allow_unused=True)
            for col, g in enumerate(grads):
                if g is not None:
                    jac[o][col][k, :] = g.numpy().astype(np.float64).reshape(-1)
    return jac


def _mismatches(analytic, numeric, inputs, outs, atol, rtol) -> list[Mismatch]:
    found = []
    diff = _diff_inputs(inputs)
    for o, (arow, nrow) in enumerate(zip(analytic, numeric, strict=True)):
        for col, (a, n) in enumerate(zip(arow, nrow, strict=True)):
            bad = ~np.isclose(a, n, rtol=rtol, atol=atol, equal_nan=True)
            for r, c in zip(*np.nonzero(bad), strict=True):
                found.append(Mismatch(o, diff[col], np.unravel_index(r, outs[o].shape),
                                      np.unravel_index(c, inputs[diff[col]].shape),
                                      float(a[r, c]), float(n[r, c])))
    found.sort(key=lambda m: -abs(m.analytic - m.numeric))
    return found


def describe(mismatches: Sequence[Mismatch], limit: int = 10) -> str:
    lines = [f"Jacobian mismatch in {len(mismatches)} entries (worst first):",
             "  output  input  out_index  in_index      analytic       numeric    difference"]
    for m in mismatches[:limit]:
        lines.append(f"  {m.output:6d}  {m.input:5d}  {str(tuple(map(int, m.out_index))):9s}  "
                     f"{str(tuple(map(int, m.in_index))):9s}  {m.analytic:12.6g}  "
                     f"{m.numeric:12.6g}  {m.analytic - m.numeric:12.4g}")
    return "\n".join(lines)


def _check_dtypes(inputs: tuple) -> None:
    for i in _diff_inputs(inputs):
        if inputs[i].dtype != np.float64:
            warnings.warn(f"gradcheck: input {i} is {inputs[i].dtype}, not float64; finite "
                          "differences will be inaccurate", UserWarning, stacklevel=3)


def _fast_check(fn, inputs, eps, atol, rtol, seed=0) -> list[Mismatch]:
    """PyTorch's fast mode: compare v^T J u for random u, v instead of whole Jacobians."""
    return _projection_check(fn, inputs, inputs, eps, atol, rtol, seed)


def gradcheck(fn: Callable, inputs, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, raise_exception: bool = True, fast_mode: bool = False,
              **_ignored) -> bool:
    """Compare the analytic Jacobian of ``fn`` at ``inputs`` with central differences."""
    inputs = _as_tuple(inputs)
    _check_dtypes(inputs)
    if not _diff_inputs(inputs):
        raise ValueError("gradcheck: no input requires grad")
    if fast_mode:
        bad = _fast_check(fn, inputs, eps, atol, rtol)
    else:
        numeric = numerical_jacobian(fn, inputs, eps)
        analytic = analytical_jacobian(fn, inputs)
        outs = _float_outputs(fn(*inputs))
        bad = _mismatches(analytic, numeric, inputs, outs, atol, rtol)
    if bad:
        if raise_exception:
            raise GradcheckError("gradcheck failed.\n" + describe(bad))
        return False
    return True


def gradgradcheck(fn: Callable, inputs, grad_outputs=None, eps: float = 1e-6,
                  atol: float = 1e-5, rtol: float = 1e-3, raise_exception: bool = True,
                  fast_mode: bool = False, seed: int = 0, **_ignored) -> bool:
    """Check second derivatives: gradcheck of the map (inputs, v) -> J(inputs)^T v."""
    inputs = _as_tuple(inputs)
    outs = _float_outputs(fn(*inputs))
    rng = np.random.default_rng(seed)
    if grad_outputs is None:
        grad_outputs = tuple(Tensor(rng.standard_normal(o.shape), dtype=o.dtype,
                                    requires_grad=True) for o in outs)
    grad_outputs = _as_tuple(grad_outputs)
    diff = _diff_inputs(inputs)
    n = len(inputs)

    def first_order(*args):
        xs, vs = args[:n], args[n:]
        ys = [o for o in _float_outputs(fn(*xs)) if o.requires_grad]
        gs = grad(ys, [xs[i] for i in diff], vs[:len(ys)], create_graph=True,
                  allow_unused=True)
        return tuple(g for g in gs if g is not None)

    return gradcheck(first_order, inputs + tuple(grad_outputs), eps=eps, atol=atol,
                     rtol=rtol, raise_exception=raise_exception, fast_mode=fast_mode)


@dataclass
class JacobianComparison:
    """What :func:`gradcheck` compares, kept for inspection (used by ``nbgrad check``).

    ``analytic[o][k]`` and ``numeric[o][k]`` are float64 arrays of shape
    ``(outputs[o].size, inputs[diff_inputs[k]].size)``; both are ``None`` in fast mode,
    where each mismatch is one random projection ``v^T J u`` (indices left empty).
    """

    analytic: list[list[np.ndarray]] | None
    numeric: list[list[np.ndarray]] | None
    diff_inputs: list[int]
    out_shapes: list[tuple[int, ...]]
    in_shapes: list[tuple[int, ...]]
    out_requires_grad: list[bool]
    mismatches: list[Mismatch]

    @property
    def ok(self) -> bool:
        return not self.mismatches


def compare_jacobians(fn: Callable, inputs, eps: float = 1e-6, atol: float = 1e-5,
                      rtol: float = 1e-3, fast_mode: bool = False,
                      numeric_inputs=None, seed: int = 0) -> JacobianComparison:
    """gradcheck's comparison, returned instead of raised: both Jacobians and the entries
    where they differ (worst first). Same tolerances and rules as :func:`gradcheck`.

    ``numeric_inputs`` (same structure as ``inputs``, e.g. float64 copies of float32
    inputs) are where the finite differences are taken instead, so a float32 analytic
    gradient can be checked against an accurate float64 reference.
    """
    inputs = _as_tuple(inputs)
    diff = _diff_inputs(inputs)
    if not diff:
        raise ValueError("gradcheck: no input requires grad")
    outs = _float_outputs(fn(*inputs))
    shapes = ([tuple(o.shape) for o in outs], [tuple(inputs[i].shape) for i in diff],
              [o.requires_grad for o in outs])
    if numeric_inputs is None:
        if fast_mode:
            return JacobianComparison(None, None, diff, *shapes,
                                      _fast_check(fn, inputs, eps, atol, rtol))
        numeric_inputs = inputs
    numeric_inputs = _as_tuple(numeric_inputs)
    if _diff_inputs(numeric_inputs) != diff or len(numeric_inputs) != len(inputs):
        raise ValueError("compare_jacobians: numeric_inputs must match inputs (same "
                         "positions requiring grad)")
    if fast_mode:
        return JacobianComparison(None, None, diff, *shapes,
                                  _projection_check(fn, inputs, numeric_inputs, eps, atol,
                                                    rtol, seed))
    numeric = numerical_jacobian(fn, numeric_inputs, eps)
    analytic = analytical_jacobian(fn, inputs)
    return JacobianComparison(analytic, numeric, diff, *shapes,
                              _mismatches(analytic, numeric, inputs, outs, atol, rtol))


def _projection_check(fn, inputs, numeric_inputs, eps, atol, rtol, seed) -> list[Mismatch]:
    """Fast mode with the finite differences taken at ``numeric_inputs``."""
    rng = np.random.default_rng(seed)
    diff = _diff_inputs(inputs)
    outs = _float_outputs(fn(*inputs))
    us = [rng.standard_normal(inputs[i].shape) for i in diff]
    vs = [rng.standard_normal(o.shape) for o in outs]
    saved = [numeric_inputs[i]._data.copy() for i in diff]

    def shifted(sign: float) -> list[np.ndarray]:
        for i, u, x in zip(diff, us, saved, strict=True):
            numeric_inputs[i]._data[...] = x + sign * eps * u
        try:
            return _evaluate(fn, numeric_inputs)
        finally:
            for i, x in zip(diff, saved, strict=True):
                numeric_inputs[i]._data[...] = x

    plus, minus = shifted(1.0), shifted(-1.0)
    found = []
    for o, (out, v) in enumerate(zip(outs, vs, strict=True)):
        numeric = float(np.sum(v.reshape(-1) * (plus[o] - minus[o]) / (2 * eps)))
        analytic = 0.0
        if out.requires_grad:
            grads = grad(out, [inputs[i] for i in diff], Tensor._make(v.astype(out.dtype)),
                         retain_graph=True, allow_unused=True)
            analytic = float(sum(np.sum(g.numpy().astype(np.float64) * u)
                                 for g, u in zip(grads, us, strict=True) if g is not None))
        if not np.isclose(analytic, numeric, rtol=rtol, atol=atol):
            found.append(Mismatch(o, -1, (), (), analytic, numeric))
    return found
