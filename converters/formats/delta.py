"""Delta Lake store through delta-rs: the Parquet layout, committed atomically by the Delta log.

Tensor-field specs live in the table schema's field metadata (Delta keeps it); each commit
carries trainfeed's mark and the whole dataset schema (delta_log.py, which also lists a
version's row groups); delta_writer.py writes, restores, compacts and vacuums. ``DELTA`` is the
registry's delta format: a ``VersionedFormat`` whose methods are those modules' functions, and
whose read side is Parquet's (its files are Parquet).
"""
from __future__ import annotations

from trainfeed.converters.formats.delta_log import (
    FORMAT,
    LOG,
    data_files,
    is_store,
    latest_version,
    list_pieces,
    live_ids,
    marked_commit,
    open_table,
    read_samples,
    read_schema,
    tensor_column,
    user_metadata,
    written_by_trainfeed,
)
from trainfeed.converters.formats.delta_writer import (
    create_table,
    describe_part,
    optimize,
    restore,
    table_result,
    vacuum,
    write,
)
from trainfeed.converters.formats.interface import VersionedFormat
from trainfeed.converters.formats.parquet import RowGroup, RowGroupPieces, RowGroups

# A Delta table's files are Parquet: its codecs and its read side are Parquet's.
from trainfeed.converters.formats.parquet_writer import COMPRESSION_LEVELS, COMPRESSIONS, DEFAULT_COMPRESSION
from trainfeed.converters.storage.location import check_delta_url

#: What callers and tests reach through this module (the log's and the writer's functions).
__all__ = ["DELTA", "FORMAT", "LOG", "Delta", "create_table", "data_files", "describe_part", "is_store",
           "list_pieces", "live_ids", "marked_commit", "open_table", "optimize", "read_samples", "read_schema",
           "restore", "table_result", "tensor_column", "user_metadata", "vacuum", "write", "written_by_trainfeed"]


class Delta(RowGroups, VersionedFormat[RowGroup, RowGroupPieces]):
    """Delta tables (formats/interface.py says what each member is for)."""

    name, label, noun, foreign_noun = FORMAT, "Delta Lake", "a Delta table", "a Delta table"
    writable, versioned, parquet_files, fetches_ahead = True, True, True, True
    COMPRESSIONS, DEFAULT_COMPRESSION, COMPRESSION_LEVELS = COMPRESSIONS, DEFAULT_COMPRESSION, COMPRESSION_LEVELS
    suffixes, commit_record = (".parquet",), LOG
    part_names = run_part_names = r"part-\d{5}-[0-9a-f]{12}-c000\.parquet"  # its own run id: see delta_writer.write

    is_store = staticmethod(is_store)
    written_by_trainfeed = staticmethod(written_by_trainfeed)
    check_url = staticmethod(check_delta_url)
    write = staticmethod(write)
    read_schema = staticmethod(read_schema)
    read_samples = staticmethod(read_samples)
    data_files = staticmethod(data_files)
    list_pieces = staticmethod(list_pieces)
    # what a versioned format adds
    version = staticmethod(latest_version)
    tensor_column = staticmethod(tensor_column)
    restore = staticmethod(restore)
    live_ids = staticmethod(live_ids)
    optimize = staticmethod(optimize)
    vacuum = staticmethod(vacuum)
    table_result = staticmethod(table_result)
    create_table = staticmethod(create_table)
    user_metadata = staticmethod(user_metadata)
    marked_commit = staticmethod(marked_commit)


DELTA = Delta()
