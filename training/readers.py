"""One interface over every layout: open a store, iterate one epoch of numpy batches.

- parquet / delta: Petastorm ``make_batch_reader`` over the store's files (for Delta, the
  live snapshot's files from the log, at ``delta_version`` if given);
- hdf5: h5py, chunk-aligned slices read ahead by worker threads (one handle per thread and file);
- blob: the original small files, one read per sample, N threads (local or any fsspec URL).

Every reader shards by rank the same way (pieces -> ``index % num_shards == shard``), shuffles
pieces and then samples through a seeded buffer, and yields ``Batch`` objects of numpy arrays.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from trainfeed.converters import delta, hdf5, parquet
from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.labels import resolve_labels
from trainfeed.converters.layout import ID, LABEL, MANIFEST, DatasetSchema, FieldSpec, decode_tensor
from trainfeed.converters.samples import SchemaGuard, load_sample, ordered_map
from trainfeed.converters.sources import ImageOptions, list_source
from trainfeed.converters.stores import detect_format

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
    if opts.delta_version is not None and fmt != "delta":
        raise UsageError(f"--delta-version applies to Delta tables only; {path} is a {fmt} store")
    local = path.removeprefix("file://")
    if fmt != "blob" and not Path(local).exists():
        raise TrainfeedError(f"{path}: store not found")
    try:
        if fmt == "parquet":
            store = _open_parquet(local, parquet.read_schema(local), parquet.data_files(local), opts)
            _check_declared_rows(store, _manifest_rows(local, parquet.read_manifest(local)))
            return store
        if fmt == "delta":
            return _open_delta(local, opts)
        if fmt == "hdf5":
            return _open_hdf5(local, opts)
        return _open_blob(path, opts)
    except TrainfeedError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise TrainfeedError(f"{path}: cannot open as a {fmt} store: {exc}") from exc


def _open_delta(path: str, opts: ReaderOptions) -> Store:
    if opts.delta_version is not None:
        latest = delta.open_table(path).version()
        if not 0 <= opts.delta_version <= latest:
            raise UsageError(f"--delta-version {opts.delta_version}: {path} has versions 0..{latest}")
    table = delta.open_table(path, opts.delta_version)
    store = _open_parquet(path, delta.read_schema(path, opts.delta_version), table.file_uris(), opts)
    store.fmt, store.version = "delta", table.version()
    _check_declared_rows(store, {})
    return store


def _manifest_rows(path: str, manifest: dict) -> dict[str, int | None]:
    """Rows per data file as the manifest declares them."""
    return {str(Path(path) / part["file"]): part.get("rows") for part in manifest.get("parts", [])}


def _check_declared_rows(store: Store, declared_per_file: dict[str, int | None]) -> None:
    """The rows the pieces hold must be what the store declares: per file (manifest) and in
    all (``schema.samples``). A mismatch means a damaged or hand-edited store: never train on it."""
    held: dict[str, int] = {}
    for piece, rows in zip(store.pieces, store.piece_rows):
        held[_piece_file(piece)] = held.get(_piece_file(piece), 0) + rows
    for f, declared in declared_per_file.items():
        if declared is not None and declared != held.get(f, 0):
            raise TrainfeedError(f"{f}: the store's manifest declares {declared} samples in this file, "
                                 f"it holds {held.get(f, 0)}: the store is damaged or was modified; convert it again")
    if store.schema.samples is not None and store.schema.samples != store.samples:
        raise TrainfeedError(f"{store.path}: the store declares {store.schema.samples} samples, its files hold "
                             f"{store.samples}: the store is damaged or was modified; convert it again")


def _piece_file(piece) -> str:
    """The file a piece is read from (Parquet/HDF5 pieces are tuples, blob pieces SourceFiles)."""
    return piece[0] if isinstance(piece, tuple) else piece.path


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
    files = hdf5.data_files(path)
    pieces, rows = [], []
    for f in files:
        with h5py.File(f, "r") as h5:
            n = _hdf5_rows_in(h5, f, schema)
            chunk = h5[spec.name].chunks[0] if h5[spec.name].chunks else 64
        step = max(chunk, (max(64, chunk) // chunk) * chunk)  # whole chunks, >= 64 samples per read
        for start in range(0, n, step):
            pieces.append((f, start, min(n, start + step)))
            rows.append(min(n, start + step) - start)
    store = Store(path, "hdf5", schema, spec, pieces, rows, extra={"files": files})
    manifest = Path(path) / MANIFEST
    _check_declared_rows(store, _manifest_rows(path, json.loads(manifest.read_text())) if manifest.is_file() else {})
    return store


def _hdf5_rows_in(h5, path: str, schema: DatasetSchema) -> int:
    """Samples in one HDF5 file: every dataset (id, label, each field) must hold the same number."""
    names = [ID, *([LABEL] if schema.labeled else []), *schema.field_names]
    missing = [name for name in names if name not in h5]
    if missing:
        raise TrainfeedError(f"{path}: no dataset {missing[0]!r} in this file: not a complete trainfeed HDF5 store")
    lengths = {name: h5[name].shape[0] if h5[name].shape else 0 for name in names}
    if len(set(lengths.values())) > 1:
        sizes = ", ".join(f"{name} {n}" for name, n in lengths.items())
        raise TrainfeedError(f"{path}: datasets hold different numbers of samples ({sizes}): the file is damaged "
                             "or was modified; convert it again")
    for spec in schema.fields:
        ds = h5[spec.name]
        if spec.is_raw and spec.shape is not None and (ds.shape[1:] != tuple(spec.shape) or ds.dtype != spec.dtype):
            raise TrainfeedError(f"{path}: dataset {spec.name!r} holds {ds.dtype} samples of shape {ds.shape[1:]}, "
                                 f"the store's schema says {spec.dtype} {tuple(spec.shape)}: the file is damaged or "
                                 "was modified; convert it again")
    return lengths[ID]


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
    return _h5_arrays(h5, start, stop, field_name, labeled)


def _h5_arrays(h5, start: int, stop: int, field_name: str, labeled: bool) -> tuple[list, np.ndarray, np.ndarray]:
    ids = [x.decode() if isinstance(x, bytes) else x for x in h5[ID][start:stop]]
    y = h5[LABEL][start:stop] if labeled else np.full(stop - start, -1, np.int64)
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
    return _table_arrays(pf.read_row_group(rg, columns=[ID, LABEL, spec.name]), spec)


def _table_arrays(table: pa.Table, spec: FieldSpec) -> tuple[list, np.ndarray, np.ndarray]:
    col = table.column(spec.name).combine_chunks()
    n = len(col)
    if pa.types.is_binary(col.type):
        offsets = np.frombuffer(col.buffers()[1], np.int32, n + 1, col.offset * 4)
        data = np.frombuffer(col.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
        x = data.view(np.dtype(spec.dtype).newbyteorder("<")).reshape((n, *spec.shape))
    else:
        x = col.flatten().to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False).reshape((n, *spec.shape))
    return table.column(ID).to_pylist(), _labels(table.column(LABEL).to_numpy(zero_copy_only=False)), x


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
    for i, item in zip(order, reader(store, opts, order)):
        _check_piece(store, i, item)
        yield item


def _check_piece(store: Store, index: int, item: tuple) -> None:
    """A piece must deliver as many ids, labels and samples as it was listed with."""
    ids, y, x = item
    listed = store.piece_rows[index]
    if not len(ids) == len(y) == len(x) == listed:
        raise TrainfeedError(f"{_piece_file(store.pieces[index])}: read {len(ids)} ids, {len(y)} labels and "
                             f"{len(x)} samples where {listed} were listed: the file is damaged or changed "
                             "while training")


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


# ------------------------------------------------------------------ what a store holds

def store_identity(store: Store) -> str:
    """What identifies a store's content, whatever path or URL it was opened by (checkpoints
    must match it). The id its writer gave it (for Delta, with the version read) when there
    is one; else a fingerprint of its content (see ``_fingerprint``)."""
    if store.schema.store_id:
        key = {"store_id": store.schema.store_id, "version": store.version}
    else:
        key = {"fingerprint": _fingerprint(store)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _fingerprint(store: Store) -> dict:
    """Content only, never the path: the schema (less ``source``, a path), the rows of every
    piece, each data file's name within the store and size (blob: each file's id and size),
    every label, and the first sample (id, label, tensor bytes) of the first and of the last
    piece. Cheap: the label column and two samples are read. Sound: the same store gives the
    same answer by any path; other data differs in its labels, its counts or sizes, or its
    first or last samples (a rewrite differing in none of these is the one blind spot, and a
    store written with a store_id has none)."""
    schema = {k: v for k, v in store.schema.to_dict().items() if k != "source"}
    if store.fmt == "blob":
        files = [[f.id, f.size] for f in store.pieces]
    else:
        files = [_file_entry(store.path, f) for f in store.extra["files"]]
    digest = hashlib.sha256()
    for labels in _label_columns(store):
        digest.update(labels.astype("<i8").tobytes())
    for index in sorted({0, len(store.pieces) - 1}):
        sample_id, label, value = _first_sample(store, index)
        digest.update(json.dumps([sample_id, label]).encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return {"schema": schema, "format": store.fmt, "version": store.version, "rows": store.piece_rows,
            "files": files, "content": digest.hexdigest()}


def _file_entry(root: str, file: str) -> list:
    local = file.removeprefix("file://")
    name = os.path.relpath(os.path.abspath(local), os.path.abspath(root))  # "." for a single-file store
    return [name, os.path.getsize(local)]


def _first_sample(store: Store, index: int) -> tuple[str, int, np.ndarray]:
    """The first sample of piece ``index``, read through fresh handles (not the readers' caches)."""
    piece, spec = store.pieces[index], store.spec
    if store.fmt == "blob":
        sample = load_sample(store.extra["fs"], store.extra["kind"], piece, store.extra["labels"], ImageOptions())
        return sample.id, -1 if sample.label is None else sample.label, sample.fields[spec.name]
    if store.fmt == "hdf5":
        import h5py

        f, start, _ = piece
        with h5py.File(f, "r") as h5:
            ids, y, x = _h5_arrays(h5, start, start + 1, spec.name, store.schema.labeled)
    else:
        import pyarrow.parquet as pq

        f, rg = piece
        batch = next(pq.ParquetFile(f).iter_batches(batch_size=1, row_groups=[rg], columns=[ID, LABEL, spec.name]))
        ids, y, x = _table_arrays(pa.Table.from_batches([batch]), spec)
    return ids[0], int(y[0]), x[0]


def label_bounds(store: Store) -> tuple[int, int] | None:
    """The lowest and highest label in the store (-1 for a sample without one), reading the
    label column only; None for an empty store."""
    columns = [y for y in _label_columns(store) if len(y)]
    if not columns:
        return None
    return min(int(y.min()) for y in columns), max(int(y.max()) for y in columns)


def _label_columns(store: Store) -> Iterator[np.ndarray]:
    if store.fmt == "blob":
        labels = store.extra["labels"]
        yield np.array([-1 if labels.get(f.id) is None else labels.get(f.id) for f in store.pieces], np.int64)
    elif store.fmt == "hdf5":
        import h5py

        for f in store.extra["files"]:
            with h5py.File(f, "r") as h5:
                yield h5[LABEL][:].astype(np.int64) if store.schema.labeled else np.full(h5[ID].shape[0], -1)
    else:
        import pyarrow.parquet as pq

        for f in store.extra["files"]:
            column = pq.ParquetFile(f).read(columns=[LABEL]).column(LABEL).combine_chunks()
            yield _labels(column.to_numpy(zero_copy_only=False))
