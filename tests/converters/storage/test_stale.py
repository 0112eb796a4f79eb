"""On real object stores (Azurite, moto's S3): a store overwritten under the same URL, a table
another tool rewrote in place with the same size, or an edited small file is never served
from ``cache_dir``; a reader whose store changed after it opened it stops with a message
instead of mixing generations. Every comparison is bit for bit against the source."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trainfeed
from tests.test_object_storage import SHAPE, SMALL, STORES, convert, get_backend, labels, on, source
from trainfeed.converters.storage.cache_writer import flush_cache_writes

BACKENDS = [on("azurite"), on("s3")]


def read_all(url: str, backend, cache, **kwargs) -> dict[str, tuple[np.ndarray, int]]:
    store = trainfeed.open_store(url, storage_options=backend.options, cache_dir=str(cache), **kwargs)
    got = {i: (x.copy(), int(y)) for batch in store.batches(batch_size=8, shuffle=False)
           for i, x, y in zip(batch.ids, batch.x, batch.y)}
    flush_cache_writes()  # the cache is written behind the reads: all of it there before the next read
    return got


def assert_same(got: dict, truth: dict) -> None:
    """Ids, labels and every sample's bytes (``truth``: id -> (array, label))."""
    assert sorted(got) == sorted(truth)
    for sid, (x, label) in truth.items():
        assert got[sid][0].tobytes() == np.asarray(x).tobytes() and got[sid][1] == label, sid


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("kind", ["hdf5", "parquet"])
def test_a_store_overwritten_at_the_same_url_is_read_anew(request, tmp_path, backend_name, kind):
    backend = get_backend(request, backend_name)
    url = backend.url(backend.new_bucket("over"), STORES[kind][1])
    first, second = tmp_path / "first", tmp_path / "second"
    truth1, truth2 = source(first, seed=1), source(second, seed=2)  # the same ids, other values
    assert convert(first, url, kind, backend, *labels(first), *SMALL).exit_code == 0
    cache = tmp_path / "cache"
    assert_same(read_all(url, backend, cache), truth1)
    assert any(cache.glob("*/*.bin"))
    res = convert(second, url, kind, backend, *labels(second), *SMALL, "--overwrite")
    assert res.exit_code == 0, res.stderr
    assert_same(read_all(url, backend, cache), truth2)


def _table(values: np.ndarray) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": [v.tobytes() for v in values], "label": np.arange(len(values)) % 2}), buf,
                   row_group_size=4, compression="none", write_statistics=False)
    return buf.getvalue()


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_table_rewritten_in_place_with_the_same_size_is_read_anew(request, tmp_path, backend_name):
    """Another tool rewrites ``data.parquet`` under the same name, byte for byte as long: a
    cache keyed by name and size alone would serve the old rows."""
    backend = get_backend(request, backend_name)
    bucket = backend.new_bucket("inplace")
    rng = np.random.default_rng(0)
    old, new = rng.random((12, *SHAPE), np.float32), rng.random((12, *SHAPE), np.float32)
    first, second = _table(old), _table(new)
    assert len(first) == len(second)
    fs = backend.fs()
    fs.pipe_file(f"{bucket}/t/data.parquet", first)
    url, cache = backend.url(bucket, "t"), tmp_path / "cache"
    opts = {"tensor_column": "x", "shape": SHAPE, "dtype": "float32", "tensor_encoding": "raw"}
    assert_same(read_all(url, backend, cache, **opts), {f"row-{i}": (v, i % 2) for i, v in enumerate(old)})
    fs.pipe_file(f"{bucket}/t/data.parquet", second)
    assert_same(read_all(url, backend, cache, **opts), {f"row-{i}": (v, i % 2) for i, v in enumerate(new)})


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_an_edited_small_file_is_read_anew(request, tmp_path, backend_name):
    backend = get_backend(request, backend_name)
    bucket = backend.new_bucket("edit")
    src = tmp_path / "vols"
    truth = source(src, 12, seed=3)
    fs = backend.fs()
    for f in src.iterdir():
        fs.pipe_file(f"{bucket}/vols/{f.name}", f.read_bytes())
    url, cache = backend.url(bucket, "vols"), tmp_path / "cache"
    assert_same(read_all(url, backend, cache, format="blob", labels=f"{url}/labels.csv"), truth)
    edited = (truth["v005"][0] + 1).astype(np.float32)
    buf = io.BytesIO()
    np.save(buf, edited)
    fs.pipe_file(f"{bucket}/vols/v005.npy", buf.getvalue())
    assert_same(read_all(url, backend, cache, format="blob", labels=f"{url}/labels.csv"),
                {**truth, "v005": (edited, truth["v005"][1])})


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("change", ["replaced", "deleted"])
def test_a_store_that_changes_after_it_was_opened_stops_the_reader(request, tmp_path, backend_name, change):
    backend = get_backend(request, backend_name)
    bucket = backend.new_bucket("moved")
    url = backend.url(bucket, "store.h5")
    first, second = tmp_path / "first", tmp_path / "second"
    source(first, seed=1)
    source(second, seed=2)
    assert convert(first, url, "hdf5", backend, *labels(first), *SMALL).exit_code == 0
    store = trainfeed.open_store(url, storage_options=backend.options)
    if change == "replaced":
        assert convert(second, url, "hdf5", backend, *labels(second), *SMALL, "--overwrite").exit_code == 0
    else:
        backend.fs().rm_file(f"{bucket}/store.h5")
    with pytest.raises(trainfeed.TrainfeedError,
                       match=f"store.h5: the store changed while it was being read \\(an object was {change}\\); "
                             "reopen it"):
        list(store.batches(batch_size=8, shuffle=False))
