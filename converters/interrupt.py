"""Ctrl-C at safe points only.

A KeyboardInterrupt raised wherever the main thread happens to be (inside a lock held by a
thread pool's future, inside a native writer's callback) can deadlock or crash the
interpreter on the way out. While a conversion runs, the first SIGINT only sets a flag that
the conversion checks between samples; a second SIGINT interrupts at once.
"""
from __future__ import annotations

import signal
import threading


class SafeInterrupts:
    """Context manager: ``check()`` raises KeyboardInterrupt once Ctrl-C was pressed."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> SafeInterrupts:
        if threading.current_thread() is threading.main_thread():  # handlers live in the main thread
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt  # the second Ctrl-C: the user insists
        self.requested = True

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
