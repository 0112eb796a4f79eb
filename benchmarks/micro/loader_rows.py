"""``DataLoader(TorchDataset(store), num_workers=N)`` next to trainfeed's own threads, measured the
way users run it (``make bench-io``'s DataLoader rows; issue #31's targets):

- **threads**: ``num_workers=0``, trainfeed's reader threads in the training process;
- **workers**: ``num_workers`` 1, 2 and 4 with ``persistent_workers=True`` (epoch 1: the
  workers' start included; epoch 2: the steady state), under fork, and under spawn and
  forkserver once (their start, importing torch, is a one-time cost);
- **cache**: with a fresh ``cache_dir``, epoch 1 (filling it) and epoch 2 (from it), through 0
  and 2 workers, beside ``store.batches``' own epoch 2 from the same cache.

Each cell runs in a fresh process (spawned), as a training run starts: nothing warmed by the
bench or earlier cells. Each record has MB/s of samples delivered and CPU-seconds per GB of the
training process and its worker processes together (read from /proc while the workers run),
for the whole epoch and from its first batch on (``running_*``; ``start_s``: the time to the
first batch, the workers' start and the first windows' reads). Every epoch delivers every
sample (checked), and each batch is touched (summed) as a training step would.
"""
from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trainfeed
from trainfeed.benchmarks.ab.hostload import ProcessesCPU

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    import numpy as np
    import torch

#: Worker counts measured under fork; the other start methods are measured with this many.
WORKERS = (1, 2, 4)
OTHER_METHODS_WORKERS = 2


def _epoch(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], cpu: ProcessesCPU) -> dict[str, Any]:
    """One epoch: samples, bytes, seconds and CPU-seconds, whole and from its first batch on
    (before it: the workers' start and the first windows' reads)."""
    c0, t0 = cpu.seconds(), time.perf_counter()
    samples = nbytes = first_bytes = 0
    first_s = first_cpu = 0.0
    for x, y in batches:
        if not samples:
            first_s, first_cpu, first_bytes = time.perf_counter() - t0, cpu.seconds() - c0, x.nbytes
        samples += len(y)
        nbytes += x.nbytes
        float(x.view(-1)[::4096].sum())  # touch the batch, as a step would
        if samples % 2048 < len(y):
            cpu.seconds()  # a worker that exits keeps its last reading
    seconds, cpu_s = time.perf_counter() - t0, cpu.seconds() - c0
    running = nbytes - first_bytes
    return {"samples": samples, "bytes": nbytes, "seconds": round(seconds, 3),
            "mb_per_s": round(nbytes / seconds / 1e6, 1), "cpu_s": round(cpu_s, 3),
            "cpu_s_per_gb": round(cpu_s / (nbytes / 1e9), 3), "start_s": round(first_s, 3),
            "running_mb_per_s": round(running / max(1e-9, seconds - first_s) / 1e6, 1),
            "running_cpu_s_per_gb": round((cpu_s - first_cpu) / max(1, running) * 1e9, 3),
            "load_1m": round(os.getloadavg()[0], 2)}


def _cell(url: str, options: dict[str, Any], samples: int, kind: str, method: str, n: int, cache: str | None,
          batch_size: int, out: Queue[dict[str, Any] | None]) -> None:
    """One cell in a process of its own (what a training process starts from: nothing warmed by
    earlier cells), two epochs; the records go to ``out``."""
    from torch.utils.data import DataLoader

    cpu = ProcessesCPU()
    store = trainfeed.open_store(url, storage_options=options, io_concurrency=8, cache_dir=cache)
    dataset = trainfeed.TorchDataset(store, batch_size=batch_size, seed=1)
    loader = DataLoader(dataset, batch_size=None, num_workers=n, persistent_workers=n > 0, timeout=600 if n else 0,
                        multiprocessing_context=method if n else None)
    cell = {"method": method, "workers": n, "cache": cache is not None}
    for epoch in (1, 2):
        dataset.set_epoch(epoch)
        rec = {"kind": kind, "epoch": epoch, **cell, **_epoch(loader, cpu)}
        assert rec["samples"] == samples, rec
        out.put(rec)
    del loader, dataset
    if cache is not None:  # store.batches' epoch 2 from the same cache: the reference for the cache's target
        rec = _epoch(_as_tensors((b.x, b.y) for b in store.batches(batch_size, seed=1, epoch=2)), cpu)
        out.put({"kind": "store_batches_cache", "epoch": 2, **cell, **rec})
        from trainfeed.converters.storage.cache_writer import flush_cache_writes

        flush_cache_writes()
    out.put(None)


def rows(url: str, options: dict[str, Any], samples: int, work: Path, methods: tuple[str, ...] = ("fork",
         "forkserver", "spawn"),
         workers: tuple[int, ...] = WORKERS, batch_size: int = 32) -> Iterator[dict[str, Any]]:
    """The DataLoader rows for the store at ``url``: two epochs of each cell, each cell in a
    fresh process (spawned: the bench's own state is not inherited)."""
    import multiprocessing

    def cells() -> Iterator[tuple[str, str, int, str | None]]:
        yield "threads", "none", 0, None
        for n in workers:
            yield "workers", "fork", n, None
        for method in methods:
            if method != "fork":
                yield "workers", method, OTHER_METHODS_WORKERS, None
        for n in (0, 2):
            yield "cache", "fork" if n else "none", n, str(work / f"loader-cache-{n}")

    ctx = multiprocessing.get_context("spawn")
    for kind, method, n, cache in cells():
        out = ctx.Queue()
        proc = ctx.Process(target=_cell, args=(url, options, samples, kind, method, n, cache, batch_size, out))
        proc.start()
        while (rec := out.get(timeout=1800)) is not None:
            yield rec
        proc.join(120)
        assert proc.exitcode == 0, (kind, method, n, proc.exitcode)
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)


def _rank_epochs(rank: int, world: int, url: str, options: dict[str, Any],
                 out: Queue[tuple[int, int, int, float, float]]) -> None:
    """One rank of ``world``, reading its part of two epochs in trainfeed's threads."""
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    store = trainfeed.open_store(url, storage_options=options, io_concurrency=8)
    dataset = trainfeed.TorchDataset(store, global_batch_size=32, seed=1)
    for epoch in (1, 2):
        dataset.set_epoch(epoch)
        t0, c0, nbytes = time.perf_counter(), time.process_time(), 0
        for x, _ in dataset:
            nbytes += x.nbytes
        out.put((rank, epoch, nbytes, time.perf_counter() - t0, time.process_time() - c0))


def rank_rows(url: str, options: dict[str, Any], worlds: tuple[int, ...] = (1, 2)) -> Iterator[dict[str, Any]]:
    """W ranks on this machine, each reading its part of every global batch (issue #30's
    throughput target: their aggregate MB/s against one rank's): per epoch, the bytes all ranks
    delivered over the slowest rank's time, and their CPU-seconds per GB together."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for world in worlds:
        out = ctx.Queue()
        procs = [ctx.Process(target=_rank_epochs, args=(r, world, url, options, out)) for r in range(world)]
        for p in procs:
            p.start()
        got = [out.get(timeout=900) for _ in range(2 * world)]
        for p in procs:
            p.join(60)
        for epoch in (1, 2):
            mine = [g for g in got if g[1] == epoch]
            nbytes, seconds, cpu = sum(g[2] for g in mine), max(g[3] for g in mine), sum(g[4] for g in mine)
            yield {"kind": "ranks", "epoch": epoch, "method": "fork", "workers": 0, "cache": False, "world": world,
                   "bytes": nbytes, "seconds": round(seconds, 3), "mb_per_s": round(nbytes / seconds / 1e6, 1),
                   "cpu_s": round(cpu, 3), "cpu_s_per_gb": round(cpu / (nbytes / 1e9), 3),
                   "load_1m": round(os.getloadavg()[0], 2)}


def _as_tensors(batches: Iterator[tuple[np.ndarray, np.ndarray]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    import torch

    for x, y in batches:
        yield torch.from_numpy(x), torch.from_numpy(y)


def _lance_cell(url: str, storage_options: dict[str, Any], shape: tuple[int, ...], samples: int, n: int,
                out: Queue[dict[str, Any] | None]) -> None:
    """Lance's own PyTorch dataset (``lance.torch.data.LanceDataset``, batches of 32, in order)
    through a DataLoader with ``n`` workers, two epochs, in a process of its own."""
    import numpy as np
    import torch
    from lance.torch.data import LanceDataset
    from torch.utils.data import DataLoader

    def to_tensor(batch: Any, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:  # batch: a pyarrow RecordBatch
        column = batch.column("volume")
        x = np.frombuffer(column.buffers()[2], np.float32)[:len(column) * int(np.prod(shape))]
        return torch.from_numpy(x.reshape(-1, *shape)), torch.from_numpy(batch.column("label").to_numpy())

    cpu = ProcessesCPU()
    dataset = LanceDataset(url, 32, columns=["id", "label", "volume"], to_tensor_fn=to_tensor,
                           dataset_options={"storage_options": storage_options})
    loader = DataLoader(dataset, batch_size=None, num_workers=n, persistent_workers=n > 0, timeout=600 if n else 0,
                        multiprocessing_context="fork" if n else None)
    for epoch in (1, 2):
        rec = {"kind": "lance_loader", "epoch": epoch, "method": "fork" if n else "none", "workers": n,
               **_epoch(loader, cpu)}
        assert rec["samples"] == samples, rec
        out.put(rec)
    out.put(None)


def lance_rows(url: str, storage_options: dict[str, Any], shape: tuple[int, ...], samples: int) -> Iterator[dict[str,
               Any]]:
    """The peer's rows beside ours: Lance's dataset through 0 and 2 workers, each in a fresh process."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    for n in (0, OTHER_METHODS_WORKERS):
        out = ctx.Queue()
        proc = ctx.Process(target=_lance_cell, args=(url, storage_options, shape, samples, n, out))
        proc.start()
        while (rec := out.get(timeout=1800)) is not None:
            yield rec
        proc.join(120)
