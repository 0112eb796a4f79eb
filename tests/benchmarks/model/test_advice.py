"""One model, one source of truth: a report built from recorded measurements shows, for a node,
the same row in its headline as in the catalog for that node's instance; a scenario's published
times sit beside its projections; scenario files are checked key by key."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.recorded import cell
from trainfeed.benchmarks.model.advice import build_advice, plan_for
from trainfeed.benchmarks.model.catalog import DbuRate, Instance
from trainfeed.benchmarks.model.cost import Workload
from trainfeed.benchmarks.model.projection import Loader
from trainfeed.benchmarks.model.scenario import SCENARIO_COPY, load_scenario
from trainfeed.benchmarks.report import report
from trainfeed.converters.errors import TrainfeedError

T4_STEP = 8.1e12 * 0.35 * 0.4  # a T4 profile computes this batch of 32 in 0.4 s: 80 samples/s
SHIPPED = Path(__file__).parents[3] / "scenarios" / "reference-azure-databricks.toml"
KEYS = ("samples_per_s", "seconds", "bottleneck", "limits", "usd_per_job", "spot_usd_per_job")


def measured() -> list[dict]:
    """Small files and a Delta table, each on a CPU node (4 vCPUs) and an emulated T4, behind the
    azure-blob latency profile."""
    common = dict(profile="azure-blob", batch_size=32, flops_per_step=T4_STEP, sample_bytes=360_000, cores=4)
    return [cell("blob", "t4", compute=80, cpu_ms=0.5, real=80, **common),
            cell("delta", "t4", compute=80, cpu_ms=0.2, real=80, requests={"gets": 9, "bytes": 72_000_000},
                 samples=200, **common),
            cell("blob", "cpu", node_kind="real", compute=4, cpu_step_s=16.0, cpu_ms=0.5, real=3.5, **common),
            cell("delta", "cpu", node_kind="real", compute=4, cpu_step_s=16.0, cpu_ms=0.2, real=3.9,
                 requests={"gets": 9, "bytes": 72_000_000}, samples=200, **common)]


def instance(name, vcpus, gpus=0, model="", on_demand=None, spot=None, dbu=None, cloud="azure"):
    return Instance(cloud=cloud, region="eastus", name=name, vcpus=vcpus, ram_gib=28.0, gpus=gpus, gpu_model=model,
                    gpu_mem_gib=None, network_gbps=8.0, on_demand=on_demand, spot=spot, price_date="2026-01-01",
                    source="test", dbu_per_hour=dbu)


def test_headline_row_of_a_node_equals_the_catalog_row_of_its_twin():
    """Without a scenario the headline projects this machine (4 vCPUs) with each node's device;
    an instance identical to it in the catalog gets the very same figures."""
    cells = measured()
    catalog = [instance("twin-t4", 4, 1, "NVIDIA T4"), instance("twin-cpu", 4), instance("big-t4", 64, 1, "NVIDIA T4")]
    catalog = [Instance(**{**vars(i), "network_gbps": None}) for i in catalog]  # this machine's network: unknown
    plan = plan_for(cells, Workload(96_000, 1), baseline=Loader("one at a time", 1, 1, True))
    advice = build_advice(cells, catalog, {}, plan, ["blob", "delta"])
    for node, twin in (("t4", "twin-t4"), ("cpu", "twin-cpu")):
        head = next(h for h in advice.headline if h.node == node)
        for row in head.rows:
            catalog_row = next(r for r in advice.projections[row["option"]] if r["machine"] == twin)
            assert {k: row[k] for k in KEYS[:4]} == {k: catalog_row[k] for k in KEYS[:4]}, (node, row["option"])
    # the small files' latency penalty does not vanish on a 64-vCPU instance: one GET in flight, 20 ms + 6 ms
    blob = {r["machine"]: r for r in advice.projections["blob, one at a time"]}
    for name in ("twin-t4", "big-t4"):
        assert blob[name]["samples_per_s"] == pytest.approx(1 / (0.02 + 360_000 / 60e6)), name
        assert blob[name]["bottleneck"] == "io-latency", name


SCENARIO = """
name = "test case"
[workload]
samples_per_epoch = 9600
epochs = 2
batch_size = 32
source = "a test"
[model]
sample_shape = [30, 30, 10, 10]
width = 8
framework = "torch"
source = "a test"
[storage]
name = "slow blob"
first_byte_ms = 50.0
stream_mb_per_s = 60.0
max_concurrency = 64
source = "a test"
[loaders.blob]
name = "one at a time"
concurrency = 1
threads = 1
prefetch = false
framework = "tf"
source = "a test"
[loaders.compacted]
name = "ten threads"
concurrency = 10
threads = 10
prefetch = true
framework = "tf"
source = "a test"
[[nodes]]
name = "GPU node"
instance = "gpu-box"
measure = "t4"
source = "a test"
[[nodes]]
name = "CPU node"
instance = "cpu-box"
measure = "cpu"
cpu_speed = 0.5
source = "a test"
[[reference]]
node = "GPU node"
store = "delta"
seconds = 600
source = "a test"
[[reference]]
node = "GPU node"
store = "blob"
seconds = 3600
source = "a test"
[measure]
samples = 64
stores = ["blob", "delta"]
steps = 4
cpu_steps = 2
"""


def test_scenario_nodes_in_the_headline_equal_their_catalog_rows(tmp_path):
    path = tmp_path / "case.toml"
    path.write_text(SCENARIO)
    sc = load_scenario(path)
    cells = measured()
    catalog = [instance("gpu-box", 4, 1, "NVIDIA T4", on_demand=0.5, spot=0.1, dbu=1.0),
               instance("cpu-box", 16, on_demand=0.8, dbu=3.0), instance("other", 8, on_demand=0.4)]
    dbu = {"azure": DbuRate("azure", "premium", "jobs", 0.3, "2026-01-01", "test")}
    advice = build_advice(cells, catalog, dbu, plan_for(cells, Workload(1, 1), scenario=sc), ["blob", "delta"])
    for head in advice.headline:
        for row in head.rows:
            catalog_row = next(r for r in advice.projections[row["option"]] if r["machine"] == head.instance)
            assert {k: row[k] for k in KEYS} == {k: catalog_row[k] for k in KEYS}, (head.node, row["option"])
    gpu = {r["option"]: r for r in advice.headline[0].rows}
    # one at a time, no prefetch: 0.4 / 32 + 0.0005 + (50 ms + 360,000 B / 60 MB/s) = 0.069 s a sample
    assert gpu["blob, one at a time"]["samples_per_s"] == pytest.approx(1 / (0.4 / 32 + 0.0005 + 0.056))
    # the T4's 80/s binds the Delta table (10 parts of 8 MB in flight deliver far more)
    assert gpu["delta"]["samples_per_s"] == pytest.approx(80)
    # $0.5/h + 1 DBU x $0.30 = $0.80/h, for 19,200 samples at 80/s (240 s)
    assert gpu["delta"]["usd_per_hour"] == pytest.approx(0.8)
    assert gpu["delta"]["usd_per_job"] == pytest.approx(0.8 * 240 / 3600)
    assert advice.reference is not None
    ref = {r["store"]: r for r in advice.reference.rows}
    assert ref["delta"]["projected_s"] == pytest.approx(240)
    assert ref["delta"]["deviation"] == pytest.approx(240 / 600 - 1)
    blob_s = 19_200 * (0.4 / 32 + 0.0005 + 0.056)
    assert ref["blob"]["deviation"] == pytest.approx(blob_s / 3600 - 1)
    speedup = advice.reference.speedups[0]
    assert (speedup.published, speedup.projected) == (pytest.approx(6.0), pytest.approx(blob_s / 240))
    # the published Delta time implies a step 2.5x slower (1.0 s); the small files projected again with it
    check = advice.reference.cross_checks[0]
    assert check.implied_step_s == pytest.approx(1.0)
    assert check.blob_projected_s == pytest.approx(19_200 * (1.0 / 32 + 0.0005 + 0.056))


def test_report_of_a_scenario_run_writes_reference_json(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text("".join(json.dumps(c) + "\n" for c in measured()))
    (out / SCENARIO_COPY).write_text(SCENARIO.replace('"gpu-box"', '"Standard_NC4as_T4_v3"')
                                     .replace('"cpu-box"', '"Standard_D16s_v3"'))
    info = report.build(str(out))
    rows = json.loads((out / "reference.json").read_text())
    assert [(r["node"], r["store"], r["reference_s"]) for r in rows] == [("GPU node", "delta", 600),
                                                                          ("GPU node", "blob", 3600)]
    assert rows[0]["projected_s"] == pytest.approx(240)
    assert info["reference"][0]["projected_s"] == pytest.approx(240)
    md = (out / "report.md").read_text()
    assert "## Reference case: test case" in md
    assert "| GPU node | delta, ten threads | 4 min | 10 min | -60% | compute |" in md
    assert "| GPU node | 6x |" in md  # the published speed-up, beside the projected one


def test_the_shipped_reference_scenario_sources_every_knob():
    sc = load_scenario(SHIPPED)
    assert sc.workload.total == 96_000 and sc.batch_size == 32
    assert [(r.node, r.store, r.seconds) for r in sc.references] == [
        ("T4 node", "delta", 19 * 60), ("T4 node", "blob", 1.8 * 3600), ("CPU node", "delta", 2.42 * 3600),
        ("CPU node", "blob", 3.59 * 3600)]
    assert all(sc.sources.values()) and all(r.source for r in sc.references)
    assert {n.instance for n in sc.nodes} == {"Standard_NC4as_T4_v3", "Standard_D16s_v3"}


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace("epochs = 2\n", ""), "missing key 'workload.epochs'"),
    (lambda t: t.replace("epochs = 2", 'epochs = "two"'), "workload.epochs must be a whole number, got 'two'"),
    (lambda t: t.replace("stream_mb_per_s = 60.0", "stream_mb_per_s = 0"), "storage.stream_mb_per_s must be above 0"),
    (lambda t: t.replace('node = "GPU node"\nstore = "blob"', 'node = "TPU node"\nstore = "blob"'),
     "reference.1.node 'TPU node' is not one of the scenario's nodes"),
    (lambda t: t.replace("prefetch = false", "prefetch = 0"), "loaders.blob.prefetch must be true or false"),
    (lambda t: t + "[broken", "not a valid TOML scenario"),
])
def test_a_bad_scenario_names_the_file_and_the_key(tmp_path, edit, message):
    path = tmp_path / "bad.toml"
    path.write_text(edit(SCENARIO))
    with pytest.raises(TrainfeedError, match=f"{path}: .*{message}".replace("(", r"\(").replace(")", r"\)")):
        load_scenario(path)


def test_a_calibrated_profile_replaces_the_estimate_in_every_row_of_its_gpu():
    """`calibrate --name t4` on a T4 measured 0.2 s a step for this shape and batch: a run with
    that profile as a node puts it into every T4 row of the catalog, labelled calibrated."""
    from dataclasses import asdict

    from trainfeed.benchmarks.model.profiles import Accelerator, calibration_key

    key = calibration_key([10, 10, 4, 2], 32, 8, False)
    t4 = Accelerator("t4", 0.0, 0.0, 1.0, "calibrated on NVIDIA T4", kind="calibrated", step_seconds={key: 0.2})
    cells = [cell("delta", "t4.json", compute=160, cpu_ms=0.1, real=160, batch_size=32, flops_per_step=T4_STEP,
                  accelerator=asdict(t4))]
    catalog = [instance("one-t4", 8, 1, "NVIDIA T4", on_demand=1.0), instance("four-t4", 48, 4, "NVIDIA T4")]
    advice = build_advice(cells, catalog, {}, plan_for(cells, Workload(32_000, 1)), ["delta"])
    rows = {r["machine"]: r for r in advice.projections["delta"]}
    assert {(r["device"], r["device_how"]) for r in rows.values()} == {("t4", "calibrated")}
    assert rows["one-t4"]["samples_per_s"] == pytest.approx(32 / 0.2)  # not the 80/s the estimate gives
    assert rows["four-t4"]["samples_per_s"] == pytest.approx(4 * 32 / 0.2)


def test_storage_bench_run_with_a_scenario(tmp_path):
    """`storage-bench run --scenario FILE --out DIR` generates its dataset, measures, and writes
    the report with the reference section and DIR/reference.json."""
    from tests.conftest import run_cli
    from trainfeed.benchmarks.cli import app

    path = tmp_path / "tiny.toml"
    path.write_text(SCENARIO.replace("sample_shape = [30, 30, 10, 10]", "sample_shape = [6, 6, 4, 2]")
                    .replace('"gpu-box"', '"Standard_NC4as_T4_v3"').replace('"cpu-box"', '"Standard_D16s_v3"')
                    .replace("samples = 64", "samples = 48").replace("steps = 4", "steps = 3"))
    out = tmp_path / "out"
    res = run_cli(app, "run", "--scenario", path, "--out", out)
    assert res.exit_code == 0, res.stderr
    assert (out / "data" / "labels.csv").read_text().count("\n") == 49  # header and 48 generated samples
    rows = json.loads((out / "reference.json").read_text())
    assert [(r["node"], r["store"], r["reference_s"]) for r in rows] == [("GPU node", "delta", 600),
                                                                          ("GPU node", "blob", 3600)]
    assert all(r["projected_s"] > 0 for r in rows)
    md = (out / "report.md").read_text()
    assert "## Reference case: test case" in md and "| GPU node (Standard_NC4as_T4_v3) |" in md
    assert "Standard_NC4as_T4_v3" in md and "$" in md  # Azure's price from the catalog
