"""The typed Python API (`import trainfeed`): the README's example runs as written, the
PyTorch IterableDataset delivers every sample exactly once per epoch across DataLoader
workers and ranks, and its state resumes at the exact next batch."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import trainfeed
from tests.conftest import write_volumes

SHAPE = (4, 4, 2, 1)


def readme_examples() -> list[str]:
    """The README's Python API example: its numpy-only part, then its PyTorch part."""
    text = (Path(__file__).parents[1] / "README.md").read_text()
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the Python API section holds the example in two parts"
    return blocks


def readme_example() -> str:
    return "\n".join(readme_examples())


def test_every_public_name_resolves():
    import subprocess
    import sys

    assert all(getattr(trainfeed, name) is not None for name in trainfeed.__all__)
    # the CLIs import trainfeed's subpackages: the package itself imports nothing heavy
    code = ("import sys, trainfeed.converters; "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'trainfeed.training'))))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    truth = write_volumes(tmp_path / "data" / "volumes", 48, shape=SHAPE)
    monkeypatch.chdir(tmp_path)
    exec(compile(readme_example(), "README.md (Python API)", "exec"), {"__name__": "readme_example"})
    out = capsys.readouterr().out
    assert "48 samples," in out and "parquet 48 (4, 4, 2, 1) (8, 4, 4, 2, 1)" in out
    assert (tmp_path / "runs" / "api" / "summary.json").is_file()
    store = trainfeed.open_store("volumes.parquet")
    got = {i: (x.tobytes(), int(y)) for b in store.batches(16, shuffle=False) for i, x, y in zip(b.ids, b.x, b.y)}
    assert got == {i: (a.tobytes(), lab) for i, (a, lab) in truth.items()}


@pytest.fixture(scope="module")
def store56(tmp_path_factory):
    """56 volumes in 7 row groups of 8: DataLoader workers get uneven shares (4 and 3 pieces)."""
    root = tmp_path_factory.mktemp("api")
    truth = write_volumes(root / "src", 56, shape=SHAPE, seed=5)
    result = trainfeed.convert(str(root / "src"), str(root / "s.parquet"), format="parquet",
                               labels=str(root / "src" / "labels.csv"), row_group_size=8 * 128)
    assert isinstance(result, trainfeed.ConvertResult) and result.samples == 56 and result.format == "parquet"
    store = trainfeed.open_store(str(root / "s.parquet"))
    assert len(store.reader.pieces) == 7 and store.shape == SHAPE and store.dtype == "float32"
    return store, sorted((a.tobytes(), lab) for a, lab in truth.values())


def epoch_of(dataset, num_workers: int) -> list[tuple[bytes, np.ndarray]]:
    from torch.utils.data import DataLoader

    return [(x.numpy().tobytes(), y.numpy().copy())
            for x, y in DataLoader(dataset, batch_size=None, num_workers=num_workers)]


def samples_of(batches) -> list[tuple[bytes, int]]:
    out = []
    for xb, y in batches:
        rows = np.frombuffer(xb, np.float32).reshape(len(y), -1)
        out += [(r.tobytes(), int(lab)) for r, lab in zip(rows, y)]
    return sorted(out)


@pytest.mark.parametrize("world", [1, 2])
def test_torch_dataset_with_two_workers_delivers_every_sample_once(store56, monkeypatch, world):
    store, truth = store56
    epochs = []
    for epoch in range(2):
        delivered = []
        for rank in range(world):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            dataset = trainfeed.TorchDataset(store, batch_size=5, seed=1)
            dataset.set_epoch(epoch)
            delivered += epoch_of(dataset, num_workers=2)
        assert samples_of(delivered) == truth  # bit for bit, each sample once
        epochs.append([x for x, _ in delivered])
    assert epochs[0] != epochs[1]  # a new order each epoch


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_resumes_at_the_exact_next_batch(store56, num_workers):
    store, truth = store56
    full = epoch_of(trainfeed.TorchDataset(store, batch_size=5, seed=2), num_workers)
    assert len(full) == (12 if num_workers == 0 else 7 + 5) and samples_of(full) == truth
    for done in (1, 2, 5, 9, 11, 12):
        first = trainfeed.TorchDataset(store, batch_size=5, seed=2)
        state = first.state_dict(done)
        resumed = trainfeed.TorchDataset(store, batch_size=5, seed=2)
        resumed.load_state_dict(state)
        rest = epoch_of(resumed, num_workers)
        assert [x for x, _ in rest] == [x for x, _ in full[done:]], done
        if done == len(full):
            continue
        # resumed again, part-way through the resumed iteration: counts add up
        again = trainfeed.TorchDataset(store, batch_size=5, seed=2)
        again.load_state_dict(resumed.state_dict(1))
        assert [x for x, _ in epoch_of(again, num_workers)] == [x for x, _ in full[done + 1:]]
    # the next epoch starts from its first batch
    resumed.set_epoch(1)
    fresh = trainfeed.TorchDataset(store, batch_size=5, seed=2)
    fresh.set_epoch(1)
    assert [x for x, _ in epoch_of(resumed, num_workers)] == [x for x, _ in epoch_of(fresh, num_workers)]


def test_a_state_for_other_batches_is_refused(store56):
    store, _ = store56
    state = trainfeed.TorchDataset(store, batch_size=5, seed=2).state_dict(3)
    with pytest.raises(trainfeed.TrainfeedError, match=r"cannot resume: the state was saved with other batch_size "
                                                       r"\(5, now 8\)"):
        trainfeed.TorchDataset(store, batch_size=8, seed=2).load_state_dict(state)


def test_store_batches_start_batch_and_usage_errors(store56, tmp_path):
    store, truth = store56
    full = list(store.batches(6, seed=3, epoch=1))
    assert samples_of((b.x.tobytes(), b.y) for b in full) == truth
    assert [b.ids for b in store.batches(6, seed=3, epoch=1, start_batch=4)] == [b.ids for b in full[4:]]
    with pytest.raises(trainfeed.UsageError, match="--to must be one of"):
        trainfeed.convert(str(tmp_path), str(tmp_path / "x"), format="csv")  # type: ignore[arg-type]
    with pytest.raises(trainfeed.TrainfeedError, match="store not found"):
        trainfeed.open_store(str(tmp_path / "missing.parquet"), format="parquet")


@pytest.mark.tf
def test_tf_dataset_yields_the_store_batches(store56):
    store, truth = store56
    batches = [(x.numpy().tobytes(), y.numpy()) for x, y in trainfeed.tf_dataset(store, batch_size=5, seed=4)]
    assert samples_of(batches) == truth
    assert [y.tolist() for _, y in batches[3:]] == [b.y.tolist() for b in store.batches(5, seed=4, start_batch=3)]


def test_the_typed_options_name_what_the_registries_hold():
    """The Literal types are for type checkers; the registries are the truth."""
    from typing import get_args

    from trainfeed import conversion, store
    from trainfeed.converters.formats.registry import FORMATS, WRITABLE
    from trainfeed.training.reading.readers import POOLS

    assert set(get_args(store.Format)) == set(FORMATS)
    assert set(get_args(conversion.WritableFormat)) == set(WRITABLE)
    assert set(get_args(store.Pool)) == set(POOLS)


def test_convert_takes_src_labels_csv_and_names_fixes_in_keyword_arguments(tmp_path):
    """As the `convert` CLI: SRC/labels.csv is the labels when ``labels`` is not given
    (``folder_labels=False``: none), and a message names the fix as the API spells it."""
    truth = write_volumes(tmp_path / "src", 6, shape=SHAPE)
    trainfeed.convert(str(tmp_path / "src"), str(tmp_path / "a.parquet"), format="parquet")
    store = trainfeed.open_store(str(tmp_path / "a.parquet"))
    assert {i: int(y) for b in store.batches(6, shuffle=False) for i, y in zip(b.ids, b.y)} == \
        {i: lab for i, (_, lab) in truth.items()}
    trainfeed.convert(str(tmp_path / "src"), str(tmp_path / "b.parquet"), format="parquet", folder_labels=False)
    assert not trainfeed.open_store(str(tmp_path / "b.parquet")).reader.schema.labeled
    with pytest.raises(trainfeed.TrainfeedError, match=r'destination already exists; pass mode="overwrite" to '):
        trainfeed.convert(str(tmp_path / "src"), str(tmp_path / "a.parquet"), format="parquet")
