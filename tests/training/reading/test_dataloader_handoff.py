"""Issue #31: batches cross from DataLoader workers to the training process without a new
allocation and copy. One worker reads into batch slots the training process allocated once;
the training process receives views of them; a slot is reused only once nothing of it is held.

Each test runs a real DataLoader with worker processes (``timeout``: a hang fails the test)
and compares samples bit for bit with what the training process reads by itself."""
from __future__ import annotations

import gc
import os
import signal
import traceback

import numpy as np
import pytest

import trainfeed
from tests.training.reading.dataloaders import TIMEOUT, loader, make_store, samples_of
from trainfeed import torch_handoff, torch_ring
from trainfeed.converters.errors import TrainfeedError
from trainfeed.torch_ring import FILL, RELEASED, RUN, TAKEN

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402


def settle(raised) -> None:
    """Let the DataLoader that raised go now: PyTorch re-raises a worker's error from a frame that
    holds it (a cycle), so without this the loader waits for a garbage collection, which shuts
    its workers down slowly (they never get the word, and are terminated after seconds)."""
    traceback.clear_frames(raised.tb)


def epoch_bytes(batches) -> list[tuple[bytes, bytes]]:
    return [(x.numpy().tobytes(), y.numpy().tobytes()) for x, y in batches]


def in_ring(dataset, t) -> bool:
    """Whether tensor ``t`` lies in the dataset's batch slots (a view: no copy was made)."""
    ring = dataset._ring
    start = ring.data.data_ptr()
    return start <= t.data_ptr() < start + ring.slots * ring.slot_bytes


def held(ring) -> int:
    """Slots the training process holds (taken, not yet given back)."""
    t = ring.table.numpy()
    return int(((t[:, TAKEN] == t[:, FILL]) & (t[:, RELEASED] != t[:, FILL]) & (t[:, FILL] > 0)).sum())


@pytest.mark.parametrize("method,persistent", [("fork", True), ("fork", False), ("spawn", True), ("forkserver", True)])
def test_every_batch_kept_in_a_list_and_across_epochs_stays_bit_for_bit(request, tmp_path, source, method,
                                                                        persistent):
    store, _, _ = make_store(request, tmp_path, source, "local")
    alone = trainfeed.TorchDataset(store, batch_size=5, seed=7)
    want = []
    for epoch in (0, 1):
        alone.set_epoch(epoch)
        want.append(epoch_bytes(DataLoader(alone, batch_size=None)))
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=7)
    dl = loader(dataset, method, 2, persistent)
    kept = []
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        kept.append([(x, y) for x, y in dl])  # the tensors themselves, held
    assert all(in_ring(dataset, x) and in_ring(dataset, y) for e in kept for x, y in e)  # views: no copy
    assert held(dataset._ring) == sum(len(e) for e in kept)
    for epoch in (0, 1):  # read at the end: nothing held was overwritten by later batches
        assert epoch_bytes(kept[epoch]) == want[epoch]
    assert samples_of([(x.numpy(), y.numpy()) for x, y in kept[0]]) == source[1]
    del kept
    gc.collect()
    assert held(dataset._ring) == 0  # every slot given back once nothing of it is held


@pytest.mark.parametrize("num_workers", [1, 3, 4])
def test_any_number_of_workers_delivers_the_order_the_training_process_reads(request, tmp_path, source, num_workers):
    store, _, _ = make_store(request, tmp_path, source, "local")
    dataset = trainfeed.TorchDataset(store, batch_size=6, seed=3)
    want = epoch_bytes(DataLoader(dataset, batch_size=None))
    assert epoch_bytes(loader(dataset, "fork", num_workers)) == want


def test_in_order_false_delivers_the_order_and_resumes_exactly(request, tmp_path, source):
    """DataLoader(in_order=False) yields batches as they arrive: each handle then stands for
    the next batch of the epoch, so the order (and what state_dict(n) names) stays the epoch's."""
    store, _, _ = make_store(request, tmp_path, source, "local")
    dataset = trainfeed.TorchDataset(store, batch_size=4, seed=9)
    want = epoch_bytes(DataLoader(dataset, batch_size=None))

    def unordered():
        return DataLoader(dataset, batch_size=None, num_workers=3, multiprocessing_context="fork", in_order=False,
                          timeout=TIMEOUT)

    assert epoch_bytes(unordered()) == want
    got = []
    for step, (x, y) in enumerate(unordered()):
        got.append((x.numpy().tobytes(), y.numpy().tobytes()))
        if step + 1 == 5:
            state = dataset.state_dict(step + 1)
            break
    dataset.load_state_dict(state)
    assert got + epoch_bytes(unordered()) == want


def test_pin_memory_delivers_every_sample(request, tmp_path, source):
    """``pin_memory=True``: with CUDA, the pinning thread copies each batch to pinned memory and
    drops the slot's view; without it (CI), PyTorch leaves pinning off. Either way, every sample."""
    store, _, _ = make_store(request, tmp_path, source, "local")
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=2)
    dl = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork", pin_memory=True,
                    timeout=TIMEOUT)
    with pytest.warns(UserWarning, match="pin_memory") if not torch.cuda.is_available() else _nothing():
        got = [(x.numpy().copy(), y.numpy().copy()) for x, y in dl]
    assert samples_of(got) == source[1]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_loader_abandoned_mid_epoch_gives_its_slots_back(request, tmp_path, source):
    store, _, _ = make_store(request, tmp_path, source, "local")
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=4)
    it = iter(loader(dataset, "fork", 2))
    first = [next(it) for _ in range(3)]
    assert held(dataset._ring) >= 3
    del first, it
    gc.collect()
    assert held(dataset._ring) == 0
    # the slots filled for the abandoned iterator, never taken, are the next reader's
    assert samples_of([(x.numpy().copy(), y.numpy().copy()) for x, y in loader(dataset, "fork", 2)]) == source[1]
    t = dataset._ring.table.numpy()
    assert len(set(t[t[:, FILL] > 0, RUN].tolist())) >= 1


@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_worker_leaves_no_shared_memory_and_the_loader_raises(request, tmp_path, source, victim):
    """Worker 0 reads, worker 1 only hands over: either killed, the DataLoader says so, and
    nothing is left in /dev/shm (the slots are shared by file descriptor, unlinked at once)."""
    store, _, _ = make_store(request, tmp_path, source, "local")
    before = set(os.listdir("/dev/shm"))
    dataset = trainfeed.TorchDataset(store, batch_size=2, seed=4)
    it = iter(loader(dataset, "fork", 2))
    next(it)
    os.kill(it._workers[victim].pid, signal.SIGKILL)
    # PyTorch notices the dead worker, or another worker notices the reader is gone: either says so
    said = "DataLoader worker .* exited unexpectedly|killed by signal|reading the store .* is gone"
    with pytest.raises((RuntimeError, TrainfeedError), match=said) as e:
        for _ in it:
            pass
    settle(e)
    del it
    gc.collect()
    assert set(os.listdir("/dev/shm")) - before == set()


def test_holding_every_slot_is_a_clear_error(request, tmp_path, source, monkeypatch):
    monkeypatch.setattr(torch_ring, "MIN_SLOTS", 3)
    monkeypatch.setattr(torch_ring, "MAX_SLOTS", 3)
    monkeypatch.setattr(torch_handoff, "HOLD_TIMEOUT", 1.0)  # forked workers inherit these
    store, _, _ = make_store(request, tmp_path, source, "local")
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=4)
    kept = []
    with pytest.raises(TrainfeedError, match="the training process has held all 3 batch slots of this DataLoader") as e:
        for x, y in loader(dataset, "fork", 2):
            kept.append((x, y))
    settle(e)
    assert len(kept) == 3


def test_a_reading_error_reaches_the_training_process_from_any_worker(request, tmp_path, source):
    store, _, _ = make_store(request, tmp_path, source, "local")
    dataset = trainfeed.TorchDataset(store, batch_size=5, seed=4)
    next(iter(dataset))
    part = sorted((tmp_path / "s.parquet").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes())  # another file now, for the readers' pins
    with pytest.raises(TrainfeedError, match=r"the store changed while it was being read .*; reopen it") as e:
        for _ in loader(dataset, "fork", 2):
            pass
    settle(e)


def test_a_batch_kept_by_another_thread_is_not_overwritten(request, tmp_path, source):
    import queue
    import threading

    store, _, _ = make_store(request, tmp_path, source, "local")
    dataset = trainfeed.TorchDataset(store, batch_size=3, seed=5)
    want = epoch_bytes(DataLoader(dataset, batch_size=None))
    handed: queue.Queue = queue.Queue()
    results: list = []
    consumer = threading.Thread(target=lambda: results.extend(epoch_bytes(iter(handed.get, None))))
    for batch in loader(dataset, "fork", 2):
        handed.put(batch)
    handed.put(None)
    consumer.start()  # starts reading only once every batch was handed over
    consumer.join(TIMEOUT)
    assert results == want
    assert np.all([len(r[1]) for r in results])

