"""W2 and W3 on a GPU: nbgrad's CUDA backend against PyTorch CUDA and JAX GPU.

W2: one SGD step (lr 0.01) of an MLP 784-256-256-10, ReLU, mean softmax cross-entropy,
batch 128, float32. W3: value and gradient of ``sum(sin(x)*exp(-x*x) + tanh(x))`` for x
of 4,000,000 float64 (and 100,000,000 with ``--big``). Each implementation is checked
against the float64 NumPy reference on its first call, then timed: steady-state
median of ``--repeat`` calls after ``--warmup`` calls, synchronising the device after
each call. ``nbgrad.jit`` rows are then called until no graph of theirs compiles in the
background and their tiers stay put (:func:`settle`; the row says which tiers and after
how long), so a fresh machine's background compiles do not leak into the timed calls.
Peers that are not installed are reported as such.

    python perf/gpu/bench_gpu.py [--big] [--repeat 20] [--json perf/results/gpu.json]
    NUMBA_ENABLE_CUDASIM=1 python perf/gpu/bench_gpu.py --smoke --repeat 1   # no GPU
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from perf.workloads import w2_mlp  # noqa: E402

LR = w2_mlp.LR
PARAMS = w2_mlp.PARAMS


# ---------------------------------------------------------------------- W3
def w3_reference(x: np.ndarray) -> tuple[float, np.ndarray]:
    e = np.exp(-x * x)
    loss = float(np.sum(np.sin(x) * e + np.tanh(x)))
    grad = np.cos(x) * e - 2 * x * np.sin(x) * e + 1 - np.tanh(x) ** 2
    return loss, grad


def w3_nbgrad(x: np.ndarray):
    from numba import cuda

    import nbgrad as nb
    xt = nb.tensor(x, device="cuda", requires_grad=True)

    def step():
        loss = (nb.sin(xt) * nb.exp(-xt * xt) + nb.tanh(xt)).sum()
        (g,) = nb.autograd.grad(loss, xt)
        return loss, g

    return step, cuda.synchronize, lambda out: (out[0].item(), out[1].numpy())


def w3_nbgrad_jit(x: np.ndarray):
    """``nbgrad.jit(value_and_grad(f))`` on a CUDA tensor: fused ``@cuda.jit`` kernels."""
    from numba import cuda

    import nbgrad as nb
    xt = nb.tensor(x, device="cuda")
    step = nb.jit(nb.value_and_grad(lambda v: (nb.sin(v) * nb.exp(-v * v) + nb.tanh(v)).sum()))

    def run():
        return step(xt)
    run.jitted = step
    return run, cuda.synchronize, lambda out: (out[0].item(), out[1].numpy())


def w3_torch(x: np.ndarray):
    import torch
    xt = torch.tensor(x, device="cuda", requires_grad=True)

    def step():
        loss = (torch.sin(xt) * torch.exp(-xt * xt) + torch.tanh(xt)).sum()
        (g,) = torch.autograd.grad(loss, xt)
        return loss, g

    return step, torch.cuda.synchronize, lambda out: (out[0].item(), out[1].cpu().numpy())


def w3_jax(x: np.ndarray):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    xj = jax.device_put(jnp.asarray(x), jax.devices("gpu")[0])
    f = jax.jit(jax.value_and_grad(lambda v: jnp.sum(jnp.sin(v) * jnp.exp(-v * v)
                                                      + jnp.tanh(v))))
    state = {}

    def step():
        state["out"] = f(xj)
        return state["out"]

    def sync():
        if "out" in state:
            jax.block_until_ready(state["out"])

    return step, sync, lambda out: (float(out[0]), np.asarray(out[1]))


# ---------------------------------------------------------------------- W2
def w2_nbgrad(inp: dict):
    from numba import cuda

    import nbgrad as nb
    import nbgrad.nn.functional as F
    params = [nb.tensor(inp[k], requires_grad=True, device="cuda") for k in PARAMS]
    X, y = nb.tensor(inp["X"], device="cuda"), nb.tensor(inp["y"], device="cuda")

    def step():
        W1, b1, W2, b2, W3, b3 = params
        h1 = F.relu(X @ W1 + b1)
        h2 = F.relu(h1 @ W2 + b2)
        loss = F.cross_entropy(h2 @ W3 + b3, y)
        grads = nb.autograd.grad(loss, params)
        with nb.no_grad():
            for q, g in zip(params, grads, strict=True):
                q.sub_(LR * g)
        return loss, grads

    return step, cuda.synchronize, lambda out: (out[0].item(), [g.numpy() for g in out[1]])


def w2_nbgrad_jit(inp: dict):
    """W2's JAX-like step in ``nbgrad.jit`` on CUDA tensors: gradient and update in one
    traced function returning the new parameters."""
    from numba import cuda

    import nbgrad as nb
    import nbgrad.nn.functional as F

    def loss(W1, b1, W2, b2, W3, b3, X, y):
        h1 = F.relu(X @ W1 + b1)
        h2 = F.relu(h1 @ W2 + b2)
        return F.cross_entropy(h2 @ W3 + b3, y)

    vg = nb.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5))

    @nb.jit
    def train_step(W1, b1, W2, b2, W3, b3, X, y):
        params = (W1, b1, W2, b2, W3, b3)
        value, grads = vg(*params, X, y)
        return value, grads, tuple(q - LR * g for q, g in zip(params, grads, strict=True))

    state = {"params": [nb.tensor(inp[k], device="cuda") for k in PARAMS]}
    X, y = nb.tensor(inp["X"], device="cuda"), nb.tensor(inp["y"], device="cuda")

    def step():
        loss, grads, state["params"] = train_step(*state["params"], X, y)
        return loss, grads
    step.jitted = train_step

    return step, cuda.synchronize, lambda out: (out[0].item(), [g.numpy() for g in out[1]])


def w2_torch(inp: dict):
    import torch
    step = w2_mlp.torch_sgd_step(inp, device="cuda")
    return step, torch.cuda.synchronize, lambda out: (out[0].item(),
                                                      [g.cpu().numpy() for g in out[1]])


def w2_jax(inp: dict):
    import jax
    import jax.numpy as jnp
    gpu = jax.devices("gpu")[0]
    params = [jax.device_put(jnp.asarray(inp[k]), gpu) for k in PARAMS]
    X, y = jax.device_put(jnp.asarray(inp["X"]), gpu), jax.device_put(jnp.asarray(inp["y"]),
                                                                      gpu)

    def loss_fn(ps, X, y):
        W1, b1, W2, b2, W3, b3 = ps
        h1 = jax.nn.relu(X @ W1 + b1)
        h2 = jax.nn.relu(h1 @ W2 + b2)
        logp = jax.nn.log_softmax(h2 @ W3 + b3, axis=1)
        return -jnp.mean(logp[jnp.arange(X.shape[0]), y])

    @jax.jit
    def update(ps, X, y):
        loss, grads = jax.value_and_grad(loss_fn)(ps, X, y)
        return loss, grads, [p - LR * g for p, g in zip(ps, grads, strict=True)]

    state = {"params": params}

    def step():
        loss, grads, state["params"] = update(state["params"], X, y)
        state["out"] = (loss, grads)
        return loss, grads

    def sync():
        if "out" in state:
            jax.block_until_ready(state["out"])

    return step, sync, lambda out: (float(out[0]), [np.asarray(g) for g in out[1]])


# ---------------------------------------------------------------------- harness
def measure(build: Callable, arg, check: Callable, repeat: int, warmup: int) -> dict:
    t0 = time.perf_counter()
    step, sync, fetch = build(arg)
    first = fetch(step())
    sync()
    first_s = time.perf_counter() - t0
    error = check(first)
    for _ in range(warmup):
        step()
    sync()
    settled = settle(step, sync)
    times = step_times_ms(step, sync, repeat)
    return {"median_ms": statistics.median(times), "min_ms": min(times),
            "first_call_s": first_s, "max_rel_error": error, **settled}


#: calls with unchanged tiers after which :func:`settle` takes an ``nbgrad.jit`` row as settled
STABLE_CALLS = 8


def settle(step: Callable, sync: Callable, seconds: float = 120.0) -> dict:
    """For an ``nbgrad.jit`` row (``step.jitted``): call it until no graph of it is being
    promoted or compiled in the background and its tiers stayed the same for
    :data:`STABLE_CALLS` calls, so that the timed calls measure the steady state (on a
    fresh machine the fused kernels compile in the background for longer than the
    warm-up); ``{"tiers", "settle_s"}``, or nothing for other rows."""
    jitted = getattr(step, "jitted", None)
    if jitted is None:
        return {}
    from nbgrad.jit.program import PROMOTING, quiet
    start = time.perf_counter()
    last, same = None, 0
    while time.perf_counter() - start < seconds:
        step()
        sync()
        tiers = {e.tier for e in jitted._cache.values()}
        same = same + 1 if tiers == last else 0
        last = tiers
        if PROMOTING not in tiers and quiet() is not None and same >= STABLE_CALLS:
            break
    return {"tiers": ", ".join(sorted(last or ())), "settle_s": time.perf_counter() - start}


def step_times_ms(step: Callable, sync: Callable, repeat: int) -> list[float]:
    """Milliseconds of each of ``repeat`` calls of ``step``, the device synchronised after
    each."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def run(big: bool, repeat: int, warmup: int, smoke: bool = False, impl: str = "",
        on_row: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Every row (of the implementations whose name contains ``impl``); ``on_row(rows so
    far)`` after each (a run cut short keeps its rows)."""
    rows: list[dict] = []

    def add(row: dict | None) -> None:
        if row is None:
            return
        rows.append(row)
        if on_row is not None:
            on_row(rows)

    sizes = [2_000] if smoke else [4_000_000] + ([100_000_000] if big else [])
    for n in sizes:
        x = np.random.default_rng(0).standard_normal(n)
        ref_loss, ref_grad = w3_reference(x)

        def check(out, ref_loss=ref_loss, ref_grad=ref_grad):
            return max(_rel(out[0], ref_loss), _rel(out[1], ref_grad))

        for name, build in (("nbgrad-cuda", w3_nbgrad), ("nbgrad-cuda-jit", w3_nbgrad_jit),
                            ("torch-cuda", w3_torch), ("jax-gpu", w3_jax)):
            add(_row(f"W3 n={n:,}", name, build, x, check, repeat, warmup, impl))
    p = w2_mlp.SIZES["tiny" if smoke else "full"]
    inp = w2_mlp.make_inputs(p)
    ref = w2_mlp.reference(inp, p)

    def check_w2(out):
        errs = [_rel(out[0], ref.loss)] + [_rel(g, r) for g, r in
                                            zip(out[1], ref.grads, strict=True)]
        return max(errs)

    for name, build in (("nbgrad-cuda", w2_nbgrad), ("nbgrad-cuda-jit", w2_nbgrad_jit),
                        ("torch-cuda", w2_torch), ("jax-gpu", w2_jax)):
        add(_row("W2 mlp", name, build, inp, check_w2, repeat, warmup, impl))
    return rows


def _row(workload, impl, build, arg, check, repeat, warmup, only: str = "") -> dict | None:
    if only not in impl:
        return None
    row = {"workload": workload, "impl": impl}
    try:
        row.update(measure(build, arg, check, repeat, warmup))
    except ImportError as exc:
        row["error"] = f"not installed: {exc}"
    except Exception as exc:  # noqa: BLE001 - report, then go on with the next peer
        row["error"] = f"{type(exc).__name__}: {exc}"
    line = (f"{workload:<16} {impl:<15} " + (f"{row['median_ms']:10.3f} ms  (first call "
            f"{row['first_call_s']:.1f} s, rel. error {row['max_rel_error']:.1e}"
            + (f"; {row['tiers']} after {row['settle_s']:.1f} s" if "tiers" in row else "")
            + ")" if "median_ms" in row else row["error"]))
    print(line, flush=True)
    return row


def _write(path: Path, rows: list[dict]) -> None:
    device = ""
    try:
        from numba import cuda
        device = cuda.get_current_device().name
        device = device.decode() if isinstance(device, bytes) else str(device)
    except Exception:  # noqa: BLE001 - the name is informative only
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device, "host": platform.node(), "rows": rows},
                               indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="also W3 at 1e8 elements")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here (after each row)")
    parser.add_argument("--impl", default="",
                        help="only the implementations whose name contains this")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes (a check that every path runs, e.g. in the simulator)")
    args = parser.parse_args(argv)
    rows = run(args.big, args.repeat, args.warmup, args.smoke, args.impl,
               on_row=None if args.json is None else lambda rows: _write(args.json, rows))
    return 1 if any("error" in r and r["impl"].startswith("nbgrad") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
