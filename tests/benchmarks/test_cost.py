"""`cost.project` and `cost.recommend` on a small catalog, every figure worked out by hand.

The measured store: 4 local cores; a CPU-node cell (real 10/s, ingest 80/s) and a T4 cell (ingest
120/s): ingest median 100/s. A T4 step of batch 10 is FLOPs / (8.1 TFLOPS x 35%) = 0.5 s, so
20 samples/s per GPU (estimate). The workload: 36,000 samples x 2 epochs = 72,000 samples of 1 MiB
(35.2 GiB)."""
from __future__ import annotations

import pytest

from trainfeed.benchmarks.cost import Instance, project, recommend

from .recorded import cell

T4_HALF_SECOND = 8.1e12 * 0.35 * 0.5  # training FLOPs of one step that a T4 profile computes in 0.5 s
MEASURED = [cell("parquet", "cpu", node_kind="real", compute=12, ingest=80, real=10, cores=4, batch_size=10,
                 flops_per_step=T4_HALF_SECOND, sample_bytes=2**20),
            cell("parquet", "t4", compute=20, ingest=120, real=20, cores=4, batch_size=10,
                 flops_per_step=T4_HALF_SECOND, sample_bytes=2**20)]


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

# instance, samples/s, hours, on-demand $, spot $, time vs fastest, cost vs cheapest, constraint, RAM note
EXPECTED = [
    ("cpu8", 20.0, 1.0, 2.0, 0.5, 2.5, 1.0, "CPU compute", None),  # 10/s x 8/4 vCPUs
    ("t4x4", 50.0, 0.4, 2.4, None, 1.0, 1.2,  # GPUs 4 x 20 = 80/s, ingest 100 x 2/4 = 50/s binds
     "input pipeline: needs ~4 vCPUs to feed 4 GPU(s), has 2", None),  # ceil(4 x 80 / 100)
    ("t4x1", 20.0, 1.0, 3.0, None, 2.5, 1.5, "GPU compute (estimate)", None),  # GPU 20/s; ingest 100/s
    ("cpu2", 5.0, 4.0, None, None, 10.0, None, "CPU compute",
     "dataset (35 GiB) does not fit in RAM (43 GiB): every epoch reads storage"),
]


def test_project_each_instance():
    rows = project(MEASURED, CATALOG, "parquet", target_samples=36_000, epochs=2)
    got = [(r["instance"], r["samples_per_s"], r["hours"], r["on_demand_usd"], r["spot_usd"], r["time_vs_fastest"],
            r["cost_vs_cheapest"], r["constraint"], r.get("ram_note")) for r in rows]
    assert got == [tuple(pytest.approx(v) if isinstance(v, float) else v for v in row) for row in EXPECTED]


def test_project_without_a_cpu_cell_leaves_cpu_instances_out():
    rows = project(MEASURED[1:], CATALOG, "parquet", target_samples=36_000, epochs=2)
    # ingest median is now 120/s: t4x4 is fed 120 x 2/4 = 60/s, needs ceil(4 x 80 / 120) = 3 vCPUs
    assert [(r["instance"], r["samples_per_s"], r["hours"], r["constraint"]) for r in rows] == [
        ("t4x4", pytest.approx(60.0), pytest.approx(1 / 3),
         "input pipeline: needs ~3 vCPUs to feed 4 GPU(s), has 2"),
        ("t4x1", pytest.approx(20.0), pytest.approx(1.0), "GPU compute (estimate)")]


def test_project_of_a_store_without_cells_is_empty():
    assert project(MEASURED, CATALOG, "delta", target_samples=36_000, epochs=2) == []


def test_recommend_the_cheapest_and_the_fastest_priced_rows():
    rows = project(MEASURED, CATALOG, "parquet", target_samples=36_000, epochs=2)
    rec = recommend({"parquet": rows, "delta": []})
    assert (rec["cheapest"]["instance"], rec["fastest"]["instance"]) == ("cpu8", "t4x4")
    assert recommend({"parquet": [r for r in rows if r["instance"] == "cpu2"]}) is None  # nothing priced
