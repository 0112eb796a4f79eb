"""Delta Lake store through delta-rs: the Parquet layout, committed atomically by the Delta log.

Tensor-field specs live in the table schema's field metadata (Delta keeps it); each commit
trainfeed makes (writes, OPTIMIZE, VACUUM, restores) carries the whole dataset schema as
custom commit metadata under ``trainfeed`` (a table the Spark repack wrote through delta-spark
carries it in the commit's ``userMetadata`` instead, see ``user_metadata``): that is
trainfeed's mark on a table, and where the label map, source and ``store_id`` of each version
are read from (an append that brings new classes cannot change the table schema's field
metadata). Readers must take the live file
list from the log (``file_uris()``), never the folder listing: after OPTIMIZE the folder
still holds the replaced files until VACUUM. ``DELTA`` is the registry's delta format.
"""
from __future__ import annotations

import json
import tempfile
import uuid
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import pyarrow as pa

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.interface import Format, Row, Where
from trainfeed.converters.formats.options import (
    OpenOptions,
    Pieces,
    WriteOptions,
    WriteResult,
    check_declared_rows,
    pick_field,
)

# A Delta table's files are Parquet: its codecs and its read side are Parquet's.
from trainfeed.converters.formats.parquet import RowGroups, file_pieces, ids_in, piece_file, row_group_samples
from trainfeed.converters.formats.parquet_writer import (
    COMPRESSION_LEVELS,
    COMPRESSIONS,
    DEFAULT_COMPRESSION,
    Part,
    write_parts,
)
from trainfeed.converters.layout import (
    DATASET_META,
    ID,
    LABEL,
    DatasetSchema,
    arrow_schema,
    checked_schema,
    schema_from_arrow,
)
from trainfeed.converters.redact import redact_url
from trainfeed.converters.sources.decode import Sample
from trainfeed.converters.storage.location import Location, as_location, check_delta_url
from trainfeed.converters.storage.upload import Uploader

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable, WriterProperties
    from deltalake.transaction import AddAction, RemoveAction


def _deltalake() -> Any:
    """delta-rs, loaded on first use: a process that never touches a Delta table (a reader of
    Parquet or HDF5, a DataLoader worker) neither loads its large native library nor needs it."""
    import deltalake
    import deltalake.exceptions
    import deltalake.transaction

    return deltalake

FORMAT = "delta"
LOG = "_delta_log"
_DELTA_COMPRESSION = {"none": "UNCOMPRESSED", "lz4": "LZ4_RAW"}


def writer_properties(schema: DatasetSchema, opts: WriteOptions, rows_per_group: int) -> WriterProperties:
    # As for Parquet: no dictionaries or statistics on tensor columns (CPU spent, nothing gained).
    plain = _deltalake().ColumnProperties(dictionary_enabled=False, statistics_enabled="NONE")
    props: WriterProperties = _deltalake().WriterProperties(
        compression=_DELTA_COMPRESSION.get(opts.compression, opts.compression.upper()),
        compression_level=opts.compression_level,
        max_row_group_size=rows_per_group,
        column_properties={f.name: plain for f in schema.fields},
    )
    return props


def is_store(path: Where) -> bool:
    loc = as_location(path)
    return Path(loc.path, LOG).is_dir() if loc.local else loc.fs.isdir(loc.file(LOG))


def open_table(path: Where, version: int | None = None, storage_options: dict[str, str] | None = None) -> DeltaTable:
    """The table at a local path or URI (``storage_options`` in delta-rs's names), or at a
    Location (its own credentials)."""
    shown = _shown(path)
    if isinstance(path, Location):
        loc = path
        path, storage_options = loc.delta_uri(), loc.delta_options() or None
    try:
        table: DeltaTable = _deltalake().DeltaTable(str(path), version=version, storage_options=storage_options)
        return table
    except _deltalake().exceptions.TableNotFoundError as exc:
        raise ValueError(f"{shown}: not a Delta table") from exc
    except _deltalake().exceptions.DeltaError as exc:  # a corrupt or truncated log; delta-rs appends a backtrace
        raise ValueError(f"{shown}/_delta_log: cannot read the Delta log: {str(exc).splitlines()[0]}") from exc


def _shown(path: Where) -> str:
    return path.shown if isinstance(path, Location) else redact_url(str(path))


def _commit_history(table: DeltaTable) -> list[dict[str, Any]]:
    try:
        return table.history()
    except _deltalake().exceptions.DeltaError as exc:
        raise ValueError(f"{_location(table)}/_delta_log: cannot read the commit history: "
                         f"{str(exc).splitlines()[0]}") from exc


def written_by_trainfeed(path: Where) -> bool:
    """Whether the table's commit history carries trainfeed's commit metadata. ValueError if
    its log cannot be read."""
    return _marked(open_table(path))


def _marked(table: DeltaTable) -> bool:
    return any(marked_commit(commit) for commit in _commit_history(table))


def user_metadata(schema: DatasetSchema) -> str:
    """trainfeed's commit mark as a commit's ``userMetadata``: delta-spark (the Spark repack on
    Databricks) cannot add the ``trainfeed`` key delta-rs commits carry, only that string."""
    return json.dumps({DATASET_META: schema.to_json()})


def marked_commit(commit: dict[str, Any]) -> bool:
    """Whether a commit (a Delta history row: ``userMetadata`` and the rest) is trainfeed's."""
    return _recorded_json(commit) is not None


def _recorded_json(commit: dict[str, Any]) -> str | None:
    """The dataset schema (JSON text) a commit carries: under ``trainfeed`` (delta-rs), or in
    ``userMetadata`` as ``user_metadata`` writes it (delta-spark); None for anyone else's commit."""
    if DATASET_META in commit:
        recorded: str | None = commit[DATASET_META]
        return recorded
    try:
        user = json.loads(commit.get("userMetadata") or "null")
    except json.JSONDecodeError:
        return None
    return user.get(DATASET_META) if isinstance(user, dict) else None


def recorded_schema(path: Where, version: int, storage_options: dict[str, str] | None = None) -> DatasetSchema | None:
    """The dataset schema trainfeed recorded with the newest of its commits up to ``version``;
    None for a table trainfeed never committed to."""
    # The history of the latest table: a table opened at an older version numbers the
    # newest commits as if they were its own (delta-rs 1.x).
    for commit in _commit_history(open_table(path, storage_options=storage_options)):  # newest first
        text = _recorded_json(commit)
        if text is not None and commit.get("version", -1) <= version:
            where = f"{_shown(path)}/_delta_log: commit {commit.get('version')}"
            try:
                recorded = json.loads(text)
            except (TypeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{where}: metadata {DATASET_META!r} is not valid JSON ({exc})") from exc
            return checked_schema(recorded, where)
    return None


def _location(table: DeltaTable) -> str:
    return table.table_uri.removeprefix("file://").rstrip("/")


def _commit_properties(schema: DatasetSchema) -> CommitProperties:
    props: CommitProperties = _deltalake().CommitProperties(custom_metadata={DATASET_META: schema.to_json()})
    return props


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
    loc = as_location(path)
    run = uuid.uuid4().hex[:12]
    written: list[str] = []
    parts: list[Part] = []
    with _parts_folder(loc) as folder, _uploader(loc, folder) as uploader:
        try:
            parts = write_parts(folder, schema, _noting_ids(batches, written), opts,
                                part_name=lambda i: f"part-{i:05d}-{run}-c000.parquet",
                                on_part=_each(uploader, on_part))
            schema.samples = sum(p.rows for p in parts)
            if uploader is not None:
                uploader.finish()
            actions = [_add_action(p, schema.labeled) for p in parts]
            delta_schema = _deltalake().Schema.from_arrow(arrow_schema(schema, opts.tensor_column))
            if opts.mode == "create":
                with publishing():
                    _deltalake().transaction.create_table_with_add_actions(
                        loc.delta_uri(), delta_schema, actions, mode="error",
                        storage_options=loc.delta_options() or None, commit_properties=_commit_properties(schema))
            else:
                table = open_table(loc) if since_version is None else \
                    _recheck(loc, since_version, written if opts.mode == "append" else [])
                changes: list[AddAction | RemoveAction] = list(actions)
                with publishing():
                    table.create_write_transaction(changes, mode=opts.mode, schema=delta_schema,
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
        marked = _marked(table)
    except ValueError:
        marked = False
    if not marked:
        raise TrainfeedError(f"{loc.shown}: is no longer a Delta table written by trainfeed (it changed while this "
                             "run was writing); nothing committed")
    if ids and table.version() != since_version:
        clash = set(ids) & ids_added_since(loc, table.version(), since_version)
        if clash:
            raise TrainfeedError(f"{loc.shown}: cannot append: {len(clash)} of these sample ids were added to the "
                                 f"table by another writer while this run was writing (e.g. {sorted(clash)[:3]}); "
                                 "nothing appended")
    return table


def live_ids(path: Where, version: int | None = None) -> set[str]:
    """Every sample id in the table's snapshot at ``version`` (the latest when None)."""
    listing = list_pieces(as_location(path), OpenOptions(version=version))
    return ids_in(listing, listing.files)


def ids_added_since(path: Where, version: int, since: int) -> set[str]:
    """Ids in the live files of ``version`` that were not live at ``since``."""
    now = list_pieces(as_location(path), OpenOptions(version=version))
    before = set(list_pieces(as_location(path), OpenOptions(version=since)).files)
    return ids_in(now, [f for f in now.files if f not in before])


def restore(path: Where, version: int) -> None:
    """Make ``version``'s snapshot the live one again (a new commit, recording its schema)."""
    schema = read_schema(path, version)
    open_table(path).restore(version, commit_properties=_commit_properties(schema))


def create_table(folder: Path, parts: list[Part], schema: DatasetSchema, tensor_column: str) -> None:
    """Commit Parquet ``parts`` already in ``folder`` as version 0 of a new Delta table."""
    actions = [_add_action(p, schema.labeled) for p in parts]
    delta_schema = _deltalake().Schema.from_arrow(arrow_schema(schema, tensor_column))
    _deltalake().transaction.create_table_with_add_actions(str(folder), delta_schema, actions, mode="error",
                                                           commit_properties=_commit_properties(schema))


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
    stats = {
        "numRecords": part.rows,
        "minValues": {ID: part.min_id, **({LABEL: part.labels[0]} if labeled else {})},
        "maxValues": {ID: part.max_id, **({LABEL: part.labels[1]} if labeled else {})},
        "nullCount": {ID: 0, LABEL: 0 if labeled else part.rows},
    }
    action: AddAction = _deltalake().transaction.AddAction(part.file, part.size, {}, part.written_ms, True,
                                                           json.dumps(stats))
    return action


def _sample_nbytes(schema: DatasetSchema) -> int:
    return sum(f.sample_nbytes or 100_000 for f in schema.fields)


def table_result(path: Where) -> WriteResult:
    """The live files of the table at ``path`` now, their bytes and its version."""
    table = open_table(path)
    return _result(table, {"version": table.version()})


def _result(table: DeltaTable, details: dict[str, Any]) -> WriteResult:
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    return WriteResult(table.file_uris(), int(sum(actions.get("size_bytes", []))),
                       {**details, "live_files": len(actions.get("path", []))})


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


def tensor_column(path: Where, storage_options: dict[str, str] | None = None) -> str:
    """'binary' or 'list': how the table stores tensors (appends must match it)."""
    arrow = pa.schema(open_table(path, storage_options=storage_options).schema().to_arrow())
    schema = schema_from_arrow(arrow)
    raw = [f for f in schema.fields if f.is_raw]
    return "list" if raw and pa.types.is_list(arrow.field(raw[0].name).type) else "binary"


def read_schema(path: Where, version: int | None = None,
                storage_options: dict[str, str] | None = None) -> DatasetSchema:
    table = open_table(path, version, storage_options)
    schema = schema_from_arrow(pa.schema(table.schema().to_arrow()))
    schema.samples = sample_count(table)
    recorded = recorded_schema(path, table.version(), storage_options)
    if recorded is not None:
        schema.labeled, schema.label_map = recorded.labeled, recorded.label_map
        schema.source, schema.store_id = recorded.source, recorded.store_id
    return schema


def sample_count(table: DeltaTable) -> int:
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    return int(sum(actions.get("num_records", [])))


def data_files(path: Where, version: int | None = None, storage_options: dict[str, str] | None = None) -> list[str]:
    """The live snapshot's files, from the Delta log."""
    return open_table(path, version, storage_options).file_uris()


def read_samples(path: Where, version: int | None = None,
                 storage_options: dict[str, str] | None = None) -> Iterator[Row]:
    """Every sample of the snapshot with all its fields (what ``--verify`` compares): the pieces
    training reads. ``path``: a local path, URL or Location (``storage_options`` in fsspec's names)."""
    return row_group_samples(list_pieces(as_location(path, storage_options), OpenOptions(version=version)))


def list_pieces(path: Where, options: OpenOptions) -> Pieces:
    """The row groups of the live snapshot's files (at ``options.version`` if given), from the log;
    on object storage the log is read by delta-rs and the data files through fsspec."""
    loc = as_location(path, options.storage_options)
    table, files, sizes = live_files(loc, options.version)
    schema = read_schema(loc, options.version)
    spec = pick_field(schema, options.field, loc.shown)
    listing = file_pieces(loc, schema, spec, files, sizes, options)
    listing.version = table.version()
    check_declared_rows(loc.shown, listing, {}, piece_file)
    return listing


def live_files(loc: Location, version: int | None) -> tuple[DeltaTable, list[str], dict[str, int] | None]:
    """The table at ``version`` (default: the latest), its live data files from the log and, on
    object storage, their sizes (None locally)."""
    if version is not None:
        latest = open_table(loc).version()
        if not 0 <= version <= latest:
            raise UsageError(f"--delta-version {version}: {loc.shown} has versions 0..{latest}")
    table = open_table(loc, version)
    if loc.local:
        return table, table.file_uris(), None
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    files = [loc.file(p) for p in actions.get("path", [])]
    return table, files, dict(zip(files, (int(n) for n in actions.get("size_bytes", []))))


# ------------------------------------------------------------------ the registry's format

class Delta(RowGroups, Format):
    """Delta tables (formats/interface.py says what each member is for)."""

    name, label, noun, foreign_noun = FORMAT, "Delta Lake", "a Delta table", "a Delta table"
    writable, versioned, parquet_files, fetches_ahead = True, True, True, True
    COMPRESSIONS, DEFAULT_COMPRESSION, COMPRESSION_LEVELS = COMPRESSIONS, DEFAULT_COMPRESSION, COMPRESSION_LEVELS
    suffixes, commit_record = (".parquet",), LOG
    part_names = run_part_names = r"part-\d{5}-[0-9a-f]{12}-c000\.parquet"  # its own run id: see write()

    def is_store(self, path: Where) -> bool:
        return is_store(path)

    def written_by_trainfeed(self, path: Where) -> bool:
        return written_by_trainfeed(path)

    def check_url(self, url: str) -> None:
        check_delta_url(url)

    def write(self, path: Where, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
              on_part: Callable[[str], None] | None = None) -> WriteResult:
        return write(path, schema, batches, opts, on_part)

    def read_schema(self, path: Where) -> DatasetSchema:
        return read_schema(path)

    def read_samples(self, path: Where, storage_options: dict[str, Any] | None = None) -> Iterator[Row]:
        return read_samples(path, storage_options=storage_options)

    def data_files(self, path: Where) -> list[str]:
        return data_files(path)

    def list_pieces(self, path: Where, options: OpenOptions) -> Pieces:
        return list_pieces(path, options)


DELTA = Delta()
