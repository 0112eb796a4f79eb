"""What every reader shares: the options an epoch is read with, the opened ``Store`` (what it
holds, the pieces an epoch is made of, the ``OpenOptions`` it was opened with) and the ``Batch``
readers deliver."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainfeed.converters.formats import foreign_table
from trainfeed.converters.formats.foreign import ForeignSchema
from trainfeed.converters.formats.interface import Format, PieceReader
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import FORMATS as REGISTRY
from trainfeed.converters.layout import DatasetSchema, FieldSpec
from trainfeed.training.reading import images


@dataclass(frozen=True)
class EpochOptions:
    """What reading one epoch of an opened store needs (``Store.batches``, ``TorchDataset``,
    ``tf_dataset``, ``train``). Frozen and picklable: DataLoader worker processes receive it."""

    batch_size: int = 32  # samples per batch
    shuffle: bool = True  # a seeded order per epoch; False: the store's order
    seed: int = 0  # with the epoch, fixes the order (and the augmentation)
    shuffle_buffer: int = 256  # rows per shuffle window (at least)
    drop_last: bool = False  # drop a last batch smaller than batch_size
    workers: int = 2  # threads reading (and decoding) pieces
    pool: str = "arrow"  # arrow: trainfeed's engine; sharded | process | thread | dummy: Petastorm (Parquet/Delta)
    shard: int = 0  # read shard ``shard`` of ``num_shards`` (whole pieces: index % num_shards == shard)
    num_shards: int = 1
    augment: bool = False  # encoded images: a random resized crop and flip, from (seed, epoch, sample id)


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
    local: bool = True  # False: on object storage (read through range requests)
    images: images.Decoding | None = None  # encoded images: how they are decoded
    options: OpenOptions = field(default_factory=OpenOptions)  # what it was opened with

    @property
    def foreign(self) -> ForeignSchema | None:
        """A table another tool wrote, read as ``options.foreign`` says (None: a trainfeed store or small files)."""
        return self.options.foreign

    @property
    def sample_spec(self) -> FieldSpec:
        """The field as batches deliver it (encoded images: decoded, of a fixed shape)."""
        return self.spec if self.images is None else self.images.spec(self.spec.name)

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
        return [i for i in range(len(self.pieces)) if i % num_shards == shard]

    def shard_rows(self, shard: int, num_shards: int) -> int:
        return sum(self.piece_rows[i] for i in self.shard_pieces(shard, num_shards))
