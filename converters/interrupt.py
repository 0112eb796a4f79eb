"""Signals turned into flags that the work checks at safe points.

A KeyboardInterrupt raised wherever the main thread happens to be (inside a lock held by a
thread pool's future, inside a native writer's callback) can deadlock or crash the
interpreter on the way out; a SIGTERM must let a training step finish. While inside one of
these context managers, the signal only sets ``requested``; the work checks it.
"""
from __future__ import annotations

import signal
import threading


class SignalFlag:
    """Context manager: while inside, ``signum`` sets ``requested`` instead of its usual effect
    (only in the main thread, where Python runs signal handlers)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self.signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)


class SafeInterrupts(SignalFlag):
    """Ctrl-C during a conversion: the first one is acted on at the next ``check()`` (between
    samples, before publishing); a second one interrupts at once."""

    def __init__(self) -> None:
        super().__init__(signal.SIGINT)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt  # the second Ctrl-C: the user insists
        self.requested = True

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt
