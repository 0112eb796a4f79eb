"""The projection model: how fast one training job runs on one machine, and what limits it.

Every figure storage-bench advises with (the headline table, each cell's verdict, the catalog
rows, the recommendation, the reference scenario) is ``project()`` of the same measured
quantities, so no two of them can disagree. The quantities:

- the device: seconds per step on one GPU (measured, calibrated, or estimated from FLOPs), or on
  a CPU node the CPU-seconds a step costs (measured here as process CPU time);
- the layout: host CPU-seconds to read and decode one sample (process CPU time of the reader,
  which a busy machine distorts far less than a wall-clock rate), bytes moved per sample and
  bytes per request;
- the storage: per-request first-byte latency, per-stream bandwidth and connection limit;
- the loader: requests in flight, threads that read and decode, prefetch on or off;
- the machine: vCPUs, GPUs, network bandwidth.

Each resource sustains a rate of its own; with prefetch the job runs at the smallest of them
(the binding one is the bottleneck); without prefetch reading and compute take turns, so their
times per sample add up. Request concurrency is the loader's, never scaled with vCPUs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trainfeed.converters.errors import UsageError

from .profiles import ObjectStore

#: The names a projection's bottleneck can take.
COMPUTE, DECODE, LATENCY, BANDWIDTH, NETWORK = "compute", "decode", "io-latency", "bandwidth", "network"


@dataclass(frozen=True)
class Loader:
    """How an input pipeline reads: ``concurrency`` requests in flight to storage, ``threads``
    that read and decode (its CPU parallelism), and whether it reads ahead while the step runs."""

    name: str = "trainfeed"
    concurrency: int = 8
    threads: int = 4
    prefetch: bool = True
    framework: str = "torch"
    source: str = "trainfeed's reader as configured (--io-concurrency, --workers)"

    def describe(self) -> str:
        ahead = "prefetch" if self.prefetch else "no prefetch (reads between steps)"
        return (f"{self.name}: {self.concurrency} request{'s' if self.concurrency != 1 else ''} in flight, "
                f"{self.threads} thread{'s' if self.threads != 1 else ''}, {ahead}, {self.framework}")


def parse_loader(text: str) -> Loader:
    """``--baseline-loader``: comma-separated KEY=VALUE of name, concurrency, threads (default:
    concurrency), prefetch (on/off) and framework; e.g. ``concurrency=1,prefetch=off,framework=tf``
    for a synchronous generator that reads one file at a time."""
    fields: dict = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise UsageError(f"--baseline-loader: {item!r} is not KEY=VALUE")
        if key in ("concurrency", "threads"):
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"--baseline-loader: {key} must be a whole number >= 1, got {value!r}")
            fields[key] = int(value)
        elif key == "prefetch":
            if value.lower() not in ("on", "off", "true", "false", "yes", "no"):
                raise UsageError(f"--baseline-loader: prefetch is on or off, got {value!r}")
            fields[key] = value.lower() in ("on", "true", "yes")
        elif key in ("name", "framework"):
            fields[key] = value
        else:
            raise UsageError(f"--baseline-loader: unknown key {key!r}: use name, concurrency, threads, prefetch, "
                             "framework")
    fields.setdefault("name", "your loader")
    fields.setdefault("threads", fields.get("concurrency", 1))
    fields.setdefault("concurrency", fields["threads"])
    return Loader(**fields, source="--baseline-loader")


@dataclass(frozen=True)
class Layout:
    """What reading one store costs per sample, measured here."""

    store: str
    cpu_s_per_sample: float  # host CPU-seconds to read and decode one sample
    bytes_per_sample: float  # bytes moved from storage per sample
    request_bytes: float  # bytes per storage request
    how: str = "measured"


@dataclass(frozen=True)
class Device:
    """What computes a step: ``count`` GPUs taking ``step_s`` seconds per step each, or the CPU
    (``count`` 0), whose step costs ``step_s`` CPU-seconds spread over the machine's vCPUs."""

    name: str
    count: int
    step_s: float
    how: str

    @property
    def is_gpu(self) -> bool:
        return self.count > 0


@dataclass(frozen=True)
class Machine:
    name: str
    vcpus: int
    device: Device
    network_gbps: float | None = None


@dataclass(frozen=True)
class Projection:
    samples_per_s: float
    bottleneck: str
    limits: dict[str, float] = field(default_factory=dict)  # samples/s each resource sustains alone
    serial: bool = False  # no prefetch: input and compute took turns

    def seconds(self, samples: int) -> float:
        return samples / self.samples_per_s


def project(machine: Machine, layout: Layout, loader: Loader, storage: ObjectStore | None, batch: int) -> Projection:
    """The rate of a training job on ``machine`` reading ``layout`` through ``loader`` from
    ``storage`` (None: local disk, no request cost), and the resource that limits it."""
    dev = machine.device
    if dev.is_gpu:
        compute_s = dev.step_s / batch / dev.count  # device seconds per sample
        shared = None
    else:  # the step and the reader share the vCPUs
        compute_s = dev.step_s / batch / machine.vcpus
        shared = (dev.step_s / batch + layout.cpu_s_per_sample) / machine.vcpus
    decode_s = layout.cpu_s_per_sample / max(1, min(loader.threads, machine.vcpus))
    io_s, io_kind = _io_seconds(layout, loader, storage)
    net_s = layout.bytes_per_sample * 8 / (machine.network_gbps * 1e9) if machine.network_gbps else 0.0
    per_sample = {COMPUTE: compute_s, DECODE: decode_s, io_kind: io_s, NETWORK: net_s}
    limits = {k: 1 / v for k, v in per_sample.items() if v > 0}
    if loader.prefetch:
        seconds = max(per_sample.values())
        if shared is not None and shared > seconds:
            seconds = shared
            bottleneck = COMPUTE if compute_s >= layout.cpu_s_per_sample / machine.vcpus else DECODE
        else:
            bottleneck = max(per_sample, key=per_sample.get)
    else:
        feed = max(decode_s, io_s, net_s) if loader.threads > 1 else decode_s + max(io_s, net_s)
        seconds = compute_s + feed
        if shared is not None:
            seconds = max(seconds, shared + max(io_s, net_s))
        bottleneck = max(per_sample, key=per_sample.get)
    return Projection(1 / seconds, bottleneck, limits, serial=not loader.prefetch)


def _io_seconds(layout: Layout, loader: Loader, storage: ObjectStore | None) -> tuple[float, str]:
    """Storage seconds per sample with the loader's requests in flight, and whether latency or
    transfer dominates a request."""
    if storage is None or layout.bytes_per_sample <= 0:
        return 0.0, LATENCY
    in_flight = max(1, min(loader.concurrency, storage.max_concurrency))
    request_s = storage.request_seconds(int(layout.request_bytes))
    requests_per_sample = layout.bytes_per_sample / layout.request_bytes
    kind = LATENCY if storage.first_byte_ms / 1e3 >= request_s / 2 else BANDWIDTH
    return request_s * requests_per_sample / in_flight, kind
