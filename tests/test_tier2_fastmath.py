"""Tier 2 computes as eager mode does, with no fast-math rewrites.

Reciprocal freedom (``arcp``) turned ``0 / 5e-324`` into ``0 * inf = nan``, signed-zero
freedom (``nsz``) flipped ``atan2(-0.0, -1)`` from -pi to pi, FMA contraction gave 1e308
where eager overflows to inf, and reassociation turned ``(x / d) * w`` into
``(x * w) / d`` (nan for a finite result); each compiled function is called twice, since
the first call may take another path.
"""

import numpy as np
import pytest

import nbgrad as nb

CASES = {  # a broadcast 0-d divisor: LLVM hoists its reciprocal out of the loop under arcp
    "div_by_subnormal": (lambda a, b: a / b, [0.0, 1e-300, -0.0, 2.0], 5e-324),
    "signed_zero_atan2": (lambda a, b: nb.atan2(-(a - a), b), [1.0, 2.0], -1.0),
    "no_fma_past_overflow": (lambda a, b: a[:-1] + a[1:] * b, [-1e308, -1e308, 0.5], -2.0),
    "no_reassociated_product": (lambda a, b: (a / (1.0 + nb.abs(a))) * b,
                                [3e307, -3e307, 2.0], 1e300),
}

@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode", ["interpret", "compile"])
def test_generated_code_keeps_ieee_results(name, mode):
    fn, a, b = CASES[name]
    a, b = np.array(a), np.array(b)
    want = np.asarray(fn(nb.tensor(a), nb.tensor(b)))
    compiled = nb.jit(fn, mode=mode)
    for _ in range(2):
        got = np.asarray(compiled(nb.tensor(a), nb.tensor(b)))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
