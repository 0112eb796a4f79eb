"""Encoded images decoded at training time: pixels as Pillow gives them, the same batches from
every layout as from a store of decoded pixels, seeded augmentation, clear errors, learning."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from tests.conftest import run_cli, write_images
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.training.reading import images
from trainfeed.training.reading.readers import EpochOptions, iter_batches, open_store

SIZE = (24, 32)


def convert(src, dst, *args):
    from trainfeed.converters.cli import app

    res = run_cli(app, src, dst, *args, "--no-progress")
    assert res.exit_code == 0, res.stderr
    return dst


def train_cli(*args):
    from trainfeed.training.cli import app

    return run_cli(app, *args, "--no-progress")


def encoded(img: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """24 JPEGs of one size in class folders, as a folder and as stores: encoded (Parquet with
    several row groups, Delta, HDF5) and decoded (Parquet), all from the same files."""
    root = tmp_path_factory.mktemp("photos")
    write_images(root / "imgs", 24, size=SIZE)
    small = ["--row-group-size", "4KB", "--hdf5-chunk-size", "4KB"]
    stores = {"blob": root / "imgs"}
    for fmt in ("parquet", "delta", "hdf5"):
        stores[fmt] = convert(root / "imgs", root / f"enc-{fmt}", "--to", fmt, *small)
    decoded = convert(root / "imgs", root / "dec.parquet", "--to", "parquet", "--image-storage", "decoded")
    return {"root": root, "stores": stores, "decoded": decoded}


def epoch(path, fmt=None, *, epoch_=0, **opts):
    options = EpochOptions(**{"batch_size": 5, "workers": 2, "shuffle": False, **opts})
    return list(iter_batches(open_store(str(path), fmt, OpenOptions()), options, epoch_))


def assert_same_batches(got, want):
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert a.ids == b.ids
        np.testing.assert_array_equal(a.y, b.y)
        assert a.x.dtype == b.x.dtype and a.x.shape == b.x.shape
        assert np.array_equal(a.x, b.x)


# ---------------------------------------------------------------- pixels as Pillow decodes them


def test_jpeg_decodes_as_pillow_does():
    rng = np.random.default_rng(1)
    data = encoded(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8), "JPEG")
    same_size = images.Decoding((96, 128), 3, "uint8", False, "first")
    assert np.array_equal(images.decode(data, same_size, "f.jpg", "f"), np.asarray(Image.open(io.BytesIO(data))))
    # smaller: Pillow's reduced-scale JPEG decode (draft), then its bilinear resize
    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", (32, 24))
        assert img.size == (32, 24)  # the DCT scale did all of it
        want = np.asarray(img.resize((32, 24), Image.Resampling.BILINEAR))
    got = images.decode(data, images.Decoding((24, 32), 3, "uint8", True, "first"), "f.jpg", "f")
    assert np.array_equal(got, want)
    # a crop: the same box, at the scale Pillow's draft picks for it
    augment = images.Augment(seed=3, epoch=0)
    (left, top, right, bottom), flip = augment.draw("f", 128, 96)
    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", (int(np.ceil(16 * 128 / (right - left))), int(np.ceil(12 * 96 / (bottom - top)))))
        f = img.size[0] / 128
        want = np.asarray(img.resize((16, 12), Image.Resampling.BILINEAR,
                                     box=(left * f, top * f, right * f, bottom * f)))
    got = images.decode(data, images.Decoding((12, 16), 3, "uint8", True, "first"), "f.jpg", "f", augment)
    assert np.array_equal(got, want[:, ::-1] if flip else want)


def test_16_bit_png_keeps_every_bit():
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 65535, (20, 30), dtype=np.uint16)
    data = encoded(pixels, "PNG")
    decoding = images.Decoding((20, 30), 1, "uint16", False, "first")
    got = images.decode(data, decoding, "g.png", "g")
    assert got.dtype == np.uint16 and got.shape == (20, 30, 1) and np.array_equal(got[..., 0], pixels)
    resized = images.decode(data, images.Decoding((10, 15), 1, "uint16", True, "first"), "g.png", "g")
    want = np.asarray(Image.open(io.BytesIO(data)).resize((15, 10), Image.Resampling.BILINEAR))
    assert resized.dtype == np.uint16 and np.array_equal(resized[..., 0], want)


# ---------------------------------------------------------------- every layout, the same batches


@pytest.mark.parametrize("fmt", ["parquet", "delta", "hdf5", "blob"])
def test_encoded_layouts_give_the_decoded_store_batches(photos, fmt):
    want = epoch(photos["decoded"])
    assert want[0].x.shape == (5, *SIZE, 3)
    got = epoch(photos["stores"][fmt], fmt if fmt == "blob" else None)
    assert_same_batches(got, want)
    assert open_store(str(photos["stores"][fmt]), fmt if fmt == "blob" else None).sample_spec.shape == (*SIZE, 3)


def test_augmentation_is_seeded_and_changes_pixels(photos):
    store = photos["stores"]["parquet"]
    one = epoch(store, augment=True, shuffle=True, seed=5, workers=1)
    three = epoch(store, augment=True, shuffle=True, seed=5, workers=3)
    assert_same_batches(three, one)  # any worker count: the same batches
    plain = {i: x for b in epoch(store, shuffle=True, seed=5) for i, x in zip(b.ids, b.x)}
    first = {i: x for b in one for i, x in zip(b.ids, b.x)}
    later = {i: x for b in epoch(store, augment=True, shuffle=True, seed=5, epoch_=1) for i, x in zip(b.ids, b.x)}
    assert first.keys() == plain.keys() == later.keys()
    assert all(first[i].shape == (*SIZE, 3) for i in first)
    assert sum(not np.array_equal(first[i], plain[i]) for i in first) >= len(first) - 1  # the crop changes pixels
    assert sum(not np.array_equal(first[i], later[i]) for i in first) >= len(first) - 1  # another epoch, other crops
    # the same sample from another layout (other pieces, other order) gets the same crop
    blob = {i: x for b in epoch(photos["stores"]["blob"], "blob", augment=True, shuffle=True, seed=5)
            for i, x in zip(b.ids, b.x)}
    assert all(np.array_equal(blob[i], first[i]) for i in first)


def test_python_api_decodes_and_augments(photos):
    import trainfeed

    store = trainfeed.open_store(str(photos["stores"]["delta"]), image_size=(16, 20))
    assert store.shape == (16, 20, 3) and store.dtype == "uint8"
    plain = next(store.batches(8, seed=1))
    assert plain.x.shape == (8, 16, 20, 3)
    again = next(store.batches(8, seed=1, augment=True))
    assert again.ids == plain.ids and not np.array_equal(again.x, plain.x)
    assert np.array_equal(next(store.batches(8, seed=1, augment=True)).x, again.x)


def test_greyscale_gets_a_channel_axis(tmp_path):
    rng = np.random.default_rng(4)
    for i in range(6):
        path = tmp_path / "grey" / ("a" if i % 2 else "b") / f"g{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 65535, (10, 12), dtype=np.uint16)
        pixels[:i] = 7  # files of different lengths (the HDF5 writer cannot yet store equal-length images)
        path.write_bytes(encoded(pixels, "PNG"))
    enc = convert(tmp_path / "grey", tmp_path / "enc.h5", "--to", "hdf5")
    dec = convert(tmp_path / "grey", tmp_path / "dec.h5", "--to", "hdf5", "--image-storage", "decoded",
                  "--image-mode", "L")
    got, want = epoch(enc, batch_size=3), epoch(dec, batch_size=3)
    assert want[0].x.shape == (3, 10, 12) and got[0].x.shape == (3, 10, 12, 1) and got[0].x.dtype == np.uint16
    for a, b in zip(got, want):
        assert a.ids == b.ids and np.array_equal(a.x[..., 0], b.x)
    res = train_cli("--data", enc, "--width", "4", "--batch-size", "3", "--out", tmp_path / "o", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["sample_shape"] == [10, 12, 1]


# ---------------------------------------------------------------- errors


def test_images_of_other_sizes_need_image_size(tmp_path, photos):
    src = tmp_path / "mixed"
    write_images(src, 6, size=SIZE)
    write_images(tmp_path / "other", 2, size=(30, 20), seed=9)
    odd = src / "b" / "img999.jpg"
    odd.write_bytes((tmp_path / "other" / "a" / "img000.jpg").read_bytes())
    store = convert(src, tmp_path / "mixed.parquet", "--to", "parquet")
    for data, fmt in ((src, "blob"), (store, "parquet")):
        res = train_cli("--data", data, "--format", fmt, "--width", "4", "--batch-size", "7", "--out", tmp_path / "o")
        assert res.exit_code == 1
        assert "image 'b/img999' is 30x20 (HxW) but the first image, 'a/img000', is 24x32" in res.stderr
        assert "pass --image-size HxW" in res.stderr
        where = str(odd) if fmt == "blob" else str(store)
        assert f"error: {where}" in res.stderr
        res = train_cli("--data", data, "--format", fmt, "--width", "4", "--batch-size", "7", "--out", tmp_path / "o",
                        "--image-size", "16x16", "--json")
        assert res.exit_code == 0, res.stderr
        assert json.loads(res.stdout)["sample_shape"] == [16, 16, 3]


def test_eval_images_of_another_size(tmp_path, photos):
    write_images(tmp_path / "held", 6, size=(30, 20))
    held = convert(tmp_path / "held", tmp_path / "held.h5", "--to", "hdf5")
    base = ["--data", photos["stores"]["parquet"], "--eval-data", held, "--width", "4", "--batch-size", "6",
            "--out", tmp_path / "o"]
    res = train_cli(*base)
    assert res.exit_code == 1 and (f"{held}: --eval-data field 'image' holds uint8 samples of shape (30, 20, 3); the "
                                   "model trains on uint8 samples of shape (24, 32, 3) from --data; --image-size HxW "
                                   "decodes both to one size") in res.stderr
    res = train_cli(*base, "--image-size", "24x32", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["eval"]["samples"] == 6


@pytest.mark.parametrize("args,message", [
    (["--data", "{decoded}", "--image-size", "16x16"], "--image-size applies to encoded images (JPEG/PNG)"),
    (["--data", "{parquet}", "--image-size", "16"], "--image-size expects HEIGHTxWIDTH such as 64x64, got '16'"),
    (["--data", "{parquet}", "--reader-pool", "sharded"], "holds encoded images, which the default pool, arrow"),
])
def test_usage_errors(tmp_path, photos, args, message):
    args = [a.format(decoded=photos["decoded"], parquet=photos["stores"]["parquet"]) for a in args]
    res = train_cli(*args, "--width", "4", "--out", tmp_path / "o")
    assert res.exit_code == 2 and message in res.stderr


# ---------------------------------------------------------------- learning


def test_resnet_learns_from_an_encoded_store(tmp_path):
    """Stripes whose orientation is the class (benchmarks/synth.py), stored as JPEG bytes at
    48x48, decoded to 32x32 with augmentation; held-out accuracy well above chance (0.5)."""
    from trainfeed.benchmarks.synth import generate_images

    generate_images(tmp_path / "train", 192, size=(48, 48), seed=1)
    generate_images(tmp_path / "held", 64, size=(48, 48), seed=2)
    train = convert(tmp_path / "train", tmp_path / "train.parquet", "--to", "parquet", "--row-group-size", "64KB")
    held = convert(tmp_path / "held", tmp_path / "held.h5", "--to", "hdf5")
    res = train_cli("--data", train, "--eval-data", held, "--image-size", "32x32", "--epochs", "4", "--width", "8",
                    "--batch-size", "16", "--lr", "0.003", "--out", tmp_path / "o", "--json")
    assert res.exit_code == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["sample_shape"] == [32, 32, 3] and s["config"]["epoch"]["augment"] is True
    assert s["eval"]["samples"] == 64 and s["eval"]["accuracy"] >= 0.8, s["eval"]
