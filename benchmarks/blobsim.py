"""Cloud-latency emulation for any fsspec filesystem: every GET waits a first-byte latency,
streams at a per-connection bandwidth, and at most N GETs are in flight (the client-side
connection cap). Wrapping local files, Azurite or a real bucket, it shows what the small-
file layout costs on a cloud object store from this machine.

    fs = EmulatedFileSystem(target="file", profile="azure-blob")
    # or as a URL: emulated:///data/volumes with storage_options {"target": "file", "profile": "s3"}
"""
from __future__ import annotations

import threading
import time

import fsspec
from fsspec.spec import AbstractFileSystem

from .profiles import ObjectStore, load_object_store


class EmulatedFileSystem(AbstractFileSystem):
    protocol = "emulated"
    cachable = False

    def __init__(self, target: str = "file", profile: str | ObjectStore = "azure-blob",
                 target_options: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.target = fsspec.filesystem(target, **(target_options or {}))
        self.profile = profile if isinstance(profile, ObjectStore) else load_object_store(profile)
        self._slots = threading.BoundedSemaphore(self.profile.max_concurrency)
        self.requests = 0
        self.bytes = 0
        self._lock = threading.Lock()

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        return path[len("emulated://"):] if path.startswith("emulated://") else path

    # listing and metadata go straight to the target (one LIST is cheap next to N GETs)
    def ls(self, path, detail=True, **kwargs):
        return self.target.ls(path, detail=detail, **kwargs)

    def info(self, path, **kwargs):
        return self.target.info(path, **kwargs)

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        return self.target.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)

    def isdir(self, path):
        return self.target.isdir(path)

    def cat_file(self, path, start=None, end=None, **kwargs):
        with self._slots:
            data = self.target.cat_file(path, start=start, end=end, **kwargs)
            delay = self.profile.first_byte_ms / 1e3 + len(data) / (self.profile.stream_mb_per_s * 1e6)
            time.sleep(delay)
        with self._lock:
            self.requests += 1
            self.bytes += len(data)
        return data

    def _open(self, path, mode="rb", **kwargs):
        if "r" not in mode:
            raise PermissionError("the emulated object store is read-only")
        return self.target._open(path, mode=mode, **kwargs)


fsspec.register_implementation("emulated", EmulatedFileSystem, clobber=True)
