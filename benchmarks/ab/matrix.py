"""The storage A/B matrix: stores x nodes x frameworks, each cell measured three ways (the
differential stall analysis): compute-only (synthetic batches already in memory), ingest-only
(the reader, no model) and the real run (the reader feeding the step). Every store is staged on
one storage backend and read from there with one connection budget, so the cells differ by
layout only (the layout effect); the best compacted store is also read from a local copy (the
location effect). Cells go to results.jsonl as they complete, so a partially failed matrix
keeps what it measured."""
from __future__ import annotations

import hashlib
import json
import posixpath
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.redact import redact, redact_obj, register_storage_options
from trainfeed.converters.sources.files import ImageOptions
from trainfeed.converters.storage.fetch import DEFAULT_IO_CONCURRENCY
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.training.config import TrainConfig
from trainfeed.training.metrics import StepTimer, UtilizationSampler, environment
from trainfeed.training.reading.readers import Batch, ReaderOptions, iter_batches, open_store
from trainfeed.training.metrics import record
from trainfeed.training.reading.prefetch import Prefetcher

from trainfeed.benchmarks.ab.hostload import LoadMonitor
from trainfeed.benchmarks.ab.progress import MatrixProgress, NullProgress
from trainfeed.benchmarks.model.profiles import (ACCELERATORS, calibration_key, load_accelerator, load_object_store, model_flops,
                       step_seconds)
from trainfeed.benchmarks.ab.stages import STAGES, stage_costs
from trainfeed.benchmarks.ab.storage import (Backend, StoreSource, check_labels, local_copy, open_backend, plan_backend, stage_small_files,
                      stage_store)
from trainfeed.benchmarks.model.verdict import checks, verdict

RESULTS_VERSION = 4
#: The small-file layout as it is (the baseline), then every format of the registry.
STORES = tuple(dict.fromkeys(("blob", *FORMATS)))
#: How a compacted store of an image folder holds its images (``convert --image-storage``).
IMAGE_STORAGES = ("encoded", "decoded")
REAL_NODES = ("cpu", "cuda")
#: Ingest-only reads a store to the end of its epoch when it holds at most this many times the
#: samples the timed window read: the reader may have read that much ahead already.
FULL_PASS_FACTOR = 4
#: What makes one cell (or one store's cells) fail without stopping the matrix.
CELL_ERRORS = (TrainfeedError, RuntimeError, OSError)


@dataclass
class MatrixConfig:
    src: str  # folder of small files (the blob layout)
    out: str
    labels_csv: str | None = None
    stores: tuple[str, ...] = STORES
    nodes: tuple[str, ...] = ("cpu", "t4", "h100")
    frameworks: tuple[str, ...] = ("torch",)
    steps: int = 20
    cpu_steps: int = 4  # real-model steps on a CPU node are slow; fewer of them
    batch_size: int = 32
    repeats: int = 1
    width: int = 64
    workers: int = 4  # reader threads (blob: files read at once, locally)
    io_concurrency: int = DEFAULT_IO_CONCURRENCY  # remote or emulated storage: range requests in flight per reader
    storage_backend: str = "local"  # local (OUT/stores), azurite, or a URL
    storage_profile: str | None = "azure-blob"  # latency emulation around every store; None: as is
    storage_options: dict = field(default_factory=dict)  # SRC's, --labels' and a URL backend's
    amp: bool = False
    # image folders: the size every image is resized to (at conversion, and by the reader for the
    # small files), and how the compacted stores hold the images: one store of each per format
    resize: tuple[int, int] | None = None
    image_storage: tuple[str, ...] = IMAGE_STORAGES


def check_matrix(cfg: MatrixConfig) -> Backend:
    """Usage errors before anything runs; the backend the matrix will stage its stores on."""
    for s in cfg.stores:
        if s not in STORES:
            raise UsageError(f"unknown store {s!r}: choose from {', '.join(STORES)}")
    for n in cfg.nodes:
        if n not in REAL_NODES:
            load_accelerator(n)  # raises a clear UsageError / TrainfeedError
        elif n == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise TrainfeedError("node cuda: no CUDA device is available here; use an emulated node "
                                     f"({', '.join(ACCELERATORS)}) or run on a GPU machine")
    for f in cfg.frameworks:
        if f not in ("torch", "tf"):
            raise UsageError(f"unknown framework {f!r}: choose torch or tf")
    for s in cfg.image_storage:
        if s not in IMAGE_STORAGES:
            raise UsageError(f"unknown --image-storage {s!r}: choose from {', '.join(IMAGE_STORAGES)}")
    if not cfg.image_storage:
        raise UsageError(f"--image-storage: name at least one of {', '.join(IMAGE_STORAGES)}")
    if cfg.steps < 2 or cfg.cpu_steps < 2:
        raise UsageError("--steps and --cpu-steps must be at least 2 (the first step is warm-up)")
    if cfg.workers < 1 or cfg.io_concurrency < 1:
        raise UsageError("--workers and --io-concurrency must be at least 1")
    if cfg.storage_profile:
        load_object_store(cfg.storage_profile)
    backend = plan_backend(cfg.storage_backend, Path(cfg.out), cfg.storage_options, cfg.storage_profile)
    check_labels(cfg.labels_csv, cfg.src, backend)
    return backend


# --------------------------------------------------------------------------- stores

@dataclass(frozen=True)
class Staged:
    """One store staged on the backend: its URL there, how the cells read it, the samples its
    batches deliver (shape, bytes), how it holds images (None: no images) and, for image
    stores, the CPU cost of each stage (``stages.stage_costs``)."""

    url: str
    source: StoreSource
    shape: tuple[int, ...]
    sample_bytes: int
    image_storage: str | None = None
    stages: dict | None = None


def store_variants(cfg: MatrixConfig, images: bool) -> dict[str, tuple[str, str | None]]:
    """The stores the matrix compares, name -> (format, image storage). An image folder gives
    one compacted store per format and --image-storage, named FORMAT-STORAGE (parquet-encoded,
    parquet-decoded); the small files keep their name, blob (encoded images)."""
    if not images:
        return {name: (name, None) for name in cfg.stores}
    return {(name if name == "blob" else f"{name}-{storage}"): (name, "encoded" if name == "blob" else storage)
            for name in cfg.stores for storage in (("encoded",) if name == "blob" else cfg.image_storage)}


def stage_stores(cfg: MatrixConfig, backend: Backend, log: Callable[[str], None]) -> tuple[list, dict, dict]:
    """Stage every store on the backend and open it as the cells will: the store names in
    order (``store_variants``), name -> Staged for those that open, name -> the redacted reason
    for those that do not (their cells fail, the others run). The compacted stores are
    converted from the small files as staged."""
    try:
        small_files, labels = stage_small_files(cfg.src, cfg.labels_csv, cfg.storage_options, backend, log)
    except CELL_ERRORS as exc:
        reason = redact(exc)
        log(f"stage small files: failed: {reason}")
        return list(cfg.stores), {}, dict.fromkeys(cfg.stores, reason)
    blob = backend.source(small_files, "blob", labels)
    try:
        images = open_store(blob.path, blob.fmt, _reader_options(cfg, blob)).images is not None
    except UsageError:
        raise
    except CELL_ERRORS:
        images = None  # unknown: the small files do not open; the loop below records why, store by store
    if cfg.resize and images is False:
        raise UsageError(f"--resize: {cfg.src} holds no JPEG/PNG images")
    variants = store_variants(cfg, bool(images))
    opened, failed = {}, {}
    for name, (fmt, storage) in variants.items():
        try:
            image = ImageOptions(resize=cfg.resize, storage=storage or "encoded")
            url = small_files if fmt == "blob" else stage_store(fmt, small_files, labels, backend, log, name, image)
            src = blob if fmt == "blob" else backend.source(url, fmt)
            store = open_store(src.path, src.fmt, _reader_options(cfg, src))
            spec = store.sample_spec
            stages = _logged_stages(log, name, store) if images else None
        except UsageError:
            raise
        except CELL_ERRORS as exc:
            failed[name] = redact(exc)
            log(f"stage {name}: failed: {failed[name]}")
        else:
            opened[name] = Staged(url, src, tuple(spec.shape), int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize,
                                  storage, stages)
    return list(variants), opened, failed


def _logged_stages(log: Callable[[str], None], name: str, store) -> dict:
    costs = stage_costs(store)
    log(f"stages {name}: CPU per sample " + ", ".join(f"{s} {costs[s] * 1e3:.3f} ms" for s in STAGES)
        + f" ({costs['samples']} samples)")
    return costs


def _reader_options(cfg: MatrixConfig, src: StoreSource) -> ReaderOptions:
    # a shuffle buffer of two batches: a larger one would make the first step read far ahead
    # and the short measured window flow from memory; no disk cache: every cell reads the storage
    return ReaderOptions(batch_size=cfg.batch_size, workers=cfg.workers, io_concurrency=cfg.io_concurrency,
                         shuffle=True, seed=0, shuffle_buffer=2 * cfg.batch_size, pool="arrow",
                         labels_csv=src.labels_csv, storage_options=src.storage_options, image_size=cfg.resize)


def connections(cfg: MatrixConfig, backend: Backend) -> dict:
    """The connection budget every cell reads with, whatever the layout: ``workers`` reader
    threads and, on object storage or behind the emulation, ``io_concurrency`` range requests
    in flight for the whole reader. Local reads as they are have no request budget: None."""
    remote = backend.kind != "local" or bool(backend.profile)
    return {"reader_workers": cfg.workers, "io_concurrency": cfg.io_concurrency if remote else None}


# --------------------------------------------------------------------------- measurements

class ReadTally:
    """What a reader delivered: samples, bytes, and a digest of its (id, label) pairs."""

    def __init__(self):
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


def _no_step(done: int) -> None:
    """The default step callback: no progress display."""


def ingest_only(src: StoreSource, opts: ReaderOptions, steps: int, on_step: Callable[[int], None] = _no_step) -> dict:
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
    store = open_store(src.path, src.fmt, opts)
    tally = ReadTally()  # every sample read, the warm-up batch too: the digest covers them all
    batches = iter_batches(store, opts)
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
    return {"samples_per_s": timed / seconds if seconds and timed else None,
            "mb_per_s": timed_bytes / seconds / 1e6 if seconds and timed else None, "samples": tally.samples,
            "timed_samples": timed, "seconds": seconds, "cpu_s": cpu_s,
            "cpu_s_per_sample": cpu_s / tally.samples if tally.samples else None,
            "requests": requests.stats() if requests else None, "ids_labels_sha256": tally.digest,
            "load": load.summary()}


def _request_counter(src: StoreSource):
    """The emulated storage's client (its request counters), None for storage as it is."""
    if not src.path.startswith("emulated://"):
        return None
    import fsspec

    return fsspec.filesystem("emulated", **src.storage_options)


def compute_only_torch(shape, batch: int, width: int, steps: int, device: str = "cpu",
                       amp: bool = False) -> tuple[float, float]:
    """Median seconds of a real training step on synthetic data already on the device, and the
    process CPU-seconds per step (after the first)."""
    import torch

    from trainfeed.training.models.resnet_torch import build

    dev = torch.device(device)
    model = build(tuple(shape), 1, width).to(dev)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, *shape, device=dev)
    y = torch.randint(0, 2, (batch,), device=dev).float()
    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out[:, 0].float(), y)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return float(np.median(times[1:])), float(np.mean(cpu[1:]))


def compute_only_tf(shape, batch: int, width: int, steps: int) -> tuple[float, float]:
    """As ``compute_only_torch``, for the Keras model."""
    import keras
    import tensorflow as tf

    from trainfeed.training.models.resnet_tf import build

    model = build(tuple(shape), 1, width)
    opt = keras.optimizers.Adam()
    x = tf.random.normal((batch, *shape))
    y = tf.cast(tf.random.uniform((batch, 1)) > 0.5, tf.float32)
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step().numpy()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return float(np.median(times[1:])), float(np.mean(cpu[1:]))


def emulated_run(src: StoreSource, opts: ReaderOptions, step_s: float, steps: int, out_dir: Path,
                 on_step: Callable[[int], None] = _no_step) -> dict:
    """The real reader feeds a step that occupies the (emulated) accelerator for ``step_s``:
    the host is free meanwhile, as with a real GPU."""
    store = open_store(src.path, src.fmt, opts)
    timer = StepTimer(warmup_steps=1)
    util_path = out_dir / "utilization.jsonl"
    tally = ReadTally()
    with (open(util_path, "w") as fh, UtilizationSampler(sink=lambda r: fh.write(json.dumps(r) + "\n")) as util,
          LoadMonitor(include_children=True) as load):
        prefetch = Prefetcher(iter_batches(store, opts), lambda b: None, depth=2)
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
                 image_size: tuple[int, int] | None = None) -> dict:
    from trainfeed.training.cli import run

    tcfg = TrainConfig(data=src.path, fmt=src.fmt, framework=framework,
                       device=device, batch_size=cfg.batch_size, steps_per_epoch=cfg.cpu_steps, epochs=1,
                       workers=cfg.workers, io_concurrency=cfg.io_concurrency, pool="arrow", width=cfg.width,
                       out=str(out_dir), labels_csv=src.labels_csv,
                       shuffle_buffer=2 * cfg.batch_size,
                       storage_options=src.storage_options, progress=False, amp=cfg.amp,
                       image_size=image_size, augment=False)
    with LoadMonitor(include_children=True) as load:
        summary = run(tcfg)
    timeline = [json.loads(line) for line in (out_dir / "utilization.jsonl").read_text().splitlines()]
    return {**{k: summary[k] for k in ("steps", "samples", "wall_s", "data_wait_s", "compute_s", "samples_per_s",
                                       "mb_per_s", "stall_fraction", "au", "compute_step_s")},
            "utilization": summary["utilization"], "utilization_timeline": timeline, "load": load.summary()}


# --------------------------------------------------------------------------- the matrix

class ResultsFile:
    """results.jsonl, one redacted record per line, appended as each cell ends."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict] = []

    def add(self, rec: dict) -> dict:
        rec = redact_obj(rec)
        self.records.append(rec)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        return rec


def run_matrix(cfg: MatrixConfig, log: Callable[[str], None] = print,
               progress: MatrixProgress | NullProgress = NullProgress()) -> list[dict]:
    """Measure every cell; ``log`` takes staging messages, ``progress`` shows the cells as they run."""
    planned = check_matrix(cfg)
    register_storage_options(cfg.storage_options)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    results = ResultsFile(out / "results.jsonl")
    with open_backend(planned, log) as backend:
        _run(cfg, backend, results, environment(), log, progress)
    return results.records


def _run(cfg: MatrixConfig, backend: Backend, results: ResultsFile, env: dict, log: Callable[[str], None],
         progress: MatrixProgress | NullProgress) -> None:
    out = Path(cfg.out)
    names, staged, failed = stage_stores(cfg, backend, log)
    compute: dict[tuple[str, str], tuple[float, str, float | None]] = {}
    grid = [(node, framework) for node in cfg.nodes for framework in cfg.frameworks]
    ingest: dict[str, dict] = {}
    if isinstance(progress, MatrixProgress):
        progress.total_cells = cfg.repeats * len(names) * len(grid)
    index = 0

    def fail(rep: int, store: str, stage: str, error: str) -> None:
        """Every cell of one store fails for one reason."""
        for node, framework in grid:
            results.add(_error_record(rep, store, node, framework, stage, error, env))
        log(f"{store}: every cell failed ({stage}): {error}")

    for rep in range(cfg.repeats):
        for store_name in names:
            first = index + 1
            index += len(grid)
            if store_name in failed:
                fail(rep, store_name, "prepare", failed[store_name])
                continue
            st = staged[store_name]
            ropts = _reader_options(cfg, st.source)
            progress.cell(first, f"{store_name} x {grid[0][0]} {grid[0][1]}")
            progress.phase(f"ingest-only {store_name}", cfg.steps)
            try:
                ingest[store_name] = ingest_only(st.source, ropts, cfg.steps, progress.step)
            except CELL_ERRORS as exc:
                progress.end_cell(f"ingest-only failed: {redact(exc)}")
                fail(rep, store_name, "ingest-only", redact(exc))
                continue
            flops_step = model_flops(st.shape, cfg.width) * cfg.batch_size
            for n, (node, framework) in enumerate(grid):
                if n:
                    progress.cell(first + n, f"{store_name} x {node} {framework}")
                cell = {"kind": "cell", "results_version": RESULTS_VERSION, "repeat": rep, "store": store_name,
                        "node": node, "framework": framework, "batch_size": cfg.batch_size, "width": cfg.width,
                        "sample_shape": list(st.shape), "sample_bytes": st.sample_bytes,
                        "image_storage": st.image_storage, "stages": st.stages,
                        "flops_per_step": flops_step, "storage": _storage_record(backend, st.url),
                        "connections": connections(cfg, backend), "env": env, "page_cache": "warm after the first read"}
                try:
                    cell.update(_measure_cell(cfg, node, framework, st, ropts, flops_step, compute,
                                              out / "cells" / f"{store_name}-{node}-{framework}-{rep}", progress))
                    cell["ingest_only"] = ingest[store_name]
                    cell["checks"] = checks(cell)
                    cell["verdict"] = verdict(cell)
                except CELL_ERRORS as exc:
                    cell = _error_record(rep, store_name, node, framework, "cell", redact(exc), env)
                cell = results.add(cell)
                progress.end_cell(f"{cell['real']['samples_per_s']:.1f} samples/s, stall "
                                  f"{100 * cell['real']['stall_fraction']:.0f}%, {cell['verdict']['bottleneck']}"
                                  if cell["kind"] == "cell" else f"failed: {cell['error']}")
    location_effect(cfg, backend, staged, ingest, results, env, log)


def _storage_record(backend: Backend, url: str) -> dict:
    """Where a cell read from, with the latency profile's figures (the model needs them when
    the report is rebuilt from results.jsonl elsewhere)."""
    profile = load_object_store(backend.profile) if backend.profile else None
    return {**backend.describe(url), "profile_figures": asdict(profile) if profile else None}


def _logged(log: Callable[[str], None], name: str, measure: Callable[[], dict]) -> dict:
    """An ingest-only measurement, with a progress line as it starts and one as it ends."""
    log(f"{name}: start")
    t0 = time.perf_counter()
    res = measure()
    rate = f"{res['samples_per_s']:.1f} samples/s" if res["samples_per_s"] else "too few batches to time"
    log(f"{name}: {rate}, {res['samples']} samples ({time.perf_counter() - t0:.1f} s)")
    return res


def location_effect(cfg: MatrixConfig, backend: Backend, staged: dict, ingest: dict, results: ResultsFile,
                    env: dict, log: Callable[[str], None]) -> None:
    """The location effect: the compacted store that ingested fastest on the backend, read again
    from local disk as it is (a copy downloaded from the backend; on the local backend the store
    itself, without the emulation), with the same reader and connection budget. Nothing to
    measure when the cells read local disk as it is already."""
    compacted = {s: r for s, r in ingest.items() if s != "blob"}
    if not compacted or (backend.kind == "local" and not backend.profile):
        return
    best = max(compacted, key=lambda s: compacted[s]["samples_per_s"] or 0)
    name = f"location effect {best}: ingest-only from local disk"
    rec = {"kind": "location-effect", "results_version": RESULTS_VERSION, "repeat": cfg.repeats - 1, "store": best,
           "storage": backend.describe(staged[best].url), "connections": connections(cfg, backend), "env": env,
           "on_storage": compacted[best]}
    try:
        path = local_copy(staged[best].url, backend, Path(cfg.out) / "local-copy" / posixpath.basename(staged[best].url))
        local = StoreSource(path, {}, staged[best].source.fmt)
        rec["local_copy"] = path
        rec["local_disk"] = _logged(log, name, lambda: ingest_only(local, _reader_options(cfg, local), cfg.steps))
    except CELL_ERRORS as exc:
        log(f"{name}: failed: {redact(exc)}")
        results.add(_error_record(cfg.repeats - 1, best, None, None, "location-effect", redact(exc), env))
        return
    results.add(rec)


def _error_record(rep: int, store: str, node: str | None, framework: str | None, stage: str, error: str,
                  env: dict) -> dict:
    return {"kind": "error", "results_version": RESULTS_VERSION, "repeat": rep, "store": store, "node": node,
            "framework": framework, "stage": stage, "error": error, "env": env}


def _measure_cell(cfg: MatrixConfig, node: str, framework: str, st: Staged, ropts: ReaderOptions, flops_step: float,
                  compute: dict, cell_dir: Path, progress: MatrixProgress | NullProgress) -> dict:
    cell_dir.mkdir(parents=True, exist_ok=True)
    key = (node, framework)
    if node in REAL_NODES:
        if key not in compute:
            progress.phase("compute-only", None)
            seconds, cpu_s = (compute_only_torch(st.shape, cfg.batch_size, cfg.width, 3, node, cfg.amp)
                              if framework == "torch" else compute_only_tf(st.shape, cfg.batch_size, cfg.width, 3))
            compute[key] = (seconds, "measured", cpu_s)
        progress.phase("real run", None)
        real = real_cpu_run(st.source, cfg, framework, cell_dir, node,
                            cfg.resize if st.image_storage == "encoded" else None)
        profile = {"node_kind": "real", "device": node}
    else:
        acc = load_accelerator(node)
        if key not in compute:
            compute[key] = (*step_seconds(acc, flops_step, calibration_key(st.shape, cfg.batch_size, cfg.width,
                                                                             cfg.amp), cfg.amp), None)
        progress.phase("real run", cfg.steps)
        real = emulated_run(st.source, ropts, compute[key][0], cfg.steps, cell_dir, progress.step)
        profile = {"node_kind": "emulated", "accelerator": asdict(acc)}
    step_s, how, cpu_s = compute[key]
    return {"compute_only": {"step_s": step_s, "samples_per_s": cfg.batch_size / step_s, "how": how,
                             "cpu_s_per_step": cpu_s},
            "real": real, **profile}


def load_results(out: str) -> list[dict]:
    path = Path(out) / "results.jsonl"
    if not path.is_file():
        raise TrainfeedError(f"{out}: no results.jsonl here; run `storage-bench run` first")
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TrainfeedError(f"{path}, line {n}: not JSON: {exc}") from exc
        if rec.get("results_version") != RESULTS_VERSION:
            raise TrainfeedError(f"{path}, line {n}: results version {rec.get('results_version')!r}; this "
                                 f"storage-bench reads version {RESULTS_VERSION}: rerun `storage-bench run`")
        records.append(rec)
    return records


