"""The read engine, the same for every format: one epoch's order (``order.py``) -> the windows
this rank reads -> read-ahead in worker threads -> batches.

A rank reads the lanes its part of each global batch comes from (``EpochOrder.parts``). Their
windows are scheduled by the first batch that needs each; a piece that windows need at the
same time, or one right after the other, is read once (``schedule``).
Reads run ahead in ``workers`` threads, in schedule order; a window is dropped once its last
row is delivered. Because batch k's rows are known without reading, a resume starts with the
windows that hold batch k and reads nothing before them.

Batches are gathered, not stacked: a piece is read into arrays once (for Parquet, a view of
Arrow's buffer), and ``np.take`` copies each sample once, straight into the batch's array
(recycled memory, or memory the caller hands in with ``into``). Within a lane's share of a
batch, rows are grouped by the unit they come from (one ``take`` each); which rows form the
batch is what the order decides.
"""
from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.interface import Columns, Empty, OpenFiles
from trainfeed.converters.sources.samples import ordered_map
from trainfeed.training.reading.order import EpochOrder, Part, Window


class Recycler:
    """``empty(shape, dtype)`` that hands out memory again once nothing refers to what it gave.

    Fresh memory from the OS is page-faulted and zeroed on first touch, which costs more than
    the copy into it (glibc returns large blocks to the OS on free). An array given out is a
    view of a pooled block through a memoryview: numpy's views of it, and views of those,
    all keep that array alive (a view's base stops at an array whose base is not an array),
    so the block returns to the pool only when no view of it is left."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.free: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
        self.lock = threading.Lock()
        # a thread of the parent may hold the lock when a DataLoader forks its workers
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self.lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
        dtype = np.dtype(dtype)
        key = (tuple(shape), dtype.str)
        with self.lock:
            blocks = self.free.get(key)
            block = blocks.pop() if blocks else None
        if block is None:
            block = np.empty(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, np.uint8)
        flat = np.frombuffer(block.data, dtype=dtype)  # its base: the memoryview (.data), not an array
        weakref.finalize(flat, self._give_back, key, block)
        return flat.reshape(shape)

    def _give_back(self, key: tuple[tuple[int, ...], str], block: np.ndarray) -> None:
        with self.lock:
            blocks = self.free.setdefault(key, [])
            if len(blocks) < self.keep:
                blocks.append(block)


#: One pool for the process: consecutive epochs and readers reuse the same blocks.
RECYCLER = Recycler()


@dataclass
class _Scheduled:
    """A window this rank reads: its lane, index, the batches that need it, and the read (an
    index into the schedule's piece reads) each of its units takes its rows from."""

    lane: int
    index: int
    window: Window
    first: int
    last: int
    reads: list[int]


def schedule(order: EpochOrder, parts: list[Part], start_batch: int) -> tuple[list[_Scheduled], list[int]]:
    """The windows rank ``parts`` needs from batch ``start_batch`` on, in the order they are
    first needed (batch, lane, window), and the pieces to read for them, in that order. A piece
    that a window used until this window's batch or the one before is not read again: its
    columns are kept until this window takes them (a piece split between two lanes, the end
    of the epoch's order that the short last batch takes)."""
    b, found = order.per_lane, []
    for part in parts:
        lane = order.all_lanes[part.lane]
        for w, window in enumerate(lane.windows):
            lo, hi = int(lane.starts[w]), int(lane.starts[w + 1])
            first = max(start_batch, (lo - part.hi) // b + 1)
            last = min(order.batches - 1, (hi - part.lo - 1) // b)
            if first <= last:
                found.append(_Scheduled(part.lane, w, window, first, last, []))
    found.sort(key=lambda s: (s.first, s.lane, s.index))
    pieces: list[int] = []
    latest: dict[int, tuple[int, int]] = {}  # piece -> (its latest read, the last batch a window used it)
    for s in found:
        for unit in s.window.units:
            read, until = latest.get(unit.piece, (-1, -2))
            if until < s.first - 1:  # not read for a window of this batch or the one before: read it
                read = len(pieces)
                pieces.append(unit.piece)
            latest[unit.piece] = (read, max(until, s.last))
            s.reads.append(read)
    return found, pieces


def gather(order: EpochOrder, parts: list[Part], k: int, rank: int, world: int,
           loaded: dict[tuple[int, int], list[Columns]], empty: Empty = np.empty
           ) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray | None]:
    """Batch ``k`` of this rank from its loaded windows ((lane, window) -> each unit's columns):
    part by part, window by window, rows grouped by unit; with the samples' own shapes when
    they were fitted. A ragged field not fitted gathers into an object array (each sample in
    its own shape)."""
    takes: list[tuple[Columns, np.ndarray]] = []
    for part in parts:
        lane = order.all_lanes[part.lane]
        rows = order.rows_of(k, part, rank, world)
        if not len(rows):
            continue
        for w in range(lane.window_of(int(rows[0])), lane.window_of(int(rows[-1])) + 1):
            mine = rows[(rows >= lane.starts[w]) & (rows < lane.starts[w + 1])]
            unit, piece_rows = lane.windows[w].locate(mine - lane.starts[w])
            by_unit = np.argsort(unit, kind="stable")
            unit, piece_rows = unit[by_unit], piece_rows[by_unit]
            cuts = np.flatnonzero(np.diff(unit)) + 1
            columns = loaded[(part.lane, w)]
            for u, picked in zip(unit[np.r_[0, cuts]], np.split(piece_rows, cuts)):
                takes.append((columns[int(u)], picked))
    n = sum(len(picked) for _, picked in takes)
    first = takes[0][0]
    x = (np.empty if first.x.dtype == object else empty)((n, *first.x.shape[1:]), first.x.dtype)
    y = np.empty(n, dtype=np.int64)
    shapes = None if first.shapes is None else np.empty((n, first.shapes.shape[1]), np.int64)
    ids: list[str] = []
    at = 0
    for cols, picked in takes:
        end = at + len(picked)
        np.take(cols.x, picked, axis=0, out=x[at:end], mode="clip")  # clip: no buffered copy; rows are valid
        np.take(cols.labels, picked, out=y[at:end], mode="clip")
        if shapes is not None and cols.shapes is not None:  # every piece of a fitted store has them
            np.take(cols.shapes, picked, axis=0, out=shapes[at:end], mode="clip")
        ids += [cols.ids[int(i)] for i in picked]
        at = end
    return x, y, ids, shapes


def run_epoch(order: EpochOrder, rank: int, world: int, read: Callable[[int, OpenFiles, Empty], Columns],
              describe: Callable[[int], str], *, workers: int, start_batch: int = 0,
              upcoming: Callable[[int], None] | None = None, ahead: int = 0,
              empty: Callable[..., np.ndarray] | None = None
              ) -> Iterator[tuple[np.ndarray, np.ndarray, list[str], np.ndarray | None]]:
    """Rank ``rank`` of ``world``'s batches ``start_batch``.. of ``order`` as (x, y, ids, shapes).
    ``read(piece_index, handles, empty)`` reads one piece (``handles``: the files the reading
    thread keeps open; ``empty``: where to allocate arrays it fills itself);
    ``describe(piece_index)`` names its file in errors. ``upcoming(piece_index)`` is told of each
    piece ``ahead`` reads before it is read (a remote reader starts fetching it). ``empty``: where
    each batch's x is allocated (default: recycled memory)."""
    if not isinstance(start_batch, int) or isinstance(start_batch, bool) or start_batch < 0:
        raise UsageError(f"start_batch must be an integer, 0 or more, not {start_batch!r}")
    if start_batch >= order.batches:
        return
    parts = order.parts(rank, world)
    windows, pieces = schedule(order, parts, start_batch)
    local = threading.local()
    recycler = RECYCLER
    told = [0]  # how many of ``pieces`` ``upcoming`` was told of
    told_lock = threading.Lock()

    def tell(upto: int) -> None:
        assert upcoming is not None  # only called when there is someone to tell
        with told_lock:  # told before any thread reads them: no piece is requested twice
            first, told[0] = told[0], max(told[0], min(len(pieces), upto))
            for pos in range(first, told[0]):
                upcoming(pieces[pos])

    def read_checked(pos: int) -> Columns:
        i = pieces[pos]
        if upcoming is not None:
            tell(pos + 1 + ahead)
        cols = read(i, local.__dict__.setdefault("handles", OpenFiles()), recycler.empty)
        listed = order.piece_rows[i]
        if not len(cols.ids) == len(cols.labels) == len(cols.x) == listed:
            raise TrainfeedError(f"{describe(i)}: read {len(cols.ids)} ids, {len(cols.labels)} labels and "
                                 f"{len(cols.x)} samples where {listed} were listed: the file is damaged or changed "
                                 "while training")
        return cols

    results = iter(ordered_map(read_checked, range(len(pieces)), max(1, workers), window_per_worker=2))
    got: dict[int, Columns] = {}  # reads taken from ``results`` that a window still waits for
    waiting = [0] * len(pieces)
    for s in windows:
        for r in s.reads:
            waiting[r] += 1
    taken = [0]

    def take(r: int) -> Columns:
        while taken[0] <= r:
            result = next(results)
            if isinstance(result, TrainfeedError):
                raise result
            if isinstance(result, Exception):
                raise TrainfeedError(f"{describe(pieces[taken[0]])}: cannot read: {result}") from result
            got[taken[0]] = result
            taken[0] += 1
        cols = got[r]
        waiting[r] -= 1
        if not waiting[r]:
            del got[r]
        return cols

    loaded: dict[tuple[int, int], list[Columns]] = {}
    ending: dict[int, list[tuple[int, int]]] = {}  # batch -> the windows it delivers the last rows of
    for s in windows:
        ending.setdefault(s.last, []).append((s.lane, s.index))
    pending = iter(windows)
    next_window = next(pending, None)
    for k in range(start_batch, order.batches):
        while next_window is not None and next_window.first == k:  # in schedule order
            loaded[(next_window.lane, next_window.index)] = [take(r) for r in next_window.reads]
            next_window = next(pending, None)
        batch = gather(order, parts, k, rank, world, loaded, empty or recycler.empty)
        for key in ending.pop(k, []):
            loaded.pop(key, None)  # fully delivered
        yield batch
