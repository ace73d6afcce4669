"""Opaque ops' natives: every one declares a native ``@njit`` function or why it has none,
and the native, called from ``@njit`` code as generated code calls it (C-contiguous
arrays, then ``kind.static(attrs, shapes)``), gives what the op's CPU kernel gives on
every sample of the op's record."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import nbgrad as nb
from nbgrad.ops.reduction import shift_along
from nbgrad.ops.registry import REGISTRY
from nbgrad.ops.traits import Opaque
from nbgrad.testing.core import all_records, make_inputs

OPAQUE = sorted(n for n, op in REGISTRY.items() if op.entry is not None
                and isinstance(op.kind, Opaque))
NATIVE = [n for n in OPAQUE if REGISTRY[n].kind.native is not None]
RECORDS = all_records()


def test_every_opaque_op_declares_a_native_or_why_not():
    both = [n for n in OPAQUE if REGISTRY[n].kind.native is not None
            and REGISTRY[n].kind.why_not_native]
    neither = [n for n in OPAQUE if REGISTRY[n].kind.native is None
               and not REGISTRY[n].kind.why_not_native]
    assert not both, f"ops declaring a native and a reason not to have one: {both}"
    assert not neither, f"opaque ops with neither a native nor a reason: {neither}"


def test_why_not_native_is_one_line():
    for n in OPAQUE:
        why = REGISTRY[n].kind.why_not_native
        assert why is None or (why.strip() and "\n" not in why), n


def _kernel_calls(name: str, sample) -> list[tuple[tuple, object]]:
    """Every call of op ``name``'s CPU kernel (arguments, result) while the op's record
    runs ``sample``."""
    op = REGISTRY[name]
    original = op.kernels["cpu"]
    calls = []

    def spy(*args):
        out = original(*args)
        calls.append((args, out))
        return out

    op.kernels["cpu"] = spy
    try:
        args, kwargs = make_inputs(sample, requires_grad=False)
        RECORDS[name].function()(*args, **kwargs)
    finally:
        op.kernels["cpu"] = original
    return calls


_WRAPPERS: dict = {}


def _njit_caller(native, n_args: int):
    """An ``@njit`` function calling ``native`` with its ``n_args`` arguments."""
    key = (native, n_args)
    if key not in _WRAPPERS:
        names = ", ".join(f"a{i}" for i in range(n_args))
        scope = {"native": native}
        exec(f"def call({names}):\n    return native({names})\n", scope)  # noqa: S102
        _WRAPPERS[key] = njit(scope["call"])
    return _WRAPPERS[key]


def _native_result(op, args: tuple):
    """The native's result on a kernel call's arguments, as generated code calls it: each
    tensor C-contiguous, a tensor list as a tuple, then the static's constants."""
    kind = op.kind
    arrays, flat = [], []
    for i, p in enumerate(op.params):
        if p.is_tensor:
            a = None if args[i] is None else np.array(args[i], order="C", copy=True)
            arrays.append(a)
            flat.append(a)
        elif p.is_tensor_list:
            items = tuple(np.array(a, order="C", copy=True) for a in args[i])
            arrays.append(items)
            flat.extend(items)
    attrs = {name: args[i] for i, name in op.attr_names}
    shapes = tuple(None if a is None else a.shape for a in flat)
    consts = (tuple(kind.static(attrs, shapes)) if kind.static is not None
              else tuple(args[i] for i in op.attr_pos))
    return _njit_caller(kind.native, len(arrays) + len(consts))(*arrays, *consts)


def _assert_same(got, want, what: str) -> None:
    got = got if isinstance(got, tuple) else (got,)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        w = np.asarray(w)
        assert isinstance(g, np.ndarray), f"{what}: output {k} is a {type(g).__name__}"
        assert g.dtype == w.dtype and g.shape == w.shape, \
            f"{what}: output {k} is {g.shape} {g.dtype}, the kernel gives {w.shape} {w.dtype}"
        np.testing.assert_array_equal(g, w, err_msg=f"{what}: output {k}")


@pytest.mark.parametrize("name", NATIVE)
def test_native_matches_kernel(name):
    """Every kernel call the record's samples make (a sample taking another path, e.g.
    cross_entropy's probability targets, makes none)."""
    calls = [call for sample in RECORDS[name].samples(np.random.default_rng(0))
             for call in _kernel_calls(name, sample)]
    assert calls, f"{name}: no sample of its record reaches the kernel"
    for k, (args, want) in enumerate(calls):
        _assert_same(_native_result(REGISTRY[name], args), want, f"{name} native, call {k}")


def test_eager_kernels_reuse_constants_only_for_the_same_attributes():
    """The kernels keep each static's constants per (shapes, attributes): a fill of -0.0
    is not the cached one of 0.0, nor True the one of 1 where the op reads them apart."""
    x = nb.tensor(np.array([1.0, 2.0]))
    plus, minus = shift_along(x, 0, 5, 0.0), shift_along(x, 0, 5, -0.0)
    assert not np.signbit(plus.numpy()).any() and np.signbit(minus.numpy()).all()
    np.testing.assert_array_equal(nb.amax(nb.tensor(np.ones((2, 3))), 1, True).shape, (2, 1))
    np.testing.assert_array_equal(nb.amax(nb.tensor(np.ones((2, 3))), 1, False).shape, (2,))
