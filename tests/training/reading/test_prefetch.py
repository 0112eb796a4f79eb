"""The prefetch thread ends when the step stops reading, whatever it was doing: a consumer that
leaves the queue full (a run stopped at --steps-per-epoch near the epoch's end) must not leave
the thread blocked on its last put."""
from __future__ import annotations

import numpy as np

from trainfeed.training.reading.prefetch import Prefetcher
from trainfeed.training.reading.store import Batch


def batches(n: int):
    for k in range(n):
        yield Batch(np.full((2, 3), k, np.float32), np.zeros(2, np.int64), [f"a{k}", f"b{k}"])


def test_close_ends_the_thread_when_the_queue_is_full_at_the_epochs_end():
    p = Prefetcher(batches(3), lambda b: b.x, depth=2)
    (batch, x), _ = p.get()
    assert batch.ids == ["a0", "b0"] and x[0, 0] == 0
    while p._q.qsize() < 2:  # the reader filled the queue with batches 1 and 2; the end marker waits for room
        p._thread.join(0.01)
    p.close()
    assert not p._thread.is_alive()


def test_every_batch_then_the_end():
    p = Prefetcher(batches(4), lambda b: float(b.x.sum()), depth=2)
    got = []
    while True:
        item, wait = p.get()
        if item is None:
            break
        got.append(item[1])
        assert wait >= 0
    p.close()
    assert got == [0.0, 6.0, 12.0, 18.0] and not p._thread.is_alive()
