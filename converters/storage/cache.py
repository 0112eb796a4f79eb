"""A local disk cache of object ranges that can never serve stale or damaged bytes, and never
touches a file it did not write.

- **Keyed by object identity**: the object's URL, its version (ETag or version id, size, last
  modified, as the store's listing gave them when the reader opened it) and the range. An
  object replaced under the same name (a store overwritten, a table rewritten in place, an
  edited file) has another identity: its old ranges are never looked up again, only evicted.
- **Checked on every read**: each file ends with a footer (magic, CRC-32, payload length and
  a digest of the key); a file of the wrong size, a bad footer, a checksum mismatch or another
  key's range is deleted and reported as a miss, so the range is fetched again.
- **Owns its folder**: a folder is used only if the cache created it or it is empty (it is then
  marked with ``.trainfeed-cache``); one holding any name the cache would not give is refused
  (``ForeignCacheFolder``) before anything is read. Eviction and sweeping delete only files named
  as the cache names them, and a range file only if its footer is the cache's.
- **Shared by processes**: a range is written to a temporary name (``.<name>.<pid>.<n>.<size>.tmp``) and
  renamed into place (readers see all of it or nothing); the bytes in use, temporary files
  included, are counted in ``.usage`` under an exclusive lock on ``.lock``, and whoever pushes
  the total past ``limit`` evicts the least recently used files (a hit touches its file's
  modification time) until it is under the limit again. A temporary file is created in the
  same locked step that reserves its size, renamed under the lock too, and a rescan counts it
  at that size (its name says), not the part written so far: a rescan never drops a
  reservation being written. Temporary files of writers that are
  gone are swept when a cache opens. A file a reader has mapped stays readable after eviction.
- **Never in the way**: a folder that cannot be written (read-only, full) makes the cache a
  pass-through with one warning; a read never fails because of the cache.
"""
from __future__ import annotations

import fcntl
import hashlib
import itertools
import mmap
import os
import re
import struct
import sys
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfeed.converters.errors import UsageError

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

_MAGIC = b"TFC2"
_FOOTER = struct.Struct("<4sIQ16s")  # magic, CRC-32 of the payload, payload length, key digest
FOOTER_SIZE = _FOOTER.size
MARKER = ".trainfeed-cache"
_MARKER_TEXT = "A trainfeed range cache (--cache-dir). trainfeed deletes only the files it wrote here.\n"
#: What the cache itself may create: its marker, lock and usage files, and range files.
_OWN_TOP = re.compile(r"(\.trainfeed-cache|\.lock|\.usage|\.usage\.\d+\.tmp|[0-9a-f]{2})")
_RANGE = re.compile(r"[0-9a-f]{64}\.bin")
_TEMP = re.compile(r"\.([0-9a-f]{64}\.bin)\.(\d+)\.\d+(?:\.(\d+))?\.tmp")

#: Eviction goes this far under the limit, so that the next puts do not each evict again.
_LOW_WATER = 0.9


def _writer_pid(temporary_name: str) -> int:
    """The process that writes a temporary file (its name, as ``_owned`` matched it, says)."""
    match = _TEMP.fullmatch(temporary_name)
    assert match is not None, temporary_name
    return int(match.group(2))


def _counted(file: Path, st: os.stat_result, temporary: bool) -> int:
    """Bytes a file counts for: a temporary file its whole reserved size (its name says), so
    that a rescan while it is written does not drop the reservation."""
    match = _TEMP.fullmatch(file.name) if temporary else None
    return max(st.st_size, int(match.group(3))) if match and match.group(3) else st.st_size


class ForeignCacheFolder(UsageError):
    """The cache folder holds files the cache did not write."""


class DiskCache:
    """Byte ranges of remote objects as files under ``folder``, at most ``limit`` bytes in all."""

    def __init__(self, folder: str | os.PathLike[str], limit: int) -> None:
        self.folder = Path(folder)
        self.limit = limit
        self.discarded = 0
        self.usable = True
        self._names = itertools.count()
        self._claim()
        if self.usable:
            self._sweep_dead_writers()

    def __getstate__(self) -> dict[str, object]:
        return {"folder": str(self.folder), "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        DiskCache.__init__(self, state["folder"], state["limit"])

    # ------------------------------------------------------------------ ownership

    def _claim(self) -> None:
        """Use the folder only if the cache made it or it is empty; mark it as the cache's."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if (self.folder / MARKER).is_file():
                return
            foreign = [p.name for p in self.folder.iterdir() if not _OWN_TOP.fullmatch(p.name)]
            foreign += [f"{p.parent.name}/{p.name}" for p in self.folder.glob("??/*")
                        if not (_RANGE.fullmatch(p.name) or _TEMP.fullmatch(p.name))]
            if foreign:  # names the cache would have given are fine: an empty folder, or one being claimed
                shown = ", ".join(sorted(foreign)[:3])
                raise ForeignCacheFolder(f"--cache-dir {self.folder}: the folder holds {shown} and is not a trainfeed "
                                         "cache; give a new or empty folder (the cache deletes what it evicts)")
            (self.folder / MARKER).write_text(_MARKER_TEXT)
        except OSError as exc:
            self._unusable(exc)

    def _unusable(self, exc: OSError) -> None:
        if self.usable:
            self.usable = False
            print(f"warning: --cache-dir {self.folder}: cannot be used ({exc.strerror or exc}); reading without "
                  "the cache", file=sys.stderr)

    def _sweep_dead_writers(self) -> None:
        """Remove temporary files whose writing process is gone (a killed reader's)."""
        for tmp in self.folder.glob("*/.*.tmp"):
            match = _TEMP.fullmatch(tmp.name)
            if match and not pid_alive(int(match.group(2))):
                with suppress(OSError):
                    tmp.unlink()

    # ------------------------------------------------------------------ ranges

    @staticmethod
    def _digest(key: str) -> bytes:
        return hashlib.sha256(key.encode()).digest()

    def _file(self, key: str) -> Path:
        digest = self._digest(key).hex()
        return self.folder / digest[:2] / f"{digest}.bin"

    def get(self, key: str, size: int) -> memoryview | None:
        """The ``size`` bytes cached under ``key``, mapped from their file (no copy), or None:
        not cached, or the file is damaged or another key's (then it is deleted)."""
        if not self.usable:
            return None
        file = self._file(key)
        try:
            with open(file, "rb") as f:
                total = os.fstat(f.fileno()).st_size
                if total != size + _FOOTER.size:
                    raise ValueError("size")
                view = memoryview(mmap.mmap(f.fileno(), total, access=mmap.ACCESS_READ))
        except FileNotFoundError:
            return None
        except (ValueError, OSError):
            self._discard(file)
            return None
        magic, crc, length, digest = _FOOTER.unpack(view[size:])
        payload = view[:size]
        if magic != _MAGIC or length != size or digest != self._digest(key)[:16] or zlib.crc32(payload) != crc:
            self._discard(file)
            return None
        with suppress(OSError):
            os.utime(file)  # recency, seen by every process sharing the folder
        return payload

    def holds(self, key: str, size: int) -> bool:
        """Whether a file of the right size is cached under ``key`` (not checked: ``get`` does)."""
        if not self.usable:
            return False
        try:
            return self._file(key).stat().st_size == size + _FOOTER.size
        except OSError:
            return False

    def _discard(self, file: Path) -> None:
        self.discarded += 1
        with suppress(OSError):
            file.unlink()

    def put(self, key: str, parts: Iterable[Buffer]) -> None:
        """Keep ``parts`` (buffers, in order) as the range cached under ``key``. A folder that
        cannot take it (full, read-only) turns the cache into a pass-through, never a failure."""
        if not self.usable:
            return
        parts = list(parts)
        size = sum(memoryview(p).nbytes for p in parts)
        if size + _FOOTER.size > self.limit:
            return
        file = self._file(key)
        tmp = file.with_name(f".{file.name}.{os.getpid()}.{next(self._names)}.{size + _FOOTER.size}.tmp")
        crc = 0
        try:
            file.parent.mkdir(exist_ok=True)
            with self._locked():  # reserved and created together: a rescan from now on counts it
                self._account(size + _FOOTER.size)
                out = open(tmp, "wb")  # noqa: SIM115 - opened under the lock, written outside it
            with out as f:
                for part in parts:
                    f.write(part)
                    crc = zlib.crc32(part, crc)
                f.write(_FOOTER.pack(_MAGIC, crc, size, self._digest(key)[:16]))
            with self._locked():  # a rescan lists the folder under the lock: it sees one name or the other
                os.replace(tmp, file)  # readers see a whole range or none
        except OSError as exc:
            with suppress(OSError):
                tmp.unlink()
            if exc.errno not in (None, 0):
                self._unusable(exc)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.folder / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _account(self, added: int) -> None:
        """Count ``added`` bytes in, evicting first if they would pass the limit (the caller
        holds the lock)."""
        usage = self.folder / ".usage"
        try:
            total = int(usage.read_text() or 0) + added
        except (OSError, ValueError):
            total = self._scan_and_evict(self.limit - added) + added
        if total > self.limit:
            total = self._scan_and_evict(int(self.limit * _LOW_WATER) - added) + added
        tmp = usage.with_name(f".usage.{os.getpid()}.tmp")
        tmp.write_text(str(total))
        os.replace(tmp, usage)

    def _owned(self) -> Iterable[tuple[Path, os.stat_result, bool]]:
        """Every file the cache wrote: (path, stat, whether it is a temporary file). A range file
        is the cache's by its name and its footer; a file merely named like one is not."""
        for sub in self.folder.iterdir():
            if len(sub.name) != 2 or not _OWN_TOP.fullmatch(sub.name) or not sub.is_dir():
                continue
            for file in sub.iterdir():
                with suppress(OSError):
                    if _RANGE.fullmatch(file.name) and file.name.startswith(sub.name):
                        st = file.stat()
                        if _has_footer(file, st.st_size):
                            yield file, st, False
                    elif _TEMP.fullmatch(file.name) and file.name[1:3] == sub.name:
                        yield file, file.stat(), True

    def _scan_and_evict(self, target: int) -> int:
        """Delete the least recently used range files until at most ``target`` bytes remain
        (temporary files count, and go only when their writer is gone); the total."""
        ranges, total = [], 0
        for file, st, temporary in self._owned():
            if temporary and not pid_alive(_writer_pid(file.name)):
                with suppress(OSError):
                    file.unlink()
                continue
            if not temporary:
                ranges.append((st.st_mtime, st.st_size, file))
            total += _counted(file, st, temporary)
        ranges.sort()
        for _, size, file in ranges:
            if total <= target:
                break
            with suppress(OSError):
                file.unlink()
                total -= size
        return total

    @property
    def bytes(self) -> int:
        """Bytes held now, temporary files included (a scan of the folder)."""
        return sum(_counted(file, st, temporary) for file, st, temporary in self._owned())


def _has_footer(file: Path, size: int) -> bool:
    if size < _FOOTER.size:
        return False
    try:
        with open(file, "rb") as f:
            f.seek(size - _FOOTER.size)
            magic, _, length, _ = _FOOTER.unpack(f.read(_FOOTER.size))
    except (OSError, struct.error):
        return False
    return bool(magic == _MAGIC and length == size - _FOOTER.size)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (on this machine): what tells a live writer from a killed one."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
