"""The object-storage read path's parts: range fetches split across connections into buffers
read without copies, and h5py reading through a RangeFile while garbage collection runs."""
from __future__ import annotations

import gc
import threading
import time

import fsspec
import fsspec.implementations.local
import h5py
import numpy as np
import pytest

from trainfeed.converters.storage.fetch import Fetcher, RangeFile, Span
from trainfeed.converters.storage.filesystems import open_fs
from trainfeed.converters.storage.native import ObjectChanged


def test_a_range_split_into_parts_reads_the_same_bytes(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    (tmp_path / "obj").write_bytes(data)
    fetcher = Fetcher(fsspec.filesystem("file"), io_concurrency=3, part_size=64, max_request=64)
    span = fetcher.fetch(str(tmp_path / "obj"), 5, 947)
    assert len(span.parts) == 15 and span.tobytes() == data[5:947]
    file = RangeFile(fetcher, str(tmp_path / "obj"), len(data))
    file.prefetch(100, 300)
    file.seek(120)
    assert bytes(file.read(50)) == data[120:170]
    file.seek(150)  # across the parts' boundary at 164
    assert bytes(file.read(40)) == data[150:190]
    buffer = bytearray(30)
    file.seek(290)  # past the span's end: block reads
    assert file.readinto(buffer) == 30 and bytes(buffer) == data[290:320]
    file.seek(-10, 2)
    assert bytes(file.read()) == data[-10:]


def test_reads_inside_one_part_are_views_of_the_fetched_buffer():
    part = bytearray(b"abcdefgh")
    span = Span(100, [part, b"ijkl"])
    view = span.view(102, 3)
    part[2:5] = b"XYZ"  # the view sees the buffer: no copy was made
    assert bytes(view) == b"XYZ"
    assert bytes(span.view(106, 4)) == b"ghij"  # crosses two parts: joined
    assert span.end == 112 and len(span) == 12


def test_a_short_object_is_an_error_not_short_data(tmp_path):
    (tmp_path / "obj").write_bytes(b"x" * 10)
    with pytest.raises(ObjectChanged, match="cut short: asked for bytes 0-20, got 10"):
        Fetcher(fsspec.filesystem("file")).fetch(str(tmp_path / "obj"), 0, 20)


@pytest.mark.azurite
def test_h5py_reads_through_object_storage_while_garbage_collection_runs(azurite_server, tmp_path):
    """h5py holds its global lock while it calls the file's read, and the request runs on
    another thread: a collection there freeing an h5py object used to deadlock until the call
    timed out (seen in about one in 25 reads with this much garbage)."""
    local = tmp_path / "s.h5"
    with h5py.File(local, "w") as h5:
        h5["x"] = np.arange(600, dtype=np.float32).reshape(60, 10)
    fs = fsspec.filesystem("abfs", **azurite_server.storage_options)
    fs.mkdir("gc-pause")
    fs.put_file(str(local), "gc-pause/s.h5")
    class Cycle:  # garbage holding an h5py file, freed by the collector in whichever thread runs it
        def __init__(self):
            self.me, self.h5 = self, h5py.File(local, "r")

    fetcher_fs, _ = open_fs("abfs://gc-pause", azurite_server.storage_options)
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


class CountingFileSystem(fsspec.implementations.local.LocalFileSystem):  # a real file system, counted
    """Local files, counting the range reads made (each one request on object storage)."""

    requests = 0

    def cat_file(self, path, start=None, end=None, **kwargs):
        type(self).requests += 1
        return super().cat_file(path, start=start, end=end, **kwargs)


@pytest.fixture
def counted(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    (tmp_path / "obj").write_bytes(data)
    CountingFileSystem.requests = 0
    return CountingFileSystem(skip_instance_cache=True), str(tmp_path / "obj"), data


def test_a_span_up_to_the_request_limit_is_one_request_and_one_buffer(counted):
    """One buffer: a decoder reading the whole span gets a view, never a join into fresh memory."""
    fs, path, data = counted
    fetcher = Fetcher(fs, part_size=100, max_request=1000)
    span = fetcher.fetch(path, 10, 1010)
    assert (CountingFileSystem.requests, len(span.parts)) == (1, 1)
    assert isinstance(span.view(10, 1000), memoryview) and bytes(span.view(10, 1000)) == data[10:1010]
    assert fetcher.fetch(path, 0, 1001).tobytes() == data[:1001] and CountingFileSystem.requests == 1 + 11


def test_cache_writes_outlive_their_fetcher_and_leave_no_thread_behind(counted, tmp_path):
    """The cache is written behind the reads: a store dropped right after its epoch (its
    fetcher collected) still gets its ranges written by ``flush_cache_writes``, and once the
    queue is empty no writer thread is left running."""
    from trainfeed.converters.storage.cache import DiskCache
    from trainfeed.converters.storage.cache_writer import flush_cache_writes

    fs, path, data = counted
    fetcher = Fetcher(fs, part_size=100, max_request=1000, cache=DiskCache(tmp_path / "cache", 1 << 20))
    assert [fetcher.fetch(path, a, a + 500).tobytes() for a in range(0, 5000, 500)] == \
        [data[a:a + 500] for a in range(0, 5000, 500)]
    del fetcher
    gc.collect()
    flush_cache_writes(timeout=30)
    deadline = time.monotonic() + 10  # a writer ends just after its last range is counted written
    while [t for t in threading.enumerate() if t.name == "trainfeed-cache-writer"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not [t for t in threading.enumerate() if t.name == "trainfeed-cache-writer"]
    again = Fetcher(fs, part_size=100, max_request=1000, cache=DiskCache(tmp_path / "cache", 1 << 20))
    before = CountingFileSystem.requests
    assert [again.fetch(path, a, a + 500).tobytes() for a in range(0, 5000, 500)] == \
        [data[a:a + 500] for a in range(0, 5000, 500)]
    assert CountingFileSystem.requests == before  # every range from the cache


def test_a_span_fetched_ahead_is_not_requested_again(counted):
    fs, path, data = counted
    fetcher = Fetcher(fs, part_size=100, max_request=1000)
    fetcher.ahead(path, 0, 800)
    fetcher.ahead(path, 0, 800)  # asked twice: one request
    fetcher.ahead(path, 800, 1600)
    assert fetcher.fetch(path, 0, 800).tobytes() == data[:800]
    assert fetcher.fetch(path, 800, 1600).tobytes() == data[800:1600]
    assert CountingFileSystem.requests == 2
    assert fetcher.fetch(path, 0, 800).tobytes() == data[:800] and CountingFileSystem.requests == 3


def _fetch_in_child(fetcher, path, out) -> None:
    out.put(fetcher.fetch(path, 0, 800).tobytes())


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_fetcher_in_another_process_reads_with_threads_of_its_own(tmp_path, method):
    """Pickled (spawn) it travels without its threads; forked, it leaves its parent's pending
    requests behind instead of waiting on threads that do not exist in the child."""
    import multiprocessing

    data = np.random.default_rng(2).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    (tmp_path / "obj").write_bytes(data)
    path = str(tmp_path / "obj")
    fetcher = Fetcher(fsspec.filesystem("file"), part_size=100, max_request=1000)
    fetcher.ahead(path, 0, 800)  # in flight (or done) in the parent when the child starts
    ctx = multiprocessing.get_context(method)
    out = ctx.Queue()
    child = ctx.Process(target=_fetch_in_child, args=(fetcher, path, out))
    child.start()
    assert out.get(timeout=60) == data[:800]
    child.join(60)
    assert child.exitcode == 0
    assert fetcher.fetch(path, 0, 800).tobytes() == data[:800]  # the parent's own request, still there
