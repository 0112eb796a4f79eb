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
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
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


def epoch_of(dataset, num_workers: int, real: bool = False) -> list[tuple[bytes, np.ndarray]]:
    """One epoch through a DataLoader; ``real``: without the rows that pad the last batch."""
    from torch.utils.data import DataLoader

    timeout = 300 if num_workers else 0  # a hung worker fails the test, not the run
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers, timeout=timeout)
    out = []
    for k, (x, y) in enumerate(loader, start=dataset.start_batch):
        keep = len(y) - (dataset.padding(k) if real else 0)
        out.append((x[:keep].numpy().tobytes(), y[:keep].numpy().copy()))
    return out


def samples_of(batches) -> list[tuple[bytes, int]]:
    out = []
    for xb, y in batches:
        rows = np.frombuffer(xb, np.float32).reshape(len(y), -1) if len(y) else []
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
            delivered += epoch_of(dataset, num_workers=2, real=True)
        assert samples_of(delivered) == truth  # bit for bit, each sample once
        epochs.append([x for x, _ in delivered])
    assert epochs[0] != epochs[1]  # a new order each epoch


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_resumes_at_the_exact_next_batch(store56, num_workers):
    store, truth = store56
    full = epoch_of(trainfeed.TorchDataset(store, batch_size=5, seed=2), num_workers)
    assert len(full) == 12 and samples_of(full) == truth
    for done in (1, 2, 5, 9, 11, 12):
        first = trainfeed.TorchDataset(store, batch_size=5, seed=2)
        state = first.state_dict(done)
        resumed = trainfeed.TorchDataset(store, batch_size=5, seed=2)
        resumed.load_state_dict(state)
        rest = epoch_of(resumed, num_workers)
        assert [x for x, _ in rest] == [x for x, _ in full[done:]], done
        if done == len(full):
            continue
        # resumed again, part-way through the resumed iteration: counted from the epoch's start
        again = trainfeed.TorchDataset(store, batch_size=5, seed=2)
        again.load_state_dict(resumed.state_dict(done + 1))
        assert [x for x, _ in epoch_of(again, num_workers)] == [x for x, _ in full[done + 1:]]
    # the next epoch starts from its first batch
    resumed.set_epoch(1)
    fresh = trainfeed.TorchDataset(store, batch_size=5, seed=2)
    fresh.set_epoch(1)
    assert [x for x, _ in epoch_of(resumed, num_workers)] == [x for x, _ in epoch_of(fresh, num_workers)]


def test_a_state_for_other_batches_is_refused(store56):
    store, _ = store56
    state = trainfeed.TorchDataset(store, batch_size=5, seed=2).state_dict(3)
    with pytest.raises(trainfeed.TrainfeedError, match=r"cannot resume: the state was saved for global_batch_size 5 "
                                                       r"\(now 8\), lanes 5 \(now 8\)"):
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


def test_options_objects_read_what_the_keywords_read(store56):
    """An OpenOptions / EpochOptions given as an object reads the same samples, bit for bit and
    in the same order, as the same settings given as keywords."""
    store, truth = store56
    uri = store.uri
    by_keywords = trainfeed.open_store(uri, field="volume", io_concurrency=3)
    by_object = trainfeed.open_store(uri, options=trainfeed.OpenOptions(field="volume", io_concurrency=3))
    assert by_object.open_options == by_keywords.open_options == trainfeed.OpenOptions(field="volume",
                                                                                       io_concurrency=3)
    epoch = trainfeed.EpochOptions(batch_size=6, seed=3, shuffle_buffer=16, workers=1, rank=1, world_size=2,
                                   drop_last=True)
    keywords = dict(seed=3, shuffle_buffer=16, workers=1, rank=1, world_size=2, drop_last=True)

    def epoch_of_batches(batches):
        return [(b.ids, b.x.tobytes(), b.y.tobytes()) for b in batches]

    want = epoch_of_batches(by_keywords.batches(6, epoch=2, **keywords))
    assert want and epoch_of_batches(by_object.batches(options=epoch, epoch=2)) == want
    # a keyword equal to the object's value (or at its default) is no conflict
    assert epoch_of_batches(by_object.batches(6, options=epoch, epoch=2, seed=3)) == want
    whole = trainfeed.EpochOptions(batch_size=5, seed=2)
    torch_epoch = lambda dataset: [(x, y.tobytes()) for x, y in epoch_of(dataset, 2)]  # noqa: E731
    got = torch_epoch(trainfeed.TorchDataset(store, options=whole))
    assert got == torch_epoch(trainfeed.TorchDataset(store, batch_size=5, seed=2))
    assert samples_of((x, np.frombuffer(y, np.int64)) for x, y in got) == truth


@pytest.mark.tf
def test_tf_dataset_takes_an_epoch_options_object(store56):
    store, _ = store56
    as_bytes = lambda ds: [(x.numpy().tobytes(), y.numpy().tobytes()) for x, y in ds]  # noqa: E731
    assert as_bytes(trainfeed.tf_dataset(store, options=trainfeed.EpochOptions(batch_size=5, seed=4))) == as_bytes(
        trainfeed.tf_dataset(store, batch_size=5, seed=4))


def test_an_options_object_and_a_conflicting_keyword_are_refused(store56):
    store, _ = store56
    with pytest.raises(trainfeed.UsageError, match=r"seed=4 \(options has 3\)"):
        store.batches(options=trainfeed.EpochOptions(seed=3), seed=4)
    with pytest.raises(trainfeed.UsageError, match=r"batch_size=8 \(options has 32\)"):
        store.batches(8, options=trainfeed.EpochOptions())
    with pytest.raises(trainfeed.UsageError, match=r"version=1 \(options has None\)"):
        trainfeed.open_store(store.uri, options=trainfeed.OpenOptions(), version=1)
    with pytest.raises(trainfeed.UsageError, match=r"drop_last=True \(options has False\)"):
        trainfeed.TorchDataset(store, options=trainfeed.EpochOptions(), drop_last=True)
    with pytest.raises(trainfeed.UsageError, match="takes the rank and world size from torch.distributed"):
        trainfeed.TorchDataset(store, options=trainfeed.EpochOptions(world_size=2))
    with pytest.raises(trainfeed.UsageError, match="options must be a EpochOptions, not OpenOptions"):
        store.batches(options=trainfeed.OpenOptions())  # type: ignore[arg-type]


def test_options_objects_pickle_and_have_one_default_each():
    import pickle
    from dataclasses import fields

    from trainfeed.converters.formats.foreign import foreign_schema

    opened = trainfeed.OpenOptions(version=2, field="x", labels="l.csv", storage_options={"account_name": "a"},
                                   io_concurrency=4, cache_dir="/tmp/c", cache_limit=10**6, image_size=(8, 8),
                                   foreign=foreign_schema("t", "2x2", None, None, None, None))
    epoch = trainfeed.EpochOptions(batch_size=4, shuffle=False, seed=9, shuffle_buffer=8, drop_last=True,
                                   workers=3, pool="arrow", rank=1, world_size=2, global_batch_size=8, lanes=2,
                                   augment=True)
    for options in (opened, epoch, trainfeed.OpenOptions(), trainfeed.EpochOptions()):
        assert pickle.loads(pickle.dumps(options)) == options
    # the keywords of the API default to the objects' defaults (a keyword at its default is "not given")
    import inspect

    for function, cls in ((trainfeed.Store.batches, trainfeed.EpochOptions),
                          (trainfeed.TorchDataset.__init__, trainfeed.EpochOptions),
                          (trainfeed.tf_dataset, trainfeed.EpochOptions),
                          (trainfeed.open_store, trainfeed.OpenOptions)):
        params = inspect.signature(function).parameters
        for f in fields(cls):
            if f.name in params:
                default = f.default_factory() if callable(f.default_factory) else f.default
                assert params[f.name].default in (default, None), (function, f.name)
    assert trainfeed.EpochOptions().drop_last is False


def test_the_typed_options_name_what_the_registries_hold():
    """The Literal types are for type checkers; the registries are the truth."""
    from typing import get_args

    from trainfeed import conversion, store
    from trainfeed.converters.formats.registry import FORMATS, WRITABLE
    from trainfeed.training.reading.readers import POOLS

    assert set(get_args(store.FormatName)) == set(FORMATS)
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


def test_hostile_positions_and_arguments_get_clear_errors(store56, monkeypatch, tmp_path):
    """Each break a hostile user found (issue #30) is now a clear error, not a crash, a silent
    empty epoch or a silently wrong position."""
    store, _ = store56
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=2)
    with pytest.raises(trainfeed.TrainfeedError, match="takes a state from TorchDataset.state_dict, not NoneType"):
        dataset.load_state_dict(None)  # type: ignore[arg-type]
    with pytest.raises(trainfeed.TrainfeedError, match="not a TorchDataset position"):
        dataset.load_state_dict({"epoch": 0, "batch": 3})
    state = dataset.state_dict(3)
    with pytest.raises(trainfeed.TrainfeedError, match="the state's batch must be an integer, 0 or more, not -1"):
        dataset.load_state_dict({**state, "batch": -1})
    with pytest.raises(trainfeed.TrainfeedError, match=r"the state.s batch 13 is past the end of an epoch \(12"):
        dataset.load_state_dict({**state, "batch": 13})
    with pytest.raises(trainfeed.TrainfeedError, match="saved for another store, or another generation of it"):
        dataset.load_state_dict({**state, "store": "0123456789abcdef"})
    with pytest.raises(trainfeed.TrainfeedError, match="saved for seed 9 \\(now 2\\)"):
        dataset.load_state_dict({**state, "seed": 9})
    with pytest.raises(trainfeed.UsageError, match="count batches from the epoch's start"):
        resumed = trainfeed.TorchDataset(store, batch_size=5, seed=2)
        resumed.load_state_dict(state)
        resumed.state_dict(1)  # counted since the resume: refused, not a silent step back
    with pytest.raises(trainfeed.UsageError, match="an epoch has 12 batches on each rank"):
        dataset.state_dict(13)
    with pytest.raises(trainfeed.UsageError, match="batch_size must be an integer, at least 1, not 0"):
        trainfeed.TorchDataset(store, batch_size=0)
    with pytest.raises(trainfeed.TrainfeedError, match="56 samples, fewer than one batch of 64"):
        trainfeed.TorchDataset(store, batch_size=64, drop_last=True)
    with pytest.raises(trainfeed.UsageError, match="lanes \\(3\\) must divide the global batch size \\(8\\)"):
        trainfeed.TorchDataset(store, batch_size=8, lanes=3)
    for env, said in (({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 and WORLD_SIZE=2 in the environment"),
                      ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1 and WORLD_SIZE=2 in the environment"),
                      ({"RANK": "1"}, "RANK is set in the environment but WORLD_SIZE is not")):
        for name in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(trainfeed.UsageError, match=said):
            trainfeed.TorchDataset(store, batch_size=5)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(trainfeed.UsageError, match="global_batch_size=10 cannot be shared evenly by a world of 3"):
        trainfeed.TorchDataset(store, global_batch_size=10)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(trainfeed.UsageError, match="a store's path or URL is needed, not ''"):
        trainfeed.open_store("")
    monkeypatch.chdir(tmp_path)  # before, "" opened the current folder
    with pytest.raises(trainfeed.UsageError, match="a store's path or URL is needed"):
        trainfeed.open_store("   ")


def test_a_loop_that_counts_from_the_epoch_start_resumes_twice_in_one_epoch(store56):
    """Issue #32 item 7: ``state_dict(n)`` takes the batches done since the epoch began, as a
    user's loop counts them (``enumerate(loader, start=dataset.start_batch)``), across two
    resumes in one epoch: every batch once, in order."""
    from torch.utils.data import DataLoader

    store, _ = store56
    full = epoch_of(trainfeed.TorchDataset(store, batch_size=4, seed=6), 2)
    got, state = [], None
    for stop_at in (4, 9, None):  # killed after batch 4, then after batch 9, then to the end
        dataset = trainfeed.TorchDataset(store, batch_size=4, seed=6)
        if state is not None:
            dataset.load_state_dict(state)
        for step, (x, y) in enumerate(DataLoader(dataset, batch_size=None, num_workers=2, timeout=300),
                                      start=dataset.start_batch):
            got.append((x.numpy().tobytes(), y.numpy().copy()))
            if step + 1 == stop_at:
                state = dataset.state_dict(step + 1)
                break
    assert [x for x, _ in got] == [x for x, _ in full] and len(got) == 14
