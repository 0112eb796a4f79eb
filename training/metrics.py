"""Where every second of a training run goes: per-step data wait and compute, and the
machine's utilization sampled about once a second. Definitions: docs/DESIGN.md."""
from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from trainfeed.training.frameworks import FRAMEWORKS, Library


def significant(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant figures (0 stays 0)."""
    if not x or not math.isfinite(x):
        return x
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


@dataclass
class StepRecord:
    step: int  # global step
    epoch: int
    data_wait_s: float
    compute_s: float
    samples: int
    bytes: int
    loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "data_wait_s": round(self.data_wait_s, 6),
                "compute_s": round(self.compute_s, 6), "samples": self.samples, "bytes": self.bytes,
                "loss": self.loss}


@dataclass
class StepTimer:
    """Splits each step into data wait (blocked on the next batch) and compute (the step,
    synchronized on the device before the clock is read). Warm-up steps are recorded but
    excluded from the summary."""

    warmup_steps: int = 1
    records: list[StepRecord] = field(default_factory=list)
    sink: Callable[[StepRecord], None] | None = None

    def add(self, record: StepRecord) -> None:
        self.records.append(record)
        if self.sink:
            self.sink(record)

    def summary(self) -> dict[str, Any]:
        steady = self.records[self.warmup_steps:] or self.records
        if not steady:
            return {"steps": 0}
        wait = sum(r.data_wait_s for r in steady)
        compute = sum(r.compute_s for r in steady)
        wall = wait + compute
        samples = sum(r.samples for r in steady)
        nbytes = sum(r.bytes for r in steady)
        step_times = [r.data_wait_s + r.compute_s for r in steady]
        return {
            "steps": len(self.records),
            "steps_measured": len(steady),
            "warmup_steps": min(self.warmup_steps, len(self.records)),
            "samples": samples,
            "wall_s": round(wall, 6),
            "data_wait_s": round(wait, 6),
            "compute_s": round(compute, 6),
            # rates keep 4 significant figures (a relative error under 0.05% at any speed); a fixed
            # number of decimals lost 3% of 0.0186 MB/s on a slow machine
            "samples_per_s": significant(samples / wall) if wall else None,
            "mb_per_s": significant(nbytes / wall / 1e6) if wall else None,
            "stall_fraction": round(wait / wall, 4) if wall else None,
            "au": round(compute / wall, 4) if wall else None,
            "step_time_s": {"median": round(statistics.median(step_times), 6),
                            "p90": round(sorted(step_times)[int(0.9 * (len(step_times) - 1))], 6)},
            "compute_step_s": round(statistics.median(r.compute_s for r in steady), 6),
        }


class UtilizationSampler:
    """A background thread sampling CPU %, RSS, disk and network bytes (and GPU utilization
    and memory through NVML when a GPU is present) every ``interval`` seconds."""

    def __init__(self, interval: float = 1.0, sink: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.interval = interval
        self.sink = sink
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainfeed-util", daemon=True)
        self._proc = psutil.Process()
        self._nvml = _nvml_handles()

    def __enter__(self) -> UtilizationSampler:
        self._t0 = time.monotonic()
        psutil.cpu_percent(None)
        self._proc.cpu_percent(None)
        self._disk0 = psutil.disk_io_counters()
        self._net0 = psutil.net_io_counters()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._record(self._sample())  # a short run still gets one sample

    def _record(self, rec: dict[str, Any]) -> None:
        self.samples.append(rec)
        if self.sink:
            self.sink(rec)

    def _sample(self) -> dict[str, Any]:
        disk, net = psutil.disk_io_counters(), psutil.net_io_counters()
        mem = psutil.virtual_memory()
        rec: dict[str, Any] = {
            "t": round(time.monotonic() - self._t0, 3),
            "cpu_percent": psutil.cpu_percent(None),
            "process_cpu_percent": self._proc.cpu_percent(None),
            "rss_mb": round(self._proc.memory_info().rss / 1e6, 1),
            "ram_used_percent": mem.percent,
            "swap_used_mb": round(psutil.swap_memory().used / 1e6, 1),
            "disk_read_mb": round(((disk.read_bytes - self._disk0.read_bytes) if disk and self._disk0 else 0) / 1e6, 3),
            "net_recv_mb": round(((net.bytes_recv - self._net0.bytes_recv) if net and self._net0 else 0) / 1e6, 3),
        }
        for i, handle in enumerate(self._nvml):
            import pynvml

            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            meminfo = pynvml.nvmlDeviceGetMemoryInfo(handle)
            rec[f"gpu{i}_util_percent"] = util.gpu
            rec[f"gpu{i}_mem_mb"] = round(meminfo.used / 1e6, 1)
        return rec

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._record(self._sample())

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {}
        keys = [k for k in self.samples[0] if k != "t" and not k.endswith(("read_mb", "recv_mb"))]
        out = {f"{k}_mean": round(statistics.mean(s[k] for s in self.samples), 2) for k in keys}
        out["rss_mb_max"] = max(s["rss_mb"] for s in self.samples)
        out["disk_read_mb"] = self.samples[-1]["disk_read_mb"]
        out["net_recv_mb"] = self.samples[-1]["net_recv_mb"]
        return out


def _nvml_handles() -> list[Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no driver, no GPU, no package: CPU-only run
        return []


class JsonLines:
    """Append-only JSON-lines file, flushed per record so a killed run keeps what it measured."""

    def __init__(self, path: Path) -> None:
        self.fh = open(path, "a")  # noqa: SIM115 - the file lives as long as the log

    def __call__(self, record: StepRecord | dict[str, Any]) -> None:
        self.fh.write(json.dumps(record.to_dict() if isinstance(record, StepRecord) else record) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


#: Libraries whose versions a measurement depends on (reported when installed), the frameworks' in between.
_DATA_LIBRARIES = ("numpy", "pyarrow", "pandas")
_STORE_LIBRARIES = ("deltalake", "h5py", "petastorm", "pyspark")


def _libraries() -> tuple[Library, ...]:
    frameworks = tuple(library for fw in FRAMEWORKS.values() for library in fw.libraries)
    return (*(Library(name, (name,)) for name in _DATA_LIBRARIES), *frameworks,
            *(Library(name, (name,)) for name in _STORE_LIBRARIES))


def _version(library: Library) -> str | None:
    """The version of the first of ``library``'s distributions installed; None when none is."""
    import importlib.metadata

    for distribution in library.distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cpu_model() -> str | None:
    """The CPU's model name (Linux), what a CPU-bound figure depends on; None where not known."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def environment() -> dict[str, Any]:
    """The machine and library versions behind a measurement (summary.json, benchmark lines)."""
    import os
    import platform

    import psutil

    versions = {library.name: version for library in _libraries() if (version := _version(library)) is not None}
    gpu = None
    if "torch" in versions:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"python": platform.python_version(), "os": platform.platform(),
            "cpu": _cpu_model() or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "ram_gb": round(psutil.virtual_memory().total / 1e9, 1), "gpu": gpu, **versions}


def record(timer: StepTimer, step: int, epoch: int, wait: float, compute: float, samples: int, nbytes: int,
           loss: float | None = None) -> StepRecord:
    """Account one step in ``timer`` (and its sink)."""
    rec = StepRecord(step, epoch, wait, compute, samples, nbytes, loss)
    timer.add(rec)
    return rec
