"""The CUDA backend: table-generated op tests on the CUDA target, and device semantics.

Without a GPU these run under Numba's CUDA simulator. ``NUMBA_ENABLE_CUDASIM`` is read
once, when ``numba.cuda`` is first imported, so :func:`nbgrad.cuda.use_simulator_if_no_gpu`
runs at the top of this module, at collection time, before any test imports
``numba.cuda`` (nbgrad itself never imports it until a CUDA tensor is made). On a
machine with a GPU the variable is left alone and the same tests run on the GPU.
Sizes are small: the simulator runs one Python thread per CUDA thread.

Every record of :func:`nbgrad.testing.all_records` whose op has a CUDA kernel is run
on both devices: outputs, and gradients for a random upstream gradient, must agree
(the CPU's gradients are checked against finite differences by test_ops_table.py).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import nbgrad.cuda as nbcuda

nbcuda.use_simulator_if_no_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import nbgrad as nb  # noqa: E402
from nbgrad.errors import TableError  # noqa: E402
from nbgrad.ops.registry import REGISTRY, kernel, table  # noqa: E402
from nbgrad.testing import all_records, make_inputs  # noqa: E402

pytestmark = pytest.mark.cuda

RECORDS = all_records()
COVERAGE = nbcuda.coverage()
BACKWARD_GAPS = nbcuda.backward_gaps()
#: values: NumPy's float64 vs libdevice / a different summation order
RTOL, ATOL = 1e-9, 1e-12


def _seed(name: str) -> int:
    return sum(ord(c) * 31 ** i for i, c in enumerate(name)) % 2**32


def _cases():
    cases = []
    for name in sorted(RECORDS):
        if not COVERAGE.get(name):
            continue
        rec = RECORDS[name]
        for i, sample in enumerate(rec.samples(np.random.default_rng(_seed(name)))):
            cases.append(pytest.param(rec, sample, id=f"{name}-{i}-{sample.note}"))
    return cases


def _on_cuda(value):
    if isinstance(value, nb.Tensor):
        return nb.tensor(value.numpy(), requires_grad=value.requires_grad, device="cuda")
    if isinstance(value, list) and value and isinstance(value[0], nb.Tensor):
        return [_on_cuda(v) for v in value]
    return value


def _outputs(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _leaves(args) -> list:
    flat = [t for a in args for t in (a if isinstance(a, list) else [a])]
    return [t for t in flat if isinstance(t, nb.Tensor) and t.requires_grad]


def _assert_same(got: nb.Tensor, want: nb.Tensor, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != CPU's {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != CPU's {want.dtype}"
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=ATOL,
                               equal_nan=True, err_msg=what)


@pytest.mark.parametrize(("rec", "sample"), _cases())
def test_op_matches_cpu(rec, sample):
    fn = rec.function()
    args, kwargs = make_inputs(sample, requires_grad=rec.grad)
    cargs = tuple(_on_cuda(a) for a in args)
    ckwargs = {k: _on_cuda(v) for k, v in kwargs.items()}
    want = _outputs(fn(*args, **kwargs))
    got = _outputs(fn(*cargs, **ckwargs))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if rec.name != "to_device":
            assert g.device == "cuda", f"output {k} is on {g.device}"
        _assert_same(g, w, f"{rec.name} output {k}")
    leaves, cleaves = _leaves(args), _leaves(cargs)
    outs = [i for i, w in enumerate(want) if w.requires_grad]
    if not (rec.grad and leaves and outs):
        return
    rng = np.random.default_rng(7)
    seeds = [rng.standard_normal(want[i].shape).astype(want[i].dtype) for i in outs]
    grads = nb.autograd.grad([want[i] for i in outs], leaves,
                             [nb.tensor(s) for s in seeds], allow_unused=True)
    cuda_seeds = [nb.tensor(s, device="cuda") for s in seeds]
    if rec.name in BACKWARD_GAPS:  # a formula calls an op without a CUDA kernel
        with pytest.raises(RuntimeError, match="has no CUDA kernel"):
            nb.autograd.grad([got[i] for i in outs], cleaves, cuda_seeds, allow_unused=True)
        return
    cgrads = nb.autograd.grad([got[i] for i in outs], cleaves, cuda_seeds, allow_unused=True)
    for k, (g, w) in enumerate(zip(cgrads, grads, strict=True)):
        assert (g is None) == (w is None), f"gradient {k}: {g} vs CPU's {w}"
        if g is not None:
            assert g.device == "cuda", f"gradient {k} is on {g.device}"
            _assert_same(g, w, f"{rec.name} gradient {k}")


# ---------------------------------------------------------------------- coverage
def test_coverage_lists_every_table_op():
    assert set(COVERAGE) == set(table())
    assert COVERAGE["exp"] and COVERAGE["matmul"] and COVERAGE["index_backward"]


def test_cuda_kernels_are_registered_for_table_ops_only():
    covered = {n for n, ok in COVERAGE.items() if ok}
    assert covered == {n for n, op in REGISTRY.items() if "cuda" in op.kernels} & set(table())
    assert all("cuda" not in op.kernels for n, op in REGISTRY.items() if n not in table())


def _cuda_modules() -> list:
    mods = [nbcuda]
    for info in pkgutil.walk_packages(nbcuda.__path__, nbcuda.__name__ + "."):
        mods.append(importlib.import_module(info.name))
    return mods


def test_cuda_kernels_have_one_registry():
    """Every CUDA kernel is ``OpDef.kernels["cuda"]``, registered by a module of
    nbgrad.cuda.ops with ``@kernel(name, target="cuda")``; nbgrad.cuda keeps no table of
    its own (no dict from op names to functions, no second decorator)."""
    names = set(table())
    for mod in _cuda_modules():
        assert not hasattr(mod, "KERNELS") and not hasattr(mod, "cuda_kernel"), mod.__name__
        for attr, value in vars(mod).items():
            if isinstance(value, dict) and value and set(value) & names \
                    and all(callable(v) for v in value.values()):
                pytest.fail(f"{mod.__name__}.{attr} maps op names to functions")
    for name in (n for n, ok in COVERAGE.items() if ok):
        fn = inspect.unwrap(REGISTRY[name].kernels["cuda"])
        assert fn.__module__.startswith("nbgrad.cuda.ops."), (name, fn.__module__)


def test_kernel_registered_for_cuda_is_what_dispatch_runs(monkeypatch):
    from nbgrad.cuda.array import CudaArray
    op = REGISTRY["mul"]
    original = inspect.unwrap(op.kernels["cuda"])
    monkeypatch.setitem(op.kernels, "cuda", op.kernels["cuda"])  # restored afterwards
    seen = []

    @kernel("mul", target="cuda")
    def traced_mul(a, b):
        seen.append((type(a), type(b)))
        return original(a, b)

    assert inspect.unwrap(op.kernels["cuda"]) is traced_mul
    y = nb.tensor([1.0, 2.0], device="cuda") * 3.0  # 3.0: a host constant, uploaded first
    assert seen == [(CudaArray, CudaArray)]
    assert y.device == "cuda"
    np.testing.assert_array_equal(y.numpy(), [3.0, 6.0])


def test_cuda_kernel_for_an_op_without_entry_raises_naming_it():
    with pytest.raises(TableError, match="CUDA kernel for op 'no_such_cuda_op' has no "
                                         "derivatives.yaml entry"):
        kernel("no_such_cuda_op", target="cuda")(lambda x: x)
    assert "no_such_cuda_op" not in REGISTRY


def test_cuda_kernels_load_lazily():
    code = ("import sys, nbgrad\n"
            "from nbgrad.ops.registry import REGISTRY\n"
            "assert 'numba.cuda' not in sys.modules and 'nbgrad.cuda.ops' not in sys.modules\n"
            "assert not any('cuda' in op.kernels for op in REGISTRY.values())\n"
            "import nbgrad.cuda\n"
            "assert 'nbgrad.cuda.ops' not in sys.modules\n"
            "nbgrad.tensor([1.0], device='cuda')\n"
            "assert 'nbgrad.cuda.ops' in sys.modules and 'cuda' in REGISTRY['exp'].kernels\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)  # the same env


def test_op_without_cuda_kernel_raises_naming_it(monkeypatch):
    x = nb.tensor([1.0, 2.0], device="cuda")
    monkeypatch.delitem(REGISTRY["exp"].kernels, "cuda")
    with pytest.raises(RuntimeError, match="op 'exp' has no CUDA kernel"):
        nb.exp(x)


# ---------------------------------------------------------------------- device semantics
def test_tensor_on_cuda_and_back():
    a = np.arange(6.0).reshape(2, 3)
    x = nb.tensor(a, device="cuda")
    assert x.device == "cuda" and x.is_cuda and str(x.device) == "cuda"
    assert type(x._data).__name__ == "CudaArray"
    host = x.numpy()
    host[0, 0] = 100.0  # a copy: the device data is unchanged
    np.testing.assert_array_equal(x.numpy(), a)
    y = x.to("cpu")
    assert y.device == "cpu" and isinstance(y._data, np.ndarray)
    np.testing.assert_array_equal(y.numpy(), a)
    assert x.cpu().device == "cpu" and y.cuda().device == "cuda"
    assert y.to("cuda", nb.float32).dtype == nb.float32
    assert x.to("cuda") is x
    assert "device='cuda'" in repr(x) and "[3., 4., 5.]" in repr(x)
    assert x.tolist() == a.tolist() and x[1, 2].item() == 5.0


def test_factories_accept_device():
    for t in (nb.zeros(2, 3, device="cuda"), nb.ones(2, 3, device="cuda"),
              nb.empty(2, 3, device="cuda"), nb.full((2, 3), 7.0, device="cuda"),
              nb.eye(3, device="cuda"), nb.arange(5, device="cuda"),
              nb.linspace(0, 1, 4, device="cuda")):
        assert t.device == "cuda"
    np.testing.assert_array_equal(nb.full((2, 2), 7.0, device="cuda").numpy(), 7.0)
    x = nb.ones(2, 2, device="cuda", requires_grad=True)
    assert x.requires_grad and x.device == "cuda"
    for t in (nb.zeros_like(x), nb.ones_like(x), nb.full_like(x, 3.0)):
        assert t.device == "cuda" and t.shape == (2, 2)


def test_mixing_devices_raises_naming_both():
    x = nb.ones(3, device="cuda")
    y = nb.ones(3)
    with pytest.raises(RuntimeError, match="add: .*cpu.*cuda|add: .*cuda.*cpu"):
        nb.add(x, y)
    with pytest.raises(RuntimeError, match="two devices"):
        nb.matmul(y, x)


def test_device_data_is_never_converted_implicitly():
    x = nb.ones(3, device="cuda")
    with pytest.raises(TypeError, match="implicitly"):
        np.asarray(x._data)
    with pytest.raises(TypeError, match="not supported on CUDA"):
        np.sum(x._data)
    np.testing.assert_array_equal(np.asarray(x), np.ones(3))  # explicit: Tensor.__array__


def test_gradients_flow_across_devices():
    x = nb.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x.to("cuda")
    (y * y).sum().backward()
    assert x.grad.device == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])
    z = nb.tensor([1.0, 2.0], device="cuda", requires_grad=True)
    (z.cpu() * 3).sum().backward()
    assert z.grad.device == "cuda"
    np.testing.assert_allclose(z.grad.numpy(), [3.0, 3.0])


def test_leaf_gradients_accumulate_on_the_device():
    x = nb.tensor([[1.0, -2.0], [3.0, 4.0]], device="cuda", requires_grad=True)
    for _ in range(2):
        (x.exp() * 2).sum().backward()
    assert x.grad.device == "cuda"
    np.testing.assert_allclose(x.grad.numpy(), 4 * np.exp(x.numpy()), rtol=1e-12)


def test_unused_outputs_get_zero_gradients_on_the_device():
    x = nb.tensor(np.arange(6.0), device="cuda", requires_grad=True)
    a, b, c = x.split(2)
    (b * 5).sum().backward()
    assert x.grad.device == "cuda"
    np.testing.assert_array_equal(x.grad.numpy(), [0, 0, 5, 5, 0, 0])


def test_second_order_on_the_device():
    x = nb.tensor([0.5, 1.5], device="cuda", requires_grad=True)
    (g,) = nb.autograd.grad((x ** 3).sum(), x, create_graph=True)
    (h,) = nb.autograd.grad(g.sum(), x)
    assert h.device == "cuda"
    np.testing.assert_allclose(h.numpy(), 6 * np.array([0.5, 1.5]))


def test_views_share_device_memory():
    x = nb.tensor(np.arange(6.0).reshape(2, 3), device="cuda")
    t = x.transpose(0, 1)
    r = x.reshape(3, 2)
    row = x[1]
    assert t._version == x._version
    with nb.no_grad():
        x.add_(10.0)
    np.testing.assert_array_equal(t.numpy(), (np.arange(6.0).reshape(2, 3) + 10).T)
    np.testing.assert_array_equal(r.numpy(), (np.arange(6.0) + 10).reshape(3, 2))
    np.testing.assert_array_equal(row.numpy(), [13.0, 14.0, 15.0])
    assert t._version == 1 and not t._data.flags.c_contiguous
    e = nb.tensor([1.0, 2.0], device="cuda").expand(3, 2)
    with pytest.raises(RuntimeError, match="read-only"):
        e.add_(1.0)


def test_inplace_ops_and_setitem_on_the_device():
    x = nb.zeros(2, 3, device="cuda")
    x[0] = nb.tensor([1.0, 2.0, 3.0], device="cuda")
    x[1, 1:] = 7.0
    x[nb.tensor([0, 1]), nb.tensor([0, 0])] += 1.0
    np.testing.assert_array_equal(x.numpy(), [[2, 2, 3], [1, 7, 7]])
    x.mul_(2)
    np.testing.assert_array_equal(x.numpy(), [[4, 4, 6], [2, 14, 14]])
    x.zero_()
    np.testing.assert_array_equal(x.numpy(), np.zeros((2, 3)))
    assert x.device == "cuda"


# ---------------------------------------------------------------------- kernel paths
def test_reductions_over_long_short_and_strided_rows():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((40, 30))
    x = nb.tensor(a, device="cuda")
    np.testing.assert_allclose(x.sum().item(), a.sum(), rtol=1e-12)  # few long rows, split
    np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-12)  # contiguous rows
    np.testing.assert_allclose(x.sum(0).numpy(), a.sum(0), rtol=1e-12)  # strided rows
    np.testing.assert_allclose(x.T.mean(1).numpy(), a.mean(0), rtol=1e-12)
    np.testing.assert_allclose(x[:, :2].sum(0).numpy(), a[:, :2].sum(0), rtol=1e-12)
    ints = nb.tensor(np.arange(12).reshape(3, 4), device="cuda")
    assert ints.sum().dtype == nb.int64 and ints.sum().item() == 66
    empty = nb.zeros(0, 3, device="cuda")
    np.testing.assert_array_equal(empty.sum(0).numpy(), np.zeros(3))


def test_matmul_tiles_edges_transposes_and_broadcast_batches():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((7, 9)), rng.standard_normal((9, 5))
    x, y = nb.tensor(a, device="cuda"), nb.tensor(b, device="cuda")
    np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-12)
    np.testing.assert_allclose((y.T @ x.T).numpy(), (a @ b).T, rtol=1e-12)
    c, d = rng.standard_normal((2, 1, 3, 4)), rng.standard_normal((3, 4, 2))
    got = nb.tensor(c, device="cuda") @ nb.tensor(d, device="cuda")
    np.testing.assert_allclose(got.numpy(), c @ d, rtol=1e-12)
    f32 = nb.tensor(a, dtype=nb.float32, device="cuda") @ nb.tensor(b, dtype=nb.float32,
                                                                     device="cuda")
    assert f32.dtype == nb.float32
    np.testing.assert_allclose(f32.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_scatter_gradients_add_up_repeated_indices():
    x = nb.tensor(np.arange(5.0), device="cuda", requires_grad=True)
    idx = np.array([0, 2, 2, 2, 4, 0])
    x[idx].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2, 0, 3, 0, 1])


def test_float32_elementwise_keeps_dtype():
    a = np.linspace(0.1, 2.0, 7).astype(np.float32)
    x = nb.tensor(a, device="cuda")
    for y, ref in ((nb.exp(x), np.exp(a)), (nb.log(x) * 2.0, np.log(a) * 2),
                   (nb.floor(x * 3), np.floor(a * 3))):
        assert y.dtype == nb.float32
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-6)


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "amax", "logsumexp", "norm2",
                                  "norm_inf", "norm_minus_inf"])
def test_reductions_of_a_0d_tensor_over_dim_0_backpropagate(name):
    # as on the CPU (test_fuzz.py): the dim 0 or -1 of a 0-d tensor names no dim; the
    # CUDA sum backward and infinity norms indexed its shape (found by the cuda fuzzer)
    reduce = {"sum": lambda t: nb.sum(t, 0), "mean": lambda t: nb.mean(t, -1),
              "prod": lambda t: nb.prod(t, 0), "amax": lambda t: nb.amax(t, 0),
              "logsumexp": lambda t: nb.logsumexp(t, 0), "norm2": lambda t: nb.norm(t, 2, 0),
              "norm_inf": lambda t: nb.norm(t, float("inf"), 0),
              "norm_minus_inf": lambda t: nb.norm(t, float("-inf"), -1)}[name]
    x = nb.tensor(2.0, device="cuda", requires_grad=True)
    y = reduce(x)
    y.backward()
    assert y.shape == () and x.grad.shape == () and x.grad.item() == pytest.approx(1.0)


def test_small_grids_launch_without_numbas_occupancy_warning():
    """nbgrad sizes grids to the data: Numba's warning for grids under 128 blocks is off
    once nbgrad's kernels are registered, unless the environment asks for it."""
    code = ("import nbgrad as nb, nbgrad.cuda as c; c.use_simulator_if_no_gpu(); "
            "t = nb.ones(3, device='cuda'); from numba.cuda.core import config; "
            "print(config.CUDA_LOW_OCCUPANCY_WARNINGS, (t * 2).sum().item())")
    env = {k: v for k, v in __import__("os").environ.items()
           if k != "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS"}
    for setting, want in ((None, "0"), ("1", "1")):
        if setting is not None:
            env["NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS"] = setting
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.stdout.split() == [want, "6.0"], out.stderr
