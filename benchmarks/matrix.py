"""The storage A/B matrix: stores x nodes x frameworks, each cell measured three ways (the
differential stall analysis): compute-only (synthetic batches already in memory), ingest-only
(the reader, no model) and the real run (the reader feeding the step). Cells go to
results.jsonl as they complete, so a partially failed matrix keeps what it measured."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from trainfeed.converters.convert import ConvertConfig, convert
from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.options import WriteOptions
from trainfeed.converters.redact import redact, redact_obj, register_storage_options
from trainfeed.converters.stores import FORMATS, detect_format
from trainfeed.training.config import TrainConfig
from trainfeed.training.metrics import StepTimer, UtilizationSampler, environment
from trainfeed.training.readers import ReaderOptions, iter_batches, open_store
from trainfeed.training.run import Prefetcher, record

from .profiles import ACCELERATORS, calibration_key, load_accelerator, model_flops, step_seconds

RESULTS_VERSION = 1
#: The small-file layout as it is (the baseline), then every format of the registry.
STORES = tuple(dict.fromkeys(("blob", *FORMATS)))
REAL_NODES = ("cpu", "cuda")
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
    workers: int = 4
    blob_profile: str | None = "azure-blob"  # latency emulation for the blob store; None: as is
    storage_options: dict = field(default_factory=dict)
    amp: bool = False


def check_matrix(cfg: MatrixConfig) -> None:
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
    if cfg.steps < 2 or cfg.cpu_steps < 2:
        raise UsageError("--steps and --cpu-steps must be at least 2 (the first step is warm-up)")
    if "blob" in cfg.stores:
        blob_source(cfg)  # a --labels the emulated store cannot reach is a usage error


# --------------------------------------------------------------------------- stores

@dataclass(frozen=True)
class StoreSource:
    """Where the matrix reads one store from, and how."""

    path: str
    storage_options: dict
    fmt: str | None = None  # None: detected from the path
    labels_csv: str | None = None  # blob: the labels CSV, reached the way the files are


def _split_location(url: str) -> tuple[str, str]:
    """(fsspec protocol, path inside that filesystem) of a local path or URL."""
    if "://" not in url:
        return "file", os.path.abspath(url)
    protocol, path = url.split("://", 1)
    return protocol, path


def _emulated_labels(labels_csv: str | None, target: str) -> str | None:
    """The labels CSV as the emulated blob store reaches it: through the emulation (the same
    filesystem and options as the files) when it lives where they do; a local file as it is."""
    if labels_csv is None:
        return None
    protocol, path = _split_location(labels_csv)
    if protocol == target:
        return f"emulated://{path}"
    if protocol == "file":
        return labels_csv
    raise UsageError(f"--labels {labels_csv}: under --blob-profile the labels must be a local file or on the same "
                     f"storage as SRC ({target}://); copy them there, or pass --blob-profile none")


def blob_source(cfg: MatrixConfig) -> StoreSource:
    """The small files as the blob cells read them: wrapped in the latency emulation when a
    profile is set (emulated://, whose options hold the real backend's options)."""
    if not cfg.blob_profile:
        return StoreSource(cfg.src, dict(cfg.storage_options), "blob", cfg.labels_csv)
    import trainfeed.benchmarks.storagesim  # noqa: F401  registers emulated://

    target, path = _split_location(cfg.src)
    opts = {"target": target, "profile": cfg.blob_profile, "target_options": dict(cfg.storage_options)}
    return StoreSource(f"emulated://{path}", opts, "blob", _emulated_labels(cfg.labels_csv, target))


def prepare_store(cfg: MatrixConfig, name: str, log: Callable[[str], None]) -> StoreSource:
    """The blob source, or a converted store (cached in OUT/stores)."""
    if name == "blob":
        return blob_source(cfg)
    dst = Path(cfg.out) / "stores" / (f"{name}.h5" if name == "hdf5" else name)
    if detect_format(dst) != name:
        log(redact(f"converting {cfg.src} -> {name}"))
        convert(ConvertConfig(src=cfg.src, dst=str(dst), fmt=name, labels_csv=cfg.labels_csv,
                              storage_options=cfg.storage_options, write=WriteOptions(row_group_size=8 * 10**6),
                              workers=max(2, os.cpu_count() or 2)))
    return StoreSource(str(dst), {})


def open_stores(cfg: MatrixConfig, log: Callable[[str], None]) -> tuple[dict, dict]:
    """Prepare and open every store: name -> (source, sample shape) for those that open,
    name -> the redacted reason for those that do not (their cells fail, the others run)."""
    opened, failed = {}, {}
    for name in cfg.stores:
        try:
            src = prepare_store(cfg, name, log)
            store = open_store(src.path, src.fmt, _reader_options(cfg, src))
        except UsageError:
            raise
        except CELL_ERRORS as exc:
            failed[name] = redact(exc)
        else:
            opened[name] = (src, tuple(store.spec.shape))
    return opened, failed


def _reader_options(cfg: MatrixConfig, src: StoreSource) -> ReaderOptions:
    # a shuffle buffer of two batches: a larger one would make the first step read far ahead
    # and the short measured window flow from memory
    return ReaderOptions(batch_size=cfg.batch_size, workers=cfg.workers, shuffle=True, seed=0,
                         shuffle_buffer=2 * cfg.batch_size, pool="arrow",
                         labels_csv=src.labels_csv, storage_options=src.storage_options)


# --------------------------------------------------------------------------- measurements

def ingest_only(src: StoreSource, opts: ReaderOptions, steps: int) -> dict:
    store = open_store(src.path, src.fmt, opts)
    t0 = time.perf_counter()  # from the first request: filling the shuffle buffer is reading too
    n = nbytes = 0
    for i, batch in enumerate(iter_batches(store, opts), 1):
        n += len(batch.ids)
        nbytes += batch.nbytes
        if i >= steps:
            break
    seconds = time.perf_counter() - t0
    return {"samples_per_s": n / seconds if seconds else None, "mb_per_s": nbytes / seconds / 1e6 if seconds else None,
            "samples": n, "seconds": seconds}


def compute_only_torch(shape, batch: int, width: int, steps: int, device: str = "cpu", amp: bool = False) -> float:
    """Median seconds of a real training step on synthetic data already on the device."""
    import torch

    from trainfeed.training.models_torch import build

    dev = torch.device(device)
    model = build(tuple(shape), 1, width).to(dev)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, *shape, device=dev)
    y = torch.randint(0, 2, (batch,), device=dev).float()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(out[:, 0].float(), y)
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def compute_only_tf(shape, batch: int, width: int, steps: int) -> float:
    import keras
    import tensorflow as tf

    from trainfeed.training.models_tf import build

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

    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step().numpy()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))


def emulated_run(src: StoreSource, opts: ReaderOptions, step_s: float, steps: int, out_dir: Path) -> dict:
    """The real reader feeds a step that occupies the (emulated) accelerator for ``step_s``:
    the host is free meanwhile, as with a real GPU."""
    store = open_store(src.path, src.fmt, opts)
    timer = StepTimer(warmup_steps=1)
    util_path = out_dir / "utilization.jsonl"
    with open(util_path, "w") as fh, UtilizationSampler(sink=lambda r: fh.write(json.dumps(r) + "\n")) as util:
        prefetch = Prefetcher(iter_batches(store, opts), lambda b: None, depth=2)
        try:
            for step in range(1, steps + 1):
                item, wait = prefetch.get()
                if item is None:
                    break
                batch, _ = item
                t0 = time.perf_counter()
                time.sleep(step_s)
                record(timer, step, 0, wait, time.perf_counter() - t0, len(batch.ids), batch.nbytes)
        finally:
            prefetch.close()
    return {**timer.summary(), "utilization": util.summary(), "utilization_timeline": util.samples}


def real_cpu_run(src: StoreSource, cfg: MatrixConfig, framework: str, out_dir: Path, device: str = "cpu") -> dict:
    from trainfeed.training.cli import run

    tcfg = TrainConfig(data=src.path, fmt=src.fmt, framework=framework,
                       device=device, batch_size=cfg.batch_size, steps_per_epoch=cfg.cpu_steps, epochs=1,
                       workers=cfg.workers, pool="arrow", width=cfg.width, out=str(out_dir), labels_csv=src.labels_csv,
                       shuffle_buffer=2 * cfg.batch_size,
                       storage_options=src.storage_options, progress=False, amp=cfg.amp)
    summary = run(tcfg)
    timeline = [json.loads(line) for line in (out_dir / "utilization.jsonl").read_text().splitlines()]
    return {**{k: summary[k] for k in ("steps", "samples", "wall_s", "data_wait_s", "compute_s", "samples_per_s",
                                       "mb_per_s", "stall_fraction", "au", "compute_step_s")},
            "utilization": summary["utilization"], "utilization_timeline": timeline}


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


def run_matrix(cfg: MatrixConfig, log: Callable[[str], None] = print) -> list[dict]:
    check_matrix(cfg)
    register_storage_options(cfg.storage_options)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    results = ResultsFile(out / "results.jsonl")
    env = environment()
    opened, failed = open_stores(cfg, log)
    compute: dict[tuple[str, str], tuple[float, str]] = {}
    grid = [(node, framework) for node in cfg.nodes for framework in cfg.frameworks]

    def fail(rep: int, store: str, stage: str, error: str) -> None:
        """Every cell of one store fails for one reason."""
        for node, framework in grid:
            results.add(_error_record(rep, store, node, framework, stage, error, env))
        log(f"{store:>8}: every cell failed ({stage}): {error}")

    for rep in range(cfg.repeats):
        for store_name in cfg.stores:
            if store_name in failed:
                fail(rep, store_name, "prepare", failed[store_name])
                continue
            src, shape = opened[store_name]
            ropts = _reader_options(cfg, src)
            try:
                ingest = ingest_only(src, ropts, cfg.steps)
            except CELL_ERRORS as exc:
                fail(rep, store_name, "ingest-only", redact(exc))
                continue
            flops_step = model_flops(shape, cfg.width) * cfg.batch_size
            for node, framework in grid:
                cell = {"kind": "cell", "results_version": RESULTS_VERSION, "repeat": rep, "store": store_name,
                        "node": node, "framework": framework, "batch_size": cfg.batch_size, "width": cfg.width,
                        "sample_shape": list(shape), "sample_bytes": int(np.prod(shape)) * 4,
                        "flops_per_step": flops_step, "blob_profile": cfg.blob_profile if store_name == "blob" else None,
                        "workers": cfg.workers, "env": env, "page_cache": "warm after the first read"}
                try:
                    cell.update(_measure_cell(cfg, node, framework, store_name, src, ropts, shape,
                                              flops_step, compute, out / "cells" / f"{store_name}-{node}-{framework}-{rep}"))
                    cell["ingest_only"] = ingest
                    cell["verdict"] = verdict(cell)
                except CELL_ERRORS as exc:
                    cell = _error_record(rep, store_name, node, framework, "cell", redact(exc), env)
                cell = results.add(cell)
                log(f"{store_name:>8} x {node:<6} {framework:<5} "
                    + (f"{cell['real']['samples_per_s']:.1f} samples/s, stall {100 * cell['real']['stall_fraction']:.0f}%"
                       if cell["kind"] == "cell" else f"failed: {cell['error']}"))
    return results.records


def _error_record(rep: int, store: str, node: str, framework: str, stage: str, error: str, env: dict) -> dict:
    return {"kind": "error", "results_version": RESULTS_VERSION, "repeat": rep, "store": store, "node": node,
            "framework": framework, "stage": stage, "error": error, "env": env}


def _measure_cell(cfg, node, framework, store_name, src, ropts, shape, flops_step, compute, cell_dir) -> dict:
    cell_dir.mkdir(parents=True, exist_ok=True)
    key = (node, framework)
    if node in REAL_NODES:
        if key not in compute:
            seconds = (compute_only_torch(shape, cfg.batch_size, cfg.width, 3, node, cfg.amp) if framework == "torch"
                       else compute_only_tf(shape, cfg.batch_size, cfg.width, 3))
            compute[key] = (seconds, "measured")
        real = real_cpu_run(src, cfg, framework, cell_dir, node)
        profile = {"node_kind": "real", "device": node}
    else:
        acc = load_accelerator(node)
        if key not in compute:
            compute[key] = step_seconds(acc, flops_step, calibration_key(shape, cfg.batch_size, cfg.width, cfg.amp), cfg.amp)
        real = emulated_run(src, ropts, compute[key][0], cfg.steps, cell_dir)
        profile = {"node_kind": "emulated", "accelerator": asdict(acc)}
    step_s, how = compute[key]
    return {"compute_only": {"step_s": step_s, "samples_per_s": cfg.batch_size / step_s, "how": how},
            "real": real, **profile}


# --------------------------------------------------------------------------- diagnosis

def verdict(cell: dict) -> dict:
    """The bottleneck of one cell from its three measurements, with concrete advice."""
    c = cell["compute_only"]["samples_per_s"]
    i = cell["ingest_only"]["samples_per_s"] or 0.0
    real = cell["real"]
    r = real["samples_per_s"] or 0.0
    util = real.get("utilization", {})
    cores = cell["env"]["cores"]
    if util.get("swap_used_mb_mean", 0) > 100:
        return {"bottleneck": "ram", "advice": "RAM: the working set exceeds memory and the node swaps; "
                "pick an instance with more RAM or lower --workers / --shuffle-buffer"}
    if r >= 0.9 * c:
        return {"bottleneck": "compute", "advice": f"compute-bound (AU {100 * (real['au'] or 0):.0f}%): the "
                f"{'accelerator' if cell.get('node_kind') == 'emulated' else 'CPU'} is the limit; storage is not. "
                "A faster device or more devices help; repacking does not."}
    if i < 0.9 * c:
        if cell["store"] == "blob":
            prof = cell.get("blob_profile")
            lat = f"{_profile_latency(prof):.0f} ms each, " if prof else ""
            return {"bottleneck": "io-latency", "advice": f"blob GETs: {lat}{cell['workers']} in flight -> at most "
                    f"{i:.0f} samples/s for a device that takes {c:.0f}; repack into files of ~128 MB "
                    "(convert --to delta) or raise --workers"}
        need = int(np.ceil(cores * c / max(i, 1e-9)))
        return {"bottleneck": "ingest", "advice": f"read/decode-bound on {cores} vCPUs: the reader delivers {i:.0f} "
                f"samples/s, the device takes {c:.0f}; needs ~{need} vCPUs per device, or offload preprocessing "
                "to CPU workers"}
    return {"bottleneck": "contention", "advice": f"reader and step compete for {cores} vCPUs: ingest alone "
            f"({i:.0f} samples/s) and compute alone ({c:.0f}) would keep up, together they reach {r:.0f}; "
            "give the input pipeline its own cores (more vCPUs per device)"}


def _profile_latency(name: str | None) -> float:
    from .profiles import OBJECT_STORES

    return OBJECT_STORES[name].first_byte_ms if name in OBJECT_STORES else 0.0


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


