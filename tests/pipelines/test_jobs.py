"""Every job entry point end to end on local Spark, with the parameters the bundle passes
(variables substituted with local paths)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli, write_volumes
from tests.pipelines.test_bundle import bundle, jobs
from trainfeed.converters.formats import delta, parquet

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def params(job: str, task: str, variables: dict) -> list[str]:
    doc = bundle()
    values = {k: v.get("default") for k, v in doc["variables"].items()} | variables
    t = next(t for t in jobs()[job]["tasks"] if t["task_key"] == task)
    return [re.sub(r"\$\{var\.(\w+)\}", lambda m: str(values[m.group(1)]), p)
            for p in t["python_wheel_task"]["parameters"]]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("jobs")
    src = root / "raw"
    truth = write_volumes(src, 48, shape=(12, 12, 4, 2), seed=4)
    return root, src, truth


def local_vars(root, src) -> dict:
    return {"source_path": str(src), "labels_csv": str(src / "labels.csv"), "output_path": str(root / "out"),
            "target_file_size": "64KB", "dataset_samples": "1000"}


def test_repack_job_equals_convert_sample_for_sample(source, spark, capsys):
    from trainfeed.converters.cli import app
    from trainfeed.pipelines import repack

    root, src, truth = source
    args = repack.parse_args(params("repack", "repack_delta", local_vars(root, src)))
    summary = repack.repack(args, spark)
    assert summary["samples"] == len(truth) and summary["rejected"] == 0
    assert summary["partitions"] >= 2  # ~400 KB of payload at a 64 KB target: partitioned by bytes
    res = run_cli(app, src, root / "convert.delta", "--to", "delta", "--labels", src / "labels.csv", "--no-progress")
    assert res.exit_code == 0
    by_spark = {s: (lab, f["volume"].tobytes()) for s, lab, f in delta.read_samples(args.dst)}
    by_convert = {s: (lab, f["volume"].tobytes()) for s, lab, f in delta.read_samples(root / "convert.delta")}
    assert by_spark == by_convert
    assert by_spark == {s: (lab, arr.tobytes()) for s, (arr, lab) in truth.items()}
    assert delta.read_schema(args.dst).field("volume").shape == (12, 12, 4, 2)


def test_repack_parquet_and_bad_files(source, spark, tmp_path):
    from trainfeed.pipelines import repack

    _, _, _truth = source
    src = tmp_path / "raw"
    write_volumes(src, 20, shape=(12, 12, 4, 2), seed=4, labels_csv=False)
    (src / "v003.npy").write_bytes(b"\x93NUMPY broken")
    np.save(src / "v004.npy", np.zeros((2, 2), np.float32))
    args = repack.parse_args(["--src", str(src), "--dst", str(tmp_path / "o.parquet"), "--to", "parquet"])
    with pytest.raises(Exception, match="v003.npy: corrupt or truncated .npy") as err:
        repack.repack(args, spark)
    assert "nothing written" in str(err.value) and not (tmp_path / "o.parquet").exists()
    args = repack.parse_args(["--src", str(src), "--dst", str(tmp_path / "o.parquet"), "--to", "parquet",
                              "--on-error", "skip", "--tensor-column", "list"])
    summary = repack.repack(args, spark)
    assert summary["samples"] == 18 and summary["rejected"] == 2
    rejects = [json.loads(line) for line in Path(summary["rejects_report"]).read_text().splitlines()]
    assert {r["id"] for r in rejects} == {"v003", "v004"}
    got = {s for s, _, _ in parquet.read_samples(tmp_path / "o.parquet")}
    assert got == {f"v{i:03d}" for i in range(20)} - {"v003", "v004"}


def test_repack_missing_parameter_is_a_clear_error(capsys):
    from trainfeed.pipelines import repack

    with pytest.raises(SystemExit) as exit_:
        repack.parse_args(["--src", "x", "--to", "delta"])
    assert exit_.value.code == 2 and "--dst" in capsys.readouterr().err


def test_storage_ab_job_tasks_and_report(source, tmp_path):
    from trainfeed.pipelines import benchmark

    root, src, _ = source
    variables = local_vars(root, src) | {"output_path": str(tmp_path)}
    cpu = [*params("storage_ab", "ab_cpu_node", variables), "--width", "8", "--cpu-steps", "2", "--workers", "2"]
    assert benchmark.main(cpu) == 0
    gpu = params("storage_ab", "ab_gpu_node", variables)
    with pytest.raises(SystemExit) as failed:  # --nodes cuda: no GPU here, a clear error
        benchmark.main([*gpu, "--width", "8"])
    assert failed.value.code == 1
    emulated = [("t4" if p == "cuda" else p) for p in gpu] + ["--width", "8", "--steps", "4", "--workers", "2"]
    assert benchmark.main(emulated) == 0
    assert benchmark.main(params("storage_ab", "report", variables)) == 0
    md = (tmp_path / "ab" / "report.md").read_text()
    assert "cpu@cpu-node" in md and "t4@gpu-node" in md and "1,000 samples x 5 epochs" in md


def test_train_job_distributed_on_local_spark(source, spark, tmp_path):
    """Self-contained: the store the job reads is converted here, at the path the bundle names."""
    from trainfeed.converters.cli import app
    from trainfeed.pipelines import train

    _, src, _ = source
    variables = local_vars(tmp_path, src) | {"train_processes": "2"}
    store = tmp_path / "out" / "stores" / "delta"
    res = run_cli(app, src, store, "--to", "delta", "--labels", src / "labels.csv", "--row-group-size", "64KB",
                  "--no-progress")
    assert res.exit_code == 0, res.stderr
    args = params("train", "train", variables)
    args = [("cpu" if a == "cuda" else a) for a in args] + ["--width", "8", "--batch-size", "8",
                                                          "--steps-per-epoch", "2", "--workers", "1"]
    args[args.index("--out") + 1] = str(tmp_path / "train")
    args[args.index("--checkpoint-dir") + 1] = str(tmp_path / "ckpt")
    assert train.main(args) == 0
    assert json.loads((tmp_path / "train" / "summary.json").read_text())["world_size"] == 2


@pytest.mark.parametrize("script,argv", [
    ("trainfeed-train", ["--data", "{tmp}/no-such-store", "--out", "{tmp}/out"]),
    ("trainfeed-benchmark", ["merge", "--out", "{tmp}", "--inputs", "cpu-node"]),
    ("trainfeed-repack", ["--src", "{tmp}/src", "--dst", "{tmp}/src/inside", "--to", "delta"]),
])
def test_a_failed_job_fails_the_way_the_wheel_task_launcher_sees_it(tmp_path, monkeypatch, capsys, script, argv):
    """The Databricks python-wheel-task launcher loads the entry point, sets sys.argv and calls
    it, ignoring what it returns: a failure must raise SystemExit with a non-zero code."""
    from importlib.metadata import entry_points

    (tmp_path / "src").mkdir()
    (entry_point,) = entry_points(group="console_scripts", name=script)
    monkeypatch.setattr("sys.argv", [script, *(a.format(tmp=tmp_path) for a in argv)])
    with pytest.raises(SystemExit) as failed:
        entry_point.load()()
    assert failed.value.code in (1, 2)
    assert capsys.readouterr().err.startswith("error: ")
