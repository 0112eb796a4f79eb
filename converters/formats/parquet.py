"""Parquet store: a folder of ``part-NNNNN.parquet`` files of about the target size, each
split into row groups of about the row-group size, plus the ``_trainfeed.json`` manifest.

The manifest (manifest.py, shared with sharded HDF5 stores) is trainfeed's mark on a store:
readers validate it, and ``convert --overwrite`` replaces only folders that carry a valid one.
This is the read side (shared with Delta) and ``PARQUET``, the registry's parquet format; the
write side is parquet_writer.py."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeAlias, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.interface import (
    Columns,
    Empty,
    Format,
    OpenFiles,
    Pieces,
    Row,
    Where,
    check_declared_rows,
    labels_array,
    pick_field,
)
from trainfeed.converters.formats.manifest import read_manifest
from trainfeed.converters.formats.options import OpenOptions, WriteOptions, WriteResult
from trainfeed.converters.formats.parquet_writer import (
    COMPRESSION_LEVELS,
    COMPRESSIONS,
    DEFAULT_COMPRESSION,
    FORMAT,
    write,
)
from trainfeed.converters.layout import (
    ID,
    LABEL,
    MANIFEST,
    DatasetSchema,
    FieldSpec,
    from_record_batch,
    ragged_column,
)
from trainfeed.converters.sources.decode import Sample
from trainfeed.converters.storage.fetch import Fetcher, RangeFile, open_fetcher
from trainfeed.converters.storage.location import Location, as_location
from trainfeed.converters.storage.native import Identity
from trainfeed.converters.storage.pins import open_pinned, pin_files

UNIT = "row groups"
#: A piece: (data file, row group index).
RowGroup = tuple[str, int]
#: pyarrow's types (pyarrow ships no type information): what crosses this module's boundary.
ArrowTable: TypeAlias = pa.Table
Footer: TypeAlias = pq.FileMetaData


def is_store(path: Where) -> bool:
    try:
        read_manifest(path, FORMAT)
    except ValueError:
        return False
    return True


def data_files(path: Where) -> list[str]:
    """The store's part files in write order (the manifest lists exactly the committed parts)."""
    loc = as_location(path)
    return [loc.file(p["file"]) for p in read_manifest(loc, FORMAT)["parts"]]


def read_schema(path: Where) -> DatasetSchema:
    return DatasetSchema.from_dict(read_manifest(path, FORMAT)["schema"])


def read_samples(path: Where, storage_options: dict[str, Any] | None = None) -> Iterator[Row]:
    """Every sample with all its fields, in write order (what ``--verify`` compares): the
    pieces training reads, one row group at a time (plain pyarrow, no Petastorm)."""
    return row_group_samples(list_pieces(as_location(path, storage_options), OpenOptions()))


def row_group_samples(listing: RowGroupPieces) -> Iterator[Row]:
    handles = OpenFiles()
    for f, rg in listing.pieces:
        yield from from_record_batch(_parquet_file(listing, f, handles).read_row_group(rg), listing.schema)


# ------------------------------------------------------------------ read side (shared with Delta)

def list_pieces(path: Where, options: OpenOptions) -> RowGroupPieces:
    """Every row group of the manifest's parts, file by file, checked against the manifest's counts."""
    loc = as_location(path, options.storage_options)
    manifest = read_manifest(loc, FORMAT)
    schema = DatasetSchema.from_dict(manifest["schema"])
    spec = pick_field(schema, options.field, loc.shown)
    files = [loc.file(p["file"]) for p in manifest["parts"]]
    objects = None if loc.local else loc.objects()
    sizes = None if objects is None else {f: o.size for f, o in objects.items()}
    listing = file_pieces(loc, schema, spec, files, sizes, options, objects)
    declared = {loc.file(part["file"]): part.get("rows") for part in manifest["parts"]}
    check_declared_rows(loc.shown, listing, declared, piece_file)
    return listing


def file_pieces(loc: Location, schema: DatasetSchema, spec: FieldSpec, files: list[str], sizes: dict[str, int] | None,
                options: OpenOptions, identities: dict[str, Identity] | None = None,
                version: int | None = None) -> RowGroupPieces:
    """The row groups of ``files`` in ``loc``: read locally, or on object storage through range
    requests (``sizes``: each file's size, from the caller's listing or log; ``identities``:
    each object's version, else one listing of ``loc`` gives them; ``version``: the table
    version they are the live files of)."""
    if loc.local:
        return replace(row_group_pieces(schema, spec, files), version=version)
    sizes = sizes or {}
    identities = loc.objects() if identities is None else identities
    versions = {f: identities.get(f) or Identity(sizes[f]) for f in files if f in sizes}
    fetcher = open_fetcher(loc, options.io_concurrency, options.cache_dir, options.cache_limit, versions)
    return replace(remote_row_group_pieces(schema, spec, files, sizes, fetcher), version=version)


def row_group_pieces(schema: DatasetSchema, spec: FieldSpec, files: list[str]) -> RowGroupPieces:
    pieces: list[RowGroup] = []
    rows: list[int] = []
    pinned = pin_files(files)
    for f in files:
        meta = open_pinned(f, pinned[f], functools.partial(pq.ParquetFile, f)).metadata
        for rg in range(meta.num_row_groups):
            pieces.append((f, rg))
            rows.append(meta.row_group(rg).num_rows)
    return RowGroupPieces(schema=schema, spec=spec, pieces=pieces, rows=rows, files=files, pins=pinned)


@dataclass
class RemoteParts:
    """What reading Parquet files on object storage needs: the fetcher and each file's size
    and footer (read once, when the store is opened)."""

    fetcher: Fetcher
    sizes: dict[str, int]
    footers: dict[str, Footer]

    def open(self, f: str, span: tuple[int, int] | None = None) -> pq.ParquetFile:
        file = RangeFile(self.fetcher, f, self.sizes[f])
        if span:
            file.prefetch(*span)
        return pq.ParquetFile(file, metadata=self.footers[f])


@dataclass(frozen=True, kw_only=True)
class RowGroupPieces(Pieces[RowGroup]):
    """The row groups of Parquet files (a Parquet store, a Delta table's live files, a table
    another tool wrote); ``remote``: on object storage, how they are read (None locally)."""

    remote: RemoteParts | None = None


def remote_row_group_pieces(schema: DatasetSchema, spec: FieldSpec, files: list[str], sizes: dict[str, int],
                            fetcher: Fetcher) -> RowGroupPieces:
    """``row_group_pieces`` for files on object storage: the footers are read concurrently (one
    or two range requests each), the sizes come from the caller's listing."""
    missing = [f for f in files if f not in sizes]
    if missing:
        raise TrainfeedError(f"{missing[0]}: listed by the store but not found on the storage ({len(missing)} "
                             "missing): the store is incomplete or was changed while being opened")
    with ThreadPoolExecutor(fetcher.io_concurrency) as pool:
        footers = dict(zip(files, pool.map(lambda f: pq.read_metadata(RangeFile(fetcher, f, sizes[f])), files)))
    pieces: list[RowGroup] = []
    rows: list[int] = []
    for f in files:
        for rg in range(footers[f].num_row_groups):
            pieces.append((f, rg))
            rows.append(footers[f].row_group(rg).num_rows)
    return RowGroupPieces(schema=schema, spec=spec, pieces=pieces, rows=rows, files=files, sizes=sizes,
                          fetcher=fetcher, remote=RemoteParts(fetcher, sizes, footers))


def row_group_span(meta: Footer, rg: int, columns: list[str]) -> tuple[int, int]:
    """The bytes holding ``columns`` of row group ``rg``: one range covers them (they are
    adjacent in the file), so a piece is one concurrent fetch instead of a request per page."""
    group, lo, hi = meta.row_group(rg), None, None
    for j in range(group.num_columns):
        col = group.column(j)
        if col.path_in_schema.split(".")[0] not in columns:
            continue
        start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
        lo = start if lo is None else min(lo, start)
        hi = start + col.total_compressed_size if hi is None else max(hi, start + col.total_compressed_size)
    return (lo or 0, hi or 0)


def _parquet_file(listing: RowGroupPieces, f: str, handles: OpenFiles, columns: list[str] | None = None,
                  rg: int | None = None) -> pq.ParquetFile:
    """A ParquetFile for reading row group ``rg`` of ``f``: local files are kept open in
    ``handles``; on object storage the row group's bytes are fetched first, in one go."""
    remote = listing.remote
    if remote is None:
        return handles.get(f, pq.ParquetFile, lambda: open_pinned(f, listing.pins.get(f), lambda: pq.ParquetFile(f)))
    span = row_group_span(remote.footers[f], rg, columns) if rg is not None and columns else None
    return remote.open(f, span)


def piece_file(piece: RowGroup) -> str:
    return piece[0]


def piece_span(listing: RowGroupPieces, piece: RowGroup) -> tuple[str, int, int] | None:
    """(object, start, end) a remote row group's read fetches (None locally): what a reader
    asks the fetcher for ahead of decoding it."""
    remote = listing.remote
    if remote is None:
        return None
    f, rg = piece
    return (f, *row_group_span(remote.footers[f], rg, piece_columns(listing.spec)))


def piece_columns(spec: FieldSpec) -> list[str]:
    """The columns a piece's read takes: ids, labels, the field and (ragged) its shapes."""
    return [ID, LABEL, spec.name, *([spec.shape_column] if spec.is_ragged else [])]


def read_piece(listing: RowGroupPieces, piece: RowGroup, handles: OpenFiles, empty: Empty = np.empty) -> Columns:
    """One row group; a binary tensor column becomes a zero-copy view of its data buffer (all
    values have the same length, so the buffer is the stacked tensors). ``handles``: open
    files kept by the caller (one dict per reading thread). ``empty``: unused (Arrow allocates)."""
    return table_columns(read_row_group(listing, piece, piece_columns(listing.spec), handles), listing.spec)


def read_row_group(listing: RowGroupPieces, piece: RowGroup, columns: list[str], handles: OpenFiles) -> ArrowTable:
    """``columns`` of one row group (on object storage, fetched in one range request)."""
    f, rg = piece
    return _parquet_file(listing, f, handles, columns, rg).read_row_group(rg, columns=columns)


def table_columns(table: ArrowTable, spec: FieldSpec) -> Columns:
    chunked = table.column(spec.name)
    # one row group reads as one chunk: take it as is (combine_chunks would copy it)
    col = chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()
    n = len(col)
    x: np.ndarray
    shape = cast("tuple[int, ...]", spec.shape)  # fixed, but for ragged fields and images
    if spec.is_ragged:  # an object array: each sample in its own shape
        x = ragged_column(col, table.column(spec.shape_column), spec)
    elif not spec.is_raw:  # encoded images: one bytes value per row (training/reading/images.py decodes them)
        x = np.empty(n, object)
        x[:] = col.to_pylist()
    elif pa.types.is_binary(col.type):
        offsets = np.frombuffer(col.buffers()[1], np.int32, n + 1, col.offset * 4)
        data = np.frombuffer(col.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
        x = data.view(np.dtype(spec.dtype).newbyteorder("<")).reshape((n, *shape))
    else:
        x = col.flatten().to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False).reshape((n, *shape))
    return Columns(table.column(ID).to_pylist(), labels_array(table.column(LABEL).to_numpy(zero_copy_only=False)), x)


def ids_in(listing: RowGroupPieces, files: list[str]) -> set[str]:
    """Every sample id in ``files`` of the listing (the id column only)."""
    return {i for f in files for i in _parquet_file(listing, f, OpenFiles()).read(columns=[ID]).column(ID).to_pylist()}


def read_labels(listing: RowGroupPieces, column_name: str = LABEL) -> Iterator[np.ndarray]:
    """The label column (``column_name``) of each data file (-1 where unlabeled)."""
    for f in listing.files:
        column = _parquet_file(listing, f, OpenFiles()).read(columns=[column_name]).column(column_name).combine_chunks()
        yield labels_array(column.to_numpy(zero_copy_only=False))


# ------------------------------------------------------------------ the registry's format

class RowGroups:
    """The read side of a format whose pieces are Parquet row groups (Parquet, and Delta, whose
    files are Parquet): listed before ``Format`` among a format's bases, so that these are its
    ``PieceReader`` members."""

    UNIT = UNIT
    read_piece = staticmethod(read_piece)
    piece_file = staticmethod(piece_file)
    piece_span = staticmethod(piece_span)
    read_labels = staticmethod(read_labels)


def _write(path: Where, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
           on_part: Callable[[str], None] | None = None) -> WriteResult:
    assert not isinstance(path, Location), "Parquet is written to a local folder (uploaded from there)"
    return write(path, schema, batches, opts, on_part)


class Parquet(RowGroups, Format[RowGroup, RowGroupPieces]):
    """Parquet stores (formats/interface.py says what each member is for)."""

    name, label, noun = FORMAT, "Parquet", "a Parquet store"
    writable, parquet_files, fetches_ahead = True, True, True
    COMPRESSIONS, DEFAULT_COMPRESSION, COMPRESSION_LEVELS = COMPRESSIONS, DEFAULT_COMPRESSION, COMPRESSION_LEVELS
    suffixes, commit_record = (".parquet",), MANIFEST
    part_names = r"part-\d{5}\.parquet"
    run_part_names = r"part-\d{5}-[0-9a-f]{8}\.parquet"  # as publish.py tags a part with its run

    is_store = staticmethod(is_store)
    written_by_trainfeed = staticmethod(is_store)  # its manifest, validated, is trainfeed's mark
    write = staticmethod(_write)
    read_schema = staticmethod(read_schema)
    read_samples = staticmethod(read_samples)
    data_files = staticmethod(data_files)
    list_pieces = staticmethod(list_pieces)


PARQUET = Parquet()
