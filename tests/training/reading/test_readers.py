"""Every reader yields every sample exactly once per epoch, with its own label and values,
across threads and ranks; a split across ranks that cannot work fails before training starts."""
from __future__ import annotations

import csv
import shutil
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.storage.pins import pin_files
from trainfeed.training.reading.readers import EpochOptions, batches_per_rank, iter_batches, open_store

FORMATS = ["parquet", "delta", "hdf5", "blob"]


def truth_of(learnable) -> dict[str, tuple[np.ndarray, int]]:
    root = learnable["root"] / "train"
    with open(root / "labels.csv") as fh:
        labels = {row["id"]: int(row["label"]) for row in csv.DictReader(fh)}
    return {sid: (np.load(root / f"{sid}.npy"), lab) for sid, lab in labels.items()}


def opened(learnable, fmt) -> OpenOptions:
    return OpenOptions(labels=str(learnable["root"] / "train" / "labels.csv") if fmt == "blob" else None)


def options(**kw) -> EpochOptions:
    return EpochOptions(batch_size=32, **kw)


READERS = [(fmt, "arrow") for fmt in FORMATS] + [
    pytest.param(fmt, pool, marks=pytest.mark.petastorm) for fmt, pool in
    (("parquet", "sharded"), ("delta", "sharded"), ("parquet", "process"))]


@pytest.mark.parametrize("fmt,pool", READERS)
@pytest.mark.parametrize("world,workers", [(1, 1), (1, 3), (2, 2), (3, 2)])
def test_exactly_once_with_own_label_and_values(learnable, fmt, pool, world, workers):
    truth = truth_of(learnable)
    store = open_store(str(learnable["stores"][fmt]), None, opened(learnable, fmt))
    assert store.fmt == fmt and store.samples == len(truth)
    seen: list[str] = []
    counts = set()
    for rank in range(world):
        opts = EpochOptions(batch_size=32 if pool == "arrow" else 30, workers=workers, rank=rank, world_size=world,
                            seed=5, pool=pool)
        rank_ids, batches = [], 0
        for batch in iter_batches(store, opts, epoch=1):
            assert batch.x.shape[1:] == (12, 12, 4, 2) and batch.x.dtype == np.float32
            for sid, label, x in zip(batch.ids, batch.y, batch.x):
                assert label == truth[sid][1] and np.array_equal(x, truth[sid][0])
            rank_ids += batch.ids[:len(batch.ids) - batch.padding]
            batches += 1
        if pool != "arrow":  # Petastorm's pools: whole row groups by rank
            assert len(rank_ids) == store.shard_rows(rank, world)
        counts.add(batches)
        seen += rank_ids
    assert sorted(seen) == sorted(truth)  # no loss, no duplication across ranks
    if pool == "arrow":
        assert len(counts) == 1  # the same number of batches on every rank


@pytest.mark.parametrize("fmt", FORMATS)
def test_shuffle_is_seeded_and_changes_per_epoch(learnable, fmt):
    store = open_store(str(learnable["stores"][fmt]), None, opened(learnable, fmt))
    order = lambda epoch, seed: [i for b in iter_batches(store, options(seed=seed), epoch) for i in b.ids]  # noqa: E731
    assert order(0, 1) == order(0, 1)  # deterministic: resume replays the same order
    assert order(0, 1) != order(1, 1)
    plain = [i for b in iter_batches(store, options(shuffle=False, lanes=1)) for i in b.ids]
    if fmt != "parquet" and fmt != "delta":  # one lane, unshuffled: the store's order
        assert plain == sorted(plain)


def test_splits_that_cannot_work_fail_clearly(learnable):
    store = open_store(str(learnable["stores"]["parquet"]), None, opened(learnable, "parquet"))
    assert batches_per_rank(store, options(world_size=2, drop_last=True)) == store.samples // 64
    assert batches_per_rank(store, options(world_size=2)) == -(-store.samples // 64)
    with pytest.raises(TrainfeedError, match="384 samples, fewer than one batch of 1000"):
        batches_per_rank(store, EpochOptions(batch_size=1000, drop_last=True))
    assert batches_per_rank(store, EpochOptions(batch_size=1000)) == 1  # a short batch, without drop_last


def test_delta_version_and_live_snapshot(tmp_path, learnable):
    """Training reads the table's live files only, and a fixed version on request."""
    from tests.conftest import run_cli
    from trainfeed.converters.cli import app

    src = learnable["root"] / "train"
    dst = tmp_path / "t.delta"
    assert run_cli(app, src, dst, "--to", "delta", "--row-group-size", "40KB", "--target-file-size", "100KB",
                   "--labels", src / "labels.csv", "--no-progress").exit_code == 0
    assert run_cli(app, learnable["root"] / "holdout", dst, "--to", "delta", "--overwrite", "--optimize",
                   "--labels", learnable["root"] / "holdout" / "labels.csv", "--no-progress").exit_code == 0
    latest = open_store(str(dst))
    v0 = open_store(str(dst), None, OpenOptions(version=0))
    assert latest.version >= 1 and v0.version == 0
    ids_latest = [i for b in iter_batches(latest, EpochOptions(batch_size=16)) for i in b.ids]
    ids_v0 = [i for b in iter_batches(v0, EpochOptions(batch_size=16)) for i in b.ids]
    assert len(ids_latest) == len(set(ids_latest)) == 128  # the holdout only: no replaced files
    assert len(ids_v0) == len(set(ids_v0)) == 384


@pytest.mark.tf
def test_tf_dataset_yields_the_same_samples(learnable):
    from trainfeed.training.loops.loop_tf import tf_dataset

    truth = truth_of(learnable)
    store = open_store(str(learnable["stores"]["hdf5"]))
    seen = {}
    for x, y in tf_dataset(store, EpochOptions(batch_size=50, shuffle=False)):
        for xi, yi in zip(x.numpy(), y.numpy()):
            seen[xi.tobytes()] = int(yi)
    assert {arr.tobytes(): lab for arr, lab in truth.values()} == seen


def test_missing_and_wrong_stores(tmp_path, learnable):
    with pytest.raises(TrainfeedError, match="store not found"):
        open_store(str(tmp_path / "nope.parquet"), "parquet")
    with pytest.raises(TrainfeedError, match="no field 'mask'"):
        open_store(str(learnable["stores"]["hdf5"]), None, OpenOptions(field="mask"))
    with pytest.raises(TrainfeedError, match="not a Delta table"):
        open_store(str(learnable["stores"]["hdf5"]), "delta")


def _drop_first_row(part) -> int:
    """Rewrite a Parquet part without its first row, keeping its row groups; the rows left in
    the first row group."""
    pf = pq.ParquetFile(part)
    groups = [pf.read_row_group(i) for i in range(pf.num_row_groups)]
    with pq.ParquetWriter(part, pf.schema_arrow) as writer:
        for i, group in enumerate(groups):
            writer.write_table(group.slice(1) if i == 0 else group, row_group_size=len(group))
    return len(groups[0]) - 1


@pytest.mark.parametrize("pool", ["arrow", *[pytest.param(p, marks=pytest.mark.petastorm)
                                             for p in ("sharded", "thread", "dummy")]])
def test_a_reader_that_delivers_fewer_rows_stops_the_epoch(learnable, tmp_path, pool):
    """The row-count guard, deterministically: a part file loses a row after the store was
    opened (a file changed while training; what Petastorm 0.13.1's thread pool race does to
    an epoch). The epoch must stop with a clear error, never train on a partial epoch."""
    shutil.copytree(learnable["stores"]["parquet"], tmp_path / "p")
    store = open_store(str(tmp_path / "p"))
    left = _drop_first_row(tmp_path / "p" / "part-00000.parquet")
    # a change the pins cannot see (same inode, size and time)
    store.listing = replace(store.listing, pins=pin_files(list(store.listing.pins)))
    expected = (rf"part-00000\.parquet: read {left} ids, {left} labels and {left} samples where {left + 1} were listed"
                if pool == "arrow" else rf"Petastorm's {pool} pool delivered \d+ of {store.samples} rows")  # the thread
    # pool's race may drop more: the count is not pinned, the stop is
    with pytest.raises(TrainfeedError, match=expected):
        for _ in iter_batches(store, EpochOptions(pool=pool, workers=2)):
            pass


def test_petastorm_pools_without_petastorm_name_the_extra(learnable, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "petastorm", None)  # what an environment without the extra sees
    store = open_store(str(learnable["stores"]["parquet"]))
    with pytest.raises(TrainfeedError, match=r"pip install 'trainfeed\[petastorm\]'"):
        next(iter_batches(store, EpochOptions(pool="sharded")))
    assert len(next(iter_batches(store, EpochOptions(pool="arrow"))).ids) == 32  # the default needs none of it
