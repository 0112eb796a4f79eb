"""Issue #30: one order for any number of ranks and DataLoader workers, from row counts alone
(pure functions, fast). In the spirit of Mosaic Streaming's partition tests: for sample counts
that do not divide, every global batch holds the same samples on every world size, every rank
gets the same number of full batches, every sample comes once an epoch, and a resume at any
global batch reads none of the windows done before it."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from trainfeed.converters.errors import UsageError
from trainfeed.torch_handoff import worker_batches
from trainfeed.training.reading.engine import schedule
from trainfeed.training.reading.order import EpochOrder, default_lanes

#: Piece layouts that do not divide: uneven row groups, an empty piece, one piece only, files of one sample.
LAYOUTS = {"uneven": [7, 3, 11, 1, 0, 9, 8, 8, 2, 13] * 3, "one-piece": [1001], "row-groups": [91] * 11,
           "files": [1] * 37}


def order(rows, g=48, lanes=None, drop_last=False, pad=False, epoch=0, **kw) -> EpochOrder:
    return EpochOrder(rows, global_batch=g, lanes=lanes or default_lanes(g), seed=5, epoch=epoch, shuffle=True,
                      shuffle_buffer=kw.pop("shuffle_buffer", 24), drop_last=drop_last, pad=pad, **kw)


def worlds(g: int) -> list[int]:
    return [w for w in range(1, 17) if g % w == 0]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("g,lanes", [(48, None), (48, 12), (32, None), (16, 16), (12, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_global_batch_holds_the_same_samples_on_every_world_size(layout, g, lanes, drop_last):
    rows = LAYOUTS[layout]
    samples = sum(rows)
    one = order(rows, g, lanes, drop_last)
    expected_batches = samples // g if drop_last else -(-samples // g)
    assert one.batches == expected_batches
    whole = [one.sample_positions(k) for k in range(one.batches)]
    delivered = np.concatenate(whole) if whole else np.empty(0, int)
    if drop_last:  # the short tail is dropped, nothing else
        assert len(delivered) == len(set(delivered.tolist())) == expected_batches * g
    else:  # every sample exactly once
        assert sorted(delivered.tolist()) == list(range(samples))
    for world in worlds(g):
        padded = order(rows, g, lanes, drop_last, pad=world > 1)
        for k in range(one.batches):
            parts = [padded.sample_positions(k, rank, world) for rank in range(world)]
            if world > 1 or drop_last or k < one.batches - 1:  # one rank alone gets a short last batch
                assert {len(p) for p in parts} == {g // world}  # every rank a full batch, every batch
            real = [p[:padded.real_rows(k, rank, world)] for rank, p in enumerate(parts)]
            assert sorted(np.concatenate(real).tolist()) == sorted(whole[k].tolist()), (world, k)
            if drop_last or k < one.batches - 1:
                assert all(len(r) == g // world for r in real)


@pytest.mark.parametrize("workers", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("start,end", [(0, 17), (5, 17), (16, 17), (17, 17), (0, 1)])
def test_workers_hand_over_the_rank_s_batches_in_order(workers, start, end):
    """A DataLoader asks its workers in turn; worker w hands over batches start+w, start+w+N, ...:
    together, the rank's batches from ``start`` on, once each, in order (0 workers: the training
    process reads them itself)."""
    n = max(1, workers)
    handed = [list(worker_batches(start, end, w, n)) for w in range(n)]
    in_turn = [k for round_ in itertools.zip_longest(*handed) for k in round_ if k is not None]
    assert in_turn == list(range(start, end))


@pytest.mark.parametrize("layout", ["uneven", "row-groups", "files"])
def test_a_resume_at_any_batch_continues_the_order_on_any_world_size(layout):
    rows = LAYOUTS[layout]
    g = 48
    for world in worlds(g):
        o = order(rows, g, pad=world > 1)
        for rank in range(world):
            full = [o.sample_positions(k, rank, world).tolist() for k in range(o.batches)]
            whole, _ = schedule(o, o.parts(rank, world), 0)
            for start in range(o.batches + 1):
                windows, pieces = schedule(o, o.parts(rank, world), start)
                needed = {int(p) for k in range(start, o.batches) for p in _pieces_of(o, k, rank, world)}
                assert needed <= set(pieces)  # what the rest needs is read
                done = {u.piece for s in whole if s.last < start for u in s.window.units}
                live = {u.piece for s in whole if s.last >= start for u in s.window.units}
                assert not (done - live) & set(pieces)  # and nothing of the windows done before it
                assert all(s.first >= start for s in windows)
            assert [len(b) for b in full][:-1] == [g // world] * (o.batches - 1)


def _pieces_of(o: EpochOrder, k: int, rank: int, world: int) -> set[int]:
    bounds = np.cumsum([0, *o.piece_rows])
    return {int(np.searchsorted(bounds, p, side="right")) - 1 for p in o.sample_positions(k, rank, world)}


@pytest.mark.parametrize("world", [2, 4, 8])
def test_ranks_that_divide_the_lanes_read_each_piece_once_but_where_lanes_split_one(world):
    """Pieces read per epoch: one rank reads each piece once; ``world`` ranks read each of their
    lanes' pieces, and a piece split between two ranks' lanes is read by both (at most world - 1)."""
    rows = [40] * 50  # 2,000 samples in 50 row groups
    g = 64
    one = order(rows, g, lanes=8, drop_last=True)
    _, alone = schedule(one, one.parts(0, 1), 0)
    assert sorted(alone) == sorted(set(alone))  # each piece once, boundary pieces included
    spread = [p for rank in range(world) for p in schedule(one, one.parts(rank, world), 0)[1]]
    assert set(spread) == set(alone)
    assert len(alone) <= len(spread) <= len(alone) + world - 1


def test_the_order_changes_with_the_epoch_and_the_seed_and_mixes_pieces():
    rows = [40] * 50
    a, b = order(rows, 32, epoch=0), order(rows, 32, epoch=1)
    first = [a.sample_positions(k).tolist() for k in range(a.batches)]
    assert first != [b.sample_positions(k).tolist() for k in range(b.batches)]
    assert first == [order(rows, 32, epoch=0).sample_positions(k).tolist() for k in range(a.batches)]
    # a full global batch draws from every lane: 8 lanes, so at least 8 pieces in each (the short
    # last one holds the epoch's last rows)
    assert min(len({p // 40 for p in batch}) for batch in first[:-1]) >= default_lanes(32)


def test_lanes_and_world_sizes_that_cannot_work_are_refused():
    with pytest.raises(UsageError, match=r"lanes \(5\) must divide the global batch size \(32\)"):
        order([10] * 4, 32, lanes=5)
    o = order([10] * 4, 32)
    with pytest.raises(UsageError, match=r"global batch size \(32\) must be divisible by the world size \(3\)"):
        o.parts(0, 3)
    with pytest.raises(UsageError, match=r"rank 2 is not a rank of a world of 2"):
        o.parts(2, 2)
    with pytest.raises(UsageError, match=r"rank -1 is not a rank"):
        o.parts(-1, 2)
    with pytest.raises(UsageError, match="global batch size must be a positive integer"):
        order([10], 0)
