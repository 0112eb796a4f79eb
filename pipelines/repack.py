"""Spark job: repack small files into a trainfeed store, for datasets that outgrow one machine.

Spark lists and reads the files (binaryFile source), executors decode and validate them
with the same code and rules as `convert` (rejects report, --on-error), and the output is
written as Parquet with a target file size (partitions by bytes, not by a fixed count).
Delta: on Databricks, delta-spark writes the table and runs OPTIMIZE (ZORDER BY id); here,
where Spark's Delta jars cannot be fetched, Spark writes the Parquet files and delta-rs
commits them in one transaction. The result is sample-for-sample what `convert` writes.

    python -m trainfeed.pipelines.repack --src DIR --dst STORE --to delta [--labels CSV] [--on-error skip]
"""
from __future__ import annotations

import argparse
import math
import sys
import uuid
from pathlib import Path

import pyarrow as pa

from trainfeed.converters import delta, parquet
from trainfeed.converters.commit import DestinationLock, Staging
from trainfeed.converters.convert import check_apart, check_destination, destination_path, source_location, write_rejects_report
from trainfeed.converters.errors import SampleError, TrainfeedError, UsageError
from trainfeed.converters.labels import resolve_labels
from trainfeed.converters.layout import DATASET_META, ID, DatasetSchema, arrow_schema, to_record_batch
from trainfeed.converters.options import WriteOptions, parse_size
from trainfeed.converters.samples import SchemaGuard, load_sample
from trainfeed.converters.sources import ImageOptions, Sample, decode_sample, list_source

from .entry import run_job
from .paths import sample_id, source_root
from .spark import get_spark, on_databricks

PATH, ERROR = "_path", "_error"


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
    ap.add_argument("--optimize", action="store_true", help="delta: OPTIMIZE (ZORDER BY id on Databricks)")
    ap.add_argument("--cores", default="*", help="local Spark only: local[N]")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    args.target_file_size = parse_size(args.target_file_size, "--target-file-size")
    args.row_group_size = parse_size(args.row_group_size, "--row-group-size")
    return args


def _decoder(kind: str, root: str, specs, first_id: str, labels_by_id, labeled: bool, arrow_bytes: bytes):
    """The function executors run on each Arrow batch of (path, content): decoded samples in
    the store's Arrow layout, plus _path and _error columns (rejects carry only the error)."""

    def decode(batches):
        arrow = pa.ipc.read_schema(pa.py_buffer(arrow_bytes))
        schema = DatasetSchema.from_json(arrow.metadata[DATASET_META.encode()])
        guard = SchemaGuard(kind, ImageOptions())
        guard.specs, guard.first_id = specs, first_id
        out_schema = arrow.append(pa.field(PATH, pa.string())).append(pa.field(ERROR, pa.string()))
        for batch in batches:
            ok, ok_paths, bad = [], [], []
            for path, content in zip(batch.column("path").to_pylist(), batch.column("content").to_pylist()):
                local = path.removeprefix("file:")
                sid = sample_id(path, root)
                try:
                    if labeled and sid not in labels_by_id:
                        raise SampleError(local, f"no label for id {sid!r} in the labels file")
                    if not content:
                        raise SampleError(local, "empty file (0 bytes)")
                    sample = Sample(sid, labels_by_id.get(sid) if labeled else None,
                                    decode_sample(kind, local, bytes(content), ImageOptions()), len(content))
                    guard.check(local, sample)
                except SampleError as err:
                    bad.append((local, sid, err.reason))
                    continue
                ok.append(sample)
                ok_paths.append(local)
            if ok:
                rb = to_record_batch(ok, schema, arrow)
                yield pa.RecordBatch.from_arrays(rb.columns + [pa.array(ok_paths, pa.string()), pa.nulls(len(ok), pa.string())],
                                                 schema=out_schema)
            if bad:
                cols = [pa.array([b[1] for b in bad], pa.string()), pa.nulls(len(bad), pa.int64())]
                cols += [pa.nulls(len(bad), f.type) for f in arrow][2:]
                cols += [pa.array([b[0] for b in bad], pa.string()), pa.array([b[2] for b in bad], pa.string())]
                yield pa.RecordBatch.from_arrays(cols, schema=out_schema)

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


def repack(args: argparse.Namespace, spark=None) -> dict:
    """The Spark job, under the same destination rules as ``convert``: SRC and DST apart, one
    writer at a time, only a store trainfeed wrote (or an empty folder) replaced."""
    dst = destination_path(args.dst)
    check_apart(args.src, dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with DestinationLock(dst):
        check_destination(dst, "overwrite" if args.overwrite else "create")
        return _repack(args, dst, spark or get_spark("trainfeed-repack", cores=args.cores))


def _repack(args: argparse.Namespace, dst: Path, spark) -> dict:
    fs, listing = list_source(args.src)
    labels = resolve_labels(listing.files, labels_csv=args.labels)
    if labels.missing and args.on_error == "fail":
        raise TrainfeedError(f"{listing.files[0].path}: {len(labels.missing)} files have no label in {args.labels}, "
                             f"e.g. {labels.missing[0]!r}")
    # the first valid sample fixes the schema, as in convert
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
    arrow = arrow_schema(schema, args.tensor_column)
    root = source_root(args.src)
    decode = _decoder(listing.kind, root, guard.specs, guard.first_id, labels.by_id or {}, schema.labeled,
                      arrow.serialize().to_pybytes())
    out_fields = list(arrow) + [pa.field(PATH, pa.string()), pa.field(ERROR, pa.string())]
    ddl = ", ".join(f"`{f.name}` {_spark_type(f)}" for f in out_fields)
    exts = {"npy": "*.npy", "npz": "*.npz"}.get(listing.kind, "*.{jpg,jpeg,png,JPG,JPEG,PNG}")
    raw = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").option("pathGlobFilter", exts)
           .load(args.src).select("path", "content"))
    decoded = raw.mapInArrow(decode, ddl).persist()
    rejects = [{"file": r[PATH], "id": r[ID], "reason": r[ERROR]}
               for r in decoded.filter(f"{ERROR} IS NOT NULL").select(PATH, ID, ERROR).collect()]
    rejects += [{"file": f.path, "id": f.id, "reason": "no label in the labels file"}
                for f in listing.files if f.id in set(labels.missing)]
    rejects.sort(key=lambda r: r["file"])  # Spark's order is not the listing's
    if rejects and args.on_error == "fail":
        decoded.unpersist()
        first = rejects[0]
        raise TrainfeedError(f"{first['file']}: {first['reason']} ({len(rejects)} rejected; nothing written; "
                             "--on-error skip converts the rest)")
    good = decoded.filter(f"{ERROR} IS NULL").drop(PATH, ERROR)
    payload = sum(f.size for f in listing.files)
    partitions = max(1, math.ceil(payload / args.target_file_size))
    good = good.repartition(partitions).sortWithinPartitions(ID)
    with Staging(dst, overwrite=args.overwrite) as staging:
        if on_databricks() and args.to == "delta":  # pragma: no cover - needs a Databricks runtime
            _write_delta_spark(spark, good, staging.path, args)
        else:
            (good.write.option("parquet.block.size", args.row_group_size)
             .option("compression", "uncompressed" if args.compression == "none" else args.compression)
             .parquet(str(staging.path)))
            parts = _tidy_parts(staging.path)
            schema.samples = sum(p[1] for p in parts)
            if args.to == "parquet":
                parquet.write_manifest(staging.path, "parquet", schema, [{"file": n, "rows": r} for n, r in parts],
                                       writer=f"{parquet.WRITER} (spark)")
            else:
                delta.create_table(staging.path, [delta.describe_part(staging.path, n) for n, _ in parts], schema,
                                   args.tensor_column)
        staging.commit()
    decoded.unpersist()
    if args.to == "delta" and args.optimize and not on_databricks():
        delta.optimize(dst, target_size=args.target_file_size,
                       opts=WriteOptions(row_group_size=args.row_group_size, compression=args.compression))
    report = write_rejects_report(dst, rejects)
    return {"format": args.to, "output": str(dst), "samples": schema.samples, "rejected": len(rejects),
            "rejects_report": report, "files_in": len(listing.files), "partitions": partitions,
            "engine": "spark", "spark_master": spark.sparkContext.master}


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


def _write_delta_spark(spark, df, path: Path, args) -> None:  # pragma: no cover - Databricks only
    """On Databricks: delta-spark writes the table; OPTIMIZE compacts and ZORDERs by id."""
    df.write.format("delta").option("delta.targetFileSize", str(args.target_file_size)).save(str(path))
    if args.optimize:
        spark.sql(f"OPTIMIZE delta.`{path}` ZORDER BY ({ID})")


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and Databricks wheel task); a failure raises SystemExit."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_job(lambda: repack(args), None if args.json else lambda s: (
        f"{s['format']} store written by Spark: {s['output']} ({s['samples']} samples, {s['rejected']} rejected)"))

if __name__ == "__main__":
    sys.exit(main())
