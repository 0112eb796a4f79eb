"""The format registry, detection of an existing store's format, and what is at a
destination path: trainfeed replaces only what carries its own marker.

Each format is one module registered in FORMATS. What the rest of trainfeed takes from it:

- ``name``, ``label`` (display name), ``writable``, ``UNIT`` (what a piece is called);
- writable formats: ``write(path, schema, batches, opts)`` (Parquet, HDF5: also
  ``on_part(name)``, called as each data file is complete), ``read_schema(path)``,
  ``read_samples(path)`` (what ``--verify`` compares), ``is_store(path)``, ``COMPRESSIONS``,
  ``DEFAULT_COMPRESSION``, ``COMPRESSION_LEVELS``;
- every format, the read side of training: ``list_pieces(path, ReadRequest) -> Pieces``,
  ``read_piece(pieces, piece, handles, empty=np.empty) -> Columns``, ``read_labels(pieces)``, ``piece_file(piece)``.

Adding a format: its module, one line here, and its round-trip test (tests/converters/formats/test_registry.py
checks the interface and round-trips every writable format).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import h5py

from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats import blob, delta, hdf5, parquet
from trainfeed.converters.layout import MANIFEST
from trainfeed.converters.storage.location import Location, as_location

#: Data files a conversion to object storage uploads before its commit record: Parquet and
#: HDF5 parts tagged with their run, Delta parts. A folder on object storage holding only
#: these is what a killed run left: trainfeed's to replace.
RUN_PART = re.compile(r"(part|shard)-\d{5}-[0-9a-f]{8}\.(parquet|h5)|part-\d{5}-[0-9a-f]{12}-c000\.parquet")

FORMATS: dict[str, ModuleType] = {m.name: m for m in (parquet, delta, hdf5, blob)}
#: The formats convert writes (``--to``).
WRITABLE: list[str] = [name for name, m in FORMATS.items() if m.writable]
_NAMES = {"parquet": "a Parquet store", "delta": "a Delta table", "hdf5": "an HDF5 store"}


def detect_format(path, storage_options: dict | None = None) -> str | None:
    """'delta', 'parquet' or 'hdf5' for a store at ``path`` (a local path, URL or Location: what
    a reader should open it as); None if it is not one. ``identify`` says whether trainfeed wrote it."""
    loc = as_location(path, storage_options)
    if loc.local and not Path(loc.path).exists():
        return None
    if delta.is_store(loc):
        return "delta"
    if hdf5.is_store(loc):
        return "hdf5"
    if parquet.is_store(loc):
        return "parquet"
    return None


@dataclass(frozen=True)
class Found:
    """What is at a path. ``fmt``: the format of a store trainfeed wrote, else None.
    ``replaceable``: whether ``--overwrite`` may replace it (a trainfeed store, an empty folder,
    the leftovers of a killed run)."""

    what: str
    fmt: str | None = None
    replaceable: bool = False
    leftovers: bool = False  # only what a killed run left (object storage): treated as nothing


def _owned(fmt: str) -> Found:
    return Found(f"{_NAMES[fmt]} written by trainfeed", fmt, True)


def identify(path) -> Found | None:
    """What is at ``path`` (a local path or a Location on object storage): None when nothing
    is. Never raises for what it finds: a corrupt marker makes the thing "not a trainfeed
    store" and says why."""
    loc = as_location(path)
    if not loc.local:
        return _identify_remote(loc)
    path = Path(loc.path)
    if not os.path.lexists(path):
        return None
    if path.is_symlink():
        return Found(f"a symbolic link to {os.readlink(path)}")
    if path.is_dir():
        return _identify_folder(loc, sum(1 for _ in path.iterdir()))
    if path.is_file():
        return _identify_file(path)
    return Found("a special file (not a regular file or folder) that is not a trainfeed store")


def _identify_file(path: Path) -> Found:
    if h5py.is_hdf5(path):
        return _owned("hdf5") if hdf5.written_by_trainfeed(path) else Found("an HDF5 file not written by trainfeed")
    return Found(f"a file of {path.stat().st_size:,} bytes that is not a trainfeed store")


def _identify_remote(loc: Location) -> Found | None:
    """``identify`` on object storage: an object, or a "folder" (the objects under a prefix)."""
    try:
        info = loc.fs.info(loc.path)
    except FileNotFoundError:
        return None
    if info.get("type") != "directory":
        if hdf5.written_by_trainfeed(loc):
            return _owned("hdf5")
        return Found(f"an object of {int(info.get('size') or 0):,} bytes that is not a trainfeed store")
    names = loc.names()
    if names and all(RUN_PART.fullmatch(n) for n in names):
        return Found(f"{len(names)} data files an interrupted trainfeed run left (no commit record)", replaceable=True,
                     leftovers=True)
    return _identify_folder(loc, len(names))


def _identify_folder(loc: Location, entries: int) -> Found:
    if entries == 0:
        return Found("an empty folder", replaceable=True)
    if delta.is_store(loc):
        try:
            return _owned("delta") if delta.written_by_trainfeed(loc) else Found("a Delta table not written by trainfeed")
        except ValueError as exc:
            return Found(f"a Delta table whose log cannot be read ({exc})")
    if loc.exists(MANIFEST):
        try:
            return _owned(parquet.read_manifest(loc, fmt=None)["format"])
        except ValueError as exc:
            return Found(f"a folder with an invalid trainfeed manifest ({exc})")
    return Found(f"a folder with {entries} {'entry' if entries == 1 else 'entries'} that is not a trainfeed store")


def check_compression(fmt: str, codec: str, level: int | None) -> None:
    """UsageError unless ``codec`` is available for ``fmt`` and takes ``level`` (the codecs
    and levels are the format module's)."""
    module = FORMATS[fmt]
    if codec not in module.COMPRESSIONS:
        raise UsageError(f"--compression {codec!r} is not available for {fmt} "
                         f"(choose from {', '.join(module.COMPRESSIONS)})")
    if level is None:
        return
    levels = module.COMPRESSION_LEVELS.get(codec)
    if levels is None:
        takes = ", ".join(f"{name} {lo}-{hi}" for name, (lo, hi) in module.COMPRESSION_LEVELS.items())
        raise UsageError(f"--compression-level: --compression {codec} takes no level (levels for {fmt}: {takes})")
    if not levels[0] <= level <= levels[1]:
        raise UsageError(f"--compression-level {level}: {codec} levels for {fmt} are {levels[0]} to {levels[1]}")
