"""Issue #30, what long runs meet: a storage outage the same dataset recovers from, and a cache
folder that many processes share within its limit."""
from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback

import numpy as np
import pytest

import trainfeed
from tests.test_object_storage import get_backend
from tests.training.reading.dataloaders import TIMEOUT, samples_of
from trainfeed.benchmarks.emulators.latency import LatencyRelay
from trainfeed.converters.storage.cache import DiskCache

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402


@pytest.fixture
def relayed_store(request, tmp_path, source):
    """The source as a Parquet store on the S3 server, opened through a relay that can play an
    outage, with a short call timeout (an outage fails in seconds, not minutes)."""
    root, _ = source
    backend = get_backend(request, "s3")
    url = backend.url(backend.new_bucket("outage"), "s.parquet")
    trainfeed.convert(str(root), url, format="parquet", labels=str(root / "labels.csv"),
                      storage_options=dict(backend.options), row_group_size=8 * 128)
    with LatencyRelay(request.getfixturevalue("s3_server").port, 0.0) as relay:
        options = {**backend.options, "endpoint_url": f"http://127.0.0.1:{relay.port}", "call_timeout": "3"}
        yield trainfeed.open_store(url, storage_options=options), relay


def _epoch(dataset, loader):
    return samples_of([(x.numpy().copy(), y.numpy().copy()) for x, y in loader])


@pytest.mark.s3
@pytest.mark.parametrize("num_workers", [0, 2])
def test_after_an_outage_the_same_dataset_reads_again(relayed_store, source, num_workers):
    """The storage stops answering mid-run: the epoch fails with a clear error in bounded time;
    once it answers again, the next epoch of the same dataset (the same persistent workers)
    reads every sample, instead of raising the outage's error again."""
    store, relay = relayed_store
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=1)
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers, timeout=TIMEOUT if num_workers else 0,
                        persistent_workers=num_workers > 0, multiprocessing_context="fork" if num_workers else None)
    assert _epoch(dataset, loader) == source[1]
    relay.down(True)
    dataset.set_epoch(1)
    started = time.monotonic()
    with pytest.raises((trainfeed.TrainfeedError, RuntimeError), match="did not answer|status|connect|error") as e:
        _epoch(dataset, loader)
    traceback.clear_frames(e.tb)  # PyTorch re-raises from a frame that holds the error: let the loader go
    assert time.monotonic() - started < 120
    relay.down(False)
    dataset.set_epoch(2)
    assert _epoch(dataset, loader) == source[1]


def _fill(folder: str, limit: int, worker: int, count: int, size: int) -> None:
    cache = DiskCache(folder, limit)
    payload = np.full(size, worker, np.uint8).tobytes()
    for i in range(count):
        cache.put(f"key-{worker}-{i}", [payload])


def test_a_cache_folder_shared_by_processes_stays_within_its_limit(tmp_path):
    """Four processes (two ranks x two workers) writing at once: the bytes in the folder, files
    being written included, never pass the limit (a rescan must count a file being written at
    the size reserved for it, not the part written so far)."""
    folder, limit, size = tmp_path / "cache", 1_000_000, 47_000
    DiskCache(folder, limit)
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            sizes = {}  # by inode: a file renamed while the folder is listed shows up under both names
            for sub, _, files in os.walk(folder):
                for name in files:
                    try:
                        st = os.stat(os.path.join(sub, name))
                    except FileNotFoundError:
                        continue
                    if len(name) > 20:  # range files and files being written, not the cache's own
                        sizes[os.path.join(sub, name)] = st.st_size
            # a walk is no snapshot: a file counted early may be evicted before one made later is
            # listed. Count only the files still there when the walk ends (stat'ed again at once).
            held = 0
            for path, size in sizes.items():
                try:
                    held += max(size, os.stat(path).st_size)
                except FileNotFoundError:
                    continue
            peak[0] = max(peak[0], held)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_fill, args=(str(folder), limit, w, 80, size)) for w in range(4)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(TIMEOUT)
    stop.set()
    watcher.join(10)
    assert [p.exitcode for p in writers] == [0, 0, 0, 0]
    assert 0 < peak[0] <= limit, peak[0]
    assert DiskCache(folder, limit).bytes <= limit
