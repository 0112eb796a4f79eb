"""The projection model: how fast one training job runs on one machine, and what limits it.

Every figure storage-bench advises with (the headline table, each cell's verdict, the catalog
rows, the recommendation, the reference scenario) is ``project()`` of the same measured
quantities, so no two of them can disagree. The quantities:

- the device: seconds per step on one GPU (measured, calibrated, or estimated from FLOPs), or on
  a CPU node the CPU-seconds a step costs (measured here as process CPU time);
- the layout: host CPU-seconds to read and decode one sample (process CPU time of the reader,
  which a busy machine distorts far less than a wall-clock rate), bytes moved per sample and
  bytes per request;
- the storage: per-request first-byte latency, per-stream bandwidth and connection limit, and
  the client's host CPU-seconds per GB read (probed, or the native client's default);
- the loader: requests in flight, threads that read and decode, prefetch on or off;
- the machine: vCPUs, GPUs, network bandwidth.

Each resource sustains a rate of its own; with prefetch the job runs at the smallest of them
(the binding one is the bottleneck); without prefetch reading and compute take turns, so their
times per sample add up. Request concurrency is the loader's, never scaled with vCPUs.

The machine's vCPUs are one resource shared by three consumers (``host_cpu``): the storage
client (bytes per sample x CPU-seconds per GB), the reader's decode and the framework (a CPU
node's whole step; a GPU's host work per step where measured). When their sum over the vCPUs is
what binds, the bottleneck is the largest consumer: ``io-cpu``, ``decode`` or ``compute``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainfeed.benchmarks.model.profiles import ObjectStore
from trainfeed.converters.errors import UsageError

#: The names a projection's bottleneck can take.
COMPUTE, DECODE, LATENCY, BANDWIDTH, NETWORK, IO_CPU = (
    "compute", "decode", "io-latency", "bandwidth", "network", "io-cpu")


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
    fields: dict[str, Any] = {}
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
    size_per_sample: float | None = None  # bytes a sample adds to the store at rest (None: bytes_per_sample)

    @property
    def dataset_bytes_per_sample(self) -> float:
        """What one sample of the full dataset takes at rest (a page cache holds an epoch of
        these): the store's bytes per sample without its fixed overhead where measured."""
        return self.bytes_per_sample if self.size_per_sample is None else self.size_per_sample


@dataclass(frozen=True)
class Device:
    """What computes a step: ``count`` GPUs taking ``step_s`` seconds per step each, or the CPU
    (``count`` 0), whose step costs ``step_s`` CPU-seconds spread over the machine's vCPUs.
    ``host_cpu_s``: a GPU's framework work on the host per step (CPU-seconds; measured on a real
    GPU, 0 where not measured: an emulated or estimated GPU)."""

    name: str
    count: int
    step_s: float
    how: str
    host_cpu_s: float = 0.0

    @property
    def is_gpu(self) -> bool:
        return self.count > 0

    def framework_cpu(self, batch: int) -> float:
        """Host CPU-seconds per sample of the training step itself."""
        return (self.host_cpu_s if self.is_gpu else self.step_s) / batch


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
    host_cpu: dict[str, float] = field(default_factory=dict)  # host CPU-seconds per sample, by consumer

    def seconds(self, samples: int) -> float:
        return samples / self.samples_per_s


def project(machine: Machine, layout: Layout, loader: Loader, storage: ObjectStore | None, batch: int) -> Projection:
    """The rate of a training job on ``machine`` reading ``layout`` through ``loader`` from
    ``storage`` (None: local disk, no request cost), and the resource that limits it."""
    dev = machine.device
    cpu = host_cpu(dev, layout, loader, storage, batch)
    host_s = sum(cpu.values()) / machine.vcpus  # the vCPUs, shared by the three
    # a GPU's seconds per sample; on a CPU node the step's share of the vCPUs
    compute_s = dev.step_s / batch / (dev.count if dev.is_gpu else machine.vcpus)
    decode_s = layout.cpu_s_per_sample / max(1, min(loader.threads, machine.vcpus))
    io_s, io_kind = _io_seconds(layout, loader, storage)
    net_s = layout.bytes_per_sample * 8 / (machine.network_gbps * 1e9) if machine.network_gbps else 0.0
    per_sample = {COMPUTE: compute_s, DECODE: decode_s, io_kind: io_s, NETWORK: net_s,
                  IO_CPU: cpu[IO_CPU] / machine.vcpus}
    limits = {k: 1 / v for k, v in per_sample.items() if v > 0}
    if loader.prefetch:
        seconds = max(per_sample.values())
        floor = host_s
    else:
        reading = max(decode_s, io_s, net_s) if loader.threads > 1 else decode_s + max(io_s, net_s)
        seconds = compute_s + reading
        # a CPU node cannot compute while its one reader waits on storage; a GPU's host work overlaps it
        floor = host_s + (0.0 if dev.is_gpu else max(io_s, net_s))
    bottleneck = max(per_sample, key=per_sample.__getitem__)
    if floor > seconds:  # the vCPUs bind: name their largest consumer
        seconds, bottleneck = floor, max(cpu, key=cpu.__getitem__)
    return Projection(1 / seconds, bottleneck, limits, serial=not loader.prefetch, host_cpu=cpu)


def host_cpu(device: Device, layout: Layout, loader: Loader, storage: ObjectStore | None,
             batch: int) -> dict[str, float]:
    """Host CPU-seconds per sample, by consumer: the framework (``compute``), the reader's decode
    (``decode``) and the storage client (``io-cpu``: bytes x the profile's CPU-seconds per GB at
    the loader's requests in flight; nothing for local disk, whose reads the reader's own
    measured CPU holds)."""
    io = 0.0
    if storage is not None:
        io = layout.bytes_per_sample / 1e9 * storage.io_cpu_at(in_flight(loader, storage))
    return {COMPUTE: device.framework_cpu(batch), DECODE: layout.cpu_s_per_sample, IO_CPU: io}


@dataclass(frozen=True)
class Feed:
    """What feeding a device at ``samples_per_s`` takes: GB/s from storage, and the vCPUs busy
    for it, by consumer (the storage client, decode, the framework)."""

    device: str
    samples_per_s: float
    gb_per_s: float
    in_flight: int  # the loader's requests in flight (0: local disk)
    io_cpu_s_per_gb: float  # the storage client's, at that concurrency (0: local disk)
    io: float
    decode: float
    framework: float

    @property
    def vcpus(self) -> int:
        return math.ceil(round(self.io + self.decode + self.framework, 6))

    def describe(self) -> str:
        """"N vCPUs (I/O a, decode b, framework c)"."""
        return (f"{self.vcpus} vCPU{'s' if self.vcpus != 1 else ''} (I/O {self.io:.1f}, decode {self.decode:.1f}, "
                f"framework {self.framework:.1f})")


def feed(device: Device, layout: Layout, loader: Loader, storage: ObjectStore | None, batch: int,
         samples_per_s: float | None = None) -> Feed:
    """The vCPUs busy feeding ``samples_per_s`` (default: one of ``device``'s GPUs at its own
    rate) read as ``layout`` from ``storage``."""
    rate = samples_per_s or batch / device.step_s
    cpu = host_cpu(device, layout, loader, storage, batch)
    flight = in_flight(loader, storage) if storage is not None else 0
    per_gb = storage.io_cpu_at(flight) if storage is not None else 0.0
    return Feed(device.name, rate, rate * layout.bytes_per_sample / 1e9, flight, per_gb, rate * cpu[IO_CPU],
                rate * cpu[DECODE], rate * cpu[COMPUTE])


def in_flight(loader: Loader, storage: ObjectStore) -> int:
    """Requests the loader keeps in flight on ``storage``: its own, at most the profile's limit."""
    return max(1, min(loader.concurrency, storage.max_concurrency))


def _io_seconds(layout: Layout, loader: Loader, storage: ObjectStore | None) -> tuple[float, str]:
    """Storage seconds per sample with the loader's requests in flight, and whether latency or
    transfer dominates a request."""
    if storage is None or layout.bytes_per_sample <= 0:
        return 0.0, LATENCY
    request_s = storage.request_seconds(int(layout.request_bytes))
    requests_per_sample = layout.bytes_per_sample / layout.request_bytes
    kind = LATENCY if storage.first_byte_ms / 1e3 >= request_s / 2 else BANDWIDTH
    return request_s * requests_per_sample / in_flight(loader, storage), kind
