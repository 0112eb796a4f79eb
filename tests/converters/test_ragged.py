"""Real data as it comes: samples of different shapes and dtypes stored without loss in every
format, locally and on object storage, read back bit for bit, and batched only as the user says
(a fit); a folder that mixes them is refused with the file named, never an unexpected error."""
from __future__ import annotations

import json

import numpy as np
import pytest

import trainfeed
from tests.conftest import run_cli
from trainfeed.converters.cli import app as convert_app
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.layout import RAGGED_LAYOUT_VERSION
from trainfeed.training.reading.fitting import Fit, fit_into

# shapes a scanner folder mixes: slices, volumes, a multi-frame series, one 1-D profile
SHAPES = [(5, 7), (3, 4, 6), (9, 2), (2, 3, 4, 5), (11,), (6, 6), (4, 1, 3), (8, 3)]


def write_ragged(src, count: int = 16, dtype=np.int16) -> dict[str, tuple[np.ndarray, int]]:
    """``count`` .npy files of shapes from SHAPES (several axes counts), labels in labels.csv."""
    rng = np.random.default_rng(4)
    src.mkdir(parents=True)
    truth = {}
    for i in range(count):
        arr = rng.integers(-3000, 3000, SHAPES[i % len(SHAPES)]).astype(dtype)
        np.save(src / f"s{i:02d}.npy", arr)
        truth[f"s{i:02d}"] = (arr, i % 3)
    (src / "labels.csv").write_text("id,label\n" + "".join(f"{k},{v[1]}\n" for k, v in truth.items()))
    return truth


def stored_samples(batches) -> dict[str, tuple[np.ndarray, int]]:
    out = {}
    for b in batches:
        assert b.x.dtype == object and b.shapes is None
        for sid, x, y in zip(b.ids, b.x, b.y):
            out[sid] = (x, int(y))
    return out


def assert_same(got: dict, truth: dict) -> None:
    assert sorted(got) == sorted(truth)
    for sid, (arr, label) in truth.items():
        x, y = got[sid]
        assert (x.dtype, x.shape, y) == (arr.dtype, arr.shape, label), sid
        assert x.tobytes() == arr.tobytes(), sid


STORES = [("parquet", "r.parquet", []), ("parquet", "rl.parquet", ["--tensor-column", "list"]),
          ("delta", "r.delta", []), ("hdf5", "r.h5", []), ("hdf5", "r_shards", ["--target-file-size", "1KB"])]


@pytest.mark.parametrize("fmt,name,extra", STORES, ids=[s[1] for s in STORES])
def test_ragged_samples_are_stored_and_read_back_bit_for_bit(tmp_path, fmt, name, extra):
    truth = write_ragged(tmp_path / "src")
    dst = tmp_path / name
    res = run_cli(convert_app, tmp_path / "src", dst, "--to", fmt, "--ragged", "--verify", "--json", "--no-progress",
                  *extra)
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["fields"] == [{"name": "volume", "dtype": "int16", "shape": None, "encoding": "raw"}]
    assert FORMATS[fmt].read_schema(dst).to_dict()["layout_version"] == RAGGED_LAYOUT_VERSION
    store = trainfeed.open_store(str(dst))
    assert store.shape is None and store.dtype == "int16"
    assert_same(stored_samples(store.batches(5, shuffle=True, seed=1)), truth)
    assert_same({sid: (f["volume"], label) for sid, label, f in FORMATS[fmt].read_samples(dst)}, truth)


@pytest.mark.s3
def test_ragged_store_on_object_storage(tmp_path, s3_server):
    truth = write_ragged(tmp_path / "src")
    s3_server.create_bucket("ragged")
    for fmt, name in (("parquet", "r.parquet"), ("delta", "r.delta"), ("hdf5", "r.h5")):
        url = f"s3://ragged/{name}"
        trainfeed.convert(str(tmp_path / "src"), url, format=fmt, ragged=True, verify=True,
                          storage_options=s3_server.storage_options)
        store = trainfeed.open_store(url, storage_options=s3_server.storage_options)
        assert_same(stored_samples(store.batches(4, seed=2)), truth)
        fitted = trainfeed.open_store(url, storage_options=s3_server.storage_options, fit="pad:2x4x9x11")
        for b in fitted.batches(4, seed=2):
            for sid, x, shape in zip(b.ids, b.x, b.shapes):
                arr = truth[sid][0].reshape(tuple(shape))
                assert x[tuple(slice(0, n) for n in shape)].tobytes() == arr.tobytes()


def test_without_ragged_the_refusal_names_the_file_and_the_option(tmp_path):
    write_ragged(tmp_path / "src")
    res = run_cli(convert_app, tmp_path / "src", tmp_path / "o.parquet", "--to", "parquet", "--no-progress")
    assert res.exit_code == 1
    assert f"{tmp_path / 'src' / 's01.npy'}: 'volume' has shape (3, 4, 6)" in res.stderr
    assert "use --ragged" in res.stderr and not (tmp_path / "o.parquet").exists()


# ------------------------------------------------------------------ dtypes

def test_mixed_dtypes_are_refused_with_the_dtype_that_holds_both_and_stored_with_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    a = np.array([[-5, 300]], np.int16)
    b = np.array([[65535, 7]], np.uint16)
    np.save(src / "a.npy", a)
    np.save(src / "b.npy", b)
    res = run_cli(convert_app, src, tmp_path / "o.h5", "--to", "hdf5", "--no-progress")
    assert res.exit_code == 1
    assert f"{src / 'b.npy'}: 'volume' has dtype uint16, but the first sample 'a' has int16; --dtype int32 " \
           "holds both exactly" in res.stderr
    for fmt, name in (("hdf5", "o.h5"), ("parquet", "o.parquet"), ("delta", "o.delta")):
        res = run_cli(convert_app, src, tmp_path / name, "--to", fmt, "--dtype", "int32", "--verify", "--no-progress")
        assert res.exit_code == 0, res.stderr
        got = {sid: f["volume"] for sid, _, f in FORMATS[fmt].read_samples(tmp_path / name)}
        assert got["a"].dtype == got["b"].dtype == np.int32
        assert got["a"].tolist() == a.tolist() and got["b"].tolist() == b.tolist()


def test_a_value_the_dtype_cannot_hold_is_refused_naming_its_file(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.array([1, 2], np.int32))
    np.save(src / "b.npy", np.array([3, -4], np.int32))
    with pytest.raises(trainfeed.TrainfeedError, match=r"b\.npy: 'volume': int32 value -4 does not fit "
                                                       r"dtype=uint16 exactly"):  # the API's words
        trainfeed.convert(str(src), str(tmp_path / "o.parquet"), format="parquet", dtype="uint16")
    assert not (tmp_path / "o.parquet").exists()
    skipped = trainfeed.convert(str(src), str(tmp_path / "s.parquet"), format="parquet", dtype="uint16",
                                on_error="skip")
    assert (skipped.samples, skipped.rejected) == (1, 1)


def test_64_bit_integers_beside_floats_have_no_exact_dtype(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.array([1.5], np.float32))
    np.save(src / "b.npy", np.array([2**60], np.int64))
    with pytest.raises(trainfeed.TrainfeedError, match="no dtype holds every int64 and float32 value exactly"):
        trainfeed.convert(str(src), str(tmp_path / "o.parquet"), format="parquet")


# ------------------------------------------------------------------ a folder of small files as it is

def test_small_files_of_mixed_dtypes_or_shapes_are_refused_naming_the_file(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.zeros((4, 4), np.int16))
    np.save(src / "b.npy", np.zeros((4, 4), np.uint16))
    store = trainfeed.open_store(str(src), format="blob")
    with pytest.raises(trainfeed.TrainfeedError, match=r"b\.npy: holds uint16 samples of shape \(4, 4\), where "
                                                       r"the first file has int16 \(4, 4\)"):
        list(store.batches(2, shuffle=False))
    np.save(src / "b.npy", np.zeros((5, 4), np.int16))
    with pytest.raises(trainfeed.TrainfeedError, match=r"b\.npy: holds int16 samples of shape \(5, 4\).*fit"):
        list(trainfeed.open_store(str(src), format="blob").batches(2, shuffle=False))
    (b,) = trainfeed.open_store(str(src), format="blob", fit="pad:5x4").batches(2, shuffle=False)
    assert b.x.shape == (2, 5, 4) and b.shapes.tolist() == [[4, 4], [5, 4]]


# ------------------------------------------------------------------ fits

def test_resize_matches_torch_linear_interpolation():
    import torch

    rng = np.random.default_rng(0)
    for shape, target in (((7,), (3,)), ((5, 9), (8, 4)), ((4, 6, 3), (2, 9, 5))):
        arr = rng.random(shape).astype(np.float32)
        out = np.empty(target, np.float32)
        fit_into("f", "s", arr, Fit("resize", target), out)
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(shape)]
        want = torch.nn.functional.interpolate(torch.from_numpy(arr)[None, None], size=target, mode=mode,
                                               align_corners=False)[0, 0].numpy()
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_pad_crop_and_leading_axes():
    arr = np.arange(12, dtype=np.int16).reshape(3, 4)
    out = np.full((2, 5, 5), 99, np.int16)
    assert fit_into("f", "s", arr, Fit("pad", (2, 5, 5)), out) == (1, 3, 4)  # (3, 4) taken as (1, 3, 4)
    assert out[0, :3, :4].tolist() == arr.tolist() and out.sum() == arr.sum()
    cropped = np.empty((2, 2), np.int16)
    fit_into("f", "s", arr, Fit("crop", (2, 2)), cropped)
    assert cropped.tolist() == arr[0:2, 1:3].tolist()  # the centre; rows (3 -> 2) from the top
    with pytest.raises(trainfeed.TrainfeedError, match=r"f: sample 's' has shape \(3, 4\), larger than fit pad:2x2"):
        fit_into("f", "s", arr, Fit("pad", (2, 2)), cropped)
    with pytest.raises(trainfeed.TrainfeedError, match="more axes than fit pad:12 takes"):
        fit_into("f", "s", arr, Fit("pad", (12,)), np.empty(12, np.int16))
    squeezed = np.empty((3, 4), np.int16)
    fit_into("f", "s", arr[None], Fit("pad", (3, 4)), squeezed)  # a leading axis of 1 is dropped
    assert squeezed.tolist() == arr.tolist()
    rounded = np.empty(2, np.uint8)
    fit_into("f", "s", np.array([0, 255, 255], np.uint8), Fit("resize", (2,)), rounded)
    assert rounded.dtype == np.uint8 and rounded.tolist() == [64, 255]
    with pytest.raises(trainfeed.UsageError, match="fit must be pad:SHAPE"):
        Fit.parse("zoom:3x3")


def test_torch_dataset_needs_a_fit_and_workers_deliver_the_fitted_batches(tmp_path):
    from torch.utils.data import DataLoader

    truth = write_ragged(tmp_path / "src", 12)
    trainfeed.convert(str(tmp_path / "src"), str(tmp_path / "r.parquet"), format="parquet", ragged=True)
    url = str(tmp_path / "r.parquet")
    with pytest.raises(trainfeed.UsageError, match="samples of different shapes; batches need one"):
        trainfeed.TorchDataset(url, batch_size=4)
    fit = "resize:2x5x5x5"
    expected = [b.x.copy() for b in trainfeed.open_store(url, fit=fit).batches(4, seed=5)]
    for workers in (0, 2):
        ds = trainfeed.TorchDataset(url, batch_size=4, seed=5, fit=fit)
        got = [x.numpy().copy() for x, _ in DataLoader(ds, batch_size=None, num_workers=workers, timeout=120 * (
            workers > 0))]
        assert len(got) == len(expected) == 3
        assert all(g.tobytes() == e.tobytes() for g, e in zip(got, expected))
    assert len(truth) == 12

    # return_shapes: each sample's own shape beside its padded batch, through worker processes too
    fit = "pad:2x4x9x11"
    want = [(b.x.copy(), b.shapes.copy()) for b in trainfeed.open_store(url, fit=fit).batches(4, seed=5)]
    (tmp_path / "fixed").mkdir()
    for i in range(8):
        np.save(tmp_path / "fixed" / f"f{i}.npy", np.zeros((3, 5), np.int16))
    with pytest.raises(trainfeed.UsageError, match="return_shapes=True gives each sample's own shape"):
        trainfeed.TorchDataset(str(tmp_path / "fixed"), batch_size=4, return_shapes=True)
    for workers in (0, 2):
        ds = trainfeed.TorchDataset(url, batch_size=4, seed=5, fit=fit, return_shapes=True)
        got = [(x.numpy().copy(), s.numpy().copy()) for x, _, s in
               DataLoader(ds, batch_size=None, num_workers=workers, timeout=120 * (workers > 0))]
        assert len(got) == 3
        for (gx, gs), (wx, ws) in zip(got, want):
            assert gx.tobytes() == wx.tobytes() and gs.tolist() == ws.tolist()
            for x, shape in zip(gx, gs):  # zeros outside each sample's own extent
                inside = np.zeros(x.shape, bool)
                inside[tuple(slice(0, n) for n in shape)] = True
                assert not x[~inside].any()


def test_train_needs_a_fit_for_ragged_samples_and_trains_with_one(tmp_path):
    from trainfeed.training.cli import app as train_app

    write_ragged(tmp_path / "src", 16)
    trainfeed.convert(str(tmp_path / "src"), str(tmp_path / "r.h5"), format="hdf5", ragged=True)
    common = ["--data", str(tmp_path / "r.h5"), "--batch-size", "4", "--width", "4", "--no-progress", "--json"]
    res = run_cli(train_app, *common, "--out", str(tmp_path / "a"))
    assert res.exit_code == 1 and "holds samples of different shapes: choose how to batch them, --fit" in res.stderr
    res = run_cli(train_app, *common, "--fit", "pad:2x4x9x11", "--out", str(tmp_path / "b"))
    assert res.exit_code == 2 and "(2, 4, 9, 11), which looks channels-first" in res.stderr  # not guessed
    res = run_cli(train_app, *common, "--fit", "pad:2x4x9x11", "--channels", "last", "--out", str(tmp_path / "c"))
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["sample_shape"], summary["steps"]) == ([2, 4, 9, 11], 4)


def test_dtype_auto_finds_one_dtype_for_the_folder_from_the_headers(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    arrays = {"a": np.array([-5, 2], ">i2"), "b": np.array([65535], np.uint16), "c": np.array([[7]], np.uint8)}
    for name, arr in arrays.items():
        np.save(src / f"{name}.npy", arr)
    result = trainfeed.convert(str(src), str(tmp_path / "o.h5"), format="hdf5", dtype="auto", ragged=True,
                               verify=True)
    assert result.dtypes_found == ["int16", "uint16", "uint8"] and result.fields[0]["dtype"] == "int32"
    assert result.warnings == []
    got = {sid: f["volume"] for sid, _, f in FORMATS["hdf5"].read_samples(tmp_path / "o.h5")}
    assert {k: (v.dtype.name, v.tolist()) for k, v in got.items()} == \
        {k: ("int32", v.tolist()) for k, v in arrays.items()}
    np.save(src / "d.npy", np.array([1], np.uint64))
    with pytest.raises(trainfeed.TrainfeedError, match="no dtype holds every value of int16, uint16, uint64, uint8"):
        trainfeed.convert(str(src), str(tmp_path / "p.h5"), format="hdf5", dtype="auto", ragged=True)


def test_the_api_takes_a_fit_in_its_options_and_trains_with_one(tmp_path):
    src = tmp_path / "flat"
    src.mkdir()
    rng = np.random.default_rng(9)
    truth = {f"f{i}": rng.integers(0, 100, shape).astype(np.int32)
             for i, shape in enumerate([(5, 7), (2, 9), (3, 3), (8, 1), (4, 4), (6, 2)])}
    for sid, arr in truth.items():
        np.save(src / f"{sid}.npy", arr)
    trainfeed.convert(str(src), str(tmp_path / "f.parquet"), format="parquet", ragged=True)
    store = trainfeed.open_store(str(tmp_path / "f.parquet"), options=trainfeed.OpenOptions(fit="crop:3x3"))
    seen = 0
    for b in store.batches(3, shuffle=False):
        for sid, x, shape in zip(b.ids, b.x, b.shapes):
            arr = truth[sid]
            want = np.zeros((3, 3), np.int32)  # the centre where longer, zeros at the end where shorter
            rows, cols = [slice((n - 3) // 2, (n - 3) // 2 + 3) if n > 3 else slice(0, n) for n in arr.shape]
            part = arr[rows, cols]
            want[:part.shape[0], :part.shape[1]] = part
            assert tuple(shape) == arr.shape and x.tobytes() == want.tobytes(), sid
            seen += 1
    assert seen == len(truth)
    write_ragged(tmp_path / "src", 16)
    trainfeed.convert(str(tmp_path / "src"), str(tmp_path / "r.parquet"), format="parquet", ragged=True)
    result = trainfeed.train(trainfeed.TrainConfig(data=str(tmp_path / "r.parquet"), channels="last", width=4,
                                                   out=str(tmp_path / "o"), progress=False,
                                                   store=trainfeed.OpenOptions(fit="pad:2x4x9x11"),
                                                   epoch=trainfeed.EpochOptions(batch_size=4)))
    assert result.summary["sample_shape"] == [2, 4, 9, 11]


def test_a_folder_of_mixed_dtypes_is_read_as_one_with_cast(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    arrays = {"a": np.array([[-5, 300]], np.int16), "b": np.array([[65535, 7]], np.uint16),
              "c": np.array([[1, 2]], ">u1")}
    for name, arr in arrays.items():
        np.save(src / f"{name}.npy", arr)
    with pytest.raises(trainfeed.TrainfeedError, match=r"b\.npy: holds uint16 samples.*one dtype with --cast"):
        list(trainfeed.open_store(str(src), format="blob").batches(3, shuffle=False))
    for cast, dtype in (("auto", np.int32), ("int64", np.int64)):
        store = trainfeed.open_store(str(src), format="blob", cast=cast)
        (b,) = store.batches(3, shuffle=False)
        assert b.x.dtype == dtype and {i: x.tolist() for i, x in zip(b.ids, b.x)} == \
            {k: v.tolist() for k, v in arrays.items()}
    with pytest.raises(trainfeed.TrainfeedError, match=r"a\.npy: 'volume': int16 value -5 does not fit "
                                                       r"--dtype uint16 exactly"):
        list(trainfeed.open_store(str(src), format="blob", cast="uint16").batches(3, shuffle=False))
    trainfeed.convert(str(src), str(tmp_path / "o.parquet"), format="parquet", dtype="auto")
    with pytest.raises(trainfeed.UsageError, match="--cast reads a folder of small files"):
        trainfeed.open_store(str(tmp_path / "o.parquet"), cast="int64")
