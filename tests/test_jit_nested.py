"""A jitted function called inside a jitted function (or a loop body) is inlined into
the outer trace, so gradients flow through it exactly as eagerly (they were silently
None on the first call and raised on the second)."""

import numpy as np
import pytest

import nbgrad as nb


def inner(a, b):
    return (a * nb.sin(b)).sum()


OUTER = {
    "call": lambda f: lambda a, b: f(a, b) * 2.0,
    "twice": lambda f: lambda a, b: f(a, b) * f(b, a),
    "in_fori_loop": lambda f: lambda a, b: nb.fori_loop(
        0, 3, lambda i, c: c * 0.5 + f(a, b), a.sum()),
    "nested_grad": lambda f: lambda a, b: nb.grad(f)(a, b).sum() + f(a, b),
}


@pytest.fixture(autouse=True)
def _no_promotion_check():
    previous = nb.jit.set_promotion_check(False)
    yield
    nb.jit.set_promotion_check(previous)


@pytest.mark.parametrize("name", sorted(OUTER))
@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_nested_jit_matches_eager(name, mode):
    x, y = np.array([0.3, -0.4, 1.2]), np.array([0.6, 0.2, -0.7])

    def run(fn):
        a = nb.tensor(x, requires_grad=True)
        b = nb.tensor(y, requires_grad=True)
        out = fn(a, b)
        out.backward()
        return np.asarray(out.detach()), np.asarray(a.grad), np.asarray(b.grad)

    want = run(OUTER[name](inner))
    compiled = nb.jit(OUTER[name](nb.jit(inner, mode=mode)), mode=mode)
    for _ in range(3):
        got = run(compiled)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
