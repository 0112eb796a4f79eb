"""The read engine, the same for every format: pieces -> this shard's pieces -> seeded epoch
plan -> read-ahead in worker threads -> batches.

The plan is computed from the pieces' row counts alone, before anything is read: the shard's
pieces in a seeded order, grouped into shuffle windows of at least ``shuffle_buffer`` rows,
and a seeded permutation of each window's rows. The epoch is that sequence of rows cut into
batches, so batch k's rows are known without reading what comes before it: a resume starts
reading at batch k's window (``start_batch``).

Batches are gathered, not stacked: a piece is read into arrays once (for Parquet, a view of
Arrow's buffer), and ``np.take`` copies each sample once, straight into a preallocated batch.
Within a batch, rows are grouped by piece (one ``take`` per piece); which rows form a batch is
what the window permutation decides.
"""
from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.options import Columns
from trainfeed.converters.sources.samples import ordered_map


@dataclass(frozen=True)
class EpochPlan:
    """One epoch of one shard: ``order`` (piece indices in reading order), shuffle windows
    (``window_ends[w]``: the position in ``order`` after window w's last piece; ``window_rows``:
    rows before each window, length windows + 1) and the batch cut."""

    order: np.ndarray
    window_ends: np.ndarray
    window_rows: np.ndarray
    batch_size: int
    drop_last: bool
    shuffle: bool
    seed: tuple

    @property
    def rows(self) -> int:
        return int(self.window_rows[-1])

    @property
    def batches(self) -> int:
        full, rest = divmod(self.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def window_start(self, w: int) -> int:
        """Position in ``order`` of window w's first piece."""
        return 0 if w == 0 else int(self.window_ends[w - 1])

    def window_of_row(self, row: int) -> int:
        return int(np.searchsorted(self.window_rows, row, side="right")) - 1

    def permutation(self, w: int) -> np.ndarray:
        """Window w's rows in epoch order (indices into the window's concatenated rows)."""
        n = int(self.window_rows[w + 1] - self.window_rows[w])
        return np.random.default_rng((*self.seed, w)).permutation(n) if self.shuffle else np.arange(n)


def plan_epoch(piece_rows: Sequence[int], shard_pieces: Sequence[int], *, batch_size: int, shuffle: bool,
               seed: int, epoch: int, shuffle_buffer: int, drop_last: bool) -> EpochPlan:
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1, not {batch_size}")
    order = np.array(shard_pieces, dtype=np.int64)
    if shuffle:
        np.random.default_rng((seed, epoch)).shuffle(order)
    # Without shuffling a window is one piece (order is unchanged; memory stays one piece).
    limit = max(batch_size, shuffle_buffer) if shuffle else 1
    ends, rows_before, held = [], [0], 0
    for pos, i in enumerate(order):
        held += int(piece_rows[i])
        if held >= limit or pos == len(order) - 1:
            ends.append(pos + 1)
            rows_before.append(rows_before[-1] + held)
            held = 0
    return EpochPlan(order, np.array(ends, np.int64), np.array(rows_before, np.int64), batch_size, drop_last,
                     shuffle, (seed, epoch, 1))


class Recycler:
    """``empty(shape, dtype)`` that hands out memory again once nothing refers to what it gave.

    Fresh memory from the OS is page-faulted and zeroed on first touch, which costs more than
    the copy into it (glibc returns large blocks to the OS on free). An array given out is a
    view of a pooled block through a memoryview: numpy's views of it, and views of those,
    all keep that array alive (a view's base stops at an array whose base is not an array),
    so the block returns to the pool only when no view of it is left."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self.free: dict[tuple, list[np.ndarray]] = {}
        self.lock = threading.Lock()
        # a thread of the parent may hold the lock when a DataLoader forks its workers
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self.lock = threading.Lock()

    def empty(self, shape: tuple, dtype) -> np.ndarray:
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

    def _give_back(self, key: tuple, block: np.ndarray) -> None:
        with self.lock:
            blocks = self.free.setdefault(key, [])
            if len(blocks) < self.keep:
                blocks.append(block)


#: One pool for the process: consecutive epochs and readers reuse the same blocks.
RECYCLER = Recycler()


class _Window:
    """A loaded window: its pieces' columns, and where each of its rows comes from."""

    def __init__(self, columns: list[Columns], rows: list[int], perm: np.ndarray):
        self.columns = columns
        self.ids = [np.array(c.ids, dtype=object) for c in columns]
        starts = np.cumsum([0, *rows])
        self.piece = np.searchsorted(starts, perm, side="right") - 1  # local piece of each row, epoch order
        self.row = perm - starts[self.piece]


def gather(windows: list[tuple[_Window, int, int]], n: int, empty=np.empty) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Rows [lo, hi) of each (window, lo, hi), gathered into one new batch of ``n`` rows."""
    first = windows[0][0].columns[0].x
    x = empty((n, *first.shape[1:]), first.dtype)
    y = np.empty(n, dtype=np.int64)
    ids: list[str] = []
    at = 0
    for win, lo, hi in windows:
        piece, row = win.piece[lo:hi], win.row[lo:hi]
        by_piece = np.argsort(piece, kind="stable")
        piece, row = piece[by_piece], row[by_piece]
        cuts = np.flatnonzero(np.diff(piece)) + 1
        for rows_p, p in zip(np.split(row, cuts), piece[np.r_[0, cuts]]):
            cols, end = win.columns[p], at + len(rows_p)
            np.take(cols.x, rows_p, axis=0, out=x[at:end], mode="clip")  # clip: no buffered copy; rows are valid
            np.take(cols.labels, rows_p, out=y[at:end], mode="clip")
            ids += win.ids[p][rows_p].tolist()
            at = end
    return x, y, ids


def run_epoch(plan: EpochPlan, piece_rows: Sequence[int], read: Callable[[int, dict, Callable], Columns],
              describe: Callable[[int], str], *, workers: int, start_batch: int = 0,
              upcoming: Callable[[int], None] | None = None, ahead: int = 0
              ) -> Iterator[tuple[np.ndarray, np.ndarray, list[str]]]:
    """Batches ``start_batch``.. of ``plan`` as (x, y, ids). ``read(piece_index, handles, empty)``
    reads one piece (``handles``: a dict the reading thread keeps its open files in; ``empty``:
    where to allocate arrays it fills itself); ``describe(piece_index)`` names its file in errors.
    Reads start at the window holding batch ``start_batch``'s first row. ``upcoming(piece_index)``
    is told of each piece ``ahead`` pieces before it is read (a remote reader starts fetching it)."""
    if start_batch < 0:
        raise UsageError(f"start_batch must be 0 or more, not {start_batch}")
    if start_batch >= plan.batches:
        return
    local = threading.local()
    recycler = RECYCLER

    told = [0]  # how many pieces of ``todo`` ``upcoming`` was told of
    told_lock = threading.Lock()

    def tell(upto: int) -> None:
        assert upcoming is not None  # only called when there is someone to tell
        with told_lock:  # told before any thread reads them: no piece is requested twice
            first, told[0] = told[0], max(told[0], min(len(todo), upto))
            for pos in range(first, told[0]):
                upcoming(int(todo[pos]))

    def read_checked(pos: int) -> Columns:
        i = int(todo[pos])
        if upcoming is not None:
            tell(pos + 1 + ahead)
        cols = read(i, local.__dict__.setdefault("handles", {}), recycler.empty)
        listed = piece_rows[i]
        if not len(cols.ids) == len(cols.labels) == len(cols.x) == listed:
            raise TrainfeedError(f"{describe(int(i))}: read {len(cols.ids)} ids, {len(cols.labels)} labels and "
                                 f"{len(cols.x)} samples where {listed} were listed: the file is damaged or changed "
                                 "while training")
        return cols

    first_window = plan.window_of_row(start_batch * plan.batch_size)
    last_window = plan.window_of_row(min(plan.rows, plan.batches * plan.batch_size) - 1)  # drop_last: tail unread
    todo = plan.order[plan.window_start(first_window):plan.window_ends[last_window]]
    results = iter(ordered_map(read_checked, range(len(todo)), max(1, workers), window_per_worker=2))
    loaded: dict[int, _Window] = {}

    def load(w: int) -> _Window:
        columns = []
        for i in plan.order[plan.window_start(w):plan.window_ends[w]]:
            result = next(results)
            if isinstance(result, TrainfeedError):
                raise result
            if isinstance(result, Exception):
                raise TrainfeedError(f"{describe(int(i))}: cannot read: {result}") from result
            columns.append(result)
        rows = [piece_rows[i] for i in plan.order[plan.window_start(w):plan.window_ends[w]]]
        return _Window(columns, rows, plan.permutation(w))

    for k in range(start_batch, plan.batches):
        lo, hi = k * plan.batch_size, min(plan.rows, (k + 1) * plan.batch_size)
        parts = []
        for w in range(plan.window_of_row(lo), plan.window_of_row(hi - 1) + 1):
            if w not in loaded:
                loaded[w] = load(w)
            base = int(plan.window_rows[w])
            parts.append((loaded[w], max(lo, base) - base, min(hi, int(plan.window_rows[w + 1])) - base))
        for w in [w for w in loaded if plan.window_rows[w + 1] <= hi]:
            del loaded[w]  # fully delivered once this batch is built (``parts`` holds it until then)
        yield gather(parts, hi - lo, recycler.empty)
