"""``trainfeed.tf_dataset``: one epoch of a store as a ``tf.data.Dataset``."""
from __future__ import annotations

from typing import TYPE_CHECKING

from trainfeed.store import Pool, Store, epoch_options, open_store
from trainfeed.training.reading.store import EpochOptions

if TYPE_CHECKING:
    import tensorflow as tf


def tf_dataset(store: Store | str, *, options: EpochOptions | None = None, batch_size: int = 32,
               shuffle: bool = True, seed: int = 0, epoch: int = 0, start_batch: int = 0, drop_last: bool = False,
               workers: int = 2, pool: Pool = "arrow", rank: int = 0, world_size: int = 1,
               global_batch_size: int | None = None, lanes: int | None = None, shuffle_buffer: int = 256,
               prefetch: int = 2, augment: bool = False) -> tf.data.Dataset:
    """(x, y) batches as ``Store.batches`` yields them (x of the stored dtype and sample shape,
    y int64; encoded images decoded, ``augment`` as there), read ahead by ``prefetch`` batches;
    a new call per epoch. ``options``: an ``EpochOptions`` instead of the keywords, as ``Store.batches``."""
    from trainfeed.training.loops.loop_tf import tf_dataset as build

    store = store if isinstance(store, Store) else open_store(store)
    opts = epoch_options(options, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         workers=workers, pool=pool, rank=rank, world_size=world_size,
                         global_batch_size=global_batch_size, lanes=lanes, shuffle_buffer=shuffle_buffer,
                         augment=augment)
    return build(store.reader, opts, epoch, start_batch=start_batch, prefetch=prefetch)
