"""``trainfeed.TorchDataset``: a store as a PyTorch ``IterableDataset`` of (x, y) batches,
sharded by rank and DataLoader worker, that resumes mid-epoch without re-reading."""
from __future__ import annotations

import itertools
import os
from dataclasses import replace
from typing import Any, Iterator

import torch
from torch.utils.data import IterableDataset, get_worker_info

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.storage.fetch import flush_cache_writes
from trainfeed.store import Pool, Store, epoch_options, open_store
from trainfeed.training.reading import readers
from trainfeed.training.reading.store import EpochOptions

#: Seconds a DataLoader worker waits at the end of its epoch for its cache writes; what is not
#: written by then is fetched and cached in a later epoch.
WORKER_FLUSH_S = 10.0


def _rank_world() -> tuple[int, int]:
    """torch.distributed's rank and world size when it is initialized, else torchrun's variables."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def delivery_order(counts: list[int]) -> Iterator[int]:
    """The worker each batch comes from, in the order a DataLoader yields them: one batch of each
    worker that still has one, worker by worker, round after round (``counts``: batches per worker)."""
    for round_ in range(max(counts, default=0)):
        yield from (w for w, n in enumerate(counts) if round_ < n)


def resume_points(counts: list[int], done: int) -> tuple[list[int], int]:
    """After ``done`` batches of the delivery order: each worker's next batch, and the worker that
    delivers the next one (the DataLoader's first worker must be that one to keep the order)."""
    starts = [0] * len(counts)
    order = delivery_order(counts)
    for worker in itertools.islice(order, done):
        starts[worker] += 1
    return starts, next(order, 0)


class TorchDataset(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Batches of a store for ``DataLoader(ds, batch_size=None, num_workers=N)``.

    Rank r of W (torch.distributed, else RANK / WORLD_SIZE) with N DataLoader workers reads
    shard ``r * N + worker`` of ``W * N`` (whole pieces: row groups, HDF5 slices, files): every
    sample once per epoch across ranks and workers. Each yields ``(x, y)``: x a tensor of the
    stored dtype, shape (B, *sample shape); y int64 labels (-1 for unlabeled samples). Encoded
    images are decoded (``augment``: random resized crop and flip, as ``Store.batches``).

    Call ``set_epoch(e)`` before each epoch (a new seeded order). ``state_dict(n)``, after n
    batches of an epoch's iterator, and ``load_state_dict`` resume at the exact next batch
    without reading earlier pieces; resume with the same batch size, seed, world size and
    DataLoader ``num_workers``. ``options``: an ``EpochOptions`` instead of the keywords (a keyword
    that differs from it is refused; its shard and num_shards stay 0 and 1: the dataset shards itself).

    Worker processes of every start method (fork, forkserver, spawn) read with clients of their
    own: the dataset pickles as the store's description (URL, options, the object versions
    pinned at open), never as open connections. The epoch and resume point live in shared
    memory, so ``persistent_workers=True`` workers follow ``set_epoch`` and ``load_state_dict``."""

    def __init__(self, store: Store | str, *, options: EpochOptions | None = None, batch_size: int = 32,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, workers: int = 2,
                 pool: Pool = "arrow", shuffle_buffer: int = 256, storage_options: dict[str, str] | None = None,
                 augment: bool = False):
        self.options = epoch_options(options, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                     drop_last=drop_last, workers=workers, pool=pool,
                                     shuffle_buffer=shuffle_buffer, augment=augment)
        if (self.options.shard, self.options.num_shards) != (0, 1):
            raise UsageError("TorchDataset shards by rank and DataLoader worker itself: leave the options' "
                             f"shard and num_shards at 0 and 1 (not {self.options.shard} and "
                             f"{self.options.num_shards})")
        self.store = store if isinstance(store, Store) else open_store(store, storage_options=storage_options)
        # [epoch, first batch of that epoch where the next iteration starts], seen by worker processes
        self._position = torch.zeros(2, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]  # torch leaves it unannotated

    @property
    def epoch(self) -> int:
        return int(self._position[0])

    @property
    def _first_batch(self) -> int:
        return int(self._position[1])

    def _move_to(self, epoch: int, first_batch: int) -> None:
        self._position.copy_(torch.tensor([epoch, first_batch], dtype=torch.int64))

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._move_to(epoch, 0)

    @property
    def batch_size(self) -> int:
        return self.options.batch_size

    def _batches_of(self, shard: int, num_shards: int) -> int:
        rows = self.store.reader.shard_rows(shard, num_shards)
        return rows // self.batch_size if self.options.drop_last else -(-rows // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        rank, world = _rank_world()
        counts = [self._batches_of(rank * workers + w, world * workers) for w in range(workers)]
        epoch, first_batch = self.epoch, self._first_batch
        starts, first = resume_points(counts, first_batch)
        logical = (worker + first) % workers  # the DataLoader starts with its worker 0
        opts = replace(self.options, shard=rank * workers + logical, num_shards=world * workers)
        for batch in readers.iter_batches(self.store.reader, opts, epoch, start_batch=starts[logical]):
            yield torch.from_numpy(batch.x), torch.from_numpy(batch.y)
        if info is not None:  # a worker process may exit now: its cache writes first (bounded)
            flush_cache_writes(timeout=WORKER_FLUSH_S)

    def state_dict(self, batches: int) -> dict[str, Any]:
        """Where to resume after ``batches`` batches of this epoch's iterator."""
        o = self.options
        return {"epoch": self.epoch, "batch": self._first_batch + batches, "batch_size": o.batch_size,
                "seed": o.seed, "shuffle": o.shuffle, "drop_last": o.drop_last,
                "world_size": _rank_world()[1]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict(0)
        differ = [k for k in ("batch_size", "seed", "shuffle", "drop_last", "world_size") if state.get(k) != mine[k]]
        if differ:
            raise TrainfeedError(f"{self.store.uri}: cannot resume: the state was saved with other "
                                 + ", ".join(f"{k} ({state.get(k)!r}, now {mine[k]!r})" for k in differ))
        self._move_to(int(state["epoch"]), int(state["batch"]))
