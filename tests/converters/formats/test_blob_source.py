"""Converting straight from blob storage: Azurite serves the real Azure Blob API."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import numpy as np
import pytest

from tests.conftest import write_volumes
from trainfeed.converters.formats import hdf5
from trainfeed.converters.storage.config import DEFAULT_CALL_TIMEOUT_S

pytestmark = pytest.mark.azurite
REPO = Path(__file__).resolve().parents[3]


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


def open_for_writing_once_read(fifo: Path, proc: subprocess.Popen, timeout: float = 60):
    """The FIFO opened for writing as soon as ``proc`` opens it for reading."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return os.fdopen(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "w")
        except OSError:  # ENXIO: no reader yet
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.05)
    raise AssertionError(f"the conversion never opened {fifo}")


@pytest.mark.slow
def test_endpoint_gone_mid_conversion_fails_within_the_call_timeout(tmp_path):
    """The blobs are listed, then the endpoint goes away: every read fails within the default
    call_timeout (not after minutes of the client's own retries), naming the blob."""
    from trainfeed.benchmarks.emulators import azurite

    src = tmp_path / "vols"
    write_volumes(src, 8)
    fifo = tmp_path / "labels.fifo"
    os.mkfifo(fifo)  # the conversion reads its labels after listing: it waits here for them
    server = azurite.start()
    try:
        fs = fsspec.filesystem("abfs", **server.storage_options, skip_instance_cache=True)
        fs.mkdir("gone")
        fs.put(str(src), "gone/vols", recursive=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainfeed.converters", "abfs://gone/vols", str(tmp_path / "o.h5"), "--to", "hdf5",
             "--labels", str(fifo), "--storage-option", f"connection_string={server.connection_string}",
             "--no-progress"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        labels = open_for_writing_once_read(fifo, proc)
    finally:
        server.stop()
    started = time.monotonic()
    with labels:
        labels.write((src / "labels.csv").read_text())
    try:
        _, stderr = proc.communicate(timeout=4 * DEFAULT_CALL_TIMEOUT_S)
    finally:
        proc.kill()
    elapsed = time.monotonic() - started
    assert proc.returncode == 1
    assert stderr == (f"error: abfs://gone/vols/v000.npy: the storage did not answer within "
                      f"{DEFAULT_CALL_TIMEOUT_S:g} s (retries included); check that it is reachable, or allow "
                      "longer with --storage-option call_timeout=SECONDS\n")
    assert DEFAULT_CALL_TIMEOUT_S <= elapsed < DEFAULT_CALL_TIMEOUT_S + 15
    assert not (tmp_path / "o.h5").exists()
