"""HDF5 store: one file (DST ends in .h5 / .hdf5) or a folder of ``shard-NNNNN.h5`` files of
about the target size plus ``_trainfeed.json``.

Each file holds ``/id`` (UTF-8 strings), ``/label`` (int64; absent when unlabeled) and one
dataset per tensor field shaped ``(n, *shape)`` in its own dtype, chunked along the sample
axis; encoded images are variable-length uint8. The root attributes ``trainfeed`` (the
dataset schema as JSON) and ``writer`` mark a file as written by trainfeed. The write side is
hdf5_writer.py; this module is the read side, and ``HDF5`` the registry's hdf5 format (its
``write`` is hdf5_writer's).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.hdf5_writer import FORMAT, SUFFIXES, is_single_file, write
from trainfeed.converters.formats.interface import (
    Columns,
    Empty,
    Format,
    OpenFiles,
    Pieces,
    Row,
    Where,
    check_declared_rows,
    pick_field,
)
from trainfeed.converters.formats.manifest import read_manifest
from trainfeed.converters.formats.options import OpenOptions, WriteOptions, WriteResult
from trainfeed.converters.layout import (
    DATASET_META,
    ID,
    LABEL,
    MANIFEST,
    DatasetSchema,
    FieldSpec,
    checked_schema,
    ragged_values,
)
from trainfeed.converters.sources.decode import Sample
from trainfeed.converters.storage.fetch import Blocks, Fetcher, RangeFile, open_fetcher
from trainfeed.converters.storage.location import Location, as_location
from trainfeed.converters.storage.pins import Pin, open_pinned, pin_files

UNIT = "chunk slices"
COMPRESSIONS = ("none", "lzf", "gzip")
DEFAULT_COMPRESSION = "none"
COMPRESSION_LEVELS = {"gzip": (0, 9)}  # HDF5's gzip filter
#: Fewest samples one piece (a run of whole chunks) holds.
MIN_PIECE_ROWS = 64
#: A piece: (data file, first row, end row), a run of whole chunks.
Slice = tuple[str, int, int]


def is_store(path: Where) -> bool:
    """An HDF5 file, or a folder whose manifest says hdf5 (what a reader should open as HDF5)."""
    loc = as_location(path)
    if loc.local and Path(loc.path).is_file():
        return bool(h5py.is_hdf5(loc.path))
    if not loc.local and is_single_file(loc.path):
        return loc.is_file()
    try:
        read_manifest(loc, FORMAT)
    except ValueError:
        return False
    return True


def written_by_trainfeed(file: Where) -> bool:
    """Whether an HDF5 file (a local path or a Location) carries trainfeed's root attributes (a
    file it cannot open does not)."""
    try:
        h5 = Opener.at(file).open(file.path)[0] if isinstance(file, Location) else h5py.File(file, "r")
        with h5:
            writer = h5.attrs.get("writer")
            marked = DATASET_META in h5.attrs
    except (OSError, ValueError):
        return False
    writer = writer.decode(errors="replace") if isinstance(writer, bytes) else writer
    return marked and isinstance(writer, str) and writer.startswith("trainfeed ")


class Opener:
    """Opens a store's HDF5 files: local paths as they are, objects on storage as a RangeFile
    (h5py reads through it: metadata in blocks, a piece's slice prefetched in one fetch)."""

    def __init__(self, fetcher: Fetcher | None = None, sizes: dict[str, int] | None = None) -> None:
        self.fetcher, self.sizes = fetcher, sizes or {}
        self.pins: dict[str, Pin] = {}  # local files as the store's listing found them
        self._blocks: dict[str, Blocks] = {}  # per object, shared by its handles (one per reading thread)

    @classmethod
    def at(cls, loc: Location, options: OpenOptions = OpenOptions()) -> Opener:
        if loc.local:
            return cls()
        objects = {loc.path: loc.identity()} if loc.is_file() else loc.objects()
        return cls(open_fetcher(loc, options.io_concurrency, options.cache_dir, options.cache_limit, objects),
                   {f: o.size for f, o in objects.items()})

    def open(self, f: str) -> tuple[h5py.File, RangeFile | None]:
        if self.fetcher is None:
            return open_pinned(f, self.pins.get(f), lambda: h5py.File(f, "r")), None
        if f not in self.sizes:
            raise TrainfeedError(f"{f}: listed by the store but not found on the storage: the store is incomplete "
                                 "or was changed while being opened")
        blocks = self._blocks.setdefault(f, Blocks(self.fetcher, f, self.sizes[f]))
        file = RangeFile(self.fetcher, f, self.sizes[f], blocks)
        return h5py.File(file, "r"), file


@dataclass(frozen=True, kw_only=True)
class SlicePieces(Pieces[Slice]):
    """The chunk slices of a store's HDF5 files, how its files are opened, and on object
    storage each slice's tensor bytes (what a reader fetches ahead)."""

    opener: Opener
    spans: dict[Slice, tuple[int, int]]


class _Handle:
    """An HDF5 file a reading thread keeps open, and on object storage the RangeFile under it."""

    def __init__(self, opened: tuple[h5py.File, RangeFile | None]) -> None:
        self.h5, self.remote = opened


def _single(loc: Location) -> bool:
    return Path(loc.path).is_file() if loc.local else loc.is_file()


def data_files(path: Where) -> list[str]:
    loc = as_location(path)
    if _single(loc):
        return [loc.path]
    return [loc.file(s["file"]) for s in read_manifest(loc, FORMAT)["parts"]]


def read_schema(path: Where, opener: Opener | None = None) -> DatasetSchema:
    """The dataset schema: the single file's root attribute, or the shards' manifest."""
    loc = as_location(path)
    if not _single(loc):
        return DatasetSchema.from_dict(read_manifest(loc, FORMAT)["schema"])
    try:
        h5, _ = (opener or Opener.at(loc)).open(loc.path)
        with h5:
            text = h5.attrs.get(DATASET_META)
    except OSError as exc:
        raise ValueError(f"{loc.shown}: cannot open as HDF5: {exc}") from exc
    if text is None:
        raise ValueError(f"{loc.shown}: no {DATASET_META!r} root attribute: not an HDF5 store written by trainfeed")
    try:
        return checked_schema(json.loads(text), f"{loc.shown} (root attribute {DATASET_META!r})")
    except json.JSONDecodeError as exc:
        raise ValueError(f"{loc.shown}: root attribute {DATASET_META!r} is not valid JSON ({exc})") from exc


def read_samples(path: Where, storage_options: dict[str, Any] | None = None) -> Iterator[Row]:
    """Every sample with all its fields, in write order (what ``--verify`` compares): the
    pieces training reads (slices of whole chunks, plain h5py)."""
    listing = list_pieces(as_location(path, storage_options), OpenOptions())
    schema, opener = listing.schema, listing.opener
    handles: dict[str, h5py.File] = {}
    for f, start, stop in listing.pieces:
        h5 = handles.get(f) or handles.setdefault(f, opener.open(f)[0])
        ids = [x.decode() if isinstance(x, bytes) else x for x in h5[ID][start:stop]]
        labels = h5[LABEL][start:stop].tolist() if schema.labeled else [None] * len(ids)
        cols = {spec.name: _field_slice(h5, spec, start, stop) for spec in schema.fields}
        for i, sid in enumerate(ids):
            yield sid, labels[i], {spec.name: (cols[spec.name][i] if spec.is_raw else cols[spec.name][i].tobytes())
                                   for spec in schema.fields}
    for h5 in handles.values():
        h5.close()


# ------------------------------------------------------------------ read side

def _field_slice(h5: Any, spec: FieldSpec, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a field as h5py reads them; a ragged field's samples each in its shape."""
    if spec.is_ragged:
        return ragged_values(list(h5[spec.name][start:stop]), [s.tolist() for s in h5[spec.shape_column][start:stop]],
                             spec.dtype)
    values: np.ndarray = h5[spec.name][start:stop]
    return values


def list_pieces(path: Where, options: OpenOptions) -> SlicePieces:
    """Chunk-aligned slices of every file (whole chunks, >= MIN_PIECE_ROWS samples each),
    checked: datasets of equal length, the schema's shapes, the manifest's counts."""
    loc = as_location(path, options.storage_options)
    opener = Opener.at(loc, options)
    schema = read_schema(loc, opener)
    spec = pick_field(schema, options.field, loc.shown)
    files = data_files(loc)
    if loc.local:
        opener.pins = pin_files(files)
    pieces: list[Slice] = []
    rows: list[int] = []
    spans: dict[Slice, tuple[int, int]] = {}  # on object storage: a piece's tensor bytes
    for f in files:
        h5, remote = opener.open(f)
        with h5:
            n = _rows_in(h5, f, schema)
            ds = h5[spec.name]
            chunk = ds.chunks[0] if ds.chunks else MIN_PIECE_ROWS
            step = max(chunk, (max(MIN_PIECE_ROWS, chunk) // chunk) * chunk)
            for start in range(0, n, step):
                piece = (f, start, min(n, start + step))
                pieces.append(piece)
                rows.append(piece[2] - start)
                if remote is not None and spec.is_raw and not spec.is_ragged:  # vlen rows live on the heap
                    lo, hi = _slice_span(ds, start, piece[2])
                    if hi > lo:
                        spans[piece] = (max(0, lo), min(remote.size, hi))
    listing = SlicePieces(schema=schema, spec=spec, pieces=pieces, rows=rows, files=files, sizes=opener.sizes,
                          fetcher=opener.fetcher, opener=opener, spans=spans)
    declared = {} if _single(loc) else \
        {loc.file(s["file"]): s.get("rows") for s in read_manifest(loc, FORMAT)["parts"]}
    check_declared_rows(loc.shown, listing, declared, piece_file)
    return listing


def _rows_in(h5: Any, path: str, schema: DatasetSchema) -> int:
    """Samples in one HDF5 file: every dataset (id, label, each field) must hold the same number."""
    names = [ID, *([LABEL] if schema.labeled else []), *schema.field_names,
             *(f.shape_column for f in schema.fields if f.is_ragged)]
    missing = [n for n in names if n not in h5]
    if missing:
        raise TrainfeedError(f"{path}: no dataset {missing[0]!r} in this file: not a complete trainfeed HDF5 store")
    lengths = {n: h5[n].shape[0] if h5[n].shape else 0 for n in names}
    if len(set(lengths.values())) > 1:
        sizes = ", ".join(f"{n} {count}" for n, count in lengths.items())
        raise TrainfeedError(f"{path}: datasets hold different numbers of samples ({sizes}): the file is damaged "
                             "or was modified; convert it again")
    for spec in schema.fields:
        ds = h5[spec.name]
        if spec.is_raw and spec.shape is not None and (ds.shape[1:] != tuple(spec.shape) or ds.dtype != spec.dtype):
            raise TrainfeedError(f"{path}: dataset {spec.name!r} holds {ds.dtype} samples of shape {ds.shape[1:]}, "
                                 f"the store's schema says {spec.dtype} {tuple(spec.shape)}: the file is damaged or "
                                 "was modified; convert it again")
    return lengths[ID]


def piece_file(piece: Slice) -> str:
    return piece[0]


def piece_span(listing: SlicePieces, piece: Slice) -> tuple[str, int, int] | None:
    """(object, start, end) of a remote piece's tensor slice, the span ``read_piece`` prefetches:
    what a reader asks the fetcher for ahead of decoding it. Ids and labels are small and read
    through the file's block cache."""
    span = listing.spans.get(piece)
    return None if span is None else (piece[0], *span)


def read_piece(listing: SlicePieces, piece: Slice, handles: OpenFiles, empty: Empty = np.empty) -> Columns:
    """One contiguous slice of each dataset. ``handles``: open files kept by the caller (one
    per reading thread). ``empty(shape, dtype)``: where a raw tensor slice is read into."""
    f, start, stop = piece
    handle = handles.get(f, _Handle, lambda: _Handle(listing.opener.open(f)))
    h5, remote = handle.h5, handle.remote
    ds = h5[listing.spec.name]
    span = piece_span(listing, piece)
    if remote is not None and span is not None:
        remote.prefetch(*span[1:])  # the span the reader requested ahead
    ids = [x.decode() if isinstance(x, bytes) else x for x in h5[ID][start:stop]]
    y = h5[LABEL][start:stop].astype(np.int64, copy=False) if listing.schema.labeled \
        else np.full(stop - start, -1, np.int64)
    if not listing.spec.is_raw or listing.spec.is_ragged:
        return Columns(ids, y, _field_slice(h5, listing.spec, start, stop))
    stop = min(stop, ds.shape[0])  # a file cut short reads short, as a slice would (readers check the count)
    x = empty((max(0, stop - start), *ds.shape[1:]), ds.dtype)
    if len(x):
        ds.read_direct(x, np.s_[start:stop])
    return Columns(ids, y, x)


def _slice_span(ds: h5py.Dataset, start: int, stop: int) -> tuple[int, int]:
    """The bytes of ``ds[start:stop]`` in its file (from its first to its last chunk: trainfeed
    writes chunks in order); (0, 0) when unknown, and the slice is then read block by block."""
    stop = min(stop, ds.shape[0])
    if stop <= start:
        return (0, 0)
    if ds.chunks is None:
        offset = ds.id.get_offset()
        row = ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))
        return (offset + start * row, offset + stop * row) if offset is not None else (0, 0)
    rest = (0,) * (len(ds.shape) - 1)
    c = ds.chunks[0]
    first = ds.id.get_chunk_info_by_coord((start // c * c, *rest))
    last = ds.id.get_chunk_info_by_coord(((stop - 1) // c * c, *rest))
    if first.byte_offset is None or last.byte_offset is None:
        return (0, 0)
    lo, hi = min(first.byte_offset, last.byte_offset), max(first.byte_offset + first.size, last.byte_offset + last.size)
    return (lo, hi) if hi - lo <= 4 * (stop - start) * ds.dtype.itemsize * int(np.prod(ds.shape[1:])) + (1 << 20) \
        else (0, 0)


def read_labels(listing: SlicePieces) -> Iterator[np.ndarray]:
    for f in listing.files:
        h5, _ = listing.opener.open(f)
        with h5:
            yield h5[LABEL][:].astype(np.int64) if listing.schema.labeled else np.full(h5[ID].shape[0], -1, np.int64)


# ------------------------------------------------------------------ the registry's format

def _written_by_trainfeed(path: Where) -> bool:
    """A single file: its root attributes; a folder of shards: its manifest."""
    loc = as_location(path)
    if loc.local and Path(loc.path).is_dir():
        return is_store(loc)
    return written_by_trainfeed(path)


def _write(path: Where, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
           on_part: Callable[[str], None] | None = None) -> WriteResult:
    assert not isinstance(path, Location), "HDF5 is written to a local folder (uploaded from there)"
    return write(path, schema, batches, opts, on_part)


class Hdf5(Format[Slice, SlicePieces]):
    """HDF5 stores, one file or a folder of shards (formats/interface.py says what each member is for)."""

    name, label, noun, foreign_noun = FORMAT, "HDF5", "an HDF5 store", "an HDF5 file"
    writable, single_file, fetches_ahead = True, True, True
    UNIT = UNIT
    COMPRESSIONS, DEFAULT_COMPRESSION, COMPRESSION_LEVELS = COMPRESSIONS, DEFAULT_COMPRESSION, COMPRESSION_LEVELS
    suffixes, commit_record = SUFFIXES, MANIFEST
    part_names = r"shard-\d{5}\.h5"
    run_part_names = r"shard-\d{5}-[0-9a-f]{8}\.h5"  # as publish.py tags a shard with its run

    is_store = staticmethod(is_store)
    written_by_trainfeed = staticmethod(_written_by_trainfeed)
    write = staticmethod(_write)
    read_schema = staticmethod(read_schema)
    read_samples = staticmethod(read_samples)
    data_files = staticmethod(data_files)
    list_pieces = staticmethod(list_pieces)
    read_piece = staticmethod(read_piece)
    piece_file = staticmethod(piece_file)
    piece_span = staticmethod(piece_span)
    read_labels = staticmethod(read_labels)


HDF5 = Hdf5()
