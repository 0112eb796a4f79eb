"""`train --data-service`: a real tf.data service (a dispatcher and two workers, each its own
process on loopback) runs read + decode + augment for either framework; every sample of an epoch
arrives exactly once, augmentation is seeded, PyTorch's steps get the samples TensorFlow's get,
and an unreachable dispatcher, a missing TensorFlow or a compacted store are clear errors."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

from tests.conftest import run_cli, write_images
from trainfeed.training.reading.readers import EpochOptions, iter_batches, open_store

pytestmark = pytest.mark.tf

SIZE = (24, 32)
N = 26  # not a multiple of the batch: the last, short batch must still come


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trainfeed.training.data_service", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def wait_serving(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()  # the server prints this one line once it serves (TF logs go to stderr)
    assert "serving" in line, f"server exited with {proc.wait()}"


@pytest.fixture(scope="module")
def service():
    """grpc://127.0.0.1:PORT of a dispatcher with two registered workers, all stopped afterwards."""
    port = free_port()
    address = f"grpc://127.0.0.1:{port}"
    procs = [serve("dispatcher", "--port", str(port))]
    try:
        wait_serving(procs[0])
        for _ in range(2):
            procs.append(serve("worker", "--dispatcher", address, "--port", str(free_port()), "--host", "127.0.0.1"))
            wait_serving(procs[-1])
        time.sleep(1.0)  # workers register with the dispatcher by heartbeat
        yield address
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
    assert all(proc.poll() is not None for proc in procs)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("offload") / "imgs"
    write_images(root, N, size=SIZE)
    return root


def service_epoch(folder, address, *, epoch=0, augment=True, seed=0):
    from trainfeed.training.reading.service_input import iter_batches as service_batches

    opts = EpochOptions(batch_size=4, seed=seed, augment=augment)
    return list(service_batches(open_store(str(folder)), opts, epoch, address))


def local_epoch(folder):
    """id -> (pixels, label) from trainfeed's own reader (Pillow), in this process."""
    opts = EpochOptions(batch_size=4, shuffle=False, augment=False)
    return by_id(iter_batches(open_store(str(folder)), opts))


def by_id(batches):
    return {i: (x, y) for b in batches for i, x, y in zip(b.ids, b.x, b.y)}


def test_every_sample_exactly_once_from_the_workers(folder, service):
    local = local_epoch(folder)
    batches = service_epoch(folder, service)
    ids = [i for b in batches for i in b.ids]
    assert sorted(ids) == sorted(local) and len(ids) == N  # exactly once: no repeat, none missing
    got = by_id(batches)
    for i, (x, y) in got.items():
        assert x.shape == (*SIZE, 3) and x.dtype == np.uint8
        assert y == local[i][1]  # labels travel with their sample


def test_augmentation_is_seeded_by_seed_epoch_and_id(folder, service):
    first, again = by_id(service_epoch(folder, service)), by_id(service_epoch(folder, service))
    other_epoch = by_id(service_epoch(folder, service, epoch=1))
    assert all(np.array_equal(first[i][0], again[i][0]) for i in first)  # whichever worker ran it
    assert sum(not np.array_equal(first[i][0], other_epoch[i][0]) for i in first) > N // 2


def test_without_augmentation_pixels_at_the_stored_size_are_pillows(folder, service):
    local = local_epoch(folder)
    got = by_id(service_epoch(folder, service, augment=False))
    for i, (x, _) in got.items():  # no resize: libjpeg's accurate DCT on both sides
        assert np.array_equal(x, local[i][0]), i


def test_train_with_data_service(folder, service, tmp_path):
    from trainfeed.training.cli import app

    res = run_cli(app, "--data", folder, "--framework", "tf", "--data-service", service, "--batch-size", "4",
                  "--epochs", "2", "--width", "8", "--out", tmp_path / "out", "--json", "--no-progress")
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["steps"] == 2 * (N // 4)  # drop_last: every full batch of both epochs
    steps = [json.loads(line) for line in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    assert [s["samples"] for s in steps] == [4] * (2 * (N // 4))


def record_steps(monkeypatch, framework_class) -> list:
    """(label, pixel hash) of every sample handed to ``framework_class``'s steps, as uint8
    channels-last (the layout both models take; the PyTorch model moves channels first)."""
    seen = []
    to_inputs = framework_class.to_inputs

    def recording(self, batch):
        inputs = to_inputs(self, batch)
        x, y = (np.asarray(t) for t in inputs)  # torch tensors on the CPU: a view
        assert x.shape[1:] == (*SIZE, 3)
        pixels = x if x.dtype == np.uint8 else np.rint(x * 255).astype(np.uint8)  # torch: uint8 / 255 as float
        seen.extend((int(label), hashlib.sha1(sample.tobytes()).hexdigest()) for label, sample in zip(y, pixels))
        return inputs

    monkeypatch.setattr(framework_class, "to_inputs", recording)
    return seen


def test_torch_steps_get_the_samples_tf_steps_get(folder, service, tmp_path, monkeypatch):
    """Same seed, same epoch: the same files, labels and augmented pixels reach either
    framework's step, each sample once (the order between workers is not reproducible)."""
    from trainfeed.training.cli import app
    from trainfeed.training.loops.loop_tf import TensorFlow
    from trainfeed.training.loops.loop_torch import Torch

    epochs = {}
    for name, cls in (("tf", TensorFlow), ("torch", Torch)):
        seen = record_steps(monkeypatch, cls)
        res = run_cli(app, "--data", folder, "--framework", name, "--data-service", service, "--batch-size", "13",
                      "--width", "8", "--out", tmp_path / name, "--json", "--no-progress")
        assert res.exit_code == 0, res.stderr
        assert json.loads(res.stdout)["steps"] == 2
        epochs[name] = Counter(seen)
    assert sum(epochs["torch"].values()) == N and len(epochs["torch"]) == N  # N distinct samples: all, once
    assert epochs["torch"] == epochs["tf"]


def test_torch_learns_through_the_service(service, tmp_path):
    """Stripes whose orientation is the class, decoded and augmented by the workers at 32x32:
    the model learns what the workers deliver (training accuracy well above chance, 0.5, which
    images paired with the wrong labels would give), and the held-out set is evaluated.

    Held-out accuracy is not asserted: after 48 steps on 192 images it depends on the order the
    two workers deliver in (random crops zoom the stripes, the held-out images are resized
    whole), seen from 0.45 to 1.0 across runs. That the workers' pixels are Pillow's is
    test_without_augmentation_pixels_at_the_stored_size_are_pillows."""
    from trainfeed.benchmarks.synth import generate_images
    from trainfeed.training.cli import app

    generate_images(tmp_path / "train", 192, size=(48, 48), seed=1)
    generate_images(tmp_path / "held", 64, size=(48, 48), seed=2)
    res = run_cli(app, "--data", tmp_path / "train", "--eval-data", tmp_path / "held", "--framework", "torch",
                  "--data-service", service, "--image-size", "32x32", "--epochs", "4", "--width", "8",
                  "--batch-size", "16", "--lr", "0.003", "--out", tmp_path / "o", "--json", "--no-progress")
    assert res.exit_code == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["framework"] == "torch" and s["steps"] == 4 * (192 // 16) and s["config"]["epoch"]["augment"] is True
    assert s["train_accuracy"] >= 0.8, s["train_accuracy"]
    assert s["eval"]["samples"] == 64 and 0.0 <= s["eval"]["accuracy"] <= 1.0, s["eval"]


def test_unreachable_dispatcher_is_a_clear_error(folder, tmp_path):
    from trainfeed.training.cli import app

    address = f"grpc://127.0.0.1:{free_port()}"
    res = run_cli(app, "--data", folder, "--framework", "tf", "--data-service", address, "--width", "8",
                  "--out", tmp_path / "out", "--no-progress")
    assert res.exit_code == 1
    assert "cannot reach the tf.data service dispatcher" in res.stderr and address in res.stderr


@pytest.mark.parametrize("framework", ["tf", "torch"])
@pytest.mark.parametrize("args, env, message", [
    (["--resume", "--checkpoint-dir", "ck"], {}, "does not combine with --resume"),
    ([], {"RANK": "0", "WORLD_SIZE": "2"}, "feeds one training process"),
    (["--data-service", "localhost:5050"], {}, "must be grpc://HOST:PORT"),
])
def test_usage_errors(folder, tmp_path, monkeypatch, framework, args, env, message):
    from trainfeed.training.cli import app

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    res = run_cli(app, "--data", folder, "--framework", framework, "--data-service", "grpc://127.0.0.1:1", *args,
                  "--out", tmp_path / "o", "--no-progress")
    assert res.exit_code == 2 and message in res.stderr


def test_torch_without_tensorflow_is_a_usage_error(folder, tmp_path, monkeypatch):
    from trainfeed.training.cli import app

    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import tensorflow now raises ImportError
    res = run_cli(app, "--data", folder, "--framework", "torch", "--data-service", "grpc://127.0.0.1:1",
                  "--out", tmp_path / "o", "--no-progress")
    assert res.exit_code == 2
    assert "--data-service needs TensorFlow" in res.stderr and "tensorflow-cpu" in res.stderr


@pytest.mark.parametrize("framework", ["tf", "torch"])
def test_compacted_store_is_refused(folder, tmp_path, framework):
    from trainfeed.converters.cli import app as convert
    from trainfeed.training.cli import app

    assert run_cli(convert, folder, tmp_path / "s.parquet", "--to", "parquet", "--no-progress").exit_code == 0
    res = run_cli(app, "--data", tmp_path / "s.parquet", "--framework", framework, "--data-service",
                  "grpc://127.0.0.1:1", "--out", tmp_path / "o", "--no-progress")
    assert res.exit_code == 2 and "TensorFlow has no reader for it" in res.stderr
