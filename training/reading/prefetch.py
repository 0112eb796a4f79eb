"""The prefetch thread between a reader and a training step: its blocking time is the data
wait every step is accounted with."""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from trainfeed.training.reading.store import Batch


class Prefetcher:
    """Runs the reader (and ``convert``, e.g. to pinned tensors) in a thread, ``depth`` batches
    ahead. ``get()`` returns the next item and how long the caller waited for it."""

    _END = object()

    def __init__(self, batches: Iterator[Batch], convert: Callable[[Batch], object], depth: int = 2) -> None:
        self._q: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(batches, convert), daemon=True,
                                        name="trainfeed-prefetch")
        self._thread.start()

    def _put(self, item: object) -> bool:
        """Queue ``item`` unless told to stop first (a consumer that stopped reading never takes
        it: a plain ``put`` on a full queue would block the thread, and ``close``, for good)."""
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, batches: Iterator[Batch], convert: Callable[[Batch], object]) -> None:
        try:
            for batch in batches:
                if not self._put((batch, convert(batch))):
                    return
            self._put(self._END)
        except BaseException as exc:  # handed to the training thread
            self._put(exc)

    def get(self) -> tuple[Any, float]:
        """(the next (batch, converted) pair, or None at the end; seconds waited for it)."""
        t0 = time.perf_counter()
        item = self._q.get()
        wait = time.perf_counter() - t0
        if item is self._END:
            return None, wait
        if isinstance(item, BaseException):
            raise item
        return item, wait

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
