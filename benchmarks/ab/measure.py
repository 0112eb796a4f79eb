"""How one cell is measured, three ways: compute-only (synthetic batches already in memory),
ingest-only (the reader, no model) and the real run (the reader feeding the step)."""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from trainfeed.benchmarks.ab.config import MatrixConfig
from trainfeed.benchmarks.ab.hostload import LoadMonitor
from trainfeed.benchmarks.ab.storage import StoreSource
from trainfeed.benchmarks.ab.storagesim import EMULATED, EmulatedFileSystem
from trainfeed.benchmarks.model.verdict import MIN_TIMED_SAMPLES, MIN_TIMED_SECONDS
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import IN_PLACE
from trainfeed.training.config import Device, TrainConfig
from trainfeed.training.metrics import StepTimer, UtilizationSampler, record
from trainfeed.training.reading.prefetch import Prefetcher
from trainfeed.training.reading.readers import iter_batches, open_store
from trainfeed.training.reading.store import Batch, EpochOptions, OpenedStore

#: Ingest-only reads a store to the end of its epoch when it holds at most this many times the
#: samples the timed window read: the reader may have read that much ahead already.
FULL_PASS_FACTOR = 4
#: A timed window shorter than verdict's minimum (a small dataset read in milliseconds) is
#: extended by timing further epochs of the store, for at most this many seconds or epochs.
EXTEND_BUDGET_S = 10.0
EXTEND_MAX_EPOCHS = 1000


class ReadTally:
    """What a reader delivered: samples, bytes, and a digest of its (id, label) pairs."""

    def __init__(self) -> None:
        self.samples = self.nbytes = 0
        self._pairs: list[tuple[str, int]] = []

    def add(self, batch: Batch) -> None:
        self.samples += len(batch.ids)
        self.nbytes += batch.nbytes
        self._pairs += zip(batch.ids, batch.y.tolist())

    @property
    def digest(self) -> str:
        return id_label_digest(self._pairs)


def id_label_digest(pairs: Iterable[tuple[str, int]]) -> str:
    """sha256 of the sorted "id<TAB>label" lines: the same samples read in any order, from any
    store, give the same digest."""
    return hashlib.sha256("\n".join(sorted(f"{i}\t{int(y)}" for i, y in pairs)).encode()).hexdigest()


@dataclass(frozen=True)
class CellReading:
    """How every cell of a matrix opens a store and reads its epochs."""

    open: OpenOptions
    epoch: EpochOptions


def _no_step(done: int) -> None:
    """The default step callback: no progress display."""


@dataclass(frozen=True, slots=True)
class IngestResult:
    """An ingest-only pass (``ingest_only``), as a cell records it (``asdict``: results.jsonl's
    ``ingest_only``, a location effect's ``on_storage`` and ``local_disk``). Rates over the timed
    window (None: nothing timed); ``samples`` and the CPU figures over the whole pass; ``requests``:
    the latency emulation's counters (None: storage as it is); ``load``: ``LoadMonitor.summary``."""

    samples_per_s: float | None
    mb_per_s: float | None
    samples: int
    timed_samples: int
    seconds: float
    extra_epochs: int
    cpu_s: float
    cpu_s_per_sample: float | None
    requests: dict[str, int] | None
    ids_labels_sha256: str
    load: dict[str, Any]


def ingest_only(src: StoreSource, reading: CellReading, steps: int,
                on_step: Callable[[int], None] = _no_step) -> IngestResult:
    """The reader alone for ``steps`` batches after a warm-up batch (as the real run's first step
    is warm-up): its wall rate over the timed window, and what the projection model uses — the
    process CPU-seconds and, behind the latency emulation, the requests and bytes per sample,
    counted from opening the store to the end of the pass. A store small enough to be read ahead
    into memory during the warm-up is read to the end of its epoch, so that every sample read is
    a sample counted (a busy machine stretches wall time far more than CPU time)."""
    requests = _request_counter(src)
    if requests:
        requests.reset_stats()
    cpu_open = time.process_time()
    store = open_store(src.path, src.fmt, reading.open, reading.epoch.pool)
    tally = ReadTally()  # every sample read, the warm-up batch too: the digest covers them all
    batches = iter_batches(store, reading.epoch)
    first = next(batches, None)  # warm-up: opening, the first requests, filling the shuffle buffer
    if first is not None:
        tally.add(first)
    with LoadMonitor(include_children=True) as load:
        t0 = time.perf_counter()
        for i, batch in enumerate(batches, 1):
            tally.add(batch)
            on_step(i + 1)
            if i >= steps - 1:  # steps in all, the warm-up batch included, as in the real run
                break
        seconds = time.perf_counter() - t0
    timed = tally.samples - (len(first.ids) if first is not None else 0)
    timed_bytes = tally.nbytes - (first.nbytes if first is not None else 0)
    if store.samples <= FULL_PASS_FACTOR * tally.samples:
        for batch in batches:
            tally.add(batch)
    cpu_s = time.process_time() - cpu_open
    stats = requests.stats() if requests else None  # per sample of the first pass, as cpu_s
    seconds, timed, timed_bytes, extra = _extend(store, reading.epoch, seconds, timed, timed_bytes)
    return IngestResult(samples_per_s=timed / seconds if seconds and timed else None,
                        mb_per_s=timed_bytes / seconds / 1e6 if seconds and timed else None, samples=tally.samples,
                        timed_samples=timed, seconds=seconds, extra_epochs=extra, cpu_s=cpu_s,
                        cpu_s_per_sample=cpu_s / tally.samples if tally.samples else None,
                        requests=stats, ids_labels_sha256=tally.digest, load=load.summary())


def _extend(store: OpenedStore, opts: EpochOptions, seconds: float, timed: int,
            timed_bytes: int) -> tuple[float, int, int, int]:
    """A timed window too short to mean anything (verdict.too_short), extended with whole further
    epochs of the store, timed the same way, until it lasts MIN_TIMED_SECONDS over
    MIN_TIMED_SAMPLES samples (or the budget runs out: the report then says the rate is too
    short). Returns (seconds, samples, bytes, epochs added)."""
    extra, started = 0, time.perf_counter()
    while ((seconds < MIN_TIMED_SECONDS or timed < MIN_TIMED_SAMPLES) and timed and extra < EXTEND_MAX_EPOCHS
           and time.perf_counter() - started < EXTEND_BUDGET_S):
        extra += 1
        t0 = time.perf_counter()
        for batch in iter_batches(store, opts, epoch=extra):
            timed += len(batch.ids)
            timed_bytes += batch.nbytes
        seconds += time.perf_counter() - t0
    return seconds, timed, timed_bytes, extra


def _request_counter(src: StoreSource) -> EmulatedFileSystem | None:
    """The emulated storage's client (its request counters), None for storage as it is."""
    if not src.path.startswith(f"{EMULATED}://"):
        return None
    return EmulatedFileSystem(**src.storage_options)


def emulated_run(src: StoreSource, reading: CellReading, step_s: float, steps: int, out_dir: Path,
                 on_step: Callable[[int], None] = _no_step) -> dict[str, Any]:
    """The real reader feeds a step that occupies the (emulated) accelerator for ``step_s``:
    the host is free meanwhile, as with a real GPU."""
    store = open_store(src.path, src.fmt, reading.open, reading.epoch.pool)
    timer = StepTimer(warmup_steps=1)
    util_path = out_dir / "utilization.jsonl"
    tally = ReadTally()

    def sink(r: dict[str, Any]) -> None:
        fh.write(json.dumps(r) + "\n")

    with (open(util_path, "w") as fh, UtilizationSampler(sink=sink) as util,
          LoadMonitor(include_children=True) as load):
        prefetch = Prefetcher(iter_batches(store, reading.epoch), lambda b: None, depth=2)
        try:
            for step in range(1, steps + 1):
                item, wait = prefetch.get()
                if item is None:
                    break
                batch, _ = item
                tally.add(batch)
                t0 = time.perf_counter()
                time.sleep(step_s)
                record(timer, step, 0, wait, time.perf_counter() - t0, len(batch.ids), batch.nbytes)
                on_step(step)
        finally:
            prefetch.close()
    return {**timer.summary(), "samples_read": tally.samples, "ids_labels_sha256": tally.digest,
            "utilization": util.summary(), "utilization_timeline": util.samples, "load": load.summary()}


def real_cpu_run(src: StoreSource, cfg: MatrixConfig, framework: str, out_dir: Path, device: str = "cpu",
                 image_size: tuple[int, int] | None = None) -> dict[str, Any]:
    from trainfeed.training.loops.loop import run

    # the matrix accepts only torch / tf and, for a real node, cpu / cuda (TrainConfig checks them again)
    store = OpenOptions(labels=src.labels_csv, cast=cfg.arrays.dtype if src.fmt == IN_PLACE else None,
                        storage_options=src.storage_options, io_concurrency=cfg.io_concurrency, image_size=image_size,
                        fit=cfg.fit)
    epoch = EpochOptions(batch_size=cfg.batch_size, shuffle_buffer=2 * cfg.batch_size, workers=cfg.workers,
                         pool="arrow", augment=False)
    tcfg = TrainConfig(data=src.path, store=store, epoch=epoch, fmt=src.fmt, framework=framework,
                       device=cast(Device, device), steps_per_epoch=cfg.cpu_steps, epochs=1, width=cfg.width,
                       out=str(out_dir), progress=False, amp=cfg.amp, channels=cfg.arrays.channels)
    with LoadMonitor(include_children=True) as load:
        summary = run(tcfg)
    timeline = [json.loads(line) for line in (out_dir / "utilization.jsonl").read_text().splitlines()]
    return {**{k: summary[k] for k in ("steps", "samples", "wall_s", "data_wait_s", "compute_s", "samples_per_s",
                                       "mb_per_s", "stall_fraction", "au", "compute_step_s")},
            "utilization": summary["utilization"], "utilization_timeline": timeline, "load": load.summary()}
