"""A local disk cache of object ranges that can never serve stale or damaged bytes.

- **Keyed by object identity**: the object's URL, its version (ETag or version id, size, last
  modified, as the store's listing gave them when the reader opened it) and the range. An
  object replaced under the same name (a store overwritten, a table rewritten in place, an
  edited file) has another identity: its old ranges are never looked up again, only evicted.
- **Checked on every read**: each file ends with a footer (magic, payload length, CRC-32);
  a file of the wrong size, a bad footer or a checksum mismatch is deleted and reported as
  a miss, so the range is fetched again.
- **Shared by processes**: a range is written to a temporary name and renamed into place
  (readers see all of it or nothing); the bytes in use are counted in ``.usage`` under an
  exclusive lock on ``.lock``, and whoever pushes the total past ``limit`` evicts the least
  recently used files (a hit touches its file's modification time) until it is under the
  limit again. A file a reader has mapped stays readable after it is evicted.
"""
from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import time
import uuid
import zlib
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterable

_MAGIC = b"TFC1"
_FOOTER = struct.Struct("<4sIQ")  # magic, CRC-32 of the payload, payload length
#: Eviction goes this far under the limit, so that the next puts do not each evict again.
_LOW_WATER = 0.9


class DiskCache:
    """Byte ranges of remote objects as files under ``folder``, at most ``limit`` bytes in all."""

    def __init__(self, folder, limit: int):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.limit = limit
        self.hits = self.misses = self.discarded = 0

    def _file(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.folder / digest[:2] / f"{digest}.bin"

    def get(self, key: str, size: int) -> memoryview | None:
        """The ``size`` bytes cached under ``key``, mapped from their file (no copy), or None:
        not cached, or the file is damaged (then it is deleted)."""
        file = self._file(key)
        try:
            with open(file, "rb") as f:
                total = os.fstat(f.fileno()).st_size
                if total != size + _FOOTER.size:
                    raise ValueError("size")
                view = memoryview(mmap.mmap(f.fileno(), total, access=mmap.ACCESS_READ))
        except FileNotFoundError:
            self.misses += 1
            return None
        except (ValueError, OSError):
            return self._discard(file)
        magic, crc, length = _FOOTER.unpack(view[size:])
        payload = view[:size]
        if magic != _MAGIC or length != size or zlib.crc32(payload) != crc:
            return self._discard(file)
        with suppress(OSError):
            os.utime(file)  # recency, seen by every process sharing the folder
        self.hits += 1
        return payload

    def _discard(self, file: Path) -> None:
        self.discarded += 1
        self.misses += 1
        with suppress(OSError):
            file.unlink()
        return None

    def put(self, key: str, parts: Iterable) -> None:
        """Keep ``parts`` (buffers, in order) as the range cached under ``key``."""
        parts = list(parts)
        size = sum(memoryview(p).nbytes for p in parts)
        if size + _FOOTER.size > self.limit:
            return
        file = self._file(key)
        file.parent.mkdir(exist_ok=True)
        tmp = file.with_name(f".{file.name}.{uuid.uuid4().hex[:8]}.tmp")
        crc = 0
        try:
            with open(tmp, "wb") as f:
                for part in parts:
                    f.write(part)
                    crc = zlib.crc32(part, crc)
                f.write(_FOOTER.pack(_MAGIC, crc, size))
            os.replace(tmp, file)  # readers see a whole range or none
        except OSError:
            with suppress(OSError):
                tmp.unlink()
            return  # a full disk makes the cache a pass-through, never a failure
        self._account(size + _FOOTER.size)

    @contextmanager
    def _locked(self):
        with open(self.folder / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _account(self, added: int) -> None:
        usage = self.folder / ".usage"
        with self._locked():
            try:
                total = int(usage.read_text() or 0) + added
            except (OSError, ValueError):
                total = self._scan_and_evict(self.limit)
            if total > self.limit:
                total = self._scan_and_evict(int(self.limit * _LOW_WATER))
            tmp = usage.with_name(f".usage.{os.getpid()}.tmp")
            tmp.write_text(str(total))
            os.replace(tmp, usage)

    def _scan_and_evict(self, target: int) -> int:
        """Delete least recently used files until at most ``target`` bytes remain; the total."""
        stale = time.time() - 3600
        for tmp in self.folder.glob("*/.*.tmp"):  # a killed writer's; live ones are seconds old
            with suppress(OSError):
                if tmp.stat().st_mtime < stale:
                    tmp.unlink()
        files = []
        for file in self.folder.glob("*/*.bin"):
            with suppress(OSError):
                st = file.stat()
                files.append((st.st_mtime, st.st_size, file))
        files.sort()
        total = sum(size for _, size, _ in files)
        for _, size, file in files:
            if total <= target:
                break
            with suppress(OSError):
                file.unlink()
                total -= size
        return total

    @property
    def bytes(self) -> int:
        """Bytes held now (a scan of the folder)."""
        return sum(f.stat().st_size for f in self.folder.glob("*/*.bin"))
