"""Thread-local gradient mode: ``no_grad``, ``enable_grad``, ``set_grad_enabled``.

Each is a context manager and a decorator, as in PyTorch: a decorated function (or
generator: every resumption) runs under the mode, and the mode outside the call is
left as it was, exceptions included. ``set_grad_enabled(mode)`` called as a function
sets the mode at once; used as a decorator it restores the previous mode at decoration.
"""

from __future__ import annotations

import functools
import inspect
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


def _wrap_generator(gen_fn: Callable, enabled: bool) -> Callable:
    """``gen_fn`` whose generator runs each step (start, send, throw, close) under ``enabled``."""

    @functools.wraps(gen_fn)
    def generator(*args, **kwargs):
        gen = gen_fn(*args, **kwargs)
        try:
            with _GradMode(enabled):
                response = gen.send(None)
            while True:
                try:
                    request = yield response
                except GeneratorExit:
                    with _GradMode(enabled):
                        gen.close()
                    raise
                except BaseException as exc:  # noqa: BLE001 - forwarded into the generator
                    with _GradMode(enabled):
                        response = gen.throw(exc)
                else:
                    with _GradMode(enabled):
                        response = gen.send(request)
        except StopIteration as stop:
            return stop.value

    return generator


class _GradMode:
    """A context manager and decorator that sets grad mode and restores it."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled)
        self._local = threading.local()  # a stack of previous modes per thread

    def _stack(self) -> list[bool]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def __enter__(self) -> None:
        self._stack().append(STATE.grad_enabled)
        STATE.grad_enabled = self.enabled

    def __exit__(self, *exc: object) -> None:
        STATE.grad_enabled = self._stack().pop()

    def __call__(self, fn: F) -> F:
        enabled = self.enabled
        if inspect.isgeneratorfunction(fn):
            return _wrap_generator(fn, enabled)  # type: ignore[return-value]

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
    """Set grad mode to ``mode`` at once; as a context manager or decorator, restore it."""

    def __init__(self, mode: bool) -> None:
        super().__init__(mode)
        self._prev = STATE.grad_enabled
        STATE.grad_enabled = self.enabled

    def __enter__(self) -> None:
        # the mode before construction is what exit restores (``with set_grad_enabled(m):``)
        stack = self._stack()
        stack.append(self._prev if not stack else STATE.grad_enabled)
        STATE.grad_enabled = self.enabled

    def __call__(self, fn: F) -> F:
        STATE.grad_enabled = self._prev  # a decorator does not change the mode outside calls
        return super().__call__(fn)
