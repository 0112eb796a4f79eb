"""The Spark repack beyond the bundle's parameters: the Databricks Delta branch's output read by
trainfeed, and rejects as a side output of the one pass."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import trainfeed
from trainfeed.converters import delta, parquet
from tests.conftest import run_cli, write_volumes

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SHAPE = (12, 12, 4, 2)


def delta_spark_stand_in(spark, df, path: Path, options: dict[str, str], optimize: bool) -> None:
    """What delta-spark's ``df.write.format("delta").options(**options).save(path)`` leaves,
    made without its jars: Spark writes ``df``'s Parquet files, delta-rs commits them as
    version 0 with the table schema Delta takes from the DataFrame (``df.schema.json()``, the
    column metadata included), per-file ``numRecords`` stats, and ``options["userMetadata"]``
    as the commit's ``userMetadata``."""
    from deltalake import CommitProperties, Schema
    from deltalake.transaction import AddAction, create_table_with_add_actions

    df.write.parquet(str(path))
    actions = []
    for part in sorted(path.glob("part-*.parquet")):
        described = delta.describe_part(path, part.name)
        if described.rows:
            actions.append(AddAction(part.name, described.size, {}, described.written_ms, True,
                                     json.dumps({"numRecords": described.rows})))
    create_table_with_add_actions(str(path), Schema.from_json(df.schema.json()), actions, mode="error",
                                  commit_properties=CommitProperties(custom_metadata={"userMetadata": options["userMetadata"]}))


def schema_metadata(table_path: Path) -> dict[str, dict]:
    """Column name -> the metadata the Delta log's table schema holds for it."""
    fields = json.loads(delta.open_table(table_path).schema().to_json())["fields"]
    return {f["name"]: f["metadata"] for f in fields}


def test_the_databricks_delta_branch_writes_a_table_trainfeed_reads(tmp_path, spark, monkeypatch):
    from trainfeed.converters.cli import app
    from trainfeed.converters.stores import identify
    from trainfeed.pipelines import repack

    src = tmp_path / "raw"
    truth = write_volumes(src, 30, shape=SHAPE, seed=7)
    monkeypatch.setattr(repack, "on_databricks", lambda: True)
    monkeypatch.setattr(repack, "_write_delta_spark", delta_spark_stand_in)
    dst = tmp_path / "spark.delta"
    args = repack.parse_args(["--src", str(src), "--dst", str(dst), "--to", "delta", "--labels", str(src / "labels.csv"),
                              "--target-file-size", "64KB", "--optimize"])
    summary = repack.repack(args, spark)
    assert summary["samples"] == 30 and summary["rejected"] == 0

    assert run_cli(app, src, tmp_path / "convert.delta", "--to", "delta", "--labels", src / "labels.csv",
                   "--no-progress").exit_code == 0
    assert schema_metadata(dst) == schema_metadata(tmp_path / "convert.delta")  # the column metadata
    assert identify(dst).what == "a Delta table written by trainfeed"  # the commit mark
    recorded = delta.read_schema(dst)
    assert (recorded.labeled, recorded.samples, recorded.field("volume").shape) == (True, 30, SHAPE)
    assert recorded.store_id and recorded.source == str(src)

    store = trainfeed.open_store(str(dst))
    assert (store.format, store.samples, store.shape, store.dtype) == ("delta", 30, SHAPE, "float32")
    got = {}
    for batch in store.batches(batch_size=8, shuffle=False):
        for sid, x, y in zip(batch.ids, batch.x, batch.y):
            got[sid] = (int(y), x.tobytes())
    assert got == {sid: (label, arr.tobytes()) for sid, (arr, label) in truth.items()}


def broken_source(src: Path) -> dict:
    """20 volumes, 4 of which convert rejects: corrupt, another shape, empty, no label."""
    truth = write_volumes(src, 20, shape=SHAPE, seed=5)
    (src / "v003.npy").write_bytes(b"\x93NUMPY broken")
    np.save(src / "v004.npy", np.zeros((2, 2), np.float32))
    (src / "v005.npy").write_bytes(b"")
    labels = (src / "labels.csv").read_text().splitlines()
    (src / "labels.csv").write_text("\n".join(line for line in labels if not line.startswith("v006,")) + "\n")
    return {sid: v for sid, v in truth.items() if sid not in ("v003", "v004", "v005", "v006")}


@pytest.mark.parametrize("to", ["parquet", "delta"])
def test_rejects_are_a_side_output_and_the_rest_is_written_bit_for_bit(tmp_path, spark, to):
    from trainfeed.converters.cli import app
    from trainfeed.pipelines import repack

    src = tmp_path / "raw"
    good = broken_source(src)
    conf_before = {k: spark.conf.get(k) for k in repack.read_conf([1], 1)}
    common = ["--src", str(src), "--to", to, "--labels", str(src / "labels.csv"), "--target-file-size", "32KB"]
    with pytest.raises(Exception, match="files have no label"):
        repack.repack(repack.parse_args(common + ["--dst", str(tmp_path / "failed")]), spark)
    summary = repack.repack(repack.parse_args(common + ["--dst", str(tmp_path / "out"), "--on-error", "skip"]), spark)
    assert (summary["samples"], summary["rejected"]) == (16, 4)
    assert {k: spark.conf.get(k) for k in conf_before} == conf_before  # the caller's session as it was

    res = run_cli(app, src, tmp_path / "convert", "--to", to, "--labels", src / "labels.csv", "--on-error", "skip",
                  "--no-progress")
    assert res.exit_code == 0, res.stderr
    rejects = Path(summary["rejects_report"]).read_text()
    assert rejects == (tmp_path / "convert.rejects.jsonl").read_text()  # file, id and reason: convert's, in order
    assert [json.loads(line)["id"] for line in rejects.splitlines()] == ["v003", "v004", "v005", "v006"]
    fmt = delta if to == "delta" else parquet
    written = {s: (lab, f["volume"].tobytes()) for s, lab, f in fmt.read_samples(tmp_path / "out")}
    assert written == {s: (lab, arr.tobytes()) for s, (arr, lab) in good.items()}


def test_a_reject_with_on_error_fail_leaves_nothing(tmp_path, spark):
    from trainfeed.pipelines import repack

    src = tmp_path / "raw"
    write_volumes(src, 6, shape=SHAPE, seed=5, labels_csv=False)
    (src / "v002.npy").write_bytes(b"")
    args = repack.parse_args(["--src", str(src), "--dst", str(tmp_path / "o.delta"), "--to", "delta"])
    with pytest.raises(Exception, match=r"v002.npy: empty file \(0 bytes\) \(1 rejected; nothing written"):
        repack.repack(args, spark)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]  # no store, no staging folder, no lock


def test_read_tasks_are_sized_by_bytes():
    from trainfeed.pipelines.repack import read_conf

    conf = read_conf([1000] * 20_000, 128 * 2**20)
    # 1 KB files count as 2 KB each: a 256 MB task holds 128 MB of them, not the 32 the default 4 MB open cost allows
    assert conf["spark.sql.files.openCostInBytes"] == "1000"
    assert conf["spark.sql.files.maxPartitionBytes"] == str(256 * 2**20)
    assert read_conf([360_000] * 10, 2**20)["spark.sql.execution.arrow.maxRecordsPerBatch"] == str(32 * 2**20 // 360_000)
