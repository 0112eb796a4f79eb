"""The remote-read benchmark end to end on a tiny dataset: its lines hold what the emulation
counted, and no reader beats the profile's bound (the emulation only ever adds time)."""
from __future__ import annotations

import json

import pytest

from trainfeed.benchmarks import remote_bench
from trainfeed.benchmarks.profiles import OBJECT_STORES, bound_mb_per_s


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
