"""The preprocessing bottleneck's remedies (`benchmarks/model/remedies.py`), every figure worked out by
hand from the model.

Measured: encoded images cost the reader 25 ms of CPU a sample, decoded pixels 0.5 ms; an emulated
T4 takes a batch of 32 in 0.1 s (320 samples/s); the reader runs 4 threads. The workload: 96,000
samples, one epoch. On a 4-vCPU T4 instance the reader decodes 4 / 0.025 = 160 samples/s: decode-
bound, and the T4 needs ceil(320 x 0.025) = 8 vCPUs decoding."""
from __future__ import annotations

import pytest

from tests.benchmarks.recorded import cell
from trainfeed.benchmarks.model.advice import build_advice, plan_for
from trainfeed.benchmarks.model.catalog import Instance
from trainfeed.benchmarks.model.cost import Workload
from trainfeed.benchmarks.model.remedies import OFFLOAD_CPU_FACTOR

T4_TENTH = 8.1e12 * 0.35 * 0.1  # FLOPs of a step the T4 profile computes in 0.1 s
STAGES = {"read": 0.001, "decode": 0.022, "augment": 0.002, "samples": 64, "pixel_bytes_per_sample": 12288,
          "stored_bytes_per_sample": 3000}
CELLS = [cell("parquet-encoded", "t4", compute=320, cpu_ms=25, real=160, batch_size=32, flops_per_step=T4_TENTH,
              stages=STAGES),
         cell("parquet-decoded", "t4", compute=320, cpu_ms=0.5, real=320, batch_size=32, flops_per_step=T4_TENTH)]


def inst(name, vcpus, gpus, price):
    return Instance(cloud="aws", region="us-east-1", name=name, vcpus=vcpus, ram_gib=64.0, gpus=gpus,
                    gpu_model="NVIDIA T4" if gpus else "", gpu_mem_gib=None, network_gbps=None, on_demand=price,
                    spot=None, price_date="2026-01-01", source="test")


CATALOG = [inst("g-small", 4, 1, 1.0), inst("g-mid", 8, 1, 1.5), inst("g-big", 16, 1, 2.0),
           inst("cpu-w", 4, 0, 0.2), inst("cpu-x", 16, 0, 1.0)]


def advice():
    return build_advice(CELLS, CATALOG, {}, plan_for(CELLS, Workload(96_000, 1)),
                        ["parquet-encoded", "parquet-decoded"])


def test_remedies_for_a_decode_bound_gpu_instance():
    fixes = advice().remedies["parquet-encoded"]
    # every T4 instance is decode-bound with 4 reader threads: 160/s, 600 s; cheapest first
    assert [(f.today["machine"], f.today["seconds"], f.vcpus_needed) for f in fixes] == [
        ("g-small", pytest.approx(600), 8), ("g-mid", pytest.approx(600), 8), ("g-big", pytest.approx(600), 8)]
    small = fixes[0]
    assert small.today["usd_per_job"] == pytest.approx(1.0 * 600 / 3600)
    # larger CPU:GPU: the cheapest T4 instance with >= 8 vCPUs, 8 reader threads: 320/s, 300 s at $1.5/h
    assert (small.bigger["machine"], small.bigger["samples_per_s"]) == ("g-mid", pytest.approx(320))
    assert small.bigger["usd_per_job"] == pytest.approx(1.5 * 300 / 3600)
    # decoded pixels on the same instance: the T4's 320/s
    assert (small.decoded["machine"], small.decoded["seconds"]) == ("g-small", pytest.approx(300))
    # offload: ceil(8 x 2.69) = 22 vCPUs of TF decode, the cheapest per vCPU is cpu-w (4 vCPUs, $0.05 a vCPU):
    # 6 of them, 24 vCPUs at 25 ms x 2.69 a sample: 356.6/s, the T4's 320/s binds; $1.0 + 6 x $0.2 an hour
    off = small.offload
    assert (off["workers"], off["worker"], off["worker_vcpus"]) == (6, "cpu-w", 24)
    assert off["samples_per_s"] == pytest.approx(320) and off["bottleneck"] == "compute"
    assert off["limits"]["decode"] == pytest.approx(24 / (0.025 * OFFLOAD_CPU_FACTOR))
    assert off["usd_per_job"] == pytest.approx(2.2 * 300 / 3600)
    # an instance that has the vCPUs already needs only the reader threads to use them
    mid = fixes[1].bigger
    assert (mid["machine"], mid["workers"], mid["samples_per_s"]) == ("g-mid", 8, pytest.approx(320))


def test_the_report_shows_the_vcpus_needed_and_the_remedies(tmp_path):
    import json

    from trainfeed.benchmarks.report import report

    (tmp_path / "results.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CELLS))
    csv = tmp_path / "catalog.csv"
    csv.write_text("cloud,region,instance,vcpus,ram_gib,gpus,gpu_model,gpu_mem_gib,on_demand_usd_per_h,"
                   "spot_usd_per_h,price_date,source\n"
                   + "".join(f"aws,us-east-1,{i.name},{i.vcpus},64,{i.gpus},{i.gpu_model},,{i.on_demand},,2026-01-01,"
                             "test\n" for i in CATALOG))
    report.build(str(tmp_path), target_samples=96_000, target_epochs=1, catalog=csv)
    md = (tmp_path / "report.md").read_text()
    assert "## The preprocessing bottleneck: remedies" in md
    assert ("| aws g-small | 10 min, $0.17 (decode) | 4 / 8 | g-mid --workers 8: 5 min, $0.12 (compute) | "
            "5 min, $0.083 (compute) | 6 x cpu-w: 5 min, $0.18 (compute) |") in md
    assert "| fastest; cheapest; best per $ on t4 | parquet-decoded | aws g-small | 4 | 1 t4 | 320 | 5 min |" in md
    page = (tmp_path / "report.html").read_text()  # the whole catalog, folded; a tie for fastest: the first
    assert "<strong>aws g-small</strong> (fastest, cheapest)</td>\n<td>4 (needs 8)</td>\n<td>1 t4</td>" in page


def test_remedies_when_the_storage_clients_cpu_binds():
    """Encoded images of 5 MB a sample (0.5 ms of decode CPU) read through a client that costs
    3 CPU-s per GB: 15 ms of I/O CPU a sample. The requests (7.94 MB at 1 ms + 15.9 ms, 0.63 a
    sample, 8 in flight: 752/s) never bind. On 4 vCPUs: 4 / 0.0155 = 258/s < the T4's 320: io-cpu;
    the T4 needs 320 x 0.015 = 4.8 vCPUs of I/O and 0.16 of decode: 5."""
    from dataclasses import asdict

    from trainfeed.benchmarks.model.verdict import verdict

    from .test_verdict import NEAR

    rec = cell("parquet-encoded", "t4", compute=320, cpu_ms=0.5, real=250, batch_size=32, flops_per_step=T4_TENTH,
               stages=STAGES, sample_bytes=5_000_000, requests={"gets": 63, "bytes": 500_000_000}, samples=100)
    rec["storage"].update(profile=NEAR.name, profile_figures=asdict(NEAR))
    rec["verdict"] = verdict(rec)
    assert rec["verdict"]["bottleneck"] == "io-cpu"
    cells = [rec]
    fixes = build_advice(cells, CATALOG, {}, plan_for(cells, Workload(96_000, 1)), ["parquet-encoded"]).remedies
    # only the 4-vCPU instance is bound by its vCPUs (8 carry 8 / 0.0155 = 516/s)
    [small] = fixes["parquet-encoded"]
    assert (small.today["machine"], small.today["bottleneck"], small.vcpus_needed) == ("g-small", "io-cpu", 5)
    assert small.today["samples_per_s"] == pytest.approx(4 / 0.0155)
    # larger CPU:GPU: g-mid (8 vCPUs) with 5 reader threads keeps the T4's 320/s: 300 s at $1.5/h
    assert (small.bigger["machine"], small.bigger["workers"]) == ("g-mid", 5)
    assert small.bigger["samples_per_s"] == pytest.approx(320) and small.bigger["bottleneck"] == "compute"
    assert small.decoded is None  # no decoded store measured
    # offload: the workers read and decode: ceil(4.8 + 0.16 x 2.69) = 6 vCPUs, 2 x cpu-w (8 vCPUs, $0.4/h);
    # 8 / (0.015 + 0.0005 x 2.69) = 489/s: the T4's 320/s binds; $1.0 + $0.4 an hour for 300 s
    off = small.offload
    assert (off["workers"], off["worker"], off["worker_vcpus"]) == (2, "cpu-w", 8)
    assert off["samples_per_s"] == pytest.approx(320) and off["bottleneck"] == "compute"
    assert off["usd_per_job"] == pytest.approx(1.4 * 300 / 3600)
