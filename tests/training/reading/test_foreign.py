"""Bring your own table (issue #13): Parquet and Delta tables written by another tool (here pyarrow
and deltalake, as Spark writes them: a tensor column of .npy bytes, raw bytes or an array of
numbers, a label and an id column, several row groups) are read with --tensor-column & co.
Samples come back bit for bit; bad options and data are refused naming the table and column."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trainfeed
from tests.conftest import run_cli
from trainfeed.converters.errors import TrainfeedError

N = 64
SHAPE = (6, 6, 4, 2)
SHAPE_ARG = "6x6x4x2"
ENCODINGS = ("npy", "raw", "list")
TINY = ["--width", "4", "--batch-size", "8", "--workers", "1", "--lr", "0.01"]


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=True)
    return buf.getvalue()


def tensor_column(xs: np.ndarray, encoding: str) -> pa.Array:
    if encoding == "npy":
        return pa.array([npy_bytes(x) for x in xs], pa.binary())
    if encoding == "raw":
        return pa.array([x.astype("<f4").tobytes() for x in xs], pa.binary())
    return pa.array([x.reshape(-1) for x in xs], pa.list_(pa.float32()))


def samples(seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((N, *SHAPE)).astype(np.float32)
    xs[0, 0, 0, 0, 0], xs[1, 0, 0, 0, 0], xs[2, 0, 0, 0, 0] = np.nan, -0.0, np.inf  # bits matter
    return xs, rng.integers(0, 2, N).astype(np.int32), [f"scan-{i:03d}" for i in range(N)]


def arrow_table(encoding: str) -> pa.Table:
    xs, labels, ids = samples()
    return pa.table({"sample_id": pa.array(ids), "x": tensor_column(xs, encoding), "y": pa.array(labels, pa.int32())})


def write_parquet(folder: Path, table: pa.Table) -> Path:
    """Two files of several row groups each, and Spark's _SUCCESS marker."""
    folder.mkdir(parents=True)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), folder / "part-00000-abc.snappy.parquet", row_group_size=10)
    pq.write_table(table.slice(half), folder / "part-00001-abc.snappy.parquet", row_group_size=10)
    (folder / "_SUCCESS").write_bytes(b"")
    return folder


def write_delta(folder: Path, table: pa.Table) -> Path:
    from deltalake import WriterProperties, write_deltalake

    write_deltalake(str(folder), table, writer_properties=WriterProperties(max_row_group_size=10))
    return folder


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("foreign")
    out = {}
    for encoding in ENCODINGS:
        table = arrow_table(encoding)
        out["parquet", encoding] = write_parquet(root / f"{encoding}.parquet", table)
        out["delta", encoding] = write_delta(root / f"{encoding}.delta", table)
    return out


def open_table(path, **options) -> trainfeed.Store:
    return trainfeed.open_store(str(path), **{"tensor_column": "x", "shape": SHAPE, "label_column": "y", **options})


def epoch(store: trainfeed.Store, **options) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """One epoch, concatenated; unshuffled, one lane: the table's order."""
    batches = list(store.batches(**{"batch_size": 7, "lanes": 1, **options}))
    return (np.concatenate([b.x for b in batches]), np.concatenate([b.y for b in batches]),
            [i for b in batches for i in b.ids])


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_batches_are_the_written_samples_bit_for_bit(tables, fmt, encoding):
    xs, labels, ids = samples()
    store = open_table(tables[fmt, encoding], id_column="sample_id")
    listing = store.reader.listing
    assert store.format == fmt and store.samples == N and store.shape == SHAPE and store.dtype == "float32"
    assert listing.read.encoding == encoding  # auto found it
    assert len(store.reader.pieces) >= 7  # row groups of 10 rows: the engine's pieces
    x, y, got_ids = epoch(store, seed=3)
    assert sorted(got_ids) == ids and got_ids != ids  # every sample once, shuffled
    order = [ids.index(i) for i in got_ids]
    assert np.array_equal(x.view(np.uint32), xs[order].view(np.uint32))
    assert np.array_equal(y, labels[order])


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_each_encoding_named_explicitly_reads_the_same(tables, encoding):
    xs, _, _ = samples()
    x, _, _ = epoch(open_table(tables["parquet", encoding], tensor_encoding=encoding), shuffle=False)
    assert np.array_equal(x.view(np.uint32), xs.view(np.uint32))


def test_without_an_id_column_ids_are_row_positions_across_files(tables):
    xs, labels, _ = samples()
    x, y, ids = epoch(open_table(tables["parquet", "raw"]), shuffle=False)
    assert ids == [f"row-{i}" for i in range(N)]
    assert np.array_equal(x.view(np.uint32), xs.view(np.uint32)) and np.array_equal(y, labels)


def test_ranks_and_resume_as_for_trainfeeds_own_stores(tables):
    store = open_table(tables["delta", "list"], id_column="sample_id")
    full = [b.ids for b in store.batches(batch_size=5, seed=1, epoch=2)]
    assert [b.ids for b in store.batches(batch_size=5, seed=1, epoch=2, start_batch=4)] == full[4:]
    ranks = [[i for b in store.batches(batch_size=4, seed=1, rank=k, world_size=2, drop_last=True) for i in b.ids]
             for k in range(2)]
    assert not set(ranks[0]) & set(ranks[1]) and len(ranks[0]) == len(ranks[1]) == N // 8 * 4
    assert set(ranks[0] + ranks[1]) <= set(samples()[2])


def test_npy_in_fortran_order_and_big_endian_is_read_as_its_values(tmp_path):
    xs, labels, _ = samples()
    values = [npy_bytes(np.asfortranarray(x) if i % 2 else x.astype(">f4")) for i, x in enumerate(xs)]
    path = write_parquet(tmp_path / "t", pa.table({"x": pa.array(values, pa.binary()), "y": labels}))
    x, _, _ = epoch(open_table(path), shuffle=False)
    assert np.array_equal(x.view(np.uint32), xs.view(np.uint32))


def test_a_pickled_npy_value_is_refused_and_never_loaded(tmp_path):
    marker = tmp_path / "ran"
    planted = np.empty(1, dtype=object)
    planted[0] = _Plant(str(marker))
    xs, labels, _ = samples()
    values = [npy_bytes(x) for x in xs]
    values[3] = npy_bytes(planted)
    path = write_parquet(tmp_path / "t", pa.table({"x": pa.array(values, pa.binary()), "y": labels}))
    with pytest.raises(TrainfeedError, match=r"tensor column 'x', row 3: holds Python objects"):
        open_table(path)
    assert not marker.exists()


class _Plant:
    """Unpickling this creates ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


# ---------------------------------------------------------------- train


def train_cli(*args):
    from trainfeed.training.cli import app

    return run_cli(app, *args, "--no-progress")


@pytest.mark.parametrize("fmt, encoding", [("parquet", "npy"), ("delta", "list")])
def test_train_runs_on_a_foreign_table(tmp_path, tables, fmt, encoding):
    out = tmp_path / "out"
    res = train_cli("--data", tables[fmt, encoding], "--tensor-column", "x", "--shape", SHAPE_ARG,
                    "--label-column", "y", "--id-column", "sample_id", "--epochs", "1", "--out", out, "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["format"] == fmt and summary["field"] == "x" and summary["sample_shape"] == list(SHAPE)
    assert summary["steps"] == N // 8 and summary["config"]["store"]["foreign"]["encoding"] == "auto"
    assert json.loads((out / "summary.json").read_text())["steps"] == N // 8
    assert len((out / "steps.jsonl").read_text().splitlines()) == N // 8


def assert_clean_error(res, code: int, *parts: str) -> None:
    out = res.stdout + res.stderr
    assert res.exit_code == code, out
    assert res.stderr.startswith("error: ") and "Traceback" not in out, out
    for part in parts:
        assert part in res.stderr, res.stderr


BASE = ["--tensor-column", "x", "--shape", SHAPE_ARG, "--label-column", "y"]


@pytest.mark.parametrize("table, args, code, parts", [
    # usage (2)
    (("parquet", "raw"), ["--shape", SHAPE_ARG], 2, ["--shape describe a table", "need --tensor-column"]),
    (("parquet", "raw"), ["--tensor-column", "x"], 2, ["--tensor-column needs --shape"]),
    (("parquet", "raw"), [*BASE, "--shape", "6x6xfour"], 2, ["--shape: cannot parse '6x6xfour'"]),
    (("parquet", "raw"), [*BASE, "--shape", "6x0"], 2, ["--shape must be one or more positive sizes"]),
    (("parquet", "raw"), [*BASE, "--label-column", "x"], 2, ["must name different columns"]),
    (("parquet", "raw"), [*BASE, "--format", "hdf5"], 2, ["--tensor-column reads Parquet and Delta tables"]),
    (("parquet", "raw"), [*BASE, "--reader-pool", "thread"], 2, ["--reader-pool thread", "arrow"]),
    (("parquet", "raw"), [*BASE, "--labels", "l.csv"], 2, ["--labels is for folders", "--label-column"]),
    (("parquet", "raw"), [*BASE, "--delta-version", "0"], 2, ["--delta-version applies to Delta tables only"]),
    # data (1): the table and the column named
    (("parquet", "raw"), [*BASE, "--tensor-column", "volume"], 1, ["raw.parquet", "no column 'volume'"]),
    (("delta", "raw"), [*BASE, "--id-column", "name"], 1, ["raw.delta", "no column 'name'"]),
    (("parquet", "raw"), [*BASE, "--tensor-column", "sample_id"], 1,
     ["raw.parquet/part-00000-abc.snappy.parquet", "tensor column 'sample_id' is string"]),
    (("delta", "npy"), [*BASE, "--label-column", "sample_id"], 1,
     ["npy.delta", "label column 'sample_id' is string, not integers"]),
    (("parquet", "raw"), [*BASE, "--shape", "6x6x4x3"], 1,
     ["raw.parquet/part-00000-abc.snappy.parquet (row group 0)", "tensor column 'x', row 0: 1152 bytes",
      "--shape 6x6x4x3 of float32 is 1728 bytes"]),
    (("parquet", "raw"), [*BASE, "--dtype", "float64"], 1, ["row 0: 1152 bytes", "float64 is 2304 bytes"]),
    (("delta", "npy"), [*BASE, "--shape", "12x6x4"], 1,
     ["npy.delta", "tensor column 'x', row 0: holds float32 of shape (6, 6, 4, 2), not float32 of shape (12, 6, 4)"]),
    (("parquet", "npy"), [*BASE, "--tensor-encoding", "raw"], 1, ["tensor column 'x', row 0:", "bytes, but --shape"]),
    (("parquet", "raw"), [*BASE, "--tensor-encoding", "npy"], 1, ["tensor column 'x', row 0: not a .npy file"]),
    (("parquet", "raw"), [*BASE, "--tensor-encoding", "list"], 1,
     ["tensor column 'x' is binary; --tensor-encoding list"]),
    (("delta", "list"), [*BASE, "--tensor-encoding", "npy"], 1,
     ["list.delta", "--tensor-encoding npy takes a binary column"]),
    (("delta", "list"), [*BASE, "--dtype", "float64"], 1,
     ["list.delta", "tensor column 'x' holds float values, not double (--dtype float64); pass --dtype float32"]),
    (("parquet", "list"), [*BASE, "--shape", "6x6x4"], 1,
     ["tensor column 'x', row 0: 288 numbers, but --shape 6x6x4 is 144"]),
])
def test_bad_options_and_data_are_refused_naming_the_table_and_column(tmp_path, tables, table, args, code, parts):
    res = train_cli("--data", tables[table], *args, "--out", tmp_path / "o", *TINY)
    assert_clean_error(res, code, *parts)
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_a_foreign_table_without_the_options_is_refused_naming_them(tmp_path, tables, fmt):
    res = train_cli("--data", tables[fmt, "raw"], "--out", tmp_path / "o", *TINY)
    assert_clean_error(res, 1, f"raw.{fmt}", "--tensor-column", "--shape", "--label-column", "--id-column")
    one_file = next(tables["parquet", "raw"].glob("*.parquet"))
    assert_clean_error(train_cli("--data", one_file, "--out", tmp_path / "o", *TINY), 1,
                       "a Parquet file that is not a trainfeed store", "--tensor-column")


def test_one_parquet_file_is_a_table(tables):
    xs, labels, _ = samples()
    one_file = sorted(tables["parquet", "list"].glob("*.parquet"))[0]
    x, y, ids = epoch(open_table(one_file), shuffle=False)
    assert ids == [f"row-{i}" for i in range(N // 2)]
    assert np.array_equal(x.view(np.uint32), xs[:N // 2].view(np.uint32)) and np.array_equal(y, labels[:N // 2])


def test_a_delta_version_is_read_as_of_that_version(tmp_path):
    from deltalake import write_deltalake

    table = arrow_table("raw")
    path = write_delta(tmp_path / "t.delta", table.slice(0, 20))
    write_deltalake(str(path), table.slice(20), mode="append")
    assert open_table(path).samples == N and open_table(path, version=1).samples == N
    old = open_table(path, version=0, id_column="sample_id")
    assert old.version == 0 and sorted(epoch(old)[2]) == samples()[2][:20]
