"""Anomaly detection: the first op whose forward or backward makes a NaN raises."""

from __future__ import annotations

import contextlib
import os
import traceback

import numpy as np

from ..ops import dispatch

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Anomaly:
    """Whether anomaly mode is on; turning it on installs :func:`check_outputs` in dispatch."""

    _enabled = False

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._enabled = bool(on)
        dispatch.set_observer(check_outputs if on else None)

    @contextlib.contextmanager
    def context(self, node):
        try:
            yield
        except RuntimeError as exc:
            site = forward_site(node)
            if site and "created at" not in str(exc):
                raise RuntimeError(f"{exc}\n  (the forward of {node.name()} was created at "
                                   f"{site})") from exc
            raise


ANOMALY = _Anomaly()


def user_frame() -> str | None:
    """``file:line`` of the innermost stack frame outside nbgrad."""
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR):
            return f"{frame.filename}:{frame.lineno} ({frame.line})"
    return None


def forward_site(node) -> str | None:
    return getattr(node, "anomaly_trace", None)


def _has_nan(array) -> bool:
    return array.dtype.kind == "f" and bool(np.isnan(np.asarray(array)).any())


def check_forward(op_name: str, outputs, site: str | None) -> None:
    for out in outputs:
        if _has_nan(out._data):
            raise RuntimeError(f"detect_anomaly: the forward of '{op_name}' returned NaN "
                               f"values; it was called at {site}")


def check_outputs(op, outputs) -> None:
    """Dispatch's observer in anomaly mode: note the forward's site, raise on NaN outputs."""
    site = user_frame()
    if outputs and outputs[0].grad_fn is not None:
        outputs[0].grad_fn.anomaly_trace = site
    check_forward(op.name, outputs, site)


def check_gradients(node, outs) -> None:
    for i, g in enumerate(outs):
        if g is not None and _has_nan(g._data):
            raise RuntimeError(f"detect_anomaly: {node.name()} returned NaN values in its "
                               f"gradient for input {i}; its forward was created at "
                               f"{forward_site(node)}")


class detect_anomaly:  # noqa: N801 - torch's name
    """Within this context, an op producing NaN (forward or backward) raises at once."""

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan
        self._prev = False

    def __enter__(self) -> None:
        self._prev = ANOMALY.enabled
        ANOMALY.enabled = self.check_nan

    def __exit__(self, *exc: object) -> None:
        ANOMALY.enabled = self._prev
