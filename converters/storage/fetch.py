"""Reading stores on object storage: concurrent range requests, a seekable file over them, and
the optional local disk cache.

- ``Fetcher``: ``fetch(path, start, end)``: one request up to ``MAX_REQUEST``, a larger range
  split into parts of ``part_size`` fetched concurrently; one fetcher per opened store holds
  the connection budget (``io_concurrency``: requests in flight for the whole reader, whatever
  the decode workers). Each part is requested from the version of the object the store's listing gave
  when it was opened (``If-Match`` on its ETag, native client): a reader never mixes
  generations, it stops with "the store changed while it was being read; reopen it".
  Retries (500, 503, resets, timeouts: only the failed request) are the client's own.
- A ``Fetcher`` belongs to the process that uses it: pickled, it travels as its description
  (file system, identities, budget, cache folder) and a forked copy rebuilds its threads, so
  DataLoader worker processes of every start method read with clients of their own.
- ``Span``: a fetched range as the buffers it arrived in; reads inside one buffer are views
  (no copy), and nothing is joined unless a read crosses two parts.
- ``CacheWriter`` (``cache_writer.py``): ranges go into the disk cache on a thread of their own,
  after the read has its bytes (write-behind).
- ``RangeFile``: a read-only seekable file for pyarrow and h5py over one object.
  ``prefetch`` loads the span a piece needs in one concurrent fetch; other reads (footers,
  HDF5 metadata) go through a small block cache. Nothing is read that was not asked for.
"""
from __future__ import annotations

import bisect
import gc
import io
import itertools
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import fsspec
from fsspec.exceptions import FSTimeoutError

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.storage.cache import DiskCache
from trainfeed.converters.storage.cache_writer import CacheWriter
from trainfeed.converters.storage.config import call_timeout, no_answer
from trainfeed.converters.storage.filesystems import call
from trainfeed.converters.storage.native import Identity, NativeFileSystem, ObjectChanged, changed_message

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from trainfeed.converters.storage.location import Location  # collections.abc.Buffer from Python 3.12

#: Bytes per range request when a span is split across connections: large enough to run near
#: a stream's bandwidth past the first-byte latency (8 MB at 60 MB/s: ~87% with 20 ms).
PART_SIZE = 8 << 20
#: A span up to this size is one request. Parts arrive as separate buffers, and a decoder
#: reading across them (pyarrow reads a row group's column chunk in one call) gets them joined
#: into fresh memory: a copy of every byte. So a piece of a default row group (32 MB) is one
#: request, and concurrency comes from pieces in flight (``training/reading/readers.py``).
MAX_REQUEST = 32 << 20


def requests_for(nbytes: float) -> int:
    """Range requests a span of ``nbytes`` is fetched with (the default limits)."""
    return 1 if nbytes <= MAX_REQUEST else -(-int(nbytes) // PART_SIZE)
#: Reads outside a prefetched span (footers, HDF5 metadata) fetch this much at a time.
BLOCK_SIZE = 256 << 10
DEFAULT_IO_CONCURRENCY = 8
#: Spans fetched ahead and not yet asked for, at most (older ones are dropped, and refetched if asked).
AHEAD_SPANS = 64


class Span:
    """Bytes ``start:end`` of one object, held as the buffers they arrived in."""

    def __init__(self, start: int, parts: list[Buffer]) -> None:
        self.start = start
        self.parts = [memoryview(p).cast("B") for p in parts]
        self._offsets = [start]
        for p in self.parts:
            self._offsets.append(self._offsets[-1] + p.nbytes)
        self.end = self._offsets[-1]

    def __len__(self) -> int:
        return self.end - self.start

    def view(self, pos: int, n: int) -> memoryview | bytearray:
        """Bytes ``pos:pos+n`` (absolute offsets, inside the span): a view when they lie in one
        part, else joined."""
        i = bisect.bisect_right(self._offsets, pos) - 1
        local = pos - self._offsets[i]
        if local + n <= self.parts[i].nbytes:
            return self.parts[i][local:local + n]
        out, done = bytearray(n), 0
        while done < n:
            take = min(n - done, self.parts[i].nbytes - local)
            out[done:done + take] = self.parts[i][local:local + take]
            done, i, local = done + take, i + 1, 0
        return out

    def tobytes(self) -> bytes:
        return b"".join(self.parts)


class Fetcher:
    """Range reads from one file system with at most ``io_concurrency`` requests in flight.
    ``identities``: each object's version as listed when the store was opened (path -> Identity);
    a cached range is keyed on it, a request is conditional on it."""

    def __init__(self, fs: fsspec.AbstractFileSystem, io_concurrency: int = DEFAULT_IO_CONCURRENCY,
                 cache: DiskCache | None = None, part_size: int = PART_SIZE, deadline: float | None = None,
                 identities: dict[str, Identity] | None = None, max_request: int = MAX_REQUEST) -> None:
        self.fs = fs
        self.io_concurrency = max(1, io_concurrency)
        self.cache = cache
        self.part_size = part_size
        self.max_request = max(part_size, max_request)
        self.deadline = deadline
        self.identities: dict[str, Identity] = dict(identities or {})
        self._native = isinstance(fs, NativeFileSystem)
        self._start()

    def _start(self) -> None:
        """This process's threads: the request pool and the cache's writer."""
        self._pid = os.getpid()
        self._pool = ThreadPoolExecutor(self.io_concurrency, thread_name_prefix="trainfeed-io")
        self._ahead: OrderedDict[tuple[str, int, int], Span | list[Future[Buffer]]] = OrderedDict()
        self._ahead_lock = threading.Lock()
        budget = max(64 << 20, 2 * self.io_concurrency * self.part_size)
        self._writer = CacheWriter(self.cache, budget) if self.cache is not None else None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_pid", "_pool", "_writer", "_ahead",
                                                                    "_ahead_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The request threads of this process (a forked child inherits none: it starts its own)."""
        self._own()
        return self._pool

    def _own(self) -> None:
        """Threads and pending requests of this process: a forked child starts its own and never
        waits on its parent's requests in flight."""
        if self._pid != os.getpid():
            self._start()

    def url(self, path: str) -> str:
        return str(self.fs.unstrip_protocol(path))

    def _get(self, path: str, start: int, end: int) -> Buffer:
        identity = self.identities.get(path)
        data: Buffer
        try:
            if self._native:
                data = self.fs.get_range(path, start, end, identity)
            else:
                data = call(self.fs, "cat_file", path, start=start, end=end, deadline=self.deadline)
        except FSTimeoutError as exc:
            raise TrainfeedError(no_answer(self.url(path), self.deadline)) from exc
        except FileNotFoundError as exc:
            raise ObjectChanged(changed_message(self.url(path), "deleted")) from exc
        if memoryview(data).nbytes != end - start:
            raise ObjectChanged(changed_message(self.url(path), f"cut short: asked for bytes {start}-{end}, got "
                                                f"{memoryview(data).nbytes}"))
        return data

    def _request(self, path: str, start: int, end: int, cached: bool = True) -> Span | list[Future[Buffer]]:
        """A cached span (``cached``: looked up), or the futures of the requests that fetch it
        (started now)."""
        if cached and self.cache is not None:
            hit = self.cache.get(self._cache_key(path, start, end), end - start)
            if hit is not None:
                return Span(start, [hit])
        pool = self.pool
        cuts = [start, end] if end - start <= self.max_request else [*list(range(start, end, self.part_size)), end]
        return [pool.submit(self._get, path, a, b) for a, b in itertools.pairwise(cuts)]

    def _cache_key(self, path: str, start: int, end: int) -> str:
        identity = self.identities.get(path)
        return f"{self.url(path)}|{identity.token if identity else ''}|{start}|{end}"

    def ahead(self, path: str, start: int, end: int) -> None:
        """Start fetching ``start:end`` now, for a ``fetch`` of the same span soon (a reader asks
        for the pieces it will decode next, so that ``io_concurrency`` requests stay in flight
        across pieces while few threads decode). At most ``AHEAD_SPANS`` wait. A span the disk
        cache holds is left to ``fetch`` (which checks it)."""
        self._own()
        with self._ahead_lock:
            key = (path, start, end)
            if key in self._ahead or (self.cache is not None
                                      and self.cache.holds(self._cache_key(path, start, end), end - start)):
                return
            self._ahead[key] = self._request(path, start, end, cached=False)
            while len(self._ahead) > AHEAD_SPANS:
                self._ahead.popitem(last=False)

    def fetch(self, path: str, start: int, end: int) -> Span:
        """Bytes ``start:end`` of ``path``; spans over ``max_request`` are fetched as concurrent
        parts of ``part_size``."""
        self._own()
        with self._ahead_lock:
            pending = self._ahead.pop((path, start, end), None)
        if isinstance(pending, list) and any(f.done() and f.exception() is not None for f in pending):
            pending = None  # fetched ahead during an outage: ask again (the storage may answer now)
        if pending is None:
            pending = self._request(path, start, end)
        if isinstance(pending, Span):
            return pending
        parts = [f.result() for f in pending]
        if self._writer is not None:  # there is one exactly when there is a cache
            self._writer.offer(self._cache_key(path, start, end), parts)
        return Span(start, parts)

    def close(self) -> None:
        if self._pid == os.getpid():
            self._pool.shutdown(wait=False, cancel_futures=True)


class _GCPause:
    """Automatic garbage collection held off while any thread is inside a RangeFile read.

    h5py calls ``readinto`` holding its global lock while the request runs on another thread;
    were a collection to start there and free an h5py object (which takes that lock), the two
    threads would wait on each other until the call times out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._was_enabled = False
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        """A forked child has none of its parent's threads: none is inside a read."""
        self._lock = threading.Lock()
        if self._inside and self._was_enabled:
            gc.enable()
        self._inside = 0

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._inside += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0 and self._was_enabled:
                gc.enable()


_GC_PAUSE = _GCPause()


class Blocks:
    """``BLOCK_SIZE`` blocks of one object fetched on demand, the ``count`` most recently used
    kept. One may serve several RangeFiles of the object (HDF5: each reading thread's handle),
    so that what they all read (the file's metadata, its chunk index) is fetched once."""

    def __init__(self, fetcher: Fetcher, path: str, size: int, count: int = 32) -> None:
        self.fetcher, self.path, self.size, self.count = fetcher, path, size, count
        self._blocks: OrderedDict[int, Span] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:  # a copy in another process starts empty
        return {"fetcher": self.fetcher, "path": self.path, "size": self.size, "count": self.count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        Blocks.__init__(self, **state)

    def get(self, index: int) -> Span:
        if self._pid != os.getpid():  # a forked child: its own lock (a parent's thread may have held this one)
            Blocks.__init__(self, self.fetcher, self.path, self.size, self.count)
        with self._lock:
            block = self._blocks.get(index)
            if block is not None:
                self._blocks.move_to_end(index)
                return block
        start = index * BLOCK_SIZE
        block = self.fetcher.fetch(self.path, start, min(self.size, start + BLOCK_SIZE))
        with self._lock:
            self._blocks[index] = block
            while len(self._blocks) > self.count:
                self._blocks.popitem(last=False)
        return block


class RangeFile(io.RawIOBase):
    """A read-only seekable view of one object whose reads are served from a prefetched span,
    else from blocks fetched on demand (``blocks``: shared with other views of the object)."""

    def __init__(self, fetcher: Fetcher, path: str, size: int, blocks: Blocks | None = None) -> None:
        super().__init__()
        self.fetcher, self.path, self.size = fetcher, path, size
        self._pos = 0
        self._span: Span | None = None
        self._blocks = blocks if blocks is not None else Blocks(fetcher, path, size)

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
        self._span = self.fetcher.fetch(self.path, start, end) if end > start else None

    def read(self, size: int | None = -1) -> Any:
        """Up to ``size`` bytes; inside the prefetched span, a view of the fetched buffer (pyarrow
        takes any buffer: the bytes are not copied on the way)."""
        n = self.size - self._pos if size is None or size < 0 else max(0, min(size, self.size - self._pos))
        span = self._span
        if span is not None and span.start <= self._pos and self._pos + n <= span.end:
            data = span.view(self._pos, n)
            self._pos += n
            return data
        buffer = bytearray(n)
        return bytes(buffer[:self.readinto(buffer)])

    def readinto(self, buffer: Buffer) -> int:
        with _GC_PAUSE:
            return self._readinto(buffer)

    def _readinto(self, buffer: Buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self.size - self._pos))
        pos, done = self._pos, 0
        span = self._span
        if span is not None and span.start <= pos and pos + n <= span.end:
            view[:n] = span.view(pos, n)
        elif n > BLOCK_SIZE * 4:  # a large read outside the span: fetch it whole, keep nothing
            fetched = self.fetcher.fetch(self.path, pos, pos + n)
            view[:n] = fetched.view(pos, n)
        else:
            while done < n:
                index, offset = divmod(pos + done, BLOCK_SIZE)
                block = self._blocks.get(index)
                take = min(n - done, len(block) - offset)
                view[done:done + take] = block.view(block.start + offset, take)
                done += take
        self._pos += n
        return n


class CachingFileSystem:
    """A file system whose bounded reads go through ``fetcher`` (its connection budget and disk
    cache); everything else is the fetcher's file system's. For the small-file layout, whose
    reads are whole files of known size."""

    async_impl = False

    def __init__(self, fetcher: Fetcher) -> None:
        self._fetcher = fetcher

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_fetcher":  # looked up by unpickling before the state is set
            raise AttributeError(name)
        return getattr(self._fetcher.fs, name)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        if end is None:
            data: bytes = call(self._fetcher.fs, "cat_file", path, start=start, end=end,
                               deadline=self._fetcher.deadline)
            return data
        return self._fetcher.fetch(path, start or 0, end).tobytes()


def open_fetcher(location: Location, io_concurrency: int = DEFAULT_IO_CONCURRENCY,
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int = 0,
                 identities: dict[str, Identity] | None = None) -> Fetcher:
    """The fetcher a reader of the store at ``location`` uses (``cache_dir``: keep what it reads)."""
    cache = DiskCache(cache_dir, cache_limit) if cache_dir and cache_limit > 0 else None
    return Fetcher(location.fs, io_concurrency, cache, deadline=call_timeout(location.storage_options),
                   identities=identities)
