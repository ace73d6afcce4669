"""OpRecord, Sample and the input domains they draw from."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..ops.registry import REGISTRY
from ..tensor import Tensor


@dataclass(frozen=True)
class Sample:
    """One call of an op: ``args`` hold NumPy arrays where tensors go."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    note: str = ""
    #: positions of args that are differentiated (default: every float array)
    diff: tuple[int, ...] | None = None


@dataclass(frozen=True)
class OpRecord:
    """How to test one table entry."""

    name: str
    samples: Callable[[np.random.Generator], list[Sample]]
    call: Callable | None = None  # fn(*args, **kwargs); default: the op's function
    ref: Callable | None = None  # NumPy/SciPy reference of the forward
    grad: bool = True  # gradcheck it (False for non-differentiable entries)
    second_order: bool = True
    atol: float = 1e-5
    rtol: float = 1e-3
    eps: float = 1e-6
    ref_rtol: float = 1e-10
    jit: bool = True  # also run it under nbgrad.jit

    def function(self) -> Callable:
        if self.call is not None:
            return self.call
        return REGISTRY[self.name].fn


# ------------------------------------------------------------------ domains
def _real(rng, shape):
    return rng.standard_normal(shape)


def _positive(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


def _unit(rng, shape):
    return rng.uniform(-0.9, 0.9, shape)


def _gt1(rng, shape):
    return rng.uniform(1.2, 3.0, shape)


def _prob(rng, shape):
    return rng.uniform(0.05, 0.95, shape)


def _nonzero(rng, shape):
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def _nonint(rng, shape):
    return np.floor(rng.uniform(-3, 3, shape)) + rng.uniform(0.2, 0.8, shape)


DOMAINS: dict[str, Callable] = {
    "real": _real, "positive": _positive, "unit": _unit, "gt1": _gt1,
    "nonzero": _nonzero, "nonint": _nonint, "prob": _prob,
}

UNARY_SHAPES = [(), (5,), (2, 3)]
BINARY_SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((3, 1, 2), (4, 1)), ((), (2, 2)),
                 ((2, 3), ())]


def sample_array(rng: np.random.Generator, shape, domain: str = "real") -> np.ndarray:
    return np.asarray(DOMAINS[domain](rng, shape), dtype=np.float64)


def unary_samples(domain: str = "real", shapes=UNARY_SHAPES, **kwargs) -> Callable:
    def make(rng):
        return [Sample((sample_array(rng, s, domain),), dict(kwargs), note=f"{s}")
                for s in shapes]
    return make


def binary_samples(domain_a: str = "real", domain_b: str | None = None,
                   shapes=BINARY_SHAPES) -> Callable:
    def make(rng):
        return [Sample((sample_array(rng, a, domain_a), sample_array(rng, b, domain_b or
                                                                     domain_a)),
                       note=f"{a}x{b}") for a, b in shapes]
    return make


def make_inputs(sample: Sample, dtype=np.float64, requires_grad: bool = True
                ) -> tuple[tuple, dict]:
    """Tensors for a sample: float arrays require grad (those in ``diff``, if given)."""
    args = []
    for i, a in enumerate(sample.args):
        args.append(_to_tensor(a, dtype, requires_grad and
                               (sample.diff is None or i in sample.diff)))
    kwargs = {k: _to_tensor(v, dtype, False) for k, v in sample.kwargs.items()}
    return tuple(args), kwargs


def float_tensor_call(rec: OpRecord, sample: Sample) -> tuple[Callable, list[Tensor]]:
    """The op of ``rec`` as a function of the sample's floating tensor arguments only (the
    rest, integer targets and indices included, closed over as constants), and those
    tensors: what the jit tests trace."""
    fn = rec.function()
    args, kwargs = make_inputs(sample, requires_grad=False)
    slots, tensors = [], []
    for i, a in enumerate(args):
        if isinstance(a, Tensor) and a.dtype.kind == "f":
            slots.append((i, None))
            tensors.append(a)
        elif isinstance(a, list) and a and all(isinstance(t, Tensor) and t.dtype.kind == "f"
                                               for t in a):
            slots.append((i, len(a)))
            tensors.extend(a)

    def call(*ts):
        full, k = list(args), 0
        for i, n in slots:
            if n is None:
                full[i] = ts[k]
                k += 1
            else:
                full[i] = list(ts[k:k + n])
                k += n
        return fn(*full, **kwargs)

    return call, tensors


def _to_tensor(value, dtype, requires_grad: bool):
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            return Tensor(value.astype(dtype), requires_grad=requires_grad)
        return Tensor(value)
    if isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
        return [_to_tensor(v, dtype, requires_grad) for v in value]
    return value


def check_array_outputs(outputs, what: str) -> None:
    """Assert that every tensor in ``outputs`` converts with ``np.asarray`` to an ndarray
    of its shape and dtype (0-d results included: a tensor never holds a NumPy scalar)."""
    for k, out in enumerate(outputs if isinstance(outputs, (tuple, list)) else (outputs,)):
        if not isinstance(out, Tensor):
            continue
        assert out.device.type != "cpu" or isinstance(out._data, np.ndarray), \
            f"{what}: output {k} holds a {type(out._data).__name__}, not an ndarray"
        arr = np.asarray(out)
        assert type(arr) is np.ndarray, \
            f"{what}: output {k} converts to {type(arr).__name__}, not an ndarray"
        assert arr.shape == out.shape and arr.dtype == out.dtype, \
            (f"{what}: output {k} converts to {arr.shape} {arr.dtype}, but the tensor is "
             f"{out.shape} {out.dtype}")


def all_records() -> dict[str, OpRecord]:
    """Every record, from every module of :mod:`nbgrad.testing.records`."""
    from . import records
    found: dict[str, OpRecord] = {}
    for info in sorted(pkgutil.iter_modules(records.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{records.__name__}.{info.name}")
        for rec in getattr(module, "RECORDS", ()):
            if rec.name in found:
                raise ValueError(f"two op records for {rec.name!r}")
            found[rec.name] = rec
    return found
