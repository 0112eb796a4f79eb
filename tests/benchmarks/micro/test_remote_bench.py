"""The remote-read benchmark end to end on a tiny dataset: its lines hold what the emulation
counted, and no reader beats the profile's bound (the emulation only ever adds time)."""
from __future__ import annotations

import json

import pytest

from trainfeed.benchmarks.micro import remote_bench
from trainfeed.benchmarks.model.profiles import OBJECT_STORES, bound_mb_per_s


def test_blob_epochs_through_the_emulation(tmp_path, capsys):
    remote_bench.main(["--work", str(tmp_path), "--count", "24", "--shape", "6x5x4x3", "--layouts", "blob",
                       "--backends", "local", "--connections", "1,3"])
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [r["kind"] for r in lines] == ["setup", "epoch", "epoch"]
    files = sorted((tmp_path / "volumes-24-6x5x4x3").glob("*.npy"))
    az = OBJECT_STORES["azure-blob"]
    for rec, connections in zip(lines[1:], (1, 3)):
        assert rec["layout"] == "blob" and rec["connections"] == connections and rec["samples"] == 24
        assert rec["requests"]["gets"] == 24 and rec["requests"]["bytes"] == sum(f.stat().st_size for f in files)
        assert rec["requests"]["peak_in_flight"] <= connections
        mean = rec["requests"]["bytes"] / rec["requests"]["requests"]
        assert rec["bound_mb_per_s"] == pytest.approx(bound_mb_per_s(az, connections, mean))
        assert rec["vs_bound"] <= 1.0
        assert rec["mb"] == pytest.approx(24 * 6 * 5 * 4 * 3 * 4 / 1e6)
    assert "vs bound" in err


def test_bad_layout_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        remote_bench.main(["--layouts", "zip"])
    assert exc.value.code == 2 and "choose from blob, parquet, delta, hdf5, got 'zip'" in capsys.readouterr().err


def test_compacted_stores_cache_and_utilisation(tmp_path, capsys):
    remote_bench.main(["--work", str(tmp_path), "--count", "40", "--shape", "6x5x4x3", "--layouts",
                       "parquet,delta,hdf5", "--backends", "local", "--connections", "2", "--au-connections", "1,2",
                       "--accelerators", "t4", "--width", "8", "--batch-size", "8"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["kind"], r.get("layout"), r.get("connections")) for r in lines] == [
        ("setup", None, None), ("epoch", "parquet", 2), ("epoch", "delta", 2), ("epoch", "hdf5", 2),
        ("cache", "parquet", 2), ("cache", "delta", 2), ("cache", "hdf5", 2), ("au", "delta", 1), ("au", "delta", 2)]
    for rec in lines[1:4]:
        assert rec["samples"] == 40 and rec["requests"]["gets"] >= 1 and rec["requests"]["peak_in_flight"] <= 2
        assert rec["vs_bound"] <= 1.0
    for rec in lines[4:7]:
        assert rec["epoch2_requests"]["requests"] == 0  # epoch 2 reads the cache only
        assert rec["epoch2_vs_local"] == pytest.approx(rec["epoch2_mb_per_s"] / rec["local_mb_per_s"])
    for rec in lines[7:]:
        t4 = rec["accelerators"]["t4"]
        assert t4["how"] == "estimate" and t4["demand_samples_per_s"] == pytest.approx(8 / t4["step_s"])
        assert t4["au"] == pytest.approx(min(1.0, rec["loader_samples_per_s"] / t4["demand_samples_per_s"]))
