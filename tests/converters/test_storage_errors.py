"""Issue #24 item 5 (the parts outside the object-store client): errors say what happened, on
real servers (Azurite, moto's S3) and a relay in front of them that answers HTTP 500.

- a source answering 500 is a failing storage, never "source folder does not exist";
- a bucket / container that does not exist is named as such (not "HTTP 404 for 0 s, retries
  included"), for a source and a destination (before any work);
- a status that is not retried says so, without a retry time;
- an Azure connection string holding a SAS (``BlobEndpoint=...;SharedAccessSignature=...``)
  works: test_hostile_urls.py::test_a_sas_token_in_the_url_becomes_a_storage_option."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.converters.storage.relay import Relay
from tests.test_object_storage import REPO, source

pytestmark = pytest.mark.slow


def cli(module: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def options_cli(options: dict) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "panic" not in done.stderr.lower()
    return lines[0]


@pytest.fixture(params=[pytest.param("azurite", marks=pytest.mark.azurite), pytest.param("s3", marks=pytest.mark.s3)])
def storage(request):
    """(server, scheme, a new bucket with a source folder ``src/`` of 8 volumes, its options)."""
    if request.param == "azurite":
        server = request.getfixturevalue("azurite_server")
        bucket = f"errs-{uuid.uuid4().hex[:12]}"
        server.create_container(bucket)
        scheme = "abfs"
    else:
        server = request.getfixturevalue("s3_server")
        bucket = f"errs-{uuid.uuid4().hex[:12]}"
        server.create_bucket(bucket)
        scheme = "s3"
    return server, scheme, bucket, dict(server.storage_options)


def upload_source(tmp_path: Path, scheme: str, bucket: str, options: dict) -> None:
    from trainfeed.converters.storage.location import locate

    local = tmp_path / "vols"
    source(local, 8)
    fs = locate(f"{scheme}://{bucket}", options).fs
    for f in local.iterdir():
        fs.put_file(str(f), f"{bucket}/src/{f.name}")


def through(relay: Relay, server, scheme: str, options: dict) -> dict:
    if scheme == "abfs":
        return {"connection_string": server.connection_string.replace(server.endpoint, relay.endpoint)}
    return {**options, "endpoint_url": relay.endpoint}


def test_a_source_answering_500_is_a_failing_storage_not_a_missing_folder(storage, tmp_path):
    server, scheme, bucket, options = storage
    upload_source(tmp_path, scheme, bucket, options)
    with Relay(server.endpoint) as relay:
        relay.fail(100_000, 500)
        done = cli("trainfeed.converters", f"{scheme}://{bucket}/src", tmp_path / "o.parquet", "--to", "parquet",
                   "--labels", tmp_path / "vols" / "labels.csv", *options_cli(through(relay, server, scheme, options)),
                   "--storage-option", "call_timeout=2", "--no-progress", cwd=tmp_path)
    line = one_line(done)
    assert done.returncode == 1
    assert "does not exist" not in line and "HTTP 500" in line and f"{scheme}://{bucket}/src" in line, line
    assert "call_timeout=2 s" in line, line  # the time limit as configured
    assert "cannot write" not in line, line  # the source failed, not the local destination
    assert not (tmp_path / "o.parquet").exists()


def test_a_missing_bucket_is_named(storage, tmp_path):
    _server, scheme, bucket, options = storage
    upload_source(tmp_path, scheme, bucket, options)
    what = "container" if scheme == "abfs" else "bucket"
    missing = f"nosuch-{uuid.uuid4().hex[:8]}"
    runs = {
        "source": cli("trainfeed.converters", f"{scheme}://{missing}/src", tmp_path / "o.parquet", "--to", "parquet",
                      "--labels", tmp_path / "vols" / "labels.csv", *options_cli(options), "--no-progress",
                      cwd=tmp_path),
        "destination": cli("trainfeed.converters", tmp_path / "vols", f"{scheme}://{missing}/o.parquet", "--to",
                           "parquet", "--labels", tmp_path / "vols" / "labels.csv", *options_cli(options),
                           "--no-progress", cwd=tmp_path),
    }
    for role, done in runs.items():
        line = one_line(done)
        assert done.returncode == 1, (role, line)
        url = f"{scheme}://{missing}/src" if role == "source" else f"{scheme}://{missing}/o.parquet"
        assert f"error: {url}: {what} {missing!r} not found" in line, (role, line)
        assert "for 0 s" not in line and "retries included" not in line, (role, line)
    # a missing folder in a bucket that exists is still that
    done = cli("trainfeed.converters", f"{scheme}://{bucket}/nope", tmp_path / "o.parquet", "--to", "parquet",
               "--labels", tmp_path / "vols" / "labels.csv", *options_cli(options), "--no-progress", cwd=tmp_path)
    assert done.returncode == 1 and f"{scheme}://{bucket}/nope: source folder does not exist" in one_line(done)


def test_an_error_status_that_is_not_retried_is_not_said_to_be(storage, tmp_path):
    """HTTP 400 comes back at once: the message gives the status (and the storage's error
    code when the answer has a body; a HEAD's has none), no retry time, and blames the source,
    not the local destination."""
    server, scheme, bucket, options = storage
    upload_source(tmp_path, scheme, bucket, options)
    with Relay(server.endpoint) as relay:
        relay.fail(100_000, 400)
        done = cli("trainfeed.converters", f"{scheme}://{bucket}/src", tmp_path / "o.parquet", "--to", "parquet",
                   "--labels", tmp_path / "vols" / "labels.csv", *options_cli(through(relay, server, scheme, options)),
                   "--no-progress", cwd=tmp_path)
    line = one_line(done)
    assert done.returncode == 1
    assert line.startswith(f"error: {scheme}://{bucket}/src: the storage answered HTTP 400"), line
    assert "retried" not in line and "retries" not in line and "cannot write" not in line, line


def put_with_another_tool(server, scheme: str, bucket: str, key: str, data: bytes) -> None:
    """Write an object the way another tool would (Azure's SDK, botocore): trainfeed's client
    refuses to write such names at all."""
    if scheme == "abfs":
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(server.connection_string).get_container_client(bucket).upload_blob(
            key, data)
        return
    import botocore.session

    from trainfeed.benchmarks.emulators import s3server

    botocore.session.get_session().create_client(
        "s3", endpoint_url=server.storage_options["endpoint_url"], region_name="us-east-1",
        aws_access_key_id=s3server.ACCESS_KEY, aws_secret_access_key=s3server.SECRET_KEY,
    ).put_object(Bucket=bucket, Key=key, Body=data)


def test_an_object_name_the_client_cannot_use_is_named(storage, tmp_path):
    """One key with a newline (a tab on moto), written by another tool: before issue #24 the whole folder was
    "the storage did not answer within 30 s" (after 1-3 s). Now the object is named, at once."""
    server, scheme, bucket, options = storage
    upload_source(tmp_path, scheme, bucket, options)
    odd = "src/odd\nname.npy" if scheme == "abfs" else "src/odd\tname.npy"  # moto cannot store a newline
    put_with_another_tool(server, scheme, bucket, odd, (tmp_path / "vols" / "v000.npy").read_bytes())
    done = cli("trainfeed.converters", f"{scheme}://{bucket}/src", tmp_path / "o.parquet", "--to", "parquet",
               "--labels", tmp_path / "vols" / "labels.csv", *options_cli(options), "--no-progress", cwd=tmp_path)
    line = one_line(done)
    assert done.returncode == 1
    assert "did not answer" not in line and repr(odd) in line and "rename or remove" in line, line
    assert not (tmp_path / "o.parquet").exists()


def test_a_storage_that_hangs_at_open_is_said_to_not_answer(storage, tmp_path):
    """``train`` on a store whose storage stops answering (every request held by the relay),
    with ``call_timeout=3``: before issue #24, "unexpected FSTimeoutError" after 13-15 s."""
    server, scheme, bucket, options = storage
    upload_source(tmp_path, scheme, bucket, options)
    url = f"{scheme}://{bucket}/store.parquet"
    made = cli("trainfeed.converters", f"{scheme}://{bucket}/src", url, "--to", "parquet", "--labels",
               tmp_path / "vols" / "labels.csv", *options_cli(options), "--no-progress", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    with Relay(server.endpoint) as relay:
        relay.stall()
        done = cli("trainfeed.training", "--data", url, *options_cli(through(relay, server, scheme, options)),
                   "--storage-option", "call_timeout=3", "--epochs", "1", "--no-progress", "--out", tmp_path / "run",
                   cwd=tmp_path)
    line = one_line(done)
    assert done.returncode == 1
    assert "unexpected" not in line and "did not answer within 3 s" in line and url.rsplit("/", 1)[0] in line, line
