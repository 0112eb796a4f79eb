"""Spark job: repack small files into a trainfeed store, for datasets that outgrow one machine.

One pass: Spark lists and reads the files (binaryFile source) in read tasks of about
--target-file-size bytes each, executors decode and validate them with the same code and
rules as `convert`, and each task writes its samples, sorted by id, as one Parquet file.
Rejected files come back beside the data (an accumulator), for the rejects report and
--on-error. Delta: on Databricks, delta-spark writes the table with trainfeed's column and
commit metadata; here, where Spark's Delta jars cannot be fetched, Spark writes the Parquet
files and delta-rs commits them in one transaction. The result is sample-for-sample what
`convert` writes.

    python -m trainfeed.pipelines.repack --src DIR --dst STORE --to delta [--labels CSV] [--on-error skip]
"""
from __future__ import annotations

import argparse
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import pyarrow as pa

from trainfeed.converters import delta, parquet
from trainfeed.converters.commit import DestinationLock, Staging
from trainfeed.converters.convert import check_apart, check_destination, destination_path, source_location, write_rejects_report
from trainfeed.converters.errors import SampleError, TrainfeedError, UsageError
from trainfeed.converters.labels import Labels, resolve_labels
from trainfeed.converters.layout import DATASET_META, ID, DatasetSchema, arrow_schema, to_record_batch
from trainfeed.converters.options import WriteOptions, parse_size
from trainfeed.converters.samples import SchemaGuard, load_sample
from trainfeed.converters.sources import ImageOptions, Listing, Sample, decode_sample, list_source

from .entry import run_job
from .paths import sample_id, source_root
from .spark import get_spark, on_databricks

if TYPE_CHECKING:
    from pyspark import Accumulator, Broadcast

#: Bytes of source files per Arrow batch handed to a Python worker.
BATCH_BYTES = 32 * 2**20


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="trainfeed.pipelines.repack", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="folder of .npy/.npz/JPEG/PNG files (local, dbfs:/, abfss://, ...)")
    ap.add_argument("--dst", required=True, help="output store (a local path or, on Databricks, a volume path)")
    ap.add_argument("--to", choices=("parquet", "delta"), required=True)
    ap.add_argument("--labels", default=None, help="labels CSV (id,label)")
    ap.add_argument("--on-error", choices=("fail", "skip"), default="fail")
    ap.add_argument("--target-file-size", default="128MB")
    ap.add_argument("--row-group-size", default="32MB")
    ap.add_argument("--compression", default="none", choices=("none", "snappy", "zstd", "lz4", "gzip"))
    ap.add_argument("--tensor-column", default="binary", choices=("binary", "list"))
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--optimize", action="store_true", help="delta: compact the table's files (OPTIMIZE)")
    ap.add_argument("--cores", default="*", help="local Spark only: local[N]")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    args.target_file_size = parse_size(args.target_file_size, "--target-file-size")
    args.row_group_size = parse_size(args.row_group_size, "--row-group-size")
    return args


class _Rejects:
    """A Spark AccumulatorParam (duck-typed: pyspark stays a lazy import) for rejected files:
    lists of {"file", "id", "reason"}, concatenated."""

    def zero(self, value: list) -> list:
        return []

    def addInPlace(self, value1: list, value2: list) -> list:
        value1.extend(value2)
        return value1


def _sample(kind: str, path: str, content: bytes, root: str, labels: dict | None, guard: SchemaGuard) -> Sample:
    """The file Spark listed at ``path`` as a sample, or SampleError with convert's reason."""
    local = path.removeprefix("file:")
    sid = sample_id(path, root)
    if labels is not None and sid not in labels:
        raise SampleError(local, f"no label for id {sid!r} in the labels file")
    sample = Sample(sid, None if labels is None else labels[sid], decode_sample(kind, local, content, ImageOptions()),
                    len(content))
    guard.check(local, sample)
    return sample


def _decoder(kind: str, root: str, guard: SchemaGuard, labels: Broadcast | None, rejects: Accumulator,
             arrow_bytes: bytes) -> Callable:
    """The function executors run on each Arrow batch of (path, content): the accepted samples
    in the store's Arrow layout; each rejected file goes to the ``rejects`` accumulator.
    ``labels``: a broadcast id -> label dict, or None for an unlabeled store."""

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        arrow = pa.ipc.read_schema(pa.py_buffer(arrow_bytes))
        schema = DatasetSchema.from_json(arrow.metadata[DATASET_META.encode()])
        by_id = None if labels is None else labels.value
        for batch in batches:
            ok, bad = [], []
            for path, content in zip(batch.column("path").to_pylist(), batch.column("content").to_pylist()):
                try:
                    ok.append(_sample(kind, path, content, root, by_id, guard))
                except SampleError as err:
                    bad.append({"file": err.path, "id": sample_id(path, root), "reason": err.reason})
            if bad:
                rejects.add(bad)
            if ok:
                yield to_record_batch(ok, schema, arrow)

    return decode


def _spark_type(field: pa.Field) -> str:
    if pa.types.is_binary(field.type):
        return "binary"
    if pa.types.is_list(field.type):
        inner = {"float": "float", "double": "double", "int8": "tinyint", "int16": "smallint", "int32": "int",
                 "int64": "bigint", "uint8": "smallint", "bool": "boolean"}.get(str(field.type.value_type))
        if inner is None:
            raise UsageError(f"--tensor-column list: {field.type.value_type} has no exact Spark type; use binary")
        return f"array<{inner}>"
    return {"string": "string", "int64": "bigint"}[str(field.type)]


def column_metadata(field: pa.Field) -> dict[str, str]:
    """A store column's Arrow field metadata (``trainfeed.field``, ``trainfeed.label_map``) as
    Spark column metadata: what Delta keeps in the table schema, as delta-rs writes it."""
    return {k.decode(): v.decode() for k, v in (field.metadata or {}).items()}


def read_conf(sizes: list[int], target_file_size: int) -> dict[str, str]:
    """Spark SQL settings that size the read tasks by bytes. Spark packs files into a task
    counting each as its length plus ``openCostInBytes`` (default 4 MB: 1 KB files went 32 to
    a task, each task paying a Python worker round trip); counted at the mean file size
    instead, a task of ``2 * target`` counted bytes holds ~``target`` bytes of files, and
    writes one Parquet file of about that size. Arrow batches to Python hold ~BATCH_BYTES."""
    mean = max(1, sum(sizes) // max(1, len(sizes)))
    return {"spark.sql.files.openCostInBytes": str(mean),
            "spark.sql.files.maxPartitionBytes": str(2 * target_file_size),
            "spark.sql.execution.arrow.maxRecordsPerBatch": str(max(1, min(10_000, BATCH_BYTES // mean)))}


@contextmanager
def _session_conf(spark, conf: dict[str, str]) -> Iterator[None]:
    """``conf`` set on the session for the block (the session may be the caller's)."""
    before = {k: spark.conf.get(k) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            spark.conf.set(k, v)


@contextmanager
def _broadcast(sc, value: dict | None) -> Iterator[Broadcast | None]:
    """``value`` shipped once to each executor (not with every task), removed afterwards; None stays None."""
    shared = None if value is None else sc.broadcast(value)
    try:
        yield shared
    finally:
        if shared is not None:
            shared.destroy()


def repack(args: argparse.Namespace, spark=None) -> dict:
    """The Spark job, under the same destination rules as ``convert``: SRC and DST apart, one
    writer at a time, only a store trainfeed wrote (or an empty folder) replaced."""
    dst = destination_path(args.dst)
    check_apart(args.src, dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with DestinationLock(dst):
        check_destination(dst, "overwrite" if args.overwrite else "create")
        return _repack(args, dst, spark or get_spark("trainfeed-repack", cores=args.cores))


def _dataset_schema(args: argparse.Namespace, fs, listing: Listing, labels: Labels) -> tuple[DatasetSchema, SchemaGuard]:
    """The store's schema, fixed by the first valid sample as in convert, and the guard that
    holds every other sample to it."""
    guard = SchemaGuard(listing.kind, ImageOptions())
    for src in listing.files:
        try:
            guard.check(src.path, load_sample(fs, listing.kind, src, labels, ImageOptions()))
            break
        except SampleError:
            continue
    if guard.specs is None:
        raise TrainfeedError(f"{args.src}: no valid samples")
    schema = DatasetSchema(fields=list(guard.specs), labeled=labels.by_id is not None, label_map=labels.label_map,
                           source=source_location(args.src), store_id=uuid.uuid4().hex)
    return schema, guard


def _samples_frame(spark, args: argparse.Namespace, kind: str, decode: Callable, arrow: pa.Schema):
    """The accepted samples as a DataFrame in the store's columns, with their metadata, each
    partition (one read task) sorted by id: what is written, to Parquet or Delta."""
    from pyspark.sql import functions as F

    exts = {"npy": "*.npy", "npz": "*.npz"}.get(kind, "*.{jpg,jpeg,png,JPG,JPEG,PNG}")
    raw = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").option("pathGlobFilter", exts)
           .load(args.src).select("path", "content"))
    ddl = ", ".join(f"`{f.name}` {_spark_type(f)}" for f in arrow)
    decoded = raw.mapInArrow(decode, ddl)
    columns = [F.col(f"`{f.name}`").alias(f.name, metadata=column_metadata(f)) for f in arrow]
    return decoded.select(*columns).sortWithinPartitions(ID)


def _repack(args: argparse.Namespace, dst: Path, spark) -> dict:
    fs, listing = list_source(args.src)
    labels = resolve_labels(listing.files, labels_csv=args.labels)
    if labels.missing and args.on_error == "fail":
        raise TrainfeedError(f"{listing.files[0].path}: {len(labels.missing)} files have no label in {args.labels}, "
                             f"e.g. {labels.missing[0]!r}")
    schema, guard = _dataset_schema(args, fs, listing, labels)
    arrow = arrow_schema(schema, args.tensor_column)
    sc = spark.sparkContext
    rejected = sc.accumulator([], _Rejects())
    databricks_delta = on_databricks() and args.to == "delta"
    with _broadcast(sc, labels.by_id) as by_id, \
            _session_conf(spark, read_conf([f.size for f in listing.files], args.target_file_size)):
        decode = _decoder(listing.kind, source_root(args.src), guard, by_id, rejected, arrow.serialize().to_pybytes())
        good = _samples_frame(spark, args, listing.kind, decode, arrow)
        partitions = good.rdd.getNumPartitions()
        with Staging(dst, overwrite=args.overwrite) as staging:
            if databricks_delta:
                _write_delta_spark(spark, good, staging.path, delta_options(schema, args), args.optimize)
            else:
                _write_parquet(good, staging.path, args)
            rejects = _checked_rejects(rejected.value + _empty_files(listing), args.on_error)
            if databricks_delta:
                schema.samples = delta.read_schema(staging.path).samples  # and trainfeed can read it
            else:
                _finish(staging.path, schema, args)
            staging.commit()
    if args.to == "delta" and args.optimize and not on_databricks():
        delta.optimize(dst, target_size=args.target_file_size,
                       opts=WriteOptions(row_group_size=args.row_group_size, compression=args.compression))
    report = write_rejects_report(dst, rejects)
    return {"format": args.to, "output": str(dst), "samples": schema.samples, "rejected": len(rejects),
            "rejects_report": report, "files_in": len(listing.files), "partitions": partitions,
            "engine": "spark", "spark_master": sc.master}


def _empty_files(listing: Listing) -> list[dict]:
    """Rejects Spark never sees: its file scan skips 0-byte files."""
    return [{"file": f.path, "id": f.id, "reason": "empty file (0 bytes)"} for f in listing.files if f.size == 0]


def _checked_rejects(found: list[dict], on_error: str) -> list[dict]:
    """One entry per rejected file (a retried task reports its rejects again), in file order;
    with --on-error fail, any reject is an error (the staged output is then discarded)."""
    rejects = sorted({r["file"]: r for r in found}.values(), key=lambda r: r["file"])
    if rejects and on_error == "fail":
        first = rejects[0]
        raise TrainfeedError(f"{first['file']}: {first['reason']} ({len(rejects)} rejected; nothing written; "
                             "--on-error skip converts the rest)")
    return rejects


def _write_parquet(df, folder: Path, args: argparse.Namespace) -> None:
    (df.write.option("parquet.block.size", args.row_group_size)
     .option("compression", "uncompressed" if args.compression == "none" else args.compression)
     .parquet(str(folder)))


def _finish(folder: Path, schema: DatasetSchema, args: argparse.Namespace) -> None:
    """Spark's Parquet files made a store: the manifest, or version 0 of a Delta table (delta-rs)."""
    parts = _tidy_parts(folder)
    schema.samples = sum(rows for _, rows in parts)
    if args.to == "parquet":
        parquet.write_manifest(folder, "parquet", schema, [{"file": n, "rows": r} for n, r in parts],
                               writer=f"{parquet.WRITER} (spark)")
    else:
        delta.create_table(folder, [delta.describe_part(folder, n) for n, _ in parts], schema, args.tensor_column)


def _tidy_parts(folder: Path) -> list[tuple[str, int]]:
    """Spark's part files in name order with their row counts; its marker files removed."""
    import pyarrow.parquet as pq

    for junk in list(folder.glob("_SUCCESS")) + list(folder.glob(".*.crc")):
        junk.unlink()
    parts = []
    for f in sorted(folder.glob("part-*.parquet")):
        rows = pq.ParquetFile(f).metadata.num_rows
        if rows == 0:
            f.unlink()
            continue
        parts.append((f.name, rows))
    return parts


def delta_options(schema: DatasetSchema, args: argparse.Namespace) -> dict[str, str]:
    """What the Databricks branch gives delta-spark's writer: trainfeed's commit mark (the
    commit's ``userMetadata``) and the table's target file size."""
    return {"userMetadata": delta.user_metadata(schema), "delta.targetFileSize": str(args.target_file_size)}


def _write_delta_spark(spark, df, path: Path, options: dict[str, str], optimize: bool) -> None:  # pragma: no cover
    """Databricks only (delta-spark cannot run here): the table written by delta-spark."""
    df.write.format("delta").options(**options).save(str(path))
    if optimize:
        spark.sql(f"OPTIMIZE delta.`{path}`")


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and Databricks wheel task); a failure raises SystemExit."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_job(lambda: repack(args), None if args.json else lambda s: (
        f"{s['format']} store written by Spark: {s['output']} ({s['samples']} samples, {s['rejected']} rejected)"))

if __name__ == "__main__":
    sys.exit(main())
