"""One order per epoch, the same for any number of ranks and DataLoader workers.

An epoch is cut into *global batches* of ``G`` samples; global batch ``k`` holds the same
samples whatever the world size ``W`` (any ``W`` dividing ``G``) and whatever the workers.
The samples are dealt to ``L`` *lanes*, a number fixed by the store and ``G`` alone (Mosaic
Streaming's canonical nodes play this part):

- the store's pieces (row groups, HDF5 slices, files) in a seeded order, their rows
  concatenated, are cut into ``L`` contiguous segments of equal length (a piece may be split
  between two neighbouring lanes);
- each lane reads its segment in windows of whole pieces (a piece it shares with the next lane
  first, with its own first piece: both lanes then need it at the same time, and a rank that
  reads both reads it once), the rows of each window in a seeded permutation;
- global batch ``k`` is ``b = G / L`` rows of every lane, lane after lane.

Rank ``d`` of ``W`` takes positions ``[d*B, (d+1)*B)`` of that lane-major listing (``B = G / W``):
whole lanes when ``W`` divides ``L``, so that each rank reads only its own lanes' pieces (a
piece split between two ranks' lanes is read by both: at most ``W - 1`` per epoch). ``W``
decides which rank reads which lane, never which samples form batch ``k``.

Every rank gets the same number of batches: ``S // G`` with ``drop_last`` (the short tail, the
last rows of the epoch's order, is dropped), else ``ceil(S / G)``, where the last global batch
is short; ``pad`` fills it to ``G`` with the epoch's first samples again, so that every rank's
last batch is full (its real rows come first). A resume at global batch ``k`` reads no piece
whose rows all come before it.

Everything here is computed from row counts alone; nothing is read.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from trainfeed.converters.errors import UsageError

#: The default lane count's upper bound: lanes hold a window each, so a rank that reads all of
#: them (one process, or a resume on fewer ranks) holds this many windows at once. Eight covers
#: world sizes 1, 2, 4 and 8 with each rank reading only its own lanes.
MAX_DEFAULT_LANES = 8


def default_lanes(global_batch: int) -> int:
    """The largest divisor of ``global_batch`` up to ``MAX_DEFAULT_LANES`` (1 for a batch size
    that is no positive integer: ``check_batching`` refuses it)."""
    if not isinstance(global_batch, int) or global_batch < 1:
        return 1
    return max(n for n in range(1, min(MAX_DEFAULT_LANES, global_batch) + 1) if global_batch % n == 0)


@dataclass(frozen=True)
class Unit:
    """Rows ``lo:hi`` of piece ``piece`` (an index into the store's pieces)."""

    piece: int
    lo: int
    hi: int

    @property
    def rows(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class Window:
    """Units read together and shuffled together: its rows in ``permutation()`` order."""

    units: tuple[Unit, ...]
    seed: tuple[int, ...] | None  # None: no shuffle, the units' rows in order

    @property
    def rows(self) -> int:
        return sum(u.rows for u in self.units)

    @cached_property
    def starts(self) -> np.ndarray:
        """Position of each unit's first row in the window (length units + 1)."""
        return np.cumsum([0, *(u.rows for u in self.units)])

    @cached_property
    def permutation(self) -> np.ndarray:
        if self.seed is None:
            return np.arange(self.rows)
        return np.random.default_rng(self.seed).permutation(self.rows)

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For window rows in epoch order: the unit each comes from and its row in that piece."""
        r = self.permutation[rows]
        unit = np.searchsorted(self.starts, r, side="right") - 1
        lo = np.array([u.lo for u in self.units], dtype=np.int64)
        return unit, lo[unit] + r - self.starts[unit]


@dataclass(frozen=True)
class Lane:
    """One lane's rows for the epoch: its windows in reading order."""

    windows: tuple[Window, ...]

    @cached_property
    def starts(self) -> np.ndarray:
        """Lane row where each window begins (length windows + 1)."""
        return np.cumsum([0, *(w.rows for w in self.windows)])

    def window_of(self, row: int) -> int:
        return int(np.searchsorted(self.starts, row, side="right")) - 1


@dataclass(frozen=True)
class Part:
    """Rows ``lo:hi`` of each batch's ``b`` rows from lane ``lane``: what one rank takes of it."""

    lane: int
    lo: int
    hi: int


class EpochOrder:
    """The order of one epoch of a store (see the module's docstring): ``batches`` global
    batches of ``global_batch`` samples, dealt from ``lanes`` lanes."""

    def __init__(self, piece_rows: Sequence[int], *, global_batch: int, lanes: int, seed: int, epoch: int,
                 shuffle: bool, shuffle_buffer: int, drop_last: bool, pad: bool = False) -> None:
        check_batching(global_batch, lanes)
        self.pad = pad and not drop_last
        self.piece_rows = [int(n) for n in piece_rows]
        self.global_batch, self.lanes = global_batch, lanes
        self.seed, self.epoch, self.shuffle, self.drop_last = seed, epoch, shuffle, drop_last
        self.samples = sum(self.piece_rows)
        self.per_lane = global_batch // lanes  # b: rows of each lane in every global batch
        full, rest = divmod(self.samples, global_batch)
        self.batches = full + (1 if rest and not drop_last else 0)
        #: real rows in the last global batch (global_batch when it is full)
        self.last_rows = rest if rest and not drop_last else global_batch
        self.window_rows = max(self.per_lane, -(-max(1, shuffle_buffer) // lanes))
        order = np.arange(len(self.piece_rows), dtype=np.int64)
        if shuffle:
            np.random.default_rng((seed, epoch)).shuffle(order)
        self.order = order[np.asarray(self.piece_rows, dtype=np.int64)[order] > 0] if len(order) else order
        self._starts = np.cumsum([0, *(self.piece_rows[i] for i in self.order)]).astype(np.int64)

    # ------------------------------------------------------------------ lanes

    def _units(self, first: int, end: int) -> list[Unit]:
        """The units holding positions ``first:end`` of the epoch's row sequence (no wrap)."""
        units: list[Unit] = []
        at = first
        while at < end:
            pos = int(np.searchsorted(self._starts, at, side="right")) - 1
            piece, base = int(self.order[pos]), int(self._starts[pos])
            stop = min(end, int(self._starts[pos + 1]))
            units.append(Unit(piece, at - base, stop - base))
            at = stop
        return units

    def _wrapped(self, first: int, count: int) -> list[Unit]:
        """Units of ``count`` positions from ``first`` on, wrapping to the epoch's first rows."""
        units: list[Unit] = []
        while count > 0:
            first %= self.samples
            take = min(count, self.samples - first)
            units += self._units(first, first + take)
            first, count = first + take, count - take
        return units

    def lane(self, c: int) -> Lane:
        """Lane ``c``'s windows: its body (the full batches), its two end units first, in windows
        of at least ``window_rows`` rows, then (without ``drop_last``) its share of the short last
        batch, in order: with ``pad``, positions past the epoch's samples repeat its first ones."""
        full = self.batches if self.last_rows == self.global_batch else self.batches - 1
        body = full * self.per_lane
        units = self._units(c * body, (c + 1) * body)
        windows: list[Window] = []
        group: list[Unit] = []
        last = units[-1] if units else None
        if len(units) > 2 and c < self.lanes - 1 and last is not None and last.hi < self.piece_rows[last.piece]:
            # a piece split with the next lane: read with this lane's first piece, when the next
            # lane reads its part (its first), so that a rank reading both lanes reads it once
            group, units = [units[0], last], units[1:-1]
            if sum(u.rows for u in group) >= self.window_rows:
                windows.append(self._window(c, 0, group))
                group = []
        for unit in units:
            group.append(unit)
            if sum(u.rows for u in group) >= self.window_rows:
                windows.append(self._window(c, len(windows), group))
                group = []
        if group:
            windows.append(self._window(c, len(windows), group))
        if full < self.batches:  # the short last batch: positions c*b .. of its G
            count = self.per_lane if self.pad else min(self.per_lane, max(0, self.last_rows - c * self.per_lane))
            if count:
                tail = full * self.global_batch + c * self.per_lane
                windows.append(Window(tuple(self._wrapped(tail, count)), None))
        return Lane(tuple(windows))

    def _window(self, lane: int, index: int, units: list[Unit]) -> Window:
        return Window(tuple(units), (self.seed, self.epoch, 2, lane, index) if self.shuffle else None)

    @cached_property
    def all_lanes(self) -> tuple[Lane, ...]:
        return tuple(self.lane(c) for c in range(self.lanes))

    # ------------------------------------------------------------------ ranks

    def parts(self, rank: int, world: int) -> list[Part]:
        """What rank ``rank`` of ``world`` takes of each global batch, lane by lane."""
        check_world(self.global_batch, rank, world)
        per_rank = self.global_batch // world
        first, end = rank * per_rank, (rank + 1) * per_rank
        b = self.per_lane
        return [Part(c, max(first, c * b) - c * b, min(end, (c + 1) * b) - c * b)
                for c in range(first // b, -(-end // b))]

    def real_rows(self, k: int, rank: int, world: int) -> int:
        """How many of rank ``rank``'s rows of batch ``k`` are samples of the epoch (the rest, at
        the end of its last batch with ``pad``, repeat the epoch's first samples)."""
        per_rank = self.global_batch // world
        if k < self.batches - 1 or self.last_rows == self.global_batch:
            return per_rank
        return int(min(per_rank, max(0, self.last_rows - rank * per_rank)))

    def rows_of(self, k: int, part: Part, rank: int, world: int) -> np.ndarray:
        """The lane rows rank ``rank`` takes from ``part``'s lane for batch ``k`` (without ``pad``,
        the last batch's padding positions are left out)."""
        first = k * self.per_lane
        hi = part.hi
        if not self.pad and k == self.batches - 1 and self.last_rows < self.global_batch:
            hi = min(hi, max(part.lo, self.last_rows - part.lane * self.per_lane))
        return np.arange(first + part.lo, first + hi)

    def sample_positions(self, k: int, rank: int = 0, world: int = 1) -> np.ndarray:
        """Rank ``rank``'s samples of global batch ``k``, each as its position in the store
        (piece offsets in store order + row), real rows first: for checks and tests; the read
        engine reads pieces, not positions."""
        offsets = np.cumsum([0, *self.piece_rows])
        out = []
        for part in self.parts(rank, world):
            lane = self.all_lanes[part.lane]
            rows = self.rows_of(k, part, rank, world)
            if not len(rows):
                continue
            for w in range(lane.window_of(int(rows[0])), lane.window_of(int(rows[-1])) + 1):
                mine = rows[(rows >= lane.starts[w]) & (rows < lane.starts[w + 1])]
                window = lane.windows[w]
                unit, row = window.locate(mine - lane.starts[w])
                by_unit = np.argsort(unit, kind="stable")  # as the engine gathers them
                pieces = np.array([u.piece for u in window.units], dtype=np.int64)[unit[by_unit]]
                out.append(offsets[pieces] + row[by_unit])
        return np.concatenate(out) if out else np.empty(0, np.int64)


def check_batching(global_batch: int, lanes: int) -> None:
    if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
        raise UsageError(f"the global batch size must be a positive integer, not {global_batch!r}")
    if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
        raise UsageError(f"lanes must be a positive integer, not {lanes!r}")
    if global_batch % lanes:
        raise UsageError(f"lanes ({lanes}) must divide the global batch size ({global_batch}): each global batch "
                         "takes the same number of samples from every lane")


def check_world(global_batch: int, rank: int, world: int) -> None:
    """A rank of a world that can share ``global_batch`` evenly."""
    for name, value in (("rank", rank), ("world size", world)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise UsageError(f"the {name} must be an integer, not {value!r}")
    if world < 1:
        raise UsageError(f"the world size must be at least 1, not {world}")
    if not 0 <= rank < world:
        raise UsageError(f"rank {rank} is not a rank of a world of {world} (0 to {world - 1})")
    if global_batch % world:
        raise UsageError(f"the global batch size ({global_batch}) must be divisible by the world size ({world}): "
                         "every rank takes an equal part of each global batch")
