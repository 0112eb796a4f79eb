"""`storage-bench probe`: measure an object store (any fsspec location) as the latency
emulation models one, and save the result as a profile it replays (kind "probed").

Four measurements, on objects the probe writes under ``URL/_trainfeed-probe-<id>/`` (deleted
afterwards, also on failure or Ctrl-C) or, with ``existing``, on objects already there:

- small GETs one at a time: the request-time distribution (p50/p90/p99);
- large range reads on one connection: single-stream time;
- range reads of a medium size at concurrency 1, 2, 4, ... up to ``max_concurrency``;
- the client's CPU: this process's CPU time (``time.process_time``, every thread, the native
  client's own included) per GB of range reads at 1, 8 and 32 in flight (those up to
  ``max_concurrency``), each over ``CPU_PASSES`` times the large object's bytes.

Every read goes through trainfeed's own client, as the reader fetches: the native client's
``get_range`` (Azure Blob, S3, GCS: one buffer, no copy), else the file system's ``cat_file``.
The model's two parameters come from the medians of the first two, ``t = latency + bytes /
bandwidth`` solved for both; its connection cap is the sweep's best aggregate throughput over
its single-connection throughput (how many connections' worth the store delivers at most).
"""
from __future__ import annotations

import math
import posixpath
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import fsspec
import numpy as np
from fsspec import AbstractFileSystem

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.redact import redact, redact_url
from trainfeed.converters.storage.filesystems import is_local, open_fs
from trainfeed.converters.storage.native import NativeFileSystem

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

from trainfeed.benchmarks.model.profiles import ObjectStore

SMALL_OBJECTS = 8  # small GETs cycle over this many objects
LARGE_READS = 3
SWEEP_ROUNDS = 3  # range reads per connection at each concurrency
CPU_LEVELS = (1, 8, 32)  # requests in flight the client's CPU per GB is measured at
CPU_PASSES = 8  # each CPU level reads this many times the large object's bytes (at least)


@dataclass(frozen=True)
class ProbeConfig:
    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    small_size: int = 64 * 10**3
    large_size: int = 32 * 10**6
    samples: int = 50
    max_concurrency: int = 64
    existing: bool = False
    name: str = "probed"


@dataclass(frozen=True)
class Objects:
    """What the probe reads: paths inside the probed filesystem, and the byte counts read."""

    small: list[str]
    small_bytes: int
    large: str
    large_bytes: int
    how: str


def check(cfg: ProbeConfig) -> None:
    if cfg.samples < 1:
        raise UsageError("--samples must be at least 1")
    if cfg.max_concurrency < 1:
        raise UsageError("--max-concurrency must be at least 1")
    if cfg.large_size <= cfg.small_size:
        raise UsageError(f"--large-size ({cfg.large_size:,} bytes) must be larger than --small-size "
                         f"({cfg.small_size:,} bytes): the two sizes separate latency from bandwidth")


def probe(cfg: ProbeConfig, log: Callable[[str], None] = lambda m: None) -> ObjectStore:
    """Measure ``cfg.url`` and return its profile."""
    check(cfg)
    fs, root = open_fs(cfg.url, cfg.storage_options)
    shown = redact_url(cfg.url) if "://" in cfg.url else root
    root = root.rstrip("/")
    if cfg.existing:
        return measure(fs, _existing(fs, root, cfg, shown), cfg, shown, log)
    writer, writer_root = _writer(fs, root)
    sub = f"_trainfeed-probe-{uuid.uuid4().hex[:12]}"
    try:
        objects = _write(writer, posixpath.join(writer_root, sub), posixpath.join(root, sub), cfg, shown, log)
        return measure(fs, objects, cfg, shown, log)
    finally:
        _remove(writer, posixpath.join(writer_root, sub), shown, log)


def _writer(fs: fsspec.AbstractFileSystem, root: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """Where the probe objects are written: the storage itself, or the one under a wrapper
    filesystem (the latency emulation is read-only; the same paths are read through it)."""
    inner = getattr(fs, "inner_url", None)
    if inner is None:
        return fs, root
    writer, path = open_fs(inner(root), fs.inner_options)
    return writer, path.rstrip("/")


def _write(writer: AbstractFileSystem, prefix: str, read_prefix: str, cfg: ProbeConfig, shown: str,
           log: Callable[[str], None]) -> Objects:
    rng = np.random.default_rng()  # incompressible payloads
    sub = posixpath.basename(prefix)
    log(f"writing {SMALL_OBJECTS} objects of {cfg.small_size:,} B and one of {cfg.large_size:,} B under {shown}/{sub}/")
    try:
        if is_local(writer):
            if not writer.isdir(posixpath.dirname(prefix)):
                raise TrainfeedError(f"{shown}: folder does not exist")
            writer.makedirs(prefix, exist_ok=True)
        for i in range(SMALL_OBJECTS):
            writer.pipe_file(f"{prefix}/small-{i}", rng.bytes(cfg.small_size))
        writer.pipe_file(f"{prefix}/large", rng.bytes(cfg.large_size))
    except TrainfeedError:
        raise
    except Exception as exc:  # each storage raises its own types
        raise TrainfeedError(redact(f"{shown}: cannot write the probe objects: {exc}")) from exc
    return Objects([f"{read_prefix}/small-{i}" for i in range(SMALL_OBJECTS)], cfg.small_size,
                   f"{read_prefix}/large", cfg.large_size, f"written under {sub}/ and deleted afterwards")


def _remove(writer: AbstractFileSystem, prefix: str, shown: str, log: Callable[[str], None]) -> None:
    try:
        if writer.exists(prefix):
            writer.rm(prefix, recursive=True)
    except Exception as exc:  # never hide the probe's own outcome; say what is left behind
        log(redact(f"warning: {shown}/{posixpath.basename(prefix)}/ could not be deleted: {exc}"))


def _existing(fs: AbstractFileSystem, root: str, cfg: ProbeConfig, shown: str) -> Objects:
    """Objects already under ``root``: small GETs read the first ``small_size`` bytes of
    objects at least that large; the large reads, the start of the largest one."""
    try:
        sizes = {p: int(info.get("size") or 0) for p, info in fs.find(root, detail=True).items()
                 if info.get("type") == "file"}
    except Exception as exc:
        raise TrainfeedError(redact(f"{shown}: cannot list: {exc}")) from exc
    small = sorted(p for p, size in sizes.items() if size >= cfg.small_size)[:SMALL_OBJECTS]
    large = max(sizes, key=sizes.__getitem__, default=None)
    if not small or large is None or sizes[large] < 2 * cfg.small_size:
        raise TrainfeedError(f"{shown}: --existing needs objects of at least --small-size ({cfg.small_size:,} B) "
                             f"and one of at least twice that; found {len(sizes)} objects, the largest "
                             f"{max(sizes.values(), default=0):,} B")
    large_bytes = min(sizes[large], cfg.large_size)
    return Objects(small, cfg.small_size, large, large_bytes, f"existing objects ({len(small)} small, 1 large)")


Read = Callable[[str, int, int], "Buffer"]


def reader(fs: AbstractFileSystem) -> Read:
    """``read(path, start, end)``: a range as trainfeed's reader fetches it (``Fetcher``), through
    the native client's ``get_range`` for Azure Blob, S3 and GCS, else the file system's
    ``cat_file``."""
    if isinstance(fs, NativeFileSystem):
        return fs.get_range
    return lambda path, start, end: fs.cat_file(path, start=start, end=end)


def _timed_get(read: Read, path: str, nbytes: int) -> float:
    t0 = time.perf_counter()
    got = memoryview(read(path, 0, nbytes)).nbytes
    seconds = time.perf_counter() - t0
    if got != nbytes:
        raise TrainfeedError(f"{path}: read {got:,} bytes, expected {nbytes:,}")
    return seconds


class Sweep(NamedTuple):
    mb_per_s: float
    requests_per_s: float
    cpu_s_per_gb: float  # this process's CPU time (every thread) per GB read
    nbytes: int


def _sweep(read: Read, path: str, size: int, chunk: int, connections: int, rounds: int = SWEEP_ROUNDS) -> Sweep:
    """``connections`` threads each reading ``rounds`` ranges of ``chunk`` bytes, timed (wall and
    process CPU) from the moment all of them are ready (thread start-up excluded)."""
    slots = max(1, size // chunk)
    began: list[float] = []
    ready = threading.Barrier(connections, action=lambda: began.append(time.process_time()))

    def connection(k: int) -> tuple[float, float, int]:
        ready.wait()
        t0, nbytes = time.perf_counter(), 0
        for r in range(rounds):
            start = ((k * rounds + r) % slots) * chunk
            nbytes += memoryview(read(path, start, start + chunk)).nbytes
        return t0, time.perf_counter(), nbytes

    with ThreadPoolExecutor(connections) as pool:
        runs = list(pool.map(connection, range(connections)))
    cpu = time.process_time() - began[0]
    seconds = max(r[1] for r in runs) - min(r[0] for r in runs)
    nbytes = sum(r[2] for r in runs)
    return Sweep(nbytes / seconds / 1e6, connections * rounds / seconds, cpu / (nbytes / 1e9), nbytes)


def _client_cpu(read: Read, objects: Objects, chunk: int, cfg: ProbeConfig,
                log: Callable[[str], None]) -> dict[str, Sweep]:
    """The client's CPU-seconds per GB of range reads of ``chunk`` bytes at each of CPU_LEVELS up
    to ``max_concurrency`` in flight, each over CPU_PASSES times the large object's bytes."""
    out = {}
    for c in (c for c in CPU_LEVELS if c <= cfg.max_concurrency):
        rounds = max(SWEEP_ROUNDS, math.ceil(CPU_PASSES * objects.large_bytes / (c * chunk)))
        log(f"client CPU at {c} in flight: {c * rounds} range reads of {chunk:,} B")
        out[str(c)] = _sweep(read, objects.large, objects.large_bytes, chunk, c, rounds)
    return out


def measure(fs: AbstractFileSystem, objects: Objects, cfg: ProbeConfig, shown: str,
            log: Callable[[str], None]) -> ObjectStore:
    when = datetime.now(UTC).replace(microsecond=0).isoformat()
    read = reader(fs)
    try:
        _timed_get(read, objects.small[0], objects.small_bytes)  # connection set-up is not latency
        log(f"{cfg.samples} GETs of {objects.small_bytes:,} B, one at a time")
        small = [_timed_get(read, objects.small[i % len(objects.small)], objects.small_bytes)
                 for i in range(cfg.samples)]
        log(f"{LARGE_READS} range reads of {objects.large_bytes:,} B, one at a time")
        large = [_timed_get(read, objects.large, objects.large_bytes) for _ in range(LARGE_READS)]
        chunk = min(objects.large_bytes, max(objects.small_bytes, objects.large_bytes // 8))
        levels = [c for c in (2 ** k for k in range(16)) if c <= cfg.max_concurrency]
        throughput, rates = {}, {}
        for c in levels:
            log(f"concurrency {c}: {c * SWEEP_ROUNDS} range reads of {chunk:,} B")
            throughput[str(c)], rates[str(c)], *_ = _sweep(read, objects.large, objects.large_bytes, chunk, c)
        cpu = _client_cpu(read, objects, chunk, cfg, log)
    except TrainfeedError:
        raise
    except Exception as exc:
        raise TrainfeedError(redact(f"{shown}: probe read failed: {exc}")) from exc
    ts, tl = statistics.median(small), statistics.median(large)
    bandwidth = (objects.large_bytes - objects.small_bytes) / max(tl - ts, 1e-9)  # bytes/s
    latency = max(0.0, ts - objects.small_bytes / bandwidth)
    best = max(throughput.values())
    connections = max(1, min(levels[-1], round(best / throughput["1"])))
    ms = np.array(small) * 1e3
    detail = {
        "url": shown, "when": when, "host": socket.gethostname(), "objects": objects.how,
        "small_bytes": objects.small_bytes, "small_gets": len(small),
        "latency_ms": {"p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)),
                       "p99": float(np.percentile(ms, 99)), "min": float(ms.min()), "max": float(ms.max())},
        "large_bytes": objects.large_bytes, "large_read_s": large,
        "sweep_request_bytes": chunk, "sweep_requests_per_connection": SWEEP_ROUNDS,
        "throughput_mb_per_s": throughput, "requests_per_s": rates,
        "client": type(fs).__name__, "cpu_request_bytes": chunk,
        "cpu_bytes_read": {c: m.nbytes for c, m in cpu.items()},
        "cpu_mb_per_s": {c: m.mb_per_s for c, m in cpu.items()},
    }
    source = (f"probed {shown} at {when} from {detail['host']}: {len(small)} GETs of {objects.small_bytes:,} B, "
              f"{LARGE_READS} reads of {objects.large_bytes:,} B, range reads of {chunk:,} B at concurrency "
              f"1-{levels[-1]}; latency and bandwidth solved from the medians, connections = best aggregate / "
              f"one connection's throughput; client CPU per GB ({detail['client']}) = process CPU time / GB read at "
              f"{', '.join(cpu)} in flight")
    return ObjectStore(cfg.name, latency * 1e3, bandwidth / 1e6, connections, source, kind="probed", detail=detail,
                       io_cpu_s_per_gb={c: m.cpu_s_per_gb for c, m in cpu.items()})


def summary(profile: ObjectStore) -> str:
    """The probe's result as a table (stdout)."""
    d = profile.detail
    assert d is not None, "a probed profile always has the probe's detail"
    lat = d["latency_ms"]
    lines = [f"probe of {d['url']} ({d['objects']})",
             f"GET of {d['small_bytes']:,} B (n={d['small_gets']}): p50 {lat['p50']:.1f} ms, p90 {lat['p90']:.1f} ms, "
             f"p99 {lat['p99']:.1f} ms",
             f"read of {d['large_bytes']:,} B: median {statistics.median(d['large_read_s']):.3f} s",
             f"{'connections':>11}  {'MB/s':>9}  {'requests/s':>10}   (range reads of {d['sweep_request_bytes']:,} B)"]
    lines += [f"{c:>11}  {mb:>9,.1f}  {d['requests_per_s'][c]:>10,.1f}" for c, mb in d["throughput_mb_per_s"].items()]
    if profile.io_cpu_s_per_gb:
        lines.append(f"client CPU ({d['client']}, range reads of {d['cpu_request_bytes']:,} B): "
                     + ", ".join(f"{v:.2f} CPU-s/GB at {c} in flight" for c, v in profile.io_cpu_s_per_gb.items()))
    lines.append(f"profile {profile.name!r}: first_byte_ms {profile.first_byte_ms:.2f}, stream_mb_per_s "
                 f"{profile.stream_mb_per_s:,.1f}, max_concurrency {profile.max_concurrency}")
    return "\n".join(lines)
