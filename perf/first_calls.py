"""The first 20 calls, compile included, and the steady state of each jit tier.

    python -m perf.first_calls [first] [-w W3,W5] [-f nbgrad:jit,jax:jit] [--calls 20]
        [--timeline]
    python -m perf.first_calls steady [-w W1,W2,W3,W4,W5,W6] [--rounds 5]

``first``: each row runs in a fresh process (one thread) that imports its framework
(timed apart), builds the workload's step and times its first ``--calls`` calls one by
one; the total includes tracing and compiling, and for ``nbgrad.jit`` in the default
mode the background promotion to tier 2 (which shares the CPU with the calls). Cache
states (``--caches``): ``cold`` points NUMBA_CACHE_DIR and NBGRAD_CACHE_DIR at empty
folders (nbgrad's one-time kernel and interpreter builds are included); ``installed``
fills them first by running the same workload under ``mode="interpret"`` in another
process (nbgrad's kernels cached, as after any earlier use, but this graph never
compiled with tier 2); ``warm`` reruns with the folders the cold row filled. JAX has
no persistent cache here, so its rows are the same in every state. ``--timeline`` also
prints each call of the nbgrad rows: its time, the tier its signatures were in after it,
and when tier-2 promotions started and ended (seconds from the first call's start).

``steady``: per workload one process builds the step under ``mode="interpret"`` and
``mode="compile"``, warms both, then times them in interleaved rounds
(:func:`perf.core.interleaved`) and prints the compile/interpret ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .harness import THREAD_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent

CHILD_FIRST = "first-child"
CHILD_STEADY = "steady-child"


# ------------------------------------------------------------------ children
def _configure(framework: str) -> None:
    if framework == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_platforms", "cpu")


def _impl(workload: str, impl_id: str):
    from . import workloads

    mod = workloads.get(workload)
    return mod, next(i for i in mod.IMPLS if i.id == impl_id)


def _first_child(spec: dict) -> dict:
    """Import, build and time the first ``calls`` calls of one row."""
    import importlib

    from .core import FRAMEWORKS

    fw = spec["impl"].split(":")[0]
    t0 = time.perf_counter()
    importlib.import_module(FRAMEWORKS[fw])
    import_s = time.perf_counter() - t0
    _configure(fw)
    if spec.get("policy") == "old":
        _old_policy()
    mod, impl = _impl(spec["workload"], spec["impl"])
    params = mod.SIZES[spec["size"]]
    inputs = mod.make_inputs(params)
    step = impl.build(inputs, params)
    events: list = []
    if fw == "nbgrad" and spec.get("timeline"):
        _record_promotions(events)
    times, tiers = [], []
    start = time.perf_counter()
    events.append(start)
    for _ in range(spec["calls"]):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
        if fw == "nbgrad" and spec.get("timeline"):
            tiers.append(" ".join(_nbgrad_tiers(step)))
    out = {"import_s": import_s, "times": times, "total_s": sum(times)}
    if fw == "nbgrad":
        out["tiers"] = _nbgrad_tiers(step)
    if tiers:
        out["timeline"] = {"tiers": tiers, "promotions": [
            (what, t - start) for what, t in events[1:] if t >= start]}
    return out


def _record_promotions(events: list) -> None:
    """Append ``(what, perf_counter time)`` as each tier-2 promotion starts and ends."""
    from nbgrad.jit import program

    real = program.Program._promote

    def promote(self):
        events.append(("promotion start", time.perf_counter()))
        try:
            real(self)
        finally:
            events.append((f"promotion end ({self.tier})", time.perf_counter()))
    program.Program._promote = promote


def _old_policy() -> None:
    """The promotion policy before measuring: 3 calls and 0.25 s in tier 1, no heavy
    rule, tier 2 kept whatever its timings (for before/after rows in one run)."""
    from nbgrad.jit import program

    program.PROMOTE_AFTER, program.PROMOTE_SECONDS = 3, 0.25
    program.HEAVY_FRACTION, program.MEASURE = float("inf"), False


def _nbgrad_tiers(step) -> list[str]:
    """The tier of every signature the jitted functions of ``step`` hold."""
    tiers = []
    for cell in (step.__closure__ or ()):
        obj = cell.cell_contents
        for entry in getattr(obj, "_cache", {}).values():
            tiers.append(entry.tier)
    return tiers


def _steady_child(spec: dict) -> dict:
    """Interleaved steady state of the interpret and compile rows of one workload."""
    from nbgrad.jit import program

    from .core import interleaved

    rows, first, tiers = {}, {}, {}
    for name, variant, measure in (("interpret", "jit-interpret", True),
                                   ("compile-unmeasured", "jit-compile", False),
                                   ("compile", "jit-compile", True)):
        program.MEASURE = measure  # read by each program when it is made (at its trace)
        mod, impl = _impl(spec["workload"], f"nbgrad:{variant}")
        params = mod.SIZES[spec["size"]]
        step = impl.build(mod.make_inputs(params), params)
        t = time.perf_counter()
        step()
        first[name] = time.perf_counter() - t
        for _ in range(10):  # past the measurement (tier 2's runs, then a tier-1 trial)
            step()
        rows[name] = step
        tiers[name] = _nbgrad_tiers(step)
    times = interleaved(rows, spec["rounds"], spec["block_s"])
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"first_s": first, "median_s": med, "tiers": tiers,
            "ratio": med["compile"] / med["interpret"],
            "ratio_unmeasured": med["compile-unmeasured"] / med["interpret"]}


# ------------------------------------------------------------------ parent
def _env(cache: Path | None) -> dict:
    env = dict(os.environ)
    env.update(THREAD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = str(cache / "numba")
        env["NBGRAD_CACHE_DIR"] = str(cache / "nbgrad")
    return env


def _spawn(kind: str, spec: dict, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "perf.first_calls", kind, json.dumps(spec)],
                          env=env, capture_output=True, text=True, cwd=REPO_ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail}
    return json.loads(lines[-1][len("RESULT "):])


def first_calls(workloads: list[str], impls: list[str], caches: list[str], calls: int,
                size: str, policy: str = "new", timeline: bool = False) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="perf-first-") as scratch:
        for w in workloads:
            for impl in impls:
                nb = impl.startswith("nbgrad")
                for state in caches if nb else ["cold"]:
                    tag = f"{w}-{impl.replace(':', '_')}-{policy}"
                    # warm reuses what the cold row filled (empty if there was none)
                    cache = Path(scratch) / f"{tag}-{'cold' if state == 'warm' else state}"
                    spec = {"workload": w, "impl": impl, "calls": calls, "size": size,
                            "policy": policy, "timeline": timeline}
                    if state == "installed":  # the interpreter built, as after any use
                        _spawn(CHILD_FIRST, {**spec, "impl": "nbgrad:jit-interpret",
                                             "calls": 3},
                               {**_env(cache), "NBGRAD_TIER1_BACKGROUND": "0"})
                    res = _spawn(CHILD_FIRST, spec, _env(cache))
                    rows.append({"workload": w, "impl": impl if policy == "new" or not nb
                                 else impl + "(old)", "caches": state if nb else "-", **res})
                    _print_first(rows[-1])
    return rows


def _print_first(r: dict) -> None:
    if "error" in r:
        print(f"{r['workload']:3} {r['impl']:20} {r['caches']:9} error: {r['error']}",
              flush=True)
        return
    t = r["times"]
    print(f"{r['workload']:3} {r['impl']:20} {r['caches']:9} import {r['import_s']:6.2f} s  "
          f"first {t[0]:7.3f} s  calls 2-{len(t)} {sum(t[1:]):7.3f} s  "
          f"total {r['total_s']:7.3f} s  last {t[-1] * 1e3:8.2f} ms  "
          f"{' '.join(r.get('tiers', []))}", flush=True)
    line = r.get("timeline")
    if line:
        events = sorted((t, what) for what, t in line["promotions"])
        clock = 0.0
        for k, (dt, tier) in enumerate(zip(t, line["tiers"], strict=True)):
            while events and events[0][0] <= clock + dt:
                print(f"      {events[0][0]:7.3f} s  {events.pop(0)[1]}")
            clock += dt
            print(f"      {clock:7.3f} s  call {k + 1:2d} {dt * 1e3:8.1f} ms  {tier}")
        for at, what in events:
            print(f"      {at:7.3f} s  {what}")


def steady(workloads: list[str], rounds: int, block_s: float, size: str) -> list[dict]:
    rows = []
    for w in workloads:
        res = _spawn(CHILD_STEADY, {"workload": w, "rounds": rounds, "block_s": block_s,
                                    "size": size}, _env(None))
        rows.append({"workload": w, **res})
        if "error" in res:
            print(f"{w:3} error: {res['error']}", flush=True)
            continue
        m = res["median_s"]
        print(f"{w:3} interpret {m['interpret'] * 1e3:9.3f} ms | compile unmeasured "
              f"{m['compile-unmeasured'] * 1e3:9.3f} ms ({res['ratio_unmeasured']:5.2f}x) | "
              f"compile {m['compile'] * 1e3:9.3f} ms ({res['ratio']:5.2f}x) "
              f"[{' '.join(res['tiers']['compile'])}]", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in (CHILD_FIRST, CHILD_STEADY):
        fn = _first_child if argv[0] == CHILD_FIRST else _steady_child
        print("RESULT " + json.dumps(fn(json.loads(argv[1]))), flush=True)
        return 0
    parser = argparse.ArgumentParser(prog="python -m perf.first_calls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", choices=("first", "steady"), default="first")
    parser.add_argument("-w", "--workloads", default=None,
                        help="comma list (first: W3,W5; steady: W1..W6)")
    parser.add_argument("-f", "--impls", default="nbgrad:jit,jax:jit",
                        help="first: comma list of framework:variant ids")
    parser.add_argument("--caches", default="cold,installed,warm",
                        help="first: nbgrad cache states (cold, installed, warm)")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-s", type=float, default=0.2)
    parser.add_argument("--size", default="full", choices=("tiny", "small", "full"))
    parser.add_argument("--policy", default="new", choices=("new", "old"),
                        help="first: nbgrad's promotion policy (old: 3 calls and 0.25 s in "
                             "tier 1, tier 2 kept unmeasured)")
    parser.add_argument("--timeline", action="store_true",
                        help="first: print every call of the nbgrad rows, with its tier and "
                             "when promotions started and ended")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if args.what == "first":
        ws = (args.workloads or "W3,W5").split(",")
        rows = first_calls(ws, args.impls.split(","), args.caches.split(","), args.calls,
                           args.size, args.policy, args.timeline)
    else:
        ws = (args.workloads or "W1,W2,W3,W4,W5,W6").split(",")
        rows = steady(ws, args.rounds, args.block_s, args.size)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
