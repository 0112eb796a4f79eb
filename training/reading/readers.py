"""One interface over every layout: open a store, iterate one epoch of numpy batches.

Formats come from the registry (``trainfeed.converters.formats.registry.FORMATS``): each lists its
pieces (Parquet/Delta row groups, HDF5 chunk slices, blob files) and reads one piece into
columns; what a format can do (versions, Petastorm, fetching ahead) is asked of it, never
decided by its name. Pool "arrow" (the default) reads them with trainfeed's own engine
(``training/reading/engine.py``: seeded epoch plan, read-ahead threads, batches gathered with one copy
per sample; resumable at any batch without re-reading). The Petastorm pools ("sharded",
"process", "thread", "dummy") read Parquet and Delta stores through Petastorm, an optional
extra (``training/reading/petastorm_reader.py``); HDF5 and blob stores always use the engine.

A Parquet or Delta table another tool wrote is read when ``OpenOptions.foreign`` names its
columns (``converters/formats/foreign_table.py``): the same row-group pieces and engine, arrow pool only.

The engine reads an epoch in one order for any number of ranks (``training/reading/order.py``):
each rank takes its part of every global batch, and every rank gets the same number of batches.
The Petastorm pools shard whole row groups by rank (``index % world_size == rank``) instead.
Encoded images (JPEG/PNG bytes) are decoded by the engine's threads as each piece is read
(``training/reading/images.py``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import posixpath
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats import foreign_table, registry
from trainfeed.converters.formats.foreign import HINT as FOREIGN_HINT
from trainfeed.converters.formats.interface import Columns, Empty, OpenFiles
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import FORMATS, IN_PLACE, AnyFormat, detect_format, detect_table
from trainfeed.converters.sources.dtypes import check_dtype_option
from trainfeed.converters.storage import fetch
from trainfeed.converters.storage.location import Location, is_remote, locate
from trainfeed.training.reading import engine, fitting, images, petastorm_reader
from trainfeed.training.reading.order import EpochOrder
from trainfeed.training.reading.store import Batch, EpochOptions, OpenedStore

POOLS = ("arrow", *petastorm_reader.POOLS)


def detect(path: str, storage_options: dict[str, Any] | None = None) -> str:
    """The format of the store at ``path`` (local or URL); the small files ("blob") when it is not a store."""
    return detect_format(path, storage_options) or IN_PLACE


def open_store(path: str, fmt: str | None = None, opts: OpenOptions = OpenOptions(),
               pool: str = "arrow") -> OpenedStore:
    """Open ``path`` (a local path or a URL: abfs://, az://, abfss://, s3://, gs://, file://)
    as ``fmt`` (detected when None) and list its pieces. ``pool``: the reader pool its epochs
    will be read with (``EpochOptions.pool``), checked against the store before anything is read."""
    if not isinstance(path, str) or not path.strip():
        raise UsageError(f"a store's path or URL is needed, not {path!r} (an empty path would name the current "
                         "folder)")
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if pool not in POOLS:
        raise UsageError(f"--reader-pool must be one of {', '.join(POOLS)}, not {pool!r}")
    if opts.io_concurrency < 1:
        raise UsageError(f"--io-concurrency must be at least 1, not {opts.io_concurrency}")
    check_dtype_option(opts.cast, "--cast")
    remote = is_remote(path)
    if opts.foreign is not None:
        fmt = _foreign_format(path, fmt, opts, pool)
    detected = fmt is None
    fmt = fmt or detect(path, opts.storage_options)
    module = FORMATS[fmt]
    if opts.cast is not None and not module.in_place:
        raise UsageError(f"--cast reads a folder of small files; {path} is a {fmt} store, whose samples have one dtype")
    if opts.version is not None and not module.versioned:
        raise UsageError(f"--delta-version applies to Delta tables only; {path} is a {fmt} store")
    if remote and pool != "arrow" and module.parquet_files:
        raise UsageError(f"--reader-pool {pool}: Petastorm reads local stores only; stores on object storage "
                         "are read by the default pool, arrow")
    location = locate(path, opts.storage_options)
    if module.writable and not location.exists():
        raise TrainfeedError(f"{location.shown}: store not found")
    if detected and module.in_place:
        _check_sample_folder(location)
    try:
        if opts.foreign is not None:
            listing = foreign_table.list_pieces(location, module.versioned, opts, opts.foreign)
        else:
            listing = module.list_pieces(path if module.in_place else location, opts)
    except TrainfeedError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        hint = f"; {FOREIGN_HINT}" if opts.foreign is None and _foreign_table(location, module) else ""
        raise TrainfeedError(f"{location.shown}: cannot open as a {fmt} store: {exc}{hint}") from exc
    store_path = path if remote or not module.writable else location.path
    store = OpenedStore(store_path, fmt, listing, location.path, local=not remote, options=opts)
    if not listing.spec.is_raw:
        if uses_petastorm(store, pool):
            raise UsageError(f"--reader-pool {pool}: {location.shown} holds encoded images, which the default "
                             "pool, arrow, decodes; Petastorm pools read raw tensors only")
        store.images = images.plan(listing.spec, opts.image_size, lambda: _first_image(store))
    if opts.fit is not None:
        if not listing.spec.is_raw:
            raise UsageError(f"fit applies to arrays; {location.shown} holds encoded images: give them one size with "
                             "--image-size / image_size=")
        if uses_petastorm(store, pool):
            raise UsageError(f"--reader-pool {pool}: fit is applied by the default pool, arrow")
        store.fit = fitting.Fit.parse(opts.fit)
    elif listing.spec.is_ragged and uses_petastorm(store, pool):
        raise UsageError(f"--reader-pool {pool}: {location.shown} holds samples of different shapes, which the "
                         "default pool, arrow, reads")
    return store


def _foreign_format(path: str, fmt: str | None, opts: OpenOptions, pool: str) -> str:
    """The format of a table read with ``opts.foreign``: Parquet or Delta (detected by its log),
    and what does not combine with reading one."""
    if fmt is not None and not FORMATS[fmt].parquet_files:
        raise UsageError(f"--tensor-column reads Parquet and Delta tables, not --format {fmt}")
    if pool != "arrow":
        raise UsageError(f"--reader-pool {pool}: a table read with --tensor-column is read by the default "
                         "pool, arrow")
    if opts.labels:
        raise UsageError("--labels is for folders of small files; a table's labels are its --label-column")
    assert opts.foreign is not None  # called for a table read with --tensor-column
    if opts.field not in (None, opts.foreign.tensor_column):
        raise UsageError(f"--field {opts.field!r} names a field of a trainfeed store; with --tensor-column "
                         f"the tensor is column {opts.foreign.tensor_column!r}")
    return fmt or detect_table(path, opts.storage_options)


def _foreign_table(location: Location, module: AnyFormat) -> bool:
    """Whether a store that cannot be opened is a table with a log (Delta) trainfeed did not
    write: one read by naming its columns."""
    try:
        return module.versioned and module.parquet_files and not module.written_by_trainfeed(location)
    except ValueError:
        return False


def _check_sample_folder(location: Location) -> None:
    """A path that is no store is read as a folder of small files; say plainly when it is
    nothing at all, the data files of a store without its commit record, or Parquet that
    another tool wrote."""
    if not location.exists():
        raise TrainfeedError(f"{location.shown}: not found (no store and no folder of sample files there)")
    if not location.fs.isdir(location.path):
        if location.path.endswith(registry.TABLE_SUFFIXES):
            raise TrainfeedError(f"{location.shown}: a Parquet file that is not a trainfeed store; {FOREIGN_HINT}")
        return
    names = [n for n in location.names() if not n.startswith(("_", "."))]  # Spark's _SUCCESS, checksums
    data = [n for n in names if n.endswith(registry.DATA_SUFFIXES)]
    if data and len(data) == len(names):
        foreign = any(n.endswith(registry.TABLE_SUFFIXES) for n in data)
        raise TrainfeedError(f"{location.shown}: not a complete store: {len(data)} data files but no "
                             "_trainfeed.json manifest or Delta log (the parts of an interrupted conversion?); "
                             "convert again" + (f"; {FOREIGN_HINT}" if foreign else ""))


#: Bytes of samples the shuffle windows hold at most, whatever ``shuffle_buffer`` says: 256 of
#: MLPerf's 140 MB volumes would be 36 GB, and a first batch would wait for all of them.
SHUFFLE_BYTES = 1 << 30


def shuffle_rows(store: OpenedStore, opts: EpochOptions) -> int:
    """The rows shuffled together: ``shuffle_buffer``, at most ``SHUFFLE_BYTES`` of samples."""
    sample = store.sample_spec.sample_nbytes
    return max(1, min(opts.shuffle_buffer, SHUFFLE_BYTES // sample)) if sample else opts.shuffle_buffer


def epoch_order(store: OpenedStore, opts: EpochOptions, epoch: int = 0) -> EpochOrder:
    """The epoch's order (from row counts only; nothing is read). Several ranks without
    ``drop_last`` get the short last batch padded, so that each rank's last batch is full."""
    return EpochOrder(store.piece_rows, global_batch=opts.global_batch, lanes=opts.lane_count, seed=opts.seed,
                      epoch=epoch, shuffle=opts.shuffle, shuffle_buffer=shuffle_rows(store, opts),
                      drop_last=opts.drop_last, pad=opts.world_size > 1)


def batches_per_rank(store: OpenedStore, opts: EpochOptions) -> int:
    """Batches each rank reads in an epoch (the same on every rank; none is refused): the
    engine's order, or for a Petastorm pool the full batches of the smallest shard (its ranks
    read whole row groups and would otherwise run different numbers of steps)."""
    path = store.path
    if uses_petastorm(store, opts.pool) and opts.world_size > 1:
        if len(store.pieces) < opts.world_size:
            raise TrainfeedError(f"{path}: {len(store.pieces)} {store.piece_reader.UNIT} cannot be split across "
                                 f"{opts.world_size} ranks by a Petastorm pool; use --reader-pool arrow (the default), "
                                 "or rewrite the store with a smaller --row-group-size")
        rows = min(store.shard_rows(k, opts.world_size) for k in range(opts.world_size))
        count = rows // opts.rank_batch
    else:
        count = epoch_order(store, opts).batches
    if count < 1:
        ranks = f" ({opts.rank_batch} on each of {opts.world_size} ranks)" if opts.world_size > 1 else ""
        raise TrainfeedError(f"{path}: {store.samples} samples, fewer than one batch of {opts.global_batch}{ranks}")
    return count


def uses_petastorm(store: OpenedStore, pool: str) -> bool:
    """Whether ``pool`` reads this store through Petastorm (a Petastorm pool, Parquet or Delta files)."""
    if pool not in POOLS:
        raise UsageError(f"--reader-pool must be one of {', '.join(POOLS)}, not {pool!r}")
    if store.foreign is not None and pool != "arrow":
        raise UsageError(f"--reader-pool {pool}: a table read with --tensor-column is read by the default "
                         "pool, arrow")
    return pool in petastorm_reader.POOLS and store.format.parquet_files


def iter_batches(store: OpenedStore, opts: EpochOptions, epoch: int = 0, start_batch: int = 0,
                 empty: Callable[..., np.ndarray] | None = None) -> Iterator[Batch]:
    """This rank's batches of one epoch: its part of every global batch, in an order fixed by
    (seed, epoch) whatever the world size. ``start_batch``: batches start_batch.. of that epoch;
    the engine reads none of the pieces whose rows all fall in earlier batches. ``empty``: where
    each batch's x is allocated (``np.empty``'s form; default: recycled memory)."""
    if uses_petastorm(store, opts.pool):
        for k, (x, y, ids) in enumerate(petastorm_reader.batches(store, opts, epoch)):
            if k >= start_batch:
                yield Batch(x, y, ids)
        return
    listing, module = store.listing, store.piece_reader

    def read(i: int, handles: OpenFiles, empty: Empty) -> Columns:
        cols = module.read_piece(listing, store.pieces[i], handles, empty)
        where = module.piece_file(store.pieces[i])
        if store.images is not None:
            augment = images.Augment(opts.seed, epoch) if opts.augment else None
            return images.decode_piece(cols, store.images, where, augment, empty)
        if store.fit is not None:
            cols = fitting.fit_piece(cols, store.fit, where, empty)
        _check_samples(cols, store, where)
        return cols

    ahead = not store.local and store.foreign is None and store.format.fetches_ahead

    def upcoming(i: int) -> None:
        span = store.format.piece_span(listing, store.pieces[i])
        if span is not None and listing.fetcher is not None:
            listing.fetcher.ahead(*span)

    order = epoch_order(store, opts, epoch)
    for k, (x, y, ids, shapes) in enumerate(engine.run_epoch(
            order, opts.rank, opts.world_size, read, lambda i: module.piece_file(store.pieces[i]),
            workers=reading_threads(store, opts, fetch_ahead=ahead), start_batch=start_batch,
            upcoming=upcoming if ahead else None, ahead=pieces_ahead(store), empty=empty), start=start_batch):
        yield Batch(x, y, ids, len(ids) - order.real_rows(k, opts.rank, opts.world_size), shapes)


def _check_samples(cols: Columns, store: OpenedStore, where: str) -> None:
    """Samples of one shape and dtype, the store's (small files differ where a folder mixes them)."""
    spec = store.sample_spec
    if spec.shape is None or not len(cols.x):
        return
    shape, dtype = tuple(spec.shape), np.dtype(spec.dtype)
    if cols.x.dtype == dtype and cols.x.shape[1:] == shape:
        return
    fix = ("read them all as one dtype with --cast / cast= (a dtype, or auto), or convert with --dtype"
           if cols.x.dtype != dtype else
           "give them one shape with --fit / fit= (pad:SHAPE, crop:SHAPE or resize:SHAPE), or convert with --ragged")
    first = "first file" if store.format.in_place else "store"
    raise TrainfeedError(f"{where}: holds {cols.x.dtype} samples of shape {cols.x.shape[1:]}, where the {first} has "
                         f"{dtype} {shape}: {fix}")


def pieces_ahead(store: OpenedStore) -> int:
    """Pieces whose bytes are requested before they are decoded, so that ``io_concurrency``
    range requests stay in flight across pieces: one request per small file or row group up
    to ``fetch.MAX_REQUEST``; a larger piece is fetched as concurrent parts."""
    sample_nbytes = store.spec.sample_nbytes
    piece_bytes = sample_nbytes * store.samples / max(1, len(store.pieces)) if sample_nbytes else 0
    return math.ceil(store.options.io_concurrency / fetch.requests_for(piece_bytes))


def reading_threads(store: OpenedStore, opts: EpochOptions, fetch_ahead: bool = False) -> int:
    """Pieces decoded at once: ``workers``. On object storage a format without ahead fetching
    (HDF5, small files) reads ``pieces_ahead`` pieces at once instead, each thread waiting for
    its own requests; Parquet and Delta keep decoding to ``workers`` threads (fewer threads,
    less CPU per GB) while the fetcher keeps the requests in flight."""
    if store.local or fetch_ahead:
        return opts.workers
    return max(opts.workers, pieces_ahead(store))


# ------------------------------------------------------------------ what a store holds

def store_identity(store: OpenedStore) -> str:
    """What identifies a store's content, whatever path or URL it was opened by (checkpoints
    must match it). The id its writer gave it (for Delta, with the version read) when there
    is one; else a fingerprint of its content (see ``_fingerprint``)."""
    key: dict[str, object]
    if store.schema.store_id:
        key = {"store_id": store.schema.store_id, "version": store.version}
    else:
        key = {"fingerprint": _fingerprint(store)}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _fingerprint(store: OpenedStore) -> dict[str, object]:
    """Content only, never the path: the schema (less ``source``, a path), the rows of every
    piece, each data file's name within the store and size (blob: each file's id and size),
    every label, and the first sample (id, label, tensor bytes) of the first and of the last
    piece. Cheap: the label column and two samples are read. Sound: the same store gives the
    same answer by any path; other data differs in its labels, its counts or sizes, or its
    first or last samples (a rewrite differing in none of these is the one blind spot, and a
    store written with a store_id has none)."""
    schema = {k: v for k, v in store.schema.to_dict().items() if k != "source"}
    if store.format.in_place:  # the pieces are the files
        files = [[f.id, f.size] for f in store.pieces]
    else:
        files = [_file_entry(store, f) for f in store.listing.files]
    digest = hashlib.sha256()
    for labels in store.piece_reader.read_labels(store.listing):
        digest.update(labels.astype("<i8").tobytes())
    for index in sorted({0, len(store.pieces) - 1}):
        sample_id, label, value = _first_sample(store, index)
        digest.update(json.dumps([sample_id, label]).encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return {"schema": schema, "format": store.fmt, "version": store.version, "rows": store.piece_rows,
            "files": files, "content": digest.hexdigest()}


def _file_entry(store: OpenedStore, file: str) -> list[str | int]:
    """[name within the store ("." for a single-file store), size]."""
    if not store.local:
        return [posixpath.relpath(file, store.root), store.listing.sizes[file]]
    local = file.removeprefix("file://")
    return [os.path.relpath(os.path.abspath(local), os.path.abspath(store.path)), os.path.getsize(local)]


def _first_sample(store: OpenedStore, index: int) -> tuple[str, int, np.ndarray]:
    """The first sample of piece ``index``, read through fresh handles (not the readers')."""
    cols = store.piece_reader.read_piece(store.listing, store.pieces[index], OpenFiles())
    return cols.ids[0], int(cols.labels[0]), cols.x[0]


def _first_image(store: OpenedStore) -> tuple[str, str, bytes]:
    """(file, sample id, bytes) of the store's first encoded image."""
    if not store.pieces:
        raise TrainfeedError(f"{store.path}: the store holds no images")
    sample_id, _, value = _first_sample(store, 0)
    return store.piece_reader.piece_file(store.pieces[0]), sample_id, bytes(value)


def label_bounds(store: OpenedStore) -> tuple[int, int] | None:
    """The lowest and highest label in the store (-1 for a sample without one), reading the
    label column only; None for an empty store."""
    columns = [y for y in store.piece_reader.read_labels(store.listing) if len(y)]
    if not columns:
        return None
    return min(int(y.min()) for y in columns), max(int(y.max()) for y in columns)
