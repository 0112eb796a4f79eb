"""``trainfeed.TorchDataset``: a store as a PyTorch ``IterableDataset`` of (x, y) batches. Each
rank yields its part of every global batch of one order, the same for any number of ranks and
DataLoader workers (training/reading/order.py); every rank yields the same number of batches;
a position saved on one topology resumes on another."""
from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.storage.clouds import StorageOptions
from trainfeed.store import Pool, Store, epoch_options, open_store
from trainfeed.torch_handoff import Reader, consume, torch_dtype
from trainfeed.torch_ring import Ring
from trainfeed.training.config import distributed_env
from trainfeed.training.reading import readers
from trainfeed.training.reading.store import EpochOptions

#: Marks a TorchDataset position; a state without it (or of another version) is refused.
STATE_FORMAT = "trainfeed-torch-position/2"
#: What a position depends on besides its epoch and batch: a state that differs in one is refused.
ORDER_KEYS = ("store", "seed", "shuffle", "shuffle_buffer", "drop_last", "global_batch_size", "lanes")


def rank_and_world() -> tuple[int, int]:
    """torch.distributed's rank and world size when it is initialized, else torchrun's variables."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    rank, world, _ = distributed_env()
    return rank, world


class TorchDataset(IterableDataset[tuple[torch.Tensor, ...]]):
    """Batches of a store for ``DataLoader(ds, batch_size=None, num_workers=N)``.

    Rank r of W (torch.distributed, else RANK / WORLD_SIZE, taken in the training process and
    carried to its workers) yields its part of each global batch of ``global_batch_size``
    samples (default ``batch_size`` x W; give one of the two): the samples of global batch k
    depend on the store, ``seed``, the epoch, ``shuffle``, ``shuffle_buffer``, ``drop_last``,
    the global batch size and ``lanes``, never on W or N. Every rank yields the same number of
    batches: ``drop_last`` drops the short tail; without it, with several ranks, the last batch
    is filled with the epoch's first samples again (``padding(k)`` says how many). Each batch
    is ``(x, y)``: x of the stored dtype, shape (batch_size, *sample shape); y int64 labels (-1
    for unlabeled samples). Encoded images are decoded (``augment``: random resized crop and
    flip, as ``Store.batches``). Arrays of different shapes need a ``fit`` (``open_store(uri,
    fit=...)``, or ``fit=`` here with a URL): batches are then of the fit's shape, and with
    ``return_shapes`` each is ``(x, y, shapes)``, shapes int64 (batch_size, len(SHAPE)): each
    sample's own shape (the valid region of a padded one).

    Call ``set_epoch(e)`` before each epoch. ``state_dict(n)``, after ``n`` batches of the epoch
    (counted from the epoch's start: ``enumerate(loader, start=ds.start_batch)``), and
    ``load_state_dict`` resume at the next global batch, on any W and N with the same global
    batch size, without reading earlier pieces.

    With ``num_workers=N``, DataLoader worker 0 reads the rank's batches (in ``workers``
    threads) into shared memory the training process allocated once, and the workers hand them
    over in turn; the training process receives views of that memory, no copy
    (trainfeed/torch_handoff.py). Worker processes of every start method (fork, forkserver,
    spawn) read with clients of their own: the dataset pickles as the store's description."""

    def __init__(self, store: Store | str, *, options: EpochOptions | None = None, batch_size: int = 32,
                 global_batch_size: int | None = None, lanes: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, workers: int = 2, pool: Pool = "arrow",
                 shuffle_buffer: int = 256, storage_options: StorageOptions | None = None, fit: str | None = None,
                 return_shapes: bool = False, augment: bool = False) -> None:
        base = epoch_options(options, batch_size=batch_size, global_batch_size=global_batch_size, lanes=lanes,
                             shuffle=shuffle, seed=seed, drop_last=drop_last, workers=workers, pool=pool,
                             shuffle_buffer=shuffle_buffer, augment=augment)
        if (base.rank, base.world_size) != (0, 1):
            raise UsageError("TorchDataset takes the rank and world size from torch.distributed (or RANK and "
                             f"WORLD_SIZE): leave the options' rank and world_size at 0 and 1 (not {base.rank} "
                             f"and {base.world_size})")
        if base.pool != "arrow" and base.global_batch_size is not None:
            raise UsageError(f"pool={base.pool!r}: Petastorm's pools read whole row groups per rank, in their own "
                             "order; global_batch_size needs the default pool, arrow")
        self._base = base
        if isinstance(store, Store) and fit is not None:
            raise UsageError("fit= applies to a store TorchDataset opens from a URL; open this one with "
                             "open_store(uri, fit=...)")
        self.store = store if isinstance(store, Store) else open_store(store, storage_options=storage_options, fit=fit)
        if self.store.shape is None:
            raise UsageError(f"{self.store.uri}: samples of different shapes; batches need one: open it with a fit, "
                             "fit='pad:SHAPE', 'crop:SHAPE' or 'resize:SHAPE' (e.g. 'pad:64x64'); Store.batches() "
                             "without one gives each sample in its own shape")
        fitted = self.store.reader.fit
        if return_shapes and fitted is None:
            raise UsageError("return_shapes=True gives each sample's own shape beside a fitted batch: open the store "
                             "with a fit (fit='pad:SHAPE', 'crop:SHAPE' or 'resize:SHAPE')")
        self._shape_dims = len(fitted.shape) if return_shapes and fitted is not None else 0
        # [epoch, first batch of that epoch where the next iteration starts], seen by worker processes
        self._position = torch.zeros(2, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        self._pid = os.getpid()  # the training process: it allocates the batch slots
        self._ring: Ring | None = None
        self._unprepared: str | None = None  # why the slots could not be allocated before a fork
        self._iterations = 0  # this process's iterations: with the workers' base seed, names a DataLoader run
        self._identity: str | None = None
        self._take_topology()
        _LIVE.add(self)

    # ------------------------------------------------------------------ topology

    def _take_topology(self) -> None:
        """This process's rank and world size, and the options of its part (the training process
        calls it when the dataset is made and again before its workers start)."""
        rank, world = rank_and_world()
        base = self._base
        if base.global_batch_size is not None:
            if base.global_batch_size % world:
                raise UsageError(f"global_batch_size={base.global_batch_size} cannot be shared evenly by a world of "
                                 f"{world}: use a multiple of {world}")
            per_rank = base.global_batch_size // world
        else:
            per_rank = base.batch_size
        if base.pool != "arrow" and world > 1:
            raise UsageError(f"pool={base.pool!r}: Petastorm's pools give ranks whole row groups and unequal "
                             "batch counts; with several ranks use the default pool, arrow")
        self.options = replace(base, batch_size=per_rank, rank=rank, world_size=world,
                               global_batch_size=per_rank * world)
        self.batches = readers.batches_per_rank(self.store.reader, self.options)

    def _prepare_workers(self) -> None:
        """In the training process, before its DataLoader starts workers: the topology as it is
        now, and the batch slots they hand batches over in."""
        if os.getpid() != self._pid:
            return
        self._take_topology()
        spec = self.store.reader.sample_spec
        if spec.shape is None:
            raise TrainfeedError(f"{self.store.uri}: field {spec.name!r} has no fixed sample shape")
        sample = int(torch.tensor(0, dtype=torch_dtype(spec.dtype)).element_size())
        for n in spec.shape:
            sample *= int(n)
        rows = self.options.rank_batch
        slot = -(-rows * sample // 64) * 64 + -(-8 * rows // 64) * 64 + 8 * rows * self._shape_dims
        if self._ring is None or self._ring.slot_bytes < slot:
            try:
                self._ring = Ring(slot, self)
            except RuntimeError as exc:  # /dev/shm too small for the ring: say what it needed
                raise TrainfeedError(f"{self.store.uri}: cannot allocate the DataLoader's batch slots in shared memory "
                                     f"({slot:,} bytes a batch): {exc}; use a smaller batch_size (or fit), or give "
                                     "/dev/shm more room (docker run --shm-size)") from exc

    def __getstate__(self) -> dict[str, Any]:
        self._prepare_workers()  # a spawn or forkserver worker is being started (or a copy made)
        return dict(self.__dict__)

    # ------------------------------------------------------------------ position

    @property
    def epoch(self) -> int:
        return int(self._position[0])

    @property
    def start_batch(self) -> int:
        """The batch of the epoch the next iteration starts at (0, or where a state resumes)."""
        return int(self._position[1])

    @property
    def batch_size(self) -> int:
        """Samples per batch of this rank."""
        return self.options.rank_batch

    @property
    def global_batch_size(self) -> int:
        return self.options.global_batch

    @property
    def lanes(self) -> int:
        return self.options.lane_count

    @property
    def rank(self) -> int:
        return self.options.rank

    @property
    def world_size(self) -> int:
        return self.options.world_size

    def __len__(self) -> int:
        """Batches of a whole epoch on this rank (the same on every rank)."""
        return self.batches

    def _move_to(self, epoch: int, first_batch: int) -> None:
        self._position.copy_(torch.tensor([epoch, first_batch], dtype=torch.int64))

    def set_epoch(self, epoch: int) -> None:
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise UsageError(f"set_epoch takes an epoch number, 0 or more, not {epoch!r}")
        if epoch != self.epoch:
            self._move_to(epoch, 0)

    def padding(self, batch: int) -> int:
        """How many rows at the end of this rank's batch ``batch`` of the current epoch repeat
        the epoch's first samples (only the last batch, several ranks, no ``drop_last``): leave
        them out of metrics."""
        order = readers.epoch_order(self.store.reader, self.options, self.epoch)
        if not 0 <= batch < order.batches:
            raise UsageError(f"batch {batch} is not a batch of this epoch (0 to {order.batches - 1})")
        if not order.pad:
            return 0
        return self.options.rank_batch - order.real_rows(batch, self.rank, self.world_size)

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        info = get_worker_info()
        if info is None:  # in the training process: trainfeed's own threads read
            self._take_topology()
            for batch in readers.iter_batches(self.store.reader, self.options, self.epoch, self.start_batch):
                if self._shape_dims and batch.shapes is not None:
                    yield torch.from_numpy(batch.x), torch.from_numpy(batch.y), torch.from_numpy(batch.shapes)
                else:
                    yield torch.from_numpy(batch.x), torch.from_numpy(batch.y)
            return
        ring = self._ring
        if ring is None:
            raise TrainfeedError(self._unprepared or "TorchDataset: this DataLoader worker has no batch slots (the "
                                 "dataset reached it without its training process preparing it)")
        self._iterations += 1
        run = ((info.seed - info.id) * 1_000_003 + self._iterations) % (1 << 62) + 1
        reader = None
        if info.id == 0:
            epoch, start, opts, store = self.epoch, self.start_batch, self.options, self.store.reader
            reader = Reader(ring, run, epoch, lambda empty: readers.iter_batches(store, opts, epoch, start, empty),
                            start, self.batches, info.num_workers, self._shape_dims)
            reader.start()
        spec = self.store.reader.sample_spec
        assert spec.shape is not None, "_prepare_workers refused a store without a fixed sample shape"
        try:
            yield from consume(ring, run, info.id, info.num_workers, reader, (tuple(spec.shape), spec.dtype),
                               self._shape_dims)
        finally:
            if reader is not None and reader.is_alive():
                reader.stop.set()
                reader.join(10)

    # ------------------------------------------------------------------ state

    def _order_state(self) -> dict[str, Any]:
        if self._identity is None:
            self._identity = readers.store_identity(self.store.reader)
        o = self.options
        return {"store": self._identity, "seed": o.seed, "shuffle": o.shuffle, "shuffle_buffer": o.shuffle_buffer,
                "drop_last": o.drop_last, "global_batch_size": o.global_batch, "lanes": o.lane_count}

    def state_dict(self, batches: int) -> dict[str, Any]:
        """Where to resume after ``batches`` batches of this epoch, counted from the epoch's
        start (a resumed epoch counts the batches before its resume point too)."""
        if not isinstance(batches, int) or isinstance(batches, bool):
            raise UsageError(f"state_dict takes the number of batches done in this epoch, not {batches!r}")
        if batches < self.start_batch:
            raise UsageError(f"state_dict({batches}): this epoch resumed at batch {self.start_batch}; count batches "
                             "from the epoch's start: enumerate(loader, start=dataset.start_batch)")
        if batches > self.batches:
            raise UsageError(f"state_dict({batches}): an epoch has {self.batches} batches on each rank")
        return {"format": STATE_FORMAT, "epoch": self.epoch, "batch": batches, **self._order_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s next global batch: refused (``TrainfeedError``, naming what
        differs) when it was saved for another store or generation of it, or another order."""
        where = self.store.uri
        if not isinstance(state, dict):
            raise TrainfeedError(f"{where}: load_state_dict takes a state from TorchDataset.state_dict, not "
                                 f"{type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise TrainfeedError(f"{where}: not a TorchDataset position (no {STATE_FORMAT!r} marker); save one "
                                 "with state_dict(n)")
        for key in ("epoch", "batch"):
            value = state.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TrainfeedError(f"{where}: the state's {key} must be an integer, 0 or more, not {value!r}")
        mine = self._order_state()
        differ = [k for k in ORDER_KEYS if state.get(k) != mine[k]]
        if differ:
            named = ["another store, or another generation of it" if k == "store" else
                     f"{k} {state.get(k)!r} (now {mine[k]!r})" for k in differ]
            raise TrainfeedError(f"{where}: cannot resume: the state was saved for " + ", ".join(named))
        if state["batch"] > self.batches:
            raise TrainfeedError(f"{where}: the state's batch {state['batch']} is past the end of an epoch "
                                 f"({self.batches} batches)")
        self._move_to(state["epoch"], state["batch"])


#: The datasets of this process: before it forks (a DataLoader starting workers), each prepares.
_LIVE: weakref.WeakSet[TorchDataset] = weakref.WeakSet()


def _before_fork() -> None:
    for dataset in list(_LIVE):
        try:
            dataset._prepare_workers()
        except Exception as exc:  # a fork must go on: the worker says what is wrong
            dataset._unprepared = str(exc)


os.register_at_fork(before=_before_fork)
