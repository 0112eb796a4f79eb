"""Reading stores on object storage: concurrent range requests, a seekable file over them, and
an optional local disk cache.

- ``Fetcher``: ``fetch(path, start, end)`` splits a large range into parts of ``part_size``
  fetched concurrently; one fetcher per opened store holds the connection budget
  (``io_concurrency``: requests in flight for the whole reader, whatever the decode workers).
  Retries are the storage SDK's own (adlfs, s3fs, gcsfs).
- ``RangeFile``: a read-only seekable file for pyarrow and h5py over one object. ``prefetch``
  loads the span a piece needs in one concurrent fetch; other reads (footers, HDF5 metadata)
  go through a small block cache. Nothing is read that was not asked for.
- ``DiskCache``: fetched ranges kept as local files (``--cache-dir``), least recently used
  evicted beyond ``--cache-limit``, so that epoch 1 streams from the storage and later epochs
  read local disk. Keys are object path and byte range: the objects trainfeed reads never
  change in place (parts get new names on every write); clear the cache if small-file
  sources are edited.
"""
from __future__ import annotations

import gc
import hashlib
import io
import mmap
import os
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fsspec.exceptions import FSTimeoutError

from .errors import TrainfeedError
from .sources import call, call_timeout, no_answer

#: Bytes per range request when a span is split across connections: large enough to run near
#: a stream's bandwidth past the first-byte latency (8 MB at 60 MB/s: ~87% with 20 ms).
PART_SIZE = 8 << 20
#: Reads outside a prefetched span (footers, HDF5 metadata) fetch this much at a time.
BLOCK_SIZE = 256 << 10
DEFAULT_IO_CONCURRENCY = 8


class DiskCache:
    """Byte ranges of remote objects as files under ``folder``, at most ``limit`` bytes."""

    def __init__(self, folder, limit: int):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.limit = limit
        self._lock = threading.Lock()
        self._sizes: OrderedDict[Path, int] = OrderedDict()  # least recently used first
        for file in sorted(self.folder.glob("*/*.bin"), key=lambda f: f.stat().st_atime):
            self._sizes[file] = file.stat().st_size

    def _file(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.folder / digest[:2] / f"{digest}.bin"

    def get(self, key: str) -> bytes | memoryview | None:
        """The range, mapped from its file (no copy until it is read; an eviction meanwhile
        does not affect a mapping already made)."""
        file = self._file(key)
        try:
            with open(file, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                data = memoryview(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)) if size else b""
        except FileNotFoundError:
            return None
        with self._lock:
            if file in self._sizes:
                self._sizes.move_to_end(file)
        return data

    def put(self, key: str, data: bytes) -> None:
        if len(data) > self.limit:
            return
        file = self._file(key)
        file.parent.mkdir(exist_ok=True)
        tmp = file.with_name(f".{file.name}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, file)  # readers see a whole range or none
        with self._lock:
            self._sizes[file] = len(data)
            self._sizes.move_to_end(file)
            total = sum(self._sizes.values())
            while total > self.limit and len(self._sizes) > 1:
                old, size = self._sizes.popitem(last=False)
                old.unlink(missing_ok=True)
                total -= size

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())


class Fetcher:
    """Range reads from one filesystem with at most ``io_concurrency`` requests in flight."""

    def __init__(self, fs, io_concurrency: int = DEFAULT_IO_CONCURRENCY, cache: DiskCache | None = None,
                 part_size: int = PART_SIZE, deadline: float | None = None):
        self.fs = fs
        self.io_concurrency = max(1, io_concurrency)
        self.cache = cache
        self.part_size = part_size
        self.deadline = deadline
        self._pool = ThreadPoolExecutor(self.io_concurrency, thread_name_prefix="trainfeed-io")
        self._key_prefix = f"{getattr(fs, 'protocol', 'fs')}|"

    def _get(self, path: str, start: int, end: int) -> bytes:
        try:
            data = call(self.fs, "cat_file", path, start=start, end=end, deadline=self.deadline)
        except FSTimeoutError as exc:
            raise TrainfeedError(no_answer(self.fs.unstrip_protocol(path), self.deadline)) from exc
        if len(data) != end - start:
            raise OSError(f"{path}: asked for bytes {start}-{end}, got {len(data)}: the object is shorter than "
                          "its listing says (changed or truncated)")
        return data

    def fetch(self, path: str, start: int, end: int) -> bytes | memoryview:
        """Bytes ``start:end`` of ``path`` (a memoryview when they come from the disk cache);
        spans over ``part_size`` are fetched as concurrent parts."""
        key = f"{self._key_prefix}{path}|{start}|{end}"
        if self.cache is not None:
            cached = self.cache.get(key)
            if cached is not None:
                return cached
        cuts = list(range(start, end, self.part_size)) + [end]
        if len(cuts) <= 2:
            data = self._pool.submit(self._get, path, start, end).result()
        else:
            parts = [self._pool.submit(self._get, path, a, b) for a, b in zip(cuts, cuts[1:])]
            data = b"".join(p.result() for p in parts)
        if self.cache is not None:
            self.cache.put(key, data)
        return data

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _GCPause:
    """Automatic garbage collection held off while any thread is inside a RangeFile read.

    h5py calls ``readinto`` holding its global lock, and the request runs on fsspec's event
    loop thread; were a collection to start there and free an h5py object (which takes that
    lock), the two threads would wait on each other until the call times out."""

    def __init__(self):
        self._lock = threading.Lock()
        self._inside = 0
        self._was_enabled = False

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._inside += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0 and self._was_enabled:
                gc.enable()


_GC_PAUSE = _GCPause()


class RangeFile(io.RawIOBase):
    """A read-only seekable view of one object whose reads are served from a prefetched span,
    else from a small cache of ``BLOCK_SIZE`` blocks fetched on demand."""

    def __init__(self, fetcher: Fetcher, path: str, size: int, blocks: int = 32):
        super().__init__()
        self.fetcher, self.path, self.size = fetcher, path, size
        self._pos = 0
        self._span: tuple[int, bytes] | None = None
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._max_blocks = blocks

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def prefetch(self, start: int, end: int) -> None:
        """Fetch ``start:end`` now (concurrently, in parts); reads inside it cost no request.
        Replaces the previous span: one piece's bytes are held at a time."""
        start, end = max(0, start), min(self.size, end)
        self._span = (start, self.fetcher.fetch(self.path, start, end)) if end > start else None

    def _block(self, index: int) -> bytes:
        block = self._blocks.get(index)
        if block is None:
            start = index * BLOCK_SIZE
            block = self._blocks[index] = self.fetcher.fetch(self.path, start, min(self.size, start + BLOCK_SIZE))
            while len(self._blocks) > self._max_blocks:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(index)
        return block

    def readinto(self, buffer) -> int:
        with _GC_PAUSE:
            return self._readinto(buffer)

    def _readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self.size - self._pos))
        pos, done = self._pos, 0
        if self._span is not None:
            start, data = self._span
            if start <= pos and pos + n <= start + len(data):
                view[:n] = data[pos - start:pos - start + n]
                self._pos += n
                return n
        if n > BLOCK_SIZE * 4:  # a large read outside the span: fetch it whole, keep nothing
            view[:n] = self.fetcher.fetch(self.path, pos, pos + n)
            self._pos += n
            return n
        while done < n:
            index, offset = divmod(pos + done, BLOCK_SIZE)
            block = self._block(index)
            take = min(n - done, len(block) - offset)
            view[done:done + take] = block[offset:offset + take]
            done += take
        self._pos += n
        return n


class CachingFileSystem:
    """A filesystem whose bounded reads go through ``fetcher`` (its connection budget and disk
    cache); everything else is the fetcher's filesystem's. For the small-file layout, whose
    reads are whole files of known size."""

    async_impl = False

    def __init__(self, fetcher: Fetcher):
        self._fetcher = fetcher

    def __getattr__(self, name):
        return getattr(self._fetcher.fs, name)

    def cat_file(self, path, start=None, end=None, **kwargs):
        if end is None:
            return call(self._fetcher.fs, "cat_file", path, start=start, end=end, deadline=self._fetcher.deadline)
        return bytes(self._fetcher.fetch(path, start or 0, end))


def open_fetcher(location, io_concurrency: int = DEFAULT_IO_CONCURRENCY, cache_dir=None,
                 cache_limit: int = 0) -> Fetcher:
    """The fetcher a reader of the store at ``location`` uses (``cache_dir``: keep what it reads)."""
    cache = DiskCache(cache_dir, cache_limit) if cache_dir and cache_limit > 0 else None
    return Fetcher(location.fs, io_concurrency, cache, deadline=call_timeout(location.storage_options))
