"""The read side of training for a Parquet or Delta table another tool wrote, described by a
``ForeignSchema`` (converters/formats/foreign.py): the same pieces as trainfeed's own stores (row groups,
listed and fetched by converters/formats/parquet.py, locally or on object storage), each read as the
named columns and decoded.

Which files: a Parquet folder's ``*.parquet`` files directly in it, by name (names starting
with ``_`` or ``.`` skipped: Spark's ``_SUCCESS``, checksums), or the one file given; a Delta
table's live snapshot from its log. Without an id column, a sample's id is ``row-<n>``, its
position in the table in that file order, counting from 0. ``READER`` is what the read engine
calls on its pieces (formats/interface.py's ``PieceReader``).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats import parquet
from trainfeed.converters.formats.delta_log import live_files
from trainfeed.converters.formats.foreign import (
    ForeignSchema,
    check_columns,
    decode_ids,
    decode_tensors,
    resolve_encoding,
)
from trainfeed.converters.formats.interface import Columns, Empty, OpenFiles, PieceReader, labels_array
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.parquet import ArrowTable, RowGroup, RowGroupPieces, read_row_group
from trainfeed.converters.storage.location import Location
from trainfeed.converters.storage.native import Identity

UNIT = parquet.UNIT
piece_file = parquet.piece_file


@dataclass(frozen=True)
class ForeignRead:
    """What reading a piece needs beyond the listing: the options, the encoding they resolve to
    for this table, and the table-wide row number of each piece's first row (for ``row-<n>`` ids)."""

    foreign: ForeignSchema
    encoding: str
    first_rows: dict[RowGroup, int]


@dataclass(frozen=True, kw_only=True)
class ForeignPieces(RowGroupPieces):
    """The row groups of a table another tool wrote, and how its columns are read."""

    read: ForeignRead


def list_pieces(loc: Location, logged: bool, options: OpenOptions, foreign: ForeignSchema) -> ForeignPieces:
    """The row groups of the table at ``loc`` (``logged``: a table with a log, Delta; else a
    folder of Parquet files), every file's columns checked against ``foreign``, and the first row
    group decoded (its values must fit too)."""
    schema = foreign.dataset_schema(loc.shown)
    spec = schema.fields[0]
    if logged:
        version, files, sizes = live_files(loc, options.version)
        listing = parquet.file_pieces(loc, schema, spec, files, sizes, options, version=version)
    else:
        files, objects = _parquet_files(loc)
        object_sizes = None if objects is None else {f: o.size for f, o in objects.items()}
        listing = parquet.file_pieces(loc, schema, spec, files, object_sizes, options, objects)
    if not listing.pieces or not sum(listing.rows):
        raise TrainfeedError(f"{loc.shown}: the table holds no rows")
    for f in listing.files:
        check_columns(foreign, _arrow_schema(listing, f), _shown(loc, f))
    schema.samples = sum(listing.rows)
    starts = np.cumsum([0, *listing.rows[:-1]]).tolist()
    first = read_row_group(listing, listing.pieces[0], foreign.columns, OpenFiles())  # read once: encoding, check
    read = ForeignRead(foreign, resolve_encoding(foreign, first.column(foreign.tensor_column).combine_chunks()),
                       dict(zip(listing.pieces, starts)))
    _decode(read, first, listing.pieces[0], np.empty)
    return ForeignPieces(**{f.name: getattr(listing, f.name) for f in fields(listing)}, read=read)


def _parquet_files(loc: Location) -> tuple[list[str], dict[str, Identity] | None]:
    """The data files of a Parquet folder (or the file itself) and, on object storage, their
    versions (size, ETag: what the reader's requests and cached ranges are tied to)."""
    if loc.is_file():
        return [loc.path], None if loc.local else {loc.path: loc.identity()}
    objects = loc.objects()
    files = sorted(f for f in objects if f.rsplit("/", 1)[-1].endswith(".parquet")
                   and not f.rsplit("/", 1)[-1].startswith(("_", ".")))
    if not files:
        raise TrainfeedError(f"{loc.shown}: no Parquet files (*.parquet) directly in this folder")
    return files, None if loc.local else objects


def _arrow_schema(listing: RowGroupPieces, f: str) -> pa.Schema:
    remote = listing.remote
    return remote.footers[f].schema.to_arrow_schema() if remote else pq.read_schema(f)


def _shown(loc: Location, f: str) -> str:
    """A data file as messages show it: the table itself when it is the one file."""
    return loc.shown if f == loc.path else f"{loc.shown}/{f.rsplit('/', 1)[-1]}"


def read_piece(listing: ForeignPieces, piece: RowGroup, handles: OpenFiles, empty: Empty = np.empty) -> Columns:
    """One row group's named columns, decoded."""
    read = listing.read
    return _decode(read, read_row_group(listing, piece, read.foreign.columns, handles), piece, empty)


def _decode(read: ForeignRead, table: ArrowTable, piece: RowGroup, empty: Empty) -> Columns:
    """A row group's columns, read, as samples, labels and ids."""
    foreign, where = read.foreign, f"{piece[0]} (row group {piece[1]})"
    x = decode_tensors(foreign, read.encoding, table.column(foreign.tensor_column), where, empty)
    labels = labels_array(table.column(foreign.label_column).to_numpy())
    return Columns(decode_ids(foreign, table, read.first_rows[piece], where), labels, x)


def read_labels(listing: ForeignPieces) -> Iterator[np.ndarray]:
    """The label column of each data file (-1 where null)."""
    return parquet.read_labels(listing, listing.read.foreign.label_column)


class ForeignTable(PieceReader[RowGroup, ForeignPieces]):
    """The read engine's calls on the pieces of a table another tool wrote."""

    UNIT = UNIT
    read_piece = staticmethod(read_piece)
    piece_file = staticmethod(piece_file)
    read_labels = staticmethod(read_labels)


READER = ForeignTable()
