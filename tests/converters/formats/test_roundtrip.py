"""Every sample survives convert bit for bit, in every format and tensor column layout."""
from __future__ import annotations

import io
import json

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.conftest import write_volumes
from trainfeed.converters.formats import delta, hdf5, parquet
from trainfeed.converters.formats.registry import FORMATS, detect_format

TARGETS = [("parquet", "out.parquet", "binary"), ("parquet", "out_list.parquet", "list"),
           ("delta", "out.delta", "binary"), ("delta", "out_list.delta", "list"),
           ("hdf5", "out.h5", None), ("hdf5", "out_shards", None)]


def stored(fmt: str, path) -> dict:
    return {sid: (label, fields) for sid, label, fields in FORMATS[fmt].read_samples(path)}


@pytest.mark.parametrize("fmt,name,tensor_column", TARGETS)
def test_npy_volumes_round_trip_bit_for_bit(tmp_path, volumes, convert_cli, fmt, name, tensor_column):
    src, truth = volumes
    dst = tmp_path / name
    args = [src, dst, "--to", fmt, "--labels", src / "labels.csv", "--json", "--verify",
            "--target-file-size", "20KB", "--row-group-size", "5KB", "--workers", "3"]
    if tensor_column:
        args += ["--tensor-column", tensor_column]
    res = convert_cli(*args)
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["samples"] == len(truth) and summary["rejected"] == 0
    assert summary["files_in"] == len(truth)
    if name.endswith(".h5"):
        assert summary["files_out"] == 1
    else:
        assert summary["files_out"] > 1  # 30 x 1.4 KB at a 20 KB target: several files
    assert summary["verified"]["samples_checked"] == len(truth)
    assert detect_format(dst) == fmt
    rows = stored(fmt, dst)
    assert set(rows) == set(truth)
    for sid, (arr, label) in truth.items():
        got_label, fields = rows[sid]
        assert got_label == label
        assert fields["volume"].dtype == arr.dtype and fields["volume"].shape == arr.shape
        assert fields["volume"].tobytes() == arr.tobytes()
    if fmt == "parquet":  # row groups counted while writing agree with the footers
        assert summary["row_groups"] == sum(pq.ParquetFile(f).num_row_groups for f in parquet.data_files(dst)) > 1
    schema = FORMATS[fmt].read_schema(dst)
    assert schema.samples == len(truth)
    assert schema.field("volume").shape == arr.shape and schema.field("volume").dtype == "float32"


def test_parquet_store_decodes_with_plain_pyarrow(tmp_path, volumes, convert_cli):
    """What docs/LAYOUT.md promises: a user with only pyarrow can decode a sample."""
    src, truth = volumes
    dst = tmp_path / "out.parquet"
    assert convert_cli(src, dst, "--to", "parquet", "--labels", src / "labels.csv").exit_code == 0
    manifest = json.loads((dst / "_trainfeed.json").read_text())
    table = pq.read_table([str(dst / p["file"]) for p in manifest["parts"]])
    meta = json.loads(table.schema.field("volume").metadata[b"trainfeed.field"])
    assert table.num_rows == manifest["schema"]["samples"] == len(truth)
    for sid, label, blob in zip(table["id"].to_pylist(), table["label"].to_pylist(), table["volume"].to_pylist()):
        arr = np.frombuffer(blob, dtype=np.dtype(meta["dtype"]).newbyteorder("<")).reshape(meta["shape"])
        assert label == truth[sid][1] and np.array_equal(arr, truth[sid][0])


def test_hdf5_store_decodes_with_plain_h5py(tmp_path, volumes, convert_cli):
    src, truth = volumes
    dst = tmp_path / "one.h5"
    assert convert_cli(src, dst, "--to", "hdf5", "--labels", src / "labels.csv", "--compression", "gzip").exit_code == 0
    with h5py.File(dst, "r") as h5:
        assert h5["volume"].shape == (len(truth), *truth["v000"][0].shape)
        assert h5["volume"].dtype == np.float32 and h5["volume"].compression == "gzip"
        assert h5["volume"].chunks[1:] == truth["v000"][0].shape
        ids = [x.decode() for x in h5["id"][:]]
        for i, sid in enumerate(ids):
            assert np.array_equal(h5["volume"][i], truth[sid][0]) and h5["label"][i] == truth[sid][1]
        assert json.loads(h5.attrs["trainfeed"])["samples"] == len(truth)


@pytest.mark.parametrize("fmt", ["parquet", "delta", "hdf5"])
def test_npz_fields_of_mixed_dtypes(tmp_path, convert_cli, fmt):
    src = tmp_path / "npz"
    src.mkdir()
    rng = np.random.default_rng(3)
    truth = {}
    for i in range(9):
        fields = {
            "ct": rng.integers(-2000, 2000, size=(4, 4, 2), dtype=np.int16),
            "mask": rng.integers(0, 2, size=(4, 4, 2)).astype(bool),
            "dose": rng.standard_normal(3),  # float64
            "spacing": np.array(1.5 + i, dtype=np.float32),  # 0-d
            "big_endian": np.arange(5, dtype=">i4") * i,
        }
        np.savez(src / f"s{i}.npz", **fields)
        truth[f"s{i}"] = fields
    dst = tmp_path / ("npz.h5" if fmt == "hdf5" else f"npz.{fmt}")
    res = convert_cli(src, dst, "--to", fmt, "--verify", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["labels"] == "none"
    rows = stored(fmt, dst)
    for sid, fields in truth.items():
        label, got = rows[sid]
        assert label is None
        assert set(got) == set(fields)
        for name, arr in fields.items():
            assert np.array_equal(got[name], arr) and got[name].shape == arr.shape
            assert got[name].dtype == arr.dtype.newbyteorder("=")


@pytest.mark.parametrize("fmt", ["parquet", "delta", "hdf5"])
def test_images_stored_encoded_keep_the_file_bytes(tmp_path, images, convert_cli, fmt):
    src, truth = images
    dst = tmp_path / ("imgs.h5" if fmt == "hdf5" else f"imgs.{fmt}")
    res = convert_cli(src, dst, "--to", fmt, "--verify", "--json")
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["label_map"] == {"a": 0, "b": 1}
    rows = stored(fmt, dst)
    assert set(rows) == set(truth)
    for sid, blob in truth.items():
        label, fields = rows[sid]
        assert fields["image"] == blob
        assert label == (0 if sid.startswith("a/") else 1)
    assert FORMATS[fmt].read_schema(dst).label_map == {"a": 0, "b": 1}


@pytest.mark.parametrize("fmt", ["parquet", "hdf5"])
def test_encoded_images_of_one_byte_length_keep_their_bytes(tmp_path, convert_cli, fmt):
    """Encoded images that all have the same length (here: one flat-colour PNG, six times): h5py
    takes such a batch for one 2-D array unless it is written sample by sample."""
    truth = {}
    for i in range(6):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (200, 0, 0)).save(buf, format="PNG")
        (tmp_path / "src" / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / "ab"[i % 2] / f"{i}.png").write_bytes(buf.getvalue())
        truth[f"{'ab'[i % 2]}/{i}"] = buf.getvalue()
    assert len({len(b) for b in truth.values()}) == 1
    dst = tmp_path / ("imgs.h5" if fmt == "hdf5" else "imgs.parquet")
    res = convert_cli(tmp_path / "src", dst, "--to", fmt, "--verify")
    assert res.exit_code == 0, res.stderr
    assert {sid: fields["image"] for sid, (_, fields) in stored(fmt, dst).items()} == truth


def test_images_resized_and_decoded_match_pil(tmp_path, convert_cli):
    from tests.conftest import write_images

    src = tmp_path / "pngs"
    truth = write_images(src, 6, size=(30, 40), fmt="PNG")
    dst = tmp_path / "small.parquet"
    res = convert_cli(src, dst, "--to", "parquet", "--resize", "8x12", "--image-storage", "decoded", "--verify")
    assert res.exit_code == 0, res.stderr
    rows = stored("parquet", dst)
    for sid, blob in truth.items():
        expected = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB").resize((12, 8), Image.Resampling.BILINEAR))
        got = rows[sid][1]["image"]
        assert got.shape == (8, 12, 3) and got.dtype == np.uint8
        assert np.array_equal(got, expected)


def test_images_resized_and_encoded_decode_to_the_new_size(tmp_path, images, convert_cli):
    src, _truth = images
    dst = tmp_path / "enc.h5"
    assert convert_cli(src, dst, "--to", "hdf5", "--resize", "16x20", "--verify").exit_code == 0
    schema = hdf5.read_schema(dst)
    assert schema.field("image").shape == (16, 20, 3) and schema.field("image").encoding == "image"
    for _, _, fields in hdf5.read_samples(dst):
        with Image.open(io.BytesIO(fields["image"])) as img:
            assert img.size == (20, 16) and img.format == "JPEG"


def test_rows_are_written_in_sorted_id_order(tmp_path, convert_cli):
    src = tmp_path / "v"
    truth = write_volumes(src, 12, labels_csv=False)
    dst = tmp_path / "o.parquet"
    assert convert_cli(src, dst, "--to", "parquet", "--workers", "4", "--row-group-size", "1KB").exit_code == 0
    assert [sid for sid, _, _ in parquet.read_samples(dst)] == sorted(truth)


def test_float_specials_survive(tmp_path, convert_cli):
    src = tmp_path / "special"
    src.mkdir()
    arr = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 1e-45, np.finfo(np.float32).max], dtype=np.float32)
    arr[0] = np.frombuffer(b"\x01\x00\xc0\x7f", dtype=np.float32)[0]  # a NaN with a payload
    np.save(src / "x.npy", arr)
    for fmt, name in (("parquet", "s.parquet"), ("delta", "s.delta"), ("hdf5", "s.h5")):
        assert convert_cli(src, tmp_path / name, "--to", fmt, "--verify").exit_code == 0
        (_, fields), = stored(fmt, tmp_path / name).values()
        assert fields["volume"].tobytes() == arr.tobytes()


def test_delta_appends_then_optimize_leave_one_live_file(tmp_path, convert_cli):
    """Appends add files; OPTIMIZE compacts them; readers see only the live snapshot, while
    the replaced files stay on disk (time travel) until VACUUM."""
    dst = tmp_path / "t.delta"
    truth = {}
    for part in range(3):
        src = tmp_path / f"part{part}"
        part_truth = write_volumes(src, 5, seed=part, labels_csv=False)
        for sid in list(part_truth):  # distinct ids across parts
            (src / f"{sid}.npy").rename(src / f"p{part}_{sid}.npy")
            truth[f"p{part}_{sid}"] = part_truth[sid]
        args = [src, dst, "--to", "delta", "--json"] + (["--mode", "append"] if part else [])
        if part == 2:
            args += ["--optimize", "--target-file-size", "10MB"]
        res = convert_cli(*args)
        assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["optimize"]["files_removed"] == 3 and summary["optimize"]["files_added"] == 1
    live = delta.data_files(dst)
    assert len(live) == 1 and len(list(dst.glob("*.parquet"))) == 4
    rows = stored("delta", dst)
    assert set(rows) == set(truth)
    assert all(rows[sid][1]["volume"].tobytes() == arr.tobytes() for sid, (arr, _) in truth.items())
    assert [len(delta.data_files(dst, version=v)) for v in range(3)] == [1, 2, 3]
