"""Axis order said, never guessed, and no bit lost silently: channels-first samples are warned
of at conversion and refused by `train` until the channel axis is named; 8- and 16-bit greyscale
images keep every bit with --promote-depth, and the summary counts what changed depth."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

import trainfeed
from tests.conftest import run_cli
from trainfeed.converters.cli import app as convert_app
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.training.cli import app as train_app


def write_slices(src, n: int = 16, shape=(1, 12, 12)) -> None:
    """PyTorch-style (C, H, W) slices, label = sign of the mean."""
    rng = np.random.default_rng(7)
    src.mkdir(parents=True)
    rows = []
    for i in range(n):
        arr = rng.normal(size=shape).astype(np.float32) + (1 if i % 2 else -1)
        np.save(src / f"s{i:02d}.npy", arr)
        rows.append(f"s{i:02d},{i % 2}\n")
    (src / "labels.csv").write_text("id,label\n" + "".join(rows))


def test_channels_first_is_warned_of_refused_unsaid_and_moved_last_when_said(tmp_path):
    write_slices(tmp_path / "src")
    res = run_cli(convert_app, tmp_path / "src", tmp_path / "s.parquet", "--to", "parquet", "--no-progress")
    assert res.exit_code == 0, res.stderr
    assert "warning   field 'volume' holds samples of shape (1, 12, 12), which looks channels-first" in res.stdout
    common = ["--batch-size", "4", "--width", "4", "--no-progress", "--json"]
    res = run_cli(train_app, "--data", tmp_path / "s.parquet", *common, "--out", tmp_path / "a")
    assert res.exit_code == 2
    assert "looks channels-first, and the store does not say: give --channels first" in res.stderr
    res = run_cli(train_app, "--data", tmp_path / "s.parquet", "--channels", "first", *common, "--out", tmp_path / "b")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["parameters"]["trainable"] > 0

    # recorded at conversion: no warning, and train reads it without the flag
    res = run_cli(convert_app, tmp_path / "src", tmp_path / "f.h5", "--to", "hdf5", "--channels", "first", "--json",
                  "--no-progress")
    summary = json.loads(res.stdout)
    assert summary["warnings"] == [] and summary["fields"][0]["channels"] == "first"
    res = run_cli(train_app, "--data", tmp_path / "f.h5", *common, "--out", tmp_path / "c")
    assert res.exit_code == 0, res.stderr


def test_the_model_sees_the_channels_last(tmp_path):
    from trainfeed.training.config import TrainConfig
    from trainfeed.training.loops.plan import as_model_input, plan

    write_slices(tmp_path / "src", 8, shape=(3, 6, 9))
    unsaid = trainfeed.convert(str(tmp_path / "src"), str(tmp_path / "u.parquet"), format="parquet")
    assert len(unsaid.warnings) == 1 and "(3, 6, 9), which looks channels-first" in unsaid.warnings[0]
    said = trainfeed.convert(str(tmp_path / "src"), str(tmp_path / "s.parquet"), format="parquet", channels="first")
    assert said.warnings == []
    p = plan(TrainConfig(data=str(tmp_path / "s.parquet"), out=str(tmp_path / "o"),
                         epoch=trainfeed.EpochOptions(batch_size=4)))
    assert p.channels_first and p.input_shape == (6, 9, 3)
    batch = next(iter(trainfeed.open_store(str(tmp_path / "s.parquet")).batches(4, shuffle=False)))
    x = as_model_input(batch, p.input_shape, p.channels_first)
    assert x.shape == (4, 6, 9, 3) and np.array_equal(x[:, 2, 1, :], batch.x[:, :, 2, 1])


def png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("storage", ["encoded", "decoded"])
def test_8_and_16_bit_greyscale_keep_every_bit_with_promote_depth(tmp_path, storage):
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    rng = np.random.default_rng(1)
    eight = {f"a/e{i}": rng.integers(0, 256, (5, 4), dtype=np.uint8) for i in range(3)}
    deep = {f"a/d{i}": rng.integers(0, 4096, (5, 4), dtype=np.uint16) for i in range(2)}  # 12-bit CT in 16 bits
    for sid, px in {**eight, **deep}.items():
        (tmp_path / "src" / f"{sid}.png").write_bytes(png(px))
    dst = tmp_path / "o.parquet"
    res = run_cli(convert_app, tmp_path / "src", dst, "--to", "parquet", "--image-storage", storage, "--image-mode",
                  "L", "--no-progress")
    assert res.exit_code == 1 and "use --image-mode L --promote-depth" in res.stderr
    res = run_cli(convert_app, tmp_path / "src", dst, "--to", "parquet", "--image-storage", storage, "--image-mode",
                  "L", "--promote-depth", "--verify", "--json", "--no-progress")
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["depth_changed"] == 3 and summary["fields"][0]["dtype"] == "uint16"
    want = {**{k: v.astype(np.uint16) * 257 for k, v in eight.items()}, **deep}
    store = trainfeed.open_store(str(dst))
    got = {sid: x for b in store.batches(5, shuffle=False) for sid, x in zip(b.ids, b.x)}
    for sid, px in want.items():
        assert got[sid].dtype == np.uint16 and got[sid].reshape(5, 4).tobytes() == px.tobytes(), sid
        if sid in eight:
            assert (got[sid].reshape(5, 4) // 257).astype(np.uint8).tobytes() == eight[sid].tobytes()
    if storage == "encoded":
        stored = {sid: f["image"] for sid, _, f in FORMATS["parquet"].read_samples(dst)}
        assert stored["a/d0"] == (tmp_path / "src" / "a" / "d0.png").read_bytes()  # 16-bit files kept as they are


def test_promote_depth_needs_greyscale(tmp_path):
    with pytest.raises(trainfeed.UsageError, match="promote_depth=True stores greyscale images at 16 bits"):
        trainfeed.convert(str(tmp_path), str(tmp_path / "o.parquet"), format="parquet", promote_depth=True)
