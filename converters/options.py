"""Write options shared by every target format, and size parsing for the CLI."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Protocol

from .errors import UsageError
from .layout import DatasetSchema
from .sources import Sample

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}

COMPRESSIONS = {
    "parquet": ("none", "snappy", "zstd", "lz4", "gzip", "brotli"),
    "delta": ("none", "snappy", "zstd", "lz4", "gzip", "brotli"),
    "hdf5": ("none", "lzf", "gzip"),
}
DEFAULT_COMPRESSION = {"parquet": "none", "delta": "none", "hdf5": "none"}
#: (lowest, highest) --compression-level per format and codec; codecs not listed take no level.
#: Parquet and Delta parts are written by Arrow (gzip 1-9); HDF5's gzip filter takes 0-9.
_ARROW_LEVELS = {"zstd": (1, 22), "gzip": (1, 9), "brotli": (0, 11)}
COMPRESSION_LEVELS = {"parquet": _ARROW_LEVELS, "delta": _ARROW_LEVELS, "hdf5": {"gzip": (0, 9)}}


def check_compression(fmt: str, codec: str, level: int | None) -> None:
    """UsageError unless ``codec`` is available for ``fmt`` and takes ``level``."""
    if codec not in COMPRESSIONS[fmt]:
        raise UsageError(f"--compression {codec!r} is not available for {fmt} (choose from {', '.join(COMPRESSIONS[fmt])})")
    if level is None:
        return
    levels = COMPRESSION_LEVELS[fmt].get(codec)
    if levels is None:
        takes = ", ".join(f"{name} {lo}-{hi}" for name, (lo, hi) in COMPRESSION_LEVELS[fmt].items())
        raise UsageError(f"--compression-level: --compression {codec} takes no level (levels for {fmt}: {takes})")
    if not levels[0] <= level <= levels[1]:
        raise UsageError(f"--compression-level {level}: {codec} levels for {fmt} are {levels[0]} to {levels[1]}")


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


class StoreWriter(Protocol):
    """One module per format implements this, beside its reader (see converters/stores.py)."""

    def __call__(
        self, path, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
        *, storage_options: dict[str, str] | None = None,
    ) -> WriteResult: ...
