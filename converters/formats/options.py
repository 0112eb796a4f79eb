"""What every format module shares: write options and results, the options a store is opened
with, the read side's piece list and the columns one piece reads into, and size parsing for the CLI."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.foreign import ForeignSchema
from trainfeed.converters.layout import DatasetSchema, FieldSpec
from trainfeed.converters.storage.fetch import DEFAULT_IO_CONCURRENCY, Fetcher
from trainfeed.converters.storage.pins import Pin

OptionsT = TypeVar("OptionsT")

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str | int, what: str = "size") -> int:
    """'128MB', '64MiB', '1GB', '500000' (or a number of bytes) -> bytes (MB = 10**6, MiB = 2**20)."""
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
    details: dict[str, Any]


# ------------------------------------------------------------------ read side

@dataclass(frozen=True)
class OpenOptions:
    """What opening a store needs (``trainfeed.open_store``, ``train``'s store options, a
    format's ``list_pieces``). Frozen and picklable: an opened store keeps the options it was
    opened with, and DataLoader worker processes receive them with it."""

    version: int | None = None  # Delta: the table version to read; None: the latest
    field: str | None = None  # the tensor field batches deliver as x; None: the store's first
    labels: str | None = None  # a folder of small files: a CSV (id,label) of their labels, as convert takes it
    classes: tuple[str, ...] | None = None  # a folder of small files: class names in label order (else sorted)
    cast: str | None = None  # a folder of small files: arrays read as this dtype, no value changed ("auto": found)
    storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)  # object storage credentials, settings
    # stores on object storage (see converters/storage/fetch.py)
    io_concurrency: int = DEFAULT_IO_CONCURRENCY  # range requests in flight for the whole reader
    cache_dir: str | None = None  # keep what is read here (a local folder), so that later epochs read local disk
    cache_limit: int = 10 * 10**9  # bytes the cache may hold
    image_size: tuple[int, int] | None = None  # encoded images: (height, width) to decode to; None: the store's size
    fit: str | None = None  # arrays: one shape for every sample, pad:SHAPE | crop:SHAPE | resize:SHAPE (fitting.py)
    foreign: ForeignSchema | None = None  # a Parquet/Delta table another tool wrote: its columns and tensor encoding


def merge_options(cls: type[OptionsT], options: OptionsT | None, keywords: dict[str, Any]) -> OptionsT:
    """One options object from an API call's ``options=`` and its keywords: ``cls(**keywords)``
    without an object; with one, the object itself, and a keyword that is not at ``cls``'s
    default and differs from the object's value is refused (the two would disagree)."""
    if options is None:
        return cls(**keywords)
    if not isinstance(options, cls):
        raise UsageError(f"options must be a {cls.__name__}, not {type(options).__name__}")
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    conflicts = [name for name, value in keywords.items()
                 if _differs(value, defaults[name]) and _differs(value, getattr(options, name))]
    if conflicts:
        raise UsageError(f"both options= ({cls.__name__}) and keywords that differ from it were given: "
                         + ", ".join(f"{name}={keywords[name]!r} (options has {getattr(options, name)!r})"
                                     for name in conflicts)
                         + f"; set them in the {cls.__name__} or leave the keywords out")
    return options


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return tuple(a) != tuple(b)
    return bool(a != b)


@dataclass
class Pieces:
    """A store's units of reading (row groups, chunk slices, files) in a stable order, with
    the rows each holds: enough to plan an epoch without reading any data."""

    schema: DatasetSchema
    spec: FieldSpec  # the tensor field read
    pieces: list[Any]
    rows: list[int]
    files: list[str]  # data files (blob: none)
    version: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: On object storage, for a format that ``fetches_ahead``: where a reader requests the bytes
    #: of the pieces it will decode next (``Format.piece_span``).
    fetcher: Fetcher | None = None
    #: On local disk: each data file as it was when the store was opened (a reader opens only that).
    pins: dict[str, Pin] = field(default_factory=dict)


@dataclass
class Columns:
    """One piece read: ids, labels (int64, -1 where unlabeled) and the tensor field, (n, *shape)
    (a ragged field: an object array of arrays, each in its own shape); once fitted to one shape,
    each sample's own (``shapes``, (n, ndim))."""

    ids: list[str]
    labels: np.ndarray
    x: np.ndarray
    shapes: np.ndarray | None = None


def pick_field(schema: DatasetSchema, name: str | None, path: object) -> FieldSpec:
    if not schema.fields:
        raise TrainfeedError(f"{path}: store has no tensor fields")
    if name is None:
        return schema.fields[0]
    try:
        return schema.field(name)
    except KeyError:
        raise TrainfeedError(f"{path}: store has no field {name!r} (fields: {', '.join(schema.field_names)})") from None


def check_declared_rows(path: object, listing: Pieces, declared_per_file: dict[str, int | None],
                        piece_file: Callable[[Any], str]) -> None:
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
