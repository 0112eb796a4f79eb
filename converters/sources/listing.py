"""Small-file sources, listing: the sample files under a folder (local path or fsspec URL), sorted
by id (the path inside the folder without its extension), and their bytes, never read past the size
the listing gave; what cannot be a sample (a FIFO, a device, a name that is not UTF-8) is listed with why."""
from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.exceptions import FSTimeoutError

from trainfeed.converters.errors import SampleError, TrainfeedError
from trainfeed.converters.storage.config import call_timeout, no_answer
from trainfeed.converters.storage.filesystems import call, is_local, open_fs
from trainfeed.converters.storage.native import Identity

NPY, NPZ, IMAGE = "npy", "npz", "image"
_EXTENSIONS = {".npy": NPY, ".npz": NPZ, ".jpg": IMAGE, ".jpeg": IMAGE, ".png": IMAGE}


@dataclass(frozen=True)
class SourceFile:
    id: str
    path: str  # path inside the filesystem
    size: int
    problem: str | None = None  # why the file cannot be a sample, found when listing it
    deadline: float | None = None  # seconds a read may take on a remote store, retries included (see call())
    identity: Identity | None = None  # the version listed (object storage): what reads and the cache are tied to


@dataclass
class Listing:
    kind: str
    files: list[SourceFile]
    ignored: list[str] = field(default_factory=list)


def printable(name: str) -> str:
    """``name`` as valid UTF-8: bytes of a file name that are not UTF-8 shown as ``\\xNN``."""
    try:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that no file name decoding produced
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


_SPECIAL_FILES = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(fs: fsspec.AbstractFileSystem, path: str) -> str | None:
    """Why an entry the listing did not call a file is no sample; None where reading it
    will tell (a broken link, a file deleted since)."""
    if not is_local(fs):
        return "not a regular file"
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return "not a regular file (" + next((what for test, what in _SPECIAL_FILES if test(mode)), "not a file") + ")"


def _listing_problem(fs: fsspec.AbstractFileSystem, path: str, rel: str, info: dict[str, Any]) -> str | None:
    """Why a listed file cannot be a sample before it is even opened: a FIFO or a device
    (opening it would block or read forever), or a name that is not UTF-8 (no store's id
    column, report or terminal can hold it)."""
    if printable(rel) != rel:
        return "file name is not valid UTF-8"
    return None if info.get("type") == "file" else _not_regular(fs, path)


def list_source(url: str, storage_options: dict[str, Any] | None = None
                ) -> tuple[fsspec.AbstractFileSystem, Listing]:
    """All sample files under ``url``, sorted by id. Fails on an empty or mixed folder."""
    fs, root = open_fs(url, storage_options)  # checked there; a SAS token moved into the options
    deadline = call_timeout(storage_options)
    try:
        # info, not isdir: isdir calls any error "not a folder", an HTTP 500 included
        try:
            kind = call(fs, "info", root, deadline=deadline).get("type")
        except FileNotFoundError as exc:
            if isinstance(exc, TrainfeedError):  # the bucket / container itself is missing: it says so
                raise
            raise TrainfeedError(f"{url}: source folder does not exist") from None
        if kind != "directory":
            raise TrainfeedError(f"{url}: source is not a folder (a {kind or 'file'}); give the folder that holds "
                                 "the sample files")
        # No time limit on the walk itself: a large folder takes long to list. Each of its
        # requests is bounded by the storage client's own retries.
        entries = fs.find(root, detail=True)
    except TrainfeedError:
        raise
    except FSTimeoutError as exc:
        raise TrainfeedError(no_answer(url, deadline)) from exc
    except Exception as exc:  # remote stores raise their own types
        raise TrainfeedError(f"{url}: cannot list source folder: {exc}") from exc
    root = root.rstrip("/")
    by_kind: dict[str, list[SourceFile]] = {}
    ignored: list[str] = []
    seen: dict[str, str] = {}
    for path, info in sorted(entries.items()):
        rel = posixpath.relpath(path, root) if root else path
        if any(part.startswith(".") for part in rel.split("/")):
            continue  # hidden files and folders (.DS_Store, .ipynb_checkpoints)
        shown = printable(rel)
        stem, ext = posixpath.splitext(shown)
        kind = _EXTENSIONS.get(ext.lower())
        if kind is None:
            ignored.append(shown)
            continue
        if stem in seen:
            raise TrainfeedError(f"{url}: files {seen[stem]!r} and {shown!r} map to the same sample id {stem!r}")
        seen[stem] = shown
        problem = _listing_problem(fs, path, rel, info)
        identity = None if is_local(fs) else Identity.of(info)
        by_kind.setdefault(kind, []).append(SourceFile(stem, path, int(info.get("size") or 0), problem, deadline,
                                                       identity))
    if not by_kind:
        hint = f" ({len(ignored)} other files ignored)" if ignored else ""
        raise TrainfeedError(f"{url}: no .npy, .npz, .jpg, .jpeg or .png files found{hint}")
    if len(by_kind) > 1:
        counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(by_kind.items()))
        raise TrainfeedError(f"{url}: source mixes sample kinds ({counts}); convert one kind per store")
    (kind, files), = by_kind.items()
    return fs, Listing(kind, sorted(files, key=lambda f: f.id), ignored)


def check_listed(src: SourceFile) -> None:
    """Raise the problem the listing found with ``src``, if any."""
    if src.problem:
        raise SampleError(printable(src.path), src.problem)


def read_bytes(fs: fsspec.AbstractFileSystem, src: SourceFile, start: int = 0, end: int | None = None) -> bytes:
    """Bytes ``start:end`` of a file, never past the size its listing gave: a file that grows
    cannot exhaust memory. On a remote store, a failure of the store itself (no answer, an
    error that is not about this file) ends the whole run: it is no reason to drop a sample."""
    check_listed(src)
    if src.size or is_local(fs):  # a remote listing may not know a size (0)
        end = src.size if end is None else min(end, src.size)
    try:
        data: bytes = call(fs, "cat_file", src.path, start=start, end=end, deadline=src.deadline)
    except FileNotFoundError as exc:
        raise SampleError(src.path, "cannot read: file not found (broken link or deleted)") from exc
    except IsADirectoryError as exc:
        raise SampleError(src.path, "cannot read: is a directory") from exc
    except PermissionError as exc:
        raise SampleError(src.path, "cannot read: permission denied") from exc
    except FSTimeoutError as exc:
        raise TrainfeedError(no_answer(fs.unstrip_protocol(src.path), src.deadline)) from exc
    except Exception as exc:
        if not is_local(fs):
            raise TrainfeedError(f"{fs.unstrip_protocol(src.path)}: cannot read from the storage: {exc}") from exc
        if isinstance(exc, OSError):
            raise SampleError(src.path, f"cannot read: {exc.strerror or exc}") from exc
        raise
    if start == 0 and len(data) == 0:
        raise SampleError(src.path, "empty file (0 bytes)")
    return data
