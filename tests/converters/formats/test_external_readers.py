"""The stores open in the tools users already have: Petastorm, DuckDB, Spark, deltalake."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import write_volumes
from trainfeed.converters.formats import delta, parquet
from trainfeed.converters.layout import decode_tensor


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    from tests.conftest import run_cli
    from trainfeed.converters.cli import app

    root = tmp_path_factory.mktemp("stores")
    src = root / "vols"
    truth = write_volumes(src, 24, folders=True)
    out = {}
    for fmt, name, extra in (("parquet", "bin.parquet", []), ("parquet", "list.parquet", ["--tensor-column", "list"]),
                             ("delta", "bin.delta", []), ("delta", "list.delta", ["--tensor-column", "list"])):
        res = run_cli(app, src, root / name, "--to", fmt, "--row-group-size", "4KB", "--no-progress", *extra)
        assert res.exit_code == 0, res.stderr
        out[name] = root / name
    return out, truth


def files_of(path) -> list[str]:
    return delta.data_files(path) if path.suffix == ".delta" else parquet.data_files(path)


@pytest.mark.petastorm
@pytest.mark.parametrize("name", ["bin.parquet", "list.parquet", "bin.delta", "list.delta"])
def test_petastorm_make_batch_reader(stores, name):
    from petastorm import make_batch_reader

    paths, truth = stores
    spec = parquet.read_schema(paths[name]) if name.endswith("parquet") else delta.read_schema(paths[name])
    vol = spec.field("volume")
    urls = ["file://" + f for f in files_of(paths[name])]
    seen = {}
    # dummy pool: Petastorm 0.13.1's thread pool sometimes drops row groups (see training/reading/petastorm_reader.py)
    with make_batch_reader(urls, num_epochs=1, reader_pool_type="dummy", shuffle_row_groups=False) as reader:
        for batch in reader:
            for sid, label, value in zip(batch.id, batch.label, batch.volume):
                arr = decode_tensor(value, vol) if isinstance(value, bytes) else np.asarray(value).reshape(vol.shape)
                seen[sid] = (arr, int(label))
    assert set(seen) == set(truth)
    for sid, (arr, label) in truth.items():
        assert seen[sid][1] == label and np.array_equal(seen[sid][0], arr)


@pytest.mark.parametrize("name", ["bin.parquet", "list.parquet", "bin.delta", "list.delta"])
def test_duckdb(stores, name):
    import duckdb

    paths, truth = stores
    files = files_of(paths[name])
    con = duckdb.connect()
    rows = con.execute("SELECT id, label, volume FROM read_parquet(?) ORDER BY id", [files]).fetchall()
    assert [r[0] for r in rows] == sorted(truth)
    for sid, label, volume in rows:
        arr, want = truth[sid]
        assert label == want
        got = np.frombuffer(volume, "<f4") if isinstance(volume, (bytes, bytearray)) else np.array(volume, np.float32)
        assert np.array_equal(got.reshape(arr.shape), arr)


def test_deltalake_reads_the_table(stores):
    paths, truth = stores
    table = delta.open_table(paths["list.delta"]).to_pyarrow_table()
    assert sorted(table["id"].to_pylist()) == sorted(truth)
    meta = json.loads(table.schema.field("volume").metadata[b"trainfeed.field"])
    assert meta == {"name": "volume", "dtype": "float32", "shape": [6, 5, 4, 3], "encoding": "raw"}


@pytest.mark.spark
def test_spark_reads_parquet_and_the_delta_snapshot(stores, spark):
    paths, truth = stores
    for name in ("list.parquet", "list.delta", "bin.parquet"):
        df = spark.read.parquet(*files_of(paths[name]))
        rows = {r["id"]: r for r in df.collect()}
        assert set(rows) == set(truth)
        for sid, (arr, label) in truth.items():
            value = rows[sid]["volume"]
            got = np.frombuffer(value, "<f4") if isinstance(value, (bytes, bytearray)) else np.array(value, np.float32)
            assert rows[sid]["label"] == label and np.array_equal(got.reshape(arr.shape), arr)
