"""Delta Lake store through delta-rs: the Parquet layout, committed atomically by the Delta log.

Tensor-field specs live in the table schema's field metadata (Delta keeps it); each commit
carries the whole dataset schema as custom commit metadata under ``trainfeed``. Readers
must take the live file list from the log (``file_uris()``), never the folder listing: after
OPTIMIZE the folder still holds the replaced files until VACUUM.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
from deltalake import ColumnProperties, CommitProperties, DeltaTable, WriterProperties, write_deltalake
from deltalake.exceptions import TableNotFoundError

from .layout import DATASET_META, DatasetSchema, arrow_schema, from_record_batch, schema_from_arrow, to_record_batch
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
    """One Delta commit holding every batch. ``opts.mode``: create (``path`` is new),
    overwrite (a new version replaces the live files; older versions stay for time travel
    until VACUUM) or append."""
    arrow = arrow_schema(schema, opts.tensor_column)
    counter = {"rows": 0}
    failure: list[BaseException] = []

    def record_batches():
        try:
            for batch in batches:
                counter["rows"] += len(batch)
                yield to_record_batch(batch, schema, arrow)
        except BaseException as exc:  # delta-rs would hide it inside a DeltaError
            failure.append(exc)
            raise

    rows_per_group = opts.rows_per_group(max(1, _sample_nbytes(schema)))
    reader = pa.RecordBatchReader.from_batches(arrow, record_batches())
    mode = {"create": "error", "overwrite": "overwrite", "append": "append"}[opts.mode]
    try:
        write_deltalake(
            str(path), reader,
            mode=mode,
            schema_mode="overwrite" if mode == "overwrite" else None,
            target_file_size=opts.target_file_size,
            writer_properties=writer_properties(schema, opts, rows_per_group),
            storage_options=storage_options,
            commit_properties=CommitProperties(custom_metadata={DATASET_META: schema.to_json()}),
        )
    except Exception:
        if failure:
            raise failure[0] from None
        raise
    schema.samples = counter["rows"]
    table = open_table(path, storage_options=storage_options)
    return _result(table, {"version": table.version(), "rows_written": counter["rows"]})


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
    for commit in table.history():  # newest first: provenance of the latest write
        if DATASET_META in commit:
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
