"""`storage-bench mlperf` end to end on tiny volumes (s3rver, 2 DataLoader workers): every epoch
delivers every whole batch of the store, and the summary is what its records say."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainfeed.benchmarks.mlperf import BATCH, STEP_S, accelerator_utilization, summary

pytestmark = pytest.mark.slow  # a matrix of real conversions and reads: `make test`, not test-fast


def _storage_bench(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("storage-bench")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRAINFEED_DEBUG": "1"})


def test_mlperf_reads_every_batch_through_workers_and_summarises_it():
    shape, samples = (8, 8, 4, 2), 17  # 2 whole batches of 7; 3 samples dropped
    proc = _storage_bench("mlperf", "--samples", str(samples), "--shape", "x".join(map(str, shape)),
                          "--workers", "2", "--epochs", "2")
    if proc.returncode != 0 and "s3rver" in proc.stderr and "node" in proc.stderr.lower():
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    epochs, result = records[:-1], records[-1]
    assert [r["kind"] for r in epochs] == ["ingest"] * 2 + ["h100"] * 2 + ["a100"] * 2
    assert [r["epoch"] for r in epochs] == list(range(6))
    batch_bytes = BATCH * 4 * int(np.prod(shape))
    for r in epochs:
        assert (r["steps"], r["bytes"], r["workers"]) == (samples // BATCH, 2 * batch_bytes, 2)
        assert ("waits" in r) == (r["kind"] != "ingest")
    assert result == summary(epochs)
    assert result["kind"] == "summary"
    first_left_out = epochs[1]["bytes"] / epochs[1]["seconds"] / 1e9
    assert result["ingest_gb_per_s"] == pytest.approx(first_left_out, rel=1e-3, abs=1e-6)
    for kind, step in STEP_S.items():
        k = result[kind]
        assert k["au_one_emulated"] == pytest.approx(accelerator_utilization(epochs, kind), abs=1e-4)
        assert k["gb_per_s_full_speed"] == pytest.approx(batch_bytes / 1e9 / step, rel=1e-3)
        assert k["gb_per_s_at_90_au"] == pytest.approx(0.9 * k["gb_per_s_full_speed"], rel=1e-3)
    assert "emulated H100s at 90% AU" in proc.stderr


def test_accelerator_utilization_counts_waits_after_the_first_step():
    records = [{"kind": "h100", "step_s": 0.5, "waits": [9.0, 0.5, 0.0]},
               {"kind": "h100", "step_s": 0.5, "waits": [0.5]}]
    # the first wait (the pipeline's start) is left out: 3 steps of 0.5 s against 1.0 s of waiting
    assert accelerator_utilization(records, "h100") == pytest.approx(1.5 / 2.5)
    assert accelerator_utilization([{"kind": "h100", "step_s": 0.5, "waits": [1.0]}], "h100") is None


def test_fewer_samples_than_a_batch_is_a_usage_error():
    proc = _storage_bench("mlperf", "--samples", str(BATCH - 1))
    assert proc.returncode == 2 and f"--samples must be at least {BATCH}" in proc.stderr
