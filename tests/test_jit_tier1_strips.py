"""Tier 1 runs chains of elementwise instructions over large arrays strip by strip
(:mod:`nbgrad.jit.tier1.strips`): the results must be bit for bit those of the
unstripped tape, with whole and ragged last strips, scratch values, in-place carries,
scalar operands and slots; and a chain that strip order would change is left alone."""

from __future__ import annotations

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.jit.tier1 import interpreter as I
from nbgrad.jit.tier1 import storage, strips
from nbgrad.jit.tier1.operands import Instr, Loc, Storage
from nbgrad.jit.tier1.tape import TapeExecutable
from nbgrad.testing.fuzz import differential as diff_mod
from nbgrad.testing.fuzz.runner import run_seeds


def _tapes(f) -> list[TapeExecutable]:
    return [exe for entry in f._cache.values()
            for exe in entry.program.executables().values() if isinstance(exe, TapeExecutable)]


def _run(fn, arrays, strip: int | None, calls: int = 2):
    """``fn`` jitted on tier 1 (``strip``: elements per strip for every chain; None: no
    strips); (its value and gradients on the last call, its tapes)."""
    with pytest.MonkeyPatch.context() as mp:
        if strip is None:
            mp.setattr(strips, "MIN_ELEMENTS", 1 << 62)
        else:
            mp.setattr(strips, "MIN_ELEMENTS", 1)
            mp.setattr(strips, "STRIP", strip)
        f = nb.jit(nb.value_and_grad(fn, argnums=tuple(range(len(arrays)))),
                   mode="interpret")
        for _ in range(calls):
            value, grads = f(*[nb.tensor(a) for a in arrays])
    return [value.numpy()] + [g.numpy() for g in grads], _tapes(f)


def _stripped(tapes) -> int:
    return sum(int(np.count_nonzero(t.ins[:, I.F_OP] == I.OP_STRIP)) for t in tapes)


def _softclip_loop(x0):
    """W5's step (abs, add, div, mul, mul, add) in a fori_loop, its backward another."""
    def body(i, x):
        return 0.9 * x + 0.1 * (x / (1.0 + nb.abs(x)))
    return nb.fori_loop(0, 5, body, x0).sum()


def _mixed(x, y):
    """Unary hot and generic ops, scalars on either side, a ternary where, a value
    used after its chain (by a reduction) and one returned."""
    a = nb.exp(x * 0.3) - y / 2.0
    b = nb.where(a > 0.1, nb.tanh(a), 2.0 - nb.sigmoid(y))
    c = nb.log1p(b * b) + nb.sin(x)
    return (c.sum() + (a * c).mean()) * 1.5


@pytest.mark.parametrize("strip", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("fn,n_args", [(_softclip_loop, 1), (_mixed, 2)])
def test_stripped_tapes_equal_unstripped_ones_bit_for_bit(fn, n_args, strip):
    rng = np.random.default_rng(strip)
    arrays = [rng.standard_normal(23) * 2.0 for _ in range(n_args)]  # ragged last strip
    want, plain = _run(fn, arrays, None)
    got, tapes = _run(fn, arrays, strip)
    assert _stripped(plain) == 0 and _stripped(tapes) >= 1
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_w5_chains_are_stripped_at_their_size_and_match_the_reference():
    n = 3 * strips.STRIP + 5  # large enough for the default strips, a ragged last one
    x = np.random.default_rng(0).standard_normal(n) * 2.0
    f = nb.jit(nb.value_and_grad(_softclip_loop), mode="interpret")
    value, grad = f(nb.tensor(x))
    value, grad = f(nb.tensor(x))
    tape = _tapes(f)[0]
    assert _stripped([tape]) == 2  # the forward loop's body and the backward's
    assert "STRIP" in f.source(nb.tensor(x))
    # scratch: the forward's intermediates take a strip each, not n elements
    _, plain = _run(_softclip_loop, [x], None)
    assert tape.size < plain[0].size - 2 * n
    xr, g = x.copy(), np.ones(n)
    for _ in range(5):
        d = 1.0 + np.abs(xr)
        g *= 0.9 + 0.1 / (d * d)
        xr = 0.9 * xr + 0.1 * (xr / d)
    np.testing.assert_allclose(value.numpy(), xr.sum(), rtol=1e-13)
    np.testing.assert_allclose(grad.numpy(), g, rtol=1e-13)


def _instr(op, o, a, b=None, n=4, f=0):
    return Instr(op, o=o, a=a, b=b, n=n, m=1, f=f)


def test_a_chain_reading_what_it_writes_at_another_offset_is_left_alone(monkeypatch):
    mul, add = I.BINARY_CODE["mul"], I.BINARY_CODE["add"]
    x, s, two = Storage(4), Storage(8), Storage(1)
    # s[0:4] = x * 2; t = s[1:5] + x: strip order would read s[2] before writing it
    first = _instr(mul, Loc(s), Loc(x), Loc(two), f=1)
    second = _instr(add, Loc(Storage(4)), Loc(s, 1), Loc(x))
    monkeypatch.setattr(strips, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(strips, "STRIP", 2)
    assert not strips._safe([first, second])
    assert strips.strip_chains([first, second], set()) == [first, second]
    # read at one offset only, the same chain is stripped
    second.a = second.reads[0] = Loc(s)
    assert strips._safe([first, second])
    assert strips.strip_chains([first, second], set())[0].op == I.OP_STRIP
    # a scalar operand written inside the chain: left alone
    third = _instr(add, Loc(Storage(4)), Loc(x), Loc(s), f=1)
    assert not strips._safe([first, third])


def test_the_strips_executor_fuzzes_stripped_tapes():
    summary = run_seeds(range(6000, 6090), ("strips",))
    assert not summary.failures, summary.text()
    tried = summary.tried
    # nearly every program ran a strip: an executor that silently stopped stripping
    # would check nothing new
    assert tried.get("strips on strips", 0) >= 0.9 * tried.get("strips", 1), tried
    saved = strips.MIN_ELEMENTS, strips.STRIP, storage.OUTSIDE_MIN
    with diff_mod.strips_everywhere(3):
        assert (strips.MIN_ELEMENTS, strips.STRIP, storage.OUTSIDE_MIN) == (1, 3, 1)
    assert (strips.MIN_ELEMENTS, strips.STRIP, storage.OUTSIDE_MIN) == saved
