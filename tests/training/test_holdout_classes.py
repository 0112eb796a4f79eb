"""Labels as convert takes them, wherever a folder is read: SRC/labels.csv by default for
`train --format blob`, and --classes numbering class names so that a held-out set missing a
class scores against the training set's numbers."""
from __future__ import annotations

import json

import numpy as np
import pytest

import trainfeed
from tests.conftest import run_cli, write_volumes
from trainfeed.converters.cli import app as convert_app
from trainfeed.training.cli import app as train_app

SHAPE = (6, 6, 2, 1)


def class_folders(root, classes: list[str], per_class: int = 8) -> dict[str, str]:
    """Volumes in one subfolder per class; id -> class."""
    rng = np.random.default_rng(len(classes))
    out = {}
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            np.save(root / c / f"v{i}.npy", rng.normal(size=SHAPE).astype(np.float32))
            out[f"{c}/v{i}"] = c
    return out


def labels_of(store) -> dict[str, int]:
    return {sid: int(y) for b in store.batches(4, shuffle=False) for sid, y in zip(b.ids, b.y)}


def test_classes_number_a_holdout_missing_a_class_as_the_training_set(tmp_path):
    train_ids = class_folders(tmp_path / "train", ["cat", "cow", "dog"])
    held_ids = class_folders(tmp_path / "held", ["cat", "dog"])
    run_cli(convert_app, tmp_path / "train", tmp_path / "train.parquet", "--to", "parquet", "--no-progress")
    res = run_cli(convert_app, tmp_path / "held", tmp_path / "held.parquet", "--to", "parquet", "--no-progress")
    assert res.exit_code == 0
    common = ["--data", tmp_path / "train.parquet", "--batch-size", "4", "--width", "4", "--no-progress"]
    res = run_cli(train_app, *common, "--eval-data", tmp_path / "held.parquet", "--out", tmp_path / "a")
    assert res.exit_code == 1 and "class 'dog' is label 1 in --eval-data but 2 in --data" in res.stderr

    res = run_cli(convert_app, tmp_path / "held", tmp_path / "held2.parquet", "--to", "parquet", "--classes",
                  "cat,cow,dog", "--json", "--no-progress")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["label_map"] == {"cat": 0, "cow": 1, "dog": 2}
    got = labels_of(trainfeed.open_store(str(tmp_path / "held2.parquet")))
    assert got == {sid: {"cat": 0, "dog": 2}[c] for sid, c in held_ids.items()}
    res = run_cli(train_app, *common, "--eval-data", tmp_path / "held2.parquet", "--out", tmp_path / "b", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["eval"]["samples"] == len(held_ids)

    # a folder read in place takes them too, for --data and --eval-data alike
    blob = trainfeed.open_store(str(tmp_path / "held"), format="blob", classes=["cat", "cow", "dog"])
    assert labels_of(blob) == got
    res = run_cli(train_app, "--data", tmp_path / "train", "--format", "blob", "--eval-data", tmp_path / "held",
                  "--classes", "cat,cow,dog", "--batch-size", "4", "--width", "4", "--no-progress", "--json",
                  "--out", tmp_path / "c")
    assert res.exit_code == 0, res.stderr
    assert len(train_ids) == 24


def test_a_class_not_listed_is_an_error_naming_it(tmp_path):
    class_folders(tmp_path / "held", ["cat", "emu"])
    with pytest.raises(trainfeed.TrainfeedError, match="class 'emu' is not in --classes"):
        trainfeed.convert(str(tmp_path / "held"), str(tmp_path / "o.parquet"), format="parquet",
                          classes=["cat", "dog"])
    with pytest.raises(trainfeed.UsageError, match="--classes takes class names joined by commas, each once"):
        trainfeed.convert(str(tmp_path / "held"), str(tmp_path / "o.parquet"), format="parquet",
                          classes=["cat", "cat"])


def test_train_reads_a_folders_labels_csv_as_convert_does(tmp_path):
    truth = write_volumes(tmp_path / "v", 24, shape=SHAPE)  # writes v/labels.csv
    store = trainfeed.open_store(str(tmp_path / "v"), format="blob")
    assert labels_of(store) == {sid: label for sid, (_, label) in truth.items()}
    res = run_cli(train_app, "--data", tmp_path / "v", "--format", "blob", "--batch-size", "4", "--width", "4",
                  "--no-progress", "--out", tmp_path / "o")
    assert res.exit_code == 0, res.stderr


def test_options_objects_take_classes_and_cast_for_a_folder(tmp_path):
    ids = class_folders(tmp_path / "f", ["cat", "dog"])
    for i, sid in enumerate(sorted(ids)):  # every other file in another dtype
        if i % 2:
            np.save(tmp_path / "f" / f"{sid}.npy", np.load(tmp_path / "f" / f"{sid}.npy").astype(np.float64))
    opts = trainfeed.OpenOptions(classes=("dog", "cat"), cast="auto")
    store = trainfeed.open_store(str(tmp_path / "f"), format="blob", options=opts)
    assert store.dtype == "float64" and store.label_map == {"dog": 0, "cat": 1}
    assert labels_of(store) == {sid: {"dog": 0, "cat": 1}[c] for sid, c in ids.items()}
    result = trainfeed.train(trainfeed.TrainConfig(data=str(tmp_path / "f"), fmt="blob", width=4,
                                                   out=str(tmp_path / "o"), progress=False,
                                                   store=trainfeed.OpenOptions(classes=("dog", "cat"), cast="auto"),
                                                   epoch=trainfeed.EpochOptions(batch_size=4)))
    assert result.summary["steps"] == 4
