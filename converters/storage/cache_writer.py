"""The disk cache's writer: fetched ranges go into a ``DiskCache`` on a thread of their own,
after the read has its bytes (write-behind), so a first epoch into an empty cache never waits
for the disk. ``flush_cache_writes`` waits for this process's writers (before it exits, before
a cache folder is removed).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from collections import deque
from contextlib import suppress
from typing import TYPE_CHECKING

from trainfeed.converters.storage.cache import DiskCache

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


class CacheWriter:
    """Puts fetched ranges into a ``DiskCache`` on a thread of its own, at the lowest CPU
    priority, so that a read never waits for the cache. At most ``budget`` bytes wait to be
    written; a range that would go past it is not cached this time (a later epoch fetches it
    again): a slow or busy disk costs cache hits, never read speed. The buffers are the fetched
    ones, held until written (no copy)."""

    def __init__(self, cache: DiskCache, budget: int) -> None:
        self.cache, self.budget = cache, budget
        self._queue: deque[tuple[str, list[Buffer], int]] = deque()
        self._pending = 0
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        _WRITERS.add(self)

    def offer(self, key: str, parts: list[Buffer]) -> bool:
        """Queue ``parts`` to be cached under ``key``; False: over the budget, not cached."""
        size = sum(memoryview(p).nbytes for p in parts)
        with self._cv:
            if self._pending + size > self.budget:
                return False
            self._pending += size
            self._queue.append((key, parts, size))
            self._cv.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainfeed-cache-writer", daemon=True)
                self._thread.start()
        return True

    def _run(self) -> None:
        """Writes until the queue is empty, then ends (the next offer starts a thread again): an
        idle writer holds no thread, and one whose fetcher is gone is freed once it is done."""
        _lowest_priority()
        while True:
            with self._cv:
                if not self._queue:
                    self._thread = None
                    return
                key, parts, size = self._queue.popleft()
            try:
                self.cache.put(key, parts)
            finally:
                with self._cv:
                    self._pending -= size
                    self._cv.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every offered range is written (or ``timeout``); whether it was."""
        with self._cv:
            return self._cv.wait_for(lambda: self._pending == 0, timeout)


def _lowest_priority() -> None:
    """This thread at the lowest CPU priority (Linux: a thread's id is a scheduling target): the
    cache is written with the cores reading leaves idle; when there are none, the writer falls
    behind and ranges go uncached this epoch instead of slowing it."""
    if sys.platform.startswith("linux"):
        with suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


#: Cache writers (weakly; one with ranges queued is held by its thread, even once its fetcher
#: is gone): ``flush_cache_writes`` waits for them.
_WRITERS: weakref.WeakSet[CacheWriter] = weakref.WeakSet()


def flush_cache_writes(timeout: float = 60.0) -> None:
    """Wait, at most ``timeout`` seconds in all, for the cache writes of this process: before a
    process exits (a DataLoader worker at the end of its epoch, the interpreter), so that the
    ranges it fetched are there for the next epoch, and before a cache folder is removed.
    Reading never waits for them otherwise."""
    end = time.monotonic() + timeout
    for writer in list(_WRITERS):
        if writer._pid == os.getpid():  # a forked child's copies of its parent's writers have no thread
            writer.flush(max(0.0, end - time.monotonic()))


atexit.register(flush_cache_writes, 30.0)
