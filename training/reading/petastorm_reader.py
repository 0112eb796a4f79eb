"""The optional Petastorm reader for Parquet and Delta stores (``pip install 'trainfeed[petastorm]'``):
Petastorm's ``make_batch_reader`` over the store's files, pools "sharded", "process", "thread"
and "dummy". trainfeed's own engine (pool "arrow", the default) needs none of it.

Its rows go through a seeded shuffle buffer (Petastorm decides the row-group order, so the
epoch cannot be planned from metadata): a resume (``start_batch``) reads and drops the batches
before it.
"""
from __future__ import annotations

import os
import queue
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.interface import labels_array
from trainfeed.converters.layout import ID, LABEL, FieldSpec, decode_tensor

if TYPE_CHECKING:
    from trainfeed.training.reading.store import EpochOptions, OpenedStore

POOLS = ("sharded", "process", "thread", "dummy")
INSTALL = "pip install 'trainfeed[petastorm]'"


def make_batch_reader() -> Callable[..., Any]:
    try:
        import petastorm
    except ImportError:
        raise TrainfeedError(f"the Petastorm reader pools ({', '.join(POOLS)}) need Petastorm: {INSTALL}; "
                             "or use --reader-pool arrow (trainfeed's own reader, the default)") from None
    # Petastorm 0.13.1 drives pyarrow 14's legacy dataset API: its deprecation warnings say
    # nothing a trainfeed user can act on.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\..*)?$")
    reader: Callable[..., Any] = petastorm.make_batch_reader
    return reader


def _reader(store: OpenedStore, opts: EpochOptions, epoch: int, pool: str, workers: int, cur_shard: int,
            shard_count: int) -> Any:
    urls = ["file://" + os.path.abspath(f) if "://" not in f else f for f in store.listing.files]
    kwargs = dict(cur_shard=cur_shard, shard_count=shard_count) if shard_count > 1 else {}
    return make_batch_reader()(urls, schema_fields=[ID, LABEL, store.spec.name], num_epochs=1,
                               shuffle_row_groups=opts.shuffle, seed=opts.seed + epoch + 7919 * cur_shard,
                               reader_pool_type=pool, workers_count=workers, **kwargs)


Rows = tuple[list[str], np.ndarray, "np.ndarray | list[np.ndarray]"]


def _decode_rows(rb: Any, spec: FieldSpec) -> Rows:
    values = getattr(rb, spec.name)
    x: np.ndarray | list[np.ndarray]
    if len(values) and isinstance(values[0], bytes):
        # views into Petastorm's bytes objects: the one copy happens when a batch is stacked
        x = [decode_tensor(v, spec) for v in values]
    else:
        assert spec.shape is not None, "a field of arrays has a fixed shape"
        x = np.asarray(np.stack(values) if values.dtype == object else values, dtype=spec.dtype)
        x = x.reshape((len(values), *spec.shape))
    return list(getattr(rb, ID)), labels_array(getattr(rb, LABEL)), x


def _drain(reader: Any, spec: FieldSpec) -> Iterator[Rows]:
    try:
        for rb in reader:
            yield _decode_rows(rb, spec)
    finally:  # not the context manager: its exit prints to stdout
        reader.stop()
        reader.join()


def _merge_in_threads(sources: Sequence[Callable[[], Iterator[Rows]]], depth: int = 4) -> Iterator[Rows]:
    """Items of several iterators, each drained ahead by its own thread, taken round-robin:
    the merged order is as deterministic as the sources are."""
    queues: list[queue.Queue[object]] = [queue.Queue(maxsize=depth) for _ in sources]
    stop = threading.Event()
    done = object()

    def run(make: Callable[[], Iterator[Rows]], q: queue.Queue[object]) -> None:
        try:
            for item in make():
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as exc:
            q.put(exc)

    threads = [threading.Thread(target=run, args=(m, q), daemon=True, name="trainfeed-petastorm")
               for m, q in zip(sources, queues)]
    for t in threads:
        t.start()
    live = list(queues)
    try:
        while live:
            for q in list(live):
                item = q.get()
                if item is done:
                    live.remove(q)
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield cast("Rows", item)
    finally:
        stop.set()
        for t in threads:
            t.join(10)


def rows(store: OpenedStore, opts: EpochOptions, epoch: int) -> Iterator[Rows]:
    """Petastorm ``make_batch_reader`` rows of this rank's shard (row groups ``i % world_size == rank``:
    Petastorm decides the order, so its pools have no global order across ranks).

    pool "sharded": W single-threaded Petastorm readers, each on a disjoint sub-shard of the
    row groups (Petastorm's own cur_shard/shard_count), drained by W threads. Parquet reads
    release the GIL, so this scales like a thread pool without the thread pool's race."""
    spec = store.spec
    expected = store.shard_rows(opts.rank, opts.world_size)
    make_batch_reader()  # fails clearly before any thread starts when Petastorm is missing
    if opts.pool == "sharded":
        s, n = opts.rank, opts.world_size
        w = max(1, min(opts.workers, len(store.pieces) // n))
        # row group i is read by sub-shard i % (n*w); the union over this rank's w sub-shards
        # is exactly {i : i % n == s}, the rank's shard.
        makers = [lambda k=k: _drain(_reader(store, opts, epoch, "dummy", 1, s + n * k, n * w), spec)
                  for k in range(w)]
        source = _merge_in_threads(makers) if w > 1 else makers[0]()
    else:
        if opts.pool == "process":  # its worker processes inherit the environment, not our warning filters
            os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
        source = _drain(_reader(store, opts, epoch, opts.pool, max(1, opts.workers), opts.rank,
                                opts.world_size), spec)
    delivered = 0
    for item in source:
        if not len(item[0]) == len(item[1]) == len(item[2]):
            raise TrainfeedError(f"{store.path}: Petastorm delivered {len(item[0])} ids, {len(item[1])} labels and "
                                 f"{len(item[2])} samples in one batch")
        delivered += len(item[0])
        yield item
    if delivered != expected:
        # Petastorm 0.13.1's thread pool can end an epoch early (a race between its ventilator
        # and its per-worker queues) and silently drop row groups: never train on that.
        raise TrainfeedError(f"{store.path}: Petastorm's {opts.pool} pool delivered {delivered} of {expected} rows "
                             f"this epoch (a known race in petastorm 0.13.1's thread pool, or a file changed "
                             f"while training); use --reader-pool arrow (the default), sharded, process or dummy")


def batches(store: OpenedStore, opts: EpochOptions, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray, list[str]]]:
    """One epoch as (x, y, ids): rows sit in a seeded buffer as views into what Petastorm
    produced; a shuffled batch draws random rows from it (swap-remove) and stacks them."""
    rng = np.random.default_rng((opts.seed, epoch, 1))
    buf: list[tuple[str, int, np.ndarray]] = []
    size = opts.rank_batch
    limit = max(size, opts.shuffle_buffer if opts.shuffle else size)

    def take(n: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
        if opts.shuffle:
            taken = []
            for _ in range(n):
                i = int(rng.integers(len(buf)))
                buf[i], buf[-1] = buf[-1], buf[i]
                taken.append(buf.pop())
        else:
            taken, buf[:n] = buf[:n], []
        return np.stack([r[2] for r in taken]), np.array([r[1] for r in taken], np.int64), [r[0] for r in taken]

    for ids, y, x in rows(store, opts, epoch):
        buf.extend(zip(ids, y.tolist(), x))
        while len(buf) >= limit:
            yield take(size)
    while len(buf) >= size:
        yield take(size)
    if buf and not opts.drop_last:
        yield take(len(buf))
