"""The storage latency emulation (emulated://), object-store profiles and `storage-bench probe`,
over local files and over Azurite (the real Azure Blob API)."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import fsspec
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli
from trainfeed.benchmarks.ab.probe import ProbeConfig, probe
from trainfeed.benchmarks.ab.storagesim import EmulatedFileSystem
from trainfeed.benchmarks.model.profiles import (
    OBJECT_STORES,
    ObjectStore,
    bound_mb_per_s,
    load_object_store,
    save_object_store,
)
from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.storage.location import locate

# 30 ms first byte, 10 MB/s per stream: a 100 KB GET is modelled at 40 ms
SLOW = ObjectStore("slow", 30.0, 10.0, 3, "test profile")


def emulated(profile=SLOW) -> EmulatedFileSystem:
    """A fresh client: a profile name no other test uses, so no counters are shared."""
    return EmulatedFileSystem(target="file", profile=replace(profile, name=f"{profile.name}-{time.perf_counter_ns()}"))


def timed(call):
    t0 = time.perf_counter()
    result = call()
    return result, time.perf_counter() - t0


@pytest.fixture
def blob(tmp_path):
    data = np.random.default_rng(0).bytes(300_000)
    (tmp_path / "obj").write_bytes(data)
    return tmp_path / "obj", data


def test_every_request_pays_the_model(blob):
    path, data = blob
    fs = emulated()
    got, seconds = timed(lambda: fs.cat_file(str(path)))
    assert got == data and seconds >= SLOW.request_seconds(300_000) == pytest.approx(0.060)
    got, seconds = timed(lambda: fs.cat_file(str(path), start=1000, end=101_000))  # a range read
    assert got == data[1000:101_000] and seconds >= 0.040
    info, seconds = timed(lambda: fs.info(str(path)))
    assert info["size"] == 300_000 and seconds >= 0.030
    assert timed(lambda: fs.size(str(path)))[1] >= 0.030
    listing, seconds = timed(lambda: fs.ls(str(path.parent), detail=False))
    assert listing == [str(path)] and seconds >= 0.030
    found, seconds = timed(lambda: fs.find(str(path.parent)))
    assert found == [str(path)] and seconds >= 0.030
    assert fs.stats() == {"requests": 6, "gets": 2, "heads": 2, "lists": 2, "bytes": 400_000, "peak_in_flight": 1}


def test_opened_files_pay_per_range_read(blob):
    path, data = blob
    fs = emulated()
    with fs.open(f"emulated://{path}") as fh:  # opening asks for the size: one HEAD
        fh.seek(5000)
        part, seconds = timed(lambda: fh.read(100_000))
        again, seconds_again = timed(lambda: (fh.seek(5000), fh.read(100_000))[1])  # no cache: read again
    assert part == again == data[5000:105_000]
    assert seconds >= 0.040 and seconds_again >= 0.040
    assert fs.stats() == {"requests": 3, "gets": 2, "heads": 1, "lists": 0, "bytes": 200_000, "peak_in_flight": 1}
    fs.reset_stats()
    with fs.open(str(path), cache_type="all") as fh:  # the caller's cache type is honoured: one GET of the file
        assert fh.read(10) + fh.read(10) == data[:20]
    assert fs.stats()["gets"] == 1 and fs.stats()["bytes"] == 300_000


def test_no_more_requests_in_flight_than_the_cap(blob):
    """12 concurrent GETs, a cap of 3: never more than 3 in flight, so 4 rounds of >= 30 ms."""
    path, data = blob
    fs = emulated()
    with ThreadPoolExecutor(12) as pool:
        parts, seconds = timed(lambda: list(pool.map(lambda k: fs.cat_file(str(path), start=k, end=k + 10), range(12))))
    assert parts == [data[k:k + 10] for k in range(12)]
    assert fs.stats()["peak_in_flight"] == 3 and seconds >= 4 * 0.030
    assert fs.stats()["requests"] == 12 and fs.stats()["bytes"] == 120


def test_counts_are_exact_under_threads_and_shared_by_one_client(blob):
    """Every thread gets its own filesystem instance (as fsspec builds them per thread); with
    the same options they share one connection pool and one set of counters."""
    path, _ = blob
    profile = replace(OBJECT_STORES["lan"], name=f"lan-{time.perf_counter_ns()}", first_byte_ms=0.5)

    def worker(k: int) -> None:
        fs = fsspec.filesystem("emulated", target="file", profile=profile)
        for i in range(25):
            fs.cat_file(str(path), start=i, end=i + k + 1)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = EmulatedFileSystem(target="file", profile=profile).stats()
    assert stats["requests"] == stats["gets"] == 200
    assert stats["bytes"] == 25 * sum(k + 1 for k in range(8))
    other = EmulatedFileSystem(target="file", profile=replace(profile, max_concurrency=2))
    assert other.stats()["requests"] == 0  # another profile: another client


def test_pyarrow_and_h5py_read_identical_data_through_the_emulation(tmp_path):
    table = pa.table({"id": [f"s{i}" for i in range(2000)], "x": np.arange(2000, dtype=np.float64)})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=500)
    arr = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    with h5py.File(tmp_path / "t.h5", "w") as h5:
        h5.create_dataset("x", data=arr, chunks=(8, 32))
    fs, path = fsspec.core.url_to_fs(f"emulated://{tmp_path}/t.parquet", target="file", profile="lan")
    assert isinstance(fs, EmulatedFileSystem) and path == f"{tmp_path}/t.parquet"
    fs.reset_stats()
    assert pq.read_table(path, filesystem=fs).equals(table)
    pf = pq.ParquetFile(fs.open(path))
    assert pf.read_row_group(3).equals(table.slice(1500, 500))
    assert fs.stats()["gets"] >= 2 and fs.stats()["heads"] >= 1
    with fs.open(f"{tmp_path}/t.h5") as fh, h5py.File(fh, "r") as h5:
        before = fs.stats()["gets"]
        assert np.array_equal(h5["x"][8:24], arr[8:24])
        assert fs.stats()["gets"] > before  # chunk reads went through the emulation


def test_read_only(blob):
    path, data = blob
    fs = emulated()
    for write in (lambda: fs.open(str(path), "wb"), lambda: fs.pipe_file(str(path), b"x"),
                  lambda: fs.open(str(path), "ab")):
        with pytest.raises(PermissionError, match="read-only"):
            write()
    assert path.read_bytes() == data


def test_inner_url_and_options_for_local_files(tmp_path):
    fs, path = fsspec.core.url_to_fs(f"emulated://{tmp_path}/store", target="file", profile="azure-blob")
    assert fs.inner_url(path) == f"{tmp_path}/store" and fs.inner_options == {}
    loc = locate(f"emulated://{tmp_path}/store", {"target": "file", "profile": "azure-blob"})
    assert loc.delta_uri() == f"{tmp_path}/store" and loc.delta_options() == {}


@pytest.mark.azurite
def test_emulation_over_azurite(azurite_server):
    opts = azurite_server.storage_options
    az = fsspec.filesystem("abfs", **opts)
    az.mkdir("simcont")
    payload = np.random.default_rng(2).bytes(50_000)
    az.pipe_file("simcont/dir/obj", payload)
    storage = {"target": "abfs", "profile": "azure-blob", "target_options": opts}
    fs, path = fsspec.core.url_to_fs("emulated://simcont/dir/obj", **storage)
    assert path == "simcont/dir/obj"
    assert fs.inner_url(path) == "abfs://simcont/dir/obj" and fs.inner_options == opts
    fs.reset_stats()
    got, seconds = timed(lambda: fs.cat_file(path, start=100, end=20_100))
    assert got == payload[100:20_100] and seconds >= 0.020
    assert fs.stats()["gets"] == 1 and fs.stats()["bytes"] == 20_000
    loc = locate("emulated://simcont/dir", storage)
    assert loc.delta_uri() == "abfs://simcont/dir"
    delta = loc.delta_options()
    assert delta["account_name"] == "devstoreaccount1" and delta["allow_http"] == "true"


# ------------------------------------------------------------------ profiles

def test_profile_round_trip_and_url_option(tmp_path, blob):
    path, _data = blob
    probed = ObjectStore("mine", 12.5, 250.0, 16, "probed here", kind="probed",
                         detail={"latency_ms": {"p50": 12.5, "p99": 30.0}, "throughput_mb_per_s": {"1": 250.0}})
    save_object_store(probed, tmp_path / "mine.json")
    assert load_object_store(str(tmp_path / "mine.json")) == probed
    assert load_object_store("Azure-Blob") == OBJECT_STORES["azure-blob"]
    assert OBJECT_STORES["azure-blob"].kind == "preset"
    fs, _ = fsspec.core.url_to_fs(f"emulated://{path}", target="file", profile=str(tmp_path / "mine.json"))
    assert fs.profile == probed
    assert timed(lambda: fs.cat_file(str(path)))[1] >= 0.0125 + 300_000 / 250e6


def test_bad_profiles_are_named(tmp_path):
    with pytest.raises(UsageError, match="unknown storage profile 'floppy': choose from azure-blob, s3, lan, or a "
                                         "profile file written by `storage-bench probe`"):
        load_object_store("floppy")
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x"}')
    with pytest.raises(TrainfeedError, match=f"{bad}: malformed object-store profile"):
        load_object_store(str(bad))
    bad.write_text(json.dumps({"name": "x", "first_byte_ms": 1, "stream_mb_per_s": 0, "max_concurrency": 4,
                               "source": "s"}))
    with pytest.raises(TrainfeedError, match="needs first_byte_ms >= 0, stream_mb_per_s > 0"):
        load_object_store(str(bad))


def test_bound_mb_per_s():
    az = OBJECT_STORES["azure-blob"]  # 20 ms, 60 MB/s, 64 connections
    # 360 KB files: 20 ms + 6 ms per request -> 13.85 MB/s per connection
    assert bound_mb_per_s(az, 1, 360_000) == pytest.approx(0.36 / 0.026)
    assert bound_mb_per_s(az, 16, 360_000) == pytest.approx(16 * 0.36 / 0.026)
    assert bound_mb_per_s(az, 128, 360_000) == pytest.approx(64 * 0.36 / 0.026)  # the client's cap
    assert bound_mb_per_s(az, 1, 10**12) == pytest.approx(60, rel=1e-3)  # large requests: the stream rate
    assert bound_mb_per_s(az, 4, 0) == 0


# ------------------------------------------------------------------ probe

def test_probe_recovers_an_emulated_preset(tmp_path):
    """Probing the emulation of azure-blob gives back its latency (never under the model) and
    no concurrency level faster than its connections' worth of the model's bandwidth: the
    emulation only ever adds time. How much it adds depends on how busy the machine is, so
    no upper bound on time is asserted."""
    cfg = ProbeConfig(f"emulated://{tmp_path}", {"target": "file", "profile": "azure-blob"}, small_size=16_000,
                      large_size=2_000_000, samples=15, max_concurrency=16)
    log = []
    profile = probe(cfg, log.append)
    az = OBJECT_STORES["azure-blob"]
    assert profile.kind == "probed" and profile.name == "probed"
    assert profile.detail["latency_ms"]["p50"] >= az.request_seconds(16_000) * 1e3
    assert profile.first_byte_ms >= az.first_byte_ms * 0.9
    assert profile.stream_mb_per_s > 0  # fitted beside an inflated latency: may land a little over the model
    tput = profile.detail["throughput_mb_per_s"]
    assert list(tput) == ["1", "2", "4", "8", "16"] and all(v > 0 for v in tput.values())
    # no level beats its connections' worth of the modelled stream bandwidth
    assert all(v <= int(n) * az.stream_mb_per_s * 1.1 for n, v in tput.items())
    assert 1 <= profile.max_concurrency <= 16
    assert f"emulated://{tmp_path}" in profile.source and profile.detail["small_gets"] == 15
    assert list(tmp_path.iterdir()) == []  # the probe objects are gone
    assert any("_trainfeed-probe-" in line for line in log)


def test_probe_cleans_up_when_interrupted(tmp_path, monkeypatch):
    import trainfeed.benchmarks.ab.probe as probe_mod

    def interrupted(*args, **kwargs):
        assert len(list(tmp_path.glob("_trainfeed-probe-*/*"))) == probe_mod.SMALL_OBJECTS + 1
        raise KeyboardInterrupt

    monkeypatch.setattr(probe_mod, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        probe(ProbeConfig(str(tmp_path), small_size=1000, large_size=10_000, samples=2))
    assert list(tmp_path.iterdir()) == []


def bench_cli(*args):
    from trainfeed.benchmarks.cli import app

    return run_cli(app, *args)


def test_probe_cli_on_a_local_folder_writes_a_profile_the_emulation_replays(tmp_path):
    (tmp_path / "data").mkdir()
    out = tmp_path / "local.json"
    res = bench_cli("probe", tmp_path / "data", "--small-size", "4KB", "--large-size", "400KB", "--samples", "5",
                    "--max-concurrency", "4", "--out", out, "--name", "this-disk", "--json")
    assert res.exit_code == 0, res.stderr
    shown = json.loads(res.stdout)
    profile = load_object_store(str(out))
    assert shown == json.loads(out.read_text()) and profile.name == "this-disk" and profile.kind == "probed"
    assert list(profile.detail["throughput_mb_per_s"]) == ["1", "2", "4"] and 1 <= profile.max_concurrency <= 4
    assert profile.stream_mb_per_s > 0 and profile.first_byte_ms >= 0
    assert "concurrency 4: 12 range reads of 50,000 B" in res.stderr
    assert list((tmp_path / "data").iterdir()) == []
    fs, _ = fsspec.core.url_to_fs(f"emulated://{tmp_path}", target="file", profile=str(out))
    assert fs.profile == profile


def test_probe_cli_usage_and_storage_errors(tmp_path):
    res = bench_cli("probe", tmp_path, "--small-size", "1MB", "--large-size", "1MB")
    assert res.exit_code == 2 and "--large-size (1,000,000 bytes) must be larger than --small-size" in res.stderr
    res = bench_cli("probe", tmp_path, "--small-size", "lots")
    assert res.exit_code == 2 and "--small-size: cannot parse 'lots'" in res.stderr
    res = bench_cli("probe", tmp_path / "missing")
    assert res.exit_code == 1 and f"error: {tmp_path / 'missing'}: folder does not exist" in res.stderr
    res = bench_cli("probe", tmp_path, "--existing")
    assert res.exit_code == 1 and "--existing needs objects of at least --small-size" in res.stderr


@pytest.mark.azurite
def test_probe_azurite_and_its_emulation(azurite_server, tmp_path):
    """Probe Azurite itself through the CLI (the connection string never printed), then the
    azure-blob emulation layered over Azurite (written through to Azurite, read through the
    emulation): the emulated latency is recovered."""
    conn = azurite_server.connection_string
    az = fsspec.filesystem("abfs", **azurite_server.storage_options)
    az.mkdir("probecont")
    out = tmp_path / "azurite.json"
    res = bench_cli("probe", "abfs://probecont/here", "--storage-option", f"connection_string={conn}",
                    "--small-size", "8KB", "--large-size", "1MB", "--samples", "8", "--max-concurrency", "8",
                    "--out", out)
    assert res.exit_code == 0, res.stderr
    assert "probe of abfs://probecont/here" in res.stdout and "max_concurrency" in res.stdout
    assert "AccountKey" not in res.stdout + res.stderr + out.read_text()
    profile = load_object_store(str(out))
    assert profile.kind == "probed" and profile.detail["latency_ms"]["p50"] > 0
    assert az.find("probecont") == []  # deleted afterwards
    cfg = ProbeConfig("emulated://probecont/sim", {"target": "abfs", "profile": "azure-blob",
                                                   "target_options": azurite_server.storage_options},
                      small_size=8_000, large_size=1_000_000, samples=8, max_concurrency=4)
    emulated_profile = probe(cfg)
    assert emulated_profile.detail["latency_ms"]["p50"] >= OBJECT_STORES["azure-blob"].request_seconds(8_000) * 1e3
    assert az.find("probecont") == []


def test_probe_existing_objects_reads_and_leaves_them(tmp_path):
    rng = np.random.default_rng(3)
    files = {f"f{i}": rng.bytes(size) for i, size in enumerate((5000, 6000, 500, 40_000))}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    cfg = ProbeConfig(f"emulated://{tmp_path}", {"target": "file", "profile": "lan"}, small_size=4000,
                      large_size=100_000, samples=6, max_concurrency=2, existing=True)
    profile = probe(cfg)
    d = profile.detail
    assert d["objects"] == "existing objects (3 small, 1 large)" and d["large_bytes"] == 40_000
    assert d["small_gets"] == 6 and list(d["throughput_mb_per_s"]) == ["1", "2"]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
