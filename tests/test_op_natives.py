"""Opaque ops' natives: every one declares a native ``@njit`` function or why it has none;
the native, called with the arguments generated code passes (``NativePlan``: flat arrays,
then the plan's constants), gives what the op's CPU kernel gives on every sample of the
op's record (``tests/test_tier2_kinds.py`` runs them from generated code); and each
compiles once per dtype."""

from __future__ import annotations

import numpy as np
import pytest
from numba import types

import nbgrad as nb
from nbgrad.kernels.layout import native_const
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


def _native_result(op, args: tuple):
    """The native's result on a kernel call's arguments, as generated code calls it (see
    ``NativePlan``): each tensor flat, a tensor list as a tuple, an absent tensor empty,
    then the plan's constants; the flat results reshaped to the plan's shapes."""
    kind = op.kind
    arrays, shaped = [], []
    for i, p in enumerate(op.params):
        if p.is_tensor:
            arrays.append(args[i])
            shaped.append(args[i])
        elif p.is_tensor_list:
            arrays.append(tuple(args[i]))
            shaped.extend(args[i])
    attrs = {name: args[i] for i, name in op.attr_names}
    plan = kind.static(attrs, tuple(None if a is None else np.shape(a) for a in shaped))
    like = next(a for a in shaped if a is not None).dtype

    def flat(a):
        if a is None:
            return np.empty(0, like)
        if isinstance(a, tuple):
            return tuple(flat(b) for b in a)
        return np.array(a, order="C", copy=True).reshape(-1)
    consts = tuple(native_const(c) for c in plan.consts)
    out = kind.native(*(flat(a) for a in arrays), *consts)  # as generated code passes them
    if len(plan.shapes) == 1:
        return out.reshape(plan.shapes[0])
    return tuple(o.reshape(s) for o, s in zip(out, plan.shapes, strict=True))


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


def _abi_breaks(sig) -> list[str]:
    """The arguments of a native's compiled signature that break the flat ABI
    (``NativePlan``): an array that is not 1-D, a tuple that is not of 1-D arrays."""
    bad = []
    for t in sig:
        if isinstance(t, types.Array) and t.ndim != 1:
            bad.append(str(t))
        elif isinstance(t, types.BaseTuple) and not all(
                isinstance(e, types.Array) and e.ndim == 1 for e in t):
            bad.append(str(t))
    return bad


def test_natives_compile_only_flat_signatures():
    """Run every native op's record through its eager kernel (which calls the native as
    generated code does), then read what Numba compiled: only 1-D arrays and scalars, so
    a native compiles once per dtype, never once per rank, None-pattern or tuple length
    (159 signatures in one ``nbgrad check`` before the flat ABI, 18 of them einsum's)."""
    for name in NATIVE:
        for sample in RECORDS[name].samples(np.random.default_rng(0)):
            args, kwargs = make_inputs(sample, requires_grad=False)
            try:
                RECORDS[name].function()(*args, **kwargs)
            except Exception:  # noqa: BLE001, S112 - a sample meant to raise
                continue
    broken = {n: bad for n in NATIVE for sig in REGISTRY[n].kind.native.signatures
              if (bad := _abi_breaks(sig))}
    assert not broken, f"natives compiled with shaped arguments: {broken}"


def test_a_native_compiles_once_across_ranks_and_dims():
    native = REGISTRY["var"].kind.native
    for nd in range(5):
        x = nb.tensor(np.random.default_rng(nd).random((2,) * nd))
        for dim in [None, *range(nd), tuple(range(0, nd, 2))]:
            nb.var(x, dim=dim)
            nb.std(x, dim=dim, keepdim=True)
    f64 = [s for s in native.signatures if s[0] == types.float64[::1]]
    assert len(f64) == 1, f64
