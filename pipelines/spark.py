"""The one place that returns a Spark session: Databricks' own when running there, else a
local[*] session sized for a laptop or CI machine."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from pyspark import RDD, StatusTracker
    from pyspark.sql import SparkSession

T = TypeVar("T")


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def get_spark(app_name: str = "trainfeed", cores: int | str = "*", driver_memory: str = "2g",
              java_options: str = "") -> SparkSession:
    """``java_options``: the local JVM's flags (ignored on Databricks, and by a session that
    already runs)."""
    from pyspark.sql import SparkSession

    if on_databricks():
        return SparkSession.builder.getOrCreate()
    # Python workers must run this interpreter (the one with pyarrow and trainfeed), not
    # whatever `python3` is first on PATH
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .config("spark.pyspark.python", sys.executable)
        .appName(app_name)
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    return builder.getOrCreate()


def collect(rdd: RDD[T], *, stop_wait: float = 60.0) -> list[T]:
    """``rdd.collect()``; when the job fails, its other tasks are cancelled and waited for
    (up to ``stop_wait`` s) before the error goes up, so that no task of a failed job still
    writes into a folder the caller is about to remove."""
    import time
    import uuid

    sc = rdd.context
    group = f"trainfeed-{uuid.uuid4().hex[:12]}"
    sc.setJobGroup(group, "trainfeed", interruptOnCancel=True)
    try:
        return rdd.collect()
    except BaseException:
        sc.cancelJobGroup(group)
        tracker = sc.statusTracker()
        deadline = time.monotonic() + stop_wait
        while time.monotonic() < deadline and _running_tasks(tracker, group):
            time.sleep(0.1)
        raise
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]  # None clears it; typed str


def _running_tasks(tracker: StatusTracker, group: str) -> int:
    running = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job else ():
            stage = tracker.getStageInfo(stage_id)
            running += stage.numActiveTasks if stage else 0
    return running
