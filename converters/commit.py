"""Build a store beside its destination, then make it visible in one atomic step.

A conversion writes into a hidden sibling ``.NAME.trainfeed-tmp-PID-XXXX``. On success the
sibling is published at the destination:

- when nothing was there, by a rename that never replaces (``renameat2(RENAME_NOREPLACE)``):
  whatever appeared at the destination while the run was writing is left alone and the
  run fails;
- when replacing (``overwrite=True``), only if what is there is still a store written by
  trainfeed or an empty folder, and by swapping the two with ``renameat2(RENAME_EXCHANGE)``
  so that at every instant the destination holds either the old complete store or the new
  one. What the swap displaced is checked again before it is deleted.

A killed run leaves only the hidden sibling, which the next run to the same destination
removes. ``DestinationLock`` keeps two runs from writing one destination at the same time.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.registry import identify
from trainfeed.converters.storage.cache import pid_alive

_TMP_TAG = ".trainfeed-tmp-"
_OLD_TAG = ".trainfeed-old-"
_LOCK_TAG = ".trainfeed-lock"
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
#: renameat2 errors meaning "not available here" (old kernel, filesystem without the flag)
_UNSUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP)


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def _renameat2(a: Path, b: Path, flags: int) -> int:
    """0 on success, else the errno; ENOSYS where libc has no renameat2."""
    fn = getattr(_LIBC, "renameat2", None) if _LIBC is not None else None
    if fn is None:
        return errno.ENOSYS
    return 0 if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0 else ctypes.get_errno()


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2). False where the OS or filesystem cannot."""
    return _renameat2(a, b, _RENAME_EXCHANGE) == 0


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; FileExistsError if anything is at ``dst``, never replacing it."""
    err = _renameat2(src, dst, _RENAME_NOREPLACE)
    if err == 0:
        return
    if err not in _UNSUPPORTED:
        raise OSError(err, os.strerror(err), str(dst))
    if src.is_dir() and not src.is_symlink():
        # mkdir fails if anything is there; rename onto the empty folder fails if anything
        # was put into it meanwhile
        os.mkdir(dst)
        try:
            os.rename(src, dst)
        except OSError:
            os.rmdir(dst)  # only succeeds while empty: never removes what others put there
            raise
    else:
        os.link(src, dst)  # fails if anything is at dst
        os.unlink(src)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_stale(dst: Path) -> list[Path]:
    """Remove staging siblings of ``dst`` left by runs that were killed; put back a previous
    store that a killed run had moved aside (only where RENAME_EXCHANGE is unavailable)."""
    removed: list[Path] = []
    prefix = f".{dst.name}{_TMP_TAG}"
    old_prefix = f".{dst.name}{_OLD_TAG}"
    if not dst.parent.is_dir():
        return removed
    for entry in sorted(dst.parent.iterdir()):
        if entry.name.startswith(old_prefix):
            if not (dst.exists() or dst.is_symlink()):
                os.replace(entry, dst)
            else:
                remove(entry)
                removed.append(entry)
            continue
        if not entry.name.startswith(prefix):
            continue
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if pid_text.isdigit() and pid_alive(int(pid_text)) and int(pid_text) != os.getpid():
            continue
        remove(entry)
        removed.append(entry)
    return removed


def _refusal(dst: Path, what: str) -> TrainfeedError:
    return TrainfeedError(f"{dst}: {what} is there now (it changed while this run was writing); "
                          "left it untouched, nothing was published")


class Staging:
    """Context manager: ``path`` is where to write; ``commit()`` publishes it at ``dst``.

    ``overwrite``: whether ``commit()`` may replace a trainfeed store (or an empty folder)
    found at ``dst``; without it nothing at ``dst`` is ever replaced."""

    def __init__(self, dst: Path, *, overwrite: bool = False) -> None:
        self.dst = Path(dst)
        self.overwrite = overwrite
        # The staging name keeps the destination's suffix: writers may read it (``x.h5`` = one file).
        unique = f"{os.getpid()}-{uuid.uuid4().hex[:8]}{self.dst.suffix}"
        self.path = self.dst.parent / f".{self.dst.name}{_TMP_TAG}{unique}"
        self.committed = False

    def __enter__(self) -> Staging:
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(self.dst)
        return self

    def commit(self) -> None:
        """Publish the staged store; an existing trainfeed store is replaced atomically when
        ``overwrite``. Raises TrainfeedError, publishing nothing, if ``dst`` holds anything else."""
        found = identify(self.dst) if self.overwrite else None
        if found is None:
            self._publish_new()
        elif not found.replaceable:
            raise _refusal(self.dst, found.what)
        else:
            self._replace()
        self.committed = True

    def _publish_new(self) -> None:
        try:
            rename_noreplace(self.path, self.dst)
        except FileExistsError:
            found = identify(self.dst)
            raise _refusal(self.dst, found.what if found else "something") from None

    def _replace(self) -> None:
        if exchange(self.path, self.dst):
            displaced = self.path  # now holds what was at dst
            self._put_back_unless_replaceable(displaced, lambda: exchange(self.path, self.dst))
        else:
            # No RENAME_EXCHANGE here: move the old store aside first. A kill between the
            # two renames leaves the old store aside, and clean_stale() puts it back.
            displaced = self.dst.parent / f".{self.dst.name}{_OLD_TAG}{os.getpid()}"
            os.replace(self.dst, displaced)
            self._put_back_unless_replaceable(displaced, lambda: rename_noreplace(displaced, self.dst))
            self._publish_new()
        remove(displaced)

    def _put_back_unless_replaceable(self, displaced: Path, put_back: Callable[[], object]) -> None:
        """The last check before deleting: what left ``dst`` must be ours to delete."""
        found = identify(displaced)
        if found is not None and not found.replaceable:
            put_back()
            raise _refusal(self.dst, found.what)

    def __exit__(self, *exc: object) -> None:
        if not self.committed:
            remove(self.path)


class DestinationLock:
    """One run at a time per destination: an exclusive, non-blocking ``flock`` on
    ``.NAME.trainfeed-lock`` beside it, holding the owner's pid. The kernel drops the lock
    when its process dies, so a killed run never blocks the next one; the file is removed
    on release (a killed run leaves it behind, unlocked, for the next run to reuse)."""

    def __init__(self, dst: Path) -> None:
        self.dst = Path(dst)
        self.path = self.dst.parent / f".{self.dst.name}{_LOCK_TAG}"
        self._fd: int | None = None

    def __enter__(self) -> DestinationLock:
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise TrainfeedError(f"{self.dst}: another trainfeed run is writing it (pid {holder}); "
                                     "try again when it has finished") from None
            if self._is_current(fd):
                self._fd = fd
            else:  # its previous holder removed it after we opened it: take the new one
                os.close(fd)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def _is_current(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            self.path.unlink(missing_ok=True)  # while still held: no one can be between open and flock on it
            os.close(self._fd)
            self._fd = None
