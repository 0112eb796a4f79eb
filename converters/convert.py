"""convert(): list, decode, validate and write a small-file dataset as one compacted store."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from . import delta
from .commit import Staging
from .errors import SampleError, TrainfeedError, UsageError
from .labels import Labels, resolve_labels
from .layout import DatasetSchema
from .options import COMPRESSIONS, WriteOptions
from .samples import SchemaGuard, load_sample, ordered_map
from .sources import ImageOptions, Sample, list_source
from .stores import FORMATS, detect_format
from .verify import verify_store

ON_ERROR = ("fail", "skip")
REJECTS_SUFFIX = ".rejects.jsonl"

ProgressFn = Callable[[int, int], None]  # (files done, bytes read so far)


@dataclass
class ConvertConfig:
    src: str
    dst: str
    fmt: str
    write: WriteOptions = field(default_factory=WriteOptions)
    image: ImageOptions = field(default_factory=ImageOptions)
    labels_csv: str | None = None
    folder_labels: bool = True
    workers: int = 4
    on_error: str = "fail"
    verify: bool = False
    optimize: bool = False
    vacuum_hours: int | None = None
    storage_options: dict[str, str] = field(default_factory=dict)


def check_config(cfg: ConvertConfig) -> None:
    """Usage errors (exit 2): options that cannot work together."""
    if cfg.fmt not in FORMATS:
        raise UsageError(f"--to must be one of {', '.join(FORMATS)}, not {cfg.fmt!r}")
    if cfg.on_error not in ON_ERROR:
        raise UsageError(f"--on-error must be 'fail' or 'skip', not {cfg.on_error!r}")
    if cfg.write.compression not in COMPRESSIONS[cfg.fmt]:
        raise UsageError(f"--compression {cfg.write.compression!r} is not available for {cfg.fmt} "
                         f"(choose from {', '.join(COMPRESSIONS[cfg.fmt])})")
    if cfg.write.mode == "append" and cfg.fmt != "delta":
        raise UsageError("--mode append works only with --to delta (Delta commits make appends atomic)")
    if (cfg.optimize or cfg.vacuum_hours is not None) and cfg.fmt != "delta":
        raise UsageError("--optimize and --vacuum-hours apply to --to delta only")
    if cfg.workers < 1:
        raise UsageError("--workers must be at least 1")
    if "://" in cfg.dst and not cfg.dst.startswith("file://"):
        raise UsageError(f"{cfg.dst}: remote destinations are not supported yet; write locally and upload the store")


def _check_destination(cfg: ConvertConfig, dst: Path) -> str | None:
    """Refuse to touch what must not be touched. Returns the existing store's format, if any."""
    if not (dst.exists() or dst.is_symlink()):
        return None
    existing = detect_format(dst)
    if cfg.write.mode == "create":
        extra = " or --mode append" if existing == "delta" else ""
        raise TrainfeedError(f"{dst}: destination already exists; pass --overwrite{extra} to replace it")
    empty_dir = dst.is_dir() and not any(dst.iterdir())
    if existing is None and not empty_dir:
        raise TrainfeedError(f"{dst}: exists and is not a trainfeed store; refusing to replace it")
    if cfg.write.mode == "append" and existing != "delta":
        raise TrainfeedError(f"{dst}: --mode append needs an existing Delta table here, found {existing or 'an empty folder'}")
    return existing


class _Stream:
    """Validated samples in batches; collects rejects and counts bytes as the writer pulls."""

    def __init__(self, cfg: ConvertConfig, fs, listing, labels: Labels, progress: ProgressFn | None,
                 existing_ids: set[str] | None = None):
        self.cfg, self.fs, self.listing, self.labels = cfg, fs, listing, labels
        self.progress = progress
        self.existing_ids = existing_ids or set()
        self.guard = SchemaGuard(listing.kind, cfg.image)
        self.rejects: list[dict] = []
        self.accepted: list[str] = []
        self.files_done = self.bytes_in = self.payload_bytes = 0
        self._samples = self._validated()

    def _reject(self, err: SampleError, sample_id: str) -> None:
        if self.cfg.on_error == "fail":
            raise err
        self.rejects.append({"file": err.path, "id": sample_id, "reason": err.reason})

    def _validated(self) -> Iterator[Sample]:
        files = self.listing.files
        load = lambda src: load_sample(self.fs, self.listing.kind, src, self.labels, self.cfg.image)  # noqa: E731
        for src, result in zip(files, ordered_map(load, files, self.cfg.workers)):
            self.files_done += 1
            if isinstance(result, Sample):
                self.bytes_in += result.nbytes_in
                try:
                    if result.id in self.existing_ids:
                        raise SampleError(src.path, f"id {result.id!r} is already in the Delta table")
                    self.guard.check(src.path, result)
                except SampleError as err:
                    self._reject(err, src.id)
                else:
                    self.accepted.append(result.id)
                    self.payload_bytes += result.nbytes
                    yield result
            elif isinstance(result, SampleError):
                self._reject(result, src.id)
            else:
                raise result
            if self.progress:
                self.progress(self.files_done, self.bytes_in)

    def first(self) -> Sample:
        for sample in self._samples:
            return sample
        reasons = "; ".join(f"{r['file']}: {r['reason']}" for r in self.rejects[:3])
        raise TrainfeedError(f"{self.cfg.src}: no valid samples ({len(self.rejects)} rejected: {reasons})")

    def batches(self, first: Sample, rows: int) -> Iterator[list[Sample]]:
        batch = [first]
        for sample in self._samples:
            if len(batch) >= rows:
                yield batch
                batch = []
            batch.append(sample)
        if batch:
            yield batch

    def schema(self, labels: Labels) -> DatasetSchema:
        return DatasetSchema(fields=list(self.guard.specs), labeled=labels.by_id is not None,
                             label_map=labels.label_map, source=redact_url(self.cfg.src))


def redact_url(url: str) -> str:
    """Drop query strings (SAS tokens) and user info from a URL before it is stored anywhere."""
    if "://" not in url:
        return os.path.abspath(url)
    scheme, rest = url.split("://", 1)
    rest = rest.split("?", 1)[0]
    host, _, path = rest.partition("/")
    return f"{scheme}://{host.rsplit('@', 1)[-1]}/{path}"


def _existing_delta_ids(dst: Path) -> set[str]:
    import pyarrow.dataset as ds

    files = delta.data_files(dst)
    return set(ds.dataset(files, format="parquet").to_table(columns=["id"]).column("id").to_pylist()) if files else set()


def write_rejects_report(dst: Path, rejects: list[dict]) -> str | None:
    report = dst.parent / (dst.name + REJECTS_SUFFIX)
    if not rejects:
        report.unlink(missing_ok=True)
        return None
    tmp = report.with_name(report.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rejects))
    os.replace(tmp, report)
    return str(report)


def convert(cfg: ConvertConfig, progress: ProgressFn | None = None,
            on_listed: Callable[[int, int], None] | None = None) -> dict:
    """Convert ``cfg.src`` into a ``cfg.fmt`` store at ``cfg.dst``; returns the run summary.

    Nothing becomes visible at ``cfg.dst`` unless the whole store (and, with ``verify``, its
    check against the source) succeeded; an existing store is replaced atomically."""
    check_config(cfg)
    t0 = time.perf_counter()
    dst = Path(cfg.dst.removeprefix("file://")).absolute()
    existing = _check_destination(cfg, dst)
    fs, listing = list_source(cfg.src, cfg.storage_options)
    labels = resolve_labels(listing.files, labels_csv=cfg.labels_csv, folder_labels=cfg.folder_labels,
                            storage_options=cfg.storage_options)
    if labels.missing and cfg.on_error == "fail":
        first = next(f for f in listing.files if f.id == labels.missing[0])
        raise TrainfeedError(f"{first.path}: no label for id {first.id!r} in {cfg.labels_csv} "
                             f"({len(labels.missing)} files without a label; --on-error skip converts the rest)")
    if on_listed:
        on_listed(len(listing.files), sum(f.size for f in listing.files))
    in_place = cfg.fmt == "delta" and existing == "delta"
    stream = _Stream(cfg, fs, listing, labels, progress,
                     _existing_delta_ids(dst) if in_place and cfg.write.mode == "append" else None)
    first = stream.first()
    schema = stream.schema(labels)
    if in_place and cfg.write.mode == "append":
        cfg.write = replace(cfg.write, tensor_column=delta.tensor_column(dst))
        current = delta.read_schema(dst)
        if not current.same_content_as(schema):
            raise TrainfeedError(f"{dst}: cannot append: table fields {[f.to_dict() for f in current.fields]} "
                                 f"differ from the new samples' {[f.to_dict() for f in schema.fields]}")
    writer = FORMATS[cfg.fmt].write
    rows = cfg.write.rows_per_group(first.nbytes)
    verified = None
    if in_place:
        # Delta's log makes the write atomic: a killed run leaves only unreferenced files.
        before = delta.open_table(dst).version()
        result = writer(dst, schema, stream.batches(first, rows), cfg.write)
        if cfg.verify:
            try:
                verified = verify_store(dst, cfg.fmt, fs=fs, listing=listing, labels=labels, image_opts=cfg.image,
                                        expected_ids=stream.accepted, exact=cfg.write.mode != "append", workers=cfg.workers)
            except Exception:
                delta.open_table(dst).restore(before)
                raise
    else:
        with Staging(dst) as staging:
            target = staging.path
            # a new store in the staging folder: "create", whatever --mode said of the destination
            result = writer(target, schema, stream.batches(first, rows), replace(cfg.write, mode="create"))
            if cfg.verify:
                verified = verify_store(target, cfg.fmt, fs=fs, listing=listing, labels=labels, image_opts=cfg.image,
                                        expected_ids=stream.accepted, exact=True, workers=cfg.workers)
            staging.commit()
        result.files = [f.replace(str(target), str(dst), 1) for f in result.files]
    details = dict(result.details)
    if cfg.optimize:
        details["optimize"] = delta.optimize(dst, target_size=cfg.write.target_file_size, opts=cfg.write)
    if cfg.vacuum_hours is not None:
        details["vacuumed_files"] = len(delta.vacuum(dst, retention_hours=cfg.vacuum_hours))
    if cfg.optimize or cfg.vacuum_hours is not None:
        out = delta.open_table(dst)
        details["version"] = out.version()
        result.files = out.file_uris()
        result.bytes_out = sum(os.path.getsize(f.removeprefix("file://")) for f in result.files)
    seconds = time.perf_counter() - t0
    return {
        "format": cfg.fmt,
        "output": str(dst),
        "source": redact_url(cfg.src),
        "mode": cfg.write.mode,
        "samples": len(stream.accepted),
        "rejected": len(stream.rejects),
        "rejects_report": write_rejects_report(dst, stream.rejects),
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
        "fields": [f.to_dict() for f in schema.fields],
        "verified": verified,
        **details,
    }
