"""Turn a source listing into a stream of validated samples, decoded by a thread pool.

Reads and decodes (file I/O, zlib, JPEG) release the GIL, so threads overlap them with
the writer in the main thread without copying arrays between processes. Output order is
the listing's (sorted ids), so a store's row order is reproducible.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import reduce
from typing import TypeVar

import fsspec
import numpy as np

from trainfeed.converters.errors import SampleError, TrainfeedError
from trainfeed.converters.layout import RAW, SHAPE_SUFFIX, FieldSpec
from trainfeed.converters.sources.decode import (
    NPY_HEADER_READ,
    ArrayOptions,
    ImageOptions,
    Sample,
    encoded_dtype,
    field_encoding,
    npy_header,
    read_sample,
)
from trainfeed.converters.sources.dtypes import cast_fields, holding_both
from trainfeed.converters.sources.labels import Labels
from trainfeed.converters.sources.listing import IMAGE, NPY, Listing, SourceFile, check_listed, read_bytes

T = TypeVar("T")
R = TypeVar("R")

def load_sample(fs: fsspec.AbstractFileSystem, kind: str, src: SourceFile, labels: Labels,
                image_opts: ImageOptions) -> Sample:
    check_listed(src)
    if labels.by_id is not None and src.id not in labels.by_id:
        raise SampleError(src.path, f"no label for id {src.id!r} in the labels file")
    fields, nbytes_in, depth_changed = read_sample(fs, kind, src, image_opts)
    return Sample(src.id, labels.get(src.id), fields, nbytes_in, depth_changed)


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int,
                window_per_worker: int = 4) -> Iterator[R | Exception]:
    """fn(item) for each item, in order, ``workers`` at a time; exceptions are returned, not raised."""

    def call(item: T) -> R | Exception:
        try:
            return fn(item)
        except Exception as exc:  # handed to the consumer in order
            return exc

    pending: deque[Future[R | Exception]] = deque()
    items_iter = iter(items)
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="trainfeed-read")
    abandoned = False
    try:
        for item in items_iter:
            pending.append(pool.submit(call, item))
            if len(pending) >= max(1, workers) * window_per_worker:
                break
        while pending:
            result = pending.popleft().result()
            nxt = next(items_iter, None)
            if nxt is not None:
                pending.append(pool.submit(call, nxt))
            yield result
    except GeneratorExit:
        # a consumer that stopped early does not wait for reads it no longer wants; the
        # generator may even be collected in one of this pool's threads, which cannot join itself
        abandoned = True
        raise
    finally:
        pool.shutdown(wait=not abandoned, cancel_futures=True)


class SchemaGuard:
    """Fixes each field's dtype and shape from the first valid sample (``arrays`` says otherwise:
    one dtype for all, or ragged shapes); rejects samples that differ."""

    def __init__(self, kind: str, image_opts: ImageOptions, specs: list[FieldSpec] | None = None,
                 first_id: str | None = None, arrays: ArrayOptions = ArrayOptions()) -> None:
        """``specs``/``first_id``: fields already fixed elsewhere (a Spark task holds its samples
        to what the driver's first sample fixed); None: the first checked sample fixes them."""
        self.kind = kind
        self.image_opts = image_opts
        self.arrays = arrays
        self.specs = None if specs is None else list(specs)
        self.first_id = first_id

    def take(self, path: str, sample: Sample) -> Sample:
        """The sample as it is stored (each array in ``arrays.dtype``, when given), checked."""
        if self.arrays.dtype is not None:
            sample.fields = cast_fields(path, sample.fields, self.arrays.dtype)
        self.check(path, sample)
        return sample

    def _spec(self, name: str, value: np.ndarray | bytes) -> FieldSpec:
        encoding = field_encoding(self.kind, self.image_opts) if self.kind == IMAGE else RAW
        if encoding != RAW:
            assert isinstance(value, bytes), "an encoded image field holds the file's bytes"
            shape = None
            if self.image_opts.resize is not None:
                channels = 1 if self.image_opts.mode == "L" else len(self.image_opts.mode)
                shape = (*self.image_opts.resize, channels)
            return FieldSpec(name, encoded_dtype(value), shape, encoding)
        assert isinstance(value, np.ndarray), "a raw field holds arrays"
        shape = None if self.arrays.ragged else tuple(value.shape)
        return FieldSpec(name, value.dtype.name, shape, RAW, self.arrays.channels if self.kind != IMAGE else None)

    def check(self, path: str, sample: Sample) -> None:
        specs = [self._spec(name, value) for name, value in sample.fields.items()]
        if self.specs is None:
            clash = [s.name for s in specs if s.is_ragged and s.shape_column in sample.fields]
            if clash:
                raise SampleError(path, f"array {clash[0] + SHAPE_SUFFIX!r} has the name --ragged gives the shapes "
                                        f"of {clash[0]!r}; rename one")
            self.specs, self.first_id = specs, sample.id
            return
        names, expected = [s.name for s in specs], [s.name for s in self.specs]
        if names != expected:
            raise SampleError(path, f"arrays {names} differ from {expected} of the first sample {self.first_id!r}")
        for got, want in zip(specs, self.specs):
            if got.dtype != want.dtype:
                raise SampleError(path, f"{got.name!r} has dtype {got.dtype}, but the first sample {self.first_id!r} "
                                        f"has {want.dtype}{self._dtype_hint(got.dtype, want.dtype)}")
            if got.shape != want.shape:
                hint = ("; use --resize HxW to store images of different sizes" if self.kind == IMAGE
                        else "; use --ragged to store each sample in its own shape")
                raise SampleError(path, f"{got.name!r} has shape {got.shape}, but the first sample {self.first_id!r} "
                                        f"has {want.shape}{hint}")

    def _dtype_hint(self, got: str, want: str) -> str:
        if self.kind == IMAGE:
            return "; use --image-mode L --promote-depth to store 8- and 16-bit greyscale images as 16-bit"
        both = holding_both(got, want)
        return (f"; --dtype {both} holds both exactly (--dtype auto finds the one dtype for every file)" if both
                else f"; no dtype holds every {got} and {want} value exactly: convert them apart")


def scan_dtype(fs: fsspec.AbstractFileSystem, listing: Listing, where: str, workers: int) -> tuple[str, list[str]]:
    """``--dtype auto``: the smallest dtype holding every .npy file's values exactly (headers
    only: one short read per file), and the dtypes found. A file whose header is bad is left
    to the conversion, which rejects it as it would without the scan."""
    if listing.kind != NPY:
        raise TrainfeedError(f"{where}: --dtype auto reads .npy headers; this folder holds {listing.kind} files: "
                             "give --dtype DTYPE")

    def dtype_of(src: SourceFile) -> str:
        head = read_bytes(fs, src, 0, min(src.size, NPY_HEADER_READ) if src.size else NPY_HEADER_READ)
        return npy_header(src.path, head, src.size or len(head)).dtype.name

    found: list[str] = []
    for src, result in zip(listing.files, ordered_map(dtype_of, listing.files, workers)):
        if isinstance(result, SampleError):
            continue
        if isinstance(result, Exception):
            raise result if isinstance(result, TrainfeedError) else TrainfeedError(f"{src.path}: cannot read: {result}")
        if result not in found:
            found.append(result)
    both = reduce(lambda a, b: a and holding_both(a, b), found[1:], found[0] if found else None)
    if both is None:
        raise TrainfeedError(f"{where}: no dtype holds every value of {', '.join(sorted(found))} exactly: "
                             "convert them apart")
    return both, sorted(found)
