"""Reading from object storage: one epoch of the same dataset through the emulated object
store (``--profile``, default azure-blob: ``benchmarks/ab/storagesim.py``) layered over local
files and over Azurite (the real Azure Blob API on loopback), for the small-file layout and
each compacted store, at 1, 4 and 16 connections.

A budget of N connections is the emulated client's cap (at most N requests in flight) and
the reader's own connection budget (``OpenOptions(io_concurrency=N)``). Each line
holds the reader's MB/s (tensor bytes delivered) and the storage MB/s (bytes it fetched)
next to ``bound_mb_per_s``: the profile's best for that budget and the run's own mean request
size (bytes / requests, HEADs and LISTs included), i.e. every request of the run packed onto
N busy connections; ``vs_bound`` = storage MB/s / bound.

Then, per compacted store: epoch 2 read from the reader's ``cache_dir`` (filled by epoch 1)
against the same store read from local disk; and, from Delta, the accelerator utilisation
AU = min(1, loader samples/s / (batch / step time)) an emulated T4 and H100 would reach at
1, 2, 4, 8 and 16 connections (step time from FLOPs, an estimate unless a calibrated
profile is given with ``--accelerators``).

JSON lines to stdout, progress and a summary table to stderr:

    python -m trainfeed.benchmarks.micro.remote_bench [--count 1000] [--backends local,azurite] > bench-out/remote.jsonl
"""
from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from trainfeed.benchmarks.ab.storagesim import EmulatedFileSystem
from trainfeed.benchmarks.emulators import azurite
from trainfeed.benchmarks.model.profiles import (
    ObjectStore,
    bound_mb_per_s,
    calibration_key,
    load_accelerator,
    load_object_store,
    model_flops,
    save_object_store,
    step_seconds,
)
from trainfeed.benchmarks.synth import VOLUME_SHAPE, generate_volumes
from trainfeed.converters.convert import ConvertConfig, convert
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.redact import redact, register_storage_options
from trainfeed.converters.storage.filesystems import filesystem
from trainfeed.training.metrics import environment
from trainfeed.training.reading.readers import iter_batches, open_store
from trainfeed.training.reading.store import EpochOptions

MB = 10**6
LAYOUTS = ("blob", "parquet", "delta", "hdf5")
STORES = LAYOUTS[1:]
CONTAINER = "trainfeed-bench"
#: what makes one measurement fail without stopping the others (recorded as an error line)
CELL_ERRORS = (TrainfeedError, OSError, RuntimeError, ValueError)


def log(message: str) -> None:
    print(redact(message), file=sys.stderr, flush=True)


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


@dataclass(frozen=True)
class Backend:
    """Where the data lives under the emulation: local files, or a container on Azurite."""

    name: str
    target: str  # fsspec protocol of the storage
    root: str  # local folder, or container
    options: dict[str, Any]

    def url(self, rel: str) -> str:
        """The URL convert writes to (a local path for local files)."""
        return f"{self.root}/{rel}" if self.target == "file" else f"{self.target}://{self.root}/{rel}"

    def emulated(self, rel: str, profile: Path) -> tuple[str, dict[str, Any]]:
        """URL and storage options of ``rel`` read through the emulation."""
        return (f"emulated://{self.root}/{rel}",
                {"target": self.target, "profile": str(profile), "target_options": self.options})


def stats_of(options: dict[str, Any]) -> EmulatedFileSystem:
    """A handle on the emulated client the reader uses (same options: same pool and counters)."""
    return EmulatedFileSystem(options["target"], options["profile"], options["target_options"])


def reader_options(connections: int, storage_options: dict[str, Any], labels: str | None, batch_size: int,
                   cache_dir: str | None = None) -> tuple[OpenOptions, EpochOptions]:
    return (OpenOptions(io_concurrency=connections, labels=labels, storage_options=storage_options,
                        cache_dir=cache_dir),
            EpochOptions(batch_size=batch_size, drop_last=False))


def read_epoch(url: str, layout: str, options: tuple[OpenOptions, EpochOptions], epoch: int = 0) -> dict[str, Any]:
    """One epoch: seconds, samples and tensor bytes delivered; with the emulation's request counts."""
    open_options, opts = options
    t0 = time.perf_counter()
    store = open_store(url, layout, open_options)
    opened = time.perf_counter() - t0
    client = stats_of(open_options.storage_options) if url.startswith("emulated://") else None
    if client:
        client.reset_stats()
    t0 = time.perf_counter()
    samples = nbytes = 0
    for batch in iter_batches(store, opts, epoch):
        samples += len(batch.ids)
        nbytes += batch.nbytes
    seconds = time.perf_counter() - t0
    shape = store.spec.shape
    assert shape is not None, "the benchmark's volumes all have one shape"
    out = {"open_s": opened, "seconds": seconds, "samples": samples, "mb": nbytes / MB,
           "mb_per_s": nbytes / seconds / MB, "samples_per_s": samples / seconds,
           "sample_shape": list(shape)}
    if client:
        out["requests"] = client.stats()
    return out


def with_bound(rec: dict[str, Any], profile: ObjectStore, connections: int) -> dict[str, Any]:
    req = rec["requests"]
    mean_request = req["bytes"] / max(1, req["requests"])
    bound = bound_mb_per_s(profile, connections, mean_request)
    storage = req["bytes"] / rec["seconds"] / MB
    return {**rec, "storage_mb_per_s": storage, "mean_request_bytes": mean_request, "bound_mb_per_s": bound,
            "vs_bound": storage / bound if bound else None}


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, stack: ExitStack) -> None:
        self.args, self.work = args, work
        self.profile = load_object_store(args.profile)
        self.src = self._dataset()
        self.labels = str(self.src / "labels.csv")
        self.local_stores = {fmt: self._convert(fmt, str(work / f"{fmt}-{self.src.name}"
                                                               f"{'.h5' if fmt == 'hdf5' else ''}"))
                             for fmt in args.layouts if fmt != "blob"}
        self.backends = [self._backend(name, stack) for name in args.backends]
        self.results: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.placed: set[tuple[str, str]] = set()  # (backend, layout) converted onto a remote backend
        self.env = environment()

    def _dataset(self) -> Path:
        shape = tuple(int(x) for x in self.args.shape.split("x"))
        src = self.work / f"volumes-{self.args.count}-{self.args.shape}"
        if not (src / "labels.csv").exists():
            shutil.rmtree(src, ignore_errors=True)
            log(f"generating {self.args.count} volumes of {self.args.shape} in {src}")
            generate_volumes(src, self.args.count, shape=shape, seed=self.args.seed)
        return src

    def _convert(self, fmt: str, dst: str, storage_options: dict[str, Any] | None = None) -> str:
        """The store at ``dst`` (converted once; a local store is kept across runs)."""
        if "://" in dst or not Path(dst).exists():
            log(f"converting {self.src} -> {dst}")
            convert(ConvertConfig(src=str(self.src), dst=dst, fmt=fmt, labels_csv=self.labels,
                                  storage_options=dict(storage_options or {})))
        return dst

    def _backend(self, name: str, stack: ExitStack) -> Backend:
        if name == "local":
            return Backend("local", "file", str(self.work.resolve()), {})
        server = stack.enter_context(azurite.start())
        register_storage_options(server.storage_options)
        backend = Backend("azurite", "abfs", CONTAINER, server.storage_options)
        server.create_container(CONTAINER)
        fs = filesystem("abfs", server.storage_options)
        log(f"uploading {self.src} to Azurite (port {server.port})")
        fs.put(str(self.src), f"{CONTAINER}/{self.src.name}", recursive=True)
        return backend

    def rel(self, backend: Backend, layout: str) -> str:
        """Where ``layout`` lives on ``backend``, relative to its root (converted there on first use)."""
        if layout == "blob":
            return self.src.name
        name = Path(self.local_stores[layout]).name
        if backend.name != "local" and (backend.name, layout) not in self.placed:
            self._convert(layout, backend.url(name), backend.options)
            self.placed.add((backend.name, layout))
        return name

    def budget(self, connections: int) -> ObjectStore:
        """The profile for a client of ``connections`` connections (never more than the profile allows)."""
        return replace(self.profile, max_concurrency=min(connections, self.profile.max_concurrency))

    def profile_for(self, connections: int) -> Path:
        path = self.work / f"profile-{self.profile.name}-c{connections}.json"
        save_object_store(self.budget(connections), path)
        return path

    def measure(self, backend: Backend, layout: str, connections: int) -> dict[str, Any]:
        key = (backend.name, layout, connections)
        if key not in self.results:
            url, options = backend.emulated(self.rel(backend, layout), self.profile_for(connections))
            opts = reader_options(connections, options, self.labels if layout == "blob" else None,
                                  self.args.batch_size)
            rec = read_epoch(url, layout, opts)
            self.results[key] = with_bound(rec, self.budget(connections), connections)
        return self.results[key]

    def cell(self, kind: str, fields: dict[str, Any], run: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """One measurement as one JSON line: its figures, or the error that stopped it."""
        base = {"bench": "remote", "kind": kind, **fields, "profile": self.profile.name,
                "profile_kind": self.profile.kind}
        try:
            rec = {**base, **run(), "env": self.env}
        except CELL_ERRORS as exc:
            rec = {**base, "error": redact(str(exc))}
            log(f"{kind} {fields}: failed: {rec['error']}")
        emit(rec)
        return rec if "error" not in rec else None

    # --------------------------------------------------------------- the three parts

    def epochs(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for backend in self.backends:
            for layout in self.args.layouts:
                for c in self.args.connections:
                    log(f"{backend.name} {layout}: one epoch at {c} connections")
                    rec = self.cell("epoch", {"backend": backend.name, "layout": layout, "connections": c},
                                    functools.partial(self.measure, backend, layout, c))
                    out += [rec] if rec else []
        return out

    def cached_epochs(self) -> list[dict[str, Any]]:
        """Epoch 2 from the reader's cache (epoch 1 fills it) against a local-disk read of the same store."""
        out: list[dict[str, Any]] = []
        c = max(self.args.connections)
        for backend in self.backends:
            for layout in (x for x in self.args.layouts if x != "blob"):
                def run(backend: Backend = backend, layout: str = layout) -> dict[str, Any]:
                    cache = self.work / f"cache-{backend.name}-{layout}"
                    shutil.rmtree(cache, ignore_errors=True)
                    url, options = backend.emulated(self.rel(backend, layout), self.profile_for(c))
                    opts = reader_options(c, options, None, self.args.batch_size, str(cache))
                    first = read_epoch(url, layout, opts, epoch=0)
                    second = read_epoch(url, layout, opts, epoch=1)
                    local = read_epoch(self.local_stores[layout], layout,
                                       reader_options(c, {}, None, self.args.batch_size), epoch=1)
                    return {"epoch1_mb_per_s": first["mb_per_s"], "epoch2_mb_per_s": second["mb_per_s"],
                            "epoch2_requests": second["requests"], "local_mb_per_s": local["mb_per_s"],
                            "epoch2_vs_local": second["mb_per_s"] / local["mb_per_s"]}

                log(f"{backend.name} {layout}: epoch 2 from the cache vs local disk ({c} connections)")
                rec = self.cell("cache", {"backend": backend.name, "layout": layout, "connections": c}, run)
                out += [rec] if rec else []
        return out

    def utilisation(self) -> list[dict[str, Any]]:
        """AU an emulated accelerator would reach fed by the Delta reader at each budget."""
        if "delta" not in self.args.layouts:
            return []
        backend, out = self.backends[0], []
        steps: dict[str, tuple[float, str]] = {}
        for c in self.args.au_connections:
            def run(c: int = c) -> dict[str, Any]:
                rec = self.measure(backend, "delta", c)
                shape = tuple(rec["sample_shape"])
                rows: dict[str, dict[str, Any]] = {}
                for name in self.args.accelerators:
                    if name not in steps:
                        flops = model_flops(shape, self.args.width) * self.args.batch_size
                        key = calibration_key(shape, self.args.batch_size, self.args.width, False)
                        steps[name] = step_seconds(load_accelerator(name), flops, key)
                    step_s, how = steps[name]
                    demand = self.args.batch_size / step_s
                    rows[name] = {"step_s": step_s, "how": how, "demand_samples_per_s": demand,
                                  "au": min(1.0, rec["samples_per_s"] / demand)}
                return {"loader_samples_per_s": rec["samples_per_s"], "batch_size": self.args.batch_size,
                        "width": self.args.width, "accelerators": rows}

            log(f"{backend.name} delta: AU at {c} connections")
            rec = self.cell("au", {"backend": backend.name, "layout": "delta", "connections": c}, run)
            out += [rec] if rec else []
        return out


def summarize(epochs: list[dict[str, Any]], cached: list[dict[str, Any]], au: list[dict[str, Any]]) -> str:
    lines = [f"{'backend':<9}{'layout':<9}{'conns':>6}{'MB/s':>9}{'storage MB/s':>14}{'bound MB/s':>12}"
             f"{'vs bound':>10}{'requests':>10}{'mean request':>14}"]
    for r in epochs:
        lines.append(f"{r['backend']:<9}{r['layout']:<9}{r['connections']:>6}{r['mb_per_s']:>9.1f}"
                     f"{r['storage_mb_per_s']:>14.1f}{r['bound_mb_per_s']:>12.1f}{r['vs_bound']:>10.2f}"
                     f"{r['requests']['requests']:>10}{r['mean_request_bytes']:>14,.0f}")
    if cached:
        lines.append(f"\n{'backend':<9}{'layout':<9}{'epoch 1 MB/s':>14}{'epoch 2 (cache)':>17}{'local disk':>12}"
                     f"{'epoch 2 / local':>17}")
        lines += [f"{r['backend']:<9}{r['layout']:<9}{r['epoch1_mb_per_s']:>14.1f}{r['epoch2_mb_per_s']:>17.1f}"
                  f"{r['local_mb_per_s']:>12.1f}{r['epoch2_vs_local']:>17.2f}" for r in cached]
    if au:
        names = list(au[0]["accelerators"])
        how = {n: au[0]["accelerators"][n]["how"] for n in names}
        lines.append(f"\nDelta, {au[0]['backend']}: AU at batch {au[0]['batch_size']} "
                     f"(step time: {', '.join(f'{n} {how[n]}' for n in names)})")
        lines.append(f"{'conns':>6}{'samples/s':>11}" + "".join(f"{'AU ' + n:>10}" for n in names))
        lines += [f"{r['connections']:>6}{r['loader_samples_per_s']:>11.1f}"
                  + "".join(f"{r['accelerators'][n]['au']:>10.2f}" for n in names) for r in au]
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in names if choices and x not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}, got {text!r}")
        return names
    return parse


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="bench-out/remote-work", help="dataset, local stores, caches (kept across runs)")
    ap.add_argument("--count", type=int, default=1000, help="volumes in the dataset")
    ap.add_argument("--shape", default="x".join(map(str, VOLUME_SHAPE)), help="volume shape, float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="azure-blob", help="object-store profile: a preset or a `probe` profile file")
    ap.add_argument("--backends", type=_names(("local", "azurite")), default=["local", "azurite"])
    ap.add_argument("--layouts", type=_names(LAYOUTS), default=list(LAYOUTS))
    ap.add_argument("--connections", type=_ints, default=[1, 4, 16])
    ap.add_argument("--au-connections", type=_ints, default=[1, 2, 4, 8, 16])
    ap.add_argument("--accelerators", type=_names(()), default=["t4", "h100"],
                    help="emulated accelerators for AU: built-in names or `calibrate` profiles")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--width", type=int, default=64, help="model width for the step-time estimate (64: ResNet-18)")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        try:
            bench = Bench(args, work, stack)
        except (TrainfeedError, azurite.AzuriteError) as exc:
            log(f"error: {exc}")
            raise SystemExit(getattr(exc, "exit_code", 1)) from None
        emit({"bench": "remote", "kind": "setup", "profile": asdict(bench.profile), "count": args.count,
              "shape": args.shape, "backends": args.backends, "layouts": args.layouts, "env": bench.env})
        epochs, cached, au = bench.epochs(), bench.cached_epochs(), bench.utilisation()
    log(summarize(epochs, cached, au))


if __name__ == "__main__":
    main()
