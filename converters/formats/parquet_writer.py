"""Parquet store, write side: every batch a row group of part files of about the target size,
encoded in a writer thread; the folder's manifest. Shared by the Parquet and Delta writers
(parquet.py is the read side and the registry's format)."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trainfeed.converters.formats.manifest import write_manifest
from trainfeed.converters.formats.options import WriteOptions, WriteResult
from trainfeed.converters.layout import ID, LABEL, DatasetSchema, arrow_schema, to_record_batch
from trainfeed.converters.sources.decode import Sample

FORMAT = "parquet"
COMPRESSIONS = ("none", "snappy", "zstd", "lz4", "gzip", "brotli")
DEFAULT_COMPRESSION = "none"
#: (lowest, highest) --compression-level per codec; codecs not listed take no level (Arrow: gzip 1-9).
COMPRESSION_LEVELS = {"zstd": (1, 22), "gzip": (1, 9), "brotli": (0, 11)}
PART = "part-{:05d}.parquet"


def parquet_compression(name: str) -> str:
    return "NONE" if name == "none" else name.upper()


@dataclass
class Part:
    file: str  # name inside the store folder
    rows: int
    row_groups: int  # one per batch written
    size: int
    min_id: str
    max_id: str
    labels: tuple[int | None, int | None]  # (min, max); None when unlabeled
    written_ms: int = 0  # when it was closed (Delta's modificationTime)


def _open_part(file: Path, arrow: pa.Schema, opts: WriteOptions) -> tuple[pa.OSFile, pq.ParquetWriter]:
    sink = pa.OSFile(str(file), "wb")  # native file: writes need no GIL
    writer = pq.ParquetWriter(
        sink, arrow,
        compression=parquet_compression(opts.compression),
        compression_level=opts.compression_level,
        # Dictionary encoding and min/max statistics only help the small columns; on tensor
        # columns they cost CPU and are thrown away.
        use_dictionary=[ID],
        write_statistics=[ID, LABEL],
    )
    return sink, writer


def write_parts(folder: Path, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
                part_name: Callable[[int], str] = PART.format, on_part: Callable[[str], None] | None = None
                ) -> list[Part]:
    """Write every batch as one row group into part files of about the target size;
    ``on_part(name)`` is called as each part is complete (an upload can start).

    Encoding and writing a row group (pyarrow, GIL released) runs in a writer thread while
    this thread assembles the next one. Shared by the Parquet and Delta writers."""
    arrow = arrow_schema(schema, opts.tensor_column)
    parts: list[Part] = []
    sink: Any = None  # pa.OSFile and pq.ParquetWriter while a part is open
    writer: Any = None
    pending: Future[Any] | None = None
    rows = groups = 0
    ids: list[str] = []
    labels: list[int] = []

    def close_part() -> None:
        nonlocal sink, writer
        writer.close()
        size = sink.tell()
        sink.close()
        name = part_name(len(parts))
        lab = (min(labels), max(labels)) if labels else (None, None)
        parts.append(Part(name, rows, groups, size, min(ids), max(ids), lab, int(time.time() * 1000)))
        sink = writer = None
        if on_part is not None:
            on_part(name)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainfeed-parquet") as pool:
        try:
            for batch in batches:
                record_batch = to_record_batch(batch, schema, arrow)
                if pending is not None:
                    pending.result()
                    if sink.tell() >= opts.target_file_size:
                        close_part()
                if writer is None:
                    sink, writer = _open_part(folder / part_name(len(parts)), arrow, opts)
                    rows, groups, ids, labels = 0, 0, [], []
                pending = pool.submit(writer.write_batch, record_batch, row_group_size=len(batch))
                rows += len(batch)
                groups += 1
                ids += (batch[0].id, batch[-1].id)  # batches arrive in id order
                labels += [s.label for s in batch if s.label is not None]
            if pending is not None:
                pending.result()
                close_part()
        except BaseException:
            if pending is not None:
                pending.cancel()
                wait([pending])
            _close_quietly(writer, sink)
            raise
    return parts


def _close_quietly(*handles: Any) -> None:
    """Close what a failed write left open: closing a half-written part fails again on a
    full disk, and that second error must not hide the first."""
    for handle in handles:
        if handle is not None:
            with suppress(Exception):
                handle.close()


def write(path: str | os.PathLike[str], schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
          on_part: Callable[[str], None] | None = None) -> WriteResult:
    """Parts plus the manifest. ``path`` must be a new (staging) folder. ``on_part(name)``:
    called as each part is complete."""
    path = Path(path)
    path.mkdir(parents=True)
    parts = write_parts(path, schema, batches, opts, on_part=on_part)
    schema.samples = sum(p.rows for p in parts)
    write_manifest(path, FORMAT, schema, [{"file": p.file, "rows": p.rows} for p in parts])
    files = [str(path / p.file) for p in parts]
    return WriteResult(files, sum(p.size for p in parts), {"row_groups": sum(p.row_groups for p in parts)})
