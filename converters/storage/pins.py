"""Local stores pinned like stores on object storage: each data file's identity (inode, size,
modification time) when the store was opened. A reader opens a file only if it is still that
file, so a store rewritten under a reader (``convert --overwrite`` swaps in new files) stops it
with "the store changed while it was being read; reopen it", mid-epoch or between epochs,
instead of mixing two generations. A file a reader already holds open keeps reading what it
opened (the old generation, whole)."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from trainfeed.converters.storage.native import ObjectChanged, changed_message

T = TypeVar("T")


@dataclass(frozen=True)
class Pin:
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str) -> Pin:
        st = os.stat(path)
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)


def pin_files(files: list[str]) -> dict[str, Pin]:
    return {f: Pin.of(f) for f in files}


def check(path: str, pinned: Pin | None) -> None:
    """Refuse ``path`` unless it is the file pinned (no pin: nothing to check)."""
    if pinned is None:
        return
    try:
        now = Pin.of(path)
    except FileNotFoundError:
        raise ObjectChanged(changed_message(path, "deleted")) from None
    if now != pinned:
        raise ObjectChanged(changed_message(path, "replaced" if now.inode != pinned.inode else "modified"))


def open_pinned(path: str, pinned: Pin | None, opener: Callable[[], T]) -> T:
    """``opener()`` for ``path``, checked against its pin before and after it opens (a swap in
    between is caught too)."""
    check(path, pinned)
    handle = opener()
    check(path, pinned)
    return handle
