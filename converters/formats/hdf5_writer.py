"""HDF5 store, write side: the samples' batches into one HDF5 file or a folder of shards and their
manifest, with Ctrl-C held back and disk errors kept out of HDF5 while it writes (see hdf5.py)."""
from __future__ import annotations

import functools
import io
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

import h5py
import numpy as np

from trainfeed.converters.formats.manifest import WRITER, write_manifest
from trainfeed.converters.formats.options import WriteOptions, WriteResult
from trainfeed.converters.layout import DATASET_META, ID, LABEL, DatasetSchema, FieldSpec
from trainfeed.converters.sources.decode import Sample

FORMAT = "hdf5"
SUFFIXES = (".h5", ".hdf5")
SHARD = "shard-{:05d}.h5"


def is_single_file(path: str | os.PathLike[str]) -> bool:
    return Path(path).suffix.lower() in SUFFIXES


def _compression(opts: WriteOptions) -> dict[str, Any]:
    if opts.compression == "none":
        return {}
    if opts.compression == "gzip":
        level = 4 if opts.compression_level is None else opts.compression_level
        return {"compression": "gzip", "compression_opts": level}
    return {"compression": opts.compression}


class _Sink(io.RawIOBase):
    """The OS file under an h5py.File (h5py's file-object driver). A failed write (a full
    disk) is not raised inside HDF5, which cannot recover from it (the interpreter then
    crashes at exit): it is kept in ``error``, later writes are dropped so that the file
    can still be closed, and ``check()`` raises it. The file is only ever a staging copy,
    deleted after a failure."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "w+b", buffering=0)  # noqa: SIM115 - closed by close()
        self.error: OSError | None = None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def readinto(self, buffer: Any) -> int:
        return self.file.readinto(buffer)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        try:
            while self.error is None and view.nbytes:  # a write to a nearly full disk may be partial
                view = view[self.file.write(view):]
        except OSError as exc:
            self.error = exc
        return size

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self.file.truncate(size)
            except OSError as exc:
                self.error = exc
        return self.tell() if size is None else size

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.file.close()
        super().close()


F = TypeVar("F", bound=Callable[..., Any])


_HELD = (signal.SIGINT, signal.SIGTERM)


def _ctrl_c_after(fn: F) -> F:
    """Run ``fn`` with Ctrl-C (and SIGTERM) held back until it returns. Through the file-object
    driver HDF5 calls Python (``_Sink``); an exception raised there by a signal handler leaves
    HDF5 in a state that crashes the interpreter."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)  # signals are only handled in the main thread
        caught: list[int] = []
        previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in _HELD}
        try:
            return fn(*args, **kwargs)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for number in dict.fromkeys(caught):
                signal.raise_signal(number)  # now, with the usual handler

    return wrapper  # type: ignore[return-value]


class _File:
    """One HDF5 file being filled; datasets grow along axis 0 as batches arrive."""

    def __init__(self, path: Path, schema: DatasetSchema) -> None:
        self.path, self.schema = path, schema
        self.rows = 0
        self.sink: _Sink | None = None
        self.h5: h5py.File | None = None

    @_ctrl_c_after
    def open(self, opts: WriteOptions) -> None:
        self.sink = _Sink(self.path)
        self.h5 = h5py.File(self.sink, "w")
        self.h5.create_dataset(ID, shape=(0,), maxshape=(None,), dtype=h5py.string_dtype("utf-8"), chunks=(4096,))
        if self.schema.labeled:
            self.h5.create_dataset(LABEL, shape=(0,), maxshape=(None,), dtype="int64", chunks=(4096,))
        for spec in self.schema.fields:
            self._create(spec, opts)

    @property
    def _open(self) -> tuple[Any, _Sink]:
        """The h5py file and its sink, once ``open`` made them."""
        assert self.h5 is not None and self.sink is not None, "open() comes first"
        return self.h5, self.sink

    def _create(self, spec: FieldSpec, opts: WriteOptions) -> None:
        h5, _ = self._open
        if not spec.is_raw:
            h5.create_dataset(spec.name, shape=(0,), maxshape=(None,), dtype=h5py.vlen_dtype(np.uint8),
                              chunks=(64,), **_compression(opts))
            h5[spec.name].attrs["encoding"] = spec.encoding
            return
        if spec.is_ragged:  # each sample flattened, its shape beside it (docs/LAYOUT.md)
            h5.create_dataset(spec.name, shape=(0,), maxshape=(None,), dtype=h5py.vlen_dtype(np.dtype(spec.dtype)),
                              chunks=(64,), **_compression(opts))
            h5.create_dataset(spec.shape_column, shape=(0,), maxshape=(None,), dtype=h5py.vlen_dtype(np.int64),
                              chunks=(4096,))
            return
        shape, nbytes = spec.shape, spec.sample_nbytes
        assert shape is not None and nbytes is not None  # a raw field has one shape (the schema guard's rule)
        per_chunk = max(1, opts.hdf5_chunk_size // max(1, nbytes))
        h5.create_dataset(spec.name, shape=(0, *shape), maxshape=(None, *shape), dtype=spec.dtype,
                          chunks=(per_chunk, *shape), **_compression(opts))

    @_ctrl_c_after
    def append(self, batch: list[Sample]) -> None:
        n0, n1 = self.rows, self.rows + len(batch)
        columns: dict[str, object] = {ID: np.array([s.id for s in batch], dtype=object)}
        if self.schema.labeled:
            columns[LABEL] = np.array([s.label for s in batch], dtype=np.int64)
        for spec in self.schema.fields:
            vals = [s.fields[spec.name] for s in batch]
            if spec.is_ragged:
                columns[spec.name] = _objects([np.asarray(v).reshape(-1) for v in vals])
                columns[spec.shape_column] = _objects([np.array(np.shape(v), np.int64) for v in vals])
            elif spec.is_raw:
                columns[spec.name] = np.stack(vals)
            else:
                col = np.empty(len(vals), dtype=object)
                col[:] = [np.frombuffer(v, dtype=np.uint8) for v in vals]
                columns[spec.name] = col
        h5, sink = self._open
        for name, values in columns.items():
            ds = h5[name]
            ds.resize(n1, axis=0)
            if isinstance(h5py.check_vlen_dtype(ds.dtype), np.dtype):
                # encoded images, ragged arrays: h5py's slice assignment takes arrays of one
                # length for a 2-D array and refuses them; write_direct keeps them one per sample
                ds.write_direct(values, dest_sel=np.s_[n0:n1])
            else:
                ds[n0:n1] = values
        sink.check()
        self.rows = n1

    @_ctrl_c_after
    def close(self, schema: DatasetSchema | None) -> None:
        """Close the file; with ``schema``, first mark it complete (written by trainfeed)."""
        try:
            if schema is not None:
                h5, _ = self._open
                h5.attrs[DATASET_META] = schema.to_json()
                h5.attrs["writer"] = WRITER
        finally:
            for handle in (self.h5, self.sink):
                if handle is not None:
                    handle.close()
        if self.sink is not None:
            self.sink.check()


def _objects(values: list[np.ndarray]) -> np.ndarray:
    """A 1-D object array of arrays (np.array would stack arrays of one length into 2-D)."""
    out = np.empty(len(values), object)
    out[:] = values
    return out


def write(path: str | os.PathLike[str], schema: DatasetSchema, batches: Iterator[list[Sample]], opts: WriteOptions,
          on_part: Callable[[str], None] | None = None, *, single_file: bool | None = None) -> WriteResult:
    """Write every batch; as a single file, or as shards that roll over at the target size.
    ``on_part(name)``: called for each shard once complete (at the end: every shard records
    the final sample count)."""
    path = Path(path)
    single = is_single_file(path) if single_file is None else single_file
    if not single:
        path.mkdir(parents=True)
    shards: list[dict[str, Any]] = []
    files: list[_File] = []
    current: _File | None = None
    bytes_in_shard = 0
    try:
        for batch in batches:
            if current is None:
                target = path if single else path / SHARD.format(len(shards))
                current = _File(target, schema)
                files.append(current)  # closed whatever happens next
                current.open(opts)
                shards.append({"file": target.name, "rows": 0})
                bytes_in_shard = 0
            current.append(batch)
            shards[-1]["rows"] = current.rows
            bytes_in_shard += sum(s.nbytes for s in batch)
            if not single and bytes_in_shard >= opts.target_file_size:
                current = None
        schema.samples = sum(s["rows"] for s in shards)
    except BaseException:
        with suppress(Exception):  # the first error is the one to report
            _close_all(files, None)  # an incomplete file gets no trainfeed mark
        raise
    _close_all(files, schema)
    out = [str(path)] if single else [str(path / s["file"]) for s in shards]
    result = WriteResult(out, sum(Path(f).stat().st_size for f in out), {"shards": len(out)})
    if not single:
        write_manifest(path, FORMAT, schema, shards)
        if on_part is not None:
            for shard in shards:
                on_part(shard["file"])
    return result


def _close_all(files: list[_File], schema: DatasetSchema | None) -> None:
    """Close every file even when one fails (an HDF5 file left open crashes the interpreter
    at exit); then raise the first error."""
    error = None
    for f in files:
        try:
            f.close(schema)
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error
