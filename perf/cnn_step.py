"""Forward + backward of a small CNN step: nbgrad eager against PyTorch eager, one thread.

The network of issue 3 (float32, batch 32, 28x28 inputs, 10 classes)::

    conv2d(1 -> 8, 3x3, padding 1) -> relu -> max_pool2d(2)     # 8 x 14 x 14
    conv2d(8 -> 16, 3x3, padding 1) -> relu -> max_pool2d(2)    # 16 x 7 x 7
    flatten -> linear(784 -> 10) -> cross_entropy (mean)

One step = forward, loss, backward to all 6 parameters (the input needs no gradient).
Both frameworks run in this one process on one thread (OMP/OpenBLAS/MKL/Numba set to
1 thread before any import, ``torch.set_num_threads(1)``). Before timing, the losses
and gradients of the two are compared (float32, relative 1e-3). Then the steps are
timed in interleaved rounds (the order alternates each round); the medians and their
ratio are printed. ``--kernels`` also times nbgrad's two conv2d forward kernels
(im2col + BLAS, and direct loops) on the two layers' shapes.

    python perf/cnn_step.py                 # 30 interleaved rounds
    python perf/cnn_step.py --runs 50 --kernels --json out.json

The machine this runs on is usually shared and noisy: compare only numbers from one run.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

BATCH, CLASSES = 32, 10


def make_data(seed: int = 0) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Parameters (He-scaled), a batch of inputs and labels, all float32 / int64."""
    rng = np.random.default_rng(seed)

    def he(*shape):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    params = [he(8, 1, 3, 3), np.zeros(8, np.float32), he(16, 8, 3, 3),
              np.zeros(16, np.float32), he(CLASSES, 16 * 7 * 7), np.zeros(CLASSES, np.float32)]
    x = rng.standard_normal((BATCH, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, CLASSES, BATCH)
    return params, x, y


def nbgrad_step_factory(params, x, y):
    """A function running one nbgrad step; returns (loss, grads) as NumPy arrays."""
    import nbgrad as nb
    import nbgrad.nn.functional as F

    ws = [nb.tensor(p, requires_grad=True) for p in params]
    xt, yt = nb.tensor(x), nb.tensor(y)
    cross_entropy = getattr(F, "cross_entropy", None)

    def loss_of(logits):
        if cross_entropy is not None:
            return cross_entropy(logits, yt)
        # fallback (no cross_entropy yet): log-softmax composed from exp/log/sum
        shifted = logits - logits.detach().numpy().max(axis=1, keepdims=True)
        logp = shifted - nb.log(nb.exp(shifted).sum(1, keepdim=True))
        return -(logp[np.arange(BATCH), y]).mean()

    def step():
        w1, b1, w2, b2, w3, b3 = ws
        for w in ws:
            w.grad = None
        h = F.max_pool2d(F.relu(F.conv2d(xt, w1, b1, padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, w2, b2, padding=1)), 2)
        loss = loss_of(F.linear(h.reshape(BATCH, -1), w3, b3))
        loss.backward()
        return float(loss.item()), [w.grad.numpy() for w in ws]

    step.uses_cross_entropy = cross_entropy is not None
    return step


def torch_step_factory(params, x, y):
    import torch
    import torch.nn.functional as TF

    torch.set_num_threads(1)
    ws = [torch.tensor(p, requires_grad=True) for p in params]
    xt, yt = torch.tensor(x), torch.tensor(y)

    def step():
        w1, b1, w2, b2, w3, b3 = ws
        for w in ws:
            w.grad = None
        h = TF.max_pool2d(TF.relu(TF.conv2d(xt, w1, b1, padding=1)), 2)
        h = TF.max_pool2d(TF.relu(TF.conv2d(h, w2, b2, padding=1)), 2)
        loss = TF.cross_entropy(TF.linear(h.reshape(BATCH, -1), w3, b3), yt)
        loss.backward()
        return float(loss.item()), [w.grad.numpy() for w in ws]

    return step


def check_agreement(a, b, rtol: float = 1e-3) -> float:
    """Largest normwise relative difference of the losses and gradients; raises if > rtol."""
    worst = abs(a[0] - b[0]) / max(abs(b[0]), 1e-30)
    for ga, gb in zip(a[1], b[1], strict=True):
        worst = max(worst, float(np.max(np.abs(ga - gb)) / max(np.max(np.abs(gb)), 1e-30)))
    if worst > rtol:
        raise SystemExit(f"nbgrad and PyTorch disagree: relative difference {worst:.3g}")
    return worst


def time_interleaved(steps: dict, runs: int) -> dict[str, list[float]]:
    """Per step, ``runs`` wall times in seconds, the order alternating every round."""
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(runs):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def time_conv_kernels(runs: int) -> dict[str, float]:
    """Median ms of the im2col and direct conv2d forward kernels on the two layers."""
    from nbgrad.kernels import conv as ck

    rng = np.random.default_rng(1)
    out = {}
    for label, (c, hw, o) in {"layer1": (1, 28, 8), "layer2": (8, 14, 16)}.items():
        x = rng.standard_normal((BATCH, c, hw, hw)).astype(np.float32)
        w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
        y = np.empty((BATCH, o, hw, hw), np.float32)
        for name, fn in (("im2col", ck.conv2d_forward), ("direct", ck.conv2d_direct)):
            fn(x, w, 1, 1, 1, 1, 1, 1, 1, y)
            ts = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fn(x, w, 1, 1, 1, 1, 1, 1, 1, y)
                ts.append(time.perf_counter() - t0)
            out[f"{label}_{name}_ms"] = 1e3 * statistics.median(ts)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="interleaved rounds (>= 20)")
    parser.add_argument("--kernels", action="store_true",
                        help="also time the im2col and direct conv2d kernels")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    params, x, y = make_data()

    t0 = time.perf_counter()
    nb_step = nbgrad_step_factory(params, x, y)
    first_nb = nb_step()
    t_first_nb = time.perf_counter() - t0
    t0 = time.perf_counter()
    th_step = torch_step_factory(params, x, y)
    first_th = th_step()
    t_first_th = time.perf_counter() - t0
    diff = check_agreement(first_nb, first_th)

    for _ in range(3):  # warm-up
        nb_step()
        th_step()
    times = time_interleaved({"nbgrad": nb_step, "torch": th_step}, max(args.runs, 1))
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    result = {
        "workload": "cnn_step (batch 32, 1->8->16 channels, 28x28, 3x3, max-pool, linear, "
                    "cross-entropy, float32), forward+backward, one thread",
        "runs": args.runs,
        "nbgrad_median_ms": med["nbgrad"],
        "torch_median_ms": med["torch"],
        "nbgrad_min_ms": 1e3 * min(times["nbgrad"]),
        "torch_min_ms": 1e3 * min(times["torch"]),
        "ratio_nbgrad_over_torch": med["nbgrad"] / med["torch"],
        "first_call_s": {"nbgrad": t_first_nb, "torch": t_first_th},
        "max_relative_difference": diff,
        "nbgrad_cross_entropy": bool(nb_step.uses_cross_entropy),
    }
    if args.kernels:
        result["conv2d_forward_kernels"] = time_conv_kernels(max(args.runs, 1))
    print(f"cnn step, median of {args.runs} interleaved runs (one thread):")
    print(f"  nbgrad eager  {med['nbgrad']:8.2f} ms   (min {result['nbgrad_min_ms']:.2f})")
    print(f"  torch eager   {med['torch']:8.2f} ms   (min {result['torch_min_ms']:.2f})")
    print(f"  ratio nbgrad / torch = {result['ratio_nbgrad_over_torch']:.2f}"
          f"   (losses and gradients agree to {diff:.1e})")
    if not nb_step.uses_cross_entropy:
        print("  note: nbgrad has no cross_entropy yet; it used exp/log/sum instead")
    for k, v in result.get("conv2d_forward_kernels", {}).items():
        print(f"  {k:24s} {v:8.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return result


if __name__ == "__main__":
    main()
