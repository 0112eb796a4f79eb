"""convert(): list, decode, validate and write a small-file dataset as one compacted store."""
from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainfeed.converters import publish
from trainfeed.converters.commit import DestinationLock, Staging
from trainfeed.converters.destination import check_apart, check_destination, destination_path, make_parent, write_error
from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.interface import VersionedFormat
from trainfeed.converters.formats.options import WriteOptions, WriteResult
from trainfeed.converters.formats.registry import FORMATS, WRITABLE, check_compression, versioned_format
from trainfeed.converters.interrupt import SafeInterrupts
from trainfeed.converters.layout import DatasetSchema, channels_warnings, check_channels
from trainfeed.converters.option_docs import option
from trainfeed.converters.redact import redact_json
from trainfeed.converters.sample_stream import ProgressFn, SampleStream, source_location
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions, Sample
from trainfeed.converters.sources.dtypes import AUTO, check_dtype_option
from trainfeed.converters.sources.labels import Labels, resolve_labels
from trainfeed.converters.sources.listing import list_source
from trainfeed.converters.sources.samples import scan_dtype
from trainfeed.converters.storage.location import Location, as_location, check_url, is_remote, locate
from trainfeed.converters.verify import verify_store

ON_ERROR = ("fail", "skip")
REJECTS_SUFFIX = ".rejects.jsonl"



@dataclass
class ConvertConfig:
    """A conversion: its source and destination, the options of what it writes (``write``,
    ``image``, ``arrays``) and its own. The ``convert`` command's flags are made from these
    declarations (converters/option_docs.py)."""

    src: str
    dst: str
    fmt: str
    write: WriteOptions = field(default_factory=WriteOptions)
    image: ImageOptions = field(default_factory=ImageOptions)
    arrays: ArrayOptions = field(default_factory=ArrayOptions)
    labels_csv: str | None = option(None, flag="labels", help="CSV with columns id,label; id is the file's path "
                                    "relative to the source without extension (e.g. pos/vol_0001). Default: "
                                    "labels.csv in the source when it exists (as `storage-bench run` does; the "
                                    "summary says so), else class subfolder names when every file is in one, else "
                                    "unlabeled.")
    classes: tuple[str, ...] | None = option(None, help="Class names in label order (e.g. neg,pos): labels that "
                                             "are class names (CSV or subfolders) are numbered so, not in sorted "
                                             "order; a held-out set missing a class then gets the training set's "
                                             "numbers. A name not listed is an error.")
    folder_labels: bool = option(True, flag="folder-labels/--no-folder-labels", help="Take labels from the source "
                                 "itself: its labels.csv or class subfolder names (off: neither; a labels CSV given "
                                 "still applies).")
    workers: int = option(0, help="Parallel readers/decoders. 0 = auto: one per CPU core for a local source, 16 for "
                          "a remote one (reads there wait on the network).")
    on_error: str = option("fail", help="fail: stop at the first bad file and write nothing. skip: convert the "
                           "valid files and list the others in DST.rejects.jsonl.")
    verify: bool = option(False, help="Re-read the whole store and compare every sample with its source before "
                          "publishing it; exit 1 on any difference. On object storage the store is read back from "
                          "there: a Parquet or Delta store once committed (a failed check puts the previous store "
                          "back), an HDF5 file under a hidden name first.")
    optimize: bool = option(False, help="delta: compact small files (OPTIMIZE) after writing.")
    vacuum_hours: int | None = option(None, help="delta: delete files unreferenced for this many hours, 0 or more "
                                      "(0 drops time travel to older versions, and removes the parts a killed run "
                                      "left).")
    storage_options: dict[str, Any] = option(factory=dict, flag="storage-option", help=(
        "Passed to fsspec for the source, the labels and the destination (e.g. account_name, connection_string, "
        "key, secret, endpoint_url); a Delta destination gets the same credentials in delta-rs's names. "
        "Credentials also come from the usual environment variables. call_timeout=SECONDS is trainfeed's own: "
        "the longest one call to a remote store (folder check, one file's read, the labels file) may take, "
        "retries included (default 30; 0: no limit)."))


def default_workers(src: str) -> int:
    """``workers`` when none is given: one per CPU core for a local source, 16 for a remote one
    (reads there wait on the network)."""
    remote = "://" in src and not src.startswith("file://")
    return 16 if remote else max(1, os.cpu_count() or 1)


def check_config(cfg: ConvertConfig) -> None:
    """Usage errors (exit 2): options that cannot work together."""
    if cfg.fmt not in WRITABLE:
        raise UsageError(f"--to must be one of {', '.join(WRITABLE)}, not {cfg.fmt!r}")
    if cfg.on_error not in ON_ERROR:
        raise UsageError(f"--on-error must be 'fail' or 'skip', not {cfg.on_error!r}")
    check_compression(cfg.fmt, cfg.write.compression, cfg.write.compression_level)
    versioned = FORMATS[cfg.fmt].versioned  # a versioned format (Delta): its commits make appends atomic
    if cfg.write.mode == "append" and not versioned:
        raise UsageError("--mode append works only with --to delta (Delta commits make appends atomic)")
    if (cfg.optimize or cfg.vacuum_hours is not None) and not versioned:
        raise UsageError("--optimize and --vacuum-hours apply to --to delta only")
    if cfg.vacuum_hours is not None and cfg.vacuum_hours < 0:
        raise UsageError(f"--vacuum-hours must be 0 or more, not {cfg.vacuum_hours}")
    if cfg.workers < 0:
        raise UsageError("--workers must be 0 (auto) or more")
    check_dtype_option(cfg.arrays.dtype, "--dtype")
    check_channels(cfg.arrays.channels)
    if cfg.image.promote_depth and cfg.image.mode != "L":
        raise UsageError("--promote-depth stores greyscale images at 16 bits: it needs --image-mode L")


def _kind_of_labels(labeled: bool, label_map: dict[str, Any] | None) -> str:
    return "class-name labels" if label_map else "integer labels" if labeled else "no labels"


def _labels_for_append(dst: str, table: DatasetSchema, labels: Labels) -> Labels:
    """The new samples' labels in the table's numbering: a class the table knows keeps its
    number, a new class gets the next free one. Samples with and without labels, or with
    class names and with integer labels, never mix in one table."""
    new, old = (_kind_of_labels(labels.by_id is not None, labels.label_map),
                _kind_of_labels(table.labeled, table.label_map))
    if new != old:
        raise TrainfeedError(f"{dst}: cannot append samples with {new} to a table with {old}")
    if not labels.label_map:
        return labels
    assert table.label_map is not None and labels.by_id is not None  # class names on both sides (checked above)
    merged = dict(table.label_map)
    for name in sorted(set(labels.label_map) - set(merged)):
        merged[name] = max(merged.values()) + 1
    renumber = {i: merged[name] for name, i in labels.label_map.items()}
    return replace(labels, by_id={sid: renumber[i] for sid, i in labels.by_id.items()}, label_map=merged)


@dataclass
class _Table:
    """The table (a versioned format's store) at DST as this run found it."""

    fmt: VersionedFormat[Any, Any]
    version: int
    schema: DatasetSchema
    tensor_column: str


def _existing_table(fmt: VersionedFormat[Any, Any], dst: Location) -> _Table:
    try:
        version = fmt.version(dst)
        return _Table(fmt, version, fmt.read_schema(dst, version), fmt.tensor_column(dst))
    except ValueError as exc:
        raise TrainfeedError(f"{dst.shown}: cannot read the existing table: {exc}") from exc


def write_rejects_report(path: str | Path | Location, rejects: list[dict[str, Any]]) -> str | None:
    """The rejected files as JSON lines beside the store (``DST.rejects.jsonl``, on the same
    storage); a previous report is removed when nothing was rejected. Returns where it is."""
    dst = as_location(path)
    report = dst.path + REJECTS_SUFFIX
    shown = dst.shown + REJECTS_SUFFIX
    if not rejects:
        if dst.fs.exists(report):
            dst.fs.rm_file(report)
        return None
    text = "".join(redact_json(r) + "\n" for r in rejects).encode()
    if not dst.local:
        dst.fs.pipe_file(report, text)  # one PUT: whole or absent
        return shown
    tmp = report + ".tmp"
    Path(tmp).write_bytes(text)
    os.replace(tmp, report)
    return report


def _commit_to_table(dst: Location, table: _Table, schema: DatasetSchema, batches: Iterator[list[Sample]],
                     opts: WriteOptions, check: Callable[[], dict[str, Any] | None], interrupts: SafeInterrupts
                     ) -> tuple[WriteResult, dict[str, Any] | None]:
    """Overwrite or append to the table at ``dst`` in one commit (a killed run leaves only
    unreferenced files); a failed check restores the version the run started from."""
    result = table.fmt.write(dst, schema, batches, opts, since_version=table.version,
                             publishing=interrupts.publishing)
    try:
        return result, check()
    except Exception:
        table.fmt.restore(dst, table.version)
        raise


def _publish_staged(dst: Location, cfg: ConvertConfig, schema: DatasetSchema, batches: Iterator[list[Sample]],
                    check: Callable[[Path | Location, bool], dict[str, Any] | None],
                    interrupts: SafeInterrupts) -> tuple[WriteResult, dict[str, Any] | None]:
    """Write a new store beside ``dst``, check it, then publish it there (see commit.Staging);
    Ctrl-C or SIGTERM until the moment of publishing publishes nothing."""
    if not dst.local:
        return _publish_remote(dst, cfg, schema, batches, check, interrupts)
    with Staging(Path(dst.path), overwrite=cfg.write.mode == "overwrite") as staging:
        # a new store in the staging folder: "create", whatever --mode said of the destination
        result = FORMATS[cfg.fmt].write(staging.path, schema, batches, replace(cfg.write, mode="create"))
        verified = check(staging.path, True)
        with interrupts.publishing():
            staging.commit()
    result.files = [f.replace(str(staging.path), dst.path, 1) for f in result.files]
    return result, verified


def _publish_remote(dst: Location, cfg: ConvertConfig, schema: DatasetSchema, batches: Iterator[list[Sample]],
                    check: Callable[[Path | Location, bool], dict[str, Any] | None],
                    interrupts: SafeInterrupts) -> tuple[WriteResult, dict[str, Any] | None]:
    """A new store on object storage. A versioned format (Delta): parts uploaded as written, then
    one commit (a failed check removes the new table): it commits in place. Parquet, HDF5:
    written to a local temporary folder
    (each part uploaded as it is complete), then published with the commit record last (see
    converters/publish.py). Ctrl-C or SIGTERM before the commit record (the Delta commit),
    uploads still pending included, publishes nothing and removes what this run uploaded."""
    overwrite = cfg.write.mode == "overwrite"
    verify = (lambda loc: check(loc, True)) if cfg.verify else None
    fmt, versioned = FORMATS[cfg.fmt], versioned_format(cfg.fmt)
    if versioned is not None:  # its log commits it in place
        result = versioned.write(dst, schema, batches, replace(cfg.write, mode="create"),
                                 publishing=interrupts.publishing)
        ours = {record for record in (fmt.commit_record,) if record} | {f.rsplit("/", 1)[-1] for f in result.files}
        try:
            verified = verify(dst) if verify else None
        except BaseException:
            publish.remove(dst, sorted(ours))
            raise
        publish.remove_stale(dst, keep=ours)
        return result, verified
    with tempfile.TemporaryDirectory(prefix="trainfeed-stage-") as tmp:
        staged = Path(tmp) / dst.name  # keeps a single-file HDF5 store's suffix
        with publish.uploader(dst, staged) as parts:
            result = fmt.write(staged, schema, batches, replace(cfg.write, mode="create"), on_part=parts)
            interrupts.check()
            result.files, verified = publish.publish(staged, dst, overwrite, verify, parts, interrupts.publishing)
    return result, verified


def convert(cfg: ConvertConfig, progress: ProgressFn | None = None,
            on_listed: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Convert ``cfg.src`` into a ``cfg.fmt`` store at ``cfg.dst``; returns the run summary.

    Nothing becomes visible at ``cfg.dst`` unless the whole store (and, with ``verify``, its
    check against the source) succeeded; an existing trainfeed store is replaced atomically,
    and nothing else ever is. One run at a time writes a destination (DestinationLock)."""
    check_config(cfg)
    if cfg.workers == 0:
        cfg = replace(cfg, workers=default_workers(cfg.src))
    for url in (cfg.src, cfg.dst, cfg.labels_csv):  # every URL means one place, checked before any work
        check_url(url)
    FORMATS[cfg.fmt].check_url(cfg.dst)
    t0 = time.perf_counter()
    if is_remote(cfg.dst):
        return _convert_to_storage(cfg, t0, progress, on_listed)
    dst = destination_path(cfg.dst)
    check_apart(cfg.src, dst)
    try:
        make_parent(dst)
        with DestinationLock(dst), SafeInterrupts() as interrupts:
            return _convert(cfg, locate(dst), t0, progress, on_listed, interrupts)
    except OSError as exc:  # source errors arrive as TrainfeedErrors: this is DST's filesystem
        if isinstance(exc, TrainfeedError):  # a storage's failure (a remote SRC), naming its URL
            raise
        raise write_error(dst, exc) from exc


def _convert_to_storage(cfg: ConvertConfig, t0: float, progress: ProgressFn | None,
                        on_listed: Callable[[int], None] | None) -> dict[str, Any]:
    """``convert`` to a URL. No lock file: object stores offer none that every one of them
    honours (see converters/publish.py for what concurrent writers get)."""
    dst = locate(cfg.dst, cfg.storage_options)
    check_apart(cfg.src, dst)
    try:
        with SafeInterrupts() as interrupts:
            return _convert(cfg, dst, t0, progress, on_listed, interrupts)
    except (TrainfeedError, UsageError, KeyboardInterrupt):
        raise
    except Exception as exc:  # the storage's own errors (HTTP, credentials, network)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise TrainfeedError(f"{dst.shown}: cannot write to the storage: {type(exc).__name__}: {first}") from exc


def _convert(cfg: ConvertConfig, dst: Location, t0: float, progress: ProgressFn | None,
             on_listed: Callable[[int], None] | None, interrupts: SafeInterrupts) -> dict[str, Any]:
    existing = check_destination(dst, cfg.write.mode)
    fs, listing = list_source(cfg.src, cfg.storage_options)
    labels = resolve_labels(listing.files, labels_csv=cfg.labels_csv, folder_labels=cfg.folder_labels,
                            classes=cfg.classes,
                            storage_options=cfg.storage_options)
    if labels.missing and cfg.on_error == "fail":
        unlabeled = next(f for f in listing.files if f.id == labels.missing[0])
        raise TrainfeedError(f"{unlabeled.path}: no label for id {unlabeled.id!r} in {cfg.labels_csv} "
                             f"({len(labels.missing)} files without a label; --on-error skip converts the rest)")
    if on_listed:
        on_listed(len(listing.files))
    dtypes_found = None
    if cfg.arrays.dtype == AUTO:  # one dtype for all, found in the headers before a sample is written
        dtype, dtypes_found = scan_dtype(fs, listing, cfg.src, cfg.workers)
        cfg = replace(cfg, arrays=replace(cfg.arrays, dtype=dtype))
    # Overwrites and appends of a versioned format (Delta) are commits to the table in place; the rest is staged.
    versioned = versioned_format(cfg.fmt)
    table = _existing_table(versioned, dst) if versioned is not None and existing == cfg.fmt else None
    appending = table is not None and cfg.write.mode == "append"
    if table is not None and appending:
        labels = _labels_for_append(dst.shown, table.schema, labels)
        cfg.write = replace(cfg.write, tensor_column=table.tensor_column)
    stream = SampleStream(cfg, fs, listing, labels, progress, interrupts.check,
                     table.fmt.live_ids(dst, table.version) if table is not None and appending else None)
    first = stream.first()
    schema = stream.schema(labels)
    # A new store gets a new identity; a Delta table keeps its own across commits.
    schema.store_id = (table.schema.store_id if table else None) or uuid.uuid4().hex
    if table is not None and appending and table.schema.fields != schema.fields:
        raise TrainfeedError(f"{dst.shown}: cannot append: table fields {[f.to_dict() for f in table.schema.fields]} "
                             f"differ from the new samples' {[f.to_dict() for f in schema.fields]}")
    batches = stream.batches(first, cfg.write.rows_per_group(first.nbytes))

    # --verify: the written store (Path or Location) against its source
    def check(path: Path | Location, exact: bool) -> dict[str, Any] | None:
        return verify_store(path, cfg.fmt, fs=fs, listing=listing, labels=labels, image_opts=cfg.image,
                            expected_ids=stream.accepted, exact=exact, workers=cfg.workers,
                            arrays=cfg.arrays) if cfg.verify else None

    if table is not None:
        result, verified = _commit_to_table(dst, table, schema, batches, cfg.write,
                                            lambda: check(dst, not appending), interrupts)
    else:
        result, verified = _publish_staged(dst, cfg, schema, batches, check, interrupts)
    rejects_report = write_rejects_report(dst, stream.rejects)
    publish.remove_leftovers(dst)  # what earlier runs left that no reader sees (trials, uncommitted blocks)
    interrupts.after_publishing(dst.shown)  # published: a signal received since ends the run here
    details = dict(result.details)
    if versioned is not None and cfg.optimize:
        details["optimize"] = versioned.optimize(dst, target_size=cfg.write.target_file_size, opts=cfg.write)
    if versioned is not None and cfg.vacuum_hours is not None:
        details["vacuumed_files"] = len(versioned.vacuum(dst, retention_hours=cfg.vacuum_hours))
    if versioned is not None and (cfg.optimize or cfg.vacuum_hours is not None):
        now = versioned.table_result(dst)
        details["version"] = now.details["version"]
        result.files, result.bytes_out = now.files, now.bytes_out
    seconds = time.perf_counter() - t0
    return {
        "format": cfg.fmt,
        "output": dst.shown,
        "source": source_location(cfg.src),
        "mode": cfg.write.mode,
        "samples": len(stream.accepted),
        "rejected": len(stream.rejects),
        "rejects_report": rejects_report,
        "files_in": stream.files_done,
        "files_out": len(result.files),
        "bytes_in": stream.bytes_in,
        "bytes_out": result.bytes_out,
        "payload_bytes": stream.payload_bytes,
        "seconds": round(seconds, 3),
        "mb_per_s": round(stream.bytes_in / seconds / 1e6, 2) if seconds > 0 else None,
        "workers": cfg.workers,
        "compression": cfg.write.compression,
        "labels": labels.origin,
        "label_map": labels.label_map,
        "labels_unmatched": len(labels.unmatched),
        "ignored_files": len(listing.ignored),
        "depth_changed": stream.depth_changed,
        "dtypes_found": dtypes_found,
        "warnings": channels_warnings(schema.fields),
        "fields": [f.to_dict() for f in schema.fields],
        "store_id": schema.store_id,
        "verified": verified,
        **details,
    }
