"""trainfeed: repack small-file training datasets into compacted stores, train from any
layout, and measure what storage does to training.

The command-line tools (``convert``, ``train``, ``storage-bench``) are thin wrappers over
the subpackages ``trainfeed.converters``, ``trainfeed.training`` and ``trainfeed.benchmarks``;
``trainfeed.pipelines`` holds the Spark / Databricks jobs.
"""
from trainfeed.converters import __version__

__all__ = ["__version__"]
