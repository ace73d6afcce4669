"""Tier 2 of nbgrad.jit: fusion, generated code, loops, disk cache (nbgrad/jit/codegen*.py).

Every compiled graph here is small (Numba compiles each in about a second); values are
compared with eager mode (float64 to 1e-12 relative).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import nbgrad as nb
from nbgrad.jit.reference import replay_arrays
from nbgrad.jit.tier2 import codegen, fusion
from nbgrad.jit.tier2 import emit as codegen_emit
from nbgrad.jit.trace import passes
from nbgrad.jit.trace.ir import Graph, LoopInfo, Node, Var, check, make_loop
from nbgrad.jit.trace.tracer import Tracer
from nbgrad.ops.registry import REGISTRY
from nbgrad.ops.traits import Opaque

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ helpers
def trace(fn, *arrays, wrt=None):
    """The optimised graph of ``fn`` over ``arrays``; with ``wrt``, of the value and the
    gradients (the backward traced into the same graph, as ``value_and_grad`` does)."""
    tr = Tracer()
    ts = []
    with tr:
        for a in arrays:
            t = nb.tensor(a)
            v = tr.add_input(t)
            if wrt is not None and a.dtype.kind == "f":
                t = t.detach()
                t._requires_grad = True
                tr.bind(t, v)
            ts.append(t)
        out = fn(*ts)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if wrt is not None:
            outs += list(nb.autograd.grad(outs[0], [ts[i] for i in wrt]))
        tr.graph.outputs = [tr.var_of(o) for o in outs]
    check(tr.graph)
    return passes.optimize(tr.graph)


def assert_close(got, want, rtol=1e-12):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape,
                                                                 got.dtype, want.dtype)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
        return
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale * 1e-2)


def compile_and_compare(graph, arrays, rtol=1e-12):
    compiled = codegen.compile_graph(graph, strict=True)
    got = compiled.run(arrays)
    want = replay_arrays(graph, arrays)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol)
    return compiled, got


def body_of(source: str) -> str:
    return source[source.index("def run_graph"):]


def calls_blas(source: str) -> bool:
    """Whether the generated code calls BLAS: ``np.dot`` or the ``gemm`` native."""
    m = re.search(r"#   (_native_\d+) = nbgrad\.kernels\.gemm\.gemm ", source)
    body = body_of(source)
    return "np.dot(" in body or (m is not None and f"{m.group(1)}(" in body)


def w3(x):
    return nb.sum(nb.sin(x) * nb.exp(-x * x) + nb.tanh(x))


# ------------------------------------------------------------------ fusion (no compiling)
def test_w3_forward_and_backward_form_one_region():
    g = trace(w3, np.linspace(-1, 1, 7), wrt=[0])
    plan = fusion.plan(g)
    assert len(plan.groups) == 1
    (region,) = plan.groups
    assert region.kind == "region" and region.shape == (7,)
    assert [r.node.op for r in region.reductions] == ["sum"]
    # only the gradient is written to memory; every intermediate stays a scalar
    assert region.stores == [g.outputs[1]]


def test_fusion_respects_reduction_dependencies():
    # the backward reads the loss value: it cannot run in the loop that computes it
    g = trace(lambda x: nb.log(nb.sum(nb.exp(x))), np.linspace(0, 1, 5), wrt=[0])
    plan = fusion.plan(g)
    regions = [grp for grp in plan.groups if grp.kind == "region" and grp.shape == (5,)]
    assert len(regions) == 2
    first, second = regions
    assert first.reductions and not second.reductions
    loss_sum = first.reductions[0].out
    assert plan.groups.index(first) < plan.groups.index(second)
    assert not any(v is loss_sum for n in first.nodes for v in n.inputs)


def test_fusion_never_creates_a_cycle_through_an_opaque_node():
    # b = exp(a); c = matmul(b, W) is opaque; d = b + c joins b's region only if no
    # cycle: region(b) -> matmul -> d, so d must not merge into region(b)... unless the
    # matmul moves before it; the plan must stay executable either way
    a = Var((4, 4), np.float64)
    w = Var((4, 4), np.float64)
    b, c, d = Var((4, 4), np.float64), Var((4, 4), np.float64), Var((4, 4), np.float64)
    g = Graph([a, w], {}, [Node("exp", [a], [b]), Node("matmul", [b, w], [c]),
                           Node("add", [b, c], [d])], [d])
    check(g)
    plan = fusion.plan(g)
    pos = {}
    for k, grp in enumerate(plan.groups):
        for n in grp.nodes:
            pos[n.op] = k
    assert pos["exp"] < pos["matmul"] < pos["add"]
    a_ = np.random.default_rng(0).standard_normal((4, 4))
    w_ = np.random.default_rng(1).standard_normal((4, 4))
    compile_and_compare(g, [a_, w_])


def test_sibling_regions_that_read_one_value_run_as_one_loop():
    # three sums of products with x (the gradient of a GP's hyperparameters has this
    # form): no region feeds another, so each started a loop of its own over x
    def f(x, y, z):
        return nb.sum(x * y), nb.sum(x * z), nb.sum(-x * y / 3.0)

    arrays = [np.random.default_rng(k).standard_normal((6, 5)) for k in range(3)]
    g = trace(f, *arrays)
    regions = [grp for grp in fusion.plan(g).groups if grp.kind == "region"]
    assert len(regions) == 1
    assert [r.node.op for r in regions[0].reductions] == ["sum", "sum", "sum"]
    compiled, _ = compile_and_compare(g, arrays)
    assert body_of(compiled.source()).count("for i0_ in range(6)") == 1


def test_adjacent_regions_with_nothing_in_common_stay_apart():
    # on the CPU, merging unrelated loops saves no pass over memory (CUDA merges them:
    # one launch fewer)
    g = trace(lambda x, y: (nb.sum(x * 2.0), nb.sum(y * 3.0)),
              *[np.random.default_rng(k).standard_normal(7) for k in range(2)])
    plan = fusion.plan(g)
    assert [len(grp.reductions) for grp in plan.groups if grp.kind == "region"] == [1, 1]
    merged = fusion.merge_adjacent(plan.groups)
    assert [len(grp.reductions) for grp in merged] == [2]


def test_a_region_that_reads_a_sibling_sum_is_not_merged_into_it():
    # the second loop reads the first one's total: it must run after that loop ends
    def f(x, y):
        s = nb.sum(x * y)
        return s, nb.sum(x * s)

    arrays = [np.random.default_rng(k).standard_normal(8) for k in range(2)]
    g = trace(f, *arrays)
    regions = [grp for grp in fusion.plan(g).groups if grp.kind == "region"]
    assert len(regions) == 2
    compile_and_compare(g, arrays)


def test_a_region_runs_right_after_the_opaque_node_whose_result_it_reads(rng, monkeypatch):
    # an SGD update traced at the end of a step (``W - lr * (X.T @ G)``) runs right after
    # its product, while the gradient is in cache, not after every later product
    def f(W, X, G, V):
        gW = X.T @ G
        h = V @ V
        return gW, h, W - 0.1 * gW

    arrays = [rng.standard_normal(s) for s in ((5, 4), (20, 5), (20, 4), (30, 30))]
    g = trace(f, *arrays)
    groups = fusion.plan(g).groups
    order = [grp.node.op if grp.kind == "node" else "region" for grp in groups]
    assert [op for op in order if op in ("matmul", "region")] == ["matmul", "region", "matmul"]
    # only regions move (pure loops): opaque nodes, objmode calls among them, keep the
    # order they were traced in
    products = [grp.node for grp in groups if grp.kind == "node" and grp.node.op == "matmul"]
    assert products[1].inputs[0] is g.inputs[3]
    compile_and_compare(g, arrays)
    monkeypatch.setattr(fusion, "PRODUCER_FIRST", False)  # the traced order (comparisons)
    order = [grp.node.op if grp.kind == "node" else "region" for grp in fusion.plan(g).groups]
    assert [op for op in order if op in ("matmul", "region")] == ["matmul", "matmul", "region"]


def test_unstack_invariants_reads_the_invariant_instead_of_a_stack():
    # a forward loop that stacks an invariant each step, and a reverse loop reading it
    x, inv = Var((3,), np.float64), Var((3,), np.float64)
    bc, bi = Var((3,), np.float64), Var((3,), np.float64)
    bn = Var((3,), np.float64)
    body = Graph([bc, bi], {}, [Node("add", [bc, bi], [bn])], [bn, bi])
    fin, stack = Var((3,), np.float64), Var((4, 3), np.float64)
    fwd = make_loop([x, inv], [fin, stack], LoopInfo(4, 1, 0, (), ((0, 1, 4),), None, body))
    rc, rx = Var((3,), np.float64), Var((3,), np.float64)
    rn = Var((3,), np.float64)
    body2 = Graph([rc, rx], {}, [Node("mul", [rc, rx], [rn])], [rn])
    out = Var((3,), np.float64)
    bwd = make_loop([fin, stack], [out], LoopInfo(4, 1, 1, ((3, -1),), (), None, body2))
    g = Graph([x, inv], {}, [fwd, bwd], [out])
    check(g)
    g2 = fusion.unstack_invariants(g)
    check(g2)
    loops = [n for n in g2.nodes if n.op == "loop"]
    assert LoopInfo.of(loops[1]).n_xs == 0 and loops[1].inputs[-1] is inv
    assert LoopInfo.of(loops[0]).n_ys == 0  # the stack is no longer built
    arrays = [np.arange(3.0), np.array([0.5, -1.0, 2.0])]
    for a, b in zip(replay_arrays(g2, arrays), replay_arrays(g, arrays), strict=True):
        np.testing.assert_array_equal(a, b)
    compiled, _ = compile_and_compare(g, arrays)
    assert "nb_empty((4, 3)" not in compiled.source()


# ------------------------------------------------------------------ generated code
def test_w3_value_and_grad_is_one_fused_loop():
    x = np.linspace(-1.5, 2.5, 1001)
    g = trace(w3, x, wrt=[0])
    compiled, (loss, grad) = compile_and_compare(g, [x])
    src = body_of(compiled.source())
    # one loop over x: forward, sum and the whole backward inlined in it, with the
    # vectorisable math; the same loop with libm again only if an argument of sin or cos
    # was beyond vecmath.TRIG_MAX
    main, _, redo = src.partition("if big")
    assert main.count("for i0_ in range(1001):") == 1 and main.count("for ") == 1
    assert redo.count("for i0_ in range(1001):") == 1 and redo.count("for ") == 1
    for fn in ("sin(", "exp(", "tanh(", "cos("):
        assert f"v{fn}" in main and f"math.{fn}" in redo
    # no intermediate buffer: only the gradient and the 1-element loss output
    assert src.count("nb_empty(") == 2
    assert compiled.stats["regions"] == 1 and compiled.stats["fallbacks"] == []
    # and the same as eager autograd
    t = nb.tensor(x, requires_grad=True)
    value = w3(t)
    value.backward()
    assert_close(loss, value.numpy())
    assert_close(grad, t.grad.numpy())
    # the source is real, importable Python in the cache folder
    assert compiled.path is not None and Path(compiled.path).read_text().endswith(
        compiled.source())
    # the same graph again (another jitted function, say) shares the module
    again = codegen.compile_graph(g, strict=True)
    assert again.entry is compiled.entry
    assert_close(again.run([x])[1], grad)


def test_generated_code_allocates_and_fills_through_intrinsics():
    """Buffers, blocked loops' partial sums, scalar outputs, fills and permutes go through
    the intrinsics of nbgrad.jit.tier2.alloc, block bounds need no ``min``: ``np.empty``,
    ``np.full``, ``ndarray.fill``, ``np.transpose`` and ``min`` make every process compile
    their overloads again (0.05-0.8 s per signature, seconds for ``np.transpose``)."""
    x = np.linspace(-1.5, 2.5, 300_000)  # blocked: at least two blocks of 65536
    src = body_of(codegen.generate(trace(w3, x, wrt=[0])).source)
    serial = src.partition("def run_graph_parallel")[0]  # (the parallel entry: the same)
    assert "prange(" in serial and serial.count("nb_empty(") == 4  # gradient, 2 partials, loss
    a = np.arange(12.0).reshape(3, 4)
    compiled, (s,) = compile_and_compare(trace(lambda a: (a * 2.0).sum(0), a), [a])
    np.testing.assert_array_equal(s, (a * 2.0).sum(0))
    src += body_of(compiled.source())
    assert "nb_fill(" in src  # the accumulator over a leading dimension is zeroed
    b = np.arange(24.0).reshape(2, 3, 4)  # np.transpose of 3-d: seconds of compile
    compiled, (p,) = compile_and_compare(trace(lambda b: (b * 2.0).permute(2, 0, 1), b), [b])
    np.testing.assert_array_equal(p, np.transpose(b * 2.0, (2, 0, 1)))
    src += body_of(compiled.source())
    assert "nb_permuted(v2_, (2, 0, 1))" in src
    for slow in ("np.empty(", "np.full(", ".fill(", "min(", "np.zeros(", "np.transpose("):
        assert slow not in src


def test_alloc_intrinsics():
    from numba import njit

    from nbgrad.jit.tier2.alloc import empty, fill

    @njit
    def f(n, b, c):
        a = empty((n, 3), np.float64)
        fill(a, 1.5)
        fill(a[1:, 1], 7)  # a strided view
        z = empty((), np.bool_)
        fill(z, np.nan)  # as numpy casts: nan is True
        fill(b, 2.7)  # int32: truncated
        fill(c.T, 0.0)
        return a, z, empty((0, 2), np.float32)

    b, c = np.zeros(4, np.int32), np.ones((2, 3))
    a, z, e = f(3, b, c)
    assert a.flags.c_contiguous and a.dtype == np.float64
    np.testing.assert_array_equal(a, [[1.5, 1.5, 1.5], [1.5, 7, 1.5], [1.5, 7, 1.5]])
    assert z.shape == () and z.dtype == np.bool_ and bool(z)
    np.testing.assert_array_equal(b, [2, 2, 2, 2])
    assert not c.any() and e.shape == (0, 2) and e.dtype == np.float32
    with pytest.raises(ValueError, match="negative or too large"):
        f(-1, b, c)


def test_broadcasting_and_reductions_over_dims(rng):
    a, b, c = rng.standard_normal((3, 4)), rng.standard_normal(4), rng.standard_normal((3, 1))

    def f(a, b, c):
        y = nb.tanh(a * b + c)
        return (nb.sum(nb.mean(y, 0) * b) + nb.sum(nb.sum(y * y, 1))
                + nb.sum(nb.exp(y).sum(dim=1, keepdim=True) * c)
                + nb.sum(nb.sum_to(y, (1, 4)) ** 2)
                + nb.sum(y[1:, ::2] * y[0, 1:3]) + nb.sum(y[None, :, -1] * 2.0))

    g = trace(f, a, b, c, wrt=[0, 1, 2])
    compiled, _ = compile_and_compare(g, [a, b, c])
    src = body_of(compiled.source())
    assert "acc" in src and "+=" in src  # reductions accumulate inside the loop nests
    assert "[1 + i0_, 2 * i1_]" in src  # y[1:, ::2] is read in place, fused
    assert compiled.stats["fallbacks"] == []  # index_backward is a loop nest too


def test_float32_ints_and_bools_keep_eager_dtypes(rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    i = rng.integers(-5, 5, (4, 5))
    m = rng.random(5) > 0.5

    def f(a, i, m):
        y = nb.where(m, a * 0.5 + 1.0, nb.exp(a))
        return [y, nb.sum(y, 0), nb.mean(y), (i * 3 - 2) // 2, (a > 0.1) & m, nb.sum(m),
                a.to(nb.float64) * 1.5, nb.abs(i), nb.clamp(a, -0.5, 0.5), nb.maximum(a, 0.2)]

    compiled, outs = compile_and_compare(trace(f, a, i, m), [a, i, m], rtol=1e-6)
    assert [o.dtype for o in outs[:3]] == [np.float32] * 3
    assert outs[4].dtype == np.bool_ and outs[5].dtype == outs[7].dtype == np.int64
    assert "np.float32(" in compiled.source()


def test_matmul_loops_and_blas(rng):
    A, B = rng.standard_normal((5, 3)), rng.standard_normal((3, 4))
    v, u = rng.standard_normal(3), rng.standard_normal(5)
    P, Q = rng.standard_normal((40, 40)), rng.standard_normal((40, 40))

    def f(A, B, v, u, P, Q):
        small = nb.sum(nb.tanh(A @ B)) + nb.sum((A @ v) * u) + nb.sum(u @ A) + (v @ v) \
            + nb.sum(nb.outer(u, v) * A)
        big = nb.sum(nb.sigmoid(P @ Q.T) * P)
        return small + big

    g = trace(f, A, B, v, u, P, Q, wrt=[0, 1, 2, 3, 4, 5])
    compiled, _ = compile_and_compare(g, [A, B, v, u, P, Q])
    src = body_of(compiled.source())
    assert calls_blas(compiled.source())  # 40x40x40 products through BLAS
    assert "for q in range(3):" in src  # small ones as loops
    assert compiled.stats["fallbacks"] == []


def test_matmul_calls_blas_above_a_few_hundred_multiply_adds(rng):
    """Products of more than ``SMALL_MATMUL`` multiply-adds call BLAS, by a transposed
    matrix (``x @ w.T``, a linear layer) or not, and matrix-vector ones too (the
    neural-ODE task's 32 x 16 x 64 products took 5-7 us as loops, 1 us through BLAS);
    smaller ones stay loops."""
    from nbgrad.jit.tier2.ops import SMALL_MATMUL
    x, w, c = rng.standard_normal((32, 16)), rng.standard_normal((16, 16)), \
        rng.standard_normal((16, 16))
    X, v = rng.standard_normal((100, 40)), rng.standard_normal(40)
    s, u = rng.standard_normal((4, 8)), rng.standard_normal((8, 8))
    assert 4 * 8 * 8 <= SMALL_MATMUL < 32 * 16 * 16

    def f(x, w, c, X, v, s, u):
        return nb.sum(nb.tanh(x @ w.T) * 2.0) + nb.sum(nb.tanh(x @ c)) + \
            nb.sum(nb.tanh(X @ v)) + nb.sum(nb.tanh(s @ u))

    arrays = [x, w, c, X, v, s, u]
    compiled, _ = compile_and_compare(trace(f, *arrays, wrt=list(range(7))), arrays)
    src = body_of(compiled.source())
    assert calls_blas(compiled.source()) and "np.dot(" in src  # (X @ v: np.dot)
    assert "for q in range(8):" in src  # s @ u: loops
    assert "for q in range(16):" not in src  # x @ w.T, x @ c: BLAS


def test_fori_loop_stays_a_native_loop_with_its_gradient(rng):
    W, b, x0 = rng.standard_normal((6, 6)) * 0.3, rng.standard_normal(6), rng.standard_normal(6)

    def w1(W, b, x0):
        def body(i, x):
            return x + 0.01 * nb.tanh(W @ x + b) - 0.01 * 0.1 * x
        return nb.sum(nb.fori_loop(0, 200, body, x0) ** 2)

    g = trace(w1, W, b, x0, wrt=[0, 1])
    compiled, _ = compile_and_compare(g, [W, b, x0], rtol=1e-11)
    src = body_of(compiled.source())
    # a forward loop and a reverse loop, not 200 copies of the body
    assert src.count("for j0_ in range(200):") == 2
    assert src.count("vtanh(") == 1  # vectorisable tanh (nbgrad.kernels.vecmath)
    assert "199 - j0" in src  # the backward walks the saved steps in reverse


def test_scan_with_xs_ys_reverse_and_an_index(rng):
    xs, c0 = rng.standard_normal((7, 3)), rng.standard_normal(3)

    def f(xs, c0):
        def step(c, x):
            c2 = nb.sin(c) * x + 0.5 * c
            return c2, nb.sum(c2 * c2)
        c, ys = nb.scan(step, c0, xs, reverse=True)

        def acc(i, s):
            return s + nb.tanh(s) * 0.1
        return nb.sum(c) + nb.sum(ys * nb.arange(7.0)) + nb.sum(nb.fori_loop(2, 5, acc, c))

    g = trace(f, xs, c0, wrt=[0, 1])
    compiled, _ = compile_and_compare(g, [xs, c0])
    assert "for j0_ in range(7):" in body_of(compiled.source())


def test_ops_without_native_lowering_run_their_eager_kernel(rng, monkeypatch):
    x = rng.standard_normal((3, 4))
    for name in ("softmax", "amax"):  # opaque, with no native function
        monkeypatch.setattr(REGISTRY[name], "kind", Opaque(why_not_native="a test says so"))

    def f(x):
        s = nb.softmax(x * 2, 1)
        return nb.sum(s * nb.amax(x, 1, keepdim=True)) + nb.sum(nb.cat([x, s], 0) ** 2)

    compiled, _ = compile_and_compare(trace(f, x, wrt=[0]), [x])
    assert {"softmax", "amax"} <= set(compiled.stats["fallbacks"])
    assert "cat" not in compiled.stats["fallbacks"]  # a Join: written natively
    assert "objmode" in body_of(compiled.source())


def test_graph_too_large_stays_in_tier_1(monkeypatch):
    g = trace(w3, np.linspace(0, 1, 4), wrt=[0])
    monkeypatch.setattr(codegen_emit, "MAX_GROUPS", 0)
    with pytest.raises(codegen.Tier2Unsupported, match="loop nests"):
        codegen.compile_graph(g, strict=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exe = codegen.compile_graph(g)
    assert exe.tier != "compile" and "loop nests" in exe.tier2_refused
    assert any("tier 2 does not compile" in str(w.message) for w in caught)
    np.testing.assert_allclose(exe.run([np.linspace(0, 1, 4)])[0],
                               replay_arrays(g, [np.linspace(0, 1, 4)])[0])


def test_buffers_are_not_reused_under_a_live_transposed_view(rng):
    x = rng.standard_normal((6, 6))
    # exp(x) dies in the region that reads its transpose; the output must not take its
    # buffer (element (i, j) is written before (j, i) is read)
    g = trace(lambda x: [nb.exp(x).T * 2.0 + 1.0, nb.tanh(nb.sin(x).T)], x)
    compile_and_compare(g, [x])


def test_run_converts_inputs_and_never_aliases_them(rng):
    x = rng.standard_normal(5)
    g = trace(lambda x: [x, nb.exp(x), nb.reshape(x, (5, 1))], x)
    compiled = codegen.compile_graph(g, strict=True)
    ro = x.copy()
    ro.flags.writeable = False  # Numba types read-only arrays differently: run copies
    outs = compiled.run([ro])
    assert all(not np.shares_memory(o, ro) for o in outs)
    np.testing.assert_array_equal(outs[0], ro)
    np.testing.assert_array_equal(outs[2], ro.reshape(5, 1))
    outs = compiled.run([x.astype(np.float32)])  # converted to the graph's dtype
    assert outs[1].dtype == np.float64
    with pytest.raises(ValueError, match="shape"):
        compiled.run([np.zeros(4)])


def test_run_copies_strided_and_misaligned_inputs(rng):
    x = rng.standard_normal(5)
    g = trace(lambda x: [nb.exp(x)], x)
    compiled = codegen.compile_graph(g, strict=True)
    strided = np.repeat(x, 2)[::2]  # not contiguous
    raw = np.zeros(5 * 8 + 1, np.uint8)[1:]  # float64 at an odd address: not aligned
    misaligned = raw.view(np.float64)
    misaligned[:] = x
    assert not strided.flags.c_contiguous and not misaligned.flags.aligned
    want = compiled.run([x])[0]
    for a in (strided, misaligned, [float(v) for v in x]):
        np.testing.assert_array_equal(compiled.run([a])[0], want)


# ------------------------------------------------------------------ the jit API
def test_jit_compile_mode_value_and_grad_is_one_native_call(rng):
    x = rng.standard_normal(50)
    f = nb.jit(nb.value_and_grad(w3), mode="compile")
    ref_v, ref_g = nb.value_and_grad(w3)(nb.tensor(x))
    for _ in range(2):  # the first call traces, the second runs the generated code
        v, gr = f(nb.tensor(x))
        assert_close(v.numpy(), ref_v.numpy())
        assert_close(gr.numpy(), ref_g.numpy())
    src = f.source(nb.tensor(x))
    # one loop (and its libm redo for sin arguments past vecmath.TRIG_MAX)
    main = body_of(src).partition("if big")[0]
    assert "@njit(cache=True" in src and main.count("for i0_ in range(50):") == 1


def test_auto_mode_promotes_a_hot_graph_in_the_background(rng, monkeypatch):
    from nbgrad.jit import program
    monkeypatch.setattr(program, "PROMOTE_AFTER", 3)
    monkeypatch.setattr(program, "PROMOTE_SECONDS", 0.0)
    x = rng.standard_normal(40)
    f = nb.jit(nb.value_and_grad(w3))  # mode="auto"
    ref_v, ref_g = nb.value_and_grad(w3)(nb.tensor(x))
    for _ in range(4):  # trace, tier 1, ..., then promotion starts
        v, gr = f(nb.tensor(x))
        assert_close(gr.numpy(), ref_g.numpy())
    assert program.wait_for_promotions(timeout=240)
    v, gr = f(nb.tensor(x))
    assert_close(v.numpy(), ref_v.numpy())
    assert_close(gr.numpy(), ref_g.numpy())
    src = f.source(nb.tensor(x))
    # one loop (and its libm redo for sin arguments past vecmath.TRIG_MAX)
    main = body_of(src).partition("if big")[0]
    assert "@njit(cache=True" in src and main.count("for i0_ in range(40):") == 1


def _w1_inputs(rng, n=8):
    return (rng.standard_normal((n, n)) / np.sqrt(n), rng.standard_normal(n) * 0.1,
            rng.standard_normal(n))


@pytest.mark.parametrize("form", ["fori_loop", "python loop"])
def test_jit_compile_mode_w1_loops_stay_loops(rng, form):
    W, b, x0 = _w1_inputs(rng)
    steps = 60

    def loss(W, b, x0):
        def step(x):
            return x + 0.01 * nb.tanh(W @ x + b) - 0.01 * 0.1 * x
        if form == "fori_loop":
            x = nb.fori_loop(0, steps, lambda i, x: step(x), x0)
        else:
            x = x0
            for _ in range(steps):
                x = step(x)
        return (x * x).sum()

    vg = nb.value_and_grad(loss, argnums=(0, 1))
    args = (nb.tensor(W), nb.tensor(b), nb.tensor(x0))
    ref_v, (ref_gw, ref_gb) = vg(*args)
    f = nb.jit(vg, mode="compile")
    for _ in range(2):
        v, (gw, gb) = f(*args)
        assert_close(v.numpy(), ref_v.numpy(), 1e-11)
        assert_close(gw.numpy(), ref_gw.numpy(), 1e-11)
        assert_close(gb.numpy(), ref_gb.numpy(), 1e-11)
    src = body_of(f.source(*args))
    assert "for j0_ in range(" in src        # native loops (the Python loop re-rolled)
    assert src.count("math.tanh(") <= 2     # never one copy per step
    assert "objmode" not in src


# ------------------------------------------------------------------ disk cache
_CHILD = textwrap.dedent('''
    import json, sys, warnings
    recorder = warnings.catch_warnings(record=True)
    caught = recorder.__enter__()  # from the start: importing nbgrad may warn already
    warnings.simplefilter("always")
    import numpy as np
    import nbgrad as nb
    from nbgrad.jit.tier2 import codegen
    from nbgrad.jit.trace import passes
    from nbgrad.jit.trace.tracer import Tracer

    x = np.linspace(-1.0, 1.0, 9)
    tr = Tracer()
    with tr:
        t = nb.tensor(x)
        v = tr.add_input(t)
        t = t.detach(); t._requires_grad = True; tr.bind(t, v)
        y = nb.sum(nb.cos(t) * t)
        (gx,) = nb.autograd.grad(y, [t])
        tr.graph.outputs = [tr.var_of(y), tr.var_of(gx)]
    compiled = codegen.compile_graph(passes.optimize(tr.graph), strict=True)
    loss, grad = compiled.run([x])
    ok = abs(float(loss) - float(np.sum(np.cos(x) * x))) < 1e-12 and np.allclose(
        grad, np.cos(x) - x * np.sin(x), rtol=1e-12, atol=0)
    print(json.dumps({"hit": compiled.stats["cache_hit"], "ok": bool(ok),
                      "path": compiled.path,
                      "warnings": [str(w.message) for w in caught]}))
''')


def _child(env_dir: Path) -> dict:
    import json
    env = dict(os.environ, NBGRAD_CACHE_DIR=str(env_dir), PYTHONPATH=str(ROOT))
    env.pop("NUMBA_CACHE_DIR", None)  # the test inspects Numba's files beside the module
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         text=True, timeout=300, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_disk_cache_across_processes_and_damage(tmp_path):
    first = _child(tmp_path)
    assert first["ok"] and first["hit"] is False
    second = _child(tmp_path)  # same graph in a new process: nothing compiles
    assert second["ok"] and second["hit"] is True and second["path"] == first["path"]
    assert not second["warnings"]
    # a damaged generated module is rewritten (one warning) and still right
    path = Path(first["path"])
    path.write_text("this is not python (\n")
    third = _child(tmp_path)
    assert third["ok"] and any("damaged" in w for w in third["warnings"])
    assert Path(third["path"]).read_text().startswith("# Generated by nbgrad")
    # a damaged Numba cache entry recompiles (one warning)
    damaged = list(path.parent.glob("__pycache__/jit_*.nbi"))
    assert damaged
    for nbi in damaged:
        nbi.write_bytes(b"garbage")
    fourth = _child(tmp_path)
    assert fourth["ok"] and fourth["hit"] is False
    assert any("damaged" in w for w in fourth["warnings"])


def test_unwritable_cache_folder_still_runs(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # running as root: make the path a file instead
            ro.chmod(0o700)
            ro.rmdir()
            ro.write_text("not a folder")
        result = _child(ro)
    finally:
        if ro.is_dir():
            ro.chmod(0o700)
    assert result["ok"]
    assert any("not writable" in w for w in result["warnings"])


def test_a_reversed_read_of_a_fused_value_is_not_fused_as_the_same_element():
    x = nb.tensor(np.linspace(-1.0, 2.0, 7), requires_grad=True)

    def f(t):
        return (nb.sin(t)[::-1] * 2.0 * t).sum()

    value, grad = nb.jit(nb.value_and_grad(f), mode="compile")(x)
    want_value, want_grad = nb.value_and_grad(f)(x)
    np.testing.assert_allclose(value.numpy(), want_value.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy(), rtol=1e-12)
