"""What every reader shares: the options an epoch is read with, the ``OpenedStore`` (its format's
listing of the pieces an epoch is made of, how its samples are decoded, the ``OpenOptions`` it
was opened with) and the ``Batch`` readers deliver."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats import foreign_table
from trainfeed.converters.formats.foreign import ForeignSchema
from trainfeed.converters.formats.interface import PieceReader, Pieces
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import FORMATS, AnyFormat
from trainfeed.converters.layout import DatasetSchema, FieldSpec
from trainfeed.converters.option_docs import option
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

    batch_size: int = option(32, help="Samples per batch (per step) of each rank (process).")
    shuffle: bool = option(True, flag="shuffle/--no-shuffle", help="A seeded order per epoch; off: the lanes read "
                           "the store in order.")
    seed: int = option(0, help="With the epoch, fixes the order (and the augmentation); 0 to 2^32-1.")
    shuffle_buffer: int = option(256, help="Samples shuffled together (at least; held in memory, shared among the "
                                 "lanes; at most 1 GB of samples).")
    drop_last: bool = option(False, flag="drop-last/--keep-last", help="Drop the epoch's short tail (fewer samples "
                             "than a global batch); kept, several ranks get its last batch filled with the epoch's "
                             "first samples.")
    workers: int = option(2, help="Reader threads reading and decoding pieces (or, with a Petastorm reader pool, "
                          "Petastorm's workers).")
    pool: str = option("arrow", flag="reader-pool", help="arrow: trainfeed's own engine (default); sharded, process, "
                       "thread, dummy: Petastorm's (Parquet and Delta), needs trainfeed[petastorm].")
    rank: int = option(0, help="This reader's part of each global batch: rank RANK of WORLD_SIZE.")
    world_size: int = option(1, help="Ranks reading the epoch together.")
    global_batch_size: int | None = option(None, help="Samples per step on all ranks together, shared evenly (each "
                                           "rank: this / world size). Default: the batch size x world size. Resuming "
                                           "on another number of ranks needs the same global batch.")
    lanes: int | None = option(None, help="How an epoch is dealt among ranks: it must divide the global batch; with "
                               "a world size that divides it, each rank reads only its own lanes' pieces. Default: "
                               "the largest divisor of the global batch up to 8. A resume keeps it.")
    augment: bool = option(False, flag="augment/--no-augment", help="Encoded images: random resized crop (25-100% "
                           "of the area, aspect 3/4 to 4/3) and horizontal flip of every image, drawn from (seed, "
                           "epoch, sample id), so any number of workers gives the same batches. Stores of decoded "
                           "pixels are delivered as stored.")

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
class OpenedStore:
    """An opened store: its format's listing of the pieces one epoch is made of, and how its
    samples are delivered."""

    path: str
    fmt: str
    listing: Pieces[Any]  # the format's own (formats/interface.py), typed by its module
    root: str  # the store's path on its storage (object storage: without the scheme)
    local: bool = True  # False: on object storage (read through range requests)
    images: images.Decoding | None = None  # encoded images: how they are decoded
    fit: Fit | None = None  # arrays: how samples are given one shape (OpenOptions.fit)
    options: OpenOptions = field(default_factory=OpenOptions)  # what it was opened with

    @property
    def schema(self) -> DatasetSchema:
        return self.listing.schema

    @property
    def spec(self) -> FieldSpec:
        """The tensor field read, as the store holds it."""
        return self.listing.spec

    @property
    def pieces(self) -> list[Any]:
        """The format's units of reading, in a stable order."""
        return self.listing.pieces

    @property
    def piece_rows(self) -> list[int]:
        return self.listing.rows

    @property
    def version(self) -> int | None:
        """The version read, for a versioned format (None for the others)."""
        return self.listing.version

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
        return self.listing.samples

    @property
    def format(self) -> AnyFormat:
        """The store's format in the registry (a table another tool wrote: Parquet or Delta)."""
        return FORMATS[self.fmt]

    @property
    def piece_reader(self) -> PieceReader[Any, Any]:
        """What reads its pieces: the format, or the reader of a table another tool wrote."""
        return foreign_table.READER if self.foreign else FORMATS[self.fmt]

    def shard_pieces(self, shard: int, num_shards: int) -> list[int]:
        """Petastorm's sharding (whole pieces, ``index % num_shards == shard``): its pools only."""
        return [i for i in range(len(self.pieces)) if i % num_shards == shard]

    def shard_rows(self, shard: int, num_shards: int) -> int:
        return sum(self.piece_rows[i] for i in self.shard_pieces(shard, num_shards))
