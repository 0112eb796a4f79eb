"""Signals turned into flags that the work checks at safe points.

A KeyboardInterrupt raised wherever the main thread happens to be (inside a lock held by a
thread pool's future, inside a native writer's callback) can deadlock or crash the
interpreter on the way out; a SIGTERM must let a training step finish. While inside one of
these context managers, the signal only sets ``requested``; the work checks it.

A conversion's contract (``SafeInterrupts``): Ctrl-C or SIGTERM at any moment before the
publishing step publishes nothing (uploads still pending included) and exits 130 / 143;
from that step on, the store is published complete, and the run still exits 130 / 143.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Self

from trainfeed.converters.errors import TrainfeedError

# What signal.signal returns and takes: a handler, SIG_DFL / SIG_IGN (ints), or None.
_Handler = Callable[[int, FrameType | None], Any] | int | None


class SignalFlag:
    """Context manager: while inside, ``signum`` sets ``requested`` instead of its usual effect
    (only in the main thread, where Python runs signal handlers)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.requested = False
        self._previous: _Handler = None

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(self.signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)


class Interrupted(TrainfeedError):
    """A conversion stopped by a signal after the point where it could still publish nothing
    (its store is published and complete), or by SIGTERM (exit 143: 128 + the signal)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


_NAMES: dict[int, str] = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


class SafeInterrupts:
    """Ctrl-C (SIGINT) and SIGTERM during a conversion. The first one only sets ``requested``
    and is acted on at the next ``check()`` (between samples, after the last upload, just
    before publishing): SIGINT raises KeyboardInterrupt, SIGTERM ``Interrupted`` (exit 143),
    and the run publishes nothing. A second one interrupts at once, except inside
    ``publishing()``: the one request that publishes (the commit record's PUT, the Delta
    commit, the rename) is never cut in half; a signal that arrived from its start on is
    reported by ``after_publishing()`` (the store is complete; exit 130 or 143)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: int | None = None  # the first signal received
        self._publishing = False
        self._previous: dict[int, _Handler] = {}

    def __enter__(self) -> SafeInterrupts:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested is not None and not self._publishing:
            raise self._error(signum)  # the second one: the user insists
        if self.requested is None:
            self.requested = signum

    @staticmethod
    def _error(signum: int) -> BaseException:
        if signum == signal.SIGINT:
            return KeyboardInterrupt()
        return Interrupted(f"terminated ({_NAMES.get(signum, f'signal {signum}')}): nothing was published at "
                           "the destination", signum)

    def check(self) -> None:
        if self.requested is not None:
            raise self._error(self.requested)

    @contextmanager
    def publishing(self) -> Iterator[None]:
        """The publishing step: ``check()`` first (the last moment at which nothing is
        published), then no signal interrupts what runs inside."""
        self.check()
        self._publishing = True
        try:
            yield
        finally:
            self._publishing = False

    def after_publishing(self, shown: str) -> None:
        """Once the store is published: a signal received meanwhile ends the run here, saying so."""
        if self.requested is not None:
            raise Interrupted(f"{shown}: interrupted ({_NAMES.get(self.requested, self.requested)}) after the store "
                              "was published; the store there is complete", self.requested)
