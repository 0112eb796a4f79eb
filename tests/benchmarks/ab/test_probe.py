"""`storage-bench probe` measures the storage client's CPU-seconds per GB (process CPU time) at 1, 8
and 32 requests in flight, reading through trainfeed's own client; the profile keeps them and the
projection model uses them. Figures are checked for presence and consistency, never for speed."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from trainfeed.benchmarks.ab.probe import CPU_PASSES, ProbeConfig, probe, reader, summary
from trainfeed.benchmarks.model.profiles import IO_CPU_S_PER_GB, ObjectStore, load_object_store, save_object_store
from trainfeed.benchmarks.model.projection import Device, Layout, Loader, host_cpu
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.storage.filesystems import open_fs
from trainfeed.converters.storage.native import NativeFileSystem


def check_cpu_figures(profile: ObjectStore, levels: list[str]) -> None:
    """A CPU-s per GB for each level, each over at least CPU_PASSES times the large object's bytes
    in whole ranges of the recorded size, and the summary saying so."""
    d = profile.detail
    assert list(profile.io_cpu_s_per_gb) == levels
    assert all(math.isfinite(v) and v > 0 for v in profile.io_cpu_s_per_gb.values())
    assert list(d["cpu_bytes_read"]) == levels
    for level, nbytes in d["cpu_bytes_read"].items():
        assert nbytes >= CPU_PASSES * d["large_bytes"] and nbytes % (int(level) * d["cpu_request_bytes"]) == 0
    assert f"at {levels[-1]} in flight" in summary(profile) and f"client CPU ({d['client']}" in summary(profile)


def test_the_probe_reads_as_trainfeeds_reader_does(tmp_path):
    native, _ = open_fs("s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s"})
    assert isinstance(native, NativeFileSystem) and reader(native) == native.get_range
    local, root = open_fs(str(tmp_path))
    (tmp_path / "obj").write_bytes(b"0123456789")
    assert bytes(reader(local)(f"{root}/obj", 2, 5)) == b"234"


def test_probe_of_a_folder_measures_the_levels_up_to_max_concurrency(tmp_path):
    profile = probe(ProbeConfig(str(tmp_path), small_size=4000, large_size=100_000, samples=3, max_concurrency=8))
    check_cpu_figures(profile, ["1", "8"])  # 32 is over --max-concurrency
    assert profile.detail["client"] == "LocalFileSystem"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.azurite
def test_probe_of_azurite_measures_the_native_clients_cpu_and_the_profile_loads_back(azurite_server, tmp_path,
                                                                                      monkeypatch):
    azurite_server.create_container("probecpu")

    def not_this_way(*args, **kwargs):
        raise AssertionError("the probe reads through get_range, as the reader does")

    monkeypatch.setattr(NativeFileSystem, "cat_file", not_this_way)
    cfg = ProbeConfig("abfs://probecpu/here", azurite_server.storage_options, small_size=8000,
                      large_size=1_000_000, samples=4, max_concurrency=32)
    profile = probe(cfg)
    check_cpu_figures(profile, ["1", "8", "32"])
    assert profile.detail["client"] == "NativeFileSystem" and "client CPU per GB (NativeFileSystem)" in profile.source
    fs, _ = open_fs("abfs://probecpu", azurite_server.storage_options)
    assert fs.find("probecpu") == []  # the probe objects are gone

    save_object_store(profile, tmp_path / "azurite.json")
    loaded = load_object_store(str(tmp_path / "azurite.json"))
    assert loaded == profile
    assert loaded.io_cpu_at(8) == pytest.approx(profile.io_cpu_s_per_gb["8"])
    # the model charges what was measured: bytes a sample x CPU-s per GB at the loader's 8 in flight (on a
    # store that allows them: Azurite's own connection figure may be lower)
    cpu = host_cpu(Device("h100", 1, 0.01, "estimate"), Layout("delta", 0.0, 360_000, 8e6), Loader(concurrency=8),
                   replace(loaded, max_concurrency=64), 32)
    assert cpu["io-cpu"] == pytest.approx(360_000e-9 * profile.io_cpu_s_per_gb["8"])


def test_a_profile_without_cpu_figures_uses_the_native_clients(tmp_path):
    """A profile probed before the probe measured the client's CPU (or a preset) loads, and the
    model uses the native client's figure."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"name": "old", "first_byte_ms": 5.0, "stream_mb_per_s": 100.0, "max_concurrency": 16,
                                "source": "probed", "kind": "probed"}))
    old = load_object_store(str(path))
    assert old.io_cpu_s_per_gb is None and old.io_cpu_at(8) == IO_CPU_S_PER_GB["8"]


@pytest.mark.parametrize("figures", [{"eight": 1.0}, {"8": -0.5}, {"0": 1.0}, ["1", 2.0]])
def test_malformed_cpu_figures_are_refused(tmp_path, figures):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "bad", "first_byte_ms": 5.0, "stream_mb_per_s": 100.0, "max_concurrency": 16,
                                "source": "probed", "io_cpu_s_per_gb": figures}))
    with pytest.raises(TrainfeedError, match=f"{path}: malformed object-store profile"):
        load_object_store(str(path))
