"""The disk cache: ranges come back bit for bit or not at all (truncated, corrupted or foreign
files are misses, and deleted), the limit holds, and processes can share one folder."""
from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest

from trainfeed.converters.storage.cache import FOOTER_SIZE, DiskCache, ForeignCacheFolder

RANGE = 1000 + FOOTER_SIZE  # bytes a cached range of 1,000 takes


def payload(seed: int, n: int = 1000) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_a_range_comes_back_as_it_was_put_from_its_parts(tmp_path):
    cache = DiskCache(tmp_path, limit=10_000)
    data = payload(1)
    cache.put("k", [data[:300], memoryview(data)[300:]])
    assert bytes(cache.get("k", 1000)) == data
    assert DiskCache(tmp_path, limit=10_000).get("k", 1000) is not None  # another process's view
    assert cache.get("other", 1000) is None


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "footer", "longer"])
def test_a_damaged_file_is_a_miss_and_is_removed(tmp_path, damage):
    cache = DiskCache(tmp_path, limit=10_000)
    data = payload(2)
    cache.put("k", [data])
    (file,) = tmp_path.glob("*/*.bin")
    raw = bytearray(file.read_bytes())
    if damage == "truncated":
        raw = raw[:700]
    elif damage == "flipped byte":
        raw[500] ^= 0x01
    elif damage == "footer":
        raw[-FOOTER_SIZE:-FOOTER_SIZE + 4] = b"XXXX"
    else:
        raw += b"\0"
    file.write_bytes(bytes(raw))
    assert cache.get("k", 1000) is None
    assert not file.exists() and cache.discarded == 1
    cache.put("k", [data])  # fetched again, kept again
    assert bytes(cache.get("k", 1000)) == data


def test_asking_for_another_length_is_a_miss(tmp_path):
    cache = DiskCache(tmp_path, limit=10_000)
    cache.put("k", [payload(3)])
    assert cache.get("k", 999) is None


def test_the_limit_holds_and_the_least_recently_used_go_first(tmp_path):
    cache = DiskCache(tmp_path, limit=3 * RANGE)  # three ranges of 1,000 bytes, each with its footer
    for i, key in enumerate("abc"):
        cache.put(key, [payload(i)])
        past = time.time() - 100 + i
        os.utime(cache._file(key), (past, past))
    assert cache.get("a", 1000) is not None  # "a" is now the most recently used
    cache.put("d", [payload(9)])
    assert cache.bytes <= 3 * RANGE
    assert cache.get("b", 1000) is None and bytes(cache.get("a", 1000)) == payload(0)
    assert bytes(cache.get("d", 1000)) == payload(9)
    cache.put("big", [b"x" * 4000])  # larger than the whole cache: not kept
    assert cache.get("big", 4000) is None


def _fill(folder: str, worker: int, limit: int) -> None:
    cache = DiskCache(folder, limit)
    for i in range(40):
        cache.put(f"{worker}-{i}", [payload(worker * 100 + i)])
        got = cache.get(f"{worker}-{i}", 1000)
        assert got is None or bytes(got) == payload(worker * 100 + i)


def test_processes_sharing_one_folder_keep_its_limit_and_its_contents_whole(tmp_path):
    limit = 30 * RANGE
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_fill, args=(str(tmp_path), w, limit)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    cache = DiskCache(tmp_path, limit)
    assert 0 < cache.bytes <= limit
    kept = 0
    for w in range(4):
        for i in range(40):
            got = cache.get(f"{w}-{i}", 1000)
            if got is not None:
                kept += 1
                assert bytes(got) == payload(w * 100 + i)
    assert kept == cache.bytes // RANGE and cache.discarded == 0
    assert not list(tmp_path.glob("*/.*.tmp"))


# ------------------------------------------------------------------ issue #24: the cache owns its folder

def test_a_folder_holding_other_files_is_refused_and_left_as_it_was(tmp_path):
    """The case that deleted a user's data: --cache-dir pointed at a folder of raw volumes."""
    data = tmp_path / "MYDATA"
    (data / "ab").mkdir(parents=True)
    volume = data / "ab" / "vol1.bin"
    volume.write_bytes(b"a user's volume")
    draft = data / "ab" / ".draft.tmp"
    draft.write_bytes(b"a user's draft")
    old = 1_000_000
    os.utime(draft, (old, old))
    before = {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}
    with pytest.raises(ForeignCacheFolder, match=r"--cache-dir .*MYDATA.*not a trainfeed cache"):
        DiskCache(data, limit=100)
    assert {p: p.read_bytes() for p in data.rglob("*") if p.is_file()} == before


def test_eviction_deletes_only_files_the_cache_wrote(tmp_path):
    cache = DiskCache(tmp_path / "c", limit=3 * RANGE)
    sub = tmp_path / "c" / "ab"
    sub.mkdir()
    # named as the cache names its files, but not written by it (no footer of its own)
    lookalike = sub / ("ab" + "0" * 62 + ".bin")
    lookalike.write_bytes(b"x" * 5000)
    for i in range(8):
        cache.put(f"k{i}", [payload(i)])
    assert lookalike.read_bytes() == b"x" * 5000
    assert cache.bytes <= 3 * RANGE


def test_the_footer_binds_the_key_a_file_swapped_for_another_range_is_a_miss(tmp_path):
    cache = DiskCache(tmp_path, limit=10_000)
    cache.put("a", [payload(1)])
    cache.put("b", [payload(2)])
    cache._file("a").write_bytes(cache._file("b").read_bytes())  # the same length, a valid file of "b"
    assert cache.get("a", 1000) is None
    assert bytes(cache.get("b", 1000)) == payload(2)


def test_a_killed_writer_s_temporary_file_is_swept_and_counted_until_then(tmp_path):
    cache = DiskCache(tmp_path, limit=10_000)
    cache.put("a", [payload(1)])
    dead = multiprocessing.get_context("spawn").Process(target=int)
    dead.start()
    dead.join()
    name = cache._file("a").name
    tmp = cache._file("a").with_name(f".{name}.{dead.pid}.0.tmp")
    tmp.write_bytes(b"y" * 3000)
    assert cache.bytes == RANGE + 3000  # counted against the limit
    DiskCache(tmp_path, limit=10_000)  # a cache opening sweeps what dead writers left
    assert not tmp.exists() and cache.bytes == RANGE


def test_a_folder_that_cannot_be_written_is_a_pass_through_with_one_warning(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    cache = DiskCache(blocker / "cache", limit=10_000)  # cannot be created: a file is in the way
    for i in range(3):
        cache.put(f"k{i}", [payload(i)])
        assert cache.get(f"k{i}", 1000) is None
    assert capsys.readouterr().err.count("warning: --cache-dir") == 1
    assert blocker.read_bytes() == b""
