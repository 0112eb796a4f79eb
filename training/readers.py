"""One interface over every layout: open a store, iterate one epoch of numpy batches.

- parquet / delta: Petastorm ``make_batch_reader`` over the store's files (for Delta, the
  live snapshot's files from the log, at ``delta_version`` if given);
- hdf5: h5py, chunk-aligned slices read ahead by worker threads (one handle per thread and file);
- blob: the original small files, one read per sample, N threads (local or any fsspec URL).

Every reader shards by rank the same way (pieces -> ``index % num_shards == shard``), shuffles
pieces and then samples through a seeded buffer, and yields ``Batch`` objects of numpy arrays.
"""
from __future__ import annotations

import os
import queue
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from converters import delta, hdf5, parquet
from converters.errors import TrainfeedError, UsageError
from converters.labels import resolve_labels
from converters.layout import DatasetSchema, FieldSpec, decode_tensor
from converters.samples import SchemaGuard, load_sample, ordered_map
from converters.sources import ImageOptions, list_source
from converters.stores import detect_format

FORMATS = ("parquet", "delta", "hdf5", "blob")

# Petastorm 0.13.1 drives pyarrow 14's legacy dataset API (why pyarrow is pinned): its
# deprecation warnings say nothing a trainfeed user can act on.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\..*)?$")


@dataclass(frozen=True)
class ReaderOptions:
    batch_size: int = 32
    workers: int = 2
    shuffle: bool = True
    seed: int = 0
    shuffle_buffer: int = 256  # samples held for shuffling across pieces
    pool: str = "sharded"  # Petastorm: sharded | process | thread | dummy (see _petastorm_rows); or arrow (no Petastorm)
    shard: int = 0
    num_shards: int = 1
    delta_version: int | None = None
    field_name: str | None = None  # tensor field to train on; default: the first one
    labels_csv: str | None = None  # blob stores: labels as convert takes them
    storage_options: dict = field(default_factory=dict)
    drop_last: bool = True


@dataclass
class Batch:
    x: np.ndarray  # (B, *shape)
    y: np.ndarray  # (B,) int64; -1 where unlabeled
    ids: list[str]

    @property
    def nbytes(self) -> int:
        return int(self.x.nbytes)


@dataclass
class Store:
    """An opened store: what it holds and the pieces one epoch is made of."""

    path: str
    fmt: str
    schema: DatasetSchema
    spec: FieldSpec
    pieces: list  # format-specific units of work, in a stable order
    piece_rows: list[int]
    version: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return sum(self.piece_rows)

    def shard_pieces(self, shard: int, num_shards: int) -> list[int]:
        return [i for i in range(len(self.pieces)) if i % num_shards == shard]

    def shard_rows(self, shard: int, num_shards: int) -> int:
        return sum(self.piece_rows[i] for i in self.shard_pieces(shard, num_shards))


def detect(path: str) -> str:
    fmt = detect_format(path.removeprefix("file://")) if "://" not in path or path.startswith("file://") else None
    return fmt or "blob"


def _pick_field(schema: DatasetSchema, name: str | None, path: str) -> FieldSpec:
    if not schema.fields:
        raise TrainfeedError(f"{path}: store has no tensor fields")
    if name is None:
        return schema.fields[0]
    try:
        return schema.field(name)
    except KeyError:
        raise TrainfeedError(f"{path}: store has no field {name!r} (fields: {', '.join(schema.field_names)})") from None


def open_store(path: str, fmt: str | None = None, opts: ReaderOptions = ReaderOptions()) -> Store:
    """Open ``path`` as ``fmt`` (detected when None) and list its pieces."""
    fmt = fmt or detect(path)
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    local = path.removeprefix("file://")
    if fmt != "blob" and not Path(local).exists():
        raise TrainfeedError(f"{path}: store not found")
    try:
        if fmt == "parquet":
            return _open_parquet(local, parquet.read_schema(local), parquet.data_files(local), opts)
        if fmt == "delta":
            table = delta.open_table(local, opts.delta_version)
            store = _open_parquet(local, delta.read_schema(local, opts.delta_version), table.file_uris(), opts)
            store.fmt, store.version = "delta", table.version()
            return store
        if fmt == "hdf5":
            return _open_hdf5(local, opts)
        return _open_blob(path, opts)
    except TrainfeedError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise TrainfeedError(f"{path}: cannot open as a {fmt} store: {exc}") from exc


def _open_parquet(path: str, schema: DatasetSchema, files: list[str], opts: ReaderOptions) -> Store:
    import pyarrow.parquet as pq

    spec = _pick_field(schema, opts.field_name, path)
    pieces, rows = [], []
    for f in files:  # Petastorm numbers row groups in this order: file by file
        meta = pq.ParquetFile(f).metadata
        for rg in range(meta.num_row_groups):
            pieces.append((f, rg))
            rows.append(meta.row_group(rg).num_rows)
    return Store(path, "parquet", schema, spec, pieces, rows, extra={"files": files})


def _open_hdf5(path: str, opts: ReaderOptions) -> Store:
    import h5py

    schema = hdf5.read_schema(path)
    spec = _pick_field(schema, opts.field_name, path)
    pieces, rows = [], []
    for f in hdf5.data_files(path):
        with h5py.File(f, "r") as h5:
            n = h5["id"].shape[0]
            chunk = h5[spec.name].chunks[0] if h5[spec.name].chunks else 64
        step = max(chunk, (max(64, chunk) // chunk) * chunk)  # whole chunks, >= 64 samples per read
        for start in range(0, n, step):
            pieces.append((f, start, min(n, start + step)))
            rows.append(min(n, start + step) - start)
    return Store(path, "hdf5", schema, spec, pieces, rows)


def _open_blob(path: str, opts: ReaderOptions) -> Store:
    fs, listing = list_source(path, opts.storage_options)
    labels = resolve_labels(listing.files, labels_csv=opts.labels_csv, storage_options=opts.storage_options)
    if labels.missing:
        raise TrainfeedError(f"{path}: {len(labels.missing)} files have no label in {opts.labels_csv}, "
                             f"e.g. {labels.missing[0]!r}")
    first = load_sample(fs, listing.kind, listing.files[0], labels, ImageOptions())
    guard = SchemaGuard(listing.kind, ImageOptions())
    guard.check(listing.files[0].path, first)
    schema = DatasetSchema(fields=guard.specs, labeled=labels.by_id is not None, label_map=labels.label_map,
                           source=path, samples=len(listing.files))
    spec = _pick_field(schema, opts.field_name, path)
    return Store(path, "blob", schema, spec, list(listing.files), [1] * len(listing.files),
                 extra={"fs": fs, "kind": listing.kind, "labels": labels})


def check_sharding(store: Store, num_shards: int, batch_size: int) -> int:
    """Pre-flight for data parallelism: every shard must get data, and all ranks must run
    the same number of steps (else collective ops hang). Returns steps per epoch per rank."""
    if num_shards < 1:
        raise UsageError("number of shards must be at least 1")
    if len(store.pieces) < num_shards:
        unit = {"parquet": "row groups", "delta": "row groups", "hdf5": "chunk slices", "blob": "files"}[store.fmt]
        raise TrainfeedError(f"{store.path}: {len(store.pieces)} {unit} cannot be split across {num_shards} shards; "
                             f"rewrite the store with a smaller --row-group-size / --hdf5-chunk-size, or use fewer ranks")
    rows = min(store.shard_rows(k, num_shards) for k in range(num_shards))
    if rows < batch_size:
        raise TrainfeedError(f"{store.path}: the smallest shard holds {rows} samples, fewer than one batch of {batch_size}")
    return rows // batch_size


# ------------------------------------------------------------------ row sources

def _petastorm_reader(store: Store, opts: ReaderOptions, epoch: int, pool: str, workers: int,
                      cur_shard: int, shard_count: int):
    from petastorm import make_batch_reader

    urls = ["file://" + os.path.abspath(f) if "://" not in f else f for f in store.extra["files"]]
    kwargs = dict(cur_shard=cur_shard, shard_count=shard_count) if shard_count > 1 else {}
    return make_batch_reader(urls, schema_fields=["id", "label", store.spec.name], num_epochs=1,
                             shuffle_row_groups=opts.shuffle, seed=opts.seed + epoch + 7919 * cur_shard,
                             reader_pool_type=pool, workers_count=workers, **kwargs)


def _decode_rows(rb, spec: FieldSpec) -> tuple[list, np.ndarray, np.ndarray | list]:
    values = getattr(rb, spec.name)
    if len(values) and isinstance(values[0], bytes):
        # views into Petastorm's bytes objects: the one copy happens when a batch is stacked
        x = [decode_tensor(v, spec) for v in values]
    else:
        x = np.asarray(np.stack(values) if values.dtype == object else values, dtype=spec.dtype)
        x = x.reshape((len(values), *spec.shape))
    return list(rb.id), _labels(rb.label), x


def _drain(reader, spec: FieldSpec) -> Iterator[tuple]:
    try:
        for rb in reader:
            yield _decode_rows(rb, spec)
    finally:  # not the context manager: its exit prints to stdout
        reader.stop()
        reader.join()


def _merge_in_threads(sources: list[Callable[[], Iterator]], depth: int = 4) -> Iterator:
    """Items of several iterators, each drained ahead by its own thread, taken round-robin:
    the merged order is as deterministic as the sources are."""
    queues = [queue.Queue(maxsize=depth) for _ in sources]
    stop = threading.Event()
    done = object()

    def run(make, q):
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
                    yield item
    finally:
        stop.set()
        for t in threads:
            t.join(10)


def _petastorm_rows(store: Store, opts: ReaderOptions, epoch: int) -> Iterator[tuple[list, np.ndarray, np.ndarray]]:
    """Petastorm ``make_batch_reader`` rows of this rank's shard.

    pool "sharded" (default): W single-threaded Petastorm readers, each on a disjoint sub-shard
    of the row groups (Petastorm's own cur_shard/shard_count), drained by W threads. Parquet
    reads release the GIL, so this scales like a thread pool without the thread pool's race."""
    spec = store.spec
    expected = store.shard_rows(opts.shard, opts.num_shards)
    if opts.pool == "sharded":
        s, n = opts.shard, opts.num_shards
        w = max(1, min(opts.workers, len(store.pieces) // n))
        # row group i is read by sub-shard i % (n*w); the union over this rank's w sub-shards
        # is exactly {i : i % n == s}, the rank's shard.
        makers = [lambda k=k: _drain(_petastorm_reader(store, opts, epoch, "dummy", 1, s + n * k, n * w), spec)
                  for k in range(w)]
        rows = _merge_in_threads(makers) if w > 1 else makers[0]()
    else:
        if opts.pool == "process":  # its worker processes inherit the environment, not our warning filters
            os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
        rows = _drain(_petastorm_reader(store, opts, epoch, opts.pool, max(1, opts.workers), opts.shard,
                                        opts.num_shards), spec)
    delivered = 0
    for item in rows:
        delivered += len(item[0])
        yield item
    if delivered != expected:
        # Petastorm 0.13.1's thread pool can end an epoch early (a race between its ventilator
        # and its per-worker queues) and silently drop row groups: never train on that.
        raise TrainfeedError(f"{store.path}: Petastorm's {opts.pool} pool delivered {delivered} of {expected} rows "
                             f"this epoch (a known race in petastorm 0.13.1's thread pool); "
                             f"use --reader-pool sharded (the default), process or dummy")


def _labels(values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == object:  # nulls in an unlabeled store
        return np.array([-1 if v is None else int(v) for v in arr], dtype=np.int64)
    return np.nan_to_num(arr, nan=-1).astype(np.int64)


_H5 = threading.local()


def _read_h5_slice(piece: tuple[str, int, int], field_name: str, labeled: bool):
    """One cached h5py handle per file and reading thread; one contiguous read per slice."""
    import h5py

    f, start, stop = piece
    handles = _H5.__dict__.setdefault("handles", {})
    h5 = handles.get(f)
    if h5 is None:
        h5 = handles[f] = h5py.File(f, "r")
    ids = [x.decode() if isinstance(x, bytes) else x for x in h5["id"][start:stop]]
    y = h5["label"][start:stop] if labeled else np.full(stop - start, -1, np.int64)
    return ids, y, h5[field_name][start:stop]


def _hdf5_rows(store: Store, opts: ReaderOptions, order: list[int]) -> Iterator[tuple]:
    """Chunk-aligned slices read ahead by ``workers`` threads, in shuffled order. Threads, not
    processes: pickling slices back from worker processes cost 4x the read (docs/BENCHMARKS.md)."""
    pieces = [store.pieces[i] for i in order]
    read = lambda p: _read_h5_slice(p, store.spec.name, store.schema.labeled)  # noqa: E731
    for result in ordered_map(read, pieces, max(1, opts.workers), window_per_worker=2):
        if isinstance(result, Exception):
            raise TrainfeedError(f"{store.path}: cannot read: {result}") from result
        yield result


def _blob_rows(store: Store, opts: ReaderOptions, order: list[int]) -> Iterator[tuple]:
    fs, kind, labels = store.extra["fs"], store.extra["kind"], store.extra["labels"]
    files = [store.pieces[i] for i in order]
    load = lambda src: load_sample(fs, kind, src, labels, ImageOptions())  # noqa: E731
    for src, sample in zip(files, ordered_map(load, files, max(1, opts.workers), window_per_worker=2)):
        if isinstance(sample, Exception):
            raise TrainfeedError(str(sample)) from sample
        value = sample.fields[store.spec.name]
        label = -1 if sample.label is None else sample.label
        yield [sample.id], np.array([label], np.int64), value[None]


_PQ = threading.local()


def _read_row_group(piece: tuple[str, int], spec: FieldSpec) -> tuple[list, np.ndarray, np.ndarray]:
    """One row group with pyarrow; a binary tensor column becomes a zero-copy view of its
    data buffer (all values have the same length, so the buffer is the stacked tensors)."""
    import pyarrow.parquet as pq

    f, rg = piece
    files = _PQ.__dict__.setdefault("files", {})
    pf = files.get(f) or files.setdefault(f, pq.ParquetFile(f))
    table = pf.read_row_group(rg, columns=["id", "label", spec.name])
    col = table.column(spec.name).combine_chunks()
    n = len(col)
    if pa.types.is_binary(col.type):
        offsets = np.frombuffer(col.buffers()[1], np.int32, n + 1, col.offset * 4)
        data = np.frombuffer(col.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
        x = data.view(np.dtype(spec.dtype).newbyteorder("<")).reshape((n, *spec.shape))
    else:
        x = col.flatten().to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False).reshape((n, *spec.shape))
    return table.column("id").to_pylist(), _labels(table.column("label").to_numpy(zero_copy_only=False)), x


def _arrow_rows(store: Store, opts: ReaderOptions, order: list[int]) -> Iterator[tuple]:
    pieces = [store.pieces[i] for i in order]
    read = lambda p: _read_row_group(p, store.spec)  # noqa: E731
    for result in ordered_map(read, pieces, max(1, opts.workers), window_per_worker=2):
        if isinstance(result, Exception):
            raise TrainfeedError(f"{store.path}: cannot read: {result}") from result
        yield result


def _rows(store: Store, opts: ReaderOptions, epoch: int) -> Iterator[tuple]:
    if store.fmt in ("parquet", "delta") and opts.pool != "arrow":
        yield from _petastorm_rows(store, opts, epoch)
        return
    order = store.shard_pieces(opts.shard, opts.num_shards)
    if opts.shuffle:
        np.random.default_rng((opts.seed, epoch)).shuffle(order)
    reader = {"parquet": _arrow_rows, "delta": _arrow_rows, "hdf5": _hdf5_rows, "blob": _blob_rows}[store.fmt]
    yield from reader(store, opts, order)


def iter_batches(store: Store, opts: ReaderOptions, epoch: int = 0) -> Iterator[Batch]:
    """One epoch of batches for this shard: every sample of the shard exactly once.

    Rows sit in a buffer as views into the arrays the reader produced; a shuffled batch
    draws random rows from it (swap-remove, no copying) and stacks them: one copy per sample."""
    rng = np.random.default_rng((opts.seed, epoch, 1))
    buf: list[tuple[str, int, np.ndarray]] = []
    limit = max(opts.batch_size, opts.shuffle_buffer if opts.shuffle else opts.batch_size)

    def take(n: int) -> Batch:
        if opts.shuffle:
            rows = []
            for _ in range(n):
                i = int(rng.integers(len(buf)))
                buf[i], buf[-1] = buf[-1], buf[i]
                rows.append(buf.pop())
        else:
            rows, buf[:n] = buf[:n], []
        return Batch(np.stack([r[2] for r in rows]), np.array([r[1] for r in rows], np.int64), [r[0] for r in rows])

    for ids, y, x in _rows(store, opts, epoch):
        buf.extend(zip(ids, y.tolist(), x))
        while len(buf) >= limit:
            yield take(opts.batch_size)
    while len(buf) >= opts.batch_size:
        yield take(opts.batch_size)
    if buf and not opts.drop_last:
        yield take(len(buf))
