"""A Delta table's log, through delta-rs: the table at a version, its live files, its history and
trainfeed's mark on its commits, the dataset schema each version records, and the row groups of
a version's live files (what training and ``--verify`` read).

Each commit trainfeed makes carries the whole dataset schema as custom commit metadata under
``trainfeed`` (a table the Spark repack wrote through delta-spark carries it in the commit's
``userMetadata`` instead, see ``user_metadata``): that is trainfeed's mark on a table, and where
the label map, source and ``store_id`` of each version are read from (an append that brings new
classes cannot change the table schema's field metadata). Readers take the live file list from
the log, never the folder listing: after OPTIMIZE the folder still holds the replaced files
until VACUUM.

delta-rs is imported inside the functions that use it (its types kept): a process that never
touches a Delta table (a reader of Parquet or HDF5, a DataLoader worker) neither loads its large
native library nor needs it.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats.interface import Row, Where, check_declared_rows, pick_field
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.parquet import RowGroupPieces, file_pieces, ids_in, piece_file, row_group_samples
from trainfeed.converters.layout import DATASET_META, DatasetSchema, checked_schema, schema_from_arrow
from trainfeed.converters.redact import redact_url
from trainfeed.converters.storage.location import Location, as_location

if TYPE_CHECKING:
    from deltalake import DeltaTable

FORMAT = "delta"
LOG = "_delta_log"


def is_store(path: Where) -> bool:
    loc = as_location(path)
    return Path(loc.path, LOG).is_dir() if loc.local else loc.fs.isdir(loc.file(LOG))


def open_table(path: Where, version: int | None = None, storage_options: dict[str, str] | None = None) -> DeltaTable:
    """The table at a local path or URI (``storage_options`` in delta-rs's names), or at a
    Location (its own credentials)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    shown = shown_path(path)
    if isinstance(path, Location):
        loc = path
        path, storage_options = loc.delta_uri(), loc.delta_options() or None
    try:
        return DeltaTable(str(path), version=version, storage_options=storage_options)
    except TableNotFoundError as exc:
        raise ValueError(f"{shown}: not a Delta table") from exc
    except DeltaError as exc:  # a corrupt or truncated log; delta-rs appends a backtrace
        raise ValueError(f"{shown}/_delta_log: cannot read the Delta log: {str(exc).splitlines()[0]}") from exc


def latest_version(path: Where) -> int:
    """The table's latest version. ValueError when its log cannot be read."""
    return open_table(path).version()


def shown_path(path: Where) -> str:
    return path.shown if isinstance(path, Location) else redact_url(str(path))


def commit_history(table: DeltaTable) -> list[dict[str, Any]]:
    from deltalake.exceptions import DeltaError

    try:
        return table.history()
    except DeltaError as exc:
        location = table.table_uri.removeprefix("file://").rstrip("/")
        raise ValueError(f"{location}/_delta_log: cannot read the commit history: "
                         f"{str(exc).splitlines()[0]}") from exc


def written_by_trainfeed(path: Where) -> bool:
    """Whether the table's commit history carries trainfeed's commit metadata. ValueError if
    its log cannot be read."""
    return marked(open_table(path))


def marked(table: DeltaTable) -> bool:
    return any(marked_commit(commit) for commit in commit_history(table))


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
    found = user.get(DATASET_META) if isinstance(user, dict) else None
    return found if isinstance(found, str) else None


def recorded_schema(path: Where, version: int, storage_options: dict[str, str] | None = None) -> DatasetSchema | None:
    """The dataset schema trainfeed recorded with the newest of its commits up to ``version``;
    None for a table trainfeed never committed to."""
    # The history of the latest table: a table opened at an older version numbers the
    # newest commits as if they were its own (delta-rs 1.x).
    for commit in commit_history(open_table(path, storage_options=storage_options)):  # newest first
        text = _recorded_json(commit)
        if text is not None and commit.get("version", -1) <= version:
            where = f"{shown_path(path)}/_delta_log: commit {commit.get('version')}"
            try:
                recorded = json.loads(text)
            except (TypeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{where}: metadata {DATASET_META!r} is not valid JSON ({exc})") from exc
            return checked_schema(recorded, where)
    return None


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


def live_files(loc: Location, version: int | None) -> tuple[int, list[str], dict[str, int] | None]:
    """The version read (``version``, default: the latest), its live data files from the log and,
    on object storage, their sizes (None locally)."""
    if version is not None:
        latest = latest_version(loc)
        if not 0 <= version <= latest:
            raise UsageError(f"--delta-version {version}: {loc.shown} has versions 0..{latest}")
    table = open_table(loc, version)
    if loc.local:
        return table.version(), table.file_uris(), None
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    files = [loc.file(p) for p in actions.get("path", [])]
    return table.version(), files, dict(zip(files, (int(n) for n in actions.get("size_bytes", []))))


def list_pieces(path: Where, options: OpenOptions) -> RowGroupPieces:
    """The row groups of the live snapshot's files (at ``options.version`` if given), from the log;
    on object storage the log is read by delta-rs and the data files through fsspec."""
    loc = as_location(path, options.storage_options)
    version, files, sizes = live_files(loc, options.version)
    schema = read_schema(loc, options.version)
    spec = pick_field(schema, options.field, loc.shown)
    listing = file_pieces(loc, schema, spec, files, sizes, options, version=version)
    check_declared_rows(loc.shown, listing, {}, piece_file)
    return listing


def read_samples(path: Where, storage_options: dict[str, Any] | None = None, *,
                 version: int | None = None) -> Iterator[Row]:
    """Every sample of the snapshot with all its fields (what ``--verify`` compares): the pieces
    training reads. ``path``: a local path, URL or Location (``storage_options`` in fsspec's names)."""
    return row_group_samples(list_pieces(as_location(path, storage_options), OpenOptions(version=version)))


def live_ids(path: Where, version: int | None = None) -> set[str]:
    """Every sample id in the table's snapshot at ``version`` (the latest when None)."""
    listing = list_pieces(as_location(path), OpenOptions(version=version))
    return ids_in(listing, listing.files)


def ids_added_since(path: Where, version: int, since: int) -> set[str]:
    """Ids in the live files of ``version`` that were not live at ``since``."""
    now = list_pieces(as_location(path), OpenOptions(version=version))
    before = set(list_pieces(as_location(path), OpenOptions(version=since)).files)
    return ids_in(now, [f for f in now.files if f not in before])
