"""The format registry, detection of an existing store's format, and what is at a
destination path: trainfeed replaces only what carries its own marker.

Each format is one object registered in FORMATS, satisfying ``interface.Format`` (what the rest
of trainfeed may call on a format, typed). Detection, identification and the names of data
files are derived from what each format declares (its commit record, its part names, its
suffixes), never from its name.

Adding a format: its module (with its ``Format`` object), its entry in ``BUILT_IN`` (or
``register_format(fmt)`` at run time), and its round-trip test (tests/converters/formats/
test_registry.py checks the interface and round-trips every writable format). What a format can
do is asked of it (``versioned``: a ``VersionedFormat``, see ``versioned_format``), never of its name.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats.blob import BLOB
from trainfeed.converters.formats.delta import DELTA
from trainfeed.converters.formats.hdf5 import HDF5
from trainfeed.converters.formats.interface import Format, VersionedFormat, Where
from trainfeed.converters.formats.manifest import read_manifest
from trainfeed.converters.formats.parquet import PARQUET
from trainfeed.converters.layout import MANIFEST
from trainfeed.converters.storage.location import Location, as_location

#: A registered format, whatever its pieces and listing.
AnyFormat = Format[Any, Any]

BUILT_IN: tuple[AnyFormat, ...] = (PARQUET, DELTA, HDF5, BLOB)
#: Every registered format by name (the one registry: ``register_format`` adds to it).
FORMATS: dict[str, AnyFormat] = {f.name: f for f in BUILT_IN}
#: The formats convert writes (``--to``; kept up to date in place by ``_derive``).
WRITABLE: list[str] = []
#: What a path holding no store is read as (the small files, in place).
IN_PLACE: str = next(name for name, f in FORMATS.items() if f.in_place)


def _logged() -> list[AnyFormat]:
    """Formats committed by a log of their own (Delta's ``_delta_log/``)."""
    return [f for f in FORMATS.values() if f.commit_record not in (None, MANIFEST)]


def _detection() -> list[AnyFormat]:
    """The formats in the order detection tries them: those with a log first, as a table's
    folder may hold anything else, then those committed by the manifest (or nothing)."""
    logged = _logged()
    return logged + [f for f in FORMATS.values() if f not in logged]


def _manifested() -> tuple[str, ...]:
    """The formats a manifest may name."""
    return tuple(name for name, f in FORMATS.items() if f.commit_record == MANIFEST)


def _names_pattern(patterns: Iterable[str | None]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in dict.fromkeys(p for p in patterns if p)))


def _derive() -> None:
    """The names derived from the formats' declarations: at import, and again whenever the
    registry changes (read them as ``registry.PART``, not copied at import)."""
    global COMMIT_RECORDS, RUN_PART, PART, DATA_SUFFIXES, TABLE_SUFFIXES
    WRITABLE[:] = [name for name, f in FORMATS.items() if f.writable]
    #: What commits a folder store: the manifest, a log.
    COMMIT_RECORDS = frozenset(f.commit_record for f in FORMATS.values() if f.commit_record)
    #: Data files a conversion to object storage uploads before its commit record: Parquet and
    #: HDF5 parts tagged with their run, Delta parts. A folder on object storage holding only
    #: these is what a killed run left: trainfeed's to replace.
    RUN_PART = _names_pattern(f.run_part_names for f in FORMATS.values())
    #: The data files trainfeed writes into folder stores: with or without a run tag.
    PART = _names_pattern(p for f in FORMATS.values() for p in (f.part_names, f.run_part_names))
    #: Suffixes of every format's data files; of those a table another tool wrote may have (Parquet).
    DATA_SUFFIXES = tuple(dict.fromkeys(s for f in FORMATS.values() for s in f.suffixes))
    TABLE_SUFFIXES = tuple(dict.fromkeys(s for f in FORMATS.values() if f.parquet_files for s in f.suffixes))


COMMIT_RECORDS: frozenset[str]
RUN_PART: re.Pattern[str]
PART: re.Pattern[str]
DATA_SUFFIXES: tuple[str, ...]
TABLE_SUFFIXES: tuple[str, ...]
_derive()


def register_format(fmt: AnyFormat) -> None:
    """Add a format to the registry: detection, ``open_store``, ``convert --to`` (when writable)
    and identification then know it. UsageError when its name is taken, when it is not a
    ``Format``, or when it says it is ``versioned`` without being a ``VersionedFormat``."""
    if not isinstance(fmt, Format):
        raise UsageError(f"{fmt!r} is not a Format (formats/interface.py says what one offers)")
    if fmt.name in FORMATS:
        raise UsageError(f"a format named {fmt.name!r} is already registered")
    if fmt.versioned and not isinstance(fmt, VersionedFormat):
        raise UsageError(f"format {fmt.name!r} says it is versioned but is not a VersionedFormat")
    FORMATS[fmt.name] = fmt
    _derive()


def unregister_format(name: str) -> None:
    """Remove a format ``register_format`` added (the built-in ones stay)."""
    if any(f.name == name for f in BUILT_IN):
        raise UsageError(f"{name!r} is a built-in format")
    del FORMATS[name]
    _derive()


@contextmanager
def registered(fmt: AnyFormat) -> Iterator[AnyFormat]:
    """``fmt`` registered for the block (a test's toy format), unregistered after it."""
    register_format(fmt)
    try:
        yield fmt
    finally:
        unregister_format(fmt.name)


def versioned_format(name: str) -> VersionedFormat[Any, Any] | None:
    """The format ``name`` as a ``VersionedFormat`` (appends, restores, compaction), or None for
    a format without versions."""
    fmt = FORMATS[name]
    return fmt if fmt.versioned and isinstance(fmt, VersionedFormat) else None


def logged_table_format() -> VersionedFormat[Any, Any]:
    """The versioned format whose files are Parquet (Delta): what the Spark repack writes through
    delta-spark on Databricks, whose commit mark a catalog table's history is checked for."""
    return next(v for v in map(versioned_format, table_formats(writable=True)) if v is not None)


def table_formats(writable: bool = False) -> list[str]:
    """The formats whose data files are Parquet (``writable``: those convert writes too): what
    the Spark repack writes, what a table another tool wrote is read as."""
    return [name for name, f in FORMATS.items() if f.parquet_files and (f.writable or not writable)]


def detect_format(path: Where, storage_options: dict[str, Any] | None = None) -> str | None:
    """The format of a store at ``path`` (a local path, URL or Location: what a reader should
    open it as); None if it is not one. ``identify`` says whether trainfeed wrote it."""
    loc = as_location(path, storage_options)
    if loc.local and not Path(loc.path).exists():
        return None
    return next((f.name for f in _detection() if f.is_store(loc)), None)


def detect_table(path: Where, storage_options: dict[str, Any] | None = None) -> str:
    """The format a table another tool wrote is read as: one with Parquet files and a log (Delta)
    when its log is there, else plain Parquet files."""
    loc = as_location(path, storage_options)
    tables, logs = [FORMATS[name] for name in table_formats()], _logged()
    found = next((f.name for f in tables if f in logs and f.is_store(loc)), None)
    return found or next(f.name for f in tables if f not in logs)


@dataclass(frozen=True)
class Found:
    """What is at a path. ``fmt``: the format of a store trainfeed wrote, else None.
    ``replaceable``: whether ``--overwrite`` may replace it (a trainfeed store, an empty folder,
    the leftovers of a killed run)."""

    what: str
    fmt: str | None = None
    replaceable: bool = False
    leftovers: bool = False  # only what a killed run left (object storage): treated as nothing

    @property
    def format(self) -> AnyFormat | None:
        """The format of the trainfeed store found, if it is one."""
        return FORMATS[self.fmt] if self.fmt is not None else None


def _owned(fmt: AnyFormat) -> Found:
    return Found(f"{fmt.noun} written by trainfeed", fmt.name, True)


def _foreign(fmt: AnyFormat) -> Found:
    return Found(f"{fmt.foreign_noun} not written by trainfeed")


def identify(path: Where) -> Found | None:
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
        return _identify_file(loc, path)
    return Found("a special file (not a regular file or folder) that is not a trainfeed store")


def _identify_file(loc: Location, path: Path) -> Found:
    for fmt in FORMATS.values():
        if fmt.single_file and fmt.is_store(loc):
            return _owned(fmt) if fmt.written_by_trainfeed(loc) else _foreign(fmt)
    return Found(f"a file of {path.stat().st_size:,} bytes that is not a trainfeed store")


def _identify_remote(loc: Location) -> Found | None:
    """``identify`` on object storage: an object, or a "folder" (the objects under a prefix)."""
    try:
        info = loc.fs.info(loc.path)
    except FileNotFoundError:
        return None
    if info.get("type") != "directory":
        owner = next((f for f in FORMATS.values() if f.single_file and f.written_by_trainfeed(loc)), None)
        if owner is not None:
            return _owned(owner)
        return Found(f"an object of {int(info.get('size') or 0):,} bytes that is not a trainfeed store")
    names = loc.names()
    if names and all(RUN_PART.fullmatch(n) for n in names):
        return Found(f"{len(names)} data files an interrupted trainfeed run left (no commit record)", replaceable=True,
                     leftovers=True)
    return _identify_folder(loc, len(names))


def _identify_folder(loc: Location, entries: int) -> Found:
    if entries == 0:
        return Found("an empty folder", replaceable=True)
    for fmt in _logged():
        if fmt.is_store(loc):
            try:
                return _owned(fmt) if fmt.written_by_trainfeed(loc) else _foreign(fmt)
            except ValueError as exc:
                return Found(f"{fmt.foreign_noun} whose log cannot be read ({exc})")
    if loc.exists(MANIFEST):
        try:
            return _owned(FORMATS[read_manifest(loc, _manifested())["format"]])
        except ValueError as exc:
            return Found(f"a folder with an invalid trainfeed manifest ({exc})")
    return Found(f"a folder with {entries} {'entry' if entries == 1 else 'entries'} that is not a trainfeed store")


def check_compression(fmt: str, codec: str, level: int | None) -> None:
    """UsageError unless ``codec`` is available for ``fmt`` and takes ``level`` (the codecs
    and levels are the format's)."""
    format_ = FORMATS[fmt]
    if codec not in format_.COMPRESSIONS:
        raise UsageError(f"--compression {codec!r} is not available for {fmt} "
                         f"(choose from {', '.join(format_.COMPRESSIONS)})")
    if level is None:
        return
    levels = format_.COMPRESSION_LEVELS.get(codec)
    if levels is None:
        takes = ", ".join(f"{name} {lo}-{hi}" for name, (lo, hi) in format_.COMPRESSION_LEVELS.items())
        raise UsageError(f"--compression-level: --compression {codec} takes no level (levels for {fmt}: {takes})")
    if not levels[0] <= level <= levels[1]:
        raise UsageError(f"--compression-level {level}: {codec} levels for {fmt} are {levels[0]} to {levels[1]}")
