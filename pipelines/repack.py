"""Spark job: repack small files into a trainfeed store, for datasets that outgrow one machine.

The driver lists the source, reads the labels and the first valid sample (which fixes the
schema, as in ``convert``), and cuts the files, in id order, into runs of about
--target-file-size bytes. Each run is one Spark task: an executor reads, checks and writes its
files as one Parquet part with ``convert``'s code and rules (``repack_tasks.py``); only part
names, row counts and rejected files come back. The driver then publishes the parts, staged
beside DST and made visible in one step as ``convert`` does: a Parquet store, or a Delta table
committed by delta-rs. On Databricks, ``--to delta`` is written by delta-spark from the parts
with Delta's own atomic overwrite, at a path (--dst) or as a Unity Catalog table (--table).

    python -m trainfeed.pipelines.repack --src DIR --dst STORE --to delta [--labels CSV] [--on-error skip]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from trainfeed.converters.commit import DestinationLock, Staging
from trainfeed.converters.convert import ON_ERROR, ConvertConfig, write_rejects_report
from trainfeed.converters.destination import check_apart, check_destination, destination_path
from trainfeed.converters.errors import SampleError, TrainfeedError, UsageError
from trainfeed.converters.formats.manifest import WRITER, write_manifest
from trainfeed.converters.formats.options import WriteOptions, parse_size
from trainfeed.converters.formats.parquet import PARQUET
from trainfeed.converters.formats.registry import logged_table_format, table_formats, versioned_format
from trainfeed.converters.layout import CHANNELS, DatasetSchema, arrow_schema
from trainfeed.converters.option_docs import add_option
from trainfeed.converters.redact import redact
from trainfeed.converters.sample_stream import source_location
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions, Sample
from trainfeed.converters.sources.dtypes import AUTO, DTYPE_CHOICES
from trainfeed.converters.sources.labels import Labels, labels_in_source, parse_classes, resolve_labels
from trainfeed.converters.sources.listing import Listing, SourceFile, list_source
from trainfeed.converters.sources.samples import SchemaGuard, load_sample, scan_dtype
from trainfeed.converters.storage.config import parse_storage_options
from trainfeed.pipelines.entry import run_job
from trainfeed.pipelines.paths import fuse_path, spark_path
from trainfeed.pipelines.repack_tasks import ATTEMPTS, TaskContext, TaskResult, plan_tasks, spark_task
from trainfeed.pipelines.spark import collect, get_spark, on_databricks

#: The local JVM only schedules tasks (no sample byte enters it), so the optimizing JIT
#: compiler's warm-up is pure cost: C1 only took the JVM's start-up from ~14 to ~8 CPU-seconds.
SCHEDULER_JVM = "-XX:TieredStopAtLevel=1"


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="trainfeed.pipelines.repack", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="folder of .npy/.npz/JPEG/PNG files: a local or volume path "
                    "(/Volumes/..., read by every node), dbfs:/..., or a cloud URL (abfss://, s3://, ...) read "
                    "with --storage-option credentials")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--dst", help="output store: a local path or, on Databricks, a volume path")
    where.add_argument("--table", help="Databricks, --to delta: write the Unity Catalog table CATALOG.SCHEMA.TABLE "
                       "(saveAsTable; managed unless --table-location)")
    ap.add_argument("--table-location", default=None, help="with --table: an external table at this URL")
    ap.add_argument("--work-dir", default=None, help="with --table: a folder every node reads and writes (a volume "
                    "path) for the intermediate Parquet parts (in a subfolder removed afterwards)")
    ap.add_argument("--to", choices=table_formats(writable=True), required=True, help="the store's format")
    add_option(ap, ConvertConfig, "labels_csv")
    add_option(ap, ConvertConfig, "classes", help_suffix=" Joined by commas.")
    add_option(ap, ArrayOptions, "ragged")
    add_option(ap, ArrayOptions, "dtype", choices=DTYPE_CHOICES, metavar="DTYPE",
               help_suffix=" (auto: the headers are read on the driver.)")
    add_option(ap, ArrayOptions, "channels", choices=CHANNELS)
    add_option(ap, ConvertConfig, "on_error", choices=ON_ERROR)
    add_option(ap, WriteOptions, "target_file_size", help_suffix=" (The Spark job: source bytes per task, one "
               "Parquet file each.)")
    add_option(ap, WriteOptions, "row_group_size")
    add_option(ap, WriteOptions, "compression", choices=PARQUET.COMPRESSIONS)
    add_option(ap, WriteOptions, "tensor_column", choices=("binary", "list"))
    ap.add_argument("--read-threads", type=int, default=0, help="files each task reads at once; 0 = auto: 16 "
                    "for a cloud URL, 4 for a path (a volume's reads wait on the network too)")
    add_option(ap, ConvertConfig, "storage_options", action="append", default=[], metavar="KEY=VALUE",
               dest="storage_option", help_suffix=" KEY=VALUE, once per setting.")
    ap.add_argument("--overwrite", action="store_true", help="replace the store or table if trainfeed wrote it")
    add_option(ap, ConvertConfig, "optimize")
    ap.add_argument("--cores", default="*", help="local Spark only: local[N]")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    for name in ("dst", "work_dir"):
        value = getattr(args, name)
        if value and "://" in value and not value.startswith("file://"):
            ap.error(f"--{name.replace('_', '-')} {value}: must be a path every node can write (a volume path, "
                     "/Volumes/...); for a table at a cloud location use --table with --table-location")
    if args.read_threads < 0:
        ap.error("--read-threads must be 0 (auto) or more")
    if args.table and versioned_format(args.to) is None:
        ap.error("--table writes a Delta table: add --to delta")
    if args.table and not args.work_dir:
        ap.error("--table needs --work-dir: a folder every node can write (a volume path) for the parts")
    if (args.table_location or args.work_dir) and not args.table:
        ap.error("--table-location and --work-dir go with --table")
    try:
        args.target_file_size = parse_size(args.target_file_size, "--target-file-size")
        args.row_group_size = parse_size(args.row_group_size, "--row-group-size")
        args.storage_options = parse_storage_options(args.storage_option)
        args.classes = parse_classes(args.classes)
    except UsageError as exc:
        ap.error(redact(str(exc)))
    for name in ("src", "dst", "labels_csv", "work_dir"):  # dbfs:/... read through the FUSE mount
        if getattr(args, name):
            setattr(args, name, fuse_path(getattr(args, name)))
    if args.work_dir:
        args.work_dir = os.path.abspath(args.work_dir)  # every node resolves it alike
    return args


def column_metadata(field: pa.Field) -> dict[str, str]:
    """A store column's Arrow field metadata (``trainfeed.field``, ``trainfeed.label_map``) as
    Spark column metadata: what Delta keeps in the table schema, as delta-rs writes it."""
    return {k.decode(): v.decode() for k, v in (field.metadata or {}).items()}


@dataclass
class _Staged:
    """The parts the executors wrote, and what they rejected."""
    folder: Path
    schema: DatasetSchema
    arrow: pa.Schema
    parts: list[dict[str, Any]]  # {"file", "rows"}, in id order
    rejects: list[dict[str, Any]]
    files_in: int
    tasks: int


def repack(args: argparse.Namespace, spark: Any = None) -> dict[str, Any]:
    """The Spark job, under the same destination rules as ``convert``: SRC and DST apart, one
    writer at a time, only a store (or table) trainfeed wrote, or an empty folder, replaced."""
    if args.table:
        if not on_databricks():
            raise UsageError("--table writes a Unity Catalog table through delta-spark, which needs Databricks; "
                             "elsewhere write a Delta table at a path with --dst")
        return _repack_to_table(args, spark or get_spark("trainfeed-repack"))
    dst = destination_path(args.dst)
    check_apart(args.src, dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with DestinationLock(dst):
        found = check_destination(dst, "overwrite" if args.overwrite else "create")
        spark = spark or get_spark("trainfeed-repack", cores=args.cores, java_options=SCHEDULER_JVM)
        if on_databricks() and versioned_format(args.to) is not None:
            return _repack_to_delta_path(args, dst, found, spark)
        return _repack_to_folder(args, dst, spark)


def _repack_to_folder(args: argparse.Namespace, dst: Path, spark: Any) -> dict[str, Any]:
    """Parts staged beside DST, made a store (a manifest, or a versioned format's first commit), then renamed."""
    versioned = versioned_format(args.to)
    with Staging(dst, overwrite=args.overwrite) as staging:
        staged = _stage(args, staging.path, spark)
        staged.schema.samples = sum(p["rows"] for p in staged.parts)
        if versioned is None:
            write_manifest(staging.path, args.to, staged.schema, staged.parts, writer=f"{WRITER} (spark)")
        else:
            versioned.create_table(staging.path, [p["file"] for p in staged.parts], staged.schema, args.tensor_column)
        staging.commit()
    if versioned is not None and args.optimize:
        versioned.optimize(dst, target_size=args.target_file_size,
                           opts=WriteOptions(row_group_size=args.row_group_size, compression=args.compression))
    return _summary(args, str(dst), staged, spark, write_rejects_report(dst, staged.rejects))


def _repack_to_delta_path(args: argparse.Namespace, dst: Path, found: str | None, spark: Any) -> dict[str, Any]:
    """Databricks: delta-spark writes the staged parts as the Delta table at DST, replacing a
    trainfeed Delta table there with Delta's own atomic overwrite (a new version)."""
    if found not in (None, args.to):
        raise TrainfeedError(f"{dst}: holds a trainfeed {found} store, which Delta's overwrite would not remove; "
                             "delete it or choose another --dst")
    with Staging(dst) as staging:  # never committed: only the parts' folder, removed afterwards
        staged = _stage(args, staging.path, spark)
        target = DeltaTarget(path=spark_path(str(dst)))
        _write_delta_spark(spark, _parts_frame(spark, staged), target, delta_options(staged.schema, args),
                           overwrite=found is not None, optimize=args.optimize)
    staged.schema.samples = logged_table_format().read_schema(dst).samples  # and trainfeed reads it
    return _summary(args, str(dst), staged, spark, write_rejects_report(dst, staged.rejects))


def _repack_to_table(args: argparse.Namespace, spark: Any) -> dict[str, Any]:
    """Databricks: delta-spark writes the staged parts as a Unity Catalog table (``saveAsTable``),
    replacing only a table trainfeed wrote."""
    name = quoted_table(args.table)
    exists = spark.catalog.tableExists(args.table)
    check_table(args.table, _table_history(spark, name) if exists else None, args.overwrite)
    work = Path(args.work_dir) / f".trainfeed-repack-{uuid.uuid4().hex[:12]}"
    try:
        staged = _stage(args, work, spark)
        target = DeltaTarget(table=name, location=args.table_location)
        _write_delta_spark(spark, _parts_frame(spark, staged), target, delta_options(staged.schema, args),
                           overwrite=exists, optimize=args.optimize)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    staged.schema.samples = spark.read.table(name).count()
    summary = _summary(args, args.table, staged, spark, None)
    summary["rejects"] = staged.rejects  # no folder to put a report beside
    return summary


def _summary(args: argparse.Namespace, output: str, staged: _Staged, spark: Any, report: str | None) -> dict[str, Any]:
    return {"format": args.to, "output": output, "samples": staged.schema.samples, "rejected": len(staged.rejects),
            "rejects_report": report, "files_in": staged.files_in, "partitions": staged.tasks,
            "engine": "spark", "spark_master": spark.sparkContext.master}


def _first_sample(args: argparse.Namespace, fs: Any, listing: Listing, labels: Labels, arrays: ArrayOptions
                  ) -> tuple[Sample, SchemaGuard]:
    """The first valid sample, which fixes the store's fields as in convert, and the guard
    that holds every other sample to them."""
    guard = SchemaGuard(listing.kind, ImageOptions(), arrays=arrays)
    reasons = []
    for src in listing.files:
        try:
            sample = guard.take(src.path, load_sample(fs, listing.kind, src, labels, ImageOptions()))
            return sample, guard
        except SampleError as err:
            reasons.append(str(err))
        except OSError as exc:
            raise TrainfeedError(f"{src.path}: cannot read: {exc}") from exc
    raise TrainfeedError(f"{args.src}: no valid samples ({len(reasons)} rejected: {'; '.join(reasons[:3])})")


def _stage(args: argparse.Namespace, folder: Path, spark: Any) -> _Staged:
    """List, plan, and have the executors write every task's part into ``folder``. Raises
    (nothing published) on a reject under --on-error fail."""
    fs, listing = list_source(args.src, args.storage_options)
    labels_csv = args.labels_csv or labels_in_source(args.src, args.storage_options)
    labels = resolve_labels(listing.files, labels_csv=labels_csv, storage_options=args.storage_options,
                            classes=args.classes)
    if labels.missing and args.on_error == "fail":
        unlabeled = next(f for f in listing.files if f.id == labels.missing[0])
        raise TrainfeedError(f"{unlabeled.path}: no label for id {unlabeled.id!r} in {labels_csv} "
                             f"(files without a label: {len(labels.missing)} of {len(listing.files)}; nothing written)")
    read_threads = args.read_threads or (16 if "://" in args.src else 4)
    dtype = scan_dtype(fs, listing, args.src, read_threads)[0] if args.dtype == AUTO else args.dtype
    arrays = ArrayOptions(ragged=args.ragged, dtype=dtype, channels=args.channels)
    first, guard = _first_sample(args, fs, listing, labels, arrays)
    assert guard.specs is not None  # the first sample fixed them
    schema = DatasetSchema(fields=list(guard.specs), labeled=labels.by_id is not None, label_map=labels.label_map,
                           source=source_location(args.src), store_id=uuid.uuid4().hex)
    write = WriteOptions(row_group_size=args.row_group_size, compression=args.compression,
                         tensor_column=args.tensor_column)
    ctx = TaskContext(src=args.src, storage_options=args.storage_options, kind=listing.kind, schema=schema,
                      specs=list(guard.specs), first_id=first.id, staging=str(folder), write=write,
                      sample_nbytes=max(1, first.nbytes), on_error=args.on_error, read_threads=read_threads,
                      arrays=arrays)
    sc = spark.sparkContext
    tasks = plan_tasks(listing.files, task_bytes(listing.files, args.target_file_size, sc.defaultParallelism))
    by_id = labels.by_id
    rows = [(i, files, None if by_id is None else {f.id: by_id[f.id] for f in files if f.id in by_id})
            for i, files in enumerate(tasks)]
    # tasks create their attempt folders in here, never its parents: a task still starting when
    # a failed job's folder is removed cannot bring the folder back
    (folder / ATTEMPTS).mkdir(parents=True, exist_ok=True)
    try:
        results: list[TaskResult] = _collect(sc.parallelize(rows, len(rows)).mapPartitions(spark_task(ctx)))
        rejects = _checked_rejects([r for res in results for r in res.rejects], args.on_error)
        parts = []
        for part in (p for res in sorted(results, key=lambda r: r.index) for p in res.parts):
            # out of its attempt's folder; whatever other attempts wrote stays behind, and goes
            os.replace(folder / ATTEMPTS / part["attempt"] / part["file"], folder / part["file"])
            parts.append({"file": part["file"], "rows": part["rows"]})
    finally:
        shutil.rmtree(folder / ATTEMPTS, ignore_errors=True)
    return _Staged(folder, schema, arrow_schema(schema, args.tensor_column), parts, rejects, len(listing.files),
                   len(tasks))


def task_bytes(files: list[SourceFile], target_file_size: int, cores: int) -> int:
    """Bytes of source files per task: ``target_file_size``, or less when the dataset would
    then make fewer tasks than the cluster has cores (smaller files, no idle core)."""
    return max(1, min(target_file_size, sum(f.size for f in files) // max(1, cores)))


_TASK_ERROR = re.compile(r"trainfeed\.converters\.errors\.\w+: (.+)")


def _collect(rdd: Any) -> list[Any]:
    """The tasks' results; a task that failed on trainfeed's own error (a file it could not
    read) fails the job with that message, not Spark's stack of Java and Python traces."""
    try:
        return collect(rdd)
    except Exception as exc:  # Py4JJavaError / PythonException: the task's traceback is in the text
        found = _TASK_ERROR.search(str(exc))
        if found is None:
            raise
        raise TrainfeedError(f"a Spark task failed: {found.group(1)}") from None


def _checked_rejects(found: list[dict[str, Any]], on_error: str) -> list[dict[str, Any]]:
    """One entry per rejected file, in file order; with --on-error fail, any reject is an error
    (nothing is published)."""
    rejects = sorted(found, key=lambda r: r["file"])
    if rejects and on_error == "fail":
        first = rejects[0]
        raise TrainfeedError(f"{first['file']}: {first['reason']} (nothing written; "
                             "--on-error skip converts the rest)")
    return rejects


def _parts_frame(spark: Any, staged: _Staged) -> Any:
    """The staged parts as a DataFrame in the store's columns, with trainfeed's column metadata."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(*[spark_path(str(staged.folder / p["file"])) for p in staged.parts])
    return frame.select(*[F.col(f"`{f.name}`").alias(f.name, metadata=column_metadata(f)) for f in staged.arrow])


_TABLE_PART = re.compile(r"[^`.\x00-\x1f]+")


def quoted_table(name: str) -> str:
    """``catalog.schema.table`` (or a shorter name) with each part in backquotes, for SQL; a
    usage error for a name Unity Catalog would not take."""
    parts = name.split(".")
    if not 1 <= len(parts) <= 3 or not all(_TABLE_PART.fullmatch(p) for p in parts):
        raise UsageError(f"--table {name!r}: expected CATALOG.SCHEMA.TABLE (no backquotes or control characters)")
    return ".".join(f"`{p}`" for p in parts)


def check_table(name: str, history: list[dict[str, Any]] | None, overwrite: bool) -> None:
    """Refuse to replace a table unless --overwrite and trainfeed committed to it. ``history``:
    the table's Delta history rows (None: no such table; [] when it has none, e.g. not Delta)."""
    if history is None:
        return
    if not overwrite:
        raise TrainfeedError(f"table {name} already exists; pass --overwrite to replace it")
    if not any(logged_table_format().marked_commit(row) for row in history):
        raise TrainfeedError(f"table {name} was not written by trainfeed; refusing to replace it "
                             "(--overwrite replaces only a table trainfeed wrote)")


def _table_history(spark: Any, name: str) -> list[dict[str, Any]]:  # pragma: no cover - needs delta-spark
    """The table's commits (``userMetadata`` and the rest); [] for a table without a Delta history."""
    from pyspark.errors import AnalysisException

    try:
        return [row.asDict() for row in spark.sql(f"DESCRIBE HISTORY {name}").collect()]
    except AnalysisException:  # not a Delta table: no history, so not trainfeed's
        return []


def delta_options(schema: DatasetSchema, args: argparse.Namespace) -> dict[str, str]:
    """What the Databricks branch gives delta-spark's writer: trainfeed's commit mark (the
    commit's ``userMetadata``), the table's target file size, and the Parquet settings the
    parts were written with (delta-spark rewrites them)."""
    return {"userMetadata": logged_table_format().user_metadata(schema),
            "compression": "uncompressed" if args.compression == "none" else args.compression,
            "parquet.block.size": str(args.row_group_size), "delta.targetFileSize": str(args.target_file_size)}


@dataclass(frozen=True)
class DeltaTarget:
    """Where delta-spark writes: a path, or a catalog table (external when ``location``)."""
    path: str | None = None
    table: str | None = None
    location: str | None = None

    @property
    def sql(self) -> str:
        return self.table or f"delta.`{self.path}`"


def _write_delta_spark(spark: Any, df: Any, target: DeltaTarget, options: dict[str, str], overwrite: bool,
                       optimize: bool) -> None:  # pragma: no cover - needs delta-spark (Databricks)
    """Databricks only: delta-spark writes ``df``, in one commit; with ``overwrite`` as a new
    version of the table (its schema may change), else only where no table is."""
    writer = df.write.format("delta").options(**options)
    writer = writer.mode("overwrite").option("overwriteSchema", "true") if overwrite else writer.mode("errorifexists")
    if target.table:
        if target.location:
            writer = writer.option("path", target.location)
        writer.saveAsTable(target.table)
    else:
        writer.save(target.path)
    if optimize:
        spark.sql(f"OPTIMIZE {target.sql}")


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and Databricks wheel task); a failure raises SystemExit."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_job(lambda: repack(args), None if args.json else lambda s: (
        f"{s['format']} store written by Spark: {s['output']} ({s['samples']} samples, {s['rejected']} rejected)"))

if __name__ == "__main__":
    sys.exit(main())
