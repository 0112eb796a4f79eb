"""Petastorm unpickles the ``dataset-toolkit.unischema.v1`` key of a ``_common_metadata`` file
found in a dataset folder, with a "restricted" unpickler that still allows ``builtins``: a
planted file runs code. trainfeed hands Petastorm explicit part files (from the manifest or
the Delta log), never a folder, and reads stores with plain pyarrow elsewhere: a planted
``_common_metadata`` in a store is never unpickled. See docs/LAYOUT.md, "Opening a store safely"."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli, write_volumes

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"  # what petastorm.etl.dataset_metadata.get_schema unpickles


class _WritesMarker:
    """Unpickling this calls builtins.exec, which Petastorm's restricted unpickler allows."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('code ran')",)


def plant_common_metadata(store, marker) -> None:
    schema = pa.schema([("id", pa.string())]).with_metadata({UNISCHEMA_KEY: pickle.dumps(_WritesMarker(marker), 2)})
    pq.write_metadata(schema, store / "_common_metadata")


def convert_cli(*args):
    from trainfeed.converters.cli import app

    return run_cli(app, *args, "--no-progress")


def train_cli(*args):
    from trainfeed.training.cli import app

    return run_cli(app, *args, "--no-progress")


@pytest.fixture
def planted(tmp_path):
    """Parquet and Delta stores of the same 24 volumes, each with a malicious _common_metadata."""
    src = tmp_path / "vols"
    samples = write_volumes(src, 24, shape=(4, 4, 2))
    stores = {}
    for fmt in ("parquet", "delta"):
        store = tmp_path / f"store.{fmt}"
        res = convert_cli(src, store, "--to", fmt, "--labels", src / "labels.csv", "--row-group-size", "400B",
                          "--target-file-size", "2KB")
        assert res.exit_code == 0, res.stderr
        plant_common_metadata(store, tmp_path / f"marker-{fmt}")
        stores[fmt] = store
    return {"src": src, "samples": samples, "stores": stores, "marker": lambda fmt: tmp_path / f"marker-{fmt}"}


@pytest.mark.petastorm
@pytest.mark.filterwarnings("ignore:Please use make_reader")
def test_the_planted_file_runs_code_when_petastorm_is_given_the_folder(planted):
    """The threat is real: this is what trainfeed must never do."""
    from petastorm import make_batch_reader

    store = planted["stores"]["parquet"]
    with pytest.raises(AttributeError):  # the "schema" it unpickled is exec's None: the code ran before
        make_batch_reader(store.as_uri(), reader_pool_type="dummy")
    assert planted["marker"]("parquet").read_text() == "code ran"


@pytest.mark.parametrize("pool", ["arrow", pytest.param("sharded", marks=pytest.mark.petastorm)])
@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_train_never_unpickles_a_planted_common_metadata(planted, tmp_path, fmt, pool):
    """trainfeed's own engine (the default) and Petastorm's sharded pool, which is handed files."""
    res = train_cli("--data", planted["stores"][fmt], "--epochs", "1", "--batch-size", "8", "--width", "4",
                    "--workers", "2", "--reader-pool", pool, "--out", tmp_path / "out", "--json")
    assert not planted["marker"](fmt).exists()
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["format"] == fmt and summary["steps"] == 3


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_store_readers_never_unpickle_a_planted_common_metadata(planted, fmt):
    """What `convert --verify` reads a store with: every sample comes back, bit for bit."""
    from trainfeed.converters.formats.registry import FORMATS

    rows = list(FORMATS[fmt].read_samples(planted["stores"][fmt]))
    assert [r[0] for r in rows] == sorted(planted["samples"])
    for sid, label, fields in rows:
        arr, expected_label = planted["samples"][sid]
        assert label == expected_label and fields["volume"].tobytes() == arr.tobytes()
        assert fields["volume"].dtype == np.float32 and fields["volume"].shape == arr.shape
    assert not planted["marker"](fmt).exists()


def test_delta_append_with_verify_never_unpickles_a_planted_common_metadata(planted, tmp_path):
    """`convert --mode append --verify` reads an existing table, where the file may have been planted."""
    more = tmp_path / "more"
    write_volumes(more, 4, shape=(4, 4, 2), seed=1)
    for p in more.glob("v*.npy"):
        p.rename(p.with_name("new_" + p.name))
    (more / "labels.csv").write_text("id,label\n" + "".join(f"new_v{i:03d},{i % 2}\n" for i in range(4)))
    res = convert_cli(more, planted["stores"]["delta"], "--to", "delta", "--mode", "append", "--verify",
                      "--labels", more / "labels.csv", "--json")
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["samples"] == 4 and summary["verified"]["samples_checked"] == 4
    assert not planted["marker"]("delta").exists()
