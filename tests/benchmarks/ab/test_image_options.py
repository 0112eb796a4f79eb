"""`storage-bench run --image-mode / --reduce-depth / --promote-depth` (issue #32): the options
its conversion errors suggest exist on `run` and reach the conversion of the compacted stores,
as `convert`'s."""
from __future__ import annotations

import re

import numpy as np
import pytest
import typer
from PIL import Image

import trainfeed
from trainfeed.benchmarks.cli import app

from .test_storage_bench import bench_cli, records_of

#: 16 images of 4 per batch: more batches than the 2 steps and the prefetch depth take
PER_CLASS, SIZE = 16, 16
FAST = ["--nodes", "t4", "--stores", "blob,parquet", "--image-storage", "decoded", "--storage-profile", "none",
        "--width", "8", "--batch-size", "4", "--steps", "2", "--workers", "2", "--json"]


def png_folder(root, depths) -> dict[str, np.ndarray]:
    """Greyscale PNGs in class folders a/ and b/, the n-th of each at depths[n % len(depths)]
    bits; returns sample id -> pixels as written."""
    rng = np.random.default_rng(7)
    written = {}
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for n in range(PER_CLASS):
            bits = depths[n % len(depths)]
            pixels = rng.integers(0, 1 << bits, (SIZE, SIZE), dtype=np.uint16 if bits == 16 else np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{cls}{n:02d}.png")
            written[f"{cls}/{cls}{n:02d}"] = pixels
    return written


def stored_pixels(store: str) -> dict[str, np.ndarray]:
    """Sample id -> pixels of every sample of a store, as its batches deliver them."""
    out = {}
    for batch in trainfeed.open_store(store).batches(batch_size=8, shuffle=False):
        out.update(zip(batch.ids, batch.x))
    return out


def run_options() -> set[str]:
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in param.opts}


def converted_alike(src, dst, **image) -> dict[str, np.ndarray]:
    """The pixels `convert` stores with the same image options (what storage-bench passes on)."""
    trainfeed.convert(str(src), str(dst), format="parquet", image_storage="decoded", **image)
    return stored_pixels(str(dst))


def assert_same_pixels(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for sample_id, pixels in got.items():
        np.testing.assert_array_equal(pixels, expected[sample_id], err_msg=sample_id)


def test_mixed_depth_folder_converts_with_the_options_its_errors_suggest(tmp_path):
    src = tmp_path / "pngs"
    written = png_folder(src, depths=(8, 16))
    res = bench_cli("run", src, "--out", tmp_path / "refused", *FAST)
    assert res.exit_code == 1  # no store holds one bit depth: every cell fails
    (why,) = [r["error"] for r in records_of(tmp_path / "refused") if r["store"] == "parquet-decoded"]
    assert "use --image-mode L to keep its 16-bit pixels, or --reduce-depth to take it at 8 bits" in why
    suggested = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", res.stderr))
    assert {"--image-mode", "--reduce-depth"} <= suggested <= run_options()

    out = tmp_path / "reduced"  # every image at 8 bits, as RGB (--image-mode's default)
    res = bench_cli("run", src, "--out", out, "--reduce-depth", *FAST)
    assert res.exit_code == 0, res.stderr
    (cell,) = [r for r in records_of(out) if r["kind"] == "cell"]  # the small files still mix depths
    assert (cell["store"], cell["sample_shape"], cell["ingest_only"]["samples"]) == (
        "parquet-decoded", [SIZE, SIZE, 3], 2 * PER_CLASS)
    got = stored_pixels(str(out / "stores" / "parquet-decoded"))
    assert_same_pixels(got, converted_alike(src, tmp_path / "convert-reduced", reduce_depth=True))
    for sample_id, pixels in written.items():
        if pixels.dtype == np.uint8:  # already 8 bits: kept as they are
            np.testing.assert_array_equal(got[sample_id], np.repeat(pixels[..., None], 3, axis=2))

    out = tmp_path / "promoted"  # every image at 16 bits, every bit kept: both compacted stores
    res = bench_cli("run", src, "--out", out, "--image-mode", "L", "--promote-depth", *FAST,
                    "--image-storage", "encoded,decoded")
    assert res.exit_code == 0, res.stderr
    cells = {r["store"]: r for r in records_of(out) if r["kind"] == "cell"}
    assert {s: c["sample_shape"] for s, c in cells.items()} == {"parquet-encoded": [SIZE, SIZE, 1],
                                                                "parquet-decoded": [SIZE, SIZE, 1]}
    promoted = {i: (p if p.dtype == np.uint16 else p.astype(np.uint16) * 257) for i, p in written.items()}
    for store in cells:
        got = stored_pixels(str(out / "stores" / store))
        assert_same_pixels({i: p.reshape(SIZE, SIZE) for i, p in got.items()}, promoted)


def test_image_mode_l_keeps_16_bit_greyscale_and_every_store_is_measured(tmp_path):
    written = png_folder(tmp_path / "pngs", depths=(16,))
    res = bench_cli("run", tmp_path / "pngs", "--out", tmp_path / "o", "--image-mode", "l", *FAST)
    assert res.exit_code == 0, res.stderr
    cells = {r["store"]: r for r in records_of(tmp_path / "o") if r["kind"] == "cell"}
    # the decoded store holds (H, W) pixels, which the models take as (H, W, 1), as the small files'
    assert {s: c["sample_shape"] for s, c in cells.items()} == {"blob": [SIZE, SIZE, 1],
                                                                "parquet-decoded": [SIZE, SIZE, 1]}
    assert cells["parquet-decoded"]["stages"]["pixel_bytes_per_sample"] == SIZE * SIZE * 2
    got = stored_pixels(str(tmp_path / "o" / "stores" / "parquet-decoded"))
    assert {p.dtype for p in got.values()} == {np.dtype(np.uint16)}
    assert_same_pixels({i: p.reshape(SIZE, SIZE) for i, p in got.items()}, written)


@pytest.mark.parametrize("mode", ["CMYK", ""])
def test_image_mode_other_than_rgb_or_l_is_a_usage_error(tmp_path, mode):
    (tmp_path / "empty").mkdir()
    res = bench_cli("run", tmp_path / "empty", "--out", tmp_path / "o", "--image-mode", mode)
    assert res.exit_code == 2 and f"--image-mode must be RGB or L, not {mode!r}" in res.stderr
    assert not (tmp_path / "o").exists()
