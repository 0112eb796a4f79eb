"""Delta Lake store through delta-rs: the Parquet layout, committed atomically by the Delta log.

Tensor-field specs live in the table schema's field metadata (Delta keeps it); each commit
carries the whole dataset schema as custom commit metadata under ``trainfeed``. Readers
must take the live file list from the log (``file_uris()``), never the folder listing: after
OPTIMIZE the folder still holds the replaced files until VACUUM.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Iterator

import pyarrow as pa
from deltalake import ColumnProperties, CommitProperties, DeltaTable, Schema, WriterProperties
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, create_table_with_add_actions

from .layout import DATASET_META, ID, LABEL, DatasetSchema, arrow_schema, from_record_batch, schema_from_arrow
from .parquet import Part, write_parts
from .options import WriteOptions, WriteResult
from .sources import Sample

FORMAT = "delta"
_DELTA_COMPRESSION = {"none": "UNCOMPRESSED", "lz4": "LZ4_RAW"}


def writer_properties(schema: DatasetSchema, opts: WriteOptions, rows_per_group: int) -> WriterProperties:
    # As for Parquet: no dictionaries or statistics on tensor columns (CPU spent, nothing gained).
    plain = ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")
    return WriterProperties(
        compression=_DELTA_COMPRESSION.get(opts.compression, opts.compression.upper()),
        compression_level=opts.compression_level,
        max_row_group_size=rows_per_group,
        column_properties={f.name: plain for f in schema.fields},
    )


def is_store(path: Path) -> bool:
    return Path(path, "_delta_log").is_dir()


def open_table(path, version: int | None = None, storage_options: dict[str, str] | None = None) -> DeltaTable:
    try:
        return DeltaTable(str(path), version=version, storage_options=storage_options)
    except TableNotFoundError as exc:
        raise ValueError(f"{path}: not a Delta table") from exc


def write(path, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
          *, storage_options: dict[str, str] | None = None) -> WriteResult:
    """Write Parquet parts (the same fast writer as ``--to parquet``) into the table folder,
    then commit them in one Delta transaction. ``opts.mode``: create (``path`` is new),
    overwrite (a new version whose live files are these; older versions stay for time travel
    until VACUUM) or append. Until the commit, the new files are invisible to every reader."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:12]
    try:
        parts = write_parts(path, schema, batches, opts, part_name=lambda i: f"part-{i:05d}-{run}-c000.parquet")
        schema.samples = sum(p.rows for p in parts)
        actions = [_add_action(path, p, schema.labeled) for p in parts]
        delta_schema = Schema.from_arrow(arrow_schema(schema, opts.tensor_column))
        commit = CommitProperties(custom_metadata={DATASET_META: schema.to_json()})
        if opts.mode == "create":
            create_table_with_add_actions(str(path), delta_schema, actions, mode="error", commit_properties=commit)
        else:
            open_table(path).create_write_transaction(actions, mode=opts.mode, schema=delta_schema,
                                                      commit_properties=commit)
    except BaseException:
        for orphan in path.glob(f"part-*-{run}-c000.parquet"):  # never referenced by the log
            orphan.unlink(missing_ok=True)
        raise
    table = open_table(path)
    return _result(table, {"version": table.version()})


def _add_action(folder: Path, part: Part, labeled: bool) -> AddAction:
    stats = {
        "numRecords": part.rows,
        "minValues": {ID: part.min_id, **({LABEL: part.labels[0]} if labeled else {})},
        "maxValues": {ID: part.max_id, **({LABEL: part.labels[1]} if labeled else {})},
        "nullCount": {ID: 0, LABEL: 0 if labeled else part.rows},
    }
    mtime_ms = int((folder / part.file).stat().st_mtime * 1000)
    return AddAction(part.file, part.size, {}, mtime_ms, True, json.dumps(stats))


def _sample_nbytes(schema: DatasetSchema) -> int:
    return sum(f.sample_nbytes or 100_000 for f in schema.fields)


def _result(table: DeltaTable, details: dict) -> WriteResult:
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    return WriteResult(table.file_uris(), int(sum(actions.get("size_bytes", []))), {**details, "live_files": len(actions.get("path", []))})


def optimize(path, *, target_size: int, opts: WriteOptions, storage_options: dict[str, str] | None = None) -> dict:
    """Compact small files into ~target_size ones (a new table version; data unchanged)."""
    table = open_table(path, storage_options=storage_options)
    schema = read_schema(path, storage_options=storage_options)
    metrics = table.optimize.compact(
        target_size=target_size,
        writer_properties=writer_properties(schema, opts, opts.rows_per_group(max(1, _sample_nbytes(schema)))),
    )
    return {"files_added": metrics.get("numFilesAdded"), "files_removed": metrics.get("numFilesRemoved")}


def vacuum(path, *, retention_hours: int, storage_options: dict[str, str] | None = None) -> list[str]:
    """Delete files no longer referenced by versions younger than ``retention_hours``."""
    table = open_table(path, storage_options=storage_options)
    return table.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False)


def tensor_column(path, storage_options: dict[str, str] | None = None) -> str:
    """'binary' or 'list': how the table stores tensors (appends must match it)."""
    arrow = pa.schema(open_table(path, storage_options=storage_options).schema().to_arrow())
    schema = schema_from_arrow(arrow)
    raw = [f for f in schema.fields if f.is_raw]
    return "list" if raw and pa.types.is_list(arrow.field(raw[0].name).type) else "binary"


def read_schema(path, version: int | None = None, storage_options: dict[str, str] | None = None) -> DatasetSchema:
    table = open_table(path, version, storage_options)
    schema = schema_from_arrow(pa.schema(table.schema().to_arrow()))
    schema.samples = sample_count(table)
    for commit in table.history():  # newest first: provenance of the latest write up to this version
        if DATASET_META in commit and commit.get("version", -1) <= table.version():
            recorded = DatasetSchema.from_json(commit[DATASET_META])
            schema.labeled, schema.source = recorded.labeled, recorded.source
            break
    return schema


def sample_count(table: DeltaTable) -> int:
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    return int(sum(actions.get("num_records", [])))


def data_files(path, version: int | None = None, storage_options: dict[str, str] | None = None) -> list[str]:
    """The live snapshot's files, from the Delta log."""
    return open_table(path, version, storage_options).file_uris()


def read_samples(path, version: int | None = None, storage_options: dict[str, str] | None = None) -> Iterator[tuple]:
    import pyarrow.parquet as pq

    schema = read_schema(path, version, storage_options)
    for f in data_files(path, version, storage_options):
        pf = pq.ParquetFile(f)
        for rg in range(pf.num_row_groups):
            yield from from_record_batch(pf.read_row_group(rg), schema)
