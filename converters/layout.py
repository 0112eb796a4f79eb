"""The dataset schema and its on-disk forms, defined once for every writer and reader.

A store holds one row per sample: ``id`` (path relative to the source, no extension),
``label`` (int64, null when unlabeled) and one column per tensor field. How a field is
encoded in each format is decided here; docs/LAYOUT.md describes the result for users
who decode stores with plain pyarrow or h5py.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa

from trainfeed.converters.errors import UsageError

if TYPE_CHECKING:
    from trainfeed.converters.sources.decode import Sample

#: The layout a store is written in: 2 for a store with ragged fields (each sample its own
#: shape, in a shape column readers before it do not know), 1 for the rest.
LAYOUT_VERSION = 1
RAGGED_LAYOUT_VERSION = 2
READABLE_LAYOUTS = (LAYOUT_VERSION, RAGGED_LAYOUT_VERSION)

ID = "id"
LABEL = "label"
RESERVED = (ID, LABEL)

#: Arrow field-metadata key holding a tensor field's FieldSpec as JSON.
FIELD_META = b"trainfeed.field"
#: Arrow field-metadata key on ``label`` holding the class-name -> index map.
LABEL_MAP_META = b"trainfeed.label_map"
#: Arrow schema-metadata key (Parquet footers) and HDF5 root attribute: the whole DatasetSchema.
DATASET_META = "trainfeed"
#: Suffix of the column (Parquet, Delta) or dataset (HDF5) holding each sample's shape of a ragged field.
SHAPE_SUFFIX = "__shape"
#: Arrow field-metadata key on a shape column: the field it gives the shapes of.
SHAPE_OF_META = b"trainfeed.shape_of"
#: The axis of a sample's channels, as ``convert --channels`` records it (None: not said; read as last).
CHANNELS = ("last", "first")
#: Manifest written beside Parquet parts and HDF5 shards; readers skip names starting with "_".
MANIFEST = "_trainfeed.json"

#: How a tensor is stored: a raw array, or the bytes of an encoded image (JPEG or PNG).
RAW = "raw"
IMAGE_BYTES = "image"

#: numpy dtypes that every target (Parquet, Delta, HDF5, Spark, DuckDB) represents exactly.
#: float16 only as ``binary`` tensors: Parquet and Delta have no half-float array type here.
SUPPORTED_DTYPES = (
    "bool", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
)


@dataclass(frozen=True)
class FieldSpec:
    """One tensor field: its numpy dtype, its shape (None when samples differ: encoded images
    of their own sizes, or a ragged raw field whose samples keep their own shapes), encoding
    and, when the writer was told, the axis of its channels."""

    name: str
    dtype: str
    shape: tuple[int, ...] | None
    encoding: str = RAW
    channels: str | None = None

    @property
    def is_raw(self) -> bool:
        return self.encoding == RAW

    @property
    def is_ragged(self) -> bool:
        """Raw arrays of different shapes: each sample's shape is stored beside it."""
        return self.is_raw and self.shape is None

    @property
    def shape_column(self) -> str:
        return self.name + SHAPE_SUFFIX

    @property
    def sample_nbytes(self) -> int | None:
        """Decoded bytes of one sample, when the shape is fixed."""
        if self.shape is None:
            return None
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "encoding": self.encoding,
            **({"channels": self.channels} if self.channels else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FieldSpec:
        shape = d.get("shape")
        return cls(d["name"], d["dtype"], None if shape is None else tuple(shape), d.get("encoding", RAW),
                   d.get("channels"))


@dataclass
class DatasetSchema:
    """What a store holds. Written into every store so that it is self-describing."""

    fields: list[FieldSpec]
    labeled: bool
    label_map: dict[str, int] | None = None
    source: str | None = None
    samples: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Random id given to a store when it is written: identifies its content (checkpoints,
    #: caches) whatever path it is opened by. None for stores written before it existed.
    store_id: str | None = None

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def to_dict(self) -> dict[str, Any]:
        ragged = any(f.is_ragged for f in self.fields)
        return {
            "layout_version": RAGGED_LAYOUT_VERSION if ragged else LAYOUT_VERSION,
            "fields": [f.to_dict() for f in self.fields],
            "labeled": self.labeled,
            "label_map": self.label_map,
            "source": self.source,
            "samples": self.samples,
            **({"store_id": self.store_id} if self.store_id else {}),
            **({"extra": self.extra} if self.extra else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DatasetSchema:
        version = d.get("layout_version")
        if version not in READABLE_LAYOUTS:
            raise ValueError(f"store layout version {version!r} is not supported (this trainfeed reads "
                             f"{', '.join(map(str, READABLE_LAYOUTS))}): written by a newer trainfeed?")
        return cls(
            fields=[FieldSpec.from_dict(f) for f in d["fields"]],
            labeled=bool(d["labeled"]),
            label_map=d.get("label_map"),
            source=d.get("source"),
            samples=d.get("samples"),
            extra=d.get("extra", {}),
            store_id=d.get("store_id"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> DatasetSchema:
        return cls.from_dict(json.loads(text))


def check_channels(value: str | None) -> None:
    """A usage error unless ``value`` (``--channels``) is None, first or last."""
    if value not in (None, *CHANNELS):
        raise UsageError(f"--channels must be first or last, not {value!r}")


def looks_channels_first(shape: tuple[int, ...]) -> bool:
    """A sample whose first axis (1-4) is smaller than every other while its last (8 or more)
    is no plausible channel count: (1, 32, 32), (3, 224, 224), (1, 64, 64, 64); not
    (30, 30, 10, 10), (32, 32, 3) nor (4, 6, 5)."""
    return len(shape) >= 3 and shape[0] <= 4 and shape[-1] >= 8 and min(shape[1:]) > shape[0]


def channels_warnings(fields: list[FieldSpec]) -> list[str]:
    """What a store's summary says of fields whose shape looks channels-first while no one said
    where their channels are."""
    return [f"field {f.name!r} holds samples of shape {f.shape}, which looks channels-first; trainfeed's models "
            "read channels last unless the store says otherwise: convert with --channels first (or --channels "
            "last to record that it is channels-last)"
            for f in fields if f.is_raw and f.shape and f.channels is None and looks_channels_first(f.shape)]


# ---------------------------------------------------------------- validation of a stored schema

def is_count(value: Any) -> bool:
    """A JSON value that is a size or a count: an int >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def checked_schema(d: Any, where: str) -> DatasetSchema:
    """A DatasetSchema from its JSON form as found in a store (manifest, HDF5 attribute, Delta
    commit), validated; ValueError naming ``where`` otherwise."""
    problem = _schema_problem(d)
    if problem is None:
        try:
            return DatasetSchema.from_dict(d)
        except (KeyError, TypeError, ValueError) as exc:
            problem = str(exc)
    raise ValueError(f"{where}: invalid dataset schema: {problem}")


def _schema_problem(d: Any) -> str | None:
    if not isinstance(d, dict):
        return f"expected an object, found {type(d).__name__}"
    if not isinstance(d.get("fields"), list) or not d["fields"]:
        return "'fields' must be a non-empty list"
    for f in d["fields"]:
        problem = _field_problem(f)
        if problem:
            return problem
    if not isinstance(d.get("labeled"), bool):
        return "'labeled' must be true or false"
    label_map = d.get("label_map")
    if label_map is not None and not (isinstance(label_map, dict) and all(
            isinstance(k, str) and is_count(v) for k, v in label_map.items())):
        return "'label_map' must map class names to integers >= 0"
    return None


def _field_problem(f: Any) -> str | None:
    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"] or f["name"] in RESERVED:
        return f"field {f!r} has no valid name"
    if f.get("dtype") not in SUPPORTED_DTYPES:
        return f"field {f['name']!r} has dtype {f.get('dtype')!r} (supported: {', '.join(SUPPORTED_DTYPES)})"
    shape = f.get("shape")
    if shape is not None and not (isinstance(shape, list) and all(is_count(n) for n in shape)):
        return f"field {f['name']!r} has shape {shape!r}, not a list of sizes"
    if f.get("encoding", RAW) not in (RAW, IMAGE_BYTES):
        return f"field {f['name']!r} has encoding {f.get('encoding')!r}"
    if f.get("channels") not in (None, *CHANNELS):
        return f"field {f['name']!r} has channels {f.get('channels')!r} (first or last)"
    return None


# ---------------------------------------------------------------- Arrow form

def _arrow_value_type(spec: FieldSpec, tensor_column: str) -> pa.DataType:
    if not spec.is_raw or tensor_column == "binary":
        return pa.binary()
    if spec.dtype == "float16":
        raise UsageError(f"--tensor-column list cannot hold float16 field {spec.name!r} (Parquet and Delta have "
                         "no half-float array type here); use --tensor-column binary")
    return pa.list_(pa.from_numpy_dtype(np.dtype(spec.dtype)))


def arrow_schema(schema: DatasetSchema, tensor_column: str = "binary") -> pa.Schema:
    """Arrow schema of a store. A tensor is one value per sample, flattened in C order: either
    its little-endian bytes (``binary``: fastest to write and read) or a ``list`` of numbers
    (what SQL engines show as an array). Encoded images are always ``binary``."""
    label_meta = {LABEL_MAP_META: json.dumps(schema.label_map).encode()} if schema.label_map else None
    fields = [pa.field(ID, pa.string(), nullable=False), pa.field(LABEL, pa.int64(), metadata=label_meta)]
    for spec in schema.fields:
        fields.append(pa.field(spec.name, _arrow_value_type(spec, tensor_column),
                               metadata={FIELD_META: json.dumps(spec.to_dict()).encode()}))
        if spec.is_ragged:
            fields.append(pa.field(spec.shape_column, pa.list_(pa.int64()),
                                   metadata={SHAPE_OF_META: spec.name.encode()}))
    return pa.schema(fields, metadata={DATASET_META: schema.to_json()})


def schema_from_arrow(arrow: pa.Schema) -> DatasetSchema:
    """Rebuild the DatasetSchema from an Arrow schema (Parquet footer or Delta table schema)."""
    meta = arrow.metadata or {}
    if DATASET_META.encode() in meta:
        return DatasetSchema.from_json(meta[DATASET_META.encode()])
    # Delta keeps field metadata but not schema metadata: rebuild from the fields.
    specs = []
    for f in arrow:
        if f.name in RESERVED or SHAPE_OF_META in (f.metadata or {}):
            continue
        fmeta = f.metadata or {}
        if FIELD_META not in fmeta:
            raise ValueError(f"column {f.name!r} carries no trainfeed field metadata: not a trainfeed store")
        specs.append(FieldSpec.from_dict(json.loads(fmeta[FIELD_META])))
    if ID not in arrow.names or LABEL not in arrow.names:
        raise ValueError("columns 'id' and 'label' are missing: not a trainfeed store")
    label_meta = arrow.field(LABEL).metadata or {}
    label_map = json.loads(label_meta[LABEL_MAP_META]) if LABEL_MAP_META in label_meta else None
    return DatasetSchema(fields=specs, labeled=True, label_map=label_map)


def _tensor_column(values: list[np.ndarray], spec: FieldSpec) -> pa.Array:
    """Flatten same-dtype arrays into one Arrow list column with a single copy."""
    lengths = np.fromiter((v.size for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([v.reshape(-1) for v in values]) if values else np.empty(0, spec.dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def to_record_batch(samples: list[Sample], schema: DatasetSchema, arrow: pa.Schema) -> pa.RecordBatch:
    """Samples (see converters.sources.Sample) -> one Arrow record batch of ``arrow``'s schema."""
    columns: list[pa.Array] = [
        pa.array([s.id for s in samples], pa.string()),
        pa.array([s.label for s in samples], pa.int64()),
    ]
    for spec in schema.fields:
        vals = [s.fields[spec.name] for s in samples]
        arrays = cast("list[np.ndarray]", vals)  # in a tensor field (encoded images alone are bytes)
        if pa.types.is_list(arrow.field(spec.name).type):
            columns.append(_tensor_column(arrays, spec))
        elif spec.is_raw:
            columns.append(_binary_column([_le(v).reshape(-1).view(np.uint8) for v in arrays]))
        else:
            columns.append(pa.array(vals, pa.binary()))
        if spec.is_ragged:
            columns.append(pa.array([list(v.shape) for v in arrays], pa.list_(pa.int64())))
    return pa.RecordBatch.from_arrays(columns, schema=arrow)


def _le(arr: np.ndarray) -> np.ndarray:
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


def _binary_column(chunks: list[np.ndarray]) -> pa.Array:
    """One Arrow binary array over byte chunks, built with a single copy into one buffer."""
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum([c.size for c in chunks], out=offsets[1:])
    data = np.concatenate(chunks) if chunks else np.empty(0, np.uint8)
    return pa.Array.from_buffers(pa.binary(), len(chunks), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def decode_tensor(value: bytes, spec: FieldSpec, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A ``binary`` tensor value -> ndarray of the field's dtype and shape (``shape``: the
    sample's own, for a ragged field) (read-only view)."""
    return np.frombuffer(value, dtype=np.dtype(spec.dtype).newbyteorder("<")).reshape(
        spec.shape if spec.shape is not None else shape)


def ragged_values(flat: list[np.ndarray], shapes: list[list[int]], dtype: str) -> np.ndarray:
    """A ragged field's samples as an object array (one ndarray of its own shape per row) from
    each one's flattened values and its shape."""
    out = np.empty(len(flat), object)
    for i, (values, shape) in enumerate(zip(flat, shapes)):
        out[i] = _native(values).astype(dtype, copy=False).reshape(shape)
    return out


def from_record_batch(batch: pa.RecordBatch | pa.Table,
                      schema: DatasetSchema) -> list[tuple[str, int | None, dict[str, Any]]]:
    """Arrow rows -> (id, label, {field: ndarray or bytes}); the inverse of to_record_batch."""
    ids = batch.column(ID).to_pylist()
    labels = batch.column(LABEL).to_pylist()
    decoded: dict[str, list[Any]] = {}
    for spec in schema.fields:
        col = batch.column(spec.name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if spec.is_ragged:
            decoded[spec.name] = list(ragged_column(col, batch.column(spec.shape_column), spec))
        elif spec.is_raw and pa.types.is_binary(col.type):
            decoded[spec.name] = [_native(decode_tensor(v, spec)) for v in col.to_pylist()]
        elif spec.is_raw:
            flat = col.flatten().to_numpy(zero_copy_only=False)
            offsets = col.offsets.to_numpy()
            first = offsets[0]
            decoded[spec.name] = [_shaped(flat[offsets[i] - first:offsets[i + 1] - first], spec)
                                  for i in range(len(col))]
        else:
            decoded[spec.name] = col.to_pylist()
    return [(ids[i], labels[i], {name: vals[i] for name, vals in decoded.items()}) for i in range(len(ids))]


def ragged_column(col: pa.Array | pa.ChunkedArray, shapes: pa.Array | pa.ChunkedArray, spec: FieldSpec) -> np.ndarray:
    """A ragged field's column (binary or list) and its shape column -> an object array of
    ndarrays, each in its own shape."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    dims = shapes.to_pylist()
    le = np.dtype(spec.dtype).newbyteorder("<")
    if pa.types.is_binary(col.type):  # views of Arrow's data buffer: no copy
        offsets = np.frombuffer(col.buffers()[1], np.int32, len(col) + 1, col.offset * 4)
        data = np.frombuffer(col.buffers()[2], np.uint8) if len(col) else np.empty(0, np.uint8)
        flat = [data[offsets[i]:offsets[i + 1]].view(le) for i in range(len(col))]
    else:
        values = col.flatten().to_numpy(zero_copy_only=False)
        offsets = col.offsets.to_numpy()
        flat = [values[offsets[i] - offsets[0]:offsets[i + 1] - offsets[0]] for i in range(len(col))]
    for i, (values, shape) in enumerate(zip(flat, dims)):
        if shape is None or len(values) != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"field {spec.name!r}, row {i}: {len(values)} values do not fill shape {shape}: "
                             "the store is damaged or was modified")
    return ragged_values(flat, dims, spec.dtype)


def _native(arr: np.ndarray) -> np.ndarray:
    return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))


def _shaped(flat: np.ndarray, spec: FieldSpec) -> np.ndarray:
    arr = flat.astype(spec.dtype, copy=False)
    return arr.reshape(spec.shape) if spec.shape is not None else arr
