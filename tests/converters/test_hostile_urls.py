"""Issue #24 item 4: every path a user gives goes through one parser, before any work, so that
a URL means one place. Real servers: Azurite and moto's S3 server.

- ``s3:/bucket/x`` (one slash) is an error naming ``s3://bucket/x``, never a local folder ``./s3:``;
- a space (or any character a host cannot hold) in the bucket is an error, never a Rust panic;
- ``?`` and ``#`` in a store URL are refused (the Delta log would go under one prefix and the
  data under another), except an Azure SAS token, moved into the storage options: never part
  of an object name, never printed;
- ``%`` in a Delta table's URL is refused (delta-rs decodes it, the object client does not):
  a table's log and data are always under one prefix."""
from __future__ import annotations

import datetime
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.test_object_storage import REPO, SMALL, labels, rows_of_batches, source, truth_rows

pytestmark = pytest.mark.slow


def cli(module: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def options_cli(options: dict) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]


def keys(root: str, options: dict) -> list[str]:
    """Every object under ``root`` (scheme://bucket), as keys."""
    from trainfeed.converters.storage.location import locate

    loc = locate(root, options)
    return sorted(p[len(loc.path) + 1:] for p in loc.fs.find(loc.path))


def read_rows(url: str, options: dict) -> list:
    import trainfeed

    store = trainfeed.open_store(url, storage_options=options)
    return sorted(rows_of_batches(store.batches(batch_size=7, shuffle=False, drop_last=False)))


@pytest.fixture
def container(azurite_server) -> str:
    name = f"urls-{uuid.uuid4().hex[:12]}"
    azurite_server.create_container(name)
    return name


@pytest.fixture
def bucket(s3_server) -> str:
    name = f"urls-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


@pytest.mark.s3
@pytest.mark.parametrize("command", ["convert", "train"])
def test_a_scheme_with_one_slash_is_an_error_not_a_local_folder(s3_server, bucket, tmp_path, command):
    src = tmp_path / "src"
    source(src, 8)
    work = tmp_path / "cwd"
    work.mkdir()
    if command == "convert":
        done = cli("trainfeed.converters", src, f"s3:/{bucket}/x.parquet", "--to", "parquet", *labels(src),
                   *options_cli(s3_server.storage_options), "--no-progress", cwd=work)
    else:
        done = cli("trainfeed.training", "--data", f"s3:/{bucket}/x.parquet", *options_cli(s3_server.storage_options),
                   "--epochs", "1", "--no-progress", cwd=work)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"s3://{bucket}/x.parquet" in lines[0], done.stderr
    assert list(work.iterdir()) == []  # no ./s3: folder
    assert keys(f"s3://{bucket}", s3_server.storage_options) == []


@pytest.mark.s3
@pytest.mark.parametrize("url", ["s3://{b} /x.parquet", "s3:// {b}/x.parquet", "s3://{b}%20/x.parquet",
                                 "s3://{b}^/x.parquet", "s3:///x.parquet"])
def test_a_bad_bucket_name_is_an_error_not_a_panic(s3_server, bucket, tmp_path, url):
    src = tmp_path / "src"
    source(src, 8)
    for args in ([src, url.format(b=bucket), "--to", "parquet", *labels(src)],
                 [url.format(b=bucket), tmp_path / "o", "--to", "parquet"]):
        done = cli("trainfeed.converters", *args, *options_cli(s3_server.storage_options), "--no-progress",
                   cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and ("bucket" in lines[0]), done.stderr
        assert "panic" not in done.stderr.lower() and "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()
    assert keys(f"s3://{bucket}", s3_server.storage_options) == []


@pytest.mark.azurite
@pytest.mark.s3
@pytest.mark.parametrize("backend", ["azurite", "s3"])
@pytest.mark.parametrize("name", ["dst/q?x.delta", "dst/q#x.delta", "dst/q?x.parquet"])
def test_a_query_or_fragment_in_a_store_url_is_refused(request, tmp_path, backend, name):
    """Before issue #24 a Delta table at ``dst/q?x.delta`` was written with its parts under
    ``dst/q?x.delta/`` and its log under ``dst/q/``, and exit 0."""
    if backend == "azurite":
        server, root = request.getfixturevalue("azurite_server"), f"abfs://{request.getfixturevalue('container')}"
    else:
        server, root = request.getfixturevalue("s3_server"), f"s3://{request.getfixturevalue('bucket')}"
    src = tmp_path / "src"
    source(src, 8)
    fmt = name.rsplit(".", 1)[1]
    done = cli("trainfeed.converters", src, f"{root}/{name}", "--to", fmt, *labels(src),
               *options_cli(server.storage_options), "--no-progress", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and ("query string" in lines[0] or "'#'" in lines[0]), done.stderr
    assert keys(root, server.storage_options) == []


def container_sas(azurite_server, container: str) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    from trainfeed.benchmarks.emulators.azurite import ACCOUNT, ACCOUNT_KEY

    return generate_container_sas(ACCOUNT, container, account_key=ACCOUNT_KEY,
                                  permission=ContainerSasPermissions(read=True, write=True, delete=True, list=True,
                                                                     add=True, create=True),
                                  expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1))


@pytest.mark.azurite
@pytest.mark.parametrize("fmt,name", [("parquet", "q.parquet"), ("delta", "q.delta"), ("hdf5", "q.h5")])
def test_a_sas_token_in_the_url_becomes_a_storage_option(azurite_server, container, tmp_path, fmt, name):
    """``abfs://c/q.parquet?sv=...&sig=...``, no other credential: the store is written and read
    with the token, no object name holds it, and nothing printed shows it."""
    from trainfeed.benchmarks.emulators.azurite import ACCOUNT

    sas = container_sas(azurite_server, container)
    signature = next(p for p in sas.split("&") if p.startswith("sig=")).split("=", 1)[1]
    src = tmp_path / "src"
    truth = source(src, 24, seed=3)
    anonymous = {"account_name": ACCOUNT, "endpoint": azurite_server.endpoint}
    url = f"abfs://{container}/{name}?{sas}"
    done = cli("trainfeed.converters", src, url, "--to", fmt, *labels(src), *SMALL, *options_cli(anonymous),
               "--no-progress", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    assert signature not in printed and "sig=" not in printed, printed
    objects = keys(f"abfs://{container}", azurite_server.storage_options)
    assert objects and all(k == name or k.startswith(name + "/") for k in objects), objects
    assert not any("?" in k or "sig" in k or "sv=" in k for k in objects), objects
    assert read_rows(url, anonymous) == truth_rows(truth)
    # and a connection string holding a SAS (issue #24 item 5: "Account must be specified" before)
    sas_conn = {"connection_string": f"BlobEndpoint={azurite_server.endpoint};SharedAccessSignature={sas}"}
    assert read_rows(f"abfs://{container}/{name}", sas_conn) == truth_rows(truth)
    again = cli("trainfeed.converters", src, f"abfs://{container}/b-{name}", "--to", fmt, *labels(src), *SMALL,
                *options_cli(sas_conn), "--no-progress", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert signature not in again.stdout + again.stderr
    assert read_rows(f"abfs://{container}/b-{name}", sas_conn) == truth_rows(truth)


@pytest.mark.azurite
@pytest.mark.s3
@pytest.mark.parametrize("backend", ["azurite", "s3"])
def test_a_delta_table_keeps_its_log_beside_its_data(request, tmp_path, backend):
    """delta-rs decodes %XX in a table URL (twice, on some paths), the object client does not:
    before issue #24, ``q%41 x.delta`` had its parts there and its log under ``qA x.delta``, and
    the run failed reading it back. ``%`` is refused before any work; a space or ``+`` is a
    name like any other, the log beside the data."""
    if backend == "azurite":
        server, root = request.getfixturevalue("azurite_server"), f"abfs://{request.getfixturevalue('container')}"
    else:
        server, root = request.getfixturevalue("s3_server"), f"s3://{request.getfixturevalue('bucket')}"
    src = tmp_path / "src"
    truth = source(src, 24, seed=4)
    refused = cli("trainfeed.converters", src, f"{root}/dst/q%41 x.delta", "--to", "delta", *labels(src), *SMALL,
                  *options_cli(server.storage_options), "--no-progress", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "'%'" in lines[0], refused.stderr
    assert keys(root, server.storage_options) == []
    name = "dst/q x+y.delta"
    done = cli("trainfeed.converters", src, f"{root}/{name}", "--to", "delta", *labels(src), *SMALL,
               *options_cli(server.storage_options), "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    objects = keys(root, server.storage_options)
    assert objects and all(k.startswith(name + "/") for k in objects), objects
    assert any(k.startswith(name + "/_delta_log/") for k in objects), objects
    assert read_rows(f"{root}/{name}", server.storage_options) == truth_rows(truth)
