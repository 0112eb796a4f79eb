"""Writing a Delta table through delta-rs: Parquet parts (``--to parquet``'s fast writer)
committed in one transaction, checked again just before the commit; restoring a version;
OPTIMIZE and VACUUM; and the first commit of parts another writer (the Spark repack) put in a
table's folder. Every commit carries trainfeed's mark (delta_log.py)."""
from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.delta_log import ids_added_since, marked, open_table, read_schema
from trainfeed.converters.formats.interface import Where
from trainfeed.converters.formats.options import WriteOptions, WriteResult
from trainfeed.converters.formats.parquet_writer import Part, write_parts
from trainfeed.converters.layout import DATASET_META, ID, LABEL, DatasetSchema, arrow_schema
from trainfeed.converters.sources.decode import Sample
from trainfeed.converters.storage.location import Location, as_location
from trainfeed.converters.storage.upload import Uploader

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable, WriterProperties
    from deltalake.transaction import AddAction

_DELTA_COMPRESSION = {"none": "UNCOMPRESSED", "lz4": "LZ4_RAW"}


def writer_properties(schema: DatasetSchema, opts: WriteOptions, rows_per_group: int) -> WriterProperties:
    from deltalake import ColumnProperties, WriterProperties

    # As for Parquet: no dictionaries or statistics on tensor columns (CPU spent, nothing gained).
    plain = ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")
    return WriterProperties(
        compression=_DELTA_COMPRESSION.get(opts.compression, opts.compression.upper()),  # type: ignore[arg-type]
        compression_level=opts.compression_level,
        max_row_group_size=rows_per_group,
        column_properties={f.name: plain for f in schema.fields},
    )


def _commit_properties(schema: DatasetSchema) -> CommitProperties:
    from deltalake import CommitProperties

    return CommitProperties(custom_metadata={DATASET_META: schema.to_json()})


def write(path: Where, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
          on_part: Callable[[str], None] | None = None, *, since_version: int | None = None,
          publishing: Callable[[], AbstractContextManager[Any]] = nullcontext) -> WriteResult:
    """Write Parquet parts (the same fast writer as ``--to parquet``) into the table folder,
    then commit them in one Delta transaction. ``path``: a local path or a Location on object
    storage (parts are written to a local temporary folder, uploaded, then committed through
    delta-rs). ``opts.mode``: create (``path`` is new), overwrite (a new version whose live
    files are these; older versions stay for time travel until VACUUM) or append. Until the
    commit, the new files are invisible to every reader; a failed run removes them, a killed
    one leaves them unreferenced (``--vacuum-hours 0`` removes them). ``on_part(name)``: called
    as each part is complete (after its upload is started, on object storage).

    ``since_version``: for overwrite and append, the version the caller checked the table at.
    Just before committing, the table must still be trainfeed's, and (append) no id written
    here may have been added by a commit after that version (another writer): TrainfeedError,
    nothing committed.

    ``publishing()`` wraps the commit, once every part is uploaded (a conversion's
    ``SafeInterrupts.publishing``: a Ctrl-C that came meanwhile stops the run there, nothing
    committed)."""
    from deltalake import Schema
    from deltalake.transaction import create_table_with_add_actions

    loc = as_location(path)
    run = uuid.uuid4().hex[:12]
    written: list[str] = []
    with _parts_folder(loc) as folder, _uploader(loc, folder) as uploader:
        try:
            parts = write_parts(folder, schema, _noting_ids(batches, written), opts,
                                part_name=lambda i: f"part-{i:05d}-{run}-c000.parquet",
                                on_part=_each(uploader, on_part))
            schema.samples = sum(p.rows for p in parts)
            if uploader is not None:
                uploader.finish()
            actions = [_add_action(p, schema.labeled) for p in parts]
            delta_schema = Schema.from_arrow(arrow_schema(schema, opts.tensor_column))
            if opts.mode == "create":
                with publishing():
                    create_table_with_add_actions(loc.delta_uri(), delta_schema, actions, mode="error",
                                                  storage_options=loc.delta_options() or None,
                                                  commit_properties=_commit_properties(schema))
            else:
                table = open_table(loc) if since_version is None else \
                    _recheck(loc, since_version, written if opts.mode == "append" else [])
                with publishing():
                    table.create_write_transaction(list(actions), mode=opts.mode, schema=delta_schema,
                                                   commit_properties=_commit_properties(schema))
        except BaseException:
            _remove_orphans(loc, run)
            raise
    return table_result(loc)


@contextmanager
def _parts_folder(loc: Location) -> Iterator[Path]:
    """Where the parts are written: the table folder itself, or a local temporary folder for a
    table on object storage (removed afterwards)."""
    if loc.local:
        Path(loc.path).mkdir(parents=True, exist_ok=True)
        yield Path(loc.path)
        return
    with tempfile.TemporaryDirectory(prefix="trainfeed-delta-") as tmp:
        yield Path(tmp)


def _uploader(loc: Location, folder: Path) -> AbstractContextManager[Uploader | None]:
    """Uploads each part as it is written, for a table on object storage; None locally."""
    return nullcontext() if loc.local else Uploader(loc, folder)


def _remove_orphans(loc: Location, run: str) -> None:
    """Remove this run's parts (never referenced by the log) after a failed commit."""
    if loc.local:
        for orphan in Path(loc.path).glob(f"part-*-{run}-c000.parquet"):
            orphan.unlink(missing_ok=True)
        return
    with suppress(Exception):  # best effort: what stays is unreferenced, and vacuum removes it
        orphans = loc.fs.glob(loc.file(f"part-*-{run}-c000.parquet"))
        if orphans:
            loc.fs.rm(orphans)


def _each(*calls: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """One callback making each of ``calls`` (those not None) in turn; None when there are none."""
    given = [call for call in calls if call is not None]
    if not given:
        return None

    def each(name: str) -> None:
        for call in given:
            call(name)

    return each


def _noting_ids(batches: Iterable[list[Sample]], ids: list[str]) -> Iterator[list[Sample]]:
    for batch in batches:
        ids.extend(s.id for s in batch)
        yield batch


def _recheck(loc: Location, since_version: int, ids: list[str]) -> DeltaTable:
    """The table to commit to, checked again: still trainfeed's, and none of ``ids`` added
    by another writer after ``since_version``."""
    try:
        table = open_table(loc)
        ours = marked(table)
    except ValueError:
        ours = False
    if not ours:
        raise TrainfeedError(f"{loc.shown}: is no longer a Delta table written by trainfeed (it changed while this "
                             "run was writing); nothing committed")
    if ids and table.version() != since_version:
        clash = set(ids) & ids_added_since(loc, table.version(), since_version)
        if clash:
            raise TrainfeedError(f"{loc.shown}: cannot append: {len(clash)} of these sample ids were added to the "
                                 f"table by another writer while this run was writing (e.g. {sorted(clash)[:3]}); "
                                 "nothing appended")
    return table


def restore(path: Where, version: int) -> None:
    """Make ``version``'s snapshot the live one again (a new commit, recording its schema)."""
    schema = read_schema(path, version)
    open_table(path).restore(version, commit_properties=_commit_properties(schema))


def create_table(folder: Path, parts: list[str], schema: DatasetSchema, tensor_column: str) -> None:
    """Commit the Parquet files ``parts`` (names) another writer (Spark) put in ``folder`` as
    version 0 of a new Delta table."""
    from deltalake import Schema
    from deltalake.transaction import create_table_with_add_actions

    actions = [_add_action(describe_part(folder, name), schema.labeled) for name in parts]
    create_table_with_add_actions(str(folder), Schema.from_arrow(arrow_schema(schema, tensor_column)), actions,
                                  mode="error", commit_properties=_commit_properties(schema))


def describe_part(folder: Path, name: str) -> Part:
    """A Parquet file another writer (Spark) put in ``folder``, described as ``write_parts``
    describes its own (rows, size, id and label ranges)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(folder / name)
    t = pf.read(columns=[ID, LABEL])
    labels = t.column(LABEL)
    stat = (folder / name).stat()
    return Part(name, t.num_rows, pf.num_row_groups, stat.st_size, pc.min(t.column(ID)).as_py(),
                pc.max(t.column(ID)).as_py(), (pc.min(labels).as_py(), pc.max(labels).as_py()),
                int(stat.st_mtime * 1000))


def _add_action(part: Part, labeled: bool) -> AddAction:
    from deltalake.transaction import AddAction

    stats = {
        "numRecords": part.rows,
        "minValues": {ID: part.min_id, **({LABEL: part.labels[0]} if labeled else {})},
        "maxValues": {ID: part.max_id, **({LABEL: part.labels[1]} if labeled else {})},
        "nullCount": {ID: 0, LABEL: 0 if labeled else part.rows},
    }
    return AddAction(part.file, part.size, {}, part.written_ms, True, json.dumps(stats))


def _sample_nbytes(schema: DatasetSchema) -> int:
    return sum(f.sample_nbytes or 100_000 for f in schema.fields)


def table_result(path: Where) -> WriteResult:
    """The live files of the table at ``path`` now, their bytes and its version."""
    table = open_table(path)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    return WriteResult(table.file_uris(), int(sum(actions.get("size_bytes", []))),
                       {"version": table.version(), "live_files": len(actions.get("path", []))})


def optimize(path: Where, *, target_size: int, opts: WriteOptions,
             storage_options: dict[str, str] | None = None) -> dict[str, Any]:
    """Compact small files into ~target_size ones (a new table version; data unchanged)."""
    table = open_table(path, storage_options=storage_options)
    schema = read_schema(path, storage_options=storage_options)
    metrics = table.optimize.compact(
        target_size=target_size,
        writer_properties=writer_properties(schema, opts, opts.rows_per_group(max(1, _sample_nbytes(schema)))),
        commit_properties=_commit_properties(schema),
    )
    return {"files_added": metrics.get("numFilesAdded"), "files_removed": metrics.get("numFilesRemoved")}


def vacuum(path: Where, *, retention_hours: int, storage_options: dict[str, str] | None = None) -> list[str]:
    """Delete files no longer referenced by versions younger than ``retention_hours``."""
    table = open_table(path, storage_options=storage_options)
    # full: also files no commit ever referenced (the parts of a killed run)
    return table.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False, full=True,
                        commit_properties=_commit_properties(read_schema(path, storage_options=storage_options)))
