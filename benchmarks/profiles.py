"""Named profiles: emulated accelerators (how long a training step computes) and cloud
object stores (how long a GET takes). Every figure says where it comes from; anything not
measured on a real device is labelled "estimate" wherever it is shown."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from converters.errors import TrainfeedError, UsageError


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_tflops: float  # dense, the precision a framework uses by default for training
    precision: str
    efficiency: float  # fraction of peak a 3D ResNet step reaches (assumption, stated)
    source: str
    kind: str = "estimate"  # "estimate" (from FLOPs) or "calibrated" (measured step time)
    step_seconds: dict | None = None  # calibrated: {"<shape>|<batch>|<width>": seconds}


# Peak figures are the vendors' datasheet numbers; the 35% efficiency is an assumption for a
# small-input 3D conv net (MLPerf-style convnets reach 30-50% of peak), to be replaced by
# `storage-bench calibrate` on the real device.
ACCELERATORS = {
    "t4": Accelerator("t4", 65.0, "fp16 tensor", 0.35, "NVIDIA T4 datasheet: 65 TFLOPS fp16 (mixed precision)"),
    "v100": Accelerator("v100", 125.0, "fp16 tensor", 0.35, "NVIDIA V100 SXM2 datasheet: 125 TFLOPS tensor"),
    "a10g": Accelerator("a10g", 125.0, "fp16 tensor", 0.35, "NVIDIA A10 datasheet: 125 TFLOPS fp16 tensor (A10G ~ A10)"),
    "a100": Accelerator("a100", 312.0, "bf16 tensor", 0.35, "NVIDIA A100 datasheet: 312 TFLOPS bf16 tensor"),
    "h100": Accelerator("h100", 989.0, "bf16 tensor", 0.35, "NVIDIA H100 SXM datasheet: 989 TFLOPS bf16 tensor (dense)"),
}


def load_accelerator(name_or_path: str) -> Accelerator:
    """A built-in name (t4, v100, a10g, a100, h100) or a JSON profile written by `calibrate`."""
    key = name_or_path.lower()
    if key in ACCELERATORS:
        return ACCELERATORS[key]
    path = Path(name_or_path)
    if not path.is_file():
        raise UsageError(f"unknown node {name_or_path!r}: use cpu, cuda, one of {', '.join(ACCELERATORS)}, "
                         "or a profile file written by `storage-bench calibrate`")
    try:
        data = json.loads(path.read_text())
        return Accelerator(**data)
    except (json.JSONDecodeError, TypeError) as exc:
        raise TrainfeedError(f"{path}: malformed accelerator profile: {exc}") from exc


def save_accelerator(acc: Accelerator, path: Path) -> None:
    path.write_text(json.dumps(asdict(acc), indent=1))


def step_seconds(acc: Accelerator, flops_per_step: float, key: str | None = None) -> float:
    """Compute time of one training step on ``acc``: calibrated if measured for this shape,
    else FLOPs / (peak x efficiency)."""
    if acc.step_seconds and key in acc.step_seconds:
        return float(acc.step_seconds[key])
    return flops_per_step / (acc.peak_tflops * 1e12 * acc.efficiency)


@dataclass(frozen=True)
class ObjectStore:
    """Latency model of one GET: first-byte latency, then the payload at per-stream bandwidth,
    with at most ``max_concurrency`` requests in flight from one client."""

    name: str
    first_byte_ms: float
    stream_mb_per_s: float
    max_concurrency: int
    source: str


# Figures from the providers' public performance guidance:
# - AWS, "Performance design patterns for Amazon S3": small-object first-byte latency of
#   100-200 ms; 5,500 GET/s per prefix; ~85-90 MB/s per connection is the commonly used
#   single-stream figure (the guide recommends parallel connections for throughput).
# - Azure, "Scalability and performance targets for Blob storage" and "Performance
#   checklist": request rate up to 20,000 requests/s per account; end-to-end latency for
#   small blobs typically in the tens of ms (the Azure portal's E2E latency metric); we take
#   20 ms. Single-blob throughput up to 60 MiB/s per blob is the documented per-blob target.
OBJECT_STORES = {
    "azure-blob": ObjectStore("azure-blob", 20.0, 60.0, 64,
                              "Azure Blob scalability targets (60 MiB/s per blob, 20k req/s per account); "
                              "20 ms small-blob E2E latency (typical, Azure performance checklist)"),
    "s3": ObjectStore("s3", 100.0, 85.0, 64,
                      "AWS 'Performance design patterns for Amazon S3': 100-200 ms first byte for small objects, "
                      "5,500 GET/s per prefix; ~85 MB/s per connection"),
    "lan": ObjectStore("lan", 1.0, 500.0, 256, "a nearby file server: 1 ms per request (illustration, not a cloud)"),
}


def load_object_store(name: str) -> ObjectStore:
    try:
        return OBJECT_STORES[name.lower()]
    except KeyError:
        raise UsageError(f"unknown blob profile {name!r}: choose from {', '.join(OBJECT_STORES)}") from None
