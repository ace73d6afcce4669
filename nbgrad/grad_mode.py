"""Thread-local gradient mode: ``no_grad``, ``enable_grad``, ``set_grad_enabled``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


class _State(threading.local):
    def __init__(self) -> None:
        self.grad_enabled = True


STATE = _State()


def is_grad_enabled() -> bool:
    """Whether operations record the graph in this thread."""
    return STATE.grad_enabled


class _GradMode:
    """A context manager and decorator that sets grad mode and restores it."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled)
        self._prev: list[bool] = []

    def __enter__(self) -> None:
        self._prev.append(STATE.grad_enabled)
        STATE.grad_enabled = self.enabled

    def __exit__(self, *exc: object) -> None:
        STATE.grad_enabled = self._prev.pop()

    def __call__(self, fn: F) -> F:
        enabled = self.enabled

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with _GradMode(enabled):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class no_grad(_GradMode):  # noqa: N801 - torch's name
    """Disable graph recording: ``with nbgrad.no_grad(): ...`` or ``@nbgrad.no_grad()``."""

    def __init__(self) -> None:
        super().__init__(False)


class enable_grad(_GradMode):  # noqa: N801
    """Enable graph recording inside a ``no_grad`` block."""

    def __init__(self) -> None:
        super().__init__(True)


class set_grad_enabled(_GradMode):  # noqa: N801
    """Set grad mode to ``mode``; takes effect at once, and as a context manager restores it."""

    def __init__(self, mode: bool) -> None:
        super().__init__(mode)
        self._prev.append(STATE.grad_enabled)
        STATE.grad_enabled = self.enabled

    def __enter__(self) -> None:
        STATE.grad_enabled = self.enabled

    def __exit__(self, *exc: object) -> None:
        if self._prev:
            STATE.grad_enabled = self._prev.pop()
