"""Turn op records and user functions into gradcheck problems: ``(fn, tensors)``.

A problem's function takes only tensors (non-tensor arguments of a sample are bound
in a closure, lists of tensors are flattened), so the same function can be handed to
``gradcheck`` directly or wrapped in ``nbgrad.jit`` first.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..autograd import grad
from ..autograd.gradcheck import _diff_inputs, _evaluate, _float_outputs
from ..tensor import Tensor
from ..testing import OpRecord, Sample, make_inputs

#: the least tolerances of a float32 check. Its finite differences are taken in float64
#: (at the same, exactly representable points, with the float64 step), so only the
#: float32 rounding of the analytic gradient needs the extra room.
FLOAT32_FLOORS = {"atol": 1e-4, "rtol": 1e-3}


@dataclass(frozen=True)
class Tolerances:
    """Finite-difference step and comparison tolerances of one check."""

    eps: float
    atol: float
    rtol: float

    @classmethod
    def choose(cls, record_like, dtype: str, eps: float | None, atol: float | None,
               rtol: float | None) -> Tolerances:
        """The record's (or gradcheck's default) tolerances, overridden by explicit flags;
        for float32, raised to at least :data:`FLOAT32_FLOORS`."""
        base = {"eps": getattr(record_like, "eps", 1e-6),
                "atol": getattr(record_like, "atol", 1e-5),
                "rtol": getattr(record_like, "rtol", 1e-3)}
        if dtype == "float32":
            base.update({k: max(base[k], v) for k, v in FLOAT32_FLOORS.items()})
        given = {"eps": eps, "atol": atol, "rtol": rtol}
        base.update({k: v for k, v in given.items() if v is not None})
        return cls(**base)


def name_seed(name: str) -> int:
    """The per-op seed the generated tests use (tests/test_ops_table.py)."""
    return sum(ord(c) * 31 ** i for i, c in enumerate(name)) % 2**32


def op_rng(name: str, seed: int | None) -> np.random.Generator:
    """Samples of op ``name``: the tests' stream by default, a ``seed``-mixed one if given."""
    if seed is None:
        return np.random.default_rng(name_seed(name))
    return np.random.default_rng([int(seed), name_seed(name)])


def record_problem(rec: OpRecord, sample: Sample, dtype: np.dtype
                   ) -> tuple[Callable, tuple[Tensor, ...]] | None:
    """``(fn, tensors)`` for one sample of an op record, or None when nothing in the
    sample is differentiable."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args, kwargs = make_inputs(sample, dtype=dtype)
    fn = rec.function()
    tensors: list[Tensor] = []
    slots: list[tuple] = []
    for a in args:
        if isinstance(a, Tensor):
            slots.append(("tensor", len(tensors)))
            tensors.append(a)
        elif isinstance(a, list) and a and all(isinstance(t, Tensor) for t in a):
            slots.append(("list", len(tensors), len(tensors) + len(a)))
            tensors.extend(a)
        else:
            slots.append(("const", a))
    if not any(t.requires_grad for t in tensors):
        return None

    def call(*ts):
        rebuilt = []
        for slot in slots:
            if slot[0] == "tensor":
                rebuilt.append(ts[slot[1]])
            elif slot[0] == "list":
                rebuilt.append(list(ts[slot[1]:slot[2]]))
            else:
                rebuilt.append(slot[1])
        return fn(*rebuilt, **kwargs)

    call.__name__ = f"{rec.name}_sample"
    return call, tuple(tensors)


def float64_twins(inputs: tuple) -> tuple:
    """Float64 copies of the floating tensors of ``inputs`` (same values, same
    requires_grad): where a float32 check takes its finite differences."""
    return tuple(Tensor(t.numpy().astype(np.float64), requires_grad=t.requires_grad)
                 if isinstance(t, Tensor) and t.dtype.kind == "f" else t for t in inputs)


#: a float32 check of a function whose float64 evaluation differs (random masks drawn per
#: dtype, dtype-dependent branches) takes float32 finite differences with these floors
FLOAT32_FD_FLOORS = {"eps": 1e-3, "atol": 1e-2, "rtol": 3e-2}


def float64_reference(fn: Callable, inputs: tuple) -> tuple | None:
    """Float64 twins of float32 ``inputs`` when ``fn`` computes the same function on them
    (outputs agree to float32 accuracy), else None (then differences stay in float32)."""
    twins = float64_twins(inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        low, high = _evaluate(fn, inputs), _evaluate(fn, twins)
    if len(low) != len(high):
        return None
    for a, b in zip(low, high, strict=True):
        scale = max(1.0, float(np.max(np.abs(b), initial=0.0)))
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-3, atol=1e-4 * scale,
                                                 equal_nan=True):
            return None
    return twins


def float32_fd_tolerances(tol: Tolerances) -> Tolerances:
    """``tol`` widened for finite differences taken in float32 itself."""
    return Tolerances(**{k: max(getattr(tol, k), v) for k, v in FLOAT32_FD_FLOORS.items()})


def first_order_problem(fn: Callable, inputs: tuple, seed: int = 0
                        ) -> tuple[Callable, tuple[Tensor, ...]]:
    """The map ``(inputs, v) -> J(inputs)^T v`` whose gradcheck is a second-order check
    (the construction of :func:`nbgrad.autograd.gradgradcheck`)."""
    rng = np.random.default_rng(seed)
    outs = _float_outputs(fn(*inputs))
    vs = tuple(Tensor(rng.standard_normal(o.shape), dtype=o.dtype, requires_grad=True)
               for o in outs)
    diff = _diff_inputs(inputs)
    n = len(inputs)

    def first_order(*args):
        xs, v = args[:n], args[n:]
        pairs = [(o, v[k]) for k, o in enumerate(_float_outputs(fn(*xs)))
                 if o.requires_grad and k < len(v)]
        if not pairs:
            return ()
        gs = grad([o for o, _ in pairs], [xs[i] for i in diff], [g for _, g in pairs],
                  create_graph=True, allow_unused=True)
        return tuple(g for g in gs if g is not None)

    return first_order, tuple(inputs) + vs
