"""What every reader shares: the options an epoch is read with, the opened ``Store`` (what it
holds, the pieces an epoch is made of, the ``OpenOptions`` it was opened with) and the ``Batch``
readers deliver."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats import foreign_table
from trainfeed.converters.formats.foreign import ForeignSchema
from trainfeed.converters.formats.interface import Format, PieceReader
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import FORMATS as REGISTRY
from trainfeed.converters.layout import DatasetSchema, FieldSpec
from trainfeed.training.reading import images
from trainfeed.training.reading.fitting import Fit
from trainfeed.training.reading.order import check_batching, check_world, default_lanes


@dataclass(frozen=True)
class EpochOptions:
    """What reading one epoch of an opened store needs (``Store.batches``, ``TorchDataset``,
    ``tf_dataset``, ``train``). Frozen and picklable: DataLoader worker processes receive it.

    The epoch's order depends on the store, ``seed``, the epoch, ``shuffle``, ``shuffle_buffer``,
    ``drop_last``, the global batch size and ``lanes`` (training/reading/order.py), never on
    ``rank``, ``world_size`` or the reader's threads and processes."""

    batch_size: int = 32  # samples per batch of this rank
    shuffle: bool = True  # a seeded order per epoch; False: the lanes read the store in order
    seed: int = 0  # with the epoch, fixes the order (and the augmentation)
    shuffle_buffer: int = 256  # rows shuffled together, at least (shared among the lanes; at most 1 GB of samples)
    drop_last: bool = False  # drop the short tail (fewer rows than a global batch)
    workers: int = 2  # threads reading (and decoding) pieces
    pool: str = "arrow"  # arrow: trainfeed's engine; sharded | process | thread | dummy: Petastorm (Parquet/Delta)
    rank: int = 0  # this reader's part of each global batch: rank ``rank`` of ``world_size``
    world_size: int = 1
    global_batch_size: int | None = None  # samples per global batch, all ranks; None: batch_size x world_size
    lanes: int | None = None  # how the epoch is dealt (order.py); None: the largest divisor of the global batch <= 8
    augment: bool = False  # encoded images: a random resized crop and flip, from (seed, epoch, sample id)

    def __post_init__(self) -> None:
        for name in ("batch_size", "shuffle_buffer", "workers", "world_size"):
            _check_int(name, getattr(self, name), 1)
        _check_int("rank", self.rank, 0)
        if self.global_batch_size is not None:
            _check_int("global_batch_size", self.global_batch_size, 1)
            if self.batch_size != 32 and self.batch_size * self.world_size != self.global_batch_size:
                raise UsageError(f"batch_size={self.batch_size} x world_size={self.world_size} is not "
                                 f"global_batch_size={self.global_batch_size}: give one of them")
        if self.lanes is not None:
            _check_int("lanes", self.lanes, 1)
        check_world(self.global_batch, self.rank, self.world_size)
        check_batching(self.global_batch, self.lane_count)

    @property
    def global_batch(self) -> int:
        """Samples per global batch: what a resume on another world size must keep."""
        return self.global_batch_size if self.global_batch_size is not None else self.batch_size * self.world_size

    @property
    def rank_batch(self) -> int:
        """Samples per batch of this rank."""
        return self.global_batch // self.world_size

    @property
    def lane_count(self) -> int:
        return self.lanes if self.lanes is not None else default_lanes(self.global_batch)


def _check_int(name: str, value: object, least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise UsageError(f"{name} must be an integer, at least {least}, not {value!r}")


@dataclass
class Batch:
    x: np.ndarray  # (B, *shape)
    y: np.ndarray  # (B,) int64; -1 where unlabeled
    ids: list[str]
    padding: int = 0  # the last rows that repeat the epoch's first samples (several ranks, no drop_last)
    shapes: np.ndarray | None = None  # (B, ndim): each sample's own shape, when a fit gave them one

    @property
    def nbytes(self) -> int:
        if self.x.dtype == object:  # a ragged field not fitted: each sample its own array
            return sum(int(v.nbytes) for v in self.x)
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
    local: bool = True  # False: on object storage (read through range requests)
    images: images.Decoding | None = None  # encoded images: how they are decoded
    fit: Fit | None = None  # arrays: how samples are given one shape (OpenOptions.fit)
    options: OpenOptions = field(default_factory=OpenOptions)  # what it was opened with

    @property
    def foreign(self) -> ForeignSchema | None:
        """A table another tool wrote, read as ``options.foreign`` says (None: a trainfeed store or small files)."""
        return self.options.foreign

    @property
    def sample_spec(self) -> FieldSpec:
        """The field as batches deliver it (encoded images: decoded, of a fixed shape; arrays:
        fitted to one, when a fit is given; a ragged field not fitted: shape None)."""
        if self.images is not None:
            return self.images.spec(self.spec.name)
        return self.spec if self.fit is None else self.fit.spec(self.spec)

    @property
    def samples(self) -> int:
        return sum(self.piece_rows)

    @property
    def format(self) -> Format:
        """The store's format in the registry (a table another tool wrote: Parquet or Delta)."""
        return REGISTRY[self.fmt]

    @property
    def module(self) -> PieceReader:
        """What reads its pieces: the format, or the reader of a table another tool wrote."""
        return foreign_table.READER if self.foreign else REGISTRY[self.fmt]

    def shard_pieces(self, shard: int, num_shards: int) -> list[int]:
        """Petastorm's sharding (whole pieces, ``index % num_shards == shard``): its pools only."""
        return [i for i in range(len(self.pieces)) if i % num_shards == shard]

    def shard_rows(self, shard: int, num_shards: int) -> int:
        return sum(self.piece_rows[i] for i in self.shard_pieces(shard, num_shards))
