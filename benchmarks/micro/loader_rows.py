"""``DataLoader(TorchDataset(store), num_workers=N)`` next to trainfeed's own threads, measured the
way users run it (``make bench-io``'s DataLoader rows; issue #31's targets):

- **threads**: ``num_workers=0``, trainfeed's reader threads in the training process;
- **workers**: ``num_workers`` 1, 2 and 4 with ``persistent_workers=True`` (epoch 1: the
  workers' start included; epoch 2: the steady state), under fork, and under spawn and
  forkserver once (their start, importing torch, is a one-time cost: ``start_s``);
- **cache**: with a fresh ``cache_dir``, epoch 1 (filling it) and epoch 2 (from it), through 0
  and 2 workers, beside ``store.batches``' own epoch 2 from the same kind of cache.

Each record has MB/s of samples delivered and CPU-seconds per GB of the training process and
its worker processes together (read from /proc while the workers run). Every epoch delivers
every sample (checked), and each batch is touched (summed) as a training step would.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

import psutil

import trainfeed

#: Worker counts measured under fork; the other start methods are measured with this many.
WORKERS = (1, 2, 4)
OTHER_METHODS_WORKERS = 2


class ProcessesCPU:
    """CPU-seconds of this process and its children (DataLoader workers), read on demand:
    a child's last reading stands once it has exited."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self._children: dict[int, float] = {}

    def children(self) -> float:
        """The children's CPU-seconds (each as last read)."""
        for child in self.me.children(recursive=True):
            try:
                t = child.cpu_times()
                self._children[child.pid] = t.user + t.system
            except psutil.Error:
                pass
        return sum(self._children.values())

    def seconds(self) -> float:
        t = self.me.cpu_times()
        return t.user + t.system + self.children()


def _epoch(batches, cpu: ProcessesCPU) -> tuple[int, int, float, float, float | None]:
    """(samples, bytes, seconds, CPU-seconds, seconds to the first batch) of one epoch."""
    c0, t0 = cpu.seconds(), time.perf_counter()
    samples = nbytes = 0
    first = None
    for x, y in batches:
        if first is None:
            first = time.perf_counter() - t0
        samples += len(y)
        nbytes += x.nbytes
        float(x.view(-1)[::4096].sum())  # touch the batch, as a step would
        if samples and samples % 2048 < len(y):
            cpu.seconds()  # a worker that exits keeps its last reading
    return samples, nbytes, time.perf_counter() - t0, cpu.seconds() - c0, first


def _record(kind: str, epoch: int, samples: int, nbytes: int, seconds: float, cpu: float, **fields) -> dict:
    return {"kind": kind, "epoch": epoch, **fields, "samples": samples, "bytes": nbytes,
            "seconds": round(seconds, 3), "mb_per_s": round(nbytes / seconds / 1e6, 1),
            "cpu_s": round(cpu, 3), "cpu_s_per_gb": round(cpu / (nbytes / 1e9), 3),
            "load_1m": round(os.getloadavg()[0], 2)}


def rows(url: str, options: dict, samples: int, work: Path, methods: tuple[str, ...] = ("fork", "forkserver", "spawn"),
         workers: tuple[int, ...] = WORKERS, batch_size: int = 32) -> Iterator[dict]:
    """The DataLoader rows for the store at ``url``: two epochs of each cell."""
    from torch.utils.data import DataLoader

    cpu = ProcessesCPU()

    def cells() -> Iterator[tuple[str, str, int, str | None]]:
        yield "threads", "none", 0, None
        for n in workers:
            yield "workers", "fork", n, None
        for method in methods:
            if method != "fork":
                yield "workers", method, OTHER_METHODS_WORKERS, None
        for n in (0, 2):
            yield "cache", "fork" if n else "none", n, str(work / f"loader-cache-{n}")

    for kind, method, n, cache in cells():
        store = trainfeed.open_store(url, storage_options=options, io_concurrency=8, cache_dir=cache)
        dataset = trainfeed.TorchDataset(store, batch_size=batch_size, seed=1)
        loader = DataLoader(dataset, batch_size=None, num_workers=n, persistent_workers=n > 0, timeout=600 if n else 0,
                            multiprocessing_context=method if n else None)
        for epoch in (1, 2):
            dataset.set_epoch(epoch)
            got, nbytes, seconds, cpu_s, first = _epoch(loader, cpu)
            assert got == samples, (kind, method, n, got)
            extra = {"start_s": round(first, 3)} if epoch == 1 and first is not None else {}
            yield _record(kind, epoch, got, nbytes, seconds, cpu_s, method=method, workers=n, cache=cache is not None,
                          **extra)
        del loader, dataset
        if cache is not None:
            yield from _store_epoch_from_cache(store, cpu, samples, batch_size)
            from trainfeed.converters.storage.fetch import flush_cache_writes

            flush_cache_writes()
            shutil.rmtree(cache, ignore_errors=True)


def _store_epoch_from_cache(store, cpu: ProcessesCPU, samples: int, batch_size: int) -> Iterator[dict]:
    """``store.batches``' epoch 2 from the cache the DataLoader epochs filled (the reference for
    the cache's target), only once per cache: with the 0-worker cell."""
    batches: Callable[[], Iterator] = lambda: ((b.x, b.y) for b in store.batches(batch_size, seed=1, epoch=2))  # noqa: E731
    got, nbytes, seconds, cpu_s, _ = _epoch(_as_tensors(batches()), cpu)
    assert got == samples
    yield _record("store_batches_cache", 2, got, nbytes, seconds, cpu_s, method="none", workers=0, cache=True)


def _as_tensors(batches: Iterator) -> Iterator:
    import torch

    for x, y in batches:
        yield torch.from_numpy(x), torch.from_numpy(y)


def _rank_epochs(rank: int, world: int, url: str, options: dict, out) -> None:
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


def rank_rows(url: str, options: dict, worlds: tuple[int, ...] = (1, 2)) -> Iterator[dict]:
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
            yield _record("ranks", epoch, 0, nbytes, seconds, cpu, method="fork", workers=0, cache=False, world=world)
