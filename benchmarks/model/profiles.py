"""Named profiles: emulated accelerators (how long a training step computes) and cloud
object stores (how long a GET takes). Every figure says where it comes from; anything not
measured on a real device is labelled "estimate" wherever it is shown."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError


@dataclass(frozen=True)
class Accelerator:
    name: str
    fp32_tflops: float  # what default (non-AMP) training uses: FP32, or TF32 where cuDNN uses it
    amp_tflops: float  # dense fp16/bf16 tensor-core peak, used with --amp
    efficiency: float  # fraction of peak a 3D ResNet step reaches (an assumption, stated)
    source: str
    kind: str = "estimate"  # "estimate" (from FLOPs) or "calibrated" (measured step time)
    step_seconds: dict[str, float] | None = None  # calibrated: {"<shape>|<batch>|<width>|<amp>": seconds}
    # The least an estimated step takes, whatever its FLOPs: a training step launches hundreds of
    # kernels (forward, backward, optimizer) at microseconds each, plus the framework's own
    # per-step work, which FLOPs / peak does not see (an assumption, stated; calibrate replaces it).
    step_floor_s: float = 0.004


# Peaks are the vendors' datasheet figures (dense). PyTorch runs FP32 convolutions as TF32 on
# Ampere and Hopper by default (torch.backends.cudnn.allow_tf32), so their "fp32" figure is
# TF32. The 35% efficiency is an assumption for a small-input 3D conv net, to be replaced by
# `storage-bench calibrate` on the real device.
ACCELERATORS = {
    "t4": Accelerator("t4", 8.1, 65.0, 0.35, "NVIDIA T4 datasheet: 8.1 TFLOPS fp32, 65 fp16 tensor"),
    "v100": Accelerator("v100", 15.7, 125.0, 0.35, "NVIDIA V100 SXM2 datasheet: 15.7 TFLOPS fp32, 125 tensor"),
    "a10g": Accelerator("a10g", 31.2, 125.0, 0.35,
                        "NVIDIA A10 datasheet (A10G is AWS's A10): 31.2 fp32, 125 fp16 tensor"),
    "a100": Accelerator("a100", 156.0, 312.0, 0.35, "NVIDIA A100 datasheet: 156 TFLOPS TF32, 312 bf16 tensor"),
    "h100": Accelerator("h100", 494.0, 989.0, 0.35, "NVIDIA H100 SXM datasheet: 494 TFLOPS TF32, 989 bf16 tensor"),
}


def model_flops(input_shape: tuple[int, ...], width: int = 64, outputs: int = 1) -> float:
    """Training FLOPs per sample of the ResNet-18 (forward MACs x 2, backward ~2x forward)."""
    import torch

    from trainfeed.training.models.resnet_torch import build

    model = build(input_shape, outputs, width).eval()  # eval: batch-norm accepts a batch of one
    macs = [0]

    def hook(mod: torch.nn.Module, inputs: object, out: torch.Tensor) -> None:
        if isinstance(mod, (torch.nn.Conv3d, torch.nn.Conv2d)):
            k = int(torch.tensor(mod.kernel_size).prod())
            macs[0] += out.numel() * (mod.in_channels // mod.groups) * k
        elif isinstance(mod, torch.nn.Linear):
            macs[0] += out.numel() * mod.in_features

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (torch.nn.Conv3d, torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model(torch.zeros(1, *input_shape))
    for h in handles:
        h.remove()
    return 2.0 * macs[0] * 3


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
        return Accelerator(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise TrainfeedError(f"{path}: malformed accelerator profile: {exc}") from exc


def save_accelerator(acc: Accelerator, path: Path) -> None:
    path.write_text(json.dumps(asdict(acc), indent=1))


def calibration_key(shape: Sequence[int], batch: int, width: int, amp: bool) -> str:
    return f"{'x'.join(map(str, shape))}|{batch}|{width}|{'amp' if amp else 'fp32'}"


def step_seconds(acc: Accelerator, flops_per_step: float, key: str, amp: bool = False) -> tuple[float, str]:
    """Compute time of one training step on ``acc`` and how it was obtained: measured by
    `calibrate` for this shape, else FLOPs / (peak x efficiency) but at least the per-step
    floor, an estimate."""
    if acc.step_seconds and key in acc.step_seconds:
        return float(acc.step_seconds[key]), "calibrated"
    peak = acc.amp_tflops if amp else acc.fp32_tflops
    return max(acc.step_floor_s, flops_per_step / (peak * 1e12 * acc.efficiency)), "estimate"


#: The storage client's host CPU-seconds per GB read, by requests in flight, for a profile that
#: has no figures of its own (the presets, scenarios, profiles probed before the probe measured
#: it). Measured here for trainfeed's native client (obstore) over plain HTTP on loopback, 2-vCPU
#: VM at load ~10: `storage-bench probe` of Azurite (4 MB ranges, 9 runs) and `make bench-io`'s
#: floor (8 MB ranges, Azurite and s3rver, 3 rounds) gave 0.55-1.25 CPU-s/GB at each of 1, 8 and
#: 32 in flight, the 45 figures' median 0.79; the levels were not told apart, hence one figure.
IO_CPU_S_PER_GB = {"1": 0.8, "8": 0.8, "32": 0.8}
IO_CPU_SOURCE = ("trainfeed's native client, measured on loopback (Azurite, s3rver; plain HTTP): 0.8 CPU-s per GB "
                 "at 1 to 32 in flight, the median of 45 runs (0.55-1.25); a cloud endpoint's TLS adds to it; "
                 "`storage-bench probe` measures yours")


@dataclass(frozen=True)
class ObjectStore:
    """Latency model of one request: first-byte latency, then the payload at per-stream
    bandwidth, with at most ``max_concurrency`` requests in flight from one client; and what
    reading costs the client's host: CPU-seconds per GB by requests in flight."""

    name: str
    first_byte_ms: float
    stream_mb_per_s: float
    max_concurrency: int
    source: str
    kind: str = "preset"  # "preset" (providers' published figures) or "probed" (`storage-bench probe`)
    detail: dict[str, Any] | None = None  # probed: latency percentiles, throughput by concurrency, ...
    # probed: {"<requests in flight>": CPU-s per GB}; None: IO_CPU_S_PER_GB
    io_cpu_s_per_gb: dict[str, float] | None = None

    def request_seconds(self, nbytes: float) -> float:
        """Modelled duration of one request that returns ``nbytes``."""
        return self.first_byte_ms / 1e3 + nbytes / (self.stream_mb_per_s * 1e6)

    @property
    def io_cpu_figures(self) -> dict[str, float]:
        """The client's CPU-seconds per GB by requests in flight: probed, else IO_CPU_S_PER_GB."""
        return self.io_cpu_s_per_gb or IO_CPU_S_PER_GB

    def io_cpu_at(self, in_flight: int) -> float:
        """Host CPU-seconds per GB the client spends reading with ``in_flight`` requests in flight:
        ``io_cpu_figures`` interpolated on log2 of the concurrency, the nearest end's figure
        outside them."""
        levels = sorted((int(k), float(v)) for k, v in self.io_cpu_figures.items())
        return float(np.interp(math.log2(max(1, in_flight)), [math.log2(k) for k, _ in levels],
                               [v for _, v in levels]))

    @property
    def io_cpu_source(self) -> str:
        """Where ``io_cpu_at``'s figure comes from, in a few words (IO_CPU_SOURCE in full)."""
        return "probed" if self.io_cpu_s_per_gb else "the native client's default, measured on loopback"


def bound_mb_per_s(profile: ObjectStore, connections: int, request_bytes: float) -> float:
    """The most MB/s a reader issuing requests of ``request_bytes`` on ``connections``
    connections can get from ``profile``: every connection busy all the time (at most
    ``max_concurrency`` of them). With ``request_bytes`` = bytes / requests of a real run,
    it is that run's bytes over its modelled request time packed onto the connections."""
    if request_bytes <= 0:
        return 0.0
    return min(connections, profile.max_concurrency) * request_bytes / profile.request_seconds(request_bytes) / 1e6


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


def load_object_store(name_or_path: str | Path | ObjectStore) -> ObjectStore:
    """A preset name (azure-blob, s3, lan) or a JSON profile written by `storage-bench probe`."""
    if isinstance(name_or_path, ObjectStore):
        return name_or_path
    key = str(name_or_path).lower()
    if key in OBJECT_STORES:
        return OBJECT_STORES[key]
    path = Path(name_or_path)
    if not path.is_file():
        raise UsageError(f"unknown storage profile {str(name_or_path)!r}: choose from {', '.join(OBJECT_STORES)}, "
                         "or a profile file written by `storage-bench probe`")
    try:
        profile = ObjectStore(**json.loads(path.read_text()))
        valid = profile.first_byte_ms >= 0 and profile.stream_mb_per_s > 0 and profile.max_concurrency >= 1
        cpu_valid = all(str(k).isdigit() and int(k) >= 1 and float(v) >= 0
                        for k, v in (profile.io_cpu_s_per_gb or {}).items())
    except (json.JSONDecodeError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as exc:
        raise TrainfeedError(f"{path}: malformed object-store profile: {exc}") from exc
    if not valid or not cpu_valid:
        raise TrainfeedError(f"{path}: malformed object-store profile: needs first_byte_ms >= 0, "
                             "stream_mb_per_s > 0, max_concurrency >= 1 and io_cpu_s_per_gb (if given) "
                             "{\"<requests in flight>\": CPU-s per GB >= 0}")
    return profile


def save_object_store(profile: ObjectStore, path: Path) -> None:
    Path(path).write_text(json.dumps(asdict(profile), indent=1) + "\n")
