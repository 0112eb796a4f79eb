"""Hostile or damaged input to `train` (issue #8): checkpoints that would run code or are not
ours, resume by data content, --eval-data checked before the first step, sample ranks,
usage errors, stores whose columns or counts disagree, and secrets kept out of every output."""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.conftest import run_cli, write_volumes
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.storage.pins import pin_files
from trainfeed.training.reading.readers import EpochOptions, iter_batches, open_store

SHAPE = (4, 4, 2, 1)
N = 16
TINY = ["--width", "4", "--batch-size", "4", "--workers", "1", "--lr", "0.01"]


def train_cli(*args):
    from trainfeed.training.cli import app

    return run_cli(app, *args, "--no-progress")


def convert(src: Path, dst: Path, *args) -> Path:
    from trainfeed.converters.cli import app

    res = run_cli(app, src, dst, *args, "--no-progress")
    assert res.exit_code == 0, res.stderr
    return dst


def volume_store(root: Path, name: str, fmt: str, *, seed: int = 0, shape=SHAPE, dtype="float32", n: int = N) -> Path:
    """``n`` labeled volumes converted to ``fmt`` at root/name (sources under root/src-name)."""
    src = root / f"src-{name}"
    write_volumes(src, n, shape=shape, dtype=dtype, seed=seed)
    return convert(src, root / name, "--to", fmt, "--labels", src / "labels.csv")


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("safety")
    return {fmt: volume_store(root, name, fmt) for fmt, name in
            (("hdf5", "st.h5"), ("parquet", "st.parquet"), ("delta", "st.delta"))}


def assert_clean_error(res, code: int, *parts: str) -> None:
    """Exit ``code``, an `error: ...` line holding every part, no traceback, no generic fallback."""
    out = res.stdout + res.stderr
    assert res.exit_code == code, out
    assert res.stderr.startswith("error: "), res.stderr
    assert "Traceback" not in out and "unexpected" not in out, out
    for part in parts:
        assert part in res.stderr, res.stderr


# ---------------------------------------------------------------- 1. checkpoints run no code


class _Plant:
    """Unpickling this creates ``marker``: what a crafted checkpoint could do to the machine."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _torch_pickle(path: Path, marker: Path) -> None:
    import torch

    torch.save({"model": _Plant(str(marker)), "signature": "x", "epoch": 0}, path)


def _raw_pickle(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps({"model": _Plant(str(marker))}))


@pytest.mark.parametrize("craft", [_torch_pickle, _raw_pickle], ids=["torch-zip", "raw-pickle"])
def test_a_crafted_checkpoint_never_runs_code(tmp_path, stores, craft):
    ckpt, marker = tmp_path / "ckpt", tmp_path / "PWNED"
    ckpt.mkdir()
    craft(ckpt / "checkpoint.pt", marker)
    res = train_cli("--data", stores["hdf5"], "--checkpoint-dir", ckpt, "--resume", "--out", tmp_path / "o", *TINY)
    assert not marker.exists()
    assert_clean_error(res, 1, f"{ckpt / 'checkpoint.pt'}: not a trainfeed checkpoint")
    assert not (tmp_path / "o" / "steps.jsonl").exists()


def _truncated(path: Path) -> None:
    import torch

    torch.save({"weights": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:600])


def _foreign_tensor(path: Path) -> None:
    import torch

    torch.save(torch.zeros(3), path)


def _marker_without_keys(path: Path) -> None:
    import torch

    torch.save({"format": "trainfeed-checkpoint/1", "epoch": -1}, path)


@pytest.mark.parametrize("make,message", [
    (lambda p: p.write_bytes(b""), "not a trainfeed checkpoint (empty, truncated or not a PyTorch file)"),
    (_truncated, "not a trainfeed checkpoint (empty, truncated or not a PyTorch file)"),
    (lambda p: p.write_bytes(b"PK\x03\x04" + bytes(300)), "not a trainfeed checkpoint (empty, truncated or not a "
                                                            "PyTorch file)"),
    (_foreign_tensor, "not a trainfeed checkpoint (no 'trainfeed-checkpoint/1' marker)"),
    (_marker_without_keys, "damaged trainfeed checkpoint: model, optimizer, scaler, epoch, step_in_epoch"),
], ids=["empty", "truncated", "bad-zip", "foreign-tensor", "marker-only"])
def test_a_checkpoint_that_is_not_ours_is_refused(tmp_path, stores, make, message):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    make(ckpt / "checkpoint.pt")
    res = train_cli("--data", stores["hdf5"], "--checkpoint-dir", ckpt, "--resume", "--out", tmp_path / "o", *TINY)
    assert_clean_error(res, 1, f"error: {ckpt / 'checkpoint.pt'}: ", message)


@pytest.fixture(scope="module")
def tf_checkpoint(tmp_path_factory, stores) -> Path:
    """A real TensorFlow checkpoint folder of a 1-epoch run on stores['hdf5']."""
    root = tmp_path_factory.mktemp("tfckpt")
    res = train_cli("--data", stores["hdf5"], "--framework", "tf", "--checkpoint-dir", root / "ckpt",
                    "--out", root / "o", *TINY)
    assert res.exit_code == 0, res.stderr
    return root / "ckpt"


def _tf_foreign(ckpt: Path) -> None:
    import tensorflow as tf

    shutil.rmtree(ckpt)
    tf.train.CheckpointManager(tf.train.Checkpoint(w=tf.Variable([1.0, 2.0])), str(ckpt), max_to_keep=1).save()


def _tf_emptied(ckpt: Path) -> None:
    for f in ckpt.glob("ckpt-*"):
        f.write_bytes(b"")


def _tf_corrupt_data(ckpt: Path) -> None:
    for f in ckpt.glob("ckpt-*.data-*"):
        f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 3])


@pytest.mark.tf
@pytest.mark.parametrize("damage,message", [
    (_tf_foreign, "not a trainfeed checkpoint (no 'trainfeed-checkpoint/1' marker)"),
    (_tf_emptied, "not a readable TensorFlow checkpoint"),
    (_tf_corrupt_data, "checkpoint cannot be restored into this model (damaged"),
    (lambda ckpt: (ckpt / "checkpoint").write_text("}}} not a checkpoint state {{{"), "no readable checkpoint"),
], ids=["foreign", "emptied", "truncated-data", "garbage-state-file"])
def test_tf_checkpoint_that_is_not_ours_or_damaged_is_refused(tmp_path, stores, tf_checkpoint, damage, message):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tf_checkpoint, ckpt)
    damage(ckpt)
    res = train_cli("--data", stores["hdf5"], "--framework", "tf", "--checkpoint-dir", ckpt, "--resume",
                    "--epochs", "2", "--out", tmp_path / "o", *TINY)
    assert_clean_error(res, 1, message)
    assert str(ckpt) in res.stderr


@pytest.mark.tf
def test_tf_checkpoint_resumes_and_holds_no_pickle(tmp_path, stores, tf_checkpoint):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tf_checkpoint, ckpt)
    import tensorflow as tf

    # all there is: TensorFlow's state file, index and tensors (no pickle, no sidecar); marker and
    # what the checkpoint was written for are tensors in it
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    reader = tf.train.load_checkpoint(str(ckpt / "ckpt-1"))
    assert reader.get_tensor("format/.ATTRIBUTES/VARIABLE_VALUE") == b"trainfeed-checkpoint/1"
    res = train_cli("--data", stores["hdf5"], "--framework", "tf", "--checkpoint-dir", ckpt, "--resume",
                    "--epochs", "2", "--out", tmp_path / "o", "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["resumed_from_step"] == N // 4 and s["global_step"] == 2 * N // 4 and s["steps"] == N // 4


# ---------------------------------------------------------------- 2. --resume with nothing to resume


@pytest.mark.parametrize("framework", ["torch", pytest.param("tf", marks=pytest.mark.tf)])
def test_resume_without_a_checkpoint_starts_from_the_first_step(tmp_path, stores, framework):
    ckpt = tmp_path / "ckpt"
    res = train_cli("--data", stores["hdf5"], "--framework", framework, "--checkpoint-dir", ckpt, "--resume",
                    "--out", tmp_path / "o", "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    assert f"train: --resume: no checkpoint in {ckpt} yet" in res.stderr
    assert json.loads(res.stdout)["global_step"] == N // 4
    assert "when there is none yet, start from the first step" in " ".join(train_cli("--help").stdout.split())


# ---------------------------------------------------------------- 3. checkpoints match data by content


@pytest.mark.parametrize("fmt,name", [("hdf5", "st.h5"), ("parquet", "st.parquet"), ("delta", "st.delta")])
def test_the_same_store_by_another_path_resumes(tmp_path, monkeypatch, fmt, name):
    store = volume_store(tmp_path, name, fmt)
    ckpt = tmp_path / "ckpt"
    first = train_cli("--data", store, "--checkpoint-dir", ckpt, "--out", tmp_path / "o1", *TINY)
    assert first.exit_code == 0, first.stderr
    monkeypatch.chdir(tmp_path)
    res = train_cli("--data", f"./{name}", "--checkpoint-dir", "ckpt", "--resume", "--epochs", "2",
                    "--out", "o2", "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["resumed_from_step"] == N // 4 and s["global_step"] == 2 * N // 4


@pytest.mark.parametrize("fmt,name", [("hdf5", "st.h5"), ("parquet", "st.parquet"), ("delta", "st.delta")])
def test_other_data_at_the_same_path_is_refused(tmp_path, fmt, name):
    store = volume_store(tmp_path, name, fmt, seed=1)
    ckpt = tmp_path / "ckpt"
    assert train_cli("--data", store, "--checkpoint-dir", ckpt, "--out", tmp_path / "o1", *TINY).exit_code == 0
    shutil.rmtree(store) if store.is_dir() else store.unlink()
    volume_store(tmp_path, name, fmt, seed=2)  # same ids, count, shape and dtype; other values and labels
    res = train_cli("--data", store, "--checkpoint-dir", ckpt, "--resume", "--epochs", "2", "--out", tmp_path / "o2",
                    *TINY)
    assert_clean_error(res, 1, "checkpoint cannot be resumed by this run: written for other data")


@pytest.mark.parametrize("fmt,name", [("hdf5", "st.h5"), ("hdf5", "shards"), ("parquet", "st.parquet"),
                                      ("delta", "st.delta"), ("blob", None)])
def test_fingerprint_follows_content_not_path(tmp_path, monkeypatch, fmt, name):
    """Stores written before store_id existed: the fallback fingerprint."""
    from trainfeed.training.reading.readers import store_identity

    monkeypatch.chdir(tmp_path)

    def opened(seed: int, path: str):
        if fmt == "blob":
            write_volumes(tmp_path / f"b{seed}", N, shape=SHAPE, seed=seed, folders=True)
            return open_store(path.format(seed=seed), "blob")
        volume_store(tmp_path / f"s{seed}", name, fmt, seed=seed)
        return open_store(path.format(seed=seed))

    def identity(store) -> str:
        store.schema.store_id = None
        return store_identity(store)

    rel = "./b{seed}" if fmt == "blob" else f"./s{{seed}}/{name}"
    a_rel = opened(1, rel)
    a_abs = open_store(str(tmp_path / rel.format(seed=1)), "blob" if fmt == "blob" else None)
    b = opened(2, rel)
    assert identity(a_rel) == identity(a_abs)
    assert identity(a_rel) != identity(b)
    # a store id, when the writer gave one, is what counts
    a_rel.schema.store_id = b.schema.store_id = "id-1"
    assert store_identity(a_rel) == store_identity(b)
    b.schema.store_id = "id-2"
    assert store_identity(a_rel) != store_identity(b)


# ---------------------------------------------------------------- 4. --eval-data checked up front


def _labels_0_to_2(root: Path) -> Path:
    src = root / "src-three"
    write_volumes(src, N, shape=SHAPE, labels_csv=False)
    (root / "three.csv").write_text("id,label\n" + "".join(f"v{i:03d},{i % 3}\n" for i in range(N)))
    return convert(src, root / "three.h5", "--to", "hdf5", "--labels", root / "three.csv")


def _other_field(root: Path) -> Path:
    src = root / "src-npz"
    src.mkdir()
    for i in range(N):
        np.savez(src / f"v{i:03d}.npz", scan=np.zeros(SHAPE, np.float32))
    (root / "npz.csv").write_text("id,label\n" + "".join(f"v{i:03d},{i % 2}\n" for i in range(N)))
    return convert(src, root / "npz.h5", "--to", "hdf5", "--labels", root / "npz.csv")


def _unlabeled(root: Path) -> Path:
    write_volumes(root / "src-u", N, shape=SHAPE, labels_csv=False)
    return convert(root / "src-u", root / "u.h5", "--to", "hdf5")


@pytest.mark.parametrize("make,message", [
    (lambda r: volume_store(r, "wide.h5", "hdf5", shape=(4, 4, 2, 2)), "holds float32 samples of shape (4, 4, 2, 2)"),
    (lambda r: volume_store(r, "f64.h5", "hdf5", dtype="float64"), "holds float64 samples of shape (4, 4, 2, 1)"),
    (_other_field, "store has no field 'volume'"),
    (_unlabeled, "store is unlabeled"),
    (_labels_0_to_2, "--eval-data labels range over 0..2, the model predicts 0..1"),
    (lambda r: r / "missing.h5", "not found"),
], ids=["shape", "dtype", "field", "unlabeled", "label-range", "missing"])
def test_eval_data_is_checked_before_training(tmp_path, stores, make, message):
    eval_store = make(tmp_path)
    res = train_cli("--data", stores["hdf5"], "--eval-data", eval_store, "--out", tmp_path / "o", *TINY)
    assert_clean_error(res, 1, f"error: {eval_store}: ", message)
    assert not (tmp_path / "o").exists()  # not one training step


def test_eval_data_with_clashing_class_names_is_refused(tmp_path, stores):
    from tests.conftest import write_images

    write_images(tmp_path / "a", 8, size=(8, 8))  # classes a -> 0, b -> 1
    (tmp_path / "b" / "a").mkdir(parents=True)
    (tmp_path / "b" / "b").mkdir()
    (tmp_path / "b" / "aa").mkdir()
    for i, f in enumerate(sorted((tmp_path / "a").rglob("*.jpg"))):  # classes a -> 0, aa -> 1, b -> 2
        shutil.copy(f, tmp_path / "b" / ("a", "aa", "b")[i % 3] / f.name)
    train = convert(tmp_path / "a", tmp_path / "a.h5", "--to", "hdf5", "--image-storage", "decoded")
    held_out = convert(tmp_path / "b", tmp_path / "b.h5", "--to", "hdf5", "--image-storage", "decoded")
    res = train_cli("--data", train, "--eval-data", held_out, "--num-classes", "3", "--out", tmp_path / "o", *TINY)
    assert_clean_error(res, 1, f"{held_out}: class 'b' is label 2 in --eval-data but 1 in --data")


# ---------------------------------------------------------------- 5. sample ranks


@pytest.mark.parametrize("framework", ["torch", pytest.param("tf", marks=pytest.mark.tf)])
def test_greyscale_hw_store_trains_with_a_channel_axis(tmp_path, framework):
    store = volume_store(tmp_path, "grey.h5", "hdf5", shape=(8, 8), dtype="uint8")
    held_out = volume_store(tmp_path, "grey-eval.h5", "hdf5", shape=(8, 8), dtype="uint8", seed=3)
    res = train_cli("--data", store, "--eval-data", held_out, "--framework", framework, "--out", tmp_path / "o",
                    "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["sample_shape"] == [8, 8] and s["steps"] == N // 4 and s["eval"]["samples"] == N


@pytest.mark.parametrize("shape", [(8,), (2, 2, 2, 2, 1)])
def test_sample_ranks_no_model_takes_are_refused(tmp_path, shape):
    store = volume_store(tmp_path, "odd.h5", "hdf5", shape=shape)
    res = train_cli("--data", store, "--out", tmp_path / "o", *TINY)
    assert_clean_error(res, 1, f"{store}: field 'volume' holds samples of shape {shape}; the models take images "
                               "(H, W) or (H, W, C) and volumes (X, Y, Z, C)")


# ---------------------------------------------------------------- 6. usage errors exit 2


@pytest.mark.parametrize("args,message", [
    (["--lr", "-0.1"], "--lr must be a positive number, not -0.1"),
    (["--lr", "0"], "--lr must be a positive number, not 0.0"),
    (["--lr", "nan"], "--lr must be a positive number, not nan"),
    (["--lr", "inf"], "--lr must be a positive number, not inf"),
    (["--seed", "-1"], "--seed must be between 0 and 4294967295, not -1"),
    (["--seed", str(2**32)], "--seed must be between 0 and 4294967295"),
    (["--warmup-steps", "-1"], "--warmup-steps must be 0 or more, not -1"),
    (["--warmup-steps", "9", "--epochs", "2"], "--warmup-steps 9 is more than the 8 steps of this run"),
    (["--data", "{delta}", "--delta-version", "-1"], "--delta-version must be 0 or more, not -1"),
    (["--data", "{delta}", "--delta-version", "3"], "--delta-version 3: {delta} has versions 0..0"),
    (["--delta-version", "0"], "--delta-version applies to Delta tables only; {hdf5} is a hdf5 store"),
    (["--out", "{file}"], "{file}: --out must be a folder; it is a file"),
    (["--out", "{file}/sub"], "{file}/sub: --out must be a folder; {file} is a file"),
    (["--checkpoint-dir", "{file}"], "{file}: --checkpoint-dir must be a folder; it is a file"),
], ids=["lr-negative", "lr-zero", "lr-nan", "lr-inf", "seed-negative", "seed-too-big", "warmup-negative",
        "warmup-too-many", "delta-version-negative", "delta-version-beyond", "delta-version-not-delta",
        "out-file", "out-under-file", "checkpoint-dir-file"])
def test_usage_errors_exit_2(tmp_path, stores, args, message):
    (tmp_path / "f").write_text("not a folder")
    fill = dict(hdf5=stores["hdf5"], delta=stores["delta"], file=tmp_path / "f")
    args = [a.format(**fill) for a in args]
    res = train_cli("--data", stores["hdf5"], "--out", tmp_path / "o", *TINY, *args)  # later options win
    assert_clean_error(res, 2, message.format(**fill))
    assert not (tmp_path / "o" / "steps.jsonl").exists()


# ---------------------------------------------------------------- 7. columns and counts agree


@pytest.mark.parametrize("dataset", ["label", "id"])
def test_hdf5_dataset_shorter_than_the_tensors_is_refused(tmp_path, convert_cli, dataset):
    write_volumes(tmp_path / "v", N, shape=SHAPE)
    assert convert_cli(tmp_path / "v", tmp_path / "s.h5", "--to", "hdf5", "--labels",
                       tmp_path / "v" / "labels.csv").exit_code == 0
    with h5py.File(tmp_path / "s.h5", "a") as h5:
        h5[dataset].resize(N - 4, axis=0)
    res = train_cli("--data", tmp_path / "s.h5", "--out", tmp_path / "o", *TINY)
    lengths = {"id": N, "label": N, "volume": N, dataset: N - 4}
    assert_clean_error(res, 1, f"error: {tmp_path / 's.h5'}: datasets hold different numbers of samples "
                               f"(id {lengths['id']}, label {lengths['label']}, volume {lengths['volume']})")


def test_hdf5_dataset_of_another_shape_than_the_schema_is_refused(tmp_path):
    store = volume_store(tmp_path, "s.h5", "hdf5")
    with h5py.File(store, "a") as h5:
        del h5["volume"]
        h5["volume"] = np.zeros((N, 4, 4, 2, 2), np.float32)
    res = train_cli("--data", store, "--out", tmp_path / "o", *TINY)
    assert_clean_error(res, 1, f"error: {store}: dataset 'volume' holds float32 samples of shape (4, 4, 2, 2), "
                               "the store's schema says float32 (4, 4, 2, 1)")


@pytest.mark.parametrize("where,message", [
    ("schema", "{store}: the store declares 24 samples, its files hold 16"),
    ("part", "{store}/part-00000.parquet: the store's manifest declares 24 samples in this file, it holds 16"),
])
def test_parquet_manifest_declaring_more_samples_is_refused(tmp_path, where, message):
    store = volume_store(tmp_path, "st.parquet", "parquet")
    manifest_path = store / "_trainfeed.json"
    manifest = json.loads(manifest_path.read_text())
    if where == "schema":
        manifest["schema"]["samples"] = N + 8
    else:
        manifest["parts"][0]["rows"] = N + 8
    manifest_path.write_text(json.dumps(manifest))
    res = train_cli("--data", store, "--out", tmp_path / "o", *TINY)
    assert_clean_error(res, 1, message.format(store=store))


def test_hdf5_file_shrinking_after_open_stops_the_epoch(tmp_path):
    store = volume_store(tmp_path, "s.h5", "hdf5")
    opened = open_store(str(store))
    with h5py.File(store, "a") as h5:
        h5["label"].resize(N - 4, axis=0)
    with pytest.raises(TrainfeedError, match="the store changed while it was being read .*; reopen it"):
        list(iter_batches(opened, EpochOptions(batch_size=4, workers=1, drop_last=True)))
    opener = opened.listing.opener
    opener.pins = pin_files(list(opener.pins))  # a change the pins cannot see: the counts still stop it
    with pytest.raises(TrainfeedError, match=f"{store}: read {N} ids, {N - 4} labels and {N} samples where {N} "
                                             "were listed"):
        list(iter_batches(opened, EpochOptions(batch_size=4, workers=1, drop_last=True)))


# ---------------------------------------------------------------- 8. secrets


def _everything_written(res, *folders: Path) -> str:
    files = [f for folder in folders if folder.exists() for f in folder.rglob("*") if f.is_file()]
    return res.stdout + res.stderr + "".join(f.read_bytes().decode("utf-8", "replace") for f in files)


@pytest.mark.parametrize("data", [
    "file://{tmp}/nowhere?sig=PLANTEDURLFAIL",
    "abfs://user:PLANTEDURLFAIL@container/path?sig=PLANTEDURLFAIL",
    "{hdf5}",  # the secret in --eval-data
])
def test_a_secret_in_a_failing_run_is_never_printed(tmp_path, stores, data):
    url = data.format(tmp=tmp_path, hdf5=stores["hdf5"])
    res = train_cli("--data", url, "--eval-data", f"file://{tmp_path}/held?sig=PLANTEDURLFAIL", "--json",
                    "--storage-option", "account_key=PLANTEDOPTFAIL", "--out", tmp_path / "o", *TINY)
    assert res.exit_code in (1, 2) and res.stderr.startswith("error: "), res.stderr
    written = _everything_written(res, tmp_path / "o")
    assert "PLANTEDURLFAIL" not in written and "PLANTEDOPTFAIL" not in written


def test_a_secret_in_a_successful_run_is_never_written(tmp_path):
    folder = tmp_path / "vols?sig=PLANTEDURLSECRET"  # a real folder: the URL's query reaches the local filesystem
    write_volumes(folder, N, shape=SHAPE, folders=True)
    url = f"file://{folder}"
    res = train_cli("--data", url, "--eval-data", url, "--storage-option", "account_key=PLANTEDOPTSECRET",
                    "--checkpoint-dir", tmp_path / "ckpt", "--resume", "--out", tmp_path / "o", "--json", *TINY)
    assert res.exit_code == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["format"] == "blob" and s["steps"] == N // 4 and s["eval"]["samples"] == N
    written = _everything_written(res, tmp_path / "o", tmp_path / "ckpt")
    assert "PLANTEDURLSECRET" not in written and "PLANTEDOPTSECRET" not in written
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["store"] == f"file://{tmp_path}/vols?***"
