"""Every branch of `matrix.verdict`, one recorded cell each, at and beside its thresholds:
a changed threshold, branch order or advice fails a row."""
from __future__ import annotations

import pytest

from trainfeed.benchmarks.matrix import verdict

from .recorded import cell

COMPUTE_ADVICE = "A faster device or more devices help; repacking does not."
ROWS = [
    # id, the cell, expected bottleneck, expected advice
    ("swapping", cell(compute=100, ingest=500, real=100, swap_mb=100.5), "ram",
     "RAM: the working set exceeds memory and the node swaps; pick an instance with more RAM or lower --workers / "
     "--shuffle-buffer"),
    ("swap of 100 MB is not swapping", cell(compute=100, ingest=500, real=100, stall=0.25, swap_mb=100), "compute",
     f"compute-bound (AU 75%): the accelerator is the limit; storage is not. {COMPUTE_ADVICE}"),
    ("real at 90% of compute, emulated", cell(compute=100, ingest=10, real=90, stall=0.5), "compute",
     f"compute-bound (AU 50%): the accelerator is the limit; storage is not. {COMPUTE_ADVICE}"),
    ("real at 90% of compute, real CPU", cell(node="cpu", node_kind="real", compute=100, ingest=10, real=90),
     "compute", f"compute-bound (AU 100%): the CPU is the limit; storage is not. {COMPUTE_ADVICE}"),
    ("blob under a latency profile", cell("blob", compute=1000, ingest=100, real=100, workers=4, io_concurrency=16,
                                          profile="azure-blob"), "io-latency",
     "blob GETs: 20 ms each, 16 in flight -> at most 100 samples/s for a device that takes 1000; repack into files "
     "of ~128 MB (convert --to delta) or allow more requests in flight (io_concurrency)"),
    ("blob as it is", cell("blob", compute=1000, ingest=100, real=100, workers=8, io_concurrency=None), "io-latency",
     "blob GETs: 8 in flight -> at most 100 samples/s for a device that takes 1000; repack into files of ~128 MB "
     "(convert --to delta) or raise --workers"),
    ("ingest below 90% of compute", cell(compute=1000, ingest=300, real=299, cores=4), "ingest",
     "read/decode-bound on 4 vCPUs: the reader delivers 300 samples/s, the device takes 1000; needs ~14 vCPUs per "
     "device, or offload preprocessing to CPU workers"),
    ("no ingest rate recorded", cell(compute=100, ingest=None, real=1, cores=2), "ingest",
     "read/decode-bound on 2 vCPUs: the reader delivers 0 samples/s, the device takes 100; needs ~200000000000 "
     "vCPUs per device, or offload preprocessing to CPU workers"),
    ("ingest at 90%, real below", cell(compute=100, ingest=90, real=50, cores=4), "contention",
     "reader and step compete for 4 vCPUs: ingest alone (90 samples/s) and compute alone (100) would keep up, "
     "together they reach 50; give the input pipeline its own cores (more vCPUs per device)"),
    ("real just under 90%", cell(compute=100, ingest=100, real=89.9, cores=8), "contention",
     "reader and step compete for 8 vCPUs: ingest alone (100 samples/s) and compute alone (100) would keep up, "
     "together they reach 90; give the input pipeline its own cores (more vCPUs per device)"),
]


@pytest.mark.parametrize("recorded,bottleneck,advice", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_verdict(recorded, bottleneck, advice):
    assert verdict(recorded) == {"bottleneck": bottleneck, "advice": advice}


def test_every_bottleneck_has_a_row():
    assert {r[2] for r in ROWS} == {"ram", "compute", "io-latency", "ingest", "contention"}
