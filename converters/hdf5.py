"""HDF5 store: one file (DST ends in .h5 / .hdf5) or a folder of ``shard-NNNNN.h5`` files of
about the target size plus ``_trainfeed.json``.

Each file holds ``/id`` (UTF-8 strings), ``/label`` (int64; absent when unlabeled) and one
dataset per tensor field shaped ``(n, *shape)`` in its own dtype, chunked along the sample
axis; encoded images are variable-length uint8. The root attribute ``trainfeed`` holds the
dataset schema as JSON.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np

from . import __version__
from .layout import DATASET_META, ID, LABEL, MANIFEST, DatasetSchema, FieldSpec
from .options import WriteOptions, WriteResult
from .sources import Sample

FORMAT = "hdf5"
SUFFIXES = (".h5", ".hdf5")
SHARD = "shard-{:05d}.h5"


def is_single_file(path) -> bool:
    return Path(path).suffix.lower() in SUFFIXES


def _compression(opts: WriteOptions) -> dict:
    if opts.compression == "none":
        return {}
    if opts.compression == "gzip":
        return {"compression": "gzip", "compression_opts": opts.compression_level or 4}
    return {"compression": opts.compression}


class _File:
    """One HDF5 file being filled; datasets grow along axis 0 as batches arrive."""

    def __init__(self, path: Path, schema: DatasetSchema, opts: WriteOptions):
        self.h5 = h5py.File(path, "w")
        self.schema = schema
        self.rows = 0
        self.h5.create_dataset(ID, shape=(0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8"), chunks=(4096,))
        if schema.labeled:
            self.h5.create_dataset(LABEL, shape=(0,), maxshape=(None,), dtype="int64", chunks=(4096,))
        for spec in schema.fields:
            self._create(spec, opts)

    def _create(self, spec: FieldSpec, opts: WriteOptions) -> None:
        if not spec.is_raw:
            self.h5.create_dataset(spec.name, shape=(0,), maxshape=(None,), dtype=h5py.vlen_dtype(np.uint8),
                                   chunks=(64,), **_compression(opts))
            self.h5[spec.name].attrs["encoding"] = spec.encoding
            return
        per_chunk = max(1, opts.hdf5_chunk_size // max(1, spec.sample_nbytes))
        self.h5.create_dataset(spec.name, shape=(0, *spec.shape), maxshape=(None, *spec.shape), dtype=spec.dtype,
                               chunks=(per_chunk, *spec.shape), **_compression(opts))

    def append(self, batch: list[Sample]) -> None:
        n0, n1 = self.rows, self.rows + len(batch)
        columns: dict[str, object] = {ID: np.array([s.id for s in batch], dtype=object)}
        if self.schema.labeled:
            columns[LABEL] = np.array([s.label for s in batch], dtype=np.int64)
        for spec in self.schema.fields:
            vals = [s.fields[spec.name] for s in batch]
            if spec.is_raw:
                columns[spec.name] = np.stack(vals)
            else:
                col = np.empty(len(vals), dtype=object)
                col[:] = [np.frombuffer(v, dtype=np.uint8) for v in vals]
                columns[spec.name] = col
        for name, values in columns.items():
            ds = self.h5[name]
            ds.resize(n1, axis=0)
            ds[n0:n1] = values
        self.rows = n1

    def close(self, schema: DatasetSchema) -> None:
        self.h5.attrs[DATASET_META] = schema.to_json()
        self.h5.attrs["writer"] = f"trainfeed {__version__}"
        self.h5.close()


def write(path, schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
          *, storage_options: dict[str, str] | None = None, single_file: bool | None = None) -> WriteResult:
    """Write every batch; as a single file, or as shards that roll over at the target size."""
    path = Path(path)
    single = is_single_file(path) if single_file is None else single_file
    if not single:
        path.mkdir(parents=True)
    shards: list[dict] = []
    files: list[_File] = []
    current: _File | None = None
    bytes_in_shard = 0
    try:
        for batch in batches:
            if current is None:
                target = path if single else path / SHARD.format(len(shards))
                current = _File(target, schema, opts)
                files.append(current)
                shards.append({"file": target.name, "rows": 0})
                bytes_in_shard = 0
            current.append(batch)
            shards[-1]["rows"] = current.rows
            bytes_in_shard += sum(s.nbytes for s in batch)
            if not single and bytes_in_shard >= opts.target_file_size:
                current = None
        schema.samples = sum(s["rows"] for s in shards)
    finally:
        for f in files:
            f.close(schema)
    if not single:
        manifest = {"format": FORMAT, "writer": f"trainfeed {__version__}", "schema": schema.to_dict(), "parts": shards}
        (path / MANIFEST).write_text(json.dumps(manifest, indent=1))
    out = [str(path)] if single else [str(path / s["file"]) for s in shards]
    return WriteResult(out, sum(Path(f).stat().st_size for f in out), {"shards": len(out)})


def is_store(path) -> bool:
    path = Path(path)
    if path.is_file():
        return h5py.is_hdf5(path)
    manifest = path / MANIFEST
    return manifest.is_file() and json.loads(manifest.read_text()).get("format") == FORMAT


def data_files(path) -> list[str]:
    path = Path(path)
    if path.is_file():
        return [str(path)]
    manifest = json.loads((path / MANIFEST).read_text())
    return [str(path / s["file"]) for s in manifest["parts"]]


def read_schema(path) -> DatasetSchema:
    with h5py.File(data_files(path)[0], "r") as h5:
        schema = DatasetSchema.from_json(h5.attrs[DATASET_META])
    return schema


def read_samples(path, batch_rows: int = 256) -> Iterator[tuple[str, int | None, dict]]:
    """Every sample in write order, read in slices of ``batch_rows`` (plain h5py)."""
    schema = read_schema(path)
    for f in data_files(path):
        with h5py.File(f, "r") as h5:
            n = h5[ID].shape[0]
            for start in range(0, n, batch_rows):
                stop = min(n, start + batch_rows)
                ids = [x.decode() if isinstance(x, bytes) else x for x in h5[ID][start:stop]]
                labels = h5[LABEL][start:stop].tolist() if schema.labeled else [None] * len(ids)
                cols = {spec.name: h5[spec.name][start:stop] for spec in schema.fields}
                for i, sid in enumerate(ids):
                    fields = {
                        spec.name: (cols[spec.name][i] if spec.is_raw else cols[spec.name][i].tobytes())
                        for spec in schema.fields
                    }
                    yield sid, labels[i], fields
