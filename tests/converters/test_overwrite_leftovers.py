"""Issue #24 item 6: ``convert --overwrite`` removes what trainfeed's own earlier runs left at the
destination, and only that. Real servers (Azurite, moto's S3).

A run killed while ``--verify`` checked an HDF5 file's trial copy (``DST.trainfeed-tmp-<run>``,
uploaded beside DST) left that object behind, and a later clean ``--overwrite`` kept it (42 MB
in the issue's case). Killed runs' parts inside a folder store are covered by
test_object_storage.py::test_killed_before_the_commit_leaves_the_previous_state."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest

from tests.converters.relay import HoldGate
from tests.test_object_storage import REPO, labels, source

pytestmark = pytest.mark.slow


def keys(root: str, options: dict) -> list[str]:
    from trainfeed.converters.storage.location import locate

    loc = locate(root, options)
    return sorted(p[len(loc.path) + 1:] for p in loc.fs.find(loc.path))


@pytest.fixture(params=[pytest.param("azurite", marks=pytest.mark.azurite), pytest.param("s3", marks=pytest.mark.s3)])
def storage(request):
    """(server, root URL of a new bucket, options, the options with the port swapped for ``{port}``)."""
    bucket = f"left-{uuid.uuid4().hex[:12]}"
    if request.param == "azurite":
        server = request.getfixturevalue("azurite_server")
        server.create_container(bucket)
        return server, f"abfs://{bucket}", dict(server.storage_options)
    server = request.getfixturevalue("s3_server")
    server.create_bucket(bucket)
    return server, f"s3://{bucket}", dict(server.storage_options)


def options_cli(options: dict, port_from: int | None = None, port_to: int | None = None) -> list[str]:
    out = []
    for k, v in options.items():
        v = str(v)
        if port_from is not None:
            v = v.replace(f":{port_from}", f":{port_to}")
        out += ["--storage-option", f"{k}={v}"]
    return out


def test_overwrite_removes_a_killed_verify_trial_and_nothing_else(storage, tmp_path):
    server, root, options = storage
    src = tmp_path / "src"
    source(src, 24, seed=8)
    url = f"{root}/store.h5"
    # what is not trainfeed's, though its name looks close: kept
    from trainfeed.converters.storage.location import locate

    fs = locate(root, options).fs
    bucket = root.split("://", 1)[1]
    foreign = ["store.h5.trainfeed-tmp-notarun", "store.h5.bak", "other.h5.trainfeed-tmp-0123abcd"]
    for name in foreign:
        fs.pipe_file(f"{bucket}/{name}", b"not trainfeed's")

    # a run killed while --verify reads its trial copy back
    gate = HoldGate(server.port, rb"^(?:GET|HEAD) \S*/store\.h5\.trainfeed-tmp-[0-9a-f]{8} ")
    proc = subprocess.Popen([sys.executable, "-m", "trainfeed.converters", str(src), url, "--to", "hdf5", "--verify",
                             *labels(src), *options_cli(options, server.port, gate.port), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        while not gate.held.wait(0.2):
            if proc.poll() is not None:
                pytest.fail(f"convert ended (exit {proc.returncode}) before reading its trial: "
                            f"{proc.stderr.read().decode()[-2000:]}")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        gate.close()
    trials = [k for k in keys(root, options) if k.startswith("store.h5.trainfeed-tmp-") and k not in foreign]
    assert len(trials) == 1, keys(root, options)

    done = subprocess.run([sys.executable, "-m", "trainfeed.converters", str(src), url, "--to", "hdf5", "--overwrite",
                           *labels(src), *options_cli(options), "--no-progress"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert keys(root, options) == sorted(["store.h5", *foreign])
    assert all(fs.cat_file(f"{bucket}/{name}") == b"not trainfeed's" for name in foreign)


def uncommitted(server, container: str) -> list[str]:
    """Blobs that have uncommitted blocks only (listed by Azure's SDK; no object store client sees them)."""
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(server.connection_string).get_container_client(container)
    committed = {b.name for b in client.list_blobs()}
    return sorted(b.name for b in client.list_blobs(include=["uncommittedblobs"]) if b.name not in committed)


@pytest.mark.azurite
def test_overwrite_removes_a_killed_block_upload(azurite_server, tmp_path):
    """A part above the 16 MB block size is uploaded in blocks; killed before its block list
    is committed, the blocks stay under the part's name (Azure collects them after 7 days).
    The next clean --overwrite removes them; only the store's own blobs remain."""
    from tests.conftest import write_volumes

    container = f"left-{uuid.uuid4().hex[:12]}"
    azurite_server.create_container(container)
    options = dict(azurite_server.storage_options)
    src = tmp_path / "big"
    write_volumes(src, 24, shape=(64, 64, 64), labels_csv=False)  # 1 MB each
    url = f"abfs://{container}/store.parquet"
    gate = HoldGate(azurite_server.port, rb"^PUT \S*/part-\d{5}-[0-9a-f]{8}\.parquet\?\S*comp=blocklist")
    proc = subprocess.Popen([sys.executable, "-m", "trainfeed.converters", str(src), url, "--to", "parquet",
                             "--target-file-size", "20MB", "--workers", "1",
                             *options_cli(options, azurite_server.port, gate.port), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        while not gate.held.wait(0.2):
            if proc.poll() is not None:
                pytest.fail(f"convert ended (exit {proc.returncode}) before committing a block list: "
                            f"{proc.stderr.read().decode()[-2000:]}")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        gate.close()
    left = uncommitted(azurite_server, container)
    assert len(left) == 1 and left[0].startswith("store.parquet/part-00000-"), left

    done = subprocess.run([sys.executable, "-m", "trainfeed.converters", str(src), url, "--to", "parquet",
                           "--overwrite", *options_cli(options), "--no-progress"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert uncommitted(azurite_server, container) == []
    import json

    manifest = json.loads(locate_fs(options).cat_file(f"{container}/store.parquet/_trainfeed.json"))
    assert keys(f"abfs://{container}", options) == sorted(
        ["store.parquet/_trainfeed.json", *(f"store.parquet/{p['file']}" for p in manifest["parts"])])


def locate_fs(options: dict):
    from trainfeed.converters.storage.location import locate

    return locate("abfs://x", options).fs
