"""Every branch of `verdict.verdict`, one recorded cell each, every figure worked out by hand from
the projection model: a changed model, threshold, branch order or advice fails a row.

Defaults of a recorded cell: batch 10, 4 vCPUs, 4 reader threads, 8 requests in flight."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from tests.benchmarks.recorded import cell
from trainfeed.benchmarks.model.profiles import ObjectStore
from trainfeed.benchmarks.model.verdict import verdict

COMPUTE_ADVICE = "A faster device or more devices help; repacking does not."
# A nearby store (1 ms, 500 MB/s a stream, 256 in flight) whose client costs 3 CPU-s per GB (probed).
NEAR = ObjectStore("near", 1.0, 500.0, 256, "test", io_cpu_s_per_gb={"1": 3.0, "8": 3.0, "32": 3.0})


def near(**kwargs) -> dict:
    """An emulated H100-like GPU (13,000 samples/s) reading 360 KB samples in 8 MB parts from NEAR
    with 32 requests in flight and 16 threads: 360,000 B x 3 CPU-s/GB = 1.08 ms of I/O CPU a
    sample; the requests take (1 ms + 16 ms) x 0.045 / 32 = 0.0239 ms a sample (41,830/s)."""
    rec = cell(**{"node": "h100", "compute": 13_000, "real": 10_000, "workers": 16, "io_concurrency": 32,
                  "sample_bytes": 360_000, "requests": {"gets": 9, "bytes": 72_000_000}, "samples": 200,
                  "cpu_ms": 0.04, **kwargs})
    rec["storage"].update(profile=NEAR.name, profile_figures=asdict(NEAR))
    return {**rec, "verdict": verdict(rec)}  # as recorded: the verdict of the cell's own storage


STAGES = {"read": 0.0001, "decode": 0.004, "augment": 0.001, "samples": 64, "pixel_bytes_per_sample": 12288,
          "stored_bytes_per_sample": 3000}
ROWS = [
    # id, the cell, expected bottleneck, expected advice
    ("swapping", cell(compute=100, real=100, swap_mb=100.5), "ram",
     "RAM: the working set exceeds memory and the node swaps; pick an instance with more RAM or lower --workers / "
     "--shuffle-buffer"),
    # device 100/s; reader 4 threads / 1 ms = 4,000/s; no storage cost
    ("compute, emulated", cell(compute=100, cpu_ms=1, real=100, stall=0.02), "compute",
     f"compute-bound: the accelerator sets the pace (100 samples/s; reading alone could deliver 4,000). "
     f"{COMPUTE_ADVICE}"),
    # CPU node: step 0.4 CPU-s / 10 = 0.04 s, reader 0.02 s, on 4 vCPUs together 0.015 s a sample: 66.7/s;
    # the step's share (0.01 s) outweighs the reader's (0.005 s); the reader alone 4 / 0.02 = 200/s
    ("compute, CPU node shares its vCPUs", cell(node="cpu", node_kind="real", compute=25, cpu_step_s=0.4, cpu_ms=20,
                                                real=60), "compute",
     f"compute-bound: the CPU sets the pace with the reader on the same vCPUs (67 samples/s; reading alone could "
     f"deliver 200). {COMPUTE_ADVICE}"),
    # reader 4 threads / 10 ms = 400/s < device 1,000/s; ~ceil(1,000 x 0.01) = 10 vCPUs reading
    ("decode", cell(compute=1000, cpu_ms=10, real=390), "decode",
     "read/decode-bound: 10.00 ms of CPU per sample on 4 thread(s) -> 400 samples/s, the device takes 1,000; needs "
     "~10 vCPUs busy reading per device (more --workers on more vCPUs), or offload preprocessing to CPU workers"),
    # 4 threads capped by 2 vCPUs: 2 / 10 ms = 200/s
    ("decode, threads capped by vCPUs", cell(compute=1000, cpu_ms=10, real=199, cores=2), "decode",
     "read/decode-bound: 10.00 ms of CPU per sample on 2 thread(s) -> 200 samples/s, the device takes 1,000; needs "
     "~10 vCPUs busy reading per device (more --workers on more vCPUs), or offload preprocessing to CPU workers"),
    # images: the same decode limit, broken down by stage (verdict.image_verdict); the vCPUs from the 10 ms the
    # reader measured (1,000 x 10 ms), as the feeds table's, not from the stages' 5.1 ms of one thread at staging
    ("decode, images", cell(compute=1000, cpu_ms=10, real=390, stages=STAGES), "decode",
     "decode-bound: 4.000 ms CPU per image to decode and resize (CPU per sample: read 0.100 ms, decode+resize "
     "4.000 ms, augment 1.000 ms); the reader delivers 400 images/s, the device takes 1,000 and needs ~10 vCPUs at "
     "this rate; store decoded pixels (4.1x the bytes) or add CPUs"),
    # azure-blob: 4 KB GETs take 20 ms + 4,000 B / 60 MB/s = 20.067 ms, 8 in flight: 398.7/s
    ("io-latency, small files", cell("blob", compute=1000, real=398, profile="azure-blob"), "io-latency",
     "storage latency: 4 KB requests at 20 ms first byte, 8 in flight -> 399 samples/s, the device takes 1,000; "
     "repack into files of ~128 MB (convert --to delta) or allow more requests in flight (--io-concurrency)"),
    # 8 MB parts (80 MB in 10 GETs for 80 samples: 1 MB a sample): 20 ms + 133.3 ms = 153.3 ms a part, an eighth
    # of a part a sample, 8 in flight: 2.396 ms a sample, 417/s; latency (20 ms) is under half a request
    ("bandwidth, row groups", cell(compute=1000, real=410, profile="azure-blob", sample_bytes=10**6,
                                   requests={"gets": 10, "bytes": 80 * 10**6}, samples=80), "bandwidth",
     "bandwidth: 8 streams of 60 MB/s -> 417 samples/s of 1,000 KB, the device takes 1,000; allow more requests in "
     "flight (--io-concurrency), or store fewer bytes per sample (compression, smaller dtype)"),
    # concurrency is the reader's: 16 in flight halve the latency cost: 797/s
    ("io-latency, more in flight", cell("blob", compute=1000, real=790, profile="azure-blob", io_concurrency=16),
     "io-latency", "storage latency: 4 KB requests at 20 ms first byte, 16 in flight -> 797 samples/s, the device "
     "takes 1,000; repack into files of ~128 MB (convert --to delta) or allow more requests in flight "
     "(--io-concurrency)"),
    # the model allows 100/s (compute); 79 is under 80% of it
    ("contention from other processes", cell(compute=100, cpu_ms=1, real=79,
                                             contended=["other processes used 61% of the machine's CPU time"]),
     "contention", "the real run reached 79 samples/s where its parts allow 100 (compute-bound): the reader and the "
     "step compete for 4 vCPUs (other processes used 61% of the machine's CPU time); give the input pipeline its own "
     "cores, or rerun on an idle machine"),
    ("contention within the run", cell(compute=100, cpu_ms=1, real=79), "contention",
     "the real run reached 79 samples/s where its parts allow 100 (compute-bound): the reader and the step compete "
     "for 4 vCPUs (nothing else was busy); give the input pipeline its own cores, or rerun on an idle machine"),
    # other processes slowed a storage-bound run: a caveat of its figures (checks), not its bottleneck
    ("others' load leaves storage the bottleneck", cell("blob", compute=1000, real=200, profile="azure-blob",
                                                        contended=["hypervisor steal 8%"]), "io-latency",
     "storage latency: 4 KB requests at 20 ms first byte, 8 in flight -> 399 samples/s, the device takes 1,000; "
     "repack into files of ~128 MB (convert --to delta) or allow more requests in flight (--io-concurrency)"),
    ("80% of the model is not contention", cell(compute=100, cpu_ms=1, real=80), "compute",
     f"compute-bound: the accelerator sets the pace (100 samples/s; reading alone could deliver 4,000). "
     f"{COMPUTE_ADVICE}"),
    # 12 vCPUs for 1.08 ms of I/O + 0.04 ms of decode CPU a sample: 12 / 0.00112 = 10,714/s < 13,000; the
    # GPU needs 13,000 x 360 KB = 4.68 GB/s: 14.04 vCPUs of I/O, 0.52 of decode, 15 in all
    ("io-cpu", near(cores=12), "io-cpu",
     "I/O CPU: the storage client costs 3.00 CPU-s per GB at 32 in flight (probed); the device takes 13,000 "
     "samples/s = 4.68 GB/s, which needs 15 vCPUs (I/O 14.0, decode 0.5, framework 0.0) where this machine has 12 "
     "-> 10,714 samples/s; give each device more vCPUs, or read fewer bytes per sample (compression, smaller dtype)"),
    # 16 vCPUs carry 16 / 0.00112 = 14,286/s of reading: the GPU's 13,000 binds
    ("io-cpu does not bind on enough vCPUs", near(cores=16, real=13_000), "compute",
     f"compute-bound: the accelerator sets the pace (13,000 samples/s; reading alone could deliver 14,286). "
     f"{COMPUTE_ADVICE}"),
    # 2 ms of decode + 1.08 ms of I/O on 12 vCPUs: 3,896/s; decode is the larger share of the vCPUs;
    # reading at the GPU's rate takes 13,000 x 0.00308 = 40.04 vCPUs
    ("decode, sharing the vCPUs with I/O", near(cores=12, cpu_ms=2, real=3800), "decode",
     "read/decode-bound: 2.00 ms of CPU per sample on 12 thread(s) -> 3,896 samples/s, the device takes 13,000; "
     "needs ~41 vCPUs busy reading per device (more --workers on more vCPUs), or offload preprocessing to CPU "
     "workers"),
]


@pytest.mark.parametrize("recorded,bottleneck,advice", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_verdict(recorded, bottleneck, advice):
    assert verdict(recorded) == {"bottleneck": bottleneck, "advice": advice}


def test_every_bottleneck_has_a_row():
    assert {r[2] for r in ROWS} == {"ram", "compute", "decode", "io-latency", "bandwidth", "contention", "io-cpu"}


@pytest.mark.parametrize("cores", range(10, 19))
def test_io_cpu_is_named_exactly_when_the_vcpus_cannot_carry_the_reads(cores):
    """13,000 samples/s at 1.12 ms of reading CPU each take 14.56 vCPUs: io-cpu on 14 or fewer,
    compute on 15 or more."""
    assert verdict(near(cores=cores, real=13_000))["bottleneck"] == ("io-cpu" if cores <= 14 else "compute")


def test_a_stalled_cell_is_never_called_compute_bound():
    """64% stall measured: the verdict follows the numbers (the reader binds), never "compute-bound"."""
    stalled = cell("blob", compute=1000, real=360, stall=0.64, profile="azure-blob")
    assert verdict(stalled)["bottleneck"] == "io-latency"


def test_a_step_at_the_profiles_floor_does_not_advise_a_faster_gpu():
    """A tiny model at batch 8 on an emulated H100: the estimate is the profile's per-step floor,
    the same on every GPU, so the advice cannot be "a faster device helps"."""
    from dataclasses import asdict

    from tests.benchmarks.recorded import cell
    from trainfeed.benchmarks.model.profiles import ACCELERATORS

    h100 = asdict(ACCELERATORS["h100"])
    rec = cell("parquet", "h100", compute=8 / h100["step_floor_s"], ingest=50_000.0, real=1900.0, batch_size=8,
               flops_per_step=1e6, accelerator=h100)
    v = verdict(rec)
    assert v["bottleneck"] == "compute"
    assert v["advice"].startswith("compute-bound at the h100 profile's per-step floor "
                                  f"({h100['step_floor_s'] * 1e3:,.0f} ms a step, an estimate")
    assert "A faster GPU would not shorten the step here" in v["advice"] and "A faster device" not in v["advice"]
