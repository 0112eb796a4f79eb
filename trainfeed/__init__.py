"""trainfeed: repack small-file training datasets into compacted stores, train from any
layout, and measure what storage does to training.

The Python API::

    result = trainfeed.convert("data/volumes", "volumes.parquet", format="parquet", labels="data/volumes/labels.csv")
    store = trainfeed.open_store("volumes.parquet")
    for batch in store.batches(batch_size=32, seed=0, epoch=0): ...
    loader = DataLoader(trainfeed.TorchDataset(store, batch_size=32), batch_size=None, num_workers=2)
    trainfeed.tf_dataset(store, batch_size=32)                    # a tf.data.Dataset
    trainfeed.train(trainfeed.TrainConfig(data="volumes.parquet"))  # the `train` CLI's run

The command-line tools (``convert``, ``train``, ``storage-bench``) are thin wrappers over
the subpackages ``trainfeed.converters``, ``trainfeed.training`` and ``trainfeed.benchmarks``;
``trainfeed.pipelines`` holds the Spark / Databricks jobs.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainfeed.converters import __version__

if TYPE_CHECKING:
    from trainfeed.conversion import ConvertResult, convert
    from trainfeed.converters.errors import TrainfeedError, UsageError
    from trainfeed.converters.formats.foreign import ForeignSchema
    from trainfeed.converters.formats.options import OpenOptions
    from trainfeed.store import Store, open_store
    from trainfeed.tf_data import tf_dataset
    from trainfeed.torch_data import TorchDataset
    from trainfeed.trainer import TrainResult, train
    from trainfeed.training.config import TrainConfig
    from trainfeed.training.reading.store import Batch, EpochOptions

#: Where each name of the API lives. Imported on first use: ``import trainfeed.converters``
#: (every CLI) stays light, and only TorchDataset imports torch.
_API = {
    "convert": ".conversion", "ConvertResult": ".conversion", "open_store": ".store", "Store": ".store",
    "Batch": "trainfeed.training.reading.store", "TorchDataset": ".torch_data", "tf_dataset": ".tf_data",
    "train": ".trainer", "TrainConfig": "trainfeed.training.config", "TrainResult": ".trainer",
    "TrainfeedError": "trainfeed.converters.errors", "UsageError": "trainfeed.converters.errors",
    "ForeignSchema": "trainfeed.converters.formats.foreign", "OpenOptions": "trainfeed.converters.formats.options",
    "EpochOptions": "trainfeed.training.reading.store",
}

__all__ = [
    "Batch",
    "ConvertResult",
    "EpochOptions",
    "ForeignSchema",
    "OpenOptions",
    "Store",
    "TorchDataset",
    "TrainConfig",
    "TrainResult",
    "TrainfeedError",
    "UsageError",
    "__version__",
    "convert",
    "open_store",
    "tf_dataset",
    "train",
]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'trainfeed' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
