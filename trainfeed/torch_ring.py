"""The training process's side of the DataLoader hand-over (trainfeed/torch_handoff.py says
how batches cross): the ring of batch slots in shared memory, the handles that cross the
DataLoader's queue, and the views the training process answers them with. A slot goes back to
the reader once no tensor of it is alive.

Slot states live in a small shared table with one writer per column: the reader fills
(``FILL``, ``RUN``, ``BATCH``, ``READY``), the training process takes and releases
(``TAKEN``, ``RELEASED``). A fill of an earlier run that was never taken (its handle was lost
when that run's DataLoader iterator was dropped) is the reader's to reuse.
"""
from __future__ import annotations

import os
import sys
import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from trainfeed.converters.errors import TrainfeedError

#: Virtual size of a ring: slots are touched only when used (lowest first), so this bounds the
#: batches a training process may hold at once, not the memory a run uses.
RING_BYTES = 2 << 30
MIN_SLOTS, MAX_SLOTS = 8, 64
# columns of the slot table (Y_AT: where the labels start, after the samples; S_AT: where the
# samples' own shapes start, after the labels, for a fitted store)
FILL, RUN, BATCH, ROWS, READY, TAKEN, RELEASED, Y_AT, S_AT = range(9)
# cells of the header (H_PID: the reader of run H_RUN; H_WRITER: the process writing slots now)
H_RUN, H_PID, H_EPOCH, H_START, H_END, H_ERROR_RUN, H_ERROR_LEN, H_WRITER = range(8)


@dataclass(frozen=True)
class Handle:
    """What crosses the queue for one tensor of a batch: where it lies in which ring."""

    ring: str
    slot: int
    seq: int
    run: int
    batch: int
    part: str  # "x", "y" or "s" (the samples' own shapes)
    shape: tuple[int, ...]
    dtype: str
    offset: int


class SlotTensor(torch.Tensor):
    """A worker's view of a slot: a tensor that pickles, on a multiprocessing queue, as its
    handle. Operations on it give plain tensors; ``pickle``/``torch.save`` copy it as usual."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # torch's own idiom
    handle: Handle


def _reduce(t: SlotTensor) -> tuple[Callable[[Handle], torch.Tensor], tuple[Handle]]:
    return receive, (t.handle,)


ForkingPickler.register(SlotTensor, _reduce)

#: The rings this process allocated (weakly): the handles that reach it name one of them.
_RINGS: weakref.WeakValueDictionary[str, Ring] = weakref.WeakValueDictionary()


def receive(handle: Handle) -> torch.Tensor:
    """The training process's tensor for a handle from a worker."""
    ring = _RINGS.get(handle.ring)
    if ring is None or ring.owner != os.getpid():
        raise TrainfeedError("a batch from a trainfeed DataLoader worker reached a process that did not start that "
                             "worker; pass batches on with .clone()")
    return ring.receive(handle)


def _shared(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` moved into shared memory (``Tensor.share_memory_``, which torch leaves unannotated)."""
    share: Callable[[], torch.Tensor] = tensor.share_memory_
    return share()


class Ring:
    """Batch slots in shared memory (see the module's docstring). Made by the training process;
    pickled (fd passing) or inherited by its workers."""

    def __init__(self, slot_bytes: int, dataset: Any = None) -> None:
        self.id = uuid.uuid4().hex
        self.owner = os.getpid()
        self.slot_bytes = -(-max(64, slot_bytes) // 64) * 64
        self.slots = max(MIN_SLOTS, min(MAX_SLOTS, RING_BYTES // self.slot_bytes))
        new_shared: Callable[[int], torch.UntypedStorage] = torch.UntypedStorage._new_shared  # unannotated in torch
        self.data = torch.empty(0, dtype=torch.uint8).set_(new_shared(self.slots * self.slot_bytes))
        self.table = _shared(torch.zeros((self.slots, S_AT + 1), dtype=torch.int64))
        self.header = _shared(torch.zeros(8, dtype=torch.int64))
        self.text = _shared(torch.zeros(2048, dtype=torch.uint8))
        self._local()
        self._dataset = weakref.ref(dataset) if dataset is not None else (lambda: None)
        _RINGS[self.id] = self

    def _local(self) -> None:
        """This process's numpy views and bookkeeping (not pickled)."""
        self.np_data = self.data.numpy()
        self.np_table = self.table.numpy()
        self.np_header = self.header.numpy()
        self._leases: weakref.WeakValueDictionary[tuple[int, int], np.ndarray] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._runs: dict[int, _RunView] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: self.__dict__[k] for k in ("id", "owner", "slot_bytes", "slots", "data", "table", "header", "text")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._dataset = lambda: None
        self._local()

    def slot(self, s: int) -> np.ndarray:
        return self.np_data[s * self.slot_bytes:(s + 1) * self.slot_bytes]

    # ------------------------------------------------------------------ the training process

    def receive(self, handle: Handle) -> torch.Tensor:
        with self._lock:
            view = self._runs.get(handle.run)
            if view is None:
                view = self._runs[handle.run] = _RunView(self, handle.run)
                while len(self._runs) > 4:  # a handle of a dropped run may still come: keep a few
                    del self._runs[next(iter(self._runs))]
            slot, seq, _k = view.bind(handle)
            if slot < 0:  # a handle of a run its DataLoader iterator dropped: discarded by the DataLoader
                return torch.empty(0)
            lease = self._leases.get((slot, seq))
            if lease is None:
                lease = np.frombuffer(self.slot(slot).data, dtype=np.uint8)  # its base, a memoryview, is no array
                self._leases[(slot, seq)] = lease
                self.np_table[slot, TAKEN] = seq
                weakref.finalize(lease, self._release, slot, seq)
        rows = int(self.np_table[slot, ROWS])  # the batch bound may be another than the handle's (in_order=False)
        if handle.part == "x":
            shape, offset = (rows, *handle.shape[1:]), 0
        elif handle.part == "y":
            shape, offset = (rows,), int(self.np_table[slot, Y_AT])
        else:  # "s": each sample's own shape
            shape, offset = (rows, *handle.shape[1:]), int(self.np_table[slot, S_AT])
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(handle.dtype).itemsize
        return torch.from_numpy(lease[offset:offset + size].view(handle.dtype).reshape(shape))

    def _release(self, slot: int, seq: int) -> None:
        if self.np_table[slot, FILL] == seq:
            self.np_table[slot, RELEASED] = seq

    def error(self, run: int) -> str | None:
        if int(self.np_header[H_ERROR_RUN]) != run:
            return None
        return bytes(self.text.numpy()[:int(self.np_header[H_ERROR_LEN])]).decode(errors="replace")

    # ------------------------------------------------------------------ workers

    def announce(self, run: int, epoch: int, start: int, end: int) -> None:
        h = self.np_header
        h[H_PID], h[H_EPOCH], h[H_START], h[H_END] = os.getpid(), epoch, start, end
        h[H_RUN] = run  # last: a worker that sees the run sees the rest

    def fail(self, run: int, message: str) -> None:
        raw = message.encode()[:len(self.text)]
        self.text.numpy()[:len(raw)] = np.frombuffer(raw, np.uint8)
        self.np_header[H_ERROR_LEN] = len(raw)
        self.np_header[H_ERROR_RUN] = run


class _RunView:
    """The training process's view of one run: which batch each handle stands for. With
    ``DataLoader(in_order=True)`` (the default) a handle stands for its own batch; with
    ``in_order=False`` the DataLoader yields handles as they arrive, so each stands for the
    next batch of the run, and the order is the run's whatever the workers' timing."""

    def __init__(self, ring: Ring, run: int) -> None:
        self.ring, self.run = ring, run
        self.in_order = _loader_in_order(ring._dataset())
        self.next = int(ring.np_header[H_START]) if int(ring.np_header[H_RUN]) == run else 0
        self.bound: dict[int, int] = {}  # batch of a handle -> batch it stands for

    def bind(self, handle: Handle) -> tuple[int, int, int]:
        table = self.ring.np_table
        k = handle.batch
        if not self.in_order:
            if k not in self.bound:
                self.bound[k] = self.next
                self.next += 1
            k = self.bound[k]
        if k == handle.batch and handle.slot >= 0 and table[handle.slot, FILL] == handle.seq:
            return handle.slot, handle.seq, k
        hit = np.flatnonzero((table[:, RUN] == self.run) & (table[:, BATCH] == k) & (table[:, READY] == 1))
        if not len(hit):
            return -1, 0, k
        return int(hit[0]), int(table[hit[0], FILL]), k


def _loader_in_order(dataset: Any) -> bool:
    """Whether the DataLoader iterating ``dataset`` keeps its batches in order (its ``in_order``):
    found among the frames of this process's threads (the training thread is inside it while it
    waits for a batch). True when it cannot be found (the default)."""
    if dataset is None:
        return True
    frames: list[Any] = list(sys._current_frames().values())
    f: Any = None
    obj: Any = None
    try:  # frames refer to their callers: none may stay referenced from here (a cycle keeps the loader alive)
        while frames:
            f = frames.pop()
            while f is not None:
                obj = f.f_locals.get("self") if f.f_code.co_name == "_next_data" else None
                if type(obj).__name__ == "_MultiProcessingDataLoaderIter" and getattr(obj, "_dataset", None) is dataset:
                    return bool(getattr(obj, "_in_order", True))
                f = f.f_back
        return True
    finally:
        del frames, f, obj


# ---------------------------------------------------------------------- worker side
