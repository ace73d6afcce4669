"""Multi-core paths (:mod:`nbgrad.kernels.parallel`) give the serial paths' results, bit
for bit: eager elementwise kernels cut into blocks on threads, tier-2 blocked loops
under ``prange`` (in a child process with ``NUMBA_NUM_THREADS=2``: the suite's own
processes run with one thread)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nbgrad.kernels import elementwise as ew
from nbgrad.kernels import parallel

ROOT = Path(__file__).resolve().parents[1]
N = 3 * parallel.BLOCK + 77  # three whole blocks and a short one


@pytest.mark.parametrize("size,parts", [(N, 2), (N, 3), (N, 7), (parallel.BLOCK, 2),
                                        (parallel.BLOCK + 1, 2), (5, 2)])
def test_cuts_cover_every_element_once_in_whole_blocks(size, parts):
    ranges = parallel.cuts(size, parts)
    assert len(ranges) <= parts
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    for (lo, hi), (lo2, _) in zip(ranges, ranges[1:], strict=False):
        assert hi == lo2 and lo % parallel.BLOCK == 0 and lo < hi
    assert ranges[-1][0] % parallel.BLOCK == 0


def _eager_cases(rng):
    x = rng.standard_normal(N) * 3.0
    x[[5, N - 1]] = [3e6, -2e6]  # beyond TRIG_MAX: sin's libm fix-up pass
    y = rng.standard_normal(N)
    i = rng.integers(-50, 50, N)
    c = x > 0
    one = np.float64(1.5)
    return [
        lambda: ew.run_unary("sin", x, x.dtype),
        lambda: ew.run_unary("exp", x.astype(np.float32), np.dtype(np.float32)),
        lambda: ew.run_unary("softplus", x, x.dtype, 1.0, 20.0),
        lambda: ew.run_binary("mul", x, y, x.dtype),
        lambda: ew.run_binary("sub", x, one, x.dtype),  # array op scalar
        lambda: ew.run_binary("div", y.reshape(1, -1), np.ones((1, 1)), x.dtype),  # b of size 1
        lambda: ew.run_binary("pow", np.full(1, 1.1), y, x.dtype),  # a of size 1
        lambda: ew.run_binary("add", i, i, i.dtype),
        lambda: ew.run_binary("lt", x, y, np.dtype(np.bool_)),
        lambda: ew.run_ternary("where", c, x, y, x.dtype),
        lambda: ew.run_ternary("where", c, x, one, x.dtype),
        lambda: ew.run_ternary("where", c, one, y, x.dtype),
    ]


def test_eager_blocks_on_threads_equal_serial(monkeypatch):
    cases = _eager_cases(np.random.default_rng(0))
    serial = [f() for f in cases]
    calls = []
    run_blocks = parallel.run_blocks
    monkeypatch.setattr(parallel, "MIN_SIZE", 1000)
    monkeypatch.setattr(parallel, "threads", lambda size: 3)  # the suite runs one thread
    monkeypatch.setattr(parallel, "run_blocks",
                        lambda *a: calls.append(a[1:]) or run_blocks(*a))
    for k, (f, want) in enumerate(zip(cases, serial, strict=True)):
        got = f()
        assert got.dtype == want.dtype and got.shape == want.shape, k
        assert got.tobytes() == want.tobytes(), f"case {k}: parallel differs from serial"
    assert calls == [(N, 3)] * len(cases)  # every case took the parallel path


def test_small_arrays_never_ask_for_threads(monkeypatch):
    monkeypatch.setattr(parallel, "threads", lambda size: pytest.fail("threads() called"))
    x = np.ones(parallel.MIN_SIZE - 1)
    ew.run_unary("exp", x, x.dtype)
    ew.run_binary("add", x, x, x.dtype)


_CHILD = textwrap.dedent('''
    import os
    import numpy as np, numba
    import nbgrad as nb
    from nbgrad.kernels import parallel

    parallel.MIN_SIZE = 1 << 16  # before the graphs are generated
    n = 3 * parallel.BLOCK + 77
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n) * 2.0
    x[5], x[n - 1] = 3e6, -2e6  # beyond TRIG_MAX: the libm redo pass
    m = rng.standard_normal((401, 499))  # 2-d: blocks of rows, a row sum per row

    def f1(x):
        return (nb.sin(x) * nb.exp(-x * x) + nb.tanh(x)).sum()

    def f2(m):
        return (nb.tanh(m).sum(dim=1) * 2.0).sum() + nb.exp(-m * m).mean()

    for fn, arg in ((nb.value_and_grad(f1), x), (nb.value_and_grad(f2), m)):
        g = nb.jit(fn, mode="compile")
        t = nb.tensor(arg)
        g(t)
        g(t)
        exe = g._entry((t,), {}).executable("main")
        assert exe.stats["blocked"] >= 1, exe.stats
        assert exe.entry is not exe.serial_entry, "the parallel entry is not used"
        par = exe.run([arg])
        numba.set_num_threads(1)
        one = exe.run([arg])
        numba.set_num_threads(2)
        ser = exe._serial()(arg.copy(), *exe.const_args)
        eager = fn(t)
        for a, b, c, e in zip(par, one, ser, eager, strict=True):
            a, b, c = (np.asarray(v).reshape(-1) for v in (a, b, c))
            assert a.tobytes() == b.tobytes(), "1 and 2 threads differ"
            assert a.tobytes() == c.tobytes(), "parallel and serial entries differ"
            np.testing.assert_allclose(a, e.numpy().reshape(-1), rtol=1e-12, atol=1e-12)

    # a child forked after the pool started: GNU OpenMP would be aborted there, so the
    # compiled graph runs its serial entry (and eager blocks a new thread pool)
    want, eager_want = exe.run([arg]), nb.exp(t).numpy()
    pid = os.fork()
    if pid == 0:
        got = exe.run([arg])
        same = all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
        os._exit(0 if same and nb.exp(t).numpy().tobytes() == eager_want.tobytes() else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print("ok", numba.threading_layer())
''')


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the child forks")
def test_tier2_blocked_loops_on_two_threads_equal_serial():
    env = dict(os.environ, NUMBA_NUM_THREADS="2", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         text=True, timeout=600, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok")


def test_tier2_one_thread_pool_runs_the_serial_entry(monkeypatch):
    import nbgrad as nb

    monkeypatch.setattr(parallel, "MIN_SIZE", 1 << 16)
    assert parallel.pool_size() == 1  # the suite's processes (tests/conftest.py)
    g = nb.jit(lambda x: (x * 2.0 + 1.0).sum(), mode="compile")
    x = nb.tensor(np.arange(N, dtype=np.float64))
    g(x)
    exe = g._entry((x,), {}).executable("main")
    assert exe.stats["blocked"] == 1 and "prange(4)" in exe.source()
    assert exe.entry is exe.serial_entry
    assert float(g(x).numpy()) == float(np.sum(np.arange(N) * 2.0 + 1.0))
