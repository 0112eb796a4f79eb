"""What every format module shares: write options and results, the read side's piece list
and the columns one piece reads into, and size parsing for the CLI."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.layout import DatasetSchema, FieldSpec

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str, what: str = "size") -> int:
    """'128MB', '64MiB', '1GB', '500000' -> bytes (MB = 10**6, MiB = 2**20)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise UsageError(f"{what}: cannot parse {text!r}; use a number of bytes or e.g. 128MB, 64MiB, 1GB")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise UsageError(f"{what}: must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class WriteOptions:
    target_file_size: int = 128 * 10**6
    row_group_size: int = 32 * 10**6
    compression: str = "none"
    compression_level: int | None = None
    hdf5_chunk_size: int = 1 * 10**6
    mode: str = "create"  # create | overwrite | append
    tensor_column: str = "binary"  # Parquet/Delta: "binary" (bytes) or "list" (array of numbers)

    def rows_per_group(self, sample_nbytes: int) -> int:
        return max(1, self.row_group_size // max(1, sample_nbytes))


@dataclass
class WriteResult:
    files: list[str]
    bytes_out: int
    details: dict


# ------------------------------------------------------------------ read side

@dataclass(frozen=True)
class ReadRequest:
    """What a reader asks of a format module's ``list_pieces``."""

    field_name: str | None = None  # tensor field to read; default: the first one
    version: int | None = None  # Delta: the table version
    labels_csv: str | None = None  # blob: labels as convert takes them
    storage_options: dict = field(default_factory=dict)
    # stores on object storage (see converters/storage/fetch.py)
    io_concurrency: int = 8  # range requests in flight for the whole reader
    cache_dir: str | None = None  # keep what is read here, so that later epochs read local disk
    cache_limit: int = 10 * 10**9  # bytes the cache may hold


@dataclass
class Pieces:
    """A store's units of reading (row groups, chunk slices, files) in a stable order, with
    the rows each holds: enough to plan an epoch without reading any data."""

    schema: DatasetSchema
    spec: FieldSpec  # the tensor field read
    pieces: list
    rows: list[int]
    files: list[str]  # data files (blob: none)
    version: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Columns:
    """One piece read: ids, labels (int64, -1 where unlabeled) and the tensor field, (n, *shape)."""

    ids: list[str]
    labels: np.ndarray
    x: np.ndarray


def pick_field(schema: DatasetSchema, name: str | None, path) -> FieldSpec:
    if not schema.fields:
        raise TrainfeedError(f"{path}: store has no tensor fields")
    if name is None:
        return schema.fields[0]
    try:
        return schema.field(name)
    except KeyError:
        raise TrainfeedError(f"{path}: store has no field {name!r} (fields: {', '.join(schema.field_names)})") from None


def check_declared_rows(path, listing: Pieces, declared_per_file: dict[str, int | None],
                        piece_file) -> None:
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


def labels_array(values) -> np.ndarray:
    """A label column (numpy or Arrow's numpy form) -> int64, -1 where null."""
    arr = np.asarray(values)
    if arr.dtype == object:  # nulls in an unlabeled store
        return np.array([-1 if v is None else int(v) for v in arr], dtype=np.int64)
    return np.nan_to_num(arr, nan=-1).astype(np.int64)
