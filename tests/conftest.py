"""Shared fixtures: small generated datasets and a CLI runner. Nothing is downloaded."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from trainfeed.training.tensorflow_env import prepare_tensorflow

prepare_tensorflow()  # as trainfeed sets it, also where a test imports TensorFlow before trainfeed does

SMALL_SHAPE = (6, 5, 4, 3)


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(app, *args: str) -> Result:
    """Run a typer app in-process, as its console script would."""
    res = CliRunner().invoke(app, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return Result(res.exit_code, res.stdout, res.stderr)


@pytest.fixture
def convert_cli():
    from trainfeed.converters.cli import app

    return lambda *args: run_cli(app, *args, "--no-progress")


def write_volumes(root: Path, n: int, *, shape=SMALL_SHAPE, dtype="float32", seed=0, folders=False,
                  labels_csv=True) -> dict[str, tuple[np.ndarray, int]]:
    """n .npy volumes under root; returns id -> (array, label). Labels go to root/labels.csv
    or (folders=True) into class folders neg/ and pos/."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for i in range(n):
        arr = (rng.standard_normal(shape) * 100).astype(dtype)
        label = int(rng.integers(2))
        sid = f"{'pos' if label else 'neg'}/v{i:03d}" if folders else f"v{i:03d}"
        path = root / f"{sid}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, arr)
        out[sid] = (arr, label)
    if labels_csv and not folders:
        with open(root / "labels.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["id", "label"])
            w.writerows((sid, lab) for sid, (_, lab) in out.items())
    return out


def write_images(root: Path, n: int, *, size=(24, 32), fmt="JPEG", seed=0) -> dict[str, bytes]:
    """n images in class folders a/ and b/; returns id -> file bytes."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        cls = "a" if i % 2 == 0 else "b"
        pixels = rng.integers(0, 255, size=(*size, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format=fmt)
        ext = "jpg" if fmt == "JPEG" else "png"
        path = root / cls / f"img{i:03d}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(buf.getvalue())
        out[f"{cls}/img{i:03d}"] = buf.getvalue()
    return out


@pytest.fixture
def volumes(tmp_path):
    src = tmp_path / "vols"
    return src, write_volumes(src, 30)


@pytest.fixture
def images(tmp_path):
    src = tmp_path / "imgs"
    return src, write_images(src, 12)


@pytest.fixture(scope="session")
def spark():
    """A real local Spark session (Java 17 is on the machine)."""
    from trainfeed.pipelines.spark import get_spark

    session = get_spark("trainfeed-tests", cores=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def azurite_server():
    """A real Azure Blob endpoint (Azurite) on a free loopback port."""
    from trainfeed.benchmarks.emulators import azurite

    with azurite.start() as server:
        yield server


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 HTTP API (moto's server, in its own process) on a free loopback port."""
    from trainfeed.benchmarks.emulators import s3server

    with s3server.start() as server:
        yield server


LEARN_SHAPE = (12, 12, 4, 2)


@pytest.fixture(scope="session")
def learnable(tmp_path_factory):
    """A learnable volume dataset (label = sign of a region mean), split into train and
    held-out folders, and the train split converted into every format."""
    from trainfeed.benchmarks.synth import generate_volumes
    from trainfeed.converters.cli import app

    root = tmp_path_factory.mktemp("learnable")
    generate_volumes(root / "train", 384, shape=LEARN_SHAPE, seed=11)
    generate_volumes(root / "holdout", 128, shape=LEARN_SHAPE, seed=12)
    stores = {"blob": root / "train"}
    for fmt, name in (("parquet", "train.parquet"), ("delta", "train.delta"), ("hdf5", "train_h5")):
        res = run_cli(app, root / "train", root / name, "--to", fmt, "--labels", root / "train" / "labels.csv",
                      "--row-group-size", "40KB", "--target-file-size", "400KB", "--no-progress")
        assert res.exit_code == 0, res.stderr
        stores[fmt] = root / name
    res = run_cli(app, root / "holdout", root / "holdout.h5", "--to", "hdf5", "--labels",
                  root / "holdout" / "labels.csv", "--no-progress")
    assert res.exit_code == 0, res.stderr
    return {"root": root, "stores": stores, "holdout": root / "holdout.h5"}


# ------------------------------------------------------------------ how `make test` spreads the files

# The files that take longest, longest first (issue #33: per-file profile of `make test`, CPU seconds
# of the test process and of the processes it waited for, and the waits: emulators, timeouts, pip).
# In an xdist worker the collection is put in this order, and `make test` (--dist loadfile
# --no-loadscope-reorder) hands the files out in it, so that no long file starts last and leaves the
# other core idle at the end (xdist's own order, most tests first, started the wheel's clean 3.12
# venv, 7 tests, near the end). The other files keep their order, after these.
LONGEST_FIRST = (
    "tests/test_packaging.py",  # a clean Python 3.12 venv and three pip resolutions, in threads
    "tests/test_secrets.py",
    "tests/test_object_storage.py",
    "tests/training/test_many_ranks.py",
    "tests/training/test_train.py",
    "tests/training/reading/test_dataloader_workers.py",
    "tests/converters/test_storage_errors.py",
    "tests/training/test_distributed.py",
    "tests/converters/test_interrupt.py",
    "tests/converters/test_publish_interrupt.py",
    "tests/training/reading/test_long_runs.py",
    "tests/converters/storage/test_faults.py",
    "tests/benchmarks/ab/test_storage_bench.py",
    "tests/test_readme_walkthroughs.py",
    "tests/training/test_train_safety.py",
    "tests/benchmarks/emulators/test_s3rver_main.py",
    "tests/converters/test_ownership.py",
    "tests/converters/storage/test_fetch.py",
    "tests/training/reading/test_dataloader_handoff.py",
    "tests/pipelines/test_repack.py",
    "tests/benchmarks/ab/test_sample_kinds.py",
    "tests/converters/test_hostile_urls.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # one process: nothing to spread
        return
    rank = {path: k for k, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: files stay whole
