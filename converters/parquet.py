"""Parquet store: a folder of ``part-NNNNN.parquet`` files of about the target size, each
split into row groups of about the row-group size, plus the ``_trainfeed.json`` manifest."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

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


def _open_part(path: Path, index: int, arrow: pa.Schema, opts: WriteOptions):
    sink = open(path / PART.format(index), "wb")
    writer = pq.ParquetWriter(
        sink, arrow,
        compression=parquet_compression(opts.compression),
        compression_level=opts.compression_level,
        # Dictionary encoding and min/max statistics only help the small columns; on tensor
        # lists they cost CPU and are thrown away.
        use_dictionary=[ID],
        write_statistics=[ID, LABEL],
    )
    return sink, writer


def write(path, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
          *, storage_options: dict[str, str] | None = None) -> WriteResult:
    """Write every batch as one row group; start a new part when the current one reaches the
    target file size. ``path`` must be a new (staging) folder."""
    path = Path(path)
    path.mkdir(parents=True)
    arrow = arrow_schema(schema, opts.tensor_column)
    parts: list[dict] = []
    sink = writer = None
    rows_in_part = 0
    try:
        for batch in batches:
            if writer is None:
                sink, writer = _open_part(path, len(parts), arrow, opts)
                rows_in_part = 0
            writer.write_batch(to_record_batch(batch, schema, arrow), row_group_size=len(batch))
            rows_in_part += len(batch)
            if sink.tell() >= opts.target_file_size:
                writer.close()
                sink.close()
                parts.append({"file": PART.format(len(parts)), "rows": rows_in_part})
                sink = writer = None
        if writer is not None:
            writer.close()
            sink.close()
            parts.append({"file": PART.format(len(parts)), "rows": rows_in_part})
            sink = writer = None
    finally:
        if writer is not None:
            writer.close()
        if sink is not None:
            sink.close()
    schema.samples = sum(p["rows"] for p in parts)
    manifest = {"format": FORMAT, "writer": f"trainfeed {__version__}", "schema": schema.to_dict(), "parts": parts}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=1))
    files = [str(path / p["file"]) for p in parts]
    return WriteResult(files, sum(Path(f).stat().st_size for f in files), {"row_groups": _row_group_count(files)})


def _row_group_count(files: list[str]) -> int:
    return sum(pq.ParquetFile(f).num_row_groups for f in files)


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
