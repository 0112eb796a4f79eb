"""The object-storage read path's parts: range fetches split across connections, the disk
cache's limit, and h5py reading through a RangeFile while garbage collection runs."""
from __future__ import annotations

import gc
import time

import fsspec
import h5py
import numpy as np
import pytest

from trainfeed.converters.remote_io import DiskCache, Fetcher, RangeFile


def test_a_range_split_into_parts_reads_the_same_bytes(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    (tmp_path / "obj").write_bytes(data)
    fetcher = Fetcher(fsspec.filesystem("file"), io_concurrency=3, part_size=64)
    assert fetcher.fetch(str(tmp_path / "obj"), 5, 947) == data[5:947]
    file = RangeFile(fetcher, str(tmp_path / "obj"), len(data))
    file.prefetch(100, 300)
    file.seek(120)
    assert file.read(50) == data[120:170]
    file.seek(-10, 2)
    assert file.read() == data[-10:]


def test_a_short_object_is_an_error_not_short_data(tmp_path):
    (tmp_path / "obj").write_bytes(b"x" * 10)
    with pytest.raises(OSError, match="asked for bytes 0-20, got 10"):
        Fetcher(fsspec.filesystem("file")).fetch(str(tmp_path / "obj"), 0, 20)


def test_the_disk_cache_keeps_within_its_limit_dropping_the_least_recently_used(tmp_path):
    cache = DiskCache(tmp_path / "c", limit=100)
    for key in ("a", "b"):
        cache.put(key, key.encode() * 40)
    assert cache.get("a") == b"a" * 40  # "a" is now the most recently used
    cache.put("c", b"c" * 40)
    assert cache.get("b") is None and cache.get("a") == b"a" * 40 and cache.get("c") == b"c" * 40
    assert cache.bytes <= 100
    assert DiskCache(tmp_path / "c", limit=100).get("c") == b"c" * 40  # survives the process
    cache.put("big", b"x" * 101)  # larger than the whole cache: not kept
    assert cache.get("big") is None


@pytest.mark.azurite
def test_h5py_reads_through_object_storage_while_garbage_collection_runs(azurite_server, tmp_path):
    """h5py holds its global lock while it calls the file's read, and the request runs on
    fsspec's loop thread: a collection there freeing an h5py object used to deadlock until the
    call timed out (seen in about one in 25 reads with this much garbage)."""
    local = tmp_path / "s.h5"
    with h5py.File(local, "w") as h5:
        h5["x"] = np.arange(600, dtype=np.float32).reshape(60, 10)
    fs = fsspec.filesystem("abfs", **azurite_server.storage_options)
    fs.mkdir("gc-pause")
    fs.put_file(str(local), "gc-pause/s.h5")
    class Cycle:  # garbage holding an h5py file, freed by the collector in whichever thread runs it
        def __init__(self):
            self.me, self.h5 = self, h5py.File(local, "r")

    fetcher_fs = fsspec.filesystem("abfs", **azurite_server.storage_options)
    thresholds = gc.get_threshold()
    gc.set_threshold(50)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for _ in range(20):
                Cycle()
            file = RangeFile(Fetcher(fetcher_fs, deadline=5), "gc-pause/s.h5", fs.size("gc-pause/s.h5"))
            with h5py.File(file, "r") as h5:
                assert np.array_equal(h5["x"][:], np.arange(600, dtype=np.float32).reshape(60, 10))
    finally:
        gc.set_threshold(*thresholds)
        gc.collect()
