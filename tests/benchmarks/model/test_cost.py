"""`cost.project_catalog` and `cost.recommend` on a small catalog, every figure worked out by hand
from the projection model (projection.py).

The measured store, parquet on local disk (no request cost): the reader spends 40 ms of CPU a
sample (4 threads). A T4 step of batch 10 is FLOPs / (8.1 TFLOPS x 35%) = 0.5 s: 20 samples/s per
GPU (estimate). A step on the CPU costs 1.0 CPU-second (0.1 a sample). The workload: 36,000
samples x 2 epochs = 72,000 samples of 1 MiB (35.2 GiB an epoch)."""
from __future__ import annotations

import pytest

from tests.benchmarks.recorded import cell
from trainfeed.benchmarks.model.catalog import Instance
from trainfeed.benchmarks.model.cost import Workload, project_catalog, recommend
from trainfeed.benchmarks.model.projection import Loader

T4_HALF_SECOND = 8.1e12 * 0.35 * 0.5  # training FLOPs of one step that a T4 profile computes in 0.5 s
MEASURED = [cell("parquet", "cpu", node_kind="real", compute=10, cpu_step_s=1.0, cpu_ms=40, real=10, cores=4,
                 batch_size=10, flops_per_step=T4_HALF_SECOND, sample_bytes=2**20),
            cell("parquet", "t4", compute=20, cpu_ms=40, real=20, cores=4, batch_size=10,
                 flops_per_step=T4_HALF_SECOND, sample_bytes=2**20)]
READER = Loader("trainfeed", 8, 4, True)
WORKLOAD = Workload(36_000, 2)


def inst(name, vcpus, gpus=0, gpu_model="", on_demand=None, spot=None, ram_gib=0.0):
    return Instance(cloud="aws", region="us-east-1", name=name, vcpus=vcpus, ram_gib=ram_gib, gpus=gpus,
                    gpu_model=gpu_model, gpu_mem_gib=None, network_gbps=None, on_demand=on_demand, spot=spot,
                    price_date="2026-01-01", source="test")


CATALOG = [
    inst("cpu8", 8, on_demand=2.0, spot=0.5, ram_gib=44),  # 35.16 GiB fits in 80% of 44 (35.2)
    inst("t4x1", 4, 1, "NVIDIA T4", on_demand=3.0),
    inst("t4x4", 2, 4, "NVIDIA T4", on_demand=6.0),
    inst("k80", 4, 1, "NVIDIA K80", on_demand=0.9),  # no step-time profile: not projected
    inst("cpu2", 2, ram_gib=43),  # no price; 35.16 GiB > 80% of 43 (34.4)
]

# instance, samples/s, seconds, bottleneck, $ per job, spot $ per job, time vs fastest, cost vs cheapest
EXPECTED = [
    # step and reader share 8 vCPUs: (0.1 + 0.04) / 8 = 0.0175 s a sample; 72,000 x 0.0175 = 1,260 s at $2/h;
    # spot: $0.5/h x 1,260 s x (1 + 0.05 x 300 / 3600)
    ("cpu8", 1 / 0.0175, 1260.0, "compute", 0.7, 0.5 * 1260 * (1 + 0.05 * 300 / 3600) / 3600, 1.0, 1.0),
    # 4 GPUs take 80/s; the reader on min(4 threads, 2 vCPUs): 2 / 0.04 = 50/s binds; 1,440 s at $6/h
    ("t4x4", 50.0, 1440.0, "decode", 2.4, None, 1440 / 1260, 2.4 / 0.7),
    # the GPU takes 20/s, the reader 4 / 0.04 = 100/s; 3,600 s at $3/h
    ("t4x1", 20.0, 3600.0, "compute", 3.0, None, 3600 / 1260, 3.0 / 0.7),
    # (0.1 + 0.04) / 2 = 0.07 s a sample: 5,040 s, no price
    ("cpu2", 1 / 0.07, 5040.0, "compute", None, None, 4.0, None),
]


def _approx(v):
    return pytest.approx(v) if isinstance(v, float) else v


def test_project_each_instance():
    rows = project_catalog(MEASURED, CATALOG, "parquet", READER, None, WORKLOAD)
    got = [(r["machine"], r["samples_per_s"], r["seconds"], r["bottleneck"], r["usd_per_job"], r["spot_usd_per_job"],
            r["time_vs_fastest"], r["cost_vs_cheapest"]) for r in rows]
    assert got == [tuple(_approx(v) for v in row) for row in EXPECTED]
    by_name = {r["machine"]: r for r in rows}
    assert (by_name["cpu8"]["fastest"], by_name["cpu8"]["cheapest"]) == (True, True)
    assert by_name["cpu8"]["usd_per_1k_samples"] == pytest.approx(0.7 / 72)
    assert by_name["cpu8"]["ram_note"] == "dataset (35.2 GiB) fits in 80% of RAM (35.2 of 44 GiB)"
    assert by_name["cpu2"]["ram_note"] == "dataset (35.2 GiB) does not fit in 80% of RAM (34.4 of 43 GiB)"


def test_project_without_a_cpu_cell_leaves_cpu_instances_out():
    rows = project_catalog(MEASURED[1:], CATALOG, "parquet", READER, None, WORKLOAD)
    assert [(r["machine"], r["samples_per_s"], r["bottleneck"]) for r in rows] == [
        ("t4x4", pytest.approx(50.0), "decode"), ("t4x1", pytest.approx(20.0), "compute")]


def test_request_concurrency_is_the_loaders_on_every_instance():
    """The small files on a 4-vCPU and a 64-vCPU T4 instance read with one loader project the same
    rate: the latency penalty does not vanish on a bigger instance. 4 KB GETs take 20 ms + 4,000 B /
    60 MB/s, 8 in flight: 398.7/s, under the 800/s the T4 takes."""
    blob = [cell("blob", "t4", compute=20, cpu_ms=0.1, real=20, profile="azure-blob", batch_size=10,
                 flops_per_step=T4_HALF_SECOND / 40)]  # a 0.0125 s step: 800/s per T4
    catalog = [inst("small", 4, 1, "NVIDIA T4", on_demand=1.0), inst("big", 64, 1, "NVIDIA T4", on_demand=4.0)]
    from trainfeed.benchmarks.model.profiles import OBJECT_STORES

    rows = project_catalog(blob, catalog, "blob", READER, OBJECT_STORES["azure-blob"], WORKLOAD)
    assert [(r["machine"], r["samples_per_s"], r["bottleneck"]) for r in rows] == [
        ("small", pytest.approx(8 / (0.02 + 4000 / 60e6)), "io-latency"),
        ("big", pytest.approx(8 / (0.02 + 4000 / 60e6)), "io-latency")]


def test_project_of_a_store_without_cells_is_empty():
    assert project_catalog(MEASURED, CATALOG, "delta", READER, None, WORKLOAD) == []


def test_recommend_the_cheapest_and_the_fastest_priced_rows():
    rows = project_catalog(MEASURED, CATALOG, "parquet", READER, None, WORKLOAD)
    slow = [dict(r, machine="slow", seconds=99_999.0, usd_per_job=0.5) for r in rows[:1]]
    rec = recommend({"parquet": rows, "delta": slow})
    assert rec is not None
    assert (rec.cheapest["machine"], rec.fastest["machine"]) == ("slow", "cpu8")
    assert rec.to_json() == {"cheapest": rec.cheapest, "fastest": rec.fastest}
    assert recommend({"parquet": [r for r in rows if r["machine"] == "cpu2"]}) is None  # nothing priced
