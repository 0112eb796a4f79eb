"""`storage-bench run` takes every sample kind `train` takes (issue #32): (H, W) arrays, which the
models take as (H, W, 1), and (H, W, C) images, measured end to end on the local backend (it
once staged every store, then died on "no model for sample shape (32, 32)" with no report)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from trainfeed.benchmarks.model.profiles import model_flops

from .test_storage_bench import TINY, bench_cli, records_of, source_digest

pytestmark = pytest.mark.slow  # a matrix of real conversions and reads: `make test`, not test-fast

#: 8 batches of 8: more than the 2 CPU steps and the prefetch depth, so every run ends mid-epoch
COUNT = 64


@pytest.mark.parametrize("shape", [(16, 16), (16, 16, 3)], ids=["HxW", "HxWxC"])
def test_run_measures_the_image_shaped_samples_train_takes(tmp_path, shape):
    src, out = tmp_path / "arrays", tmp_path / "o"
    res = bench_cli("generate", "volumes", src, "--count", str(COUNT), "--shape", "x".join(map(str, shape)))
    assert res.exit_code == 0, res.stderr
    assert np.load(src / "vol_000000.npy").shape == shape
    res = bench_cli("run", src, "--out", out, "--nodes", "cpu,t4", "--stores", "blob,parquet", "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    info = json.loads(res.stdout)
    assert (info["cells"], info["errors"]) == (4, 0)
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    model_shape = shape if len(shape) == 3 else (*shape, 1)  # train's model_input_shape
    flops = model_flops(model_shape, 8) * 8  # --width 8, --batch-size 8
    expected = source_digest(src)
    cells = [r for r in records_of(out) if r["kind"] == "cell"]
    assert sorted((c["store"], c["node"]) for c in cells) == [("blob", "cpu"), ("blob", "t4"), ("parquet", "cpu"),
                                                             ("parquet", "t4")]
    for c in cells:
        where = (c["store"], c["node"])
        assert c["sample_shape"] == list(model_shape) and c["sample_bytes"] == 4 * int(np.prod(shape)), where
        assert c["flops_per_step"] == flops, where
        assert (c["ingest_only"]["samples"], c["ingest_only"]["ids_labels_sha256"]) == (COUNT, expected), where
        if c["node"] == "cpu":  # the real model trained: one measured step of 8 after the warm-up
            assert c["compute_only"]["how"] == "measured" and c["real"]["samples"] == 8, where
        else:
            assert c["real"]["samples_read"] == 4 * 8, where  # --steps 4


def test_run_measures_ragged_samples_of_mixed_dtypes_through_one_fit(tmp_path):
    """Arrays of several shapes and integer dtypes: the compacted stores keep each sample as it
    is (--ragged --dtype auto), the small files are read as one dtype, and every store is
    batched by the same --fit: every cell is measured, on every sample."""
    from tests.converters.test_ragged import write_ragged

    src, out = tmp_path / "scans", tmp_path / "o"
    write_ragged(src, COUNT)
    for i in range(0, COUNT, 3):  # every third sample another dtype, as a scanner folder mixes them
        arr = np.load(src / f"s{i:02d}.npy")
        np.save(src / f"s{i:02d}.npy", (arr - arr.min()).astype(np.uint16))
    res = bench_cli("run", src, "--out", out, "--nodes", "cpu,t4", "--stores", "blob,parquet,hdf5", "--ragged",
                    "--dtype", "auto", "--fit", "resize:2x4x6x6", "--channels", "last", "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    info = json.loads(res.stdout)
    assert (info["cells"], info["errors"]) == (6, 0)
    expected = source_digest(src)
    cells = [r for r in records_of(out) if r["kind"] == "cell"]
    for c in cells:
        where = (c["store"], c["node"])
        assert c["sample_shape"] == [2, 4, 6, 6] and c["sample_bytes"] == 4 * 2 * 4 * 6 * 6, where  # int32: auto
        assert (c["ingest_only"]["samples"], c["ingest_only"]["ids_labels_sha256"]) == (COUNT, expected), where
