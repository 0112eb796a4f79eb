"""Cloud-latency emulation for any fsspec filesystem (local files, abfs on Azurite, s3): it
shows from this machine what a layout and a reader cost on a cloud object store.

Every request pays the profile's model: a GET (``cat_file``, whole or a byte range) takes the
first-byte latency plus its bytes at the per-stream bandwidth; a HEAD (``info``, ``size``)
and a LIST (``ls``, ``find``: one request per call) take the latency. A request takes at
least its modelled time: what the target itself takes counts towards it. At most
``max_concurrency`` requests are in flight (a semaphore held for the whole request). Opened
files read every range through ``cat_file``, so pyarrow and h5py pay per range they read.
Read-only: writes are refused.

Instances built with the same target, profile and target options share one connection pool
and one set of counters (one client per process, as a cloud SDK's pool is): fsspec builds a
filesystem per thread, which would otherwise give every reader thread its own cap.

    fs = EmulatedFileSystem(target="file", profile="azure-blob")
    fs, path = fsspec.core.url_to_fs("emulated:///data/volumes", target="file", profile="azure-blob")
    fs, path = fsspec.core.url_to_fs("emulated://container/volumes", target="abfs", profile="probed.json",
                                     target_options={"connection_string": ...})
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict
from typing import Any

import fsspec
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import tokenize

from trainfeed.benchmarks.model.profiles import ObjectStore, load_object_store
from trainfeed.converters.storage.filesystems import filesystem, is_local

GET, HEAD, LIST = "gets", "heads", "lists"
#: The URL scheme of the emulated object store, registered with fsspec when this module is imported.
EMULATED = "emulated"


class _Client:
    """One client's connection pool and request counters (thread-safe)."""

    def __init__(self, connections: int) -> None:
        self.slots = threading.BoundedSemaphore(connections)
        self._lock = threading.Lock()
        self._in_flight = 0
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._counts = {GET: 0, HEAD: 0, LIST: 0}
            self._bytes = 0
            self._peak = self._in_flight

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)

    def end(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self._in_flight -= 1
            self._counts[kind] += 1
            self._bytes += nbytes

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"requests": sum(self._counts.values()), **self._counts, "bytes": self._bytes,
                    "peak_in_flight": self._peak}


_clients: dict[str, _Client] = {}
_clients_lock = threading.Lock()


def _client(key: str, connections: int) -> _Client:
    with _clients_lock:
        return _clients.setdefault(key, _Client(connections))


class EmulatedFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec ships no types
    protocol = EMULATED
    cachable = False  # the shared state lives in _clients, keyed across threads

    def __init__(self, target: str = "file", profile: str | ObjectStore = "azure-blob",
                 target_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target_protocol = target
        self.inner_options = dict(target_options or {})
        self.target = filesystem(target, self.inner_options)
        self.profile = load_object_store(profile)
        key = tokenize(target, asdict(self.profile), self.inner_options)
        self._client = _client(key, self.profile.max_concurrency)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        return path.removeprefix(f"{EMULATED}://")

    def inner_url(self, path: str) -> str:
        """The URL of the same object on the target (a local path for local files), for the
        clients that reach storage on their own (delta-rs)."""
        path = str(self._strip_protocol(path))
        return path if is_local(self.target) else f"{self.target_protocol}://{path}"

    def stats(self) -> dict[str, int]:
        """Requests (gets, heads, lists), bytes returned and the most requests seen in flight,
        for this client since it was created or last reset."""
        return self._client.stats()

    def reset_stats(self) -> None:
        self._client.reset()

    def _request(self, kind: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """One request to the target, held to its modelled duration, on one of the client's connections."""
        with self._client.slots:
            self._client.begin()
            t0 = time.perf_counter()
            nbytes = 0
            try:
                result = getattr(self.target, method)(*args, **kwargs)
                nbytes = len(result) if kind == GET else 0
                return result
            finally:
                rest = self.profile.request_seconds(nbytes) - (time.perf_counter() - t0)
                if rest > 0:
                    time.sleep(rest)
                self._client.end(kind, nbytes)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        data: bytes = self._request(GET, "cat_file", self._strip_protocol(path), start=start, end=end, **kwargs)
        return data

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        info: dict[str, Any] = self._request(HEAD, "info", self._strip_protocol(path), **kwargs)
        return info

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        entries: list[Any] = self._request(LIST, "ls", self._strip_protocol(path), detail=detail, **kwargs)
        return entries

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:
        return self._request(LIST, "find", self._strip_protocol(path), maxdepth=maxdepth, withdirs=withdirs,
                             detail=detail, **kwargs)

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_options: dict[str, Any] | None = None, cache_type: str = "none", **kwargs: Any) -> EmulatedFile:
        if mode != "rb":
            raise PermissionError(f"{EMULATED}://{path}: the emulated object store is read-only")
        return EmulatedFile(self, path, mode, block_size or "default", cache_type=cache_type,
                            cache_options=cache_options, **kwargs)


class EmulatedFile(AbstractBufferedFile):  # type: ignore[misc]  # fsspec ships no types
    """A read-only file whose every range read is one emulated GET (no read-ahead unless the
    caller asks for a cache type)."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        data: bytes = self.fs.cat_file(self.path, start=start, end=end)
        return data


fsspec.register_implementation(EMULATED, EmulatedFileSystem, clobber=True)
