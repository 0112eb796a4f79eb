"""MLPerf Storage's yardstick on this machine (``make bench-mlperf``): how many emulated
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

    python -m trainfeed.benchmarks.micro.mlperf_unet3d --samples 32 > bench-out/mlperf.jsonl
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import trainfeed
from trainfeed.benchmarks.emulators import s3rver
from trainfeed.benchmarks.emulators.latency import LatencyRelay
from trainfeed.benchmarks.micro.loader_rows import ProcessesCPU

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


def epoch(loader, step_s: float | None, cpu: ProcessesCPU) -> dict:
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


def accelerator_utilization(records: list[dict], kind: str) -> float:
    """AU over a kind's epochs, as MLPerf Storage counts it: step time over step time plus the
    waits for data, the run's first step excluded (each later epoch's first wait included)."""
    waits = [w for r in records if r["kind"] == kind for w in r["waits"]][1:]
    step = next(r["step_s"] for r in records if r["kind"] == kind)
    return step * len(waits) / (step * len(waits) + sum(waits))


def run(args) -> list[dict]:
    from torch.utils.data import DataLoader

    out: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="trainfeed-mlperf-"))
    try:
        generate(work / "src", args.samples, args.shape)
        with s3rver.start("bench") as server:
            options = dict(server.storage_options)
            url = "s3://bench/unet3d.parquet"
            trainfeed.convert(str(work / "src"), url, format="parquet", labels=str(work / "src" / "labels.csv"),
                              storage_options=options)
            shutil.rmtree(work / "src")
            relay = LatencyRelay(server.port, args.latency_ms / 1000) if args.latency_ms else None
            if relay is not None:
                options = {k: v.replace(f":{server.port}", f":{relay.port}") if isinstance(v, str) else v
                           for k, v in options.items()}
            store = trainfeed.open_store(url, storage_options=options, io_concurrency=args.io_concurrency)
            dataset = trainfeed.TorchDataset(store, batch_size=BATCH, seed=0, drop_last=True)
            loader = DataLoader(dataset, batch_size=None, num_workers=args.workers, persistent_workers=args.workers > 0,
                                timeout=600 if args.workers else 0)
            cpu = ProcessesCPU()
            sample_nbytes = store.reader.spec.sample_nbytes
            assert sample_nbytes is not None, "generated volumes have one shape"
            common = {"samples": args.samples, "sample_mb": round(sample_nbytes / 1e6, 1),
                      "workers": args.workers, "latency_ms": args.latency_ms}
            for e, kind in enumerate(["ingest"] * args.epochs + [k for k in STEP_S for _ in range(args.epochs)]):
                dataset.set_epoch(e)
                rec = {"kind": kind, "epoch": e, **common, **epoch(loader, STEP_S.get(kind), cpu)}
                print(json.dumps(rec), flush=True)
                out.append(rec)
            del loader
            if relay is not None:
                relay.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def summary(records: list[dict]) -> str:
    ingest = [r for r in records if r["kind"] == "ingest"][1:] or [r for r in records if r["kind"] == "ingest"]
    gb_s = np.median([r["mb_per_s"] for r in ingest]) / 1e3
    cpu = float(np.median([r["cpu_s_per_gb"] for r in ingest]))
    sample_gb = records[0]["sample_mb"] / 1e3
    lines = [f"ingest through the DataLoader (steady state): {gb_s:.2f} GB/s at {cpu:.2f} CPU-s/GB"]
    for kind, step in STEP_S.items():
        need = BATCH * sample_gb / step * AU_TARGET  # GB/s one accelerator takes at 90% AU
        au = accelerator_utilization(records, kind)
        lines.append(f"{kind}: one takes {BATCH * sample_gb / step:.2f} GB/s at full speed, {need:.2f} at 90% AU "
                     f"({cpu * need:.1f} vCPUs of this machine's); fed here: {gb_s / need:.2f} emulated "
                     f"{kind.upper()}s at 90% AU; one emulated here: AU {au * 100:.1f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainfeed.benchmarks.micro.mlperf_unet3d", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=32, help="volumes (default 32: about 4.6 GB)")
    parser.add_argument("--shape", default="128x128x128x17", help="one float32 volume (default: 143 MB)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes (default 2)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each kind (default 2)")
    parser.add_argument("--io-concurrency", type=int, default=16, help="range requests in flight (default 16)")
    parser.add_argument("--latency-ms", type=int, default=0, help="latency added to every request (default 0)")
    args = parser.parse_args(argv)
    args.shape = tuple(int(x) for x in args.shape.split("x"))
    print(summary(run(args)), file=sys.stderr)


if __name__ == "__main__":
    main()
