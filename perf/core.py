"""Shared pieces of the benchmark suite: implementations, skips, output conversion, checks.

A workload module (``perf/workloads/w*_*.py``) defines its sizes, its inputs, a plain
NumPy reference (loss and gradients, derived by hand) and a list of :class:`Impl`, one
per framework and variant. An implementation's ``build(inputs, params)`` returns a
zero-argument ``step`` that runs the whole workload once (forward and backward, and for
W2 the SGD update) and returns ``(loss, grads)`` in the framework's own types; it raises
:class:`Unavailable` when the framework lacks a feature the workload needs, so the
runner skips that row with the reason instead of faking it.

This module imports nothing heavy: the runner's parent process never imports a
framework.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Frameworks in table order, with the module whose presence makes them available.
FRAMEWORKS: dict[str, str] = {
    "numba": "numba",
    "nbgrad": "nbgrad",
    "torch": "torch",
    "jax": "jax",
    "autograd": "autograd",
}

#: Display names used in tables and plots.
FRAMEWORK_TITLES: dict[str, str] = {
    "numba": "hand-written Numba (floor)",
    "nbgrad": "nbgrad",
    "torch": "PyTorch",
    "jax": "JAX",
    "autograd": "HIPS autograd",
}

#: Aliases accepted by ``--frameworks``.
FRAMEWORK_ALIASES: dict[str, str] = {"floor": "numba", "pytorch": "torch", "hips": "autograd"}

#: Peers: the frameworks nbgrad is compared with (the floor is not a peer).
PEERS: tuple[str, ...] = ("torch", "jax", "autograd")

#: Agreement tolerances (normwise relative error), by dtype name.
TOLERANCES: dict[str, float] = {"float64": 1e-8, "float32": 1e-3}


class Unavailable(Exception):
    """Raised by ``Impl.build`` when a framework lacks what the workload needs."""


class Mismatch(Exception):
    """Raised by an implementation's ``inspect`` hook when it did not run as its row says."""


@dataclass(frozen=True)
class Impl:
    """One row of a workload's table: a framework, a variant and how to build its step.

    ``inspect(step)``, when given, runs after the agreement check and returns a dict of
    facts to record (for example which execution path a jitted custom Function took);
    it raises :class:`Mismatch` if the row would be mislabelled. Rows with
    ``default=False`` (e.g. forcing one tier of ``nbgrad.jit``) run only when selected
    by their id, such as ``--frameworks nbgrad:jit-compile``. ``skip_when(exc)`` maps an
    exception of the first call that means "this framework does not support this yet"
    to a skip note (any other exception is an error).
    """

    framework: str
    variant: str
    label: str
    build: Callable[[dict, dict], Callable[[], Any]]
    inspect: Callable[[Callable[[], Any]], dict] | None = None
    default: bool = True  # False: measured only when asked for by its id
    skip_when: Callable[[BaseException], str | None] | None = None

    @property
    def id(self) -> str:
        """``framework:variant``, the name used by ``--frameworks`` and in the results."""
        return f"{self.framework}:{self.variant}"


@dataclass
class Output:
    """A loss and its gradients as NumPy values (what every implementation must agree on)."""

    loss: float
    grads: tuple = field(default_factory=tuple)


def require(module: Any, *names: str, what: str) -> list[Any]:
    """Return the function ``module.name`` for each name, or raise :class:`Unavailable`.

    ``what`` names the row in the message, e.g. ``"nbgrad jit"``, so a skipped row reads
    ``nbgrad jit: nbgrad.jit not available``.
    """
    found = []
    for name in names:
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if not callable(obj):  # missing, or only a subpackage of that name so far
            mod_name = getattr(module, "__name__", str(module))
            raise Unavailable(f"{what}: {mod_name}.{name} not available")
        found.append(obj)
    return found


def nbgrad_jit(fn: Callable, mode: str | None, what: str) -> Callable:
    """``nbgrad.jit(fn)``, or ``nbgrad.jit(fn, mode=mode)`` for a forced tier.

    Raises :class:`Unavailable` when ``nbgrad.jit`` is missing or does not take ``mode``.
    """
    import nbgrad as nb

    (jit,) = require(nb, "jit", what=what)
    if mode is None:
        return jit(fn)
    try:
        return jit(fn, mode=mode)
    except TypeError as exc:
        raise Unavailable(f"{what}: nbgrad.jit(mode={mode!r}) not supported ({exc})") from exc


def to_numpy(value: Any) -> Any:
    """Convert a framework value (tensor, array, scalar, nested tuple) to NumPy."""
    import numpy as np

    if isinstance(value, (tuple, list)):
        return tuple(to_numpy(v) for v in value)
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # torch and nbgrad tensors
        value = value.detach()
        if hasattr(value, "cpu"):
            value = value.cpu()
        return np.array(value.numpy(), copy=True)
    return np.array(value, copy=True)


def as_output(raw: Any) -> Output:
    """Turn a step's ``(loss, grads)`` into an :class:`Output` of NumPy values."""
    import numpy as np

    if not (isinstance(raw, (tuple, list)) and len(raw) == 2):
        raise TypeError("a workload step must return (loss, grads); got "
                        f"{type(raw).__name__}")
    loss, grads = raw
    if not isinstance(grads, (tuple, list)):
        grads = (grads,)
    loss_np = np.asarray(to_numpy(loss), dtype=np.float64)
    if loss_np.size != 1:
        raise ValueError(f"the loss must be a scalar; got shape {loss_np.shape}")
    return Output(float(loss_np.reshape(())), tuple(to_numpy(g) for g in grads))


def relative_error(got: Any, want: Any) -> float:
    """Normwise relative error ``max|got - want| / max|want|`` (shape mismatch is inf)."""
    import numpy as np

    g = np.asarray(got, dtype=np.float64)
    w = np.asarray(want, dtype=np.float64)
    if g.shape != w.shape:
        return float("inf")
    if not np.all(np.isfinite(g)):
        return float("inf")
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    diff = float(np.max(np.abs(g - w))) if w.size else 0.0
    if scale == 0.0:
        return diff
    return diff / scale


def compare(got: Output, want: Output) -> dict:
    """Errors of a loss and gradients against the reference: ``{"loss": e, "grads": [...]}``."""
    if len(got.grads) != len(want.grads):
        return {"loss": relative_error(got.loss, want.loss), "grads": [float("inf")],
                "max": float("inf"),
                "problem": f"{len(got.grads)} gradients returned, {len(want.grads)} expected"}
    errs = [relative_error(g, w) for g, w in zip(got.grads, want.grads, strict=True)]
    loss_err = relative_error(got.loss, want.loss)
    return {"loss": loss_err, "grads": errs, "max": max([loss_err, *errs])}


def parse_selection(text: str | None) -> list[str] | None:
    """Split a comma list of frameworks or ``framework:variant`` ids, resolving aliases.

    ``all`` stands for every framework (their default rows): ``all,torch:compile`` adds
    the opt-in torch.compile rows to a full run.
    """
    if not text:
        return None
    out = []
    for token in text.split(","):
        token = token.strip().lower()
        if not token:
            continue
        if token == "all":
            out.extend(FRAMEWORKS)
            continue
        fw, _, variant = token.partition(":")
        fw = FRAMEWORK_ALIASES.get(fw, fw)
        if fw not in FRAMEWORKS:
            raise ValueError(f"unknown framework {token!r}; choose from "
                             f"{', '.join(FRAMEWORKS)} (or framework:variant)")
        out.append(f"{fw}:{variant}" if variant else fw)
    return out


def selected(impl: Impl, selection: list[str] | None) -> bool:
    """Whether ``impl`` matches a selection from :func:`parse_selection` (None: all)."""
    if impl.id in (selection or ()):
        return True
    if not impl.default:
        return False
    return selection is None or impl.framework in selection


# ------------------------------------------------------------------ timing (standalone scripts)
def block_seconds(fn: Callable[[], Any], min_seconds: float = 0.05) -> float:
    """Seconds per call over a block of calls lasting at least ``min_seconds``."""
    import time

    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls


def interleaved(rows: dict[str, Callable[[], Any]], rounds: int,
                min_seconds: float = 0.05) -> dict[str, list[float]]:
    """Per row, seconds per call of one block in each of ``rounds`` rounds; in each round
    the rows take turns in a shuffled order (so load drifts reach every row alike)."""
    import random

    times: dict[str, list[float]] = {name: [] for name in rows}
    order = list(rows)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            times[name].append(block_seconds(rows[name], min_seconds))
    return times
