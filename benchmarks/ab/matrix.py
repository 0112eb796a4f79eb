"""The storage A/B matrix: stores x nodes x frameworks, each cell measured three ways (the
differential stall analysis): compute-only (synthetic batches already in memory), ingest-only
(the reader, no model) and the real run (the reader feeding the step). Every store is staged on
one storage backend and read from there with one connection budget, so the cells differ by
layout only (the layout effect); the best compacted store is also read from a local copy (the
location effect). Cells go to results.jsonl as they complete, so a partially failed matrix
keeps what it measured."""
from __future__ import annotations

import posixpath
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trainfeed.benchmarks.ab.config import IMAGE_STORAGES, REAL_NODES, STORES, CellFailed, MatrixConfig, stage
from trainfeed.benchmarks.ab.measure import (
    CellReading,
    IngestResult,
    emulated_run,
    ingest_only,
    real_cpu_run,
)
from trainfeed.benchmarks.ab.results import RESULTS_VERSION, ResultsFile, error_record, storage_record
from trainfeed.benchmarks.ab.staging import Staged, connections, reader_options, stage_stores
from trainfeed.benchmarks.ab.storage import Backend, StoreSource, check_labels, local_copy, open_backend, plan_backend
from trainfeed.benchmarks.model.profiles import (
    ACCELERATORS,
    calibration_key,
    load_accelerator,
    load_object_store,
    model_flops,
    step_seconds,
)
from trainfeed.benchmarks.model.verdict import checks, verdict
from trainfeed.benchmarks.records import Record
from trainfeed.converters.convert import ConvertConfig, check_config
from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.progress import MatrixProgress, NullProgress
from trainfeed.converters.redact import register_storage_options
from trainfeed.training import frameworks
from trainfeed.training.metrics import environment
from trainfeed.training.reading.fitting import Fit

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def check_source(cfg: MatrixConfig) -> None:
    """A local SRC, before anything is staged: it exists, and (without --resize) its images share
    one size, which every store's reader needs (a remote SRC is checked as it is staged)."""
    if "://" in cfg.src and not cfg.src.startswith("file://"):
        return
    src = Path(cfg.src.removeprefix("file://"))
    if not src.is_dir():
        raise UsageError(f"{src}: source folder not found" if not src.exists()
                         else f"{src}: not a folder; SRC is the folder of small files")
    if cfg.resize:
        return
    from PIL import Image, UnidentifiedImageError

    first: tuple[Path, tuple[int, int]] | None = None
    for path in sorted(p for p in src.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()):
        try:
            with Image.open(path) as img:  # the header only
                size = (img.height, img.width)
        except (OSError, UnidentifiedImageError):
            continue  # the conversion names a file it cannot decode, in its own words
        if first is None:
            first = (path, size)
        elif size != first[1]:
            raise UsageError(f"{path} is {size[0]}x{size[1]} (HxW) but {first[0]} is {first[1][0]}x{first[1][1]}: "
                             "the images differ in size; pass --resize HxW (e.g. --resize 64x64) to resize every "
                             "image to one size")


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
        frameworks.framework(f)  # a UsageError naming the registered ones
    for s in cfg.image_storage:
        if s not in IMAGE_STORAGES:
            raise UsageError(f"unknown --image-storage {s!r}: choose from {', '.join(IMAGE_STORAGES)}")
    if not cfg.image_storage:
        raise UsageError(f"--image-storage: name at least one of {', '.join(IMAGE_STORAGES)}")
    if cfg.image_mode not in ("RGB", "L"):
        raise UsageError(f"--image-mode must be RGB or L, not {cfg.image_mode!r}")
    if cfg.fit is not None:
        Fit.parse(cfg.fit)
    check_config(ConvertConfig(src=cfg.src, dst=cfg.out, fmt="parquet", arrays=cfg.arrays))  # --dtype, --channels
    if cfg.steps < 2 or cfg.cpu_steps < 2:
        raise UsageError("--steps and --cpu-steps must be at least 2 (the first step is warm-up)")
    if cfg.workers < 1 or cfg.io_concurrency < 1:
        raise UsageError("--workers and --io-concurrency must be at least 1")
    if cfg.storage_profile:
        load_object_store(cfg.storage_profile)
    check_source(cfg)
    backend = plan_backend(cfg.storage_backend, Path(cfg.out), cfg.storage_options, cfg.storage_profile)
    check_labels(cfg.labels_csv, cfg.src, backend)
    return backend


#: Compute-only is measured once per (node, framework, sample shape): (step seconds, how, CPU-s per step).
ComputeKey = tuple[str, str, tuple[int, ...]]
ComputeTime = tuple[float, str, float | None]


def run_matrix(cfg: MatrixConfig, log: Callable[[str], None] = print,
               progress: MatrixProgress | NullProgress = NullProgress()) -> list[Record]:
    """Measure every cell; ``log`` takes staging messages, ``progress`` shows the cells as they run."""
    planned = check_matrix(cfg)
    register_storage_options(cfg.storage_options)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    results = ResultsFile(out / "results.jsonl")
    with open_backend(planned, log) as backend:
        _run(cfg, backend, results, environment(), log, progress)
    return results.records


def _run(cfg: MatrixConfig, backend: Backend, results: ResultsFile, env: Record, log: Callable[[str], None],
         progress: MatrixProgress | NullProgress) -> None:
    out = Path(cfg.out)
    names, staged, failed = stage_stores(cfg, backend, log)
    compute: dict[ComputeKey, ComputeTime] = {}
    grid = [(node, framework) for node in cfg.nodes for framework in cfg.frameworks]
    ingest: dict[str, IngestResult] = {}
    if isinstance(progress, MatrixProgress):
        progress.total_cells = cfg.repeats * len(names) * len(grid)
    index = 0

    def fail(rep: int, store: str, at: str, error: str) -> None:
        """Every cell of one store fails at stage ``at``, for one reason."""
        for node, framework in grid:
            results.add(error_record(rep, store, node, framework, at, error, env))
        log(f"{store}: every cell failed ({at}): {error}")

    for rep in range(cfg.repeats):
        for store_name in names:
            first = index + 1
            index += len(grid)
            if store_name in failed:
                fail(rep, store_name, "prepare", failed[store_name])
                continue
            st = staged[store_name]
            ropts = reader_options(cfg, st.source)
            progress.cell(first, f"{store_name} x {grid[0][0]} {grid[0][1]}")
            progress.phase(f"ingest-only {store_name}", cfg.steps)
            try:
                with stage("ingest-only"):
                    ingest[store_name] = ingest_only(st.source, ropts, cfg.steps, progress.step)
                with stage("model"):  # the FLOPs of the model every cell of the store trains
                    flops_step = model_flops(st.shape, cfg.width) * cfg.batch_size
            except CellFailed as exc:
                progress.end_cell(f"{exc.stage} failed: {exc.reason}")
                fail(rep, store_name, exc.stage, exc.reason)
                continue
            for n, (node, framework) in enumerate(grid):
                if n:
                    progress.cell(first + n, f"{store_name} x {node} {framework}")
                try:
                    cell = _cell_record(cfg, rep, store_name, node, framework, st, flops_step, backend, env)
                    cell.update(_measure_cell(cfg, node, framework, st, ropts, flops_step, compute,
                                              out / "cells" / f"{store_name}-{node}-{framework}-{rep}", progress))
                    cell["ingest_only"] = asdict(ingest[store_name])
                    with stage("verdict"):
                        cell["checks"] = checks(cell)
                        cell["verdict"] = verdict(cell)
                except CellFailed as exc:
                    cell = error_record(rep, store_name, node, framework, exc.stage, exc.reason, env)
                cell = results.add(cell)
                progress.end_cell(f"{cell['real']['samples_per_s']:.1f} samples/s, stall "
                                  f"{100 * cell['real']['stall_fraction']:.0f}%, {cell['verdict']['bottleneck']}"
                                  if cell["kind"] == "cell" else f"failed ({cell['stage']}): {cell['error']}")
    location_effect(cfg, backend, staged, ingest, results, env, log)


def _cell_record(cfg: MatrixConfig, rep: int, store: str, node: str, framework: str, st: Staged, flops_step: float,
                 backend: Backend, env: Record) -> Record:
    """A cell's record before it is measured: what it reads, from where, with what budget."""
    with stage("record"):
        return {"kind": "cell", "results_version": RESULTS_VERSION, "repeat": rep, "store": store, "node": node,
                "framework": framework, "batch_size": cfg.batch_size, "width": cfg.width,
                "sample_shape": list(st.shape), "sample_bytes": st.sample_bytes, "image_storage": st.image_storage,
                "stages": asdict(st.stages) if st.stages is not None else None,
                "flops_per_step": flops_step, "storage": storage_record(backend, st.url),
                "connections": connections(cfg, backend), "env": env, "page_cache": "warm after the first read"}


def _logged(log: Callable[[str], None], name: str, measure: Callable[[], IngestResult]) -> IngestResult:
    """An ingest-only measurement, with a progress line as it starts and one as it ends."""
    log(f"{name}: start")
    t0 = time.perf_counter()
    res = measure()
    rate = f"{res.samples_per_s:.1f} samples/s" if res.samples_per_s else "too few batches to time"
    log(f"{name}: {rate}, {res.samples} samples ({time.perf_counter() - t0:.1f} s)")
    return res


def location_effect(cfg: MatrixConfig, backend: Backend, staged: dict[str, Staged], ingest: dict[str, IngestResult],
                    results: ResultsFile, env: Record, log: Callable[[str], None]) -> None:
    """The location effect: the compacted store that ingested fastest on the backend, read again
    from local disk as it is (a copy downloaded from the backend; on the local backend the store
    itself, without the emulation), with the same reader and connection budget. Nothing to
    measure when the cells read local disk as it is already."""
    compacted = {s: r for s, r in ingest.items() if s != "blob"}
    if not compacted or (backend.kind == "local" and not backend.profile):
        return
    best = max(compacted, key=lambda s: compacted[s].samples_per_s or 0)
    name = f"location effect {best}: ingest-only from local disk"
    rec = {"kind": "location-effect", "results_version": RESULTS_VERSION, "repeat": cfg.repeats - 1, "store": best,
           "storage": backend.describe(staged[best].url), "connections": connections(cfg, backend), "env": env,
           "on_storage": asdict(compacted[best])}
    try:
        with stage("location-effect"):
            path = local_copy(staged[best].url, backend,
                              Path(cfg.out) / "local-copy" / posixpath.basename(staged[best].url))
            local = StoreSource(path, {}, staged[best].source.fmt)
            rec["local_copy"] = path
            rec["local_disk"] = asdict(_logged(log, name,
                                               lambda: ingest_only(local, reader_options(cfg, local), cfg.steps)))
    except CellFailed as exc:
        log(f"{name}: failed: {exc.reason}")
        results.add(error_record(cfg.repeats - 1, best, None, None, exc.stage, exc.reason, env))
        return
    results.add(rec)


def _measure_cell(cfg: MatrixConfig, node: str, framework: str, st: Staged, ropts: CellReading, flops_step: float,
                  compute: dict[ComputeKey, ComputeTime], cell_dir: Path,
                  progress: MatrixProgress | NullProgress) -> Record:
    """Compute-only (measured once per node, framework and sample shape) and the real run."""
    key = (node, framework, st.shape)
    with stage("compute-only"):
        if key not in compute and node in REAL_NODES:
            progress.phase("compute-only", None)
            seconds, cpu_per_step = frameworks.framework(framework).compute_only(
                tuple(st.shape), cfg.batch_size, cfg.width, 3, node, cfg.amp)
            compute[key] = (seconds, "measured", cpu_per_step)
        elif key not in compute:  # an emulated node: its profile's step time
            compute[key] = (*step_seconds(load_accelerator(node), flops_step,
                                          calibration_key(st.shape, cfg.batch_size, cfg.width, cfg.amp), cfg.amp), None)
        step_s, how, cpu_s = compute[key]
        compute_only = {"step_s": step_s, "samples_per_s": cfg.batch_size / step_s, "how": how,
                        "cpu_s_per_step": cpu_s}
    with stage("real run"):
        cell_dir.mkdir(parents=True, exist_ok=True)
        if node in REAL_NODES:
            progress.phase("real run", None)
            real = real_cpu_run(st.source, cfg, framework, cell_dir, node,
                                cfg.resize if st.image_storage == "encoded" else None)
            profile: dict[str, Any] = {"node_kind": "real", "device": node}
        else:
            progress.phase("real run", cfg.steps)
            real = emulated_run(st.source, ropts, step_s, cfg.steps, cell_dir, progress.step)
            profile = {"node_kind": "emulated", "accelerator": asdict(load_accelerator(node))}
    return {"compute_only": compute_only, "real": real, **profile}
