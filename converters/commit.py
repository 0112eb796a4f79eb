"""Build a store beside its destination, then make it visible in one atomic step.

A conversion writes into a hidden sibling ``.NAME.trainfeed-tmp-PID-XXXX``. On success the
sibling is renamed onto the destination; when replacing an existing store the two are
swapped with ``renameat2(RENAME_EXCHANGE)`` so that at every instant the destination path
holds either the old complete store or the new complete one. A killed run leaves only the
hidden sibling, which the next run to the same destination removes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import uuid
from pathlib import Path

_TMP_TAG = ".trainfeed-tmp-"
_OLD_TAG = ".trainfeed-old-"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2). False where the OS or filesystem cannot."""
    fn = getattr(_LIBC, "renameat2", None) if _LIBC is not None else None
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(dst: Path) -> list[Path]:
    """Remove staging siblings of ``dst`` left by runs that were killed; put back a previous
    store that a killed run had moved aside (only where RENAME_EXCHANGE is unavailable)."""
    removed = []
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
        if pid_text.isdigit() and _pid_alive(int(pid_text)) and int(pid_text) != os.getpid():
            continue
        remove(entry)
        removed.append(entry)
    return removed


class Staging:
    """Context manager: ``path`` is where to write; ``commit()`` publishes it at ``dst``."""

    def __init__(self, dst: Path):
        self.dst = Path(dst)
        # The staging name keeps the destination's suffix: writers may read it (``x.h5`` = one file).
        unique = f"{os.getpid()}-{uuid.uuid4().hex[:8]}{self.dst.suffix}"
        self.path = self.dst.parent / f".{self.dst.name}{_TMP_TAG}{unique}"
        self.committed = False

    def __enter__(self) -> Staging:
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(self.dst)
        return self

    def commit(self) -> None:
        """Publish the staged store; an existing one at ``dst`` is replaced atomically."""
        if self.dst.exists() or self.dst.is_symlink():
            if not exchange(self.path, self.dst):
                # No RENAME_EXCHANGE here: move the old store aside first. A kill between the
                # two renames leaves the old store aside, and clean_stale() puts it back.
                aside = self.dst.parent / f".{self.dst.name}{_OLD_TAG}{os.getpid()}"
                os.replace(self.dst, aside)
                os.replace(self.path, self.dst)
                self.path = aside
            remove(self.path)  # now holds the previous store
        else:
            os.replace(self.path, self.dst)
        self.committed = True

    def __exit__(self, *exc) -> None:
        if not self.committed:
            remove(self.path)
