"""What every reader shares: the options a store is read with, the opened ``Store`` (what it
holds, the pieces an epoch is made of) and the ``Batch`` readers deliver."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainfeed.converters.formats import foreign_table
from trainfeed.converters.formats.foreign import ForeignSchema
from trainfeed.converters.formats.interface import Format, PieceReader
from trainfeed.converters.layout import DatasetSchema, FieldSpec
from trainfeed.converters.formats.registry import FORMATS as REGISTRY
from trainfeed.converters.storage import fetch
from trainfeed.training.reading import images


@dataclass(frozen=True)
class ReaderOptions:
    batch_size: int = 32
    workers: int = 2
    shuffle: bool = True
    seed: int = 0
    shuffle_buffer: int = 256  # rows per shuffle window (at least)
    pool: str = "arrow"  # arrow: trainfeed's engine; sharded | process | thread | dummy: Petastorm (Parquet/Delta)
    shard: int = 0
    num_shards: int = 1
    delta_version: int | None = None
    field_name: str | None = None  # tensor field to train on; default: the first one
    labels_csv: str | None = None  # blob stores: labels as convert takes them
    storage_options: dict = field(default_factory=dict)
    drop_last: bool = True
    # stores on object storage: range requests in flight, and an optional local disk cache
    io_concurrency: int = fetch.DEFAULT_IO_CONCURRENCY
    cache_dir: str | None = None
    cache_limit: int = 10 * 10**9
    # encoded images: the size (H, W) they are decoded to (default: the store's), and training augmentation
    image_size: tuple[int, int] | None = None
    augment: bool = False
    # a table another tool wrote: its columns and tensor encoding (None: a trainfeed store or small files)
    foreign: ForeignSchema | None = None


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
    foreign: ForeignSchema | None = None  # a table another tool wrote, read as these options say

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
