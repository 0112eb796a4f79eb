"""Issue #10: stores written to and trained from object storage, end to end.

Real endpoints only: Azurite (the Azure Blob emulator, ``azurite_server``) and moto's S3
server (a real S3 HTTP API in its own process, ``s3_server``). ``convert`` writes a store to
``abfs://CONTAINER/...`` or ``s3://BUCKET/...``; ``train``, ``trainfeed.open_store`` and the
read engine read it back; every check compares samples bit for bit (id, label, tensor bytes)
with the source files, and reads the store a second way, with plain pyarrow / h5py / deltalake
through fsspec as docs/LAYOUT.md describes, to pin the layout down independently of
trainfeed's reader.

The layout contract on an object store (no renames there):
- Parquet and sharded HDF5: the data parts are uploaded first, the manifest
  (``_trainfeed.json``, the commit record) last; only the parts it lists are read;
  ``--overwrite`` uploads parts with new names and a new manifest, then deletes the old
  generation's parts.
- Delta: the parts, then one delta-rs commit in ``_delta_log/``.
- HDF5 at a URL ending in ``.h5``: a single object.

The kill tests hold the commit deterministically: convert talks to Azurite through a
loopback relay (``CommitGate``) that forwards every request except the first PUT of a
manifest or of a Delta log entry, which it holds until the process is killed. So the kill
always lands after the parts and before the commit, with no timing guess.

Each container / bucket is new per test (a random name), so tests never see each other's
objects.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli, write_volumes
from tests.test_secrets import assert_no_secret, files_under

REPO = Path(__file__).resolve().parent.parent
SHAPE = (4, 6, 5)  # float32: 480 bytes a sample
N = 48
MANIFEST = "_trainfeed.json"
# Several parts (and row groups / HDF5 chunks) even for 48 samples: 4 parts of 12 rows.
SMALL = ["--target-file-size", "6KB", "--row-group-size", "2KB", "--hdf5-chunk-size", "1KB"]
# Many small parts for the kill tests: 12 parts of 4 rows.
TINY = ["--target-file-size", "2KB", "--row-group-size", "1KB", "--hdf5-chunk-size", "1KB"]

# kind -> (--to, name of the store at the URL)
STORES = {"parquet": ("parquet", "store.parquet"), "delta": ("delta", "store.delta"),
          "hdf5": ("hdf5", "store.h5"), "hdf5-shards": ("hdf5", "store_shards")}
DATA_SUFFIX = (".parquet", ".h5")


# ------------------------------------------------------------------ the two object stores

@dataclass
class Backend:
    """One object store: its URL scheme, options for Python (fsspec) and the CLI, the
    secrets that must never appear anywhere, and a fresh fsspec filesystem to inspect it."""

    name: str
    scheme: str
    options: dict
    cli: list[str]
    secrets: tuple[str, ...]
    make_fs: Callable
    make_bucket: Callable[[str], object]

    def fs(self):
        fs = self.make_fs()
        fs.invalidate_cache()
        return fs

    def new_bucket(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.make_bucket(name)
        return name

    def url(self, bucket: str, key: str) -> str:
        return f"{self.scheme}://{bucket}/{key}"

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object in ``bucket``: key -> bytes."""
        fs = self.fs()
        return {p.split("/", 1)[1]: fs.cat_file(p) for p in fs.find(bucket)}

    def delta_options(self) -> dict:
        from trainfeed.converters.storage.config import object_store_options

        return object_store_options(self.scheme, self.options)


def azurite_backend(server) -> Backend:
    import fsspec

    from trainfeed.benchmarks.emulators.azurite import ACCOUNT_KEY

    def make_fs():
        return fsspec.filesystem("abfs", skip_instance_cache=True, **server.storage_options)

    return Backend("azurite", "abfs", dict(server.storage_options),
                   ["--storage-option", f"connection_string={server.connection_string}"],
                   (ACCOUNT_KEY, ACCOUNT_KEY.split("/")[0]), make_fs, lambda name: make_fs().mkdir(name))


def s3_backend(server) -> Backend:
    from trainfeed.benchmarks.emulators.s3server import SECRET_KEY

    return Backend("s3", "s3", dict(server.storage_options), server.cli_options, (SECRET_KEY,), server.filesystem,
                   server.create_bucket)


def get_backend(request, name: str) -> Backend:
    if name == "azurite":
        return azurite_backend(request.getfixturevalue("azurite_server"))
    return s3_backend(request.getfixturevalue("s3_server"))


def on(backend: str, *rest, marks=()):
    """A test parameter running on ``backend``, with that backend's marker."""
    return pytest.param(backend, *rest, marks=[getattr(pytest.mark, "s3" if backend == "s3" else "azurite"), *marks],
                        id="-".join([backend, *map(str, rest)]))


@pytest.fixture
def azure(request) -> Backend:
    return get_backend(request, "azurite")


# ------------------------------------------------------------------ samples, bit for bit

Row = tuple[str, int, bytes]


def truth_rows(truth: dict) -> list[Row]:
    """The source files as sorted (id, label, little-endian tensor bytes)."""
    return sorted((sid, int(label), np.ascontiguousarray(arr, dtype="<f4").tobytes())
                  for sid, (arr, label) in truth.items())


def rows_of_batches(batches) -> list[Row]:
    rows = []
    for b in batches:
        assert b.x.dtype == np.float32 and b.x.shape[1:] == SHAPE, (b.x.dtype, b.x.shape)
        rows += [(sid, int(y), np.ascontiguousarray(x, dtype="<f4").tobytes()) for sid, y, x in zip(b.ids, b.y, b.x)]
    return rows


def read_with_trainfeed(backend: Backend, url: str, **kw) -> tuple[object, list[Row]]:
    """``trainfeed.open_store`` + one shuffled epoch: every sample, sorted."""
    import trainfeed

    store = trainfeed.open_store(url, storage_options=backend.options, **kw)
    rows = rows_of_batches(store.batches(batch_size=7, shuffle=True, seed=3, drop_last=False))
    return store, sorted(rows)


def parquet_rows(data: bytes) -> list[Row]:
    t = pq.read_table(pa.BufferReader(data))
    return list(zip(t["id"].to_pylist(), t["label"].to_pylist(), t["volume"].to_pylist()))


def h5_rows(data: bytes) -> list[Row]:
    with h5py.File(io.BytesIO(data), "r") as f:
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in f["id"][:]]
        tensors = (np.ascontiguousarray(v, "<f4").tobytes() for v in f["volume"][:])
        return list(zip(ids, f["label"][:].tolist(), tensors))


@dataclass
class Contents:
    rows: list[Row]  # sorted
    referenced: set[str]  # keys (in the bucket) that make up the store: commit records and data parts
    parts: set[str]  # the data parts among them
    under: set[str]  # every key at or under the store's key


def read_independently(backend: Backend, bucket: str, key: str, kind: str) -> Contents:
    """Read the store with plain pyarrow / h5py / deltalake as docs/LAYOUT.md describes, never
    listing its folder for data: the manifest's parts, the Delta log's live files, or the one
    .h5 object."""
    objects = backend.objects(bucket)
    under = {k for k in objects if k == key or k.startswith(key + "/")}
    if kind == "hdf5":
        assert key in objects, f"no object at {key}; the bucket holds {sorted(objects)}"
        return Contents(sorted(h5_rows(objects[key])), {key}, {key}, under)
    if kind == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(backend.url(bucket, key), storage_options=backend.delta_options())
        prefix = f"{backend.scheme}://{bucket}/"
        parts = {uri.removeprefix(prefix) for uri in table.file_uris()}
        assert all(p.startswith(key + "/") for p in parts), parts
        log = {k for k in under if k.startswith(f"{key}/_delta_log/")}
        rows = [r for p in sorted(parts) for r in parquet_rows(objects[p])]
        return Contents(sorted(rows), log | parts, parts, under)
    manifest_key = f"{key}/{MANIFEST}"
    assert manifest_key in objects, f"no manifest at {manifest_key}; the bucket holds {sorted(objects)}"
    manifest = json.loads(objects[manifest_key])
    assert manifest["writer"].startswith("trainfeed ") and manifest["format"] == STORES[kind][0], manifest
    parts = [f"{key}/{p['file']}" for p in manifest["parts"]]
    decode = h5_rows if kind == "hdf5-shards" else parquet_rows
    rows = [r for p in parts for r in decode(objects[p])]
    assert [p["rows"] for p in manifest["parts"]] == [len(decode(objects[p])) for p in parts]
    assert manifest["schema"]["samples"] == len(rows)
    return Contents(sorted(rows), {manifest_key, *parts}, set(parts), under)


# ------------------------------------------------------------------ running the CLIs

def convert(src, url: str, kind: str, backend: Backend, *extra) -> object:
    """``convert SRC URL --to ...`` in-process, with the backend's storage options."""
    from trainfeed.converters.cli import app

    return run_cli(app, src, url, "--to", STORES[kind][0], *backend.cli, *extra, "--no-progress")


def train(url: str, backend: Backend, out: Path, *extra) -> object:
    from trainfeed.training.cli import app

    return run_cli(app, "--data", url, *backend.cli, "--epochs", "1", "--steps-per-epoch", "2", "--width", "4",
                   "--batch-size", "8", "--workers", "2", "--out", out, "--json", *extra, "--no-progress")


def command(module: str, *args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """A console command in its own process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def source(root: Path, n: int = N, seed: int = 0, *, prefix: str = "v", bad: str | None = None) -> dict:
    """n volumes with labels.csv under ``root``; ids ``{prefix}000``...; ``bad``: the id of a
    file then truncated (kept in labels.csv). Returns the truth of the valid files."""
    truth = write_volumes(root, n, shape=SHAPE, seed=seed)
    if prefix != "v":
        for sid in list(truth):
            new = prefix + sid[1:]
            (root / f"{sid}.npy").rename(root / f"{new}.npy")
            truth[new] = truth.pop(sid)
        with open(root / "labels.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "label"])
            w.writerows((sid, lab) for sid, (_, lab) in truth.items())
    if bad is not None:
        path = root / f"{bad}.npy"
        path.write_bytes(path.read_bytes()[:100])
        del truth[bad]
    return truth


def labels(root: Path) -> list[str]:
    return ["--labels", str(root / "labels.csv")]


def assert_not_a_store(backend: Backend, url: str, kind: str) -> None:
    """Nothing at ``url`` opens as a store: with the format forced, the reader says there is
    no (complete) store; detected, it refuses too (what it says then is
    ``test_open_store_says_the_url_holds_no_complete_store``'s concern)."""
    import trainfeed
    from trainfeed.converters.errors import TrainfeedError

    with pytest.raises(TrainfeedError, match="not found|not a complete|not a Delta table"):
        trainfeed.open_store(url, storage_options=backend.options, format=STORES[kind][0])
    with pytest.raises(TrainfeedError):
        trainfeed.open_store(url, storage_options=backend.options)


def commits(keys) -> list[str]:
    return sorted(k for k in keys if k.endswith(MANIFEST) or "/_delta_log/" in k)


# ------------------------------------------------------------------ 0. the servers themselves

@pytest.mark.s3
def test_moto_server_takes_conditional_puts_and_delta_rs_commits_with_trainfeeds_options(request):
    """What delta-rs needs from an S3 endpoint: moto refuses a second If-None-Match: * PUT
    (how delta-rs commits a version on S3 without a rename), and a table written and appended
    through ``object_store_options("s3", ...)`` reads back."""
    import botocore.exceptions
    import botocore.session
    from deltalake import DeltaTable, write_deltalake

    from trainfeed.benchmarks.emulators import s3server

    s3 = get_backend(request, "s3")
    opts = s3.delta_options()
    endpoint = s3.options["endpoint_url"]
    assert {k: v for k, v in opts.items() if k != "aws_secret_access_key"} == {
        "aws_access_key_id": s3server.ACCESS_KEY, "aws_endpoint_url": endpoint, "aws_region": "us-east-1",
        "allow_http": "true", "conditional_put": "etag"}
    assert opts["aws_secret_access_key"] == s3server.SECRET_KEY
    bucket = s3.new_bucket("delta")
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=s3server.ACCESS_KEY,
        aws_secret_access_key=s3server.SECRET_KEY)
    client.put_object(Bucket=bucket, Key="once", Body=b"first", IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError, match="PreconditionFailed"):
        client.put_object(Bucket=bucket, Key="once", Body=b"second", IfNoneMatch="*")
    assert client.get_object(Bucket=bucket, Key="once")["Body"].read() == b"first"

    url = s3.url(bucket, "t")
    write_deltalake(url, pa.table({"id": ["a", "b"], "x": [1, 2]}), storage_options=opts)
    write_deltalake(url, pa.table({"id": ["c"], "x": [3]}), storage_options=opts, mode="append")
    table = DeltaTable(url, storage_options=opts)
    assert table.version() == 1
    assert sorted(zip(*table.to_pyarrow_table().to_pydict().values())) == [("a", 1), ("b", 2), ("c", 3)]
    assert commits(s3.objects(bucket)) == ["t/_delta_log/00000000000000000000.json",
                                           "t/_delta_log/00000000000000000001.json"]


# ------------------------------------------------------------------ 1. round trips, every format

ROUND_TRIPS = [pytest.param((b, k), marks=getattr(pytest.mark, "s3" if b == "s3" else "azurite"), id=f"{b}-{k}")
               for b in ("azurite", "s3") for k in STORES]


@dataclass
class Converted:
    backend: Backend
    bucket: str
    key: str
    kind: str
    url: str
    truth: dict
    result: object  # the convert run


@pytest.fixture(scope="module", params=ROUND_TRIPS)
def converted(request, tmp_path_factory) -> Converted:
    """48 volumes converted (``--verify``) from a local folder to a new bucket, once per
    (object store, format) for the tests below."""
    backend_name, kind = request.param
    backend = get_backend(request, backend_name)
    src = tmp_path_factory.mktemp("src") / "vols"
    truth = source(src, seed=1)
    bucket = backend.new_bucket("rt")
    key = STORES[kind][1]
    url = backend.url(bucket, key)
    res = convert(src, url, kind, backend, *labels(src), *SMALL, "--verify", "--json")
    return Converted(backend, bucket, key, kind, url, truth, res)


def test_convert_writes_the_documented_layout(converted):
    c = converted
    assert c.result.exit_code == 0, c.result.stderr
    summary = json.loads(c.result.stdout)
    assert (summary["format"], summary["samples"], summary["rejected"]) == (STORES[c.kind][0], N, 0)
    assert summary["verified"] == {"samples_checked": N, "other_rows": 0}
    got = read_independently(c.backend, c.bucket, c.key, c.kind)
    assert got.rows == truth_rows(c.truth)
    if c.kind != "hdf5":
        assert len(got.parts) > 1, f"expected several parts with {SMALL}, got {sorted(got.parts)}"
    # the store is exactly its commit records and the parts they reference; nothing else is
    # left in the bucket (no staging copy, lock or orphan part)
    assert set(c.backend.objects(c.bucket)) == got.referenced
    if c.kind == "delta":
        assert commits(got.referenced) == [f"{c.key}/_delta_log/00000000000000000000.json"]


def test_open_store_reads_every_sample_bit_for_bit(converted):
    c = converted
    assert c.result.exit_code == 0, c.result.stderr
    store, rows = read_with_trainfeed(c.backend, c.url)
    assert (store.format, store.samples, store.shape, store.dtype) == (STORES[c.kind][0], N, SHAPE, "float32")
    assert rows == truth_rows(c.truth)


def test_each_piece_is_requested_ahead_and_decoded_from_that_request(converted, monkeypatch):
    """On object storage the reader asks for a piece's bytes before it decodes the piece, so that
    requests stay in flight across pieces: in every format, each span asked for ahead is the
    one that piece's read then takes, once (none requested twice, none left unused)."""
    from trainfeed.converters.storage.fetch import Fetcher

    c = converted
    asked, taken = [], []
    ahead, fetch = Fetcher.ahead, Fetcher.fetch
    monkeypatch.setattr(Fetcher, "ahead", lambda self, *span: (asked.append(span), ahead(self, *span))[1])
    monkeypatch.setattr(Fetcher, "fetch", lambda self, *span: (taken.append(span), fetch(self, *span))[1])
    store, rows = read_with_trainfeed(c.backend, c.url)
    assert rows == truth_rows(c.truth)
    assert len(set(asked)) == len(asked) == len(store.reader.pieces)  # one request ahead per piece
    assert all(taken.count(span) == 1 for span in asked), [span for span in asked if taken.count(span) != 1]


def test_train_from_object_storage(converted, tmp_path):
    c = converted
    assert c.result.exit_code == 0, c.result.stderr
    res = train(c.url, c.backend, tmp_path / "out")
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["format"], summary["steps"], summary["sample_shape"]) == (STORES[c.kind][0], 2, list(SHAPE))
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["steps"] == 2


@pytest.mark.azurite
def test_remote_source_labels_and_destination_share_the_storage_options(azure, tmp_path):
    """SRC, --labels and DST all on the blob store, one set of --storage-option for the three."""
    src = tmp_path / "vols"
    truth = source(src, 40, seed=2)
    bucket = azure.new_bucket("remote-src")
    azure.fs().put(str(src), f"{bucket}/vols", recursive=True)
    uploaded = azure.objects(bucket)
    res = convert(azure.url(bucket, "vols"), azure.url(bucket, "out.parquet"), "parquet", azure,
                  "--labels", azure.url(bucket, "vols/labels.csv"), *SMALL, "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["source"] == azure.url(bucket, "vols")
    got = read_independently(azure, bucket, "out.parquet", "parquet")
    assert got.rows == truth_rows(truth)
    assert read_with_trainfeed(azure, azure.url(bucket, "out.parquet"))[1] == truth_rows(truth)
    after = azure.objects(bucket)
    assert {k: v for k, v in after.items() if k.startswith("vols/")} == uploaded  # the source untouched
    assert set(after) == set(uploaded) | got.referenced


# ------------------------------------------------------------------ 2. overwrite and append

@pytest.mark.parametrize("backend_name, kind", [
    on("azurite", "parquet"), on("azurite", "delta"), on("azurite", "hdf5"), on("azurite", "hdf5-shards"),
    on("s3", "parquet"), on("s3", "delta"), on("s3", "hdf5-shards")])
def test_overwrite_writes_a_new_generation_and_removes_the_old(request, tmp_path, backend_name, kind):
    """The same ids with other tensors and labels: readers then see only the new samples, the
    new parts have new names, and the old generation's parts are gone (Delta: after
    ``--vacuum-hours 0``)."""
    backend = get_backend(request, backend_name)
    old, new = tmp_path / "old", tmp_path / "new"
    source(old, 40, seed=3)
    new_truth = source(new, 24, seed=4)
    bucket = backend.new_bucket("overwrite")
    key = STORES[kind][1]
    url = backend.url(bucket, key)
    assert convert(old, url, kind, backend, *labels(old), *SMALL).exit_code == 0
    before = read_independently(backend, bucket, key, kind)
    vacuum = ["--vacuum-hours", "0"] if kind == "delta" else []
    res = convert(new, url, kind, backend, *labels(new), *SMALL, "--overwrite", *vacuum)
    assert res.exit_code == 0, res.stderr
    after = read_independently(backend, bucket, key, kind)
    assert after.rows == truth_rows(new_truth)
    assert read_with_trainfeed(backend, url)[1] == truth_rows(new_truth)
    if kind != "hdf5":
        assert not after.parts & before.parts, "an overwrite must not upload a part under an old part's name"
    assert set(backend.objects(bucket)) == after.referenced, "the old generation's parts are still there"
    if kind == "delta":  # one overwrite commit on top of the first (then VACUUM's own commits)
        assert commits(after.referenced)[:2] == [f"{key}/_delta_log/{v:020d}.json" for v in (0, 1)]


@pytest.mark.parametrize("backend_name", [on("azurite"), on("s3")])
def test_delta_append_on_object_storage(request, tmp_path, backend_name):
    from deltalake import DeltaTable

    backend = get_backend(request, backend_name)
    first, more = tmp_path / "a", tmp_path / "b"
    truth = source(first, 24, seed=5)
    truth.update(source(more, 16, seed=6, prefix="w"))
    bucket = backend.new_bucket("append")
    url = backend.url(bucket, "store.delta")
    assert convert(first, url, "delta", backend, *labels(first), *SMALL).exit_code == 0
    res = convert(more, url, "delta", backend, *labels(more), *SMALL, "--mode", "append")
    assert res.exit_code == 0, res.stderr
    assert DeltaTable(url, storage_options=backend.delta_options()).version() == 1
    assert read_independently(backend, bucket, "store.delta", "delta").rows == truth_rows(truth)
    assert read_with_trainfeed(backend, url)[1] == truth_rows(truth)


# ------------------------------------------------------------------ 3. the read cache

def cache_usage(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())


@pytest.mark.azurite
@pytest.mark.parametrize("kind", ["parquet", "delta", "hdf5-shards"])
def test_cache_dir_serves_epochs_once_the_objects_are_gone(azure, tmp_path, kind):
    """The read engine with ``cache_dir``: epoch 0 fills the cache (within ``cache_limit``);
    with the data parts then deleted from the store, the opened store reads epoch 0 again (the
    same batches, bit for bit) and epoch 1 (every sample) from the cache."""
    from trainfeed.converters.formats.options import OpenOptions
    from trainfeed.converters.storage.cache_writer import flush_cache_writes
    from trainfeed.training.reading.readers import EpochOptions, iter_batches, open_store

    src = tmp_path / "vols"
    truth = source(src, 40, seed=7)
    bucket = azure.new_bucket("cache")
    key = STORES[kind][1]
    url = azure.url(bucket, key)
    assert convert(src, url, kind, azure, *labels(src), *SMALL).exit_code == 0
    cache, limit = tmp_path / "cache", 10 * 10**6
    opts = EpochOptions(batch_size=8, shuffle=True, seed=5)
    store = open_store(url, opts=OpenOptions(storage_options=azure.options, io_concurrency=4, cache_dir=str(cache),
                                             cache_limit=limit))
    first = rows_of_batches(iter_batches(store, opts, epoch=0))
    assert sorted(first) == truth_rows(truth)
    flush_cache_writes()  # written behind the reads: finished shortly after the epoch
    assert 0 < cache_usage(cache) <= limit
    parts = read_independently(azure, bucket, key, kind).parts
    azure.fs().rm([f"{bucket}/{p}" for p in sorted(parts)])
    assert not parts & set(azure.objects(bucket))
    assert rows_of_batches(iter_batches(store, opts, epoch=0)) == first
    assert sorted(rows_of_batches(iter_batches(store, opts, epoch=1))) == truth_rows(truth)


@pytest.mark.azurite
def test_a_cache_smaller_than_the_store_stays_within_its_limit(azure, tmp_path):
    from trainfeed.converters.formats.options import OpenOptions
    from trainfeed.training.reading.readers import EpochOptions, iter_batches, open_store

    src = tmp_path / "vols"
    truth = source(src, 48, seed=8)
    bucket = azure.new_bucket("small-cache")
    url = azure.url(bucket, "store.parquet")
    assert convert(src, url, "parquet", azure, *labels(src), *TINY).exit_code == 0
    store_bytes = sum(len(v) for k, v in azure.objects(bucket).items() if k.endswith(".parquet"))
    cache, limit = tmp_path / "cache", store_bytes // 3
    opts = EpochOptions(batch_size=8, shuffle=True, seed=1)
    store = open_store(url, opts=OpenOptions(storage_options=azure.options, io_concurrency=4, cache_dir=str(cache),
                                             cache_limit=limit))
    for epoch in (0, 1):
        assert sorted(rows_of_batches(iter_batches(store, opts, epoch=epoch))) == truth_rows(truth)
        assert cache_usage(cache) <= limit


@pytest.mark.azurite
def test_train_cli_keeps_its_cache_within_the_limit(azure, tmp_path):
    """``train --cache-dir --cache-limit`` over two epochs: every step runs, and the cache holds
    what was read, within its limit."""
    src = tmp_path / "vols"
    source(src, 40, seed=17)
    bucket = azure.new_bucket("train-cache")
    url = azure.url(bucket, "store.parquet")
    assert convert(src, url, "parquet", azure, *labels(src), *TINY).exit_code == 0
    cache = tmp_path / "cache"
    res = run_cli(__import__("trainfeed.training.cli", fromlist=["app"]).app, "--data", url, *azure.cli,
                  "--epochs", "2", "--width", "4", "--batch-size", "8", "--workers", "2", "--io-concurrency", "4",
                  "--cache-dir", cache, "--cache-limit", "12KB", "--out", tmp_path / "out", "--json", "--no-progress")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["steps"] == 2 * (40 // 8)
    assert 0 < cache_usage(cache) <= 12_000


# ------------------------------------------------------------------ 4. safety, as locally

def plant(backend: Backend, bucket: str, key: str, what: str) -> None:
    fs = backend.fs()
    if what == "object":  # a file where the store would go
        fs.pipe_file(f"{bucket}/{key}", b"my thesis, not a store\n")
    elif what == "folder":  # someone's folder, holding a Parquet file trainfeed did not write
        fs.pipe_file(f"{bucket}/{key}/notes.txt", b"keep me\n")
        buf = pa.BufferOutputStream()
        pq.write_table(pa.table({"id": ["x"], "value": [1.5]}), buf)
        fs.pipe_file(f"{bucket}/{key}/data.parquet", buf.getvalue().to_pybytes())
    elif what == "delta-table":  # a Delta table another tool wrote
        from deltalake import write_deltalake

        write_deltalake(backend.url(bucket, key), pa.table({"id": ["x"], "value": [1.5]}),
                        storage_options=backend.delta_options())
    else:
        raise ValueError(what)


FOREIGN = ([on("azurite", kind, what) for kind in STORES for what in ("object", "folder")]
           + [on("azurite", kind, "delta-table") for kind in ("parquet", "delta")]
           + [on("s3", kind, what) for kind in ("parquet", "delta") for what in ("object", "folder")])


@pytest.mark.parametrize("mode", ["create", "overwrite"])
@pytest.mark.parametrize("backend_name, kind, foreign", FOREIGN)
def test_what_trainfeed_did_not_write_is_refused_and_left_untouched(request, volumes, backend_name, kind, foreign,
                                                                    mode):
    backend = get_backend(request, backend_name)
    src, _ = volumes
    bucket = backend.new_bucket("foreign")
    key = STORES[kind][1]
    url = backend.url(bucket, key)
    plant(backend, bucket, key, foreign)
    before = backend.objects(bucket)
    res = convert(src, url, kind, backend, *(["--overwrite"] if mode == "overwrite" else []))
    assert res.exit_code == 1, (res.exit_code, res.stdout, res.stderr)
    assert res.stderr.startswith(f"error: {url}: "), res.stderr
    assert ("already exists" if mode == "create" else "refusing to replace it") in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert backend.objects(bucket) == before


BAD_RUNS = [on("azurite", kind) for kind in STORES] + [on("s3", kind) for kind in ("parquet", "delta")]


@pytest.mark.parametrize("backend_name, kind", BAD_RUNS)
def test_a_bad_source_file_publishes_nothing(request, tmp_path, backend_name, kind):
    """--on-error fail (the default) with the last file truncated: parts were uploaded by
    then, yet no manifest or commit appears, nothing opens, and nothing is left behind."""
    backend = get_backend(request, backend_name)
    src = tmp_path / "vols"
    source(src, 40, seed=9, bad="v039")
    bucket = backend.new_bucket("bad-src")
    url = backend.url(bucket, STORES[kind][1])
    res = convert(src, url, kind, backend, *labels(src), *TINY)
    assert res.exit_code == 1 and "v039.npy" in res.stderr, res.stderr
    left = backend.objects(bucket)
    assert commits(left) == []
    assert sorted(left) == [], "a failed run left objects behind"
    assert_not_a_store(backend, url, kind)


@pytest.mark.azurite
def test_open_store_says_the_url_holds_no_complete_store(azure, tmp_path):
    """``trainfeed.open_store(URL)`` (format detected) on a URL with nothing there, or with only
    the parts a killed conversion uploaded (no manifest, no Delta commit), says that there is
    no complete store there, rather than reading the URL as a folder of sample files."""
    import trainfeed
    from trainfeed.converters.errors import TrainfeedError

    src = tmp_path / "vols"
    source(src, 16, seed=16)
    bucket = azure.new_bucket("no-store")
    fs = azure.fs()
    urls = [azure.url(bucket, "nothing.parquet"), azure.url(bucket, "nothing.h5")]
    for kind in ("parquet", "delta", "hdf5-shards"):
        local = tmp_path / kind / STORES[kind][1]
        local.parent.mkdir()
        assert convert(src, local, kind, azure, *labels(src), *TINY).exit_code == 0
        for part in sorted(p for p in local.iterdir() if p.suffix in DATA_SUFFIX):  # the parts only
            fs.pipe_file(f"{bucket}/{STORES[kind][1]}/{part.name}", part.read_bytes())
        urls.append(azure.url(bucket, STORES[kind][1]))
    said = {}
    for url in urls:
        with pytest.raises(TrainfeedError) as err:
            trainfeed.open_store(url, storage_options=azure.options)
        said[url] = str(err.value)
    assert {u: m for u, m in said.items() if not re.search("not found|not a complete store", m)} == {}


@pytest.mark.parametrize("backend_name, kind", BAD_RUNS)
def test_a_failed_overwrite_keeps_the_old_store(request, tmp_path, backend_name, kind):
    backend = get_backend(request, backend_name)
    old, bad = tmp_path / "old", tmp_path / "bad"
    old_truth = source(old, 24, seed=10)
    source(bad, 40, seed=11, bad="v039")
    bucket = backend.new_bucket("bad-overwrite")
    key = STORES[kind][1]
    url = backend.url(bucket, key)
    assert convert(old, url, kind, backend, *labels(old), *SMALL).exit_code == 0
    before = backend.objects(bucket)
    res = convert(bad, url, kind, backend, *labels(bad), *TINY, "--overwrite")
    assert res.exit_code == 1 and "v039.npy" in res.stderr, res.stderr
    assert read_with_trainfeed(backend, url)[1] == truth_rows(old_truth)
    assert read_independently(backend, bucket, key, kind).rows == truth_rows(old_truth)
    assert backend.objects(bucket) == before, "a failed overwrite changed or left objects in the bucket"


# ------------------------------------------------------------------ 5. killed with SIGKILL

class CommitGate:
    """A loopback relay to a storage endpoint that forwards every HTTP request except the
    first whose request line matches ``pattern``: that one (the commit) it holds, unsent,
    until the client goes away. Clients here do not pipeline, so each request starts a read."""

    _REQUEST_LINE = re.compile(rb"(?:GET|PUT|POST|HEAD|DELETE|PATCH|OPTIONS) \S+ HTTP/1\.[01]\r\n")

    def __init__(self, upstream_port: int, pattern: bytes):
        self.upstream = ("127.0.0.1", upstream_port)
        self.pattern = re.compile(pattern)
        self.held = threading.Event()
        self.held_line = b""
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.upstream)
            except OSError:
                return
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        pending = b""
        try:
            while data := client.recv(1 << 16):
                data, pending = pending + data, b""
                if re.match(rb"[A-Z]+ ", data[:16]) and b"\r\n" not in data and len(data) < 8192:
                    pending = data  # a request line cut short: read the rest of it first
                    continue
                for line in self._REQUEST_LINE.finditer(data):
                    if self.pattern.search(line.group(0)):
                        upstream.sendall(data[:line.start()])
                        self.held_line = line.group(0).strip()
                        self.held.set()
                        while client.recv(1 << 16):  # held: never forwarded
                            pass
                        return
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _responses(upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(1 << 16):
                client.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()


# The commit: a PUT of the manifest (or anything named after it) or of a Delta log entry.
COMMIT_PUT = rb"^PUT \S*(?:_trainfeed\.json|/_delta_log/)"


@pytest.mark.azurite
@pytest.mark.parametrize("mode", ["create", "overwrite"])
@pytest.mark.parametrize("kind", ["parquet", "delta", "hdf5-shards"])
def test_killed_before_the_commit_leaves_the_previous_state(azure, azurite_server, tmp_path, kind, mode):
    """convert in its own process, through a CommitGate: once it has uploaded its parts and
    sent its commit (held by the gate, never stored), SIGKILL. Readers then see no store
    (create) or the old one bit for bit (overwrite); a rerun with --overwrite (Delta: and
    --vacuum-hours 0) publishes the new store and removes the orphan parts."""
    old, new = tmp_path / "old", tmp_path / "new"
    old_truth = source(old, 24, seed=12)
    new_truth = source(new, N, seed=13)
    bucket = azure.new_bucket("killed")
    key = STORES[kind][1]
    url = azure.url(bucket, key)
    if mode == "overwrite":
        assert convert(old, url, kind, azure, *labels(old), *SMALL).exit_code == 0
    before = azure.objects(bucket)

    gate = CommitGate(azurite_server.port, COMMIT_PUT)
    gated = azurite_server.connection_string.replace(f":{azurite_server.port}/", f":{gate.port}/")
    assert gated != azurite_server.connection_string
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainfeed.converters", new, url, "--to", STORES[kind][0], "--storage-option",
         f"connection_string={gated}", *labels(new), *TINY, "--workers", "1", "--no-progress",
         *(["--overwrite"] if mode == "overwrite" else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        while not gate.held.wait(0.2):
            if proc.poll() is not None:
                pytest.fail(f"convert ended (exit {proc.returncode}) without committing through the gate: "
                            f"{proc.stderr.read().decode()[-2000:]}")
        during = azure.objects(bucket)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        gate.close()

    # at the commit: the new parts were all uploaded, the old objects untouched, no new commit
    new_parts = {k for k in set(during) - set(before) if k.endswith(DATA_SUFFIX)}
    assert new_parts, f"the commit ({gate.held_line!r}) came before any part was uploaded: {sorted(during)}"
    assert {k: during.get(k) for k in before} == before, "the old store changed before the commit"
    assert commits(during) == commits(before)

    after_kill = azure.objects(bucket)
    assert commits(after_kill) == commits(before)
    if mode == "create":
        assert_not_a_store(azure, url, kind)
    else:
        assert read_with_trainfeed(azure, url)[1] == truth_rows(old_truth)
        assert read_independently(azure, bucket, key, kind).rows == truth_rows(old_truth)

    vacuum = ["--vacuum-hours", "0"] if kind == "delta" else []
    rerun = convert(new, url, kind, azure, *labels(new), *TINY, "--overwrite", *vacuum)
    assert rerun.exit_code == 0, rerun.stderr
    done = read_independently(azure, bucket, key, kind)
    assert done.rows == truth_rows(new_truth)
    assert read_with_trainfeed(azure, url)[1] == truth_rows(new_truth)
    left = set(azure.objects(bucket))
    assert left == done.referenced, f"not referenced by the store: {sorted(left - done.referenced)}"


# ------------------------------------------------------------------ 6. no secret anywhere

@pytest.mark.parametrize("backend_name", [on("azurite"), on("s3")])
def test_remote_convert_and_train_print_and_write_no_secret(request, tmp_path, backend_name):
    """The real console commands, credentials on their command lines: a conversion with a
    rejected file (so a rejects report is written), a failing one, and (S3) a training run.
    The account key / secret is in none of their output, no local file, and no object."""
    backend = get_backend(request, backend_name)
    src = tmp_path / "vols"
    source(src, 12, seed=14, bad="v011")
    bucket = backend.new_bucket("secrets")
    url = backend.url(bucket, "store.parquet")
    opts = backend.cli

    ok = command("trainfeed.converters", src, url, "--to", "parquet", *opts, *labels(src), "--on-error", "skip",
                 "--verify", "--json", "--no-progress", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout)
    assert (summary["samples"], summary["rejected"]) == (11, 1)
    report = summary["rejects_report"]
    text = (backend.fs().cat_file(report.split("://", 1)[1]) if "://" in report else Path(report).read_bytes())
    assert [json.loads(line)["id"] for line in text.decode().splitlines()] == ["v011"]

    failed = command("trainfeed.converters", src, backend.url(bucket, "failed.delta"), "--to", "delta", *opts,
                     *labels(src), "--no-progress", cwd=tmp_path)
    assert failed.returncode == 1 and failed.stderr.startswith("error: ") and "v011.npy" in failed.stderr, failed.stderr
    assert "Traceback" not in failed.stderr

    runs = [ok, failed]
    if backend.name == "s3":  # one successful training run (each costs a torch import)
        trained = command("trainfeed.training", "--data", url, *opts, "--out", tmp_path / "run", "--epochs", "1",
                          "--steps-per-epoch", "1", "--width", "4", "--batch-size", "4", "--json", "--no-progress",
                          cwd=tmp_path)
        assert trained.returncode == 0, trained.stderr
        assert json.loads(trained.stdout)["steps"] == 1
        assert (tmp_path / "run" / "summary.json").is_file()
        runs.append(trained)

    written = {**files_under(tmp_path), **{f"{backend.scheme}://{bucket}/{k}": v
                                           for k, v in backend.objects(bucket).items()}}
    assert any(k.endswith(MANIFEST) for k in written)
    for run in runs:
        assert_no_secret(backend.secrets, run, written)


@pytest.mark.s3
def test_s3_credentials_from_the_environment_are_not_written(request, tmp_path):
    """The usual AWS_* variables instead of options (only the endpoint is an option): a
    Delta conversion (s3fs writes the parts, delta-rs the commit) works and writes no secret."""
    from trainfeed.benchmarks.emulators import s3server

    s3 = get_backend(request, "s3")
    src = tmp_path / "vols"
    truth = source(src, 16, seed=15)
    bucket = s3.new_bucket("env-creds")
    url = s3.url(bucket, "store.delta")
    env = {"AWS_ACCESS_KEY_ID": s3server.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": s3server.SECRET_KEY,
           "AWS_DEFAULT_REGION": s3server.REGION, "AWS_REGION": s3server.REGION}
    res = command("trainfeed.converters", src, url, "--to", "delta", "--storage-option",
                  f"endpoint_url={s3.options['endpoint_url']}", *labels(src), "--json", "--no-progress",
                  cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    assert read_independently(s3, bucket, "store.delta", "delta").rows == truth_rows(truth)
    written = {**files_under(tmp_path), **{f"s3://{bucket}/{k}": v for k, v in s3.objects(bucket).items()}}
    assert_no_secret(s3.secrets, res, written)


@pytest.mark.parametrize("backend_name, fmt, encoding", [on("s3", "parquet", "npy"), on("s3", "delta", "list"),
                                                         on("azurite", "parquet", "raw"),
                                                         on("azurite", "delta", "npy")])
def test_a_foreign_table_on_object_storage_reads_bit_for_bit(request, tmp_path, backend_name, fmt, encoding):
    """Issue #13: a table another tool wrote (Parquet files and Spark's _SUCCESS; a Delta table)
    uploaded as is, read with --tensor-column & co. through the same remote reader."""
    from tests.training.reading.test_foreign import arrow_table, epoch, open_table, samples, write_delta, write_parquet

    backend = get_backend(request, backend_name)
    local = (write_parquet if fmt == "parquet" else write_delta)(tmp_path / "table", arrow_table(encoding))
    bucket = backend.new_bucket("byot")
    backend.fs().put(f"{local}/", f"{bucket}/table/", recursive=True)
    store = open_table(backend.url(bucket, "table"), id_column="sample_id", storage_options=backend.options)
    assert not store.reader.local and store.format == fmt and len(store.reader.pieces) >= 7
    xs, labels, ids = samples()
    x, y, got = epoch(store, seed=5)
    order = [ids.index(i) for i in got]
    assert sorted(got) == ids and np.array_equal(x.view(np.uint32), xs[order].view(np.uint32))
    assert np.array_equal(y, labels[order])
