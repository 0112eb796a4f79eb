"""``trainfeed.open_store``: any layout (Parquet, Delta, HDF5, or the original small files) as
one ``Store`` whose ``batches()`` are one epoch of numpy batches."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal

from trainfeed.converters.formats.foreign import foreign_schema
from trainfeed.converters.formats.options import OpenOptions, merge_options
from trainfeed.converters.sources.labels import parse_classes
from trainfeed.converters.storage.clouds import StorageOptions
from trainfeed.training.reading import readers
from trainfeed.training.reading.store import Batch, EpochOptions, OpenedStore

FormatName = Literal["parquet", "delta", "hdf5", "blob"]
Encoding = Literal["auto", "npy", "raw", "list"]
Pool = Literal["arrow", "sharded", "process", "thread", "dummy"]


class Store:
    """An opened store. ``store.reader`` is the read engine's view of it (pieces, schema)."""

    def __init__(self, reader: OpenedStore) -> None:
        self.reader = reader

    @property
    def uri(self) -> str:
        return self.reader.path

    @property
    def format(self) -> str:
        return self.reader.fmt

    @property
    def version(self) -> int | None:
        """The Delta table version read (None for other formats)."""
        return self.reader.version

    @property
    def samples(self) -> int:
        return self.reader.samples

    @property
    def field(self) -> str:
        """The tensor field ``batches()`` delivers as ``x``."""
        return self.reader.spec.name

    @property
    def shape(self) -> tuple[int, ...] | None:
        """One sample's shape as ``batches()`` delivers it (encoded images: decoded, (H, W, C);
        arrays: the ``fit``'s shape when one is given; None for a ragged store without one)."""
        spec = self.reader.sample_spec
        return None if spec.shape is None else tuple(spec.shape)

    @property
    def dtype(self) -> str:
        return self.reader.sample_spec.dtype

    @property
    def label_map(self) -> dict[str, int] | None:
        """Class name -> label, when the labels were class names."""
        return self.reader.schema.label_map

    @property
    def open_options(self) -> OpenOptions:
        """What it was opened with: version, field, labels, storage options, cache, image size."""
        return self.reader.options

    def batches(self, batch_size: int = 32, *, options: EpochOptions | None = None, epoch: int = 0,
                start_batch: int = 0, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                workers: int = 2, pool: Pool = "arrow", shuffle_buffer: int = 256, rank: int = 0,
                world_size: int = 1, global_batch_size: int | None = None, lanes: int | None = None,
                augment: bool = False) -> Iterator[Batch]:
        """One epoch of ``Batch(x, y, ids, padding, shapes)`` in an order fixed by ``seed`` and ``epoch``,
        from batch ``start_batch`` on (earlier batches are not read). ``rank`` of ``world_size``:
        this reader's part of each global batch of ``global_batch_size`` (default ``batch_size`` x
        ``world_size``); the samples of global batch k do not depend on the world size, and every
        rank gets the same number of batches (README, "Many GPUs"). ``drop_last`` drops the short
        tail; without it, several ranks get the last batch filled with the epoch's first samples
        again (``Batch.padding`` counts them). Encoded images are decoded; ``augment`` gives them a
        random resized crop and flip (from seed, epoch, id). ``options``: an ``EpochOptions``
        holding these settings instead of the keywords (a keyword that differs from it is refused)."""
        opts = epoch_options(options, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                             workers=workers, pool=pool, shuffle_buffer=shuffle_buffer, rank=rank,
                             world_size=world_size, global_batch_size=global_batch_size, lanes=lanes,
                             augment=augment)
        readers.batches_per_rank(self.reader, opts)  # a store that cannot give every rank a batch is refused
        return readers.iter_batches(self.reader, opts, epoch, start_batch=start_batch)

    def __repr__(self) -> str:
        return f"Store({self.uri!r}, format={self.format!r}, samples={self.samples}, field={self.field!r})"


def epoch_options(options: EpochOptions | None, **keywords: Any) -> EpochOptions:
    """The one ``EpochOptions`` of an API call: ``options`` or the keywords (see ``merge_options``)."""
    return merge_options(EpochOptions, options, keywords)


def open_store(uri: str, *, options: OpenOptions | None = None, version: int | None = None,
               storage_options: StorageOptions | None = None, format: FormatName | None = None,
               field: str | None = None, labels: str | None = None, classes: Sequence[str] | None = None,
               cast: str | None = None,
               io_concurrency: int = 8, cache_dir: str | None = None, cache_limit: int = 10 * 10**9,
               image_size: tuple[int, int] | None = None, fit: str | None = None, tensor_column: str | None = None,
               shape: str | tuple[int, ...] | None = None, dtype: str | None = None, label_column: str | None = None,
               id_column: str | None = None, tensor_encoding: Encoding | None = None) -> Store:
    """Open the store at ``uri`` (a local path or a URL: abfs://, az://, abfss://, s3://, gs://):
    its format detected unless given, a Delta table at ``version`` (default: the latest), the
    tensor ``field`` (default: the first); ``labels`` is a CSV (id,label) for a folder of small
    files (``classes``: their class names in label order, else sorted; ``cast``: a dtype their arrays
    are read as where no value changes, or "auto", the smallest that holds every .npy file's,
    found in their headers when the folder is opened). On object storage,
    ``io_concurrency`` range requests are in flight, and ``cache_dir``
    (at most ``cache_limit`` bytes) keeps what is read for later epochs. Encoded images are
    decoded to ``image_size`` (height, width; default: the store's size). Arrays of different
    shapes (a store converted with ``ragged=True``, or a folder of small files that mixes shapes)
    are batched as ``fit`` says: ``"pad:SHAPE"``, ``"crop:SHAPE"`` or ``"resize:SHAPE"`` (e.g.
    ``"pad:64x64"``; ``Batch.shapes`` holds each sample's own shape); without one, a ragged store's
    ``Batch.x`` is an object array holding each sample in its own shape.

    A Parquet or Delta table another tool wrote is read when ``tensor_column`` names its tensor
    column: ``shape`` (a tuple or "30x30x10x10") and ``dtype`` (default float32) of one sample,
    ``label_column`` (default "label", integers), ``id_column`` (default: ids ``row-<n>``, the
    row's position in the table) and ``tensor_encoding`` (auto, npy, raw or list; see the README,
    "Train from your own table"). ``options``: an ``OpenOptions`` holding these settings instead of
    the keywords (``format`` stays a keyword; a keyword that differs from it is refused). Raises
    ``TrainfeedError`` naming the problem (``UsageError`` for options that do not fit together)."""
    opts = merge_options(OpenOptions, options, dict(
        version=version, field=field, labels=labels, classes=parse_classes(classes), cast=cast,
        storage_options=dict(storage_options or {}),
        io_concurrency=io_concurrency, cache_dir=cache_dir, cache_limit=cache_limit, image_size=image_size, fit=fit,
        foreign=foreign_schema(tensor_column, shape, dtype, label_column, id_column, tensor_encoding)))
    return Store(readers.open_store(uri, format, opts))
