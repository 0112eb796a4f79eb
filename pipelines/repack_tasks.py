"""The executors' side of the Spark repack: each Spark task is a run of files, read, checked
and written as Parquet parts by the same code as ``convert``; only names, counts and
rejects go back to the driver.

The file bytes never enter the JVM: profiled on 1 GB of volumes, handing them through Spark
(binaryFile -> Arrow -> Python -> Arrow -> Spark's Parquet writer) cost the JVM alone ~10
CPU-seconds on a warm session, more than ``convert``'s whole job; this way the job spends
~2.7x ``convert``'s CPU per GB beyond Spark's start-up (docs/BENCHMARKS.md).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfeed.converters.errors import SampleError, TrainfeedError
from trainfeed.converters.formats.options import WriteOptions
from trainfeed.converters.formats.parquet_writer import write_parts
from trainfeed.converters.layout import DatasetSchema, FieldSpec
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions, Sample
from trainfeed.converters.sources.labels import Labels
from trainfeed.converters.sources.listing import SourceFile
from trainfeed.converters.sources.samples import SchemaGuard, load_sample, ordered_map
from trainfeed.converters.storage.filesystems import open_fs


def plan_tasks(files: list[SourceFile], target_bytes: int) -> list[list[SourceFile]]:
    """The files (in id order) cut into runs of about ``target_bytes`` each: one Spark task,
    one Parquet part per run, so a part holds consecutive ids and is written in id order."""
    tasks: list[list[SourceFile]] = []
    run: list[SourceFile] = []
    size = 0
    for f in files:
        if run and size + f.size > target_bytes:
            tasks.append(run)
            run, size = [], 0
        run.append(f)
        size += f.size
    if run:
        tasks.append(run)
    return tasks


@dataclass(frozen=True)
class TaskContext:
    """What every task needs, shipped once with the job (small: no file list, no labels)."""
    src: str
    storage_options: dict[str, Any]
    kind: str
    schema: DatasetSchema
    specs: list[FieldSpec]  # every sample's fields, fixed by the first valid sample (``first_id``)
    first_id: str
    staging: str  # the folder the parts are written to, the same path on the driver and executors
    write: WriteOptions
    sample_nbytes: int  # of the first sample: rows per row group, as convert sizes them
    on_error: str
    read_threads: int  # files read at once by a task (reads from a volume or a cloud URL wait on the network)
    #: --ragged, --dtype (already found when auto), --channels
    arrays: ArrayOptions = field(default_factory=ArrayOptions)


@dataclass
class TaskResult:
    index: int
    parts: list[dict[str, Any]] = field(default_factory=list)  # {"file", "rows", "attempt"}
    rejects: list[dict[str, Any]] = field(default_factory=list)  # {"file", "id", "reason"}


#: Each task attempt writes into STAGING/ATTEMPTS/<task>-<attempt>/: a retried task never
#: writes over an attempt that may still be running, and only the parts of the attempts Spark
#: returned are moved out (the driver removes the rest with the folder).
ATTEMPTS = "_attempts"


def part_name(index: int, n: int) -> str:
    return f"part-{index:05d}-{n:03d}.parquet"


def run_task(ctx: TaskContext, index: int, attempt: int, files: list[SourceFile],
             labels: dict[str, int] | None) -> TaskResult:
    """Read, check and write one task's files. A rejected file is reported, not written;
    with on_error "fail" the task stops at the first one (the driver then writes nothing)."""
    guard = SchemaGuard(ctx.kind, ImageOptions(), ctx.specs, ctx.first_id, ctx.arrays)
    fs, _ = open_fs(ctx.src, ctx.storage_options)
    by_id = Labels(labels)
    result = TaskResult(index)

    def accepted() -> Iterator[Sample]:
        load = lambda src: load_sample(fs, ctx.kind, src, by_id, ImageOptions())  # noqa: E731
        for src, got in zip(files, ordered_map(load, files, ctx.read_threads)):
            if isinstance(got, Sample):
                try:
                    got = guard.take(src.path, got)
                except SampleError as err:
                    got = err
            if isinstance(got, Sample):
                yield got
            elif isinstance(got, SampleError):
                result.rejects.append({"file": got.path, "id": src.id, "reason": got.reason})
                if ctx.on_error == "fail":
                    return
            elif isinstance(got, OSError):
                raise TrainfeedError(f"{src.path}: cannot read: {got}") from got
            else:
                raise got

    def batches() -> Iterator[list[Sample]]:
        rows = ctx.write.rows_per_group(ctx.sample_nbytes)
        batch: list[Sample] = []
        for sample in accepted():
            batch.append(sample)
            if len(batch) >= rows:
                yield batch
                batch = []
        if batch:
            yield batch

    # one part per task: the plan sized the task to the target file size
    whole_task = WriteOptions(target_file_size=2**62, row_group_size=ctx.write.row_group_size,
                              compression=ctx.write.compression, tensor_column=ctx.write.tensor_column)
    folder = Path(ctx.staging) / ATTEMPTS / f"{index}-{attempt}"
    folder.mkdir()  # the driver made its parent; gone means the job was given up
    parts = write_parts(folder, ctx.schema, batches(), whole_task, part_name=lambda n: part_name(index, n))
    result.parts = [{"file": p.file, "rows": p.rows, "attempt": folder.name} for p in parts]
    return result


#: What Spark hands a partition's function: (index, files, labels) per task.
TaskRows = Iterator[tuple[int, list[SourceFile], dict[str, int] | None]]


def spark_task(ctx: TaskContext) -> Callable[[TaskRows], Iterator[TaskResult]]:
    """The function Spark runs on each partition: one (index, files, labels) per partition."""

    def run(rows: TaskRows) -> Iterator[TaskResult]:
        from pyspark import TaskContext as SparkTask

        task = SparkTask.get()
        assert task is not None  # this runs inside a Spark task
        attempt = task.attemptNumber()
        for index, files, labels in rows:
            yield run_task(ctx, index, attempt, files, labels)

    return run
