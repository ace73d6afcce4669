"""The CUDA runtime under nbgrad's kernels: the caching pool of device memory
(:mod:`nbgrad.cuda.memory`) and direct kernel launches (:mod:`nbgrad.cuda.launch`).

The pool's bookkeeping and the launch keys are tested everywhere, with a fake
allocator and fake arrays; the tests that allocate device memory or launch compiled
kernels need a GPU (the simulator has no driver and no compiled kernels, so there
arrays come from ``cuda.device_array`` and every launch goes through the dispatcher).
"""

from __future__ import annotations

import subprocess
import sys

import nbgrad.cuda as nbcuda

nbcuda.use_simulator_if_no_gpu()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import nbgrad as nb  # noqa: E402
from nbgrad.cuda import launch, memory  # noqa: E402
from nbgrad.cuda.memory import BlockPool, rounded_size  # noqa: E402

pytestmark = pytest.mark.cuda
gpu = pytest.mark.skipif(nbcuda.simulated(), reason="needs a GPU's driver")


@pytest.mark.parametrize("nbytes", [0, 1, 8, 511, 512, 513, 4000, (1 << 20) - 1, 1 << 20,
                                    (1 << 20) + 1, 3_000_001, 32_000_000, 800_000_000])
def test_a_rounded_size_holds_the_request_with_little_waste(nbytes):
    size = rounded_size(nbytes)
    assert size >= max(nbytes, 1)
    if nbytes < 1 << 20:
        assert size % 512 == 0 and size - max(nbytes, 1) < 512
    else:
        assert size <= nbytes * 1.125


class _Device:
    """A fake driver: numbered blocks, a capacity in bytes, and a log of calls."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity, self.used, self.next, self.log = capacity, 0, 0, []
        self.sizes: dict[int, int] = {}

    def alloc(self, size: int) -> int:
        if self.used + size > self.capacity:
            self.log.append(("oom", size))
            raise MemoryError("out of memory")
        self.next += 1
        self.used += size
        self.sizes[self.next] = size
        self.log.append(("alloc", size))
        return self.next

    def free(self, block: int) -> None:
        self.used -= self.sizes.pop(block)
        self.log.append(("free", block))


def _pool(dev: _Device) -> BlockPool:
    return BlockPool(dev.alloc, dev.free, lambda exc: isinstance(exc, MemoryError))


def test_a_freed_block_is_reused_for_the_same_size_only():
    dev = _Device()
    pool = _pool(dev)
    a = pool.take(1024)
    pool.give(1024, a)
    assert pool.cached_bytes == 1024 and pool.in_use_bytes == 0
    assert pool.take(1024) == a
    b = pool.take(2048)
    assert b != a
    assert dev.log == [("alloc", 1024), ("alloc", 2048)]
    assert pool.in_use_bytes == 3072 and pool.cached_bytes == 0


def test_a_full_device_empties_the_cache_and_tries_again():
    dev = _Device(capacity=4096)
    pool = _pool(dev)
    blocks = [pool.take(1024) for _ in range(3)]
    for b in blocks:
        pool.give(1024, b)
    c = pool.take(2048)  # 3 KiB cached + 2 KiB > 4 KiB: freed, then allocated
    assert ("oom", 2048) in dev.log and dev.used == 2048 and pool.cached_bytes == 0
    assert [e for e in dev.log if e[0] == "free"] == [("free", b) for b in blocks]
    assert dev.sizes == {c: 2048}


def test_other_allocation_errors_propagate_and_a_second_oom_raises():
    dev = _Device(capacity=1024)
    pool = BlockPool(dev.alloc, dev.free, lambda exc: isinstance(exc, MemoryError))
    with pytest.raises(MemoryError):
        pool.take(2048)
    failing = BlockPool(lambda size: (_ for _ in ()).throw(ValueError("bad")), dev.free,
                        lambda exc: isinstance(exc, MemoryError))
    with pytest.raises(ValueError, match="bad"):
        failing.take(512)


def test_release_frees_every_cached_block():
    dev = _Device()
    pool = _pool(dev)
    blocks = [(size, pool.take(size)) for size in (512, 512, 4096)]
    for size, block in blocks:
        pool.give(size, block)
    pool.release()
    assert dev.used == 0 and pool.cached_bytes == 0 and pool.in_use_bytes == 0


@gpu
def test_arrays_reuse_freed_device_memory_and_keep_their_values():
    x = np.random.default_rng(0).standard_normal(100_000)
    t = nb.tensor(x, device="cuda", requires_grad=True)
    stats = memory.memory_stats()
    assert stats["enabled"], stats
    for step in range(30):  # every step frees its temporaries, the next reuses them
        loss = (nb.sin(t) * nb.exp(-t * t) + nb.tanh(t) * step).sum()
        (g,) = nb.autograd.grad(loss, t)
        want = np.cos(x) * np.exp(-x * x) - 2 * x * np.sin(x) * np.exp(-x * x) \
            + step * (1 - np.tanh(x) ** 2)
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(loss.item(), np.sum(np.sin(x) * np.exp(-x * x)
                                                       + np.tanh(x) * step), rtol=1e-12)
    del loss, g
    stats = memory.memory_stats()
    assert stats["cached"] >= 800_000, stats
    nbcuda.empty_cache()
    assert memory.memory_stats()["cached"] == 0


@gpu
def test_a_view_keeps_its_block_after_the_array_it_came_from_is_freed():
    base = nb.tensor(np.arange(1000.0), device="cuda")
    view = base[10:20]
    del base
    junk = [nb.full((1000,), -1.0, device="cuda") for _ in range(4)]  # would reuse it
    np.testing.assert_array_equal(view.numpy(), np.arange(10.0, 20.0))
    del junk


@gpu
def test_the_pool_can_be_turned_off():
    code = ("import nbgrad as nb, nbgrad.cuda.memory as m; t = nb.ones(10, device='cuda'); "
            "print(m.memory_stats()['enabled'], t.sum().item())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "NBGRAD_CUDA_POOL": "0"},
                         timeout=300)
    assert out.stdout.split() == ["False", "10.0"], out.stderr


class _FakeArray:
    def __init__(self, shape, strides, dtype=np.float64):
        self.shape, self.strides, self.dtype, self.ndim = shape, strides, np.dtype(dtype), 1


def test_launch_keys_tell_apart_what_numba_types_differently(monkeypatch):
    monkeypatch.setattr(launch, "_DeviceNDArray", _FakeArray)
    key = launch._key
    assert key(3) is int and key(-(2**63)) is int and key(2.0) is float and key(True) is bool
    assert key((1, 2)) == (int, int) and key((1, 2.0)) != key((1, 2)) and key(()) == ()
    for unkeyed in (2**63, np.float64(1.0), np.int64(1), [1], "x"):
        with pytest.raises(launch._Unkeyed):
            key(unkeyed)
    contiguous, other = _FakeArray((8,), (8,)), _FakeArray((8,), (16,))
    assert key(contiguous) == key(_FakeArray((5,), (8,))) != key(other)
    assert key(contiguous) != key(_FakeArray((8,), (8,), np.float32))
    # one element with stride 0 is a broadcast ('A'); none or one contiguous is 'C'
    assert len({key(_FakeArray((n,), (s,))) for n in (0, 1) for s in (0, 8)}) == 4


@gpu
def test_kernels_launch_directly_after_their_first_launch():
    from nbgrad.cuda import elementwise as cew
    x = np.arange(12.0)
    a, b = nb.tensor(x, device="cuda"), nb.tensor(x * 2, device="cuda")
    for _ in range(3):
        np.testing.assert_array_equal((a + b).numpy(), x * 3)
    kept = cew.kernels().binary_add.__dict__.get("_nbgrad_launch", {})
    assert any(k is not None for k in kept.values()), "the compiled kernel was not kept"
    # strided operands and another dtype are other keys, and still right
    np.testing.assert_array_equal((a[::3] + b[1::3]).numpy(), x[::3] + 2 * x[1::3])
    f = nb.tensor(x.astype(np.float32), device="cuda")
    np.testing.assert_array_equal((f + f).numpy(), 2 * x.astype(np.float32))
    assert sum(k is not None for k in kept.values()) >= 2


@gpu
def test_direct_launches_can_be_turned_off():
    code = ("import numpy as np, nbgrad as nb; from nbgrad.cuda import elementwise as e; "
            "a = nb.tensor(np.ones(4), device='cuda'); s = [(a + a).sum().item() "
            "for _ in range(3)]; print('_nbgrad_launch' in e.kernels().binary_add.__dict__, s[-1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "NBGRAD_CUDA_FAST_LAUNCH": "0"},
                         timeout=300)
    assert out.stdout.split() == ["False", "8.0"], out.stderr
