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

from ..tensor import Tensor
from ..testing import OpRecord, Sample, make_inputs

#: what float32 checks use at least (finite differences in float32 are far noisier)
FLOAT32_FLOORS = {"eps": 1e-3, "atol": 1e-2, "rtol": 3e-2}


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
            base = {k: max(v, FLOAT32_FLOORS[k]) for k, v in base.items()}
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


def first_order_problem(fn: Callable, inputs: tuple, seed: int = 0
                        ) -> tuple[Callable, tuple[Tensor, ...]]:
    """The map ``(inputs, v) -> J(inputs)^T v`` whose gradcheck is a second-order check
    (the construction of :func:`nbgrad.autograd.gradgradcheck`)."""
    from ..autograd import grad
    from ..autograd.gradcheck import _diff_inputs, _float_outputs
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
