"""What every format module shares: write options and results, the options a store is opened
with, and size parsing for the CLI (the read side's listing and columns: pieces.py)."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats.foreign import ForeignSchema
from trainfeed.converters.option_docs import option
from trainfeed.converters.storage.fetch import DEFAULT_IO_CONCURRENCY

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
    target_file_size: int = option(128 * 10**6, cli_default="128MB", help="Approximate size of each output file "
                                   "(Parquet part, Delta file, HDF5 shard).")
    row_group_size: int = option(32 * 10**6, cli_default="32MB", help="Approximate uncompressed size of a Parquet "
                                 "row group (the unit a Petastorm worker reads).")
    compression: str = option("none", help="The codec: none (the default: float tensors and JPEG bytes hardly "
                              "compress and a codec costs throughput); zstd for data that does (masks, integer CT, "
                              "pixels).")
    compression_level: int | None = option(None, help="The codec's level; codecs without levels take none.")
    hdf5_chunk_size: int = option(1 * 10**6, cli_default="1MB", help="Approximate HDF5 chunk size; chunks span "
                                  "whole samples along the first axis.")
    mode: str = option("create", help="create: refuse an existing destination. overwrite: replace, atomically, a "
                       "store trainfeed wrote (or an empty folder); anything else there is refused and left "
                       "untouched. append: add, in one commit, to a versioned store (Delta table) trainfeed wrote "
                       "(or create it where there is none): the fields and the kind of labels must match; a class "
                       "the table knows keeps its number, a new class gets the next free number; ids already in the "
                       "table are rejected (the error policy decides whether that stops the run), and an id another "
                       "writer added meanwhile fails the run with nothing appended.")
    tensor_column: str = option("binary", help="parquet/delta: how a tensor is stored. binary: its little-endian "
                                "bytes (fastest to write and read). list: an array of numbers (what Spark and DuckDB "
                                "show as arrays; about 2-3x slower to read; not for float16).")

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

    version: int | None = option(None, flag="delta-version", help="A versioned store (Delta table): read this "
                                 "version (0 to the latest). Default: the latest.")
    field: str | None = option(None, help="The tensor field batches deliver as x. Default: the store's first.")
    labels: str | None = option(None, help="A folder of small files: a labels CSV (id,label), as convert takes it "
                                "(default: labels.csv in the folder when there is one, else class subfolders).")
    classes: tuple[str, ...] | None = option(None, help="A folder of small files: class names in label order "
                                             "(default: sorted).")
    cast: str | None = option(None, help="A folder of small files: read every array as this dtype where no value "
                              "changes (a file with one that would is an error naming it), for a folder mixing "
                              "dtypes; auto: the smallest dtype that holds every .npy file's, found in their headers "
                              "first (as convert --dtype auto).")
    storage_options: dict[str, Any] = option(factory=dict, flag="storage-option", help=(
        "Object storage: credentials and settings in fsspec's names (connection_string, account_name, key, "
        "secret, endpoint_url, ...; call_timeout=SECONDS, default 30); Delta logs are read with the same."))
    io_concurrency: int = option(DEFAULT_IO_CONCURRENCY, help="Stores on object storage: range requests in flight "
                                 "for the whole reader (apart from the reading threads, which decode).")
    cache_dir: str | None = option(None, help="Stores on object storage: keep what is read in this local folder, so "
                                   "that epochs after the first read local disk.")
    cache_limit: int = option(10 * 10**9, cli_default="10GB", help="Most bytes the cache folder may hold (least "
                              "recently used ranges are evicted), e.g. 500MB, 20GiB.")
    image_size: tuple[int, int] | None = option(None, help="Encoded images (JPEG/PNG, decoded while reading) and "
                                                "image folders: decode every image to HEIGHTxWIDTH, e.g. 64x64. "
                                                "Default: the store's size, else the first image's; needed when the "
                                                "images differ in size.")
    fit: str | None = option(None, help="Arrays of different shapes (a store converted ragged, or a folder mixing "
                             "shapes) batched as one shape: pad:SHAPE (zeros at each axis's end; a larger sample is "
                             "refused), crop:SHAPE (the centre, padded where shorter) or resize:SHAPE (linear), e.g. "
                             "pad:64x64x1. A sample with fewer axes gets leading axes of 1.")
    #: A Parquet/Delta table another tool wrote: its columns and tensor encoding (the command line
    #: and open_store take it as tensor_column, shape, dtype, label_column, id_column, tensor_encoding).
    foreign: ForeignSchema | None = None


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
