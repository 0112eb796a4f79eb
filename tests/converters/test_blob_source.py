"""Converting straight from blob storage: Azurite serves the real Azure Blob API."""
from __future__ import annotations

import json

import fsspec
import numpy as np
import pytest

from converters import hdf5
from tests.conftest import write_volumes

pytestmark = pytest.mark.azurite


def test_convert_from_abfs_url_with_storage_options(tmp_path, azurite_server, convert_cli):
    src = tmp_path / "vols"
    truth = write_volumes(src, 15)
    fs = fsspec.filesystem("abfs", **azurite_server.storage_options)
    fs.mkdir("train")
    fs.put(str(src), "train/vols", recursive=True)
    conn = azurite_server.connection_string
    dst = tmp_path / "from-blob.h5"
    res = convert_cli("abfs://train/vols", dst, "--to", "hdf5", "--labels", "abfs://train/vols/labels.csv",
                      "--storage-option", f"connection_string={conn}", "--verify", "--json")
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["source"] == "abfs://train/vols" and summary["samples"] == len(truth)
    got = {sid: (label, f["volume"]) for sid, label, f in hdf5.read_samples(dst)}
    assert all(got[sid][0] == lab and np.array_equal(got[sid][1], arr) for sid, (arr, lab) in truth.items())
    # The account key must not leak into results or the store.
    assert "AccountKey" not in res.stdout and azurite_server.connection_string not in dst.read_bytes().decode("latin-1")


def test_blob_errors_name_the_blob(tmp_path, azurite_server, convert_cli):
    fs = fsspec.filesystem("abfs", **azurite_server.storage_options)
    fs.mkdir("broken")
    fs.pipe("broken/vols/a.npy", b"\x93NUMPY garbage")
    fs.pipe("broken/vols/b.npy", b"")
    conn = azurite_server.connection_string
    res = convert_cli("abfs://broken/vols", tmp_path / "o.parquet", "--to", "parquet",
                      "--storage-option", f"connection_string={conn}")
    assert res.exit_code == 1 and "broken/vols/a.npy: corrupt or truncated .npy" in res.stderr
    res = convert_cli("abfs://missing/vols", tmp_path / "o.parquet", "--to", "parquet",
                      "--storage-option", f"connection_string={conn}")
    assert res.exit_code == 1 and "abfs://missing/vols" in res.stderr
    assert conn not in res.stderr
