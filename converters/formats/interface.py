"""What the rest of trainfeed may call on a store format, in one place and typed: ``Format``.

Every format registers one object satisfying it (registry.py), so that a type checker checks
each format against this list, and the conversion, ``--verify``, identification, the readers
and the benchmark ask the format object (its attributes, its methods) instead of comparing its
name. A format is one object: a class in its module that subclasses ``Format`` (typed by its
piece and its listing) and binds the module's functions as its methods, so that mypy refuses a
format that lacks a member or gives one another signature. Members with a body here are
defaults a format may keep.

A format's read side lists a store's pieces (``Pieces``, generic in the piece type; each format
subclasses it with the typed state its reads need) and reads one into ``Columns``, keeping a
reading thread's files open in its ``OpenFiles``. ``PieceReader`` is the part the read engine
calls on each piece: a format, or the reader of a table another tool wrote (foreign_table.py),
which is not a registered format. ``VersionedFormat`` is what a format whose commits are
versions adds (appends, restores, compaction): what ``convert`` and the Spark repack ask for,
never a format's name.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, Union, runtime_checkable

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.options import OpenOptions, WriteOptions, WriteResult
from trainfeed.converters.layout import DatasetSchema, FieldSpec
from trainfeed.converters.sources.decode import Sample
from trainfeed.converters.storage.fetch import Fetcher
from trainfeed.converters.storage.location import Location
from trainfeed.converters.storage.pins import Pin

#: Where a store is: a local path, a URL (abfs://, s3://, ...) or a Location.
Where = Union[str, "os.PathLike[str]", Location]
#: ``np.empty``'s form, ``empty(shape, dtype)``: where a reader wants a piece's tensors read into.
Empty = Callable[..., np.ndarray]
#: One sample with all its fields: (id, label or None, {field: value}).
Row = tuple[str, int | None, dict[str, Any]]

PieceT = TypeVar("PieceT")
T = TypeVar("T")



@dataclass(frozen=True, kw_only=True)
class Pieces(Generic[PieceT]):
    """A store's units of reading (row groups, chunk slices, files) in a stable order, with
    the rows each holds: enough to plan an epoch without reading any data. A format whose reads
    need more (open files, fetch spans, labels) subclasses it with typed fields of its own."""

    schema: DatasetSchema
    spec: FieldSpec  # the tensor field read
    pieces: list[PieceT]
    rows: list[int]
    files: list[str]  # data files (blob: none)
    version: int | None = None  # the version read, for a versioned format
    #: On object storage: each data file's size in bytes (what a store's fingerprint names).
    sizes: Mapping[str, int] = field(default_factory=dict)
    #: On object storage, for a format that ``fetches_ahead``: where a reader requests the bytes
    #: of the pieces it will decode next (``Format.piece_span``).
    fetcher: Fetcher | None = None
    #: On local disk: each data file as it was when the store was opened (a reader opens only that).
    pins: dict[str, Pin] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return sum(self.rows)


@dataclass
class Columns:
    """One piece read: ids, labels (int64, -1 where unlabeled) and the tensor field, (n, *shape)
    (a ragged field: an object array of arrays, each in its own shape); once fitted to one shape,
    each sample's own (``shapes``, (n, ndim))."""

    ids: list[str]
    labels: np.ndarray
    x: np.ndarray
    shapes: np.ndarray | None = None


class OpenFiles:
    """The files one reading thread keeps open, by path, so that a file is opened once per
    thread (a format's ``read_piece`` takes the caller's; a fresh one reads apart from them)."""

    def __init__(self) -> None:
        self._files: dict[str, object] = {}

    def get(self, path: str, kind: type[T], opener: Callable[[], T]) -> T:
        """The open ``kind`` for ``path``, opened by ``opener()`` the first time."""
        found = self._files.get(path)
        if isinstance(found, kind):
            return found
        opened = opener()
        self._files[path] = opened
        return opened

    def values(self) -> Iterator[object]:
        return iter(self._files.values())


def pick_field(schema: DatasetSchema, name: str | None, path: object) -> FieldSpec:
    if not schema.fields:
        raise TrainfeedError(f"{path}: store has no tensor fields")
    if name is None:
        return schema.fields[0]
    try:
        return schema.field(name)
    except KeyError:
        raise TrainfeedError(f"{path}: store has no field {name!r} (fields: {', '.join(schema.field_names)})") from None


def check_declared_rows(path: object, listing: Pieces[PieceT], declared_per_file: dict[str, int | None],
                        piece_file: Callable[[PieceT], str]) -> None:
    """The rows the pieces hold must be what the store declares: per file (manifest) and in
    all (``schema.samples``). A mismatch means a damaged or hand-edited store: never train on it."""
    held: dict[str, int] = {}
    for piece, rows in zip(listing.pieces, listing.rows):
        held[piece_file(piece)] = held.get(piece_file(piece), 0) + rows
    for f, declared in declared_per_file.items():
        if declared is not None and declared != held.get(f, 0):
            raise TrainfeedError(f"{f}: the store's manifest declares {declared} samples in this file, "
                                 f"it holds {held.get(f, 0)}: the store is damaged or was modified; convert it again")
    total = sum(listing.rows)
    if listing.schema.samples is not None and listing.schema.samples != total:
        raise TrainfeedError(f"{path}: the store declares {listing.schema.samples} samples, its files hold "
                             f"{total}: the store is damaged or was modified; convert it again")


def labels_array(values: Any) -> np.ndarray:
    """A label column (numpy or Arrow's numpy form) -> int64, -1 where null."""
    arr = np.asarray(values)
    if arr.dtype == object:  # nulls in an unlabeled store
        return np.array([-1 if v is None else int(v) for v in arr], dtype=np.int64)
    labels: np.ndarray = np.nan_to_num(arr, nan=-1).astype(np.int64)
    return labels


ListingT = TypeVar("ListingT", bound=Pieces[Any])
PieceT_contra = TypeVar("PieceT_contra", contravariant=True)
ListingT_contra = TypeVar("ListingT_contra", bound=Pieces[Any], contravariant=True)


@runtime_checkable
class PieceReader(Protocol[PieceT_contra, ListingT_contra]):
    """The read engine's calls on a piece (a unit of reading: a row group, an HDF5 chunk slice,
    a file), once ``list_pieces`` has listed them: the engine plans an epoch from row counts
    alone, then reads pieces in any order, from several threads."""

    #: What a piece is called, plural ("row groups"): messages about sharding name it.
    UNIT: str

    def read_piece(self, listing: ListingT_contra, piece: PieceT_contra, handles: OpenFiles,
                   empty: Empty = np.empty) -> Columns:
        """One piece's ids, labels and tensor field. ``handles``: open files kept by the caller
        (one per reading thread, so a file is opened once per thread); ``empty``: where
        raw tensors are read into, for a format that can read into the caller's memory."""
        ...

    def piece_file(self, piece: PieceT_contra) -> str:
        """The data file a piece is in: what a read error names, and what a store's
        declared per-file counts are checked against."""
        ...

    def read_labels(self, listing: ListingT_contra) -> Iterator[np.ndarray]:
        """The label column of each data file (int64, -1 where unlabeled), reading nothing
        else: label bounds and a store's fingerprint need only these."""
        ...


@runtime_checkable
class Format(PieceReader[PieceT_contra, ListingT], Protocol[PieceT_contra, ListingT]):
    """A store format: its name, what it can do, what identifies it on storage, its write side
    (``convert``, ``--verify``) and its read side (training, the benchmark)."""

    # ------------------------------------------------------------------ what it is
    #: The registry key: ``convert --to``, ``train --format``, a store's recorded format.
    name: str
    #: How messages and reports name the format ("Delta Lake").
    label: str
    #: How messages name one store of it trainfeed wrote ("a Delta table").
    noun: str
    #: How messages name a file or folder of it trainfeed did not write ("a Delta table").
    foreign_noun: str = ""

    # ------------------------------------------------------------------ what it can do
    #: ``convert`` writes it (``--to``); the others are read only.
    writable: bool = False
    #: Its stores have versions committed by a log: appended to (``--mode append``), optimized,
    #: vacuumed, read at a version (``--delta-version``), committed in place on object storage;
    #: the format is then a ``VersionedFormat``.
    versioned: bool = False
    #: Not a store: a folder of source files read in place; what a path holding no store is read as.
    in_place: bool = False
    #: Its data files are Parquet: Petastorm reads them, and a table of it that another tool
    #: wrote is read by naming its columns (foreign_table.py).
    parquet_files: bool = False
    #: On object storage, ``piece_span`` names a piece's bytes, so that the reader requests
    #: them ahead of decoding it (else each reading thread waits on its own requests).
    fetches_ahead: bool = False

    # ------------------------------------------------------------------ what identifies it
    #: Suffixes of its data files (".parquet"): a folder of them without a commit record is
    #: what an interrupted conversion left.
    suffixes: tuple[str, ...] = ()
    #: A store of it may be one file (DST named with one of ``suffixes``).
    single_file: bool = False
    #: What, in a store's folder, commits the store (readers see only what it lists): the
    #: manifest (layout.MANIFEST, which names its format) or the format's own log
    #: ("_delta_log"); None for a format trainfeed never writes.
    commit_record: str | None = None
    #: Regular expression of the names its writer gives data files in a store's folder.
    part_names: str | None = None
    #: Regular expression of the names of the data files a conversion to object storage
    #: uploads before its commit record: a folder holding only these is what a killed run left.
    run_part_names: str | None = None

    def is_store(self, path: Where) -> bool:
        """Whether ``path`` holds a store of this format (trainfeed's or, for a format with a
        log, another writer's): what a reader should open it as."""
        ...

    def written_by_trainfeed(self, path: Where) -> bool:
        """Whether the store at ``path`` carries trainfeed's mark (only such a store is ever
        replaced or appended to). ValueError when the mark cannot be read."""
        ...

    # ------------------------------------------------------------------ write side
    COMPRESSIONS: tuple[str, ...] = ()
    DEFAULT_COMPRESSION: str = "none"
    #: (lowest, highest) ``--compression-level`` per codec; codecs not listed take no level.
    COMPRESSION_LEVELS: Mapping[str, tuple[int, int]] = {}

    def check_url(self, url: str) -> None:
        """UsageError for a destination URL this format's writer cannot use, said before any work."""
        return None

    def write(self, path: Where, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
              on_part: Callable[[str], None] | None = None) -> WriteResult:
        """Write a new store at ``path`` (a staging path: it is published afterwards).
        ``on_part(name)``: called as each data file is complete, so its upload can start."""
        raise UsageError(f"{self.label} ({self.name}) is read only")

    def read_schema(self, path: Where) -> DatasetSchema:
        """The dataset schema the store records (fields, labels, sample count, store id)."""
        raise UsageError(f"{self.label} ({self.name}) records no schema")

    def read_samples(self, path: Where, storage_options: dict[str, Any] | None = None) -> Iterator[Row]:
        """Every sample with all its fields, in write order: what ``--verify`` compares with
        the source."""
        raise UsageError(f"{self.label} ({self.name}) is read by pieces only")

    def data_files(self, path: Where) -> list[str]:
        """The store's live data files, in order (what a reader of the store reads)."""
        raise UsageError(f"{self.label} ({self.name}) has no data files of its own")

    # ------------------------------------------------------------------ read side
    def list_pieces(self, path: Where, options: OpenOptions) -> ListingT:
        """The store's pieces in a stable order, with the rows each holds, checked against
        what the store declares: enough to plan an epoch without reading any data."""
        ...

    def piece_span(self, listing: ListingT, piece: PieceT_contra) -> tuple[str, int, int] | None:
        """(object, start, end): the bytes a piece's read fetches on object storage, for a
        format that ``fetches_ahead``; None otherwise."""
        return None


@runtime_checkable
class VersionedFormat(Format[PieceT_contra, ListingT], Protocol[PieceT_contra, ListingT]):
    """A format whose stores are tables with versions committed by a log (``versioned``):
    ``convert`` appends to them, overwrites them in one commit and restores the version it
    started from when a check fails; compacts and vacuums them; the Spark repack commits the
    parts its executors wrote as a table's first version."""

    def version(self, path: Where) -> int:
        """The table's latest version. ValueError when its log cannot be read."""
        ...

    def read_schema(self, path: Where, version: int | None = None,
                    storage_options: dict[str, str] | None = None) -> DatasetSchema:
        """The dataset schema of the table's snapshot at ``version`` (the latest when None)."""
        ...

    def tensor_column(self, path: Where, storage_options: dict[str, str] | None = None) -> str:
        """'binary' or 'list': how the table stores tensors (an append must match it)."""
        ...

    def write(self, path: Where, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
              on_part: Callable[[str], None] | None = None, *, since_version: int | None = None,
              publishing: Callable[[], AbstractContextManager[Any]] = nullcontext) -> WriteResult:
        """``Format.write``, also to a table on object storage and (``opts.mode`` overwrite or
        append) to an existing table, in one commit made inside ``publishing()``;
        ``since_version``: the version the caller checked the table at (the commit is refused
        when another writer changed it since)."""
        ...

    def restore(self, path: Where, version: int) -> None:
        """Make ``version``'s snapshot the live one again (a new commit)."""
        ...

    def live_ids(self, path: Where, version: int | None = None) -> set[str]:
        """Every sample id in the table's snapshot at ``version`` (the latest when None)."""
        ...

    def optimize(self, path: Where, *, target_size: int, opts: WriteOptions,
                 storage_options: dict[str, str] | None = None) -> dict[str, Any]:
        """Compact small files into ~``target_size`` ones (a new version; data unchanged)."""
        ...

    def vacuum(self, path: Where, *, retention_hours: int, storage_options: dict[str, str] | None = None) -> list[str]:
        """Delete files no version younger than ``retention_hours`` references; the deleted files."""
        ...

    def table_result(self, path: Where) -> WriteResult:
        """The table's live files now, their bytes and its version."""
        ...

    def create_table(self, folder: Path, parts: list[str], schema: DatasetSchema, tensor_column: str) -> None:
        """Commit Parquet files another writer (Spark) put in ``folder`` (``parts``: their names)
        as version 0 of a new table."""
        ...

    def user_metadata(self, schema: DatasetSchema) -> str:
        """trainfeed's mark as the text of a commit's ``userMetadata``: what a commit made by
        another engine's writer (delta-spark) carries."""
        ...

    def marked_commit(self, commit: dict[str, Any]) -> bool:
        """Whether a commit (a history row) carries trainfeed's mark."""
        ...
