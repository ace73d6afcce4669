"""Cold start: a tape never waits for the tier-1 interpreter's compile.

While ``run`` is not built (:func:`nbgrad.jit.tier1.interpreter.ready` is False), tapes
run their graphs with eager ops, loops run eagerly while a graph is traced, those runs
are no tier-1 samples for the promotion policy, and a call that returns starts the
background build. Eager elementwise kernels keep the general broadcast in a function of
its own (compiled only where needed), and get no read-only scalar operand (a second
compiled variant).
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.jit import program
from nbgrad.jit.tier1 import interpreter as I
from nbgrad.jit.tier1.lowering import loop_executable
from nbgrad.jit.trace.ir import LOOP, LoopInfo
from nbgrad.kernels import elementwise as ew


def _loss(W, b, x0):
    def body(i, x):
        return x + 0.01 * nb.tanh(W @ x + b) - 0.001 * x
    return (nb.fori_loop(0, 5, body, x0) ** 2).sum()


def _args():
    rng = np.random.default_rng(0)
    return (nb.tensor(rng.standard_normal((4, 4))), nb.tensor(rng.standard_normal(4)),
            nb.tensor(rng.standard_normal(4)))


@pytest.fixture
def unbuilt(monkeypatch):
    """The interpreter as if not built: ``run`` must not be called; builds are recorded."""
    calls = {"run": 0, "build": 0}

    def no_run():
        def run(*args):
            calls["run"] += 1
            raise AssertionError("the interpreter ran while not built")
        return run

    def not_ready(args):
        I.PENDING.setdefault(("types",), None)
        return False

    monkeypatch.setattr(I, "BACKGROUND", True)
    monkeypatch.setattr(I, "PENDING", {})
    monkeypatch.setattr(I, "ready", not_ready)
    monkeypatch.setattr(I, "run_function", no_run)
    monkeypatch.setattr(program, "build_interpreter",
                        lambda: calls.__setitem__("build", calls["build"] + 1))
    return calls


def test_unbuilt_interpreter_runs_eager_ops_with_the_same_results(unbuilt):
    f = nb.jit(nb.value_and_grad(_loss, argnums=(0, 1)), mode="interpret")
    args = _args()
    first = f(*args)  # traced: the loop runs eagerly
    assert unbuilt["build"] == 0  # the first result never waits for (or races) a build
    second = f(*args)  # the tape: eager ops
    assert unbuilt["run"] == 0
    assert unbuilt["build"] == 1  # started once the call returned
    (entry,) = f._cache.values()
    (exe,) = entry.program.executables().values()
    assert exe.tier == "interpret" and exe.fell_back
    assert program.run_tier(exe) is None  # no tier-1 sample for the promotion policy
    ref = nb.jit(nb.value_and_grad(_loss, argnums=(0, 1)), mode="reference")(*args)
    for got in (first, second):
        assert float(got[0]) == float(ref[0])
        for g, r in zip(got[1], ref[1], strict=True):
            np.testing.assert_array_equal(g.numpy(), r.numpy())


def test_loop_executable_is_none_while_unbuilt(unbuilt):
    f = nb.jit(_loss, mode="interpret")
    f(*_args())
    f(*_args())
    (entry,) = f._cache.values()
    (exe,) = entry.program.executables().values()
    graph = exe.graph
    (loop,) = [n for n in graph.nodes if n.op == LOOP]
    arrays = [np.zeros(v.shape, v.dtype) for v in loop.inputs]
    assert loop_executable(LoopInfo.of(loop), arrays) is None


def test_ready_reads_numbas_disk_cache_without_compiling(tmp_path, monkeypatch):
    # (Numba caches next to the file: tmp_path/__pycache__, unless NUMBA_CACHE_DIR is set)
    """Not compiled and not cached: False and pending; compiled: True; a fresh dispatcher
    over the cached file: True, loaded, not compiled."""
    path = tmp_path / "tiny_run.py"
    path.write_text("from numba import njit\n\n\n@njit(cache=True)\n"
                    "def run(a):\n    return a + 1.0\n")

    def fresh(name):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.run

    monkeypatch.setattr(I, "BACKGROUND", True)
    monkeypatch.setattr(I, "PENDING", {})
    first = fresh("nbgrad_test_tiny_run_a")
    monkeypatch.setattr(I, "run_function", lambda: first)
    assert not I.ready((1.0,))
    assert list(I.PENDING) and not first.overloads
    I.build_pending()
    assert not I.PENDING and I.ready((1.0,))
    second = fresh("nbgrad_test_tiny_run_b")
    monkeypatch.setattr(I, "run_function", lambda: second)
    assert I.ready((1.0,))
    assert second.stats.cache_hits and not second.stats.cache_misses
    sys.modules.pop("nbgrad_test_tiny_run_a", None)
    sys.modules.pop("nbgrad_test_tiny_run_b", None)


def test_general_broadcast_is_a_kernel_of_its_own():
    fn = ew.kernel_function("binary", "add")
    e = ew.EMPTY
    with pytest.raises(ValueError, match="bcast_add"):  # never a silent no-op
        fn(np.ones(2), np.ones(2), np.empty(2), 3, e, e, e)
    a, b = np.arange(6.0).reshape(2, 3), np.arange(2.0).reshape(2, 1)
    np.testing.assert_array_equal(ew.run_binary("sub", b, a, np.dtype(np.float64)), b - a)


def test_read_only_scalar_operands_reach_kernels_writable(monkeypatch):
    """A read-only one-element operand (a scalar constant) would make Numba compile a
    second variant of the kernel: run_binary passes a writable copy."""
    seen = []
    fn = ew.kernel_function("binary", "mul")

    def record(*args):
        seen.append([a.flags.writeable for a in args[:3]])
        return fn(*args)

    monkeypatch.setitem(ew._FUNCS, "binary_mul", record)
    c = np.array(2.0)
    c.flags.writeable = False
    x = np.arange(float(ew.UFUNC_MAX))  # smaller float arrays run NumPy's ufunc
    for a, b in ((c.reshape(1), x), (x, c), (x, c.reshape(1))):
        np.testing.assert_array_equal(ew.run_binary("mul", a, b, np.dtype(np.float64)),
                                      2.0 * x)
    assert seen == [[True, True, True]] * 3


class _FakeRun:
    """``run`` as not compiled and not in the disk cache; records compiles."""

    def __init__(self):
        self.overloads, self.compiled = {}, []
        self.targetctx = self

        class _Cache:
            _cache_file = type("F", (), {"_load_index": staticmethod(lambda: {})})()

            @staticmethod
            def _index_key(tys, codegen):
                return tys

        self._cache = _Cache()

    def typeof_pyval(self, a):
        return type(a).__name__

    def codegen(self):
        return None

    def compile(self, tys):
        self.compiled.append(tys)


def test_eager_stand_ins_give_way_to_the_build_once_they_cost_the_budget(monkeypatch):
    """A program that keeps calling would otherwise run slow eager replays (and hold the
    GIL the build needs) for as long as it calls: past the budget, tapes wait for it."""
    fake = _FakeRun()
    monkeypatch.setattr(I, "run_function", lambda: fake)
    monkeypatch.setattr(I, "BACKGROUND", True)
    monkeypatch.setattr(I, "PENDING", {})
    monkeypatch.setattr(I, "FALLBACK_SPENT", [0.0])
    args = (np.zeros(3), 0)
    assert not I.ready(args) and fake.compiled == [] and list(I.PENDING) == [("ndarray", "int")]
    I.FALLBACK_SPENT[0] = I.FALLBACK_BUDGET_S
    assert I.ready(args) and fake.compiled == [("ndarray", "int")] and not I.PENDING


def test_eager_stand_in_runs_count_against_the_budget(unbuilt, monkeypatch):
    monkeypatch.setattr(I, "FALLBACK_SPENT", [0.0])
    f = nb.jit(nb.value_and_grad(_loss, argnums=(0, 1)), mode="interpret")
    f(*_args())
    assert I.FALLBACK_SPENT[0] == 0.0  # the trace is no stand-in run
    f(*_args())
    assert I.FALLBACK_SPENT[0] > 0.0
