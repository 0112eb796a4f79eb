"""Issue #26 (5): the keywords and members of the public API that no other test used (see
tests/test_public_api_coverage.py), each exercised through ``import trainfeed`` as a user
would, and each checked by what it does: samples bit for bit against the source files, the
files a store or a run leaves, the weights a run trains."""
from __future__ import annotations

import csv
import dataclasses
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import trainfeed
from tests.conftest import write_images, write_volumes

SHAPE = (4, 4, 2, 1)  # float32: 128 bytes a sample
N = 24
IMAGE_SIZE = (12, 16)

Row = tuple[str, int, bytes]


def rows_of(batches) -> list[Row]:
    """Every sample of ``batches`` as (id, label, tensor bytes), sorted."""
    return sorted((i, int(y), np.ascontiguousarray(x).tobytes()) for b in batches for i, x, y in zip(b.ids, b.x, b.y))


def truth_rows(truth: dict, ids=None) -> list[Row]:
    return sorted((i, lab, arr.tobytes()) for i, (arr, lab) in truth.items() if ids is None or i in ids)


def write_labels(path: Path, labels: dict[str, int]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "label"])
        writer.writerows(labels.items())


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """N volumes (labels.csv beside them) and their Parquet store: 3 row groups of 8 samples."""
    root = tmp_path_factory.mktemp("keywords")
    truth = write_volumes(root / "src", N, shape=SHAPE, seed=7)
    trainfeed.convert(str(root / "src"), str(root / "s.parquet"), format="parquet", row_group_size=8 * 128)
    trainfeed.convert(str(root / "src"), str(root / "s.h5"), format="hdf5")
    return {"root": root, "src": root / "src", "truth": truth, "parquet": str(root / "s.parquet"),
            "hdf5": str(root / "s.h5")}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """8 JPEGs in class folders a/ and b/, and their Parquet store (encoded images)."""
    root = tmp_path_factory.mktemp("photos")
    files = write_images(root / "imgs", 8, size=IMAGE_SIZE)
    trainfeed.convert(str(root / "imgs"), str(root / "i.parquet"), format="parquet")
    return {"root": root, "src": root / "imgs", "files": files, "parquet": str(root / "i.parquet")}


# ------------------------------------------------------------------ names

def test_version_is_the_installed_distributions():
    assert trainfeed.__version__ == importlib.metadata.version("trainfeed")


def test_error_classes_carry_their_exit_codes(data, tmp_path):
    assert (trainfeed.TrainfeedError.exit_code, trainfeed.UsageError.exit_code) == (1, 2)
    with pytest.raises(trainfeed.UsageError) as usage:
        trainfeed.convert(str(data["src"]), str(tmp_path / "x"), format="parquet", compression_level=100,
                          compression="zstd")
    with pytest.raises(trainfeed.TrainfeedError) as failure:
        trainfeed.open_store(str(tmp_path / "missing.parquet"), format="parquet")
    assert usage.value.exit_code == 2 and failure.value.exit_code == 1 and not (tmp_path / "x").exists()


# ------------------------------------------------------------------ convert

def test_convert_parquet_options_and_every_result_field(data, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(data["src"], src)
    (src / "bad.npy").write_bytes(b"not an array")
    dst = tmp_path / "s.parquet"
    result = trainfeed.convert(str(src), str(dst), format="parquet", labels=str(src / "labels.csv"),
                               storage_options={}, mode="create", compression="zstd", compression_level=3,
                               target_file_size="2KB", row_group_size=1024, tensor_column="list", workers=1,
                               on_error="skip", verify=True)
    assert rows_of(trainfeed.open_store(str(dst)).batches(5)) == truth_rows(data["truth"])
    parts = sorted(dst.glob("*.parquet"))
    files = [pq.ParquetFile(p) for p in parts]
    assert len(parts) == 2  # target_file_size: 2 KB of payload a file
    assert all(f.metadata.row_group(g).num_rows == 8 for f in files for g in range(f.num_row_groups))  # 1024 B
    assert all(f.metadata.row_group(0).column(c).compression == "ZSTD" for f in files for c in range(3))
    assert files[0].schema_arrow.field("volume").type == pa.list_(pa.float32())  # tensor_column="list"

    good = sorted(p for p in src.glob("v*.npy"))
    assert (result.format, result.output, result.source, result.mode) == ("parquet", str(dst), str(src), "create")
    assert (result.samples, result.rejected, result.files_in, result.ignored_files) == (N, 1, N + 1, 1)
    assert "bad.npy" in Path(result.rejects_report).read_text()  # on_error="skip": the file is reported
    assert result.files_out == len(parts) and result.workers == 1 and result.compression == "zstd"
    assert result.bytes_in == sum(p.stat().st_size for p in good)
    assert result.bytes_out == sum(p.stat().st_size for p in parts)  # the data files (not the manifest)
    assert result.payload_bytes == N * 128
    # seconds are rounded to the millisecond, the rate (to 0.01 MB/s) from the unrounded time
    slowest, fastest = (result.bytes_in / (result.seconds + d) / 1e6 for d in (0.0005, -0.0005))
    assert result.seconds > 0 and slowest - 0.005 <= result.mb_per_s <= fastest + 0.005
    assert (result.labels, result.label_map, result.labels_unmatched) == ("csv", None, 0)
    assert result.fields == [{"name": "volume", "dtype": "float32", "shape": list(SHAPE), "encoding": "raw"}]
    assert result.store_id == json.loads((dst / "_trainfeed.json").read_text())["schema"]["store_id"]
    assert result.verified == {"samples_checked": N, "other_rows": 0}
    assert result.details == {"row_groups": 3}
    # the convert --json summary, typed: the result is its own summary's
    summary = {**{k: v for k, v in dataclasses.asdict(result).items() if k != "details"}, **result.details}
    assert trainfeed.ConvertResult.from_summary(summary=summary) == result


def test_compression_level_reaches_the_codec(data, tmp_path):
    sizes = {}
    for level in (1, 19):
        dst = tmp_path / f"l{level}.parquet"
        result = trainfeed.convert(str(data["src"]), str(dst), format="parquet", compression="zstd",
                                   compression_level=level)
        assert rows_of(trainfeed.open_store(str(dst)).batches(8)) == truth_rows(data["truth"])
        sizes[level] = (result.bytes_out, [p.read_bytes() for p in sorted(dst.glob("*.parquet"))])
    assert sizes[1][1] != sizes[19][1]  # the same samples, compressed differently


def test_convert_images_resized_grey_decoded_into_hdf5_chunks(photos, tmp_path):
    import h5py

    dst = tmp_path / "i.h5"
    result = trainfeed.convert(str(photos["src"]), str(dst), format="hdf5", resize=(8, 12), image_mode="L",
                               image_storage="decoded", hdf5_chunk_size="1KB", folder_labels=True)
    assert result.label_map == {"a": 0, "b": 1} and result.labels == "folders"
    store = trainfeed.open_store(str(dst))
    assert (store.field, store.shape, store.dtype, store.label_map) == ("image", (8, 12), "uint8", {"a": 0, "b": 1})
    want = sorted((i, int(i.startswith("b/")), np.asarray(
        Image.open(io.BytesIO(data)).convert("L").resize((12, 8), Image.Resampling.BILINEAR)).tobytes())
        for i, data in photos["files"].items())
    assert rows_of(store.batches(3)) == want
    with h5py.File(dst) as f:
        assert f["image"].chunks == (1000 // 96, 8, 12)  # 1 KB chunks of 96-byte samples


# ------------------------------------------------------------------ open_store and Store

def write_table(path: Path, truth: dict) -> None:
    """A table another tool wrote: ids in "name", labels in "lab", float64 raw bytes in "t"."""
    ids = sorted(truth)
    pq.write_table(pa.table({
        "name": ids, "lab": pa.array([truth[i][1] for i in ids], pa.int32()),
        "t": [truth[i][0].astype("<f8").tobytes() for i in ids]}), path)


def test_open_store_reads_a_foreign_table_by_keywords_or_a_foreign_schema(data, tmp_path):
    path = tmp_path / "table.parquet"
    write_table(path, data["truth"])
    by_keywords = trainfeed.open_store(str(path), tensor_column="t", shape="4x4x2x1", dtype="float64",
                                       label_column="lab", id_column="name", tensor_encoding="raw")
    schema = trainfeed.ForeignSchema(tensor_column="t", shape=SHAPE, dtype="float64", label_column="lab",
                                     id_column="name", encoding="raw")
    by_schema = trainfeed.open_store(str(path), options=trainfeed.OpenOptions(foreign=schema))
    want = sorted((i, lab, arr.astype("<f8").tobytes()) for i, (arr, lab) in data["truth"].items())
    assert rows_of(by_keywords.batches(7)) == rows_of(by_schema.batches(7)) == want
    assert by_keywords.open_options.foreign == schema
    assert (schema.size, schema.nbytes, schema.columns) == (32, 256, ["t", "lab", "name"])
    described = schema.dataset_schema(source=str(path))
    assert [(f.name, f.dtype, tuple(f.shape)) for f in described.fields] == [("t", "float64", SHAPE)]
    assert described.labeled


def split_source(data, root: Path) -> tuple[Path, Path]:
    """The volumes in two folders (ids v000-v011 and v012-v023), each with its labels.csv."""
    halves = (root / "first", root / "second")
    for k, half in enumerate(halves):
        half.mkdir()
        ids = sorted(data["truth"])[k * N // 2:(k + 1) * N // 2]
        for i in ids:
            shutil.copy(data["src"] / f"{i}.npy", half)
        write_labels(half / "labels.csv", {i: data["truth"][i][1] for i in ids})
    return halves


def test_a_delta_table_at_a_version(data, tmp_path):
    first, second = split_source(data, tmp_path)
    uri = str(tmp_path / "t.delta")
    trainfeed.convert(str(first), uri, format="delta")
    trainfeed.convert(str(second), uri, format="delta", mode="append")
    latest, old = trainfeed.open_store(uri), trainfeed.open_store(uri, version=0)
    assert (latest.version, old.version, old.samples) == (1, 0, N // 2)
    assert rows_of(latest.batches(5)) == truth_rows(data["truth"])
    assert rows_of(old.batches(5)) == truth_rows(data["truth"], sorted(data["truth"])[:N // 2])
    run = trainfeed.train(trainfeed.TrainConfig(data=uri, fmt="delta", width=4, out=str(tmp_path / "o"),
                                                progress=False, store=trainfeed.OpenOptions(version=0),
                                                epoch=trainfeed.EpochOptions(batch_size=4)))
    assert run.format == "delta" and run.summary["delta_version"] == 0 and run.steps == N // 2 // 4


def test_store_batches_pool_and_the_batch_it_yields(data):
    store = trainfeed.open_store(data["parquet"])
    batches = list(store.batches(6, pool="arrow", shuffle=False))
    assert all(isinstance(b, trainfeed.Batch) for b in batches)
    assert [b.nbytes for b in batches] == [6 * 128] * 4
    assert rows_of(batches) == truth_rows(data["truth"])
    if importlib.util.find_spec("petastorm") is None:  # the Petastorm pools need the trainfeed[petastorm] extra
        with pytest.raises(trainfeed.TrainfeedError, match="pools .* need Petastorm"):
            next(store.batches(6, pool="thread"))
    else:
        assert rows_of(store.batches(6, pool="thread")) == truth_rows(data["truth"])


# ------------------------------------------------------------------ TorchDataset

def torch_batches(dataset) -> list[tuple[bytes, list[int]]]:
    from torch.utils.data import DataLoader

    return [(x.numpy().tobytes(), y.tolist()) for x, y in DataLoader(dataset, batch_size=None, num_workers=0)]


def store_batches(batches) -> list[tuple[bytes, list[int]]]:
    return [(b.x.tobytes(), b.y.tolist()) for b in batches]


def test_torch_dataset_keywords_read_what_store_batches_reads(data):
    store = trainfeed.open_store(data["parquet"])
    in_order = trainfeed.TorchDataset(data["parquet"], storage_options={}, batch_size=5, shuffle=False, workers=1,
                                      pool="arrow")
    assert in_order.batch_size == 5 and in_order.epoch == 0
    got = torch_batches(in_order)
    assert got == store_batches(store.batches(5, shuffle=False))
    ids = [i for b in store.batches(5, shuffle=False) for i in b.ids]
    x = np.frombuffer(b"".join(xb for xb, _ in got), np.float32).reshape(N, -1)
    assert [(i, r.tobytes()) for i, r in zip(ids, x)] == [(i, data["truth"][i][0].tobytes()) for i in ids]
    window = trainfeed.TorchDataset(store, batch_size=5, seed=3, shuffle_buffer=4, lanes=1)
    window.set_epoch(2)
    assert window.epoch == 2 and window.lanes == 1
    assert torch_batches(window) == store_batches(store.batches(5, seed=3, epoch=2, shuffle_buffer=4, lanes=1))
    assert torch_batches(window) != store_batches(store.batches(5, seed=3, epoch=2, lanes=1))  # another window
    whole = trainfeed.TorchDataset(store, global_batch_size=6, seed=3)  # one process: its batch is the global one
    assert (whole.batch_size, whole.global_batch_size, whole.lanes, whole.rank, whole.world_size) == (6, 6, 6, 0, 1)
    assert torch_batches(whole) == store_batches(store.batches(seed=3, global_batch_size=6))
    assert len(whole) == N // 6


def test_torch_dataset_augments_as_store_batches(photos):
    store = trainfeed.open_store(photos["parquet"])
    augmented = torch_batches(trainfeed.TorchDataset(store, batch_size=4, seed=1, augment=True))
    assert augmented == store_batches(store.batches(4, seed=1, augment=True))
    plain = store_batches(store.batches(4, seed=1))
    assert [y for _, y in augmented] == [y for _, y in plain] and all(a != p for (a, _), (p, _) in zip(augmented,
                                                                                                       plain))


# ------------------------------------------------------------------ tf_dataset

@pytest.mark.tf
def test_tf_dataset_keywords_read_what_store_batches_reads(data, photos):
    store = trainfeed.open_store(data["parquet"])
    settings = dict(batch_size=3, shuffle=True, seed=2, drop_last=True, workers=1, pool="arrow", rank=1,
                    world_size=2, global_batch_size=6, lanes=2, shuffle_buffer=7)
    ds = trainfeed.tf_dataset(store, epoch=1, start_batch=1, prefetch=1, augment=False, **settings)
    got = [(x.numpy().tobytes(), y.numpy().tolist()) for x, y in ds]
    want = store_batches(store.batches(epoch=1, start_batch=1, **settings))
    assert got == want and len(got) == N // 6 - 1  # rank 1's half of each global batch of 6, from the 2nd
    images = trainfeed.open_store(photos["parquet"])
    augmented = [(x.numpy().tobytes(), y.numpy().tolist())
                 for x, y in trainfeed.tf_dataset(images, batch_size=4, seed=1, augment=True)]
    assert augmented == store_batches(images.batches(4, seed=1, augment=True))


# ------------------------------------------------------------------ object storage

@pytest.mark.s3
def test_object_storage_keywords(data, s3_server, tmp_path):
    from trainfeed.converters.storage.cache_writer import flush_cache_writes

    options = dict(s3_server.storage_options)
    bucket = f"keywords-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    url = f"s3://{bucket}/s.parquet"
    trainfeed.convert(str(data["src"]), url, format="parquet", storage_options=options, row_group_size=1024)

    def cached(folder: Path) -> list[int]:
        flush_cache_writes(timeout=10)  # the cache is written behind the reads
        return [p.stat().st_size for p in folder.glob("??/*.bin")]

    store = trainfeed.open_store(url, storage_options=options, io_concurrency=2, cache_dir=str(tmp_path / "c"),
                                 cache_limit=10**6)
    assert store.open_options.io_concurrency == 2
    assert rows_of(store.batches(5)) == truth_rows(data["truth"])
    assert cached(tmp_path / "c") and sum(cached(tmp_path / "c")) <= 10**6
    tiny = trainfeed.open_store(url, storage_options=options, cache_dir=str(tmp_path / "t"), cache_limit=1)
    assert rows_of(tiny.batches(5)) == truth_rows(data["truth"]) and cached(tmp_path / "t") == []
    got = torch_batches(trainfeed.TorchDataset(url, storage_options=options, batch_size=5, shuffle=False))
    assert got == store_batches(store.batches(5, shuffle=False))
    run = trainfeed.train(trainfeed.TrainConfig(data=url, width=4, out=str(tmp_path / "o"), progress=False,
                                                store=trainfeed.OpenOptions(storage_options=options, io_concurrency=2,
                                                                            cache_dir=str(tmp_path / "r"),
                                                                            cache_limit=10**6),
                                                epoch=trainfeed.EpochOptions(batch_size=8)))
    assert run.store == url and run.steps == N // 8
    assert cached(tmp_path / "r") and run.summary["config"]["store"]["storage_options"] == sorted(options)


# ------------------------------------------------------------------ train and TrainConfig

def checkpoint_weights(folder: Path) -> dict:
    import torch

    return torch.load(folder / "checkpoint.pt", weights_only=True)["model"]


def same_weights(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_train_runs_as_configured_and_reports_it(data, tmp_path, capsys):
    out = tmp_path / "out"
    config = trainfeed.TrainConfig(data=data["parquet"], fmt="parquet", framework="torch", device="cpu",
                                   steps_per_epoch=2, epochs=2, lr=0.01, width=4, num_classes=2, out=str(out),
                                   eval_data=data["hdf5"], warmup_steps=1, progress=True,
                                   epoch=trainfeed.EpochOptions(batch_size=8, workers=1, pool="arrow", seed=3,
                                                                shuffle_buffer=16, augment=False))
    run = trainfeed.train(config=config)
    assert isinstance(run, trainfeed.TrainResult)
    s = run.summary
    assert s == json.loads((out / "summary.json").read_text())
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], r["epoch"], r["samples"]) for r in steps] == [(1, 0, 8), (2, 0, 8), (3, 1, 8), (4, 1, 8)]
    assert (run.framework, run.store, run.format, run.steps, run.global_step) == ("torch", data["parquet"],
                                                                                  "parquet", 4, 4)
    assert run.preempted is False and s["steps_measured"] == 3 and s["samples"] == 3 * 8  # warmup_steps=1
    assert (run.samples_per_s, run.stall_fraction, run.train_accuracy) == (s["samples_per_s"], s["stall_fraction"],
                                                                           s["train_accuracy"])
    assert 0 <= run.train_accuracy <= 1 and run.eval_accuracy == s["eval"]["accuracy"]
    assert s["eval"]["samples"] == N and s["eval"]["store"] == data["hdf5"]
    assert (s["device"], s["num_classes"], s["batch_size"]) == ("cpu", 2, 8)
    assert s["config"]["epoch"]["shuffle_buffer"] == 16 and s["config"]["epoch"]["pool"] == "arrow"
    assert re.match(r"train .* 4/4 steps", capsys.readouterr().err)  # progress=True: the bar, on stderr


def test_seed_lr_and_amp_change_the_trained_weights(data, tmp_path):
    quick = dict(data=data["parquet"], width=4, progress=False)
    reading = trainfeed.EpochOptions(batch_size=8, workers=1)

    def weights(name: str, config: trainfeed.TrainConfig) -> dict:
        folder = tmp_path / name
        trainfeed.train(dataclasses.replace(config, out=str(folder / "o"), checkpoint_dir=str(folder)))
        return checkpoint_weights(folder)

    base = weights("base", trainfeed.TrainConfig(**quick, epoch=reading))
    assert same_weights(base, weights("again", trainfeed.TrainConfig(**quick, epoch=reading)))  # what differs below
    for name, config in (("seed", trainfeed.TrainConfig(**quick, epoch=dataclasses.replace(reading, seed=1))),
                         ("lr", trainfeed.TrainConfig(**quick, epoch=reading, lr=0.01)),  # is the option's doing
                         ("amp", trainfeed.TrainConfig(**quick, epoch=reading, amp=True))):
        assert not same_weights(base, weights(name, config)), name


def test_checkpoint_every_and_resume_after_a_failure(data, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(data["src"], src)
    run_options = dict(data=str(src), store=trainfeed.OpenOptions(labels=str(src / "labels.csv")),
                       epoch=trainfeed.EpochOptions(batch_size=8, workers=1, shuffle_buffer=8), width=4,
                       out=str(tmp_path / "o"), checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2,
                       progress=False)
    config = trainfeed.TrainConfig(**run_options)
    # the third step's batch, as train reads it (a folder of files: the epoch read with its options)
    store = trainfeed.open_store(config.data, options=config.store)
    third = [b.ids for b in store.batches(options=config.epoch_options())][2]
    victim = src / f"{next(i for i in third if i not in ('v000', f'v{N - 1:03d}'))}.npy"
    good = victim.read_bytes()
    victim.write_bytes(b"x" * len(good))  # damaged while training
    with pytest.raises(trainfeed.TrainfeedError, match="corrupt or truncated .npy"):
        trainfeed.train(config)
    assert len((tmp_path / "o" / "steps.jsonl").read_text().splitlines()) == 2
    import torch

    assert torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)["global_step"] == 2  # every 2 steps
    victim.write_bytes(good)  # repaired: the same content, so the checkpoint's data
    run = trainfeed.train(trainfeed.TrainConfig(**run_options, resume=True))
    assert (run.steps, run.global_step, run.summary["resumed_from_step"]) == (1, 3, 2)


def test_train_takes_a_field_and_a_foreign_table(data, tmp_path):
    rng = np.random.default_rng(3)
    src = tmp_path / "pairs"
    src.mkdir()
    for k in range(8):
        np.savez(src / f"p{k}.npz", a=rng.standard_normal(SHAPE).astype("float32"),
                 b=rng.standard_normal((4, 4, 2, 2)).astype("float32"))
    write_labels(src / "labels.csv", {f"p{k}": k % 2 for k in range(8)})
    trainfeed.convert(str(src), str(tmp_path / "pairs.h5"), format="hdf5")
    run = trainfeed.train(trainfeed.TrainConfig(data=str(tmp_path / "pairs.h5"), width=4, out=str(tmp_path / "o"),
                                                progress=False, store=trainfeed.OpenOptions(field="b"),
                                                epoch=trainfeed.EpochOptions(batch_size=4)))
    assert run.summary["field"] == "b" and run.summary["sample_shape"] == [4, 4, 2, 2]
    table = tmp_path / "table.parquet"
    write_table(table, data["truth"])
    foreign = trainfeed.ForeignSchema("t", SHAPE, dtype="float64", label_column="lab", id_column="name")
    run = trainfeed.train(trainfeed.TrainConfig(data=str(table), width=4, out=str(tmp_path / "o2"), progress=False,
                                                store=trainfeed.OpenOptions(foreign=foreign),
                                                epoch=trainfeed.EpochOptions(batch_size=8)))
    assert run.steps == N // 8 and run.summary["sample_shape"] == list(SHAPE)


def test_train_decodes_images_to_image_size(photos, tmp_path):
    run = trainfeed.train(trainfeed.TrainConfig(data=photos["parquet"], width=4, out=str(tmp_path / "o"),
                                                progress=False, store=trainfeed.OpenOptions(image_size=(8, 10)),
                                                epoch=trainfeed.EpochOptions(augment=True, batch_size=4)))
    assert run.summary["sample_shape"] == [8, 10, 3] and run.steps == 2


def test_device_cuda_trains_there_or_is_refused(data, tmp_path):
    import torch

    config = trainfeed.TrainConfig(data=data["parquet"], device="cuda", width=4, out=str(tmp_path / "o"),
                                   progress=False, epoch=trainfeed.EpochOptions(batch_size=8))
    if torch.cuda.is_available():
        run = trainfeed.train(config)
        assert run.summary["device"] == "cuda" and run.steps == N // 8
    else:
        with pytest.raises(trainfeed.TrainfeedError, match="no CUDA device is available to PyTorch"):
            trainfeed.train(config)
        assert not (tmp_path / "o").exists()


def test_messages_name_options_as_the_caller_spells_them(data, tmp_path):
    src = tmp_path / "five"
    write_volumes(src, 10, shape=SHAPE, labels_csv=False)
    write_labels(src / "labels.csv", {f"v{i:03d}": i % 5 for i in range(10)})
    trainfeed.convert(str(src), str(tmp_path / "five.h5"), format="hdf5")
    run_options = dict(data=str(tmp_path / "five.h5"), num_classes=2, epoch=trainfeed.EpochOptions(batch_size=5),
                       width=4, out=str(tmp_path / "o"), progress=False)
    python, command_line = trainfeed.TrainConfig(**run_options), trainfeed.TrainConfig(**run_options, cli=True)
    assert (python.option(name="num_classes"), command_line.option("num_classes")) == ("num_classes=",
                                                                                       "--num-classes ")
    with pytest.raises(trainfeed.TrainfeedError, match=r"; set num_classes=5 \(or leave it out"):
        trainfeed.train(python)
    with pytest.raises(trainfeed.TrainfeedError, match=r"; set --num-classes 5 \(or leave it out"):
        trainfeed.train(command_line)


def test_train_config_names_the_options_it_opens_and_reads_with(data):
    config = trainfeed.TrainConfig(data=data["parquet"], store=trainfeed.OpenOptions(field="volume", io_concurrency=3),
                                   epoch=trainfeed.EpochOptions(batch_size=4, seed=5, shuffle_buffer=16, workers=1,
                                                                augment=False))
    assert config.store == trainfeed.OpenOptions(field="volume", io_concurrency=3)
    ranks = [config.epoch_options(rank=r, world_size=2) for r in (0, 1)]
    assert ranks[1] == trainfeed.EpochOptions(batch_size=4, seed=5, shuffle_buffer=16, workers=1, rank=1, world_size=2)
    store = trainfeed.open_store(config.data, options=config.store)
    both = sorted(rows_of(store.batches(options=ranks[0])) + rows_of(store.batches(options=ranks[1])))
    assert both == truth_rows(data["truth"], sorted(data["truth"]))  # 3 global batches of 8: each sample once
    global_ = trainfeed.TrainConfig(data=data["parquet"], epoch=trainfeed.EpochOptions(global_batch_size=8, lanes=2,
                                                                                       augment=False))
    opts = global_.epoch_options(rank=0, world_size=2)
    assert opts == trainfeed.EpochOptions(batch_size=4, rank=0, world_size=2, global_batch_size=8, lanes=2)
    assert (opts.global_batch, opts.rank_batch, opts.lane_count) == (8, 4, 2)
    secret = trainfeed.TrainConfig(data=config.data,
                                   store=trainfeed.OpenOptions(storage_options={"account_key": "s3cr3t-value"}))
    assert secret.to_dict()["store"]["storage_options"] == ["account_key"]
    assert "s3cr3t" not in json.dumps(secret.to_dict())


@pytest.fixture
def tf_data_service():
    """grpc://localhost:PORT of an in-process tf.data service: a dispatcher and one worker."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1], port=0))
    yield dispatcher.target
    worker._stop()
    dispatcher._stop()


@pytest.mark.tf
def test_train_through_a_tf_data_service(photos, tf_data_service, tmp_path):
    run = trainfeed.train(trainfeed.TrainConfig(data=str(photos["src"]), framework="torch",
                                                data_service=tf_data_service, width=4, out=str(tmp_path / "o"),
                                                progress=False, epoch=trainfeed.EpochOptions(batch_size=3)))
    steps = [json.loads(line) for line in (tmp_path / "o" / "steps.jsonl").read_text().splitlines()]
    assert run.steps == 8 // 3 and [r["samples"] for r in steps] == [3, 3]  # whole batches from the service
