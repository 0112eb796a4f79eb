"""Batches from DataLoader worker processes to the training process without a copy.

A tensor a worker returns is normally moved into fresh shared memory, which the training
process then maps: a new allocation and a copy of every batch (1.3-1.6 CPU-s per GB on a
small cloud VM, more than reading it). Here instead:

- The training process allocates a *ring* of batch slots in shared memory once, when its
  DataLoader starts workers (just before a fork, or when the dataset is pickled for a spawn or
  forkserver worker). It is shared by file descriptor and unlinked at once: nothing is ever
  left in /dev/shm, whatever kills whom.
- One *reader* per rank, a thread of DataLoader worker 0, reads the rank's batches in order
  (``readers.iter_batches``), each gathered straight into a free slot; the order therefore does
  not depend on the number of workers.
- Worker ``w`` of ``N`` hands over batches ``s+w, s+w+N, ...`` (a DataLoader asks its workers in
  turn). What crosses the DataLoader's queue is each slot tensor's *handle* (``SlotTensor``
  pickles as one); the training process answers it with a tensor viewing its own mapping of
  the slot.
- A slot is the reader's again once every tensor the training process made of it is gone (a
  finalizer): a batch kept in a list, across epochs or by another thread is never
  overwritten. When the training process holds every slot, the reader waits, and after
  ``HOLD_TIMEOUT`` says so with an error.

This module is the workers' side (the reader and the handles each worker hands over);
torch_ring.py the training process's (the ring, the views).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.storage.cache import pid_alive
from trainfeed.converters.storage.cache_writer import flush_cache_writes
from trainfeed.torch_ring import (
    BATCH,
    FILL,
    H_END,
    H_PID,
    H_RUN,
    H_START,
    H_WRITER,
    READY,
    RELEASED,
    ROWS,
    RUN,
    S_AT,
    TAKEN,
    Y_AT,
    Handle,
    Ring,
    SlotTensor,
)
from trainfeed.training.reading.store import Batch

T = TypeVar("T")
#: The reader's allocator for a batch's x, (shape, dtype) -> memory in a free slot.
Allocate = Callable[[tuple[int, ...], npt.DTypeLike], np.ndarray]

#: Batches the reader fills ahead of the training process, at most (and at most this many bytes).
AHEAD_BYTES = 512 << 20
#: Seconds the reader waits while the training process holds every slot, before it says so.
HOLD_TIMEOUT = 60.0
#: Longest pause between two looks at the slot table while waiting (seconds); a worker whose
#: batch is more than one batch ahead of the reader looks every POLL_FAR.
POLL_MAX = 0.002
POLL_FAR = 0.01
#: Seconds the reading worker waits at the end of its epoch for its cache writes; what is not
#: written by then is fetched and cached in a later epoch.
WORKER_FLUSH_S = 10.0


class Reader(threading.Thread):
    """DataLoader worker 0's thread that reads the rank's batches into the ring."""

    def __init__(self, ring: Ring, run: int, epoch: int, batches: Callable[[Allocate], Iterator[Batch]],
                 start: int, end: int, workers: int, shape_dims: int = 0) -> None:
        """``shape_dims``: sizes of each sample's own shape kept in the slot after its labels (a
        fitted store's ``Batch.shapes``); 0: none."""
        super().__init__(name="trainfeed-ring-reader", daemon=True)
        self.shape_dims = shape_dims
        self.ring, self.run_id, self.epoch, self.batches = ring, run, epoch, batches
        self.start_batch, self.end = start, end
        self.ahead = max(1, min(2 * workers + 1, AHEAD_BYTES // ring.slot_bytes))
        self.stop = threading.Event()
        self._slot = -1
        self._seq = 0
        self._parent = os.getppid()

    def run(self) -> None:
        ring, table = self.ring, self.ring.np_table
        ring.announce(self.run_id, self.epoch, self.start_batch, self.end)
        try:
            self._take_over()
            self._seq = int(table[:, FILL].max()) + 1
            for k, batch in enumerate(self.batches(self._empty), start=self.start_batch):
                self._check_current()
                if self._slot < 0:  # a reader that does not gather into the slot (Petastorm's pools)
                    self._empty(batch.x.shape, batch.x.dtype)[...] = batch.x
                s, y_at = self._slot, _aligned(batch.x.nbytes)
                ring.slot(s)[y_at:y_at + batch.y.nbytes] = batch.y.view(np.uint8)
                s_at = _aligned(y_at + batch.y.nbytes)
                if self.shape_dims and batch.shapes is not None:
                    ring.slot(s)[s_at:s_at + batch.shapes.nbytes] = batch.shapes.reshape(-1).view(np.uint8)
                table[s, ROWS], table[s, Y_AT], table[s, BATCH], table[s, RUN] = len(batch.y), y_at, k, self.run_id
                table[s, S_AT] = s_at
                table[s, FILL] = self._seq
                table[s, READY] = 1  # last: published
                self._seq += 1
                self._slot = -1
        except _Stopped:
            return
        except BaseException as exc:  # told to every worker waiting for this run
            ring.fail(self.run_id, str(exc) if isinstance(exc, TrainfeedError) else f"{type(exc).__name__}: {exc}")
            return
        finally:
            if int(ring.np_header[H_WRITER]) == os.getpid():
                ring.np_header[H_WRITER] = 0
        flush_cache_writes(timeout=WORKER_FLUSH_S)  # this worker may exit now: its cache writes first (bounded)

    def _take_over(self) -> None:
        """Wait until the reader of an earlier run (of a DataLoader iterator dropped but not yet
        collected) has seen this run's announcement and stopped: one writer at a time."""
        header, me, since = self.ring.np_header, os.getpid(), time.monotonic()
        while (other := int(header[H_WRITER])) not in (0, me) and _alive(other):
            if self.stop.is_set():
                raise _Stopped
            if time.monotonic() - since > HOLD_TIMEOUT:
                raise TrainfeedError(f"the reader of an earlier iteration of this TorchDataset (pid {other}) has not "
                                     f"stopped in {HOLD_TIMEOUT:.0f} s")
            time.sleep(POLL_MAX)
        header[H_WRITER] = me

    def _check_current(self) -> None:
        """Stop once this run is no longer the ring's (a newer iteration announced itself)."""
        if self.stop.is_set() or int(self.ring.np_header[H_RUN]) != self.run_id:
            raise _Stopped

    def _empty(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
        """The engine's allocator for a batch's x: a free slot's memory."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if _aligned(nbytes) + _aligned(8 * shape[0]) + 8 * shape[0] * self.shape_dims > self.ring.slot_bytes:
            raise TrainfeedError(f"a batch of {nbytes} bytes does not fit the DataLoader's batch slots "
                                 f"({self.ring.slot_bytes} bytes)")
        s = self._free_slot()
        table = self.ring.np_table
        table[s, READY] = 0  # first: taken back
        self._slot = s
        x: np.ndarray = self.ring.slot(s)[:nbytes].view(dtype).reshape(shape)
        return x

    def _free_slot(self) -> int:
        table, run = self.ring.np_table, self.run_id
        held_since, pause = None, 0.0001
        while True:
            self._check_current()
            mine = table[:, RUN] == run
            in_flight = mine & (table[:, READY] == 1) & (table[:, TAKEN] != table[:, FILL])
            free = (table[:, RELEASED] == table[:, FILL]) | (~mine & (table[:, TAKEN] != table[:, FILL]))
            if int(in_flight.sum()) < self.ahead and free.any():
                return int(np.flatnonzero(free)[0])
            if not in_flight.any():  # every slot is held by the training process
                held_since = held_since or time.monotonic()
                if time.monotonic() - held_since > HOLD_TIMEOUT:
                    raise TrainfeedError(f"the training process has held all {self.ring.slots} batch slots of this "
                                         f"DataLoader for {HOLD_TIMEOUT:.0f} s: keep fewer batches alive at once, or "
                                         "keep copies (x.clone())")
            else:
                held_since = None
            if os.getppid() != self._parent:
                raise _Stopped  # the training process is gone
            time.sleep(pause)
            pause = min(POLL_MAX * 5, pause * 2)


def _aligned(n: int) -> int:
    return -(-n // 64) * 64


class _Stopped(Exception):
    """The reader was told to stop (its run was dropped) or its training process is gone."""


def consume(ring: Ring, run: int, worker: int, workers: int, reader: Reader | None,
            sample: tuple[tuple[int, ...], str], shape_dims: int = 0) -> Iterator[tuple[SlotTensor, ...]]:
    """Worker ``worker`` of ``workers``: its batches of run ``run`` as slot tensors (x of
    ``sample``'s shape and dtype per row, y int64 and, with ``shape_dims``, each sample's own
    shape, int64 of that many sizes), in order; with ``reader`` (worker 0), until that reader has
    read the other workers' batches too."""
    header, table = ring.np_header, ring.np_table
    parent, done = os.getppid(), _loader_done()
    try:
        _wait(ring, run, reader, parent, lambda: True if int(header[H_RUN]) == run else None, done, announced=False)
    except _Stopped:
        return
    start, end = int(header[H_START]), int(header[H_END])
    for k in worker_batches(start, end, worker, workers):
        try:
            s = _wait(ring, run, reader, parent, _BatchProbe(table, run, k), done)
        except _Stopped:  # the DataLoader is shutting its workers down: give the worker back to it
            return
        if s < 0:  # delivered already, for a handle that came first: this handle stands for the next batch
            yield _ticket(ring, run, k, sample, shape_dims)
            continue
        seq, rows, y_at = int(table[s, FILL]), int(table[s, ROWS]), int(table[s, Y_AT])
        x_shape, x_dtype = (rows, *sample[0]), sample[1]
        parts: tuple[SlotTensor, ...] = (
            _slot_tensor(ring, Handle(ring.id, s, seq, run, k, "x", x_shape, np.dtype(x_dtype).str, 0)),
            _slot_tensor(ring, Handle(ring.id, s, seq, run, k, "y", (rows,), "<i8", y_at)))
        if shape_dims:
            parts += (_slot_tensor(ring, Handle(ring.id, s, seq, run, k, "s", (rows, shape_dims), "<i8",
                                                int(table[s, S_AT]))),)
        yield parts
    while reader is not None and reader.is_alive():  # the other workers' batches are read by this one's thread
        reader.join(0.05)
        if done is not None and done.is_set():  # the DataLoader is shutting down: they are not wanted
            reader.stop.set()


def worker_batches(start: int, end: int, worker: int, workers: int) -> range:
    """The batches worker ``worker`` of ``workers`` hands over: a DataLoader asks its workers in
    turn, so together they hand over ``start..end-1`` in order."""
    return range(start + worker, end, workers)


class _BatchProbe:
    """Whether batch ``k`` of ``run`` is published, and how many batches the reader still has to
    read before it (a worker waiting far behind the reader looks less often)."""

    def __init__(self, table: np.ndarray, run: int, k: int) -> None:
        self.table, self.run, self.k, self.distance = table, run, k, 0

    def __call__(self) -> int | None:
        """The slot of batch k; -1 when it was published and its slot is gone (it was delivered
        for another worker's handle, ``DataLoader(in_order=False)``); None while unpublished."""
        table = self.table
        ready = (table[:, RUN] == self.run) & (table[:, READY] == 1)
        hit = np.flatnonzero(ready & (table[:, BATCH] == self.k))
        if len(hit):
            return int(hit[0])
        latest = int(table[ready, BATCH].max()) if ready.any() else -1  # batches are published in order
        if latest >= self.k:
            return -1
        self.distance = self.k - latest
        return None


def _slot_tensor(ring: Ring, handle: Handle) -> SlotTensor:
    shape, dtype, offset = handle.shape, handle.dtype, handle.offset
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    view = torch.from_numpy(ring.slot(handle.slot)[offset:offset + size].view(dtype).reshape(shape))
    t = view.as_subclass(SlotTensor)
    t.handle = handle
    return t


def _ticket(ring: Ring, run: int, k: int, sample: tuple[tuple[int, ...], str], shape_dims: int = 0
            ) -> tuple[SlotTensor, ...]:
    """Handles with no slot behind them: the training process binds them to the run's next batch."""
    def empty(part: str, shape: tuple[int, ...], dtype: str) -> SlotTensor:
        t = torch.empty(shape, dtype=torch_dtype(dtype)).as_subclass(SlotTensor)
        t.handle = Handle(ring.id, -1, 0, run, k, part, shape, np.dtype(dtype).str, 0)
        return t

    parts: tuple[SlotTensor, ...] = (empty("x", (0, *sample[0]), sample[1]), empty("y", (0,), "<i8"))
    return (*parts, empty("s", (0, shape_dims), "<i8")) if shape_dims else parts


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a numpy dtype's name."""
    return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype


def _loader_done() -> Any:
    """The event a DataLoader sets to shut its workers down (a local of torch's worker loop, in
    the frames above this generator), or None outside a DataLoader worker: a worker waiting for
    a batch that will never come (its DataLoader was dropped) must notice it, as the worker loop
    does between batches."""
    frame: Any = sys._getframe(1)
    try:  # no frame may stay referenced from here (a frame refers to its callers)
        while frame is not None:
            if frame.f_code.co_name == "_worker_loop" and "done_event" in frame.f_locals:
                return frame.f_locals["done_event"]
            frame = frame.f_back
        return None
    finally:
        del frame


def _wait(ring: Ring, run: int, reader: Reader | None, parent: int, probe: Callable[[], T | None], done: Any = None,
          announced: bool = True) -> T:
    """``probe()``'s first answer that is not None; raises the reader's error, and stops when
    the reader or the training process is gone, or (``announced``) a newer run took the ring;
    ``_Stopped`` when the DataLoader shuts its workers down (``done``)."""
    pause, checked = 0.00005, time.monotonic()
    while (found := probe()) is None:
        if done is not None and done.is_set():
            raise _Stopped
        message = ring.error(run)
        if message is not None:
            raise TrainfeedError(message)
        if announced and int(ring.np_header[H_RUN]) != run:
            raise TrainfeedError("another iteration of this TorchDataset started while this one ran: iterate it "
                                 "through one DataLoader at a time")
        now = time.monotonic()
        if now - checked > 1.0:
            checked = now
            if os.getppid() != parent:
                raise TrainfeedError("the training process is gone")
            pid = int(ring.np_header[H_PID])
            if reader is None and int(ring.np_header[H_RUN]) == run and not _alive(pid):
                raise TrainfeedError(f"the DataLoader worker reading the store (pid {pid}) is gone")
            if reader is not None and not reader.is_alive() and (found := probe()) is None:
                raise TrainfeedError(ring.error(run) or "the reader stopped before this batch was read")
            if found is not None:
                return found
        time.sleep(pause)
        pause = POLL_FAR if getattr(probe, "distance", 0) > 1 else min(POLL_MAX, pause * 2)
    return found


def _alive(pid: int) -> bool:
    """``pid_alive``, and not a zombie."""
    if not pid_alive(pid):
        return False
    try:  # a killed worker stays a zombie until the DataLoader reaps it
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
