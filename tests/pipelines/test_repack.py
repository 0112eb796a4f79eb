"""The Spark repack beyond the bundle's parameters: the Databricks Delta branches' output (a
path, a catalog table) read back, rejects reported by the tasks, retried tasks, cloud sources."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import trainfeed
from tests.conftest import run_cli, write_volumes
from trainfeed.converters.formats import delta, parquet

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SHAPE = (12, 12, 4, 2)


def delta_spark_stand_in(spark, df, target, options: dict[str, str], overwrite: bool, optimize: bool) -> None:
    """What delta-spark's ``df.write.format("delta").options(**options).save(path)`` leaves,
    made without its jars: Spark writes ``df``'s Parquet files, delta-rs commits them as
    version 0 with the table schema Delta takes from the DataFrame (``df.schema.json()``, the
    column metadata included), per-file ``numRecords`` stats, and ``options["userMetadata"]``
    as the commit's ``userMetadata``."""
    from deltalake import CommitProperties, Schema
    from deltalake.transaction import AddAction, create_table_with_add_actions

    assert target.table is None and not overwrite
    path = Path(target.path)
    df.write.parquet(str(path))
    actions = []
    for part in sorted(path.glob("part-*.parquet")):
        described = delta.describe_part(path, part.name)
        if described.rows:
            actions.append(AddAction(part.name, described.size, {}, described.written_ms, True,
                                     json.dumps({"numRecords": described.rows})))
    create_table_with_add_actions(str(path), Schema.from_json(df.schema.json()), actions, mode="error",
                                  commit_properties=CommitProperties(
                                      custom_metadata={"userMetadata": options["userMetadata"]}))


def schema_metadata(table_path: Path) -> dict[str, dict]:
    """Column name -> the metadata the Delta log's table schema holds for it."""
    fields = json.loads(delta.open_table(table_path).schema().to_json())["fields"]
    return {f["name"]: f["metadata"] for f in fields}


def test_the_databricks_delta_branch_writes_a_table_trainfeed_reads(tmp_path, spark, monkeypatch):
    from trainfeed.converters.cli import app
    from trainfeed.converters.formats.registry import identify
    from trainfeed.pipelines import repack

    src = tmp_path / "raw"
    truth = write_volumes(src, 30, shape=SHAPE, seed=7)
    monkeypatch.setattr(repack, "on_databricks", lambda: True)
    monkeypatch.setattr(repack, "_write_delta_spark", delta_spark_stand_in)
    dst = tmp_path / "spark.delta"
    args = repack.parse_args(["--src", str(src), "--dst", str(dst), "--to", "delta",
                              "--labels", str(src / "labels.csv"), "--target-file-size", "64KB", "--optimize"])
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

    # and `train` trains on it
    from trainfeed.training.cli import app as train_app

    res = run_cli(train_app, "--data", dst, "--epochs", "1", "--out", tmp_path / "run", "--width", "4",
                  "--batch-size", "8", "--workers", "1", "--no-progress", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["steps"] == 30 // 8


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
def test_rejects_are_reported_and_the_rest_is_written_bit_for_bit(tmp_path, spark, to):
    from trainfeed.converters.cli import app
    from trainfeed.pipelines import repack

    src = tmp_path / "raw"
    good = broken_source(src)
    common = ["--src", str(src), "--to", to, "--labels", str(src / "labels.csv"), "--target-file-size", "32KB"]
    with pytest.raises(Exception, match=r"v006.npy: no label for id 'v006' in .*labels.csv "
                                        r"\(files without a label: 1 of 20; nothing"):
        repack.repack(repack.parse_args([*common, "--dst", str(tmp_path / "failed")]), spark)
    summary = repack.repack(repack.parse_args([*common, "--dst", str(tmp_path / "out"), "--on-error", "skip"]), spark)
    assert (summary["samples"], summary["rejected"]) == (16, 4)

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
    with pytest.raises(Exception, match=r"v002.npy: empty file \(0 bytes\) \(nothing written"):
        repack.repack(args, spark)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]  # no store, no staging folder, no lock


def test_tasks_are_runs_of_consecutive_ids_of_about_the_target_size():
    from trainfeed.converters.sources.listing import SourceFile
    from trainfeed.pipelines.repack_tasks import plan_tasks

    files = [SourceFile(f"v{i:03d}", f"/d/v{i:03d}.npy", size) for i, size in enumerate([40, 40, 40, 100, 10, 10])]
    tasks = plan_tasks(files, 100)
    assert [[f.id for f in t] for t in tasks] == [["v000", "v001"], ["v002"], ["v003"], ["v004", "v005"]]
    assert plan_tasks([], 100) == []


def test_task_attempts_write_apart(tmp_path):
    """Two attempts of one task (Spark retries a failed one; the first may still be writing)
    write into folders of their own, each a whole part of the task's files in id order."""
    import pyarrow.parquet as pq

    from trainfeed.converters.formats.options import WriteOptions
    from trainfeed.converters.sources.decode import ImageOptions
    from trainfeed.converters.sources.labels import Labels
    from trainfeed.converters.sources.listing import list_source
    from trainfeed.converters.sources.samples import SchemaGuard, load_sample
    from trainfeed.pipelines import repack
    from trainfeed.pipelines.repack_tasks import ATTEMPTS, TaskContext, run_task

    src = tmp_path / "raw"
    truth = write_volumes(src, 5, shape=SHAPE, seed=3, labels_csv=False)
    fs, listing = list_source(str(src))
    first = load_sample(fs, "npy", listing.files[0], Labels(None), ImageOptions())
    guard = SchemaGuard("npy", ImageOptions())
    guard.check(listing.files[0].path, first)
    schema = repack.DatasetSchema(fields=list(guard.specs), labeled=False)
    ctx = TaskContext(str(src), {}, "npy", schema, list(guard.specs), "v000", str(tmp_path / "staging"),
                      WriteOptions(), first.nbytes, "fail", 2)
    (tmp_path / "staging" / ATTEMPTS).mkdir(parents=True)  # the driver's part
    results = [run_task(ctx, 7, attempt, listing.files, None) for attempt in (0, 1)]
    assert [p["attempt"] for r in results for p in r.parts] == ["7-0", "7-1"]
    for r in results:
        (part,) = r.parts
        table = pq.read_table(tmp_path / "staging" / ATTEMPTS / part["attempt"] / part["file"])
        assert table.column("id").to_pylist() == sorted(truth)
        assert [bytes(b) for b in table.column("volume").to_pylist()] == [truth[k][0].tobytes() for k in sorted(truth)]


def test_small_datasets_are_spread_over_every_core():
    from trainfeed.converters.sources.listing import SourceFile
    from trainfeed.pipelines.repack import task_bytes

    files = [SourceFile(f"v{i}", f"/d/v{i}.npy", 1000) for i in range(100)]
    assert task_bytes(files, 128 * 2**20, 8) == 12_500  # 100 KB over 8 cores
    assert task_bytes(files * 10_000, 1000, 8) == 1000  # large: the target
    assert task_bytes([], 1000, 8) == 1


def external_table_stand_in(spark, df, target, options: dict[str, str], overwrite: bool, optimize: bool) -> None:
    """delta-spark's ``saveAsTable`` made with what local Spark has: the same DataFrame saved
    as an external Parquet table of Spark's catalog at ``target.location``."""
    assert target.table and target.location and not optimize
    df.write.format("parquet").mode("overwrite" if overwrite else "errorifexists").option(
        "path", target.location).saveAsTable(target.table)


def test_a_catalog_table_is_written_and_only_a_trainfeed_table_replaced(tmp_path, spark, monkeypatch):
    from trainfeed.converters.cli import app
    from trainfeed.pipelines import repack

    src = tmp_path / "raw"
    good = broken_source(src)
    monkeypatch.setattr(repack, "on_databricks", lambda: True)
    monkeypatch.setattr(repack, "_write_delta_spark", external_table_stand_in)
    work = tmp_path / "volume"
    work.mkdir()
    common = ["--src", str(src), "--to", "delta", "--labels", str(src / "labels.csv"), "--work-dir", str(work),
              "--on-error", "skip", "--target-file-size", "32KB"]
    name = "default.trainfeed_volumes"
    summary = repack.repack(repack.parse_args([*common, "--table", name, "--table-location", str(tmp_path / "t")]),
                            spark)
    try:
        assert (summary["output"], summary["samples"], summary["rejected"]) == (name, 16, 4)
        assert [r["id"] for r in summary["rejects"]] == ["v003", "v004", "v005", "v006"]
        assert list(work.iterdir()) == []  # the parts' folder is gone
        rows = spark.read.table(name).collect()
        assert {r["id"]: (r["label"], bytes(r["volume"])) for r in rows} == {
            sid: (label, arr.tobytes()) for sid, (arr, label) in good.items()}
        # the table's columns carry trainfeed's metadata, as in the Delta table convert writes
        assert run_cli(app, src, tmp_path / "convert.delta", "--to", "delta", "--labels", src / "labels.csv",
                       "--on-error", "skip", "--no-progress").exit_code == 0
        assert {f.name: f.metadata for f in spark.table(name).schema} == schema_metadata(tmp_path / "convert.delta")

        again = repack.parse_args([*common, "--table", name])
        with pytest.raises(Exception, match="already exists; pass --overwrite"):
            repack.repack(again, spark)
        # not a table trainfeed committed to (this one has no Delta history): never replaced
        with pytest.raises(Exception, match="was not written by trainfeed; refusing"):
            repack.repack(repack.parse_args([*common, "--table", name, "--overwrite"]), spark)
        assert spark.read.table(name).count() == 16
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


@pytest.mark.parametrize("argv,message", [
    (["--table", "main.ml.vols", "--to", "parquet", "--work-dir", "/w"], "--table writes a Delta table"),
    (["--table", "main.ml.vols", "--to", "delta"], "--table needs --work-dir"),
    (["--dst", "/o", "--to", "delta", "--table-location", "abfss://c@a.dfs.core.windows.net/t"], "go with --table"),
    (["--dst", "/o", "--table", "main.ml.vols", "--to", "delta"], "not allowed with argument"),
    (["--dst", "abfss://out@acct.dfs.core.windows.net/vols.delta", "--to", "delta"],
     "must be a path every node can write"),
    (["--table", "main.ml.vols", "--to", "delta", "--work-dir", "s3://b/tmp"], "must be a path every node can write"),
    (["--dst", "/o", "--to", "delta", "--read-threads", "-1"], "--read-threads must be 0 (auto) or more"),
    (["--dst", "/o", "--to", "delta", "--target-file-size", "lots"], "--target-file-size: cannot parse 'lots'"),
    # a mistyped credential is not echoed
    (["--dst", "/o", "--to", "delta", "--storage-option", "account_key:PLANTED-SECRET"],
     "--storage-option expects KEY=VALUE"),
])
def test_options_that_do_not_fit_are_usage_errors(argv, message, capsys):
    from trainfeed.pipelines import repack

    with pytest.raises(SystemExit) as exc:
        repack.parse_args(["--src", "/in", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and "PLANTED" not in err


def test_a_table_off_databricks_is_refused_with_what_to_do_instead(tmp_path, capsys):
    from trainfeed.pipelines import repack

    src = tmp_path / "raw"
    write_volumes(src, 2, shape=SHAPE, seed=1, labels_csv=False)
    with pytest.raises(SystemExit) as exc:  # as the wheel-task launcher calls it
        repack.main(["--src", str(src), "--table", "main.ml.vols", "--to", "delta", "--work-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert "needs Databricks; elsewhere write a Delta table at a path with --dst" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


@pytest.mark.parametrize("name,quoted", [
    ("main.ml.vols", "`main`.`ml`.`vols`"), ("ml.vols", "`ml`.`vols`"), ("my-cat.ml.v 1", "`my-cat`.`ml`.`v 1`"),
    ("a.b.c.d", None), ("main..vols", None), ("main.ml.`x`", None), ("", None),
])
def test_table_names(name, quoted):
    from trainfeed.converters.errors import UsageError
    from trainfeed.pipelines.repack import quoted_table

    if quoted is None:
        with pytest.raises(UsageError, match="expected CATALOG.SCHEMA.TABLE"):
            quoted_table(name)
    else:
        assert quoted_table(name) == quoted


def test_only_a_table_trainfeed_committed_to_is_replaced():
    from trainfeed.converters.formats import delta as delta_format
    from trainfeed.converters.layout import DatasetSchema
    from trainfeed.pipelines.repack import check_table

    ours = {"version": 0, "userMetadata": delta_format.user_metadata(DatasetSchema(fields=[], labeled=False))}
    theirs = {"version": 1, "userMetadata": '{"team": "vision"}'}
    check_table("t", None, overwrite=False)  # no table yet
    check_table("t", [theirs, ours], overwrite=True)  # trainfeed wrote it (later commits may be anyone's)
    with pytest.raises(Exception, match="already exists; pass --overwrite"):
        check_table("t", [ours], overwrite=False)
    for history in ([theirs], [], [{"version": 0, "userMetadata": None}]):
        with pytest.raises(Exception, match="not written by trainfeed"):
            check_table("t", history, overwrite=True)


@pytest.mark.azurite
def test_a_cloud_source_and_names_spark_would_hide_give_convert_s_ids(tmp_path, spark, azurite_server):
    """An abfss:// source read with storage options by the driver and the executors, holding
    names Spark's own file listing skips (a leading underscore): the same samples, under the
    same ids, as convert writes."""
    import fsspec

    from trainfeed.converters.cli import app
    from trainfeed.pipelines import repack

    local = tmp_path / "raw"
    arrays = {f"pos/{k}": arr for k, (arr, _) in write_volumes(local / "pos", 5, shape=SHAPE, seed=11,
                                                                labels_csv=False).items()}
    arrays.update({f"_neg/{k}": arr for k, (arr, _) in write_volumes(local / "_neg", 4, shape=SHAPE, seed=12,
                                                                      labels_csv=False).items()})
    arrays["pos/_extra"] = np.ones(SHAPE, np.float32)
    np.save(local / "pos" / "_extra.npy", arrays["pos/_extra"])
    fs = fsspec.filesystem("abfs", **azurite_server.storage_options)
    fs.mkdir("repack-src")
    fs.put(str(local) + "/", "repack-src/vols", recursive=True)
    url = "abfss://repack-src@devstoreaccount1.dfs.core.windows.net/vols"
    option = f"connection_string={azurite_server.connection_string}"
    summary = repack.repack(repack.parse_args(["--src", url, "--storage-option", option, "--dst",
                                               str(tmp_path / "spark.parquet"), "--to", "parquet"]), spark)
    assert run_cli(app, url, tmp_path / "convert.parquet", "--to", "parquet", "--storage-option", option,
                   "--no-progress").exit_code == 0
    ours = {s: (lab, f["volume"].tobytes()) for s, lab, f in parquet.read_samples(tmp_path / "spark.parquet")}
    assert ours == {s: (lab, f["volume"].tobytes()) for s, lab, f in parquet.read_samples(tmp_path / "convert.parquet")}
    assert summary["samples"] == 10
    assert {s: x for s, (_, x) in ours.items()} == {s: arr.tobytes() for s, arr in arrays.items()}


def test_a_file_a_task_cannot_read_fails_the_job_with_trainfeed_s_message(tmp_path, spark, monkeypatch, capsys):
    """A file gone between the driver's listing and its task: the job fails naming it, and
    nothing is published."""
    from trainfeed.pipelines import repack

    src = tmp_path / "raw"
    write_volumes(src, 4, shape=SHAPE, seed=2, labels_csv=False)
    plan = repack.plan_tasks

    def plan_then_lose_a_file(files, target_bytes):
        tasks = plan(files, target_bytes)
        (src / "v002.npy").unlink()
        return tasks

    monkeypatch.setattr(repack, "plan_tasks", plan_then_lose_a_file)
    with pytest.raises(SystemExit) as exc:
        repack.main(["--src", str(src), "--dst", str(tmp_path / "out.parquet"), "--to", "parquet"])
    assert exc.value.code == 1
    assert capsys.readouterr().err.startswith(f"error: {src / 'v002.npy'}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


@pytest.mark.azurite
def test_a_storage_failure_in_a_task_fails_the_job_with_trainfeed_s_message(tmp_path, spark, azurite_server,
                                                                             monkeypatch, capsys):
    """The storage fails (HTTP 503 on every request, through a relay) once the driver has
    listed the source and read its first file: the executors' reads are retried until the
    call timeout, then the job fails with the message convert gives (exit 1), not Spark's
    traces, and publishes nothing."""
    import fsspec

    from tests.converters.storage.relay import Relay
    from trainfeed.pipelines import repack

    write_volumes(tmp_path / "raw", 3, shape=SHAPE, seed=4, labels_csv=False)
    fs = fsspec.filesystem("abfs", **azurite_server.storage_options)
    fs.mkdir("repack-slow")
    fs.put(str(tmp_path / "raw") + "/", "repack-slow/vols", recursive=True)
    plan = repack.plan_tasks
    with Relay(azurite_server.endpoint) as relay:
        def failing_plan(files, size):
            relay.fail(100_000, 503)
            return plan(files, size)

        monkeypatch.setattr(repack, "plan_tasks", failing_plan)
        relayed = azurite_server.connection_string.replace(azurite_server.endpoint, relay.endpoint)
        with pytest.raises(SystemExit) as exc:
            repack.main(["--src", "abfs://repack-slow/vols", "--storage-option", f"connection_string={relayed}",
                         "--storage-option", "call_timeout=2", "--dst", str(tmp_path / "out.parquet"),
                         "--to", "parquet"])
    err = capsys.readouterr().err
    assert exc.value.code == 1
    assert err.startswith("error: a Spark task failed: ") and "answered HTTP 503" in err, err
    assert "Traceback" not in err and "AccountKey" not in err
    assert relay.count("status 503") > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


@pytest.mark.parametrize("to", ["parquet", "delta"])
def test_real_data_options_write_what_convert_writes(tmp_path, spark, to):
    """--ragged, --dtype auto, --channels and --classes on Spark: the store holds what `convert`
    with the same options holds, sample for sample."""
    from tests.converters.test_ragged import write_ragged
    from trainfeed.pipelines import repack

    src = tmp_path / "raw"
    write_ragged(src, 12)
    for i in range(0, 12, 4):  # some samples in another dtype: auto takes one holding both
        np.save(src / f"s{i:02d}.npy", np.abs(np.load(src / f"s{i:02d}.npy")).astype(np.uint16))
    (src / "labels.csv").write_text("id,label\n" + "".join(f"s{i:02d},{'ab'[i % 2]}\n" for i in range(12)))
    options = ["--ragged", "--dtype", "auto", "--channels", "last", "--classes", "b,a,c"]
    summary = repack.repack(repack.parse_args(["--src", str(src), "--to", to, "--dst", str(tmp_path / "spark"),
                                               "--target-file-size", "2KB", *options]), spark)
    assert summary["samples"] == 12 and summary["partitions"] > 1
    made = trainfeed.convert(str(src), str(tmp_path / "convert"), format=to, ragged=True, dtype="auto",
                             channels="last", classes=["b", "a", "c"])
    fmt = delta if to == "delta" else parquet
    spark_schema, convert_schema = fmt.read_schema(tmp_path / "spark"), fmt.read_schema(tmp_path / "convert")
    assert spark_schema.fields == convert_schema.fields and spark_schema.label_map == {"b": 0, "a": 1, "c": 2}
    assert made.fields[0] == {"name": "volume", "dtype": "int32", "shape": None, "encoding": "raw",
                              "channels": "last"}
    rows = {}
    for name in ("spark", "convert"):
        rows[name] = {s: (lab, f["volume"].dtype.str, f["volume"].shape, f["volume"].tobytes())
                      for s, lab, f in fmt.read_samples(tmp_path / name)}
    assert rows["spark"] == rows["convert"] and len(rows["spark"]) == 12
