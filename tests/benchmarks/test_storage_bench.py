"""`storage-bench`: the A/B matrix end to end (Azurite as the blob backend), its report in a
real headless browser, and its bad inputs."""
from __future__ import annotations

import html
import json
import shutil
import socket
import subprocess

import pytest

from tests.conftest import run_cli

TINY = ["--width", "8", "--batch-size", "8", "--steps", "4", "--cpu-steps", "2", "--workers", "2"]


def bench_cli(*args):
    from trainfeed.benchmarks.cli import app

    return run_cli(app, *args)


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ab")
    res = bench_cli("generate", "volumes", root / "vols", "--count", "96", "--shape", "12x12x4x2", "--seed", "3")
    assert res.exit_code == 0, res.stderr
    return root / "vols"


@pytest.fixture(scope="module")
def ab_run(tmp_path_factory, tiny_dataset):
    out = tmp_path_factory.mktemp("ab-out") / "run"
    res = bench_cli("run", tiny_dataset, "--out", out, "--nodes", "cpu,t4,h100", "--blob-backend", "azurite",
                    "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    return out, json.loads(res.stdout)


@pytest.mark.azurite
@pytest.mark.slow
def test_matrix_with_azurite_measures_every_cell(ab_run):
    out, info = ab_run
    cells = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {(c["store"], c["node"]) for c in cells if c["kind"] == "cell"} == {
        (s, n) for s in ("blob", "parquet", "delta", "hdf5") for n in ("cpu", "t4", "h100")}
    for c in cells:
        assert c["kind"] == "cell", c
        assert c["compute_only"]["samples_per_s"] > 0 and c["ingest_only"]["samples_per_s"] > 0
        real = c["real"]
        assert real["steps"] >= 2 and real["stall_fraction"] + real["au"] == pytest.approx(1, abs=1e-3)
        assert c["verdict"]["bottleneck"] in ("compute", "io-latency", "ingest", "contention", "ram")
        assert c["env"]["cores"] >= 1 and "torch" in c["env"]
        assert c["compute_only"]["how"] == ("measured" if c["node"] == "cpu" else "estimate")
    blob_h100 = next(c for c in cells if c["store"] == "blob" and c["node"] == "h100")
    assert blob_h100["blob_profile"] == "azure-blob"
    assert blob_h100["verdict"]["bottleneck"] == "io-latency"  # 20 ms GETs cannot feed an emulated H100
    md = (out / "report.md").read_text()
    assert md.index("## Training time") < md.index("## Why: each cell") < md.index("## What it costs")
    assert "h100 (emulated, estimate)" in md and "no price" in md
    assert info["cells"] == 12 and info["errors"] == 0
    assert (out / "results.csv").read_text().count("\n") == 13


@pytest.mark.azurite
@pytest.mark.slow
def test_report_renders_in_headless_chromium(ab_run, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (.ci/run installs it from Debian's packages)")
    out, _ = ab_run
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
             "--enable-logging=stderr", "--v=0"]
    url = (out / "report.html").resolve().as_uri()
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('<svg class="chart"') == 3  # throughput, stall, utilization (torch)
    for store in ("blob", "parquet", "delta", "hdf5"):
        for node in ("cpu", "t4", "h100"):
            assert f'id="utilization-{store}-{node}-torch"' in dom.stdout  # one panel per cell
    assert "Training time for 650,000 samples" in dom.stdout
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    shot = tmp_path / "report.png"
    res = subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1200,2000", url], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and shot.stat().st_size > 20_000  # a page with charts, not a blank one


def test_unknown_store_and_node_are_usage_errors(tiny_dataset, tmp_path):
    res = bench_cli("run", tiny_dataset, "--out", tmp_path / "o", "--stores", "blob,zarr", *TINY)
    assert res.exit_code == 2 and "unknown store 'zarr'" in res.stderr
    res = bench_cli("run", tiny_dataset, "--out", tmp_path / "o", "--nodes", "tpu9", *TINY)
    assert res.exit_code == 2 and "unknown node 'tpu9'" in res.stderr
    res = bench_cli("run", tiny_dataset, "--out", tmp_path / "o", "--blob-profile", "floppy", *TINY)
    assert res.exit_code == 2 and "unknown blob profile 'floppy'" in res.stderr


def test_generate_with_a_shape_of_the_wrong_rank_is_a_usage_error(tmp_path):
    res = bench_cli("generate", "volumes", tmp_path / "v", "--count", "2", "--shape", "4x4x2")
    assert res.exit_code == 2 and res.stderr == "error: volumes --shape is XxYxZxC (at least 4 sizes), got '4x4x2'\n"
    res = bench_cli("generate", "images", tmp_path / "i", "--count", "2", "--shape", "4x4x3")
    assert res.exit_code == 2 and res.stderr == "error: images --shape is HxW\n"
    assert not (tmp_path / "v").exists() and not (tmp_path / "i").exists()


def test_malformed_profile_file(tiny_dataset, tmp_path):
    prof = tmp_path / "gpu.json"
    prof.write_text('{"name": "x", "fp32_tflops": ')
    res = bench_cli("run", tiny_dataset, "--out", tmp_path / "o", "--nodes", prof, *TINY)
    assert res.exit_code == 1 and "malformed accelerator profile" in res.stderr and str(prof) in res.stderr


def test_results_from_an_older_version(tmp_path):
    (tmp_path / "results.jsonl").write_text(json.dumps({"kind": "cell", "results_version": 0}) + "\n")
    res = bench_cli("report", tmp_path)
    assert res.exit_code == 1 and "results version 0" in res.stderr and "rerun" in res.stderr
    res = bench_cli("report", tmp_path / "empty")
    assert res.exit_code == 1 and "no results.jsonl" in res.stderr


def test_catalog_row_problems(tmp_path):
    from trainfeed.benchmarks.cost import load_catalog
    from trainfeed.converters.errors import TrainfeedError

    header = "cloud,region,instance,vcpus,ram_gib,gpus,gpu_model,gpu_mem_gib,on_demand_usd_per_h,spot_usd_per_h,price_date,source\n"
    path = tmp_path / "c.csv"
    path.write_text(header + "aws,,p3.2xlarge,8,61,1,NVIDIA V100,16,,,,\n")
    instances, notes = load_catalog(path)
    assert instances[0].on_demand is None and "line 2 (aws p3.2xlarge): no on-demand price" in notes[0]
    path.write_text(header + "aws,,p3.2xlarge,eight,61,1,NVIDIA V100,16,3.06,,,\n")
    with pytest.raises(TrainfeedError, match="line 2: column 'vcpus' must be a number"):
        load_catalog(path)


def test_azurite_port_taken_is_a_clear_error():
    from trainfeed.benchmarks import azurite

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(azurite.AzuriteError, match=f"port {s.getsockname()[1]} on 127.0.0.1 is already in use"):
            azurite.start(port=s.getsockname()[1])


def test_partially_failed_matrix_keeps_completed_cells(tiny_dataset, tmp_path, monkeypatch):
    from trainfeed.benchmarks import matrix
    from trainfeed.converters.errors import TrainfeedError

    real = matrix.emulated_run

    def flaky(path, *args, **kwargs):
        if "hdf5" in str(path):
            raise TrainfeedError("disk on fire (injected)")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(matrix, "emulated_run", flaky)
    res = bench_cli("run", tiny_dataset, "--out", tmp_path / "o", "--nodes", "t4", "--stores", "parquet,hdf5",
                    "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["cells"] == 1 and info["errors"] == 1
    md = (tmp_path / "o" / "report.md").read_text()
    assert "## Cells that failed" in md and "disk on fire (injected)" in md


@pytest.mark.azurite
def test_remote_source_and_remote_labels_under_latency_emulation(azurite_server, tmp_path):
    """SRC and --labels both on Azure Blob (Azurite), the blob store behind the azure-blob
    latency emulation: the labels are read through the emulated filesystem with the source's
    options (before: the emulation's options were handed to abfs and the run failed)."""
    import fsspec

    from trainfeed.converters import parquet

    src = tmp_path / "vols"
    assert bench_cli("generate", "volumes", src, "--count", "32", "--shape", "6x6x2x2", "--seed", "5").exit_code == 0
    fs = fsspec.filesystem("abfs", **azurite_server.storage_options)
    fs.mkdir("bench-remote")
    fs.put(str(src), "bench-remote/vols", recursive=True)
    out = tmp_path / "out"
    res = bench_cli("run", "abfs://bench-remote/vols", "--labels", "abfs://bench-remote/vols/labels.csv",
                    "--storage-option", f"connection_string={azurite_server.connection_string}",
                    "--blob-profile", "azure-blob", "--out", out, "--nodes", "t4", "--stores", "blob,parquet",
                    "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    cells = {c["store"]: c for c in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert {s: c["kind"] for s, c in cells.items()} == {"blob": "cell", "parquet": "cell"}
    blob = cells["blob"]
    assert blob["blob_profile"] == "azure-blob" and blob["ingest_only"]["samples"] == 32
    # 2 workers, 20 ms per emulated GET: at most 100 samples/s however fast Azurite answers
    assert 0 < blob["ingest_only"]["samples_per_s"] <= 100 * 1.05
    expected = dict(line.split(",") for line in (src / "labels.csv").read_text().splitlines()[1:])
    stored = {sid: label for sid, label, _ in parquet.read_samples(out / "stores" / "parquet")}
    assert stored == {sid: int(label) for sid, label in expected.items()}


def test_labels_on_other_storage_than_an_emulated_source_is_a_usage_error(tiny_dataset, tmp_path):
    res = bench_cli("run", tiny_dataset, "--labels", "s3://bucket/labels.csv", "--out", tmp_path / "o",
                    "--nodes", "t4", "--stores", "blob", *TINY)
    assert res.exit_code == 2
    assert "--labels s3://bucket/labels.csv: under --blob-profile the labels must be a local file or on the same " \
           "storage as SRC (file://)" in res.stderr
    assert not (tmp_path / "o").exists()


def test_matrix_where_every_cell_fails_still_reports_why(tiny_dataset, tmp_path):
    """A labels CSV that labels none of the files: the blob store cannot open, the Parquet
    store cannot be converted. Every cell fails; the report, CSV and JSONL say why; exit 1."""
    import csv

    labels = tmp_path / "other.csv"
    labels.write_text("id,label\nnot_a_sample,1\n")
    out = tmp_path / "o"
    res = bench_cli("run", tiny_dataset, "--labels", labels, "--out", out, "--nodes", "t4,h100",
                    "--stores", "blob,parquet", "--json", *TINY)
    assert res.exit_code == 1
    info = json.loads(res.stdout)
    assert info["cells"] == 0 and info["errors"] == 4 and info["failed_cells"] == 4
    blob_why = f"emulated://{tiny_dataset}: 96 files have no label in emulated://{labels}, e.g. 'vol_000000'"
    parquet_why = (f"{tiny_dataset}/vol_000000.npy: no label for id 'vol_000000' in {labels} (96 files without a "
                   "label; --on-error skip converts the rest)")
    assert res.stderr.splitlines()[-1] == (f"error: {out / 'report.md'}: no cell was measured: all 4 failed; "
                                           f"first failure: blob x t4 torch (prepare): {blob_why}")
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["store"], r["node"], r["framework"], r["stage"], r["error"]) for r in records] == [
        ("error", "blob", "t4", "torch", "prepare", blob_why), ("error", "blob", "h100", "torch", "prepare", blob_why),
        ("error", "parquet", "t4", "torch", "prepare", parquet_why),
        ("error", "parquet", "h100", "torch", "prepare", parquet_why)]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["store"], r["node"], r["failed_stage"], r["error"], r["samples_per_s"]) for r in rows] == [
        ("blob", "t4", "prepare", blob_why, ""), ("blob", "h100", "prepare", blob_why, ""),
        ("parquet", "t4", "prepare", parquet_why, ""), ("parquet", "h100", "prepare", parquet_why, "")]
    md = (out / "report.md").read_text()
    assert "**No cell was measured**: all 4 failed" in md
    assert f"| parquet | h100 | torch | 0 | prepare | {parquet_why} |" in md
    page = (out / "report.html").read_text()
    assert page.count("<tr>") == 5 and "<td>prepare</td>" in page and html.escape(parquet_why, quote=False) in page
    again = bench_cli("report", out)  # rebuilding the report of such a run fails the same way
    assert again.exit_code == 1 and again.stderr.splitlines()[-1] == res.stderr.splitlines()[-1]


def test_calibrate_writes_a_profile_run_can_use(tmp_path):
    from trainfeed.benchmarks.profiles import calibration_key, load_accelerator

    prof = tmp_path / "local.json"
    res = bench_cli("calibrate", "--out", prof, "--shape", "12x12x4x2", "--batch-size", "8", "--width", "8",
                    "--steps", "3", "--device", "cpu")
    assert res.exit_code == 0, res.stderr
    acc = load_accelerator(str(prof))
    assert acc.kind == "calibrated" and acc.step_seconds[calibration_key((12, 12, 4, 2), 8, 8, False)] > 0


def test_azurite_not_installed_is_a_clear_error(tmp_path, monkeypatch):
    from trainfeed.benchmarks import azurite

    monkeypatch.setattr(azurite, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(azurite.shutil, "which", lambda name: None)
    with pytest.raises(azurite.AzuriteError, match="Azurite is not installed: run `make install`"):
        azurite.start()
