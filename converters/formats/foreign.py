"""A table another tool wrote (Spark, pandas, DuckDB): which columns hold the tensor, the label
and the id, and how the tensor is encoded; its validation against the table's Arrow schema, and
the decoding of its columns into the arrays trainfeed's engine reads.

Tensor encodings (``--tensor-encoding``):

- ``npy``: each value is a whole ``.npy`` file; its header is parsed by numpy's header parser
  (a Python literal, never unpickled) and must give the declared dtype and shape;
- ``raw``: each value is the tensor's bytes, C order, little-endian, exactly shape x dtype long;
- ``list``: an Arrow list, large_list or fixed_size_list of numbers of the declared dtype,
  shape-many per row, reshaped to the shape;
- ``auto``: ``list`` for list columns; for binary columns ``npy`` when the first value starts
  with the ``.npy`` magic, else ``raw``.
"""
from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.layout import LABEL, SUPPORTED_DTYPES, DatasetSchema, FieldSpec
from trainfeed.converters.option_docs import option

ENCODINGS = ("auto", "npy", "raw", "list")
NPY_MAGIC = b"\x93NUMPY"
#: Said wherever a table that is not trainfeed's is refused.
HINT = ("a table another tool wrote is read by naming its columns: --tensor-column COLUMN --shape AxBx... "
        "[--dtype float32] [--label-column label] [--id-column COLUMN] (README: 'Train from your own table')")


@dataclass(frozen=True)
class ForeignSchema:
    """How to read a table trainfeed did not write. Checked when built (UsageError)."""

    tensor_column: str = option(help="The data is a Parquet folder or file or a Delta table another tool (Spark) "
                                "wrote: the column holding each sample's tensor (.npy bytes, raw bytes or a list of "
                                "numbers; see the tensor encoding). Needs the shape.")
    shape: tuple[int, ...] = option(help="With a tensor column: one sample's shape, e.g. 30x30x10x10.")
    dtype: str = option("float32", help="With a tensor column: the tensor's dtype (default float32).")
    label_column: str = option(LABEL, help="With a tensor column: the integer label column (default: label).")
    id_column: str | None = option(None, help="With a tensor column: a column of sample ids (any type, shown as "
                                   "text). Default: row-N, the row's position in the table (files in name order; "
                                   "Delta: the log's order).")
    encoding: str = option("auto", flag="tensor-encoding", help="With a tensor column: npy (each value a whole .npy "
                           "file), raw (little-endian bytes of the shape x the dtype), list (an array of numbers), "
                           "or auto (default: list for list columns, else npy when the first value starts with the "
                           ".npy magic, else raw).")

    def __post_init__(self) -> None:
        if not self.tensor_column:
            raise UsageError("--tensor-column must name a column")
        if not self.shape or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in self.shape):
            raise UsageError(f"--shape must be one or more positive sizes, e.g. 30x30x10x10, not {self.shape!r}")
        if self.dtype not in SUPPORTED_DTYPES:
            raise UsageError(f"--dtype {self.dtype!r} is not supported (choose from {', '.join(SUPPORTED_DTYPES)})")
        if self.encoding not in ENCODINGS:
            raise UsageError(f"--tensor-encoding must be one of {', '.join(ENCODINGS)}, not {self.encoding!r}")
        if not self.label_column or self.id_column == "":
            raise UsageError("--label-column and --id-column must name a column")
        named = [self.tensor_column, self.label_column, *([self.id_column] if self.id_column else [])]
        if len(set(named)) < len(named):
            raise UsageError(f"--tensor-column, --label-column and --id-column must name different columns, "
                             f"not {', '.join(map(repr, named))}")

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def columns(self) -> list[str]:
        """The columns read."""
        return [self.tensor_column, self.label_column, *([self.id_column] if self.id_column else [])]

    def dataset_schema(self, source: str) -> DatasetSchema:
        """What the engine sees: one raw tensor field, labeled; ``extra`` records these options
        (a checkpoint's data identity includes them)."""
        return DatasetSchema([FieldSpec(self.tensor_column, self.dtype, self.shape)], labeled=True, source=source,
                             extra={"foreign": asdict(self)})


def parse_shape(text: str) -> tuple[int, ...]:
    """'30x30x10x10' -> (30, 30, 10, 10)."""
    if not re.fullmatch(r"\s*\d+(\s*[xX,]\s*\d+)*\s*", text or ""):
        raise UsageError(f"--shape: cannot parse {text!r}; give the sizes of one sample, e.g. 30x30x10x10")
    return tuple(int(n) for n in re.split(r"[xX,]", text))


def foreign_schema(tensor_column: str | None, shape: str | tuple[int, ...] | None = None, dtype: str | None = None,
                   label_column: str | None = None, id_column: str | None = None,
                   encoding: str | None = None) -> ForeignSchema | None:
    """The options as given (None: not given) -> a ForeignSchema, or None without a tensor column.
    The others need one, and ``shape`` is required with it."""
    if tensor_column is None:
        given = [name for name, value in (("--shape", shape), ("--dtype", dtype), ("--label-column", label_column),
                                          ("--id-column", id_column), ("--tensor-encoding", encoding))
                 if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} describe a table another tool wrote: they need --tensor-column")
        return None
    if shape is None:
        raise UsageError("--tensor-column needs --shape, the shape of one sample (e.g. 30x30x10x10)")
    return ForeignSchema(tensor_column, parse_shape(shape) if isinstance(shape, str) else tuple(shape),
                         dtype or "float32", label_column or LABEL, id_column, encoding or "auto")


# ---------------------------------------------------------------- validation against the table

def check_columns(foreign: ForeignSchema, arrow: pa.Schema, where: str) -> None:
    """The named columns exist and have types these options can read; TrainfeedError naming
    ``where`` (the table or file) and the column otherwise."""
    for name in foreign.columns:
        if name not in arrow.names:
            raise TrainfeedError(f"{where}: no column {name!r} (columns: {', '.join(arrow.names)})")
    label = arrow.field(foreign.label_column).type
    if not pa.types.is_integer(label):
        raise TrainfeedError(f"{where}: label column {foreign.label_column!r} is {label}, not integers "
                             "(train takes class indices 0, 1, ...)")
    _check_tensor_type(foreign, arrow.field(foreign.tensor_column).type, where)


def _check_tensor_type(foreign: ForeignSchema, kind: pa.DataType, where: str) -> None:
    column = f"tensor column {foreign.tensor_column!r}"
    if _is_binary(kind):
        if foreign.encoding == "list":
            raise TrainfeedError(f"{where}: {column} is {kind}; --tensor-encoding list takes a list column")
        if pa.types.is_fixed_size_binary(kind) and foreign.encoding == "raw" and kind.byte_width != foreign.nbytes:
            raise TrainfeedError(f"{where}: {column} holds {kind.byte_width} bytes per row; --shape "
                                 f"{_shape(foreign)} of {foreign.dtype} is {foreign.nbytes} bytes")
        return
    if not _is_list(kind):
        raise TrainfeedError(f"{where}: {column} is {kind}: a tensor column holds binary (.npy or raw bytes) or a "
                             "list of numbers")
    if foreign.encoding in ("npy", "raw"):
        raise TrainfeedError(f"{where}: {column} is {kind}; --tensor-encoding {foreign.encoding} takes a binary "
                             "column")
    expected = pa.from_numpy_dtype(np.dtype(foreign.dtype))
    if kind.value_type != expected:
        hint = f"; pass --dtype {kind.value_type.to_pandas_dtype().__name__}" \
            if pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type) else ""
        raise TrainfeedError(f"{where}: {column} holds {kind.value_type} values, not {expected} (--dtype "
                             f"{foreign.dtype}){hint}")
    if pa.types.is_fixed_size_list(kind) and kind.list_size != foreign.size:
        raise TrainfeedError(f"{where}: {column} holds {kind.list_size} numbers per row; --shape {_shape(foreign)} "
                             f"is {foreign.size}")


def resolve_encoding(foreign: ForeignSchema, column: pa.Array) -> str:
    """The encoding to read ``column`` with: the one given, or (auto) what its type and its first
    value say."""
    if foreign.encoding != "auto":
        return foreign.encoding
    if _is_list(column.type):
        return "list"
    first = column[0].as_py() if len(column) and column[0].is_valid else b""
    return "npy" if first.startswith(NPY_MAGIC) else "raw"


def _is_binary(kind: pa.DataType) -> bool:
    return bool(pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind))


def _is_list(kind: pa.DataType) -> bool:
    return bool(pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind))


def _shape(foreign: ForeignSchema) -> str:
    return "x".join(map(str, foreign.shape))


# ---------------------------------------------------------------- decoding

def decode_tensors(foreign: ForeignSchema, encoding: str, column: pa.Array | pa.ChunkedArray, where: str,
                   empty: Callable[..., np.ndarray] = np.empty) -> np.ndarray:
    """A tensor column -> (n, *shape) array of the declared dtype; TrainfeedError naming ``where``,
    the column and the row for a value that does not fit. ``empty``: where new arrays come from."""
    col = _one_chunk(column)
    if col.null_count:
        raise TrainfeedError(f"{where}: tensor column {foreign.tensor_column!r} has {col.null_count} null values "
                             f"(the first in row {_first_null(col)})")
    if encoding == "list":
        return _decode_list(foreign, col, where)
    offsets, data = _binary_values(col)
    if encoding == "raw":
        return _decode_raw(foreign, offsets, data, where)
    return _decode_npy(foreign, offsets, data, where, empty)


def _one_chunk(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def _first_null(col: pa.Array) -> int:
    return int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])


def _binary_values(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets of n + 1 values into ``data``, data as uint8) of a binary-typed array, no copy."""
    n = len(col)
    if pa.types.is_fixed_size_binary(col.type):
        width = col.type.byte_width
        offsets = (np.arange(n + 1, dtype=np.int64) + col.offset) * width
        data_buffer = col.buffers()[1]
    else:
        index = np.int64 if pa.types.is_large_binary(col.type) else np.int32
        offsets = np.frombuffer(col.buffers()[1], index, n + 1, col.offset * np.dtype(index).itemsize).astype(np.int64)
        data_buffer = col.buffers()[2]
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    return offsets, data


def _decode_raw(foreign: ForeignSchema, offsets: np.ndarray, data: np.ndarray, where: str) -> np.ndarray:
    lengths = np.diff(offsets)
    bad = np.flatnonzero(lengths != foreign.nbytes)
    if len(bad):
        raise TrainfeedError(f"{where}: tensor column {foreign.tensor_column!r}, row {int(bad[0])}: "
                             f"{int(lengths[bad[0]])} bytes, but --shape {_shape(foreign)} of {foreign.dtype} is "
                             f"{foreign.nbytes} bytes")
    # equal lengths: the values are adjacent, so the data buffer is the stacked tensors (a view)
    values = data[offsets[0]:offsets[-1]]
    tensors: np.ndarray = values.view(np.dtype(foreign.dtype).newbyteorder("<")).reshape((len(lengths), *foreign.shape))
    return tensors


def _decode_npy(foreign: ForeignSchema, offsets: np.ndarray, data: np.ndarray, where: str,
                empty: Callable[..., np.ndarray]) -> np.ndarray:
    n = len(offsets) - 1
    out = empty((n, *foreign.shape), np.dtype(foreign.dtype))
    for i in range(n):
        value = data[offsets[i]:offsets[i + 1]]
        try:
            out[i] = _npy_array(value, foreign)
        except ValueError as exc:
            raise TrainfeedError(f"{where}: tensor column {foreign.tensor_column!r}, row {i}: {exc}") from None
    return out


def _npy_array(value: np.ndarray, foreign: ForeignSchema) -> np.ndarray:
    """One .npy file's bytes -> its array (a view of ``value``), checked against the options.
    The header is read by numpy's own parser (a literal, never unpickled); object arrays are
    refused as ``np.load(allow_pickle=False)`` refuses them."""
    head = value[:12].tobytes()
    if not head.startswith(NPY_MAGIC) or len(head) < 10:
        raise ValueError("not a .npy file (no .npy magic); --tensor-encoding raw reads bare bytes")
    size_bytes = 2 if head[6] == 1 else 4
    start = 8 + size_bytes + int.from_bytes(head[8:8 + size_bytes], "little")
    header = io.BytesIO(value[:start].tobytes())
    version = np.lib.format.read_magic(header)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(header)  # ValueError for a damaged header
    if dtype.hasobject:
        raise ValueError("holds Python objects (a pickle), which are never loaded")
    if dtype.newbyteorder("<") != np.dtype(foreign.dtype).newbyteorder("<") or tuple(shape) != foreign.shape:
        raise ValueError(f"holds {dtype.name} of shape {tuple(shape)}, not {foreign.dtype} of shape {foreign.shape} "
                         "(--dtype, --shape)")
    if len(value) - start != foreign.nbytes:
        raise ValueError(f"holds {len(value) - start} bytes of data after its header, not {foreign.nbytes}")
    array = value[start:].view(dtype)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _decode_list(foreign: ForeignSchema, col: pa.Array, where: str) -> np.ndarray:
    n = len(col)
    if not pa.types.is_fixed_size_list(col.type):
        lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(lengths != foreign.size)
        if len(bad):
            raise TrainfeedError(f"{where}: tensor column {foreign.tensor_column!r}, row {int(bad[0])}: "
                                 f"{int(lengths[bad[0]])} numbers, but --shape {_shape(foreign)} is {foreign.size}")
    values = col.flatten()
    if values.null_count:
        raise TrainfeedError(f"{where}: tensor column {foreign.tensor_column!r} holds {values.null_count} null "
                             "numbers")
    tensors: np.ndarray = values.to_numpy(zero_copy_only=False).reshape((n, *foreign.shape))
    return tensors


def decode_ids(foreign: ForeignSchema, table: pa.Table, first_row: int, where: str) -> list[str]:
    """Sample ids: the id column as strings, or ``row-<n>`` (n: the row's position in the table)."""
    if foreign.id_column is None:
        return [f"row-{first_row + i}" for i in range(table.num_rows)]
    col = _one_chunk(table.column(foreign.id_column))
    if col.null_count:
        raise TrainfeedError(f"{where}: id column {foreign.id_column!r} has {col.null_count} null values "
                             f"(the first in row {_first_null(col)})")
    strings = col if pa.types.is_string(col.type) else pc.cast(col, pa.string())
    ids: list[str] = strings.to_pylist()
    return ids
