"""What the DataLoader tests share: a small volume dataset, a store of it on a backend, a
DataLoader that fails a hang instead of the run, and samples compared bit for bit."""
from __future__ import annotations

import faulthandler
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

import trainfeed
from tests.test_object_storage import get_backend
from tests.training.conftest import N

REPO = Path(__file__).resolve().parents[3]
TIMEOUT = 300  # seconds a DataLoader may wait for a batch (spawn: each worker imports torch first); a hang fails


def make_store(request, tmp_path, source, backend: str, fmt: str = "parquet", **open_kw):
    """The source converted to ``fmt`` on ``backend``, opened: (store, storage options, url)."""
    root, _ = source
    name = {"parquet": "s.parquet", "delta": "s.delta", "hdf5": "s.h5", "hdf5-shards": "shards"}[fmt]
    if backend == "local":
        url, options = str(tmp_path / name), {}
    else:
        b = get_backend(request, backend)
        url, options = b.url(b.new_bucket("dl"), name), dict(b.options)
    trainfeed.convert(str(root), url, format=fmt.split("-")[0], labels=str(root / "labels.csv"),
                      storage_options=options, row_group_size=8 * 128, target_file_size=24 * 128,
                      hdf5_chunk_size=8 * 128)
    store = trainfeed.open_store(url, storage_options=options, **open_kw)
    assert store.samples == N
    return store, options, url


def samples_of(batches) -> list[tuple[bytes, int]]:
    out = []
    for x, y in batches:
        rows = np.ascontiguousarray(x).reshape(len(y), -1) if len(y) else []
        out += [(r.tobytes(), int(lab)) for r, lab in zip(rows, y)]
    return sorted(out)


def dump_stacks_if_stuck(worker_id: int) -> None:
    """A worker still running shortly before the DataLoader's timeout prints where each of its
    threads stands, so that a hang in CI says where it hung."""
    faulthandler.dump_traceback_later(TIMEOUT - 15, exit=False)


def loader(dataset, method: str | None, num_workers: int, persistent: bool = False) -> DataLoader:
    if num_workers == 0:
        return DataLoader(dataset, batch_size=None)
    return DataLoader(dataset, batch_size=None, num_workers=num_workers, multiprocessing_context=method,
                      persistent_workers=persistent, timeout=TIMEOUT, worker_init_fn=dump_stacks_if_stuck)


