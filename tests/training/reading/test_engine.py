"""The read engine: an epoch resumed at batch k is the same epoch from batch k on, bit for bit,
and reads none of the pieces whose rows all come before batch k; damaged reads stop the epoch."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.training.reading import engine
from trainfeed.training.reading.readers import EpochOptions, epoch_plan, iter_batches, open_store


def opened(learnable, fmt) -> OpenOptions:
    return OpenOptions(labels=str(learnable["root"] / "train" / "labels.csv") if fmt == "blob" else None)


def options(**kw) -> EpochOptions:
    return EpochOptions(**{"batch_size": 20, "shuffle_buffer": 50, "seed": 3, **kw})


def counting(store, monkeypatch) -> list[int]:
    """Record the index of every piece the format module is asked to read."""
    module, read = store.module, store.module.read_piece
    index = {id(p): i for i, p in enumerate(store.pieces)}
    reads: list[int] = []

    def read_piece(listing, piece, handles, empty=np.empty):
        reads.append(index[id(piece)])
        return read(listing, piece, handles, empty)

    monkeypatch.setattr(module, "read_piece", read_piece)
    return reads


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("shuffle,drop_last", [(True, False), (False, True)])
def test_resume_at_batch_k_is_the_same_epoch_without_reading_before(learnable, monkeypatch, fmt, shuffle, drop_last):
    store = open_store(str(learnable["stores"][fmt]), None, opened(learnable, fmt))
    opts = options(shuffle=shuffle, drop_last=drop_last, workers=2)
    whole = list(iter_batches(store, opts, epoch=2))
    plan = epoch_plan(store, opts, epoch=2)
    assert len(whole) == plan.batches
    assert sum(len(b.ids) for b in whole) == plan.rows - (plan.rows % 20 if drop_last else 0)
    for k in (1, len(whole) // 2, len(whole) - 1, len(whole)):
        reads = counting(store, monkeypatch)
        resumed = list(iter_batches(store, opts, epoch=2, start_batch=k))
        monkeypatch.undo()
        assert len(resumed) == len(whole) - k
        for a, b in zip(whole[k:], resumed):
            assert a.ids == b.ids and a.y.tobytes() == b.y.tobytes() and a.x.tobytes() == b.x.tobytes()
        if k == len(whole):
            assert reads == []
            continue
        first_row = k * 20
        w = plan.window_of_row(first_row)
        skipped = set(plan.order[:plan.window_start(w)].tolist())
        assert plan.window_start(w) > 0 or k < 3  # the test does skip pieces
        assert not skipped & set(reads)
        last = plan.window_of_row(min(plan.rows, plan.batches * 20) - 1)  # drop_last: the tail is never read
        assert sorted(reads) == sorted(plan.order[plan.window_start(w):plan.window_ends[last]].tolist())  # once each


def test_plan_windows_hold_the_shuffle_buffer_and_cover_the_shard_once():
    rows = [7, 3, 10, 1, 9, 4, 6]
    plan = engine.plan_epoch(rows, [0, 2, 3, 5, 6], batch_size=4, shuffle=True, seed=1, epoch=0,
                             shuffle_buffer=12, drop_last=False)
    assert sorted(plan.order.tolist()) == [0, 2, 3, 5, 6]
    assert plan.rows == 7 + 10 + 1 + 4 + 6 and plan.batches == 7
    for w in range(len(plan.window_ends)):
        held = [rows[i] for i in plan.order[plan.window_start(w):plan.window_ends[w]]]
        assert sum(held) == plan.window_rows[w + 1] - plan.window_rows[w]
        assert sum(held) >= 12 or w == len(plan.window_ends) - 1
        assert sorted(plan.permutation(w).tolist()) == list(range(sum(held)))
    same = engine.plan_epoch(rows, [0, 2, 3, 5, 6], batch_size=4, shuffle=True, seed=1, epoch=0,
                             shuffle_buffer=12, drop_last=False)
    assert same.order.tolist() == plan.order.tolist()
    assert same.permutation(0).tolist() == plan.permutation(0).tolist()


def test_batches_are_new_arrays_not_views_of_pieces(learnable):
    store = open_store(str(learnable["stores"]["parquet"]))
    opts = EpochOptions(batch_size=16, shuffle_buffer=64, drop_last=True)
    a, b = next(iter_batches(store, opts)), next(iter_batches(store, opts))
    assert a.x.flags.c_contiguous and a.x.flags.writeable and not np.shares_memory(a.x, b.x)
    kept = a.x[3]  # a view the caller keeps after dropping its batch
    expected = kept.copy()
    a.x[:2] = 0  # the caller owns its batch: writing to it changes nothing else
    assert b.x.any()
    del a
    for _ in iter_batches(store, opts):  # recycled memory is reused only once no view of it is left
        pass
    assert np.array_equal(kept, expected)


def test_recycler_gives_memory_back_only_when_no_view_is_left():
    import gc

    recycler = engine.Recycler()
    a = recycler.empty((4, 3), np.float32)
    view = a[1:3].T
    del a
    gc.collect()
    assert recycler.free == {}
    del view
    gc.collect()
    assert [len(blocks) for blocks in recycler.free.values()] == [1]
    assert recycler.empty((4, 3), np.float32).flags.writeable and recycler.free == {((4, 3), "<f4"): []}


def test_a_piece_that_delivers_fewer_rows_than_listed_stops_the_epoch(learnable, tmp_path):
    """The row-count guard, deterministically: a shard loses its last sample after the store
    was opened (a file changed while training)."""
    import shutil

    shutil.copytree(learnable["stores"]["hdf5"], tmp_path / "shards")
    store = open_store(str(tmp_path / "shards"))
    shard = tmp_path / "shards" / "shard-00000.h5"
    last = max(i for i, p in enumerate(store.pieces) if p[0] == str(shard))
    with h5py.File(shard, "r+") as h5:
        for name in ("id", "label", "volume"):
            h5[name].resize(h5[name].shape[0] - 1, axis=0)
    listed = store.piece_rows[last]
    with pytest.raises(TrainfeedError, match=rf"shard-00000\.h5: read {listed - 1} ids, {listed - 1} labels and "
                                             rf"{listed - 1} samples where {listed} were listed"):
        list(iter_batches(store, EpochOptions(batch_size=8, shuffle=False)))


def test_start_batch_must_not_be_negative(learnable):
    store = open_store(str(learnable["stores"]["hdf5"]))
    with pytest.raises(TrainfeedError, match="start_batch must be 0 or more"):
        list(iter_batches(store, EpochOptions(), start_batch=-1))
