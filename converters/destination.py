"""The destination of a conversion: DST as one real path, apart from SRC, holding nothing trainfeed
must not replace, its parent folder created, and its filesystem's errors named by DST."""
from __future__ import annotations

import os
from pathlib import Path, PurePath, PurePosixPath

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.interface import Where
from trainfeed.converters.formats.registry import identify
from trainfeed.converters.storage.config import BucketNotFound, bucket_not_found
from trainfeed.converters.storage.location import Location, as_location, is_remote, locate
from trainfeed.converters.storage.native import NativeFileSystem


def destination_path(dst: str) -> Path:
    """DST as a real absolute path (``file://`` dropped, symlinks and ``..`` resolved): one store,
    one lock, whatever name it is reached by."""
    return Path(os.path.realpath(dst.removeprefix("file://")))


def check_apart(src: str, dst: str | os.PathLike[str] | Location) -> None:
    """Usage error if SRC and DST (a local path or a Location) overlap: writing the store would
    replace or alter the files it is made from. Locations on object storage overlap when they
    are on the same storage and one path holds the other."""
    if isinstance(dst, Location) and not dst.local:
        if not is_remote(src):
            return
        source = locate(src, dst.storage_options)
        if type(source.fs) is not type(dst.fs):
            return
        _check_apart(PurePosixPath("/" + source.path), PurePosixPath("/" + dst.path), dst.shown, source.shown)
        return
    if is_remote(src):
        return
    dst = Path(dst.path if isinstance(dst, Location) else dst)
    source_path = Path(os.path.realpath(src.removeprefix("file://")))
    _check_apart(source_path, dst, str(dst), str(source_path))


def _check_apart(source: PurePath, dst: PurePath, dst_shown: str, source_shown: str) -> None:
    if source == dst:
        raise UsageError(f"{dst_shown}: is the source folder itself; write the store somewhere else")
    if source in dst.parents:
        raise UsageError(f"{dst_shown}: is inside the source folder {source_shown}; write the store outside it")
    if dst in source.parents:
        raise UsageError(f"{dst_shown}: holds the source folder {source_shown}, which writing here would replace; "
                         "write the store somewhere else")


def check_destination(path: Where, mode: str) -> str | None:
    """Refuse to touch what must not be touched: only a store trainfeed wrote (or an empty
    folder) is replaced, only a Delta table trainfeed wrote (or nothing) is appended to.
    ``path``: a local path or a Location. Returns the format of the trainfeed store there, if any."""
    found = identify(path)
    loc = as_location(path)
    dst = loc.shown
    if found is None and isinstance(loc.fs, NativeFileSystem):
        try:  # a missing bucket / container: said now, before any work
            loc.fs.info(loc.path.split("/", 1)[0])
        except BucketNotFound:
            raise BucketNotFound(bucket_not_found(dst)) from None
    if found is None or found.leftovers:
        return None  # append to nothing creates the table; a killed run's leftovers are replaced
    if mode == "append":
        if found.format is None or not found.format.versioned:
            raise TrainfeedError(f"{dst}: --mode append adds to a Delta table written by trainfeed; found {found.what}")
        return found.fmt
    if mode == "create":
        if not found.replaceable:
            raise TrainfeedError(f"{dst}: destination already exists ({found.what}); leaving it untouched")
        extra = " or --mode append" if found.format is not None and found.format.versioned else ""
        raise TrainfeedError(f"{dst}: destination already exists; pass --overwrite{extra} to replace it")
    if not found.replaceable:
        raise TrainfeedError(f"{dst}: {found.what}; refusing to replace it (--overwrite replaces only a store "
                             "written by trainfeed, or an empty folder)")
    return found.fmt


def make_parent(dst: Path) -> None:
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in reversed(dst.parents) if p.exists() and not p.is_dir()), None)
        if blocker is None:
            raise
        raise TrainfeedError(f"{dst}: cannot be created: {blocker} is a file, not a folder") from None


def write_error(dst: Path, exc: OSError) -> TrainfeedError:
    """A filesystem error while writing DST, named by DST (not by a hidden staging file) and
    its cause: "no space left on device", "read-only file system", ..."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return TrainfeedError(f"{dst}: cannot write: {reason[:1].lower()}{reason[1:]}")
