"""Name the likely cause of a Jacobian mismatch: a constant factor, a flipped sign, a
transposed gradient, a missing (unconnected) gradient, a few bad entries near a kink.

Works on one block ``J[output][input]`` of shape ``(output.size, input.size)`` as
:func:`nbgrad.autograd.gradcheck.compare_jacobians` returns it.
"""

from __future__ import annotations

import numpy as np


def _close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    return bool(np.allclose(a, b, rtol=rtol, atol=atol))


def _nice(x: float) -> str:
    """A ratio as users would write it: 2.0, 0.5, -3.0, 0.333333."""
    return repr(float(f"{x:.6g}"))


def constant_factor(analytic: np.ndarray, numeric: np.ndarray, atol: float,
                    rtol: float) -> float | None:
    """``r`` with analytic == r * numeric (within tolerance), else None."""
    scale = float(np.max(np.abs(numeric))) if numeric.size else 0.0
    mask = np.abs(numeric) > max(atol, 1e-3 * scale)
    if not mask.any():
        return None
    ratio = float(np.median(analytic[mask] / numeric[mask]))
    if not np.isfinite(ratio) or abs(ratio) < 1e-12:
        return None
    if _close(analytic, ratio * numeric, atol * max(1.0, abs(ratio)), rtol):
        return ratio
    return None


def _transposed(analytic: np.ndarray, numeric: np.ndarray, in_shape: tuple, atol: float,
                rtol: float) -> str | None:
    if analytic.shape[0] == analytic.shape[1] and analytic.shape[0] > 1 and \
            _close(analytic, numeric.T, atol, rtol):
        return ("the analytic Jacobian is the transpose of the numeric one: the backward "
                "multiplies by a matrix where it should use its transpose (a missing or "
                "extra .T?)")
    if len(in_shape) >= 2 and in_shape[-1] == in_shape[-2] and in_shape[-1] > 1:
        a = analytic.reshape((analytic.shape[0], *in_shape))
        n = numeric.reshape((numeric.shape[0], *in_shape))
        if _close(a, np.swapaxes(n, -1, -2), atol, rtol):
            return ("the gradient has the right values in transposed positions: the "
                    "backward returns the transpose of the input's gradient")
    return None


def diagnose(analytic: np.ndarray, numeric: np.ndarray, in_shape: tuple, atol: float,
             rtol: float, connected: bool = True) -> str:
    """One sentence naming the most likely cause of ``analytic != numeric``."""
    if not np.all(np.isfinite(numeric)):
        return ("the function is not finite (NaN or inf) near these inputs, so finite "
                "differences are meaningless here: choose another --domain or --seed")
    if not np.all(np.isfinite(analytic)):
        return ("the analytic gradient contains NaN or inf where the finite differences are "
                "finite (a division by zero or log of zero in the backward?)")
    small = max(atol, 1e-12)
    a_zero = float(np.max(np.abs(analytic), initial=0.0)) <= small
    n_zero = float(np.max(np.abs(numeric), initial=0.0)) <= small
    if a_zero and not n_zero:
        if not connected:
            return ("the gradient is missing: the output is not connected to this input in "
                    "the graph (a detach(), no_grad(), .numpy() or a tensor rebuilt from "
                    "values inside the function?)")
        return ("the analytic gradient is zero although the function changes with this input "
                "(the backward returns zeros, or the path to the input is cut)")
    if n_zero and not a_zero:
        return ("the function does not change with this input, but the analytic gradient is "
                "not zero (a gradient returned for the wrong input?)")
    if _close(analytic, -numeric, atol, rtol):
        return "the analytic gradient has its sign flipped (analytic = -numeric)"
    factor = constant_factor(analytic, numeric, atol, rtol)
    if factor is not None:
        return f"the analytic gradient is off by a constant factor {_nice(factor)}"
    transposed = _transposed(analytic, numeric, in_shape, atol, rtol)
    if transposed:
        return transposed
    bad = ~np.isclose(analytic, numeric, rtol=rtol, atol=atol)
    n_bad, n_all = int(bad.sum()), bad.size
    if n_bad and n_bad <= max(1, n_all // 4):
        return (f"only {n_bad} of {n_all} Jacobian entries differ and the rest agree: an input "
                "may sit next to a kink or jump of the function (abs, relu, max, clamp, "
                "round; try another --seed), or the backward is wrong for some elements "
                "only (an indexing or broadcasting mistake)")
    return ("no simple pattern (not a constant factor, a sign flip, a transpose or a "
            "missing gradient): the backward formula itself is probably wrong")
