"""Upload a store's data files to object storage while the writer goes on.

A conversion to a URL writes its parts into a local temporary folder; each part is uploaded
as soon as the writer closes it and its local copy is then deleted, so the conversion needs
local disk for a few parts, not the whole store, and the upload overlaps the conversion.
When uploads fall behind, the writer waits (at most ``2 x workers`` parts are pending).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the storage layer does not import what sits above it
    from trainfeed.converters.storage.location import Location


class Uploader:
    """``uploader(name)``: upload ``folder/name`` to ``loc/rename(name)``, then delete it
    locally. Used as a context manager: leaving it by an exception cancels what is pending and
    removes what was uploaded (best effort: a leftover is never referenced by a commit)."""

    def __init__(self, loc: Location, folder: Path, rename: Callable[[str], str] = str, workers: int = 4) -> None:
        self.loc, self.folder, self.rename = loc, folder, rename
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="trainfeed-upload")
        self._slots = threading.BoundedSemaphore(2 * workers)
        self._futures: list[Future[None]] = []
        self.uploaded: dict[str, str] = {}  # local name -> name on the storage
        self._lock = threading.Lock()

    def __call__(self, name: str) -> None:
        self._slots.acquire()
        self._futures.append(self._pool.submit(self._put, name))

    def _put(self, name: str) -> None:
        try:
            remote = self.rename(name)
            self.loc.fs.put_file(str(self.folder / name), self.loc.file(remote))
            with self._lock:
                self.uploaded[name] = remote
            (self.folder / name).unlink()
        finally:
            self._slots.release()

    def finish(self) -> dict[str, str]:
        """Wait for every upload; raise the first failure. Returns local name -> remote name."""
        for future in self._futures:
            future.result()
        return dict(self.uploaded)

    def __enter__(self) -> Uploader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            for future in self._futures:
                future.cancel()
            wait(self._futures)
            with suppress(Exception):
                names = [self.loc.file(n) for n in self.uploaded.values()]
                if names:
                    self.loc.fs.rm(names)
        self._pool.shutdown(wait=True)
