"""The disk cache: ranges come back bit for bit or not at all (truncated, corrupted or foreign
files are misses, and deleted), the limit holds, and processes can share one folder."""
from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest

from trainfeed.converters.storage.cache import DiskCache


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
        raw[-16:-12] = b"XXXX"
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
    cache = DiskCache(tmp_path, limit=3 * 1016)  # three ranges of 1,000 bytes, each with its footer
    for i, key in enumerate("abc"):
        cache.put(key, [payload(i)])
        past = time.time() - 100 + i
        os.utime(cache._file(key), (past, past))
    assert cache.get("a", 1000) is not None  # "a" is now the most recently used
    cache.put("d", [payload(9)])
    assert cache.bytes <= 3 * 1016
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
    limit = 30 * 1016
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
    assert kept == cache.bytes // 1016 and cache.discarded == 0
    assert not list(tmp_path.glob("*/.*.tmp"))
