"""What the rest of trainfeed may call on a store format, in one place and typed: ``Format``.

Every format registers one object satisfying it (registry.py), so that a type checker checks
each format against this list, and the conversion, ``--verify``, identification, the readers
and the benchmark ask the format object (its attributes, its methods) instead of comparing its
name. A format implements it by subclassing it (a small class in its module, wrapping the
module's functions): mypy then refuses a format that lacks a member or gives one another
signature. Members with a body here are defaults a format may keep.

``PieceReader`` is the part the read engine calls on each piece: a format, or the reader of a
table another tool wrote (foreign_table.py), which is not a registered format.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Mapping, Protocol, Union, runtime_checkable

import numpy as np

from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats.options import Columns, OpenOptions, Pieces, WriteOptions, WriteResult
from trainfeed.converters.layout import DatasetSchema
from trainfeed.converters.sources.decode import Sample
from trainfeed.converters.storage.location import Location

#: Where a store is: a local path, a URL (abfs://, s3://, ...) or a Location.
Where = Union[str, "os.PathLike[str]", Location]
#: ``np.empty``'s form, ``empty(shape, dtype)``: where a reader wants a piece's tensors read into.
Empty = Callable[..., np.ndarray]
#: One sample with all its fields: (id, label or None, {field: value}).
Row = tuple[str, Union[int, None], dict[str, Any]]


@runtime_checkable
class PieceReader(Protocol):
    """The read engine's calls on a piece (a unit of reading: a row group, an HDF5 chunk slice,
    a file), once ``list_pieces`` has listed them: the engine plans an epoch from row counts
    alone, then reads pieces in any order, from several threads."""

    #: What a piece is called, plural ("row groups"): messages about sharding name it.
    UNIT: str

    def read_piece(self, listing: Pieces, piece: Any, handles: dict[Any, Any], empty: Empty = np.empty) -> Columns:
        """One piece's ids, labels and tensor field. ``handles``: open files kept by the caller
        (one dict per reading thread, so a file is opened once per thread); ``empty``: where
        raw tensors are read into, for a format that can read into the caller's memory."""
        ...

    def piece_file(self, piece: Any) -> str:
        """The data file a piece is in: what a read error names, and what a store's
        declared per-file counts are checked against."""
        ...

    def read_labels(self, listing: Pieces) -> Iterator[np.ndarray]:
        """The label column of each data file (int64, -1 where unlabeled), reading nothing
        else: label bounds and a store's fingerprint need only these."""
        ...


@runtime_checkable
class Format(PieceReader, Protocol):
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
    #: vacuumed, read at a version (``--delta-version``), committed in place on object storage.
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
    def list_pieces(self, path: Where, options: OpenOptions) -> Pieces:
        """The store's pieces in a stable order, with the rows each holds, checked against
        what the store declares: enough to plan an epoch without reading any data."""
        ...

    def piece_span(self, listing: Pieces, piece: Any) -> tuple[str, int, int] | None:
        """(object, start, end): the bytes a piece's read fetches on object storage, for a
        format that ``fetches_ahead``; None otherwise."""
        return None
