"""``nbgrad.jit`` on CUDA tensors: fused ``@cuda.jit`` kernels (nbgrad/cuda/fusion.py).

Without a GPU these run under Numba's CUDA simulator (switched on at collection time,
as in test_cuda.py); on a machine with a GPU the same tests run on it. Shapes are tiny:
the simulator runs one Python thread per CUDA thread.
"""

from __future__ import annotations

import nbgrad.cuda as nbcuda

nbcuda.use_simulator_if_no_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import nbgrad as nb  # noqa: E402
from nbgrad.jit.cuda.fusion import CudaExecutable  # noqa: E402
from nbgrad.jit.local_names import function_codes, shared_temporaries  # noqa: E402
from nbgrad.jit.trace.ir import Graph, Node, Var  # noqa: E402

pytestmark = pytest.mark.cuda

RTOL, ATOL = 1e-12, 1e-14


def _cuda(a, requires_grad: bool = False) -> nb.Tensor:
    return nb.tensor(np.asarray(a), device="cuda", requires_grad=requires_grad)


def _same(got: nb.Tensor, want: nb.Tensor, rtol: float = RTOL) -> None:
    assert got.device == want.device, (got.device, want.device)
    assert got.shape == want.shape and got.dtype == want.dtype, \
        (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=rtol, atol=ATOL)


def _entry(jf, *args):
    return jf._entry(args, {})


def _kernels(exe) -> list[str]:
    return [name for kind, name in exe.steps if kind == "kernel"]


# ------------------------------------------------------------------ fused chains
def _chain(x):
    return nb.tanh(nb.sin(x) * 2.0 + nb.exp(-x)) * x


def test_elementwise_chain_forward_and_backward_are_one_kernel_each(rng):
    xa = rng.standard_normal(40)
    jf = nb.jit(_chain)
    x = _cuda(xa, requires_grad=True)
    seed = _cuda(rng.standard_normal(40))
    jf(x)  # the trace
    y = jf(x)
    assert y.device == "cuda" and y.requires_grad
    (g,) = nb.autograd.grad([y], [x], [seed])
    xe = _cuda(xa, requires_grad=True)
    ye = _chain(xe)
    (ge,) = nb.autograd.grad([ye], [xe], [seed])
    _same(y, ye)
    _same(g, ge)
    entry = _entry(jf, x)
    fwd, bwd = entry.executable("fwd"), entry.executable("bwd")
    assert isinstance(fwd, CudaExecutable) and isinstance(bwd, CudaExecutable)
    # every op of the chain (and of its backward) runs in one generated kernel
    assert fwd.steps == [("kernel", "region_0")] and bwd.steps == [("kernel", "region_0")]
    before = fwd.launches
    jf(x)
    assert fwd.launches == before + 1
    src = jf.source(x)
    assert src.count("@cuda.jit(cache=True)") == 3  # main, forward, backward
    assert "math.tanh(" in src and "math.sin(" in src and "math.exp(" in src
    assert "fused region over [40]: sin, mul, neg, exp, add, tanh, mul" in src


def test_broadcasting_and_strided_inputs(rng):
    def f(x, b, c):
        return nb.where(x > b, x * b, nb.sigmoid(c - x)) + nb.relu(b) ** 2

    xa, ba, ca = rng.standard_normal((3, 4)), rng.standard_normal(4), \
        rng.standard_normal((3, 1))
    jf = nb.jit(f)
    # x is a transposed view: the kernel reads it through its strides
    x = _cuda(xa.T.copy(), requires_grad=True).transpose(0, 1)
    b, c = _cuda(ba, requires_grad=True), _cuda(ca, requires_grad=True)
    seed = _cuda(rng.standard_normal((3, 4)))
    want = f(x, b, c)
    wgrads = nb.autograd.grad([want], [x, b, c], [seed])
    for _ in range(2):
        got = jf(x, b, c)
        _same(got, want)
        grads = nb.autograd.grad([got], [x, b, c], [seed])
        for g, w in zip(grads, wgrads, strict=True):
            _same(g, w)
    entry = _entry(jf, x, b, c)
    # one kernel per iteration space: relu(b) ** 2 over [4], the rest over [3, 4]
    text = entry.executable("fwd").describe()
    assert len(_kernels(entry.executable("fwd"))) == 2
    assert "over [3, 4]: gt mul sub sigmoid where add" in text and "over [4]: relu pow" in text
    src = entry.executable("main").source()
    assert "x0_ = b0_[o0_ + i0_ * s0_[0] + i1_ * s0_[1]]" in src  # x: both dimensions
    assert "b1_[o1_ + i1_ * s1_[0]]" in src                 # b: broadcast along dim 0
    assert "b2_[o2_ + i0_ * s2_[0]]" in src                 # c: broadcast along dim 1
    # backward: the broadcast gradients are reduced by the eager CUDA reduction
    assert ("eager", "sum_to") in entry.executable("bwd").steps


def _w3(x):
    return (nb.sin(x) * nb.exp(-x * x) + nb.tanh(x)).sum()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_w3_value_and_grad_matches_eager_cpu(rng, dtype):
    xa = rng.standard_normal(100).astype(dtype)
    vg = nb.jit(nb.value_and_grad(_w3))
    wv, wg = nb.value_and_grad(_w3)(nb.tensor(xa))
    x = _cuda(xa)
    for _ in range(3):
        v, g = vg(x)
        assert v.device == "cuda" and g.device == "cuda"
        assert v.dtype == wv.dtype and g.dtype == wg.dtype
        rtol = RTOL if dtype == np.float64 else 1e-5
        np.testing.assert_allclose(v.numpy(), wv.numpy(), rtol=rtol)
        np.testing.assert_allclose(g.numpy(), wg.numpy(), rtol=rtol, atol=1e-6)
    exe = _entry(vg, x).executable("main")
    # the value (a fused sum) and the gradient come from one kernel
    assert exe.steps == [("kernel", "region_0")]
    src = exe.source()
    assert "cuda.atomic.add(acc0_, 0, sh0_[0])" in src and "-> sum" in src


def test_reductions_fused_and_partial(rng):
    def f(x):
        return x.mean(), (x * x).sum(dim=1), (x > 0).sum(), nb.exp(x).sum(keepdim=True,
                                                                            dim=(0, 1))

    xa = rng.standard_normal((5, 7))
    jf = nb.jit(f)
    x = _cuda(xa)
    want = f(x)
    for _ in range(3):  # the last block resets the totals: repeated calls stay right
        for g, w in zip(jf(x), want, strict=True):
            _same(g, w)
    exe = _entry(jf, x).executable("main")
    assert _kernels(exe) == ["region_0"] and ("eager", "sum") in exe.steps
    assert exe.source().count("cuda.atomic.add(counter, 0, 1)") == 1


def test_matmul_between_fused_regions(rng):
    def f(x, w, b):
        h = nb.tanh(x @ w + b)
        return ((h * h - 1.0) @ w.T).sum() + nb.relu(b).sum()

    xa, wa, ba = rng.standard_normal((4, 3)), rng.standard_normal((3, 3)), \
        rng.standard_normal(3)
    args = [_cuda(a, requires_grad=True) for a in (xa, wa, ba)]
    want = f(*args)
    wgrads = nb.autograd.grad([want], args)
    jf = nb.jit(f)
    for _ in range(2):
        got = jf(*args)
        _same(got, want)
        for g, w in zip(nb.autograd.grad([got], args), wgrads, strict=True):
            _same(g, w)
    steps = _entry(jf, *args).executable("main").steps
    kinds = [k for k, _ in steps]
    # matmul runs its eager CUDA kernel; the elementwise work around it is fused
    assert ("eager", "matmul") in steps and kinds.count("kernel") >= 2
    first_mm = steps.index(("eager", "matmul"))
    assert "kernel" in kinds[first_mm + 1:]


def test_jitted_backward_and_value_and_grad_agree_with_eager_cuda(rng):
    def loss(w, x):
        return nb.softplus(x @ w).mean() + 0.5 * (w * w).sum()

    wa, xa = rng.standard_normal(3), rng.standard_normal((6, 3))
    w, x = _cuda(wa, requires_grad=True), _cuda(xa)
    want = loss(w, x)
    (wg,) = nb.autograd.grad([want], [w])
    jl = nb.jit(loss)
    for _ in range(2):
        got = jl(w, x)
        got.backward()
        _same(got, want)
        _same(w.grad, wg)
        w.grad = None
    vg = nb.jit(nb.value_and_grad(loss))
    for _ in range(2):
        v, g = vg(w.detach(), x)
        _same(v, want)
        _same(g, wg)


def test_closure_constants_index_and_outer_on_cuda(rng):
    scale = _cuda(rng.standard_normal(4))  # a closed-over CUDA tensor: a constant
    ya = rng.standard_normal(3)

    def f(x, y):
        return (x[1:, ::2] * 2.0).sum() + (nb.outer(y, x[0]) * scale).sum()

    x, y = _cuda(rng.standard_normal((3, 4)), requires_grad=True), _cuda(ya)
    want = f(x, y)
    (wg,) = nb.autograd.grad([want], [x])
    jf = nb.jit(f)
    for _ in range(2):
        got = jf(x, y)
        _same(got, want)
        (g,) = nb.autograd.grad([got], [x])
        _same(g, wg)


def test_outputs_on_the_cpu_and_reference_mode(rng):
    def f(x):
        return (nb.exp(x) + 1.0).cpu(), x * 3.0

    x = _cuda(rng.standard_normal(5))
    want = f(x)
    for mode in ("auto", "reference"):
        jf = nb.jit(f, mode=mode)
        for _ in range(2):
            got = jf(x)
            assert got[0].device == "cpu" and got[1].device == "cuda"
            for g, w in zip(got, want, strict=True):
                _same(g, w)


def test_cpu_and_cuda_calls_get_separate_entries(rng):
    xa = rng.standard_normal(6)
    jf = nb.jit(_chain)
    got_cpu = [jf(nb.tensor(xa)) for _ in range(2)]
    got_cuda = [jf(_cuda(xa)) for _ in range(2)]
    assert jf.cache_info()["entries"] == 2 and jf.cache_info()["traces"] == 2
    assert all(t.device == "cpu" for t in got_cpu) and all(t.device == "cuda" for t in got_cuda)
    np.testing.assert_allclose(got_cuda[1].numpy(), got_cpu[1].numpy(), rtol=RTOL)


def test_double_backward_through_a_cuda_jit(rng):
    x = _cuda(rng.standard_normal(4), requires_grad=True)
    jf = nb.jit(lambda x: (nb.sin(x) * x).sum())
    jf(x)
    y = jf(x)
    (g,) = nb.autograd.grad([y], [x], create_graph=True)
    (h,) = nb.autograd.grad([g.sum()], [x])
    xa = x.numpy()
    assert g.device == "cuda" and h.device == "cuda"
    np.testing.assert_allclose(g.numpy(), np.cos(xa) * xa + np.sin(xa), rtol=1e-12)
    np.testing.assert_allclose(h.numpy(), 2 * np.cos(xa) - xa * np.sin(xa), rtol=1e-12)


# ------------------------------------------------------------------ errors
def test_op_without_cuda_kernel_raises_naming_it():
    assert "sort" in nbcuda.missing()
    x = _cuda([3.0, 1.0, 2.0])
    jf = nb.jit(lambda x: nb.sort(x * 2.0)[0])
    with pytest.raises(RuntimeError, match="'sort' has no CUDA kernel"):
        jf(x)
    # a graph that reaches the executor: refused when it is built, naming op and shapes
    v = Var((3,), np.float64)
    out, idx = Var((3,), np.float64), Var((3,), np.int64)
    g = Graph([v], {}, [Node("sort", [v], [out, idx], {"dim": -1, "descending": False})],
              [out])
    with pytest.raises(RuntimeError, match=r"'sort' has no CUDA kernel.*\(3,\)"):
        CudaExecutable(g)


def test_cuda_loop_nodes_are_refused_clearly():
    from nbgrad.jit.trace.ir import LoopInfo, make_loop
    c = Var((), np.float64)
    body_in, body_out = Var((), np.float64), Var((), np.float64)
    body = Graph([body_in], {}, [Node("neg", [body_in], [body_out])], [body_out])
    out = Var((), np.float64)
    loop = make_loop([c], [out], LoopInfo(2, 1, 0, (), (), None, body))
    with pytest.raises(RuntimeError, match="loop nodes .* not supported on CUDA"):
        CudaExecutable(Graph([c], {}, [loop], [out]))


def test_shifted_reads_of_fused_values_are_not_fused(rng):
    # y[::-1] reads y at another element: y must be written to memory first
    def f(x):
        y = nb.sin(x)
        return y[::-1] * 2.0 + y

    x = _cuda(rng.standard_normal(6))
    jf = nb.jit(f)
    for _ in range(2):
        _same(jf(x), f(x))
    assert len(_kernels(_entry(jf, x).executable("main"))) == 2


def test_empty_integer_and_pass_through_outputs(rng):
    jf = nb.jit(lambda x: (x * 2.0 + 1.0, x.sum(), x.mean()))
    e = _cuda(np.zeros(0))
    for _ in range(2):
        a, s, m = jf(e)
        assert a.shape == (0,) and s.item() == 0.0 and np.isnan(m.item())
    xi = _cuda(np.arange(5))
    ji = nb.jit(lambda x: (x * 3 + 1, x, (x > 2).sum()))
    for _ in range(2):
        a, same, count = ji(xi)
        np.testing.assert_array_equal(a.numpy(), np.arange(5) * 3 + 1)
        assert a.dtype == nb.int64 and count.item() == 2 and count.dtype == nb.int64
        assert same._data is not xi._data  # outputs never alias the inputs
        np.testing.assert_array_equal(same.numpy(), np.arange(5))


def test_fused_kernels_give_every_load_its_own_temporary(rng):
    # twelve operands: loads x0..x11 and values t1..t12, names that are other names plus
    # digits (nbgrad.jit.local_names)
    def many(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = out * 0.5 + x
        return out
    xs = [_cuda(rng.standard_normal(4)) for _ in range(12)]
    jf = nb.jit(many)
    for _ in range(2):
        _same(jf(*xs), many(*xs))
    source = _entry(jf, *xs).executable("fwd").module_source
    kernels = function_codes(source)
    assert kernels and "x11_ = " in source
    assert not [n for c in kernels for n in c.co_varnames if n[-1].isdigit()]
    assert shared_temporaries(source) == {}
