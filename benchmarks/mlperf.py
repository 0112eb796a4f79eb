"""MLPerf Storage's yardstick on this machine (``storage-bench mlperf``, ``make bench-mlperf``): how many emulated
accelerators of its 3D U-Net workload the machine feeds from an S3 server through a PyTorch
DataLoader's workers, at the accelerator utilization (AU) MLPerf Storage requires (>= 90%).

The workload, as MLPerf Storage's (mlcommons/storage ``configs/dlio/workload/unet3d_*.yaml``):
one volume of about 140 MB a sample, batches of 7, a step that takes 0.323 s on an emulated
H100 and 0.636 s on an emulated A100 (the emulation sleeps, as DLIO's does: the host stays
free for the input pipeline). The volumes (``--shape``, float32) are generated, converted to
Parquet straight onto s3rver (a file-backed S3 server on loopback, on this machine's cores),
and read with ``TorchDataset`` through ``DataLoader(num_workers=--workers,
persistent_workers=True)``:

- **ingest**: epochs with no step: MB/s delivered and CPU-seconds per GB (training process and
  workers), the rate the machine can feed;
- **h100**, **a100**: epochs with the emulated step after every batch: AU (step time over wall
  time, the first step excluded) and the data wait per step.

The summary says how many emulated accelerators of each kind the ingest rate feeds at 90% AU
(an accelerator at 90% AU takes 7 samples every step time / 0.9, i.e. 0.9 x its full-speed
GB/s), and the vCPUs each takes at the measured CPU per GB; beside MLPerf Storage v1.0's
published single-client results (docs/BENCHMARKS.md).

    storage-bench mlperf --samples 32 > bench-out/mlperf.jsonl
"""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import trainfeed
from trainfeed.benchmarks.ab.hostload import ProcessesCPU
from trainfeed.benchmarks.emulators import s3rver
from trainfeed.benchmarks.emulators.latency import LatencyRelay

if TYPE_CHECKING:
    import torch

#: MLPerf Storage's 3D U-Net: batch and emulated step times (mlcommons/storage, unet3d_h100.yaml / unet3d_a100.yaml).
BATCH = 7
STEP_S = {"h100": 0.323, "a100": 0.636}
AU_TARGET = 0.9


def generate(folder: Path, samples: int, shape: tuple[int, ...]) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    count = int(np.prod(shape))
    for i in range(samples):
        volume = rng.integers(0, 1 << 23, count, dtype=np.int32).astype(np.float32).reshape(shape)
        np.save(folder / f"case_{i:05d}.npy", volume)
    (folder / "labels.csv").write_text("id,label\n" + "".join(f"case_{i:05d},{i % 2}\n" for i in range(samples)))


def epoch(loader: Iterable[tuple[torch.Tensor, Any]], step_s: float | None, cpu: ProcessesCPU) -> dict[str, Any]:
    """One epoch: bytes, wall, CPU and, with an emulated step, each step's wait for its batch."""
    c0 = cpu.seconds()
    t0 = last = time.perf_counter()
    nbytes, waits, steps = 0, [], 0
    for x, _ in loader:
        now = time.perf_counter()
        waits.append(now - last)
        nbytes += x.nbytes
        float(x.view(-1)[::65536].sum())  # touch the batch, as a host-to-device copy would
        if step_s:
            time.sleep(step_s)
        steps += 1
        last = time.perf_counter()
    wall = time.perf_counter() - t0
    return {"bytes": nbytes, "steps": steps, "seconds": round(wall, 3), "mb_per_s": round(nbytes / wall / 1e6, 1),
            "cpu_s_per_gb": round((cpu.seconds() - c0) / (nbytes / 1e9), 3),
            **({"step_s": step_s, "waits": [round(w, 4) for w in waits]} if step_s else {})}


def accelerator_utilization(records: list[dict[str, Any]], kind: str) -> float | None:
    """AU over a kind's epochs, as MLPerf Storage counts it: step time over step time plus the
    waits for data, the kind's first step excluded (each later epoch's first wait included);
    None when there was no other step."""
    waits: list[float] = [w for r in records if r["kind"] == kind for w in r["waits"]][1:]
    if not waits:
        return None
    step: float = next(r["step_s"] for r in records if r["kind"] == kind)
    return step * len(waits) / (step * len(waits) + sum(waits))


@dataclass(frozen=True)
class Workload:
    """What one run measures: the volumes generated, the DataLoader reading them, the server's added latency."""

    samples: int = 32
    shape: tuple[int, ...] = (128, 128, 128, 17)  # float32: 143 MB, MLPerf's ~140 MB case
    workers: int = 2
    epochs: int = 2
    io_concurrency: int = 16
    latency_ms: int = 0


def run(w: Workload, emit: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Generate, convert onto s3rver and read ``w.epochs`` ingest epochs and as many of each
    emulated accelerator; each epoch's record goes to ``emit`` as it ends."""
    from torch.utils.data import DataLoader

    out: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="trainfeed-mlperf-"))
    try:
        generate(work / "src", w.samples, w.shape)
        with s3rver.start("bench") as server:
            options = dict(server.storage_options)
            url = "s3://bench/unet3d.parquet"
            trainfeed.convert(str(work / "src"), url, format="parquet", labels=str(work / "src" / "labels.csv"),
                              storage_options=options)
            shutil.rmtree(work / "src")
            relay = LatencyRelay(server.port, w.latency_ms / 1000) if w.latency_ms else None
            if relay is not None:
                options = {k: v.replace(f":{server.port}", f":{relay.port}") if isinstance(v, str) else v
                           for k, v in options.items()}
            store = trainfeed.open_store(url, storage_options=options, io_concurrency=w.io_concurrency)
            dataset = trainfeed.TorchDataset(store, batch_size=BATCH, seed=0, drop_last=True)
            loader = DataLoader(dataset, batch_size=None, num_workers=w.workers, persistent_workers=w.workers > 0,
                                timeout=600 if w.workers else 0)
            cpu = ProcessesCPU()
            sample_nbytes = store.reader.spec.sample_nbytes
            assert sample_nbytes is not None, "generated volumes have one shape"
            common = {"samples": w.samples, "sample_mb": round(sample_nbytes / 1e6, 1),
                      "workers": w.workers, "latency_ms": w.latency_ms}
            for e, kind in enumerate(["ingest"] * w.epochs + [k for k in STEP_S for _ in range(w.epochs)]):
                dataset.set_epoch(e)
                rec = {"kind": kind, "epoch": e, **common, **epoch(loader, STEP_S.get(kind), cpu)}
                emit(rec)
                out.append(rec)
            del loader
            if relay is not None:
                relay.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The steady-state ingest rate (the first epoch left out when there are more) and, per
    accelerator, the GB/s one takes at 90% AU, how many the ingest rate feeds, the vCPUs of this
    machine each takes, and the AU measured with one emulated here."""
    ingest = [r for r in records if r["kind"] == "ingest"][1:] or [r for r in records if r["kind"] == "ingest"]
    gb_s = float(np.median([r["bytes"] / r["seconds"] for r in ingest])) / 1e9
    cpu = float(np.median([r["cpu_s_per_gb"] for r in ingest]))
    sample_gb = records[0]["bytes"] / records[0]["steps"] / BATCH / 1e9
    out: dict[str, Any] = {"kind": "summary", "ingest_gb_per_s": _sig(gb_s), "cpu_s_per_gb": round(cpu, 3)}
    for kind, step in STEP_S.items():
        need = BATCH * sample_gb / step * AU_TARGET  # GB/s one accelerator takes at 90% AU
        au = accelerator_utilization(records, kind)
        out[kind] = {"gb_per_s_full_speed": _sig(BATCH * sample_gb / step), "gb_per_s_at_90_au": _sig(need),
                     "vcpus_each": round(cpu * need, 2), "fed_at_90_au": round(gb_s / need, 3),
                     "au_one_emulated": au if au is None else round(au, 4)}
    return out


def summary_text(s: dict[str, Any]) -> str:
    lines = [f"ingest through the DataLoader (steady state): {s['ingest_gb_per_s']:.2f} GB/s at "
             f"{s['cpu_s_per_gb']:.2f} CPU-s/GB"]
    for kind in STEP_S:
        k = s[kind]
        au = "n/a (one step)" if k["au_one_emulated"] is None else f"{k['au_one_emulated'] * 100:.1f}%"
        lines.append(f"{kind}: one takes {k['gb_per_s_full_speed']:.2f} GB/s at full speed, "
                     f"{k['gb_per_s_at_90_au']:.2f} at 90% AU ({k['vcpus_each']:.1f} vCPUs of this machine's); "
                     f"fed here: {k['fed_at_90_au']:.2f} "
                     f"emulated {kind.upper()}s at 90% AU; one emulated here: AU {au}")
    return "\n".join(lines)
