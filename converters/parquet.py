"""Parquet store: a folder of ``part-NNNNN.parquet`` files of about the target size, each
split into row groups of about the row-group size, plus the ``_trainfeed.json`` manifest."""
from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from . import __version__
from .layout import ID, LABEL, MANIFEST, DatasetSchema, arrow_schema, from_record_batch, to_record_batch
from .options import WriteOptions, WriteResult
from .sources import Sample

FORMAT = "parquet"
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


def _open_part(file: Path, arrow: pa.Schema, opts: WriteOptions):
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
                part_name: Callable[[int], str] = PART.format) -> list[Part]:
    """Write every batch as one row group into part files of about the target size.

    Encoding and writing a row group (pyarrow, GIL released) runs in a writer thread while
    this thread assembles the next one. Shared by the Parquet and Delta writers."""
    arrow = arrow_schema(schema, opts.tensor_column)
    parts: list[Part] = []
    sink = writer = None
    pending: Future | None = None
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
        parts.append(Part(name, rows, groups, size, min(ids), max(ids), lab))
        sink = writer = None

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
        finally:
            if pending is not None:
                pending.cancel()
                wait([pending])
            if writer is not None:
                writer.close()
            if sink is not None:
                sink.close()
    return parts


def write(path, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
          *, storage_options: dict[str, str] | None = None) -> WriteResult:
    """Parts plus the manifest. ``path`` must be a new (staging) folder."""
    path = Path(path)
    path.mkdir(parents=True)
    parts = write_parts(path, schema, batches, opts)
    schema.samples = sum(p.rows for p in parts)
    manifest = {"format": FORMAT, "writer": f"trainfeed {__version__}", "schema": schema.to_dict(),
                "parts": [{"file": p.file, "rows": p.rows} for p in parts]}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=1))
    files = [str(path / p.file) for p in parts]
    return WriteResult(files, sum(p.size for p in parts), {"row_groups": sum(p.row_groups for p in parts)})


def is_store(path: Path) -> bool:
    manifest = Path(path) / MANIFEST
    return manifest.is_file() and json.loads(manifest.read_text()).get("format") == FORMAT


def read_manifest(path) -> dict:
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError as exc:
        raise ValueError(f"{path}: no {MANIFEST}: not a complete trainfeed Parquet store") from exc
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: manifest says format {manifest.get('format')!r}, not parquet")
    return manifest


def data_files(path) -> list[str]:
    """The store's part files in write order (the manifest lists exactly the committed parts)."""
    return [str(Path(path) / p["file"]) for p in read_manifest(path)["parts"]]


def read_schema(path) -> DatasetSchema:
    return DatasetSchema.from_dict(read_manifest(path)["schema"])


def read_samples(path) -> Iterator[tuple[str, int | None, dict]]:
    """Every sample in write order, one row group at a time (plain pyarrow, no Petastorm)."""
    schema = read_schema(path)
    for f in data_files(path):
        pf = pq.ParquetFile(f)
        for rg in range(pf.num_row_groups):
            yield from from_record_batch(pf.read_row_group(rg), schema)
