"""Issue #23: PyTorch's own way in. ``TorchDataset`` in a real ``DataLoader`` with worker
processes, on stores on a real S3 server (moto), on Azurite and on local disk, under each
start method (fork, forkserver, spawn): every sample exactly once per epoch, bit for bit, a
new order each epoch, ``persistent_workers`` on and off, resumes at the exact next batch.

A hang fails the test instead of the run: every DataLoader has ``timeout`` (a worker that
delivers nothing for that long raises), and the README recipe runs in a subprocess with a
time limit. Fork is the case that hung before: ``open_store`` uses the object-store client in
the parent, whose runtime a forked child cannot use (converters/storage/client.py)."""
from __future__ import annotations

import ctypes
import multiprocessing
import pickle
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import trainfeed
from tests.test_object_storage import get_backend, on

torch = pytest.importorskip("torch")

from tests.training.reading.dataloaders import REPO, TIMEOUT, loader, make_store, samples_of  # noqa: E402


def epochs(dataset, dl, n: int = 2) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    out = []
    for epoch in range(n):
        dataset.set_epoch(epoch)
        out.append([(x.numpy().copy(), y.numpy().copy()) for x, y in dl])
    return out


def assert_exact_epochs(got, truth) -> None:
    for epoch in got:
        assert samples_of(epoch) == truth  # every sample once, bit for bit
    assert [x.tobytes() for x, _ in got[0]] != [x.tobytes() for x, _ in got[1]]  # a new order each epoch


# spawn and forkserver start a Python per worker: persistent workers for one, not for the other
METHODS = [("fork", False), ("fork", True), ("forkserver", False), ("spawn", True)]


@pytest.mark.slow
@pytest.mark.parametrize("method,persistent", METHODS,
                         ids=[f"{m}-{'persistent' if p else 'fresh'}" for m, p in METHODS])
@pytest.mark.parametrize("backend", [on("s3"), on("azurite"), "local"])
def test_two_workers_deliver_every_sample_once_under_each_start_method(request, tmp_path, source, backend, method,
                                                                       persistent):
    store, _, _ = make_store(request, tmp_path, source, backend)
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=3)
    assert_exact_epochs(epochs(dataset, loader(dataset, method, 2, persistent)), source[1])


@pytest.mark.s3
@pytest.mark.parametrize("num_workers,persistent", [(0, False), (1, False), (1, True), (4, False), (4, True)])
def test_any_worker_count_under_fork_on_s3(request, tmp_path, source, num_workers, persistent):
    store, _, _ = make_store(request, tmp_path, source, "s3")
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=4)
    assert_exact_epochs(epochs(dataset, loader(dataset, "fork", num_workers, persistent)), source[1])


@pytest.mark.s3
@pytest.mark.parametrize("method,persistent", [("fork", True), ("spawn", True)])
def test_state_dict_resumes_at_the_exact_next_batch_with_workers_on_s3(request, tmp_path, source, method, persistent):
    store, _, _ = make_store(request, tmp_path, source, "s3")
    full_ds = trainfeed.TorchDataset(store, batch_size=5, seed=5)
    full_ds.set_epoch(1)
    full = [x.numpy().tobytes() for x, _ in loader(full_ds, method, 2)]
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=5)
    dl = loader(dataset, method, 2, persistent)
    for done in (3, 8):  # the same workers (persistent) follow each resume
        dataset.load_state_dict({**full_ds.state_dict(0), "epoch": 1, "batch": done})
        assert [x.numpy().tobytes() for x, _ in dl] == full[done:], done
    dataset.set_epoch(2)  # the next epoch starts from its first batch, in its own order
    full_ds.set_epoch(2)
    assert [x.numpy().tobytes() for x, _ in dl] == [x.numpy().tobytes() for x, _ in loader(full_ds, method, 2)]


@pytest.mark.parametrize("fmt", ["parquet", "delta", "hdf5", "hdf5-shards"])
def test_a_pickled_store_reads_what_the_store_reads(request, tmp_path, source, fmt):
    store, options, _ = make_store(request, tmp_path, source, "s3", fmt)
    copy = pickle.loads(pickle.dumps(store))
    assert (copy.uri, copy.format, copy.samples) == (store.uri, store.format, store.samples)
    for epoch in (0, 1):
        want = [(b.ids, b.x.tobytes(), b.y.tolist()) for b in store.batches(6, seed=1, epoch=epoch)]
        assert [(b.ids, b.x.tobytes(), b.y.tolist()) for b in copy.batches(6, seed=1, epoch=epoch)] == want
    # the copy is pinned to what was listed when the store was opened: a store rewritten since is
    # refused, a Delta table is read at the version opened (its old files stay until a vacuum)
    root, _ = source
    trainfeed.convert(str(root), store.uri, format=fmt.split("-")[0], labels=str(root / "labels.csv"),
                      storage_options=options, mode="overwrite",
                      row_group_size=8 * 128, target_file_size=24 * 128, hdf5_chunk_size=8 * 128)
    later = pickle.loads(pickle.dumps(store))
    if fmt == "delta":
        assert [b.x.tobytes() for b in later.batches(6, seed=1, epoch=1)] == [w[1] for w in want]
    else:
        with pytest.raises(trainfeed.TrainfeedError, match="store changed while it was being read"):
            list(later.batches(6))


def test_a_pickled_small_file_folder_reads_the_same_samples(request, source):
    backend = get_backend(request, "s3")
    bucket = backend.new_bucket("dl-blob")
    fs = backend.fs()
    root, truth = source
    for file in root.iterdir():
        fs.pipe_file(f"{bucket}/src/{file.name}", file.read_bytes())
    url = backend.url(bucket, "src")
    store = trainfeed.open_store(url, storage_options=backend.options, labels=f"{url}/labels.csv")
    copy = pickle.loads(pickle.dumps(store))
    assert samples_of([(b.x, b.y) for b in copy.batches(8, seed=2)]) == truth
    dataset = trainfeed.TorchDataset(store, batch_size=8, seed=2)
    assert_exact_epochs(epochs(dataset, loader(dataset, "fork", 2)), truth)


_STORE = None  # set before a pool forks: the children inherit it, client and all


def _shard_samples(rank: int) -> list[tuple[bytes, int]]:
    """Rank ``rank`` of 3's samples of an epoch, without the rows that pad its last batch."""
    return samples_of([(b.x[:len(b.ids) - b.padding], b.y[:len(b.ids) - b.padding])
                       for b in _STORE.batches(4, rank=rank, world_size=3)])


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_multiprocessing_pool_started_after_open_store_reads_every_shard(request, tmp_path, source, method):
    global _STORE
    store, _, _ = make_store(request, tmp_path, source, "azurite")
    _STORE = store
    next(iter(store.batches(8)))  # the parent has used the client, and left requests in flight, before the fork
    ctx = multiprocessing.get_context(method)
    adopt = {} if method == "fork" else {"initializer": _adopt, "initargs": (store,)}  # fork: inherited
    with ctx.Pool(3, **adopt) as pool:
        shards = pool.map_async(_shard_samples, range(3)).get(TIMEOUT)
    assert sorted(s for shard in shards for s in shard) == source[1]


def _adopt(store) -> None:
    global _STORE
    _STORE = store


def _library_and_shard(shard: int) -> tuple[int, str, list[tuple[bytes, int]]]:
    from trainfeed.converters.storage import client

    rows = _shard_samples(shard)
    lib = client.library()
    return id(lib), lib.origin, rows


def test_forked_workers_take_the_copy_of_the_client_their_parent_loaded_before_forking(request, tmp_path, source):
    """No worker loads code after the fork (the dynamic loader's locks may have been held by
    another thread of the parent then): each takes the untouched copy its parent loaded."""
    from trainfeed.converters.storage import client

    global _STORE
    store, _, _ = make_store(request, tmp_path, source, "s3")
    _STORE = store
    next(iter(store.batches(8)))
    assert client.library().origin == "installed"
    with multiprocessing.get_context("fork").Pool(3) as pool:
        got = pool.map_async(_library_and_shard, range(3)).get(TIMEOUT)
    spare = client._spare
    assert spare is not None and spare is not client.library()
    assert [(lib, origin) for lib, origin, _ in got] == [(id(spare), "private copy")] * 3
    assert sorted(s for _, _, rows in got for s in rows) == source[1]

    # the fork that hung in CI: another thread of the parent inside the dynamic loader (as an
    # exception being unwound is) while the workers are forked
    holding, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_inside_the_dynamic_loader, args=(holding, release), daemon=True)
    thread.start()
    try:
        assert holding.wait(TIMEOUT)
        with multiprocessing.get_context("fork").Pool(3) as pool:
            got = pool.map_async(_library_and_shard, range(3)).get(TIMEOUT)
        assert sorted(s for _, _, rows in got for s in rows) == source[1]
    finally:
        release.set()
        thread.join(TIMEOUT)


def _inside_the_dynamic_loader(holding: threading.Event, release: threading.Event) -> None:
    """Holds the dynamic loader's lock (dl_iterate_phdr holds it around its callback) until ``release``."""
    callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)

    def wait(*_):
        holding.set()
        release.wait(TIMEOUT)
        return 1  # one call is enough

    ctypes.CDLL(None).dl_iterate_phdr(callback_type(wait), None)


def test_a_cache_filled_by_worker_processes_serves_the_next_epoch_when_the_objects_are_gone(request, tmp_path,
                                                                                            source):
    cache = tmp_path / "cache"
    store, _options, url = make_store(request, tmp_path, source, "s3", cache_dir=str(cache))
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=6)
    dl = loader(dataset, "fork", 2)
    first = epochs(dataset, dl, 1)[0]
    assert samples_of(first) == source[1]
    assert list(cache.glob("*/*.bin"))  # written behind the reads, finished before the workers exited
    backend = get_backend(request, "s3")
    fs = backend.fs()
    for key in fs.find(url.removeprefix("s3://")):
        fs.rm_file(key)
    dataset.set_epoch(1)
    second = [(x.numpy().copy(), y.numpy().copy()) for x, y in dl]
    assert samples_of(second) == source[1]


def readme_recipe() -> str:
    """The README's PyTorch lines (DataLoader and checkpoint state), as written."""
    text = (REPO / "README.md").read_text()
    block = text.split("```python\nfrom torch.utils.data import DataLoader\n", 1)[1].split("```", 1)[0]
    lines = block.split("\nrun = trainfeed.train", 1)[0]
    return "from torch.utils.data import DataLoader\n" + lines


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_readme_recipe_runs_on_an_s3_store(request, tmp_path, source, method):
    _store, options, url = make_store(request, tmp_path, source, "s3")
    body = (f"import trainfeed\nstore = trainfeed.open_store({url!r}, storage_options={options!r})\n"
            + readme_recipe() + "\nprint('batches', step + 1, 'resumes at', state['batch'])\n")
    if method == "spawn":  # spawn re-imports the main module: a script needs its main guard
        body = ("import multiprocessing\n\ndef main():\n" + textwrap.indent(body, "    ")
                + "\nif __name__ == '__main__':\n    multiprocessing.set_start_method('spawn')\n    main()\n")
    script = tmp_path / "recipe.py"
    script.write_text(body)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batches 7 resumes at 7" in done.stdout  # 7 row groups of 8 samples, batches of 8


def _rank_reads(rank: int, world: int, store, out) -> None:
    """One torchrun-style rank (RANK / WORLD_SIZE in its environment) reading its share of an
    epoch through a DataLoader with two forked workers."""
    import os

    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    dataset = trainfeed.TorchDataset(store, batch_size=4, seed=8)
    dataset.set_epoch(1)
    out.put((rank, samples_of([(x.numpy(), y.numpy()) for x, y in loader(dataset, "fork", 2)])))


def test_ranks_that_each_use_dataloader_workers_read_every_sample_once(request, tmp_path, source):
    """Ranks started as torchrun and TorchDistributor start them (spawn), each with forked
    DataLoader workers: each rank its part of every global batch, nothing twice."""
    store, _, _ = make_store(request, tmp_path, source, "azurite")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    ranks = [ctx.Process(target=_rank_reads, args=(rank, 2, store, out)) for rank in range(2)]
    for p in ranks:
        p.start()
    got = dict(out.get(timeout=TIMEOUT * 2) for _ in ranks)
    for p in ranks:
        p.join(TIMEOUT)
    assert [p.exitcode for p in ranks] == [0, 0]
    assert sorted(got[0] + got[1]) == source[1] and not set(got[0]) & set(got[1])
