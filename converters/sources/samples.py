"""Turn a source listing into a stream of validated samples, decoded by a thread pool.

Reads and decodes (file I/O, zlib, JPEG) release the GIL, so threads overlap them with
the writer in the main thread without copying arrays between processes. Output order is
the listing's (sorted ids), so a store's row order is reproducible.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

import fsspec

from trainfeed.converters.errors import SampleError
from trainfeed.converters.layout import RAW, FieldSpec
from trainfeed.converters.sources.decode import ImageOptions, Sample, encoded_dtype, field_encoding, read_sample
from trainfeed.converters.sources.labels import Labels
from trainfeed.converters.sources.listing import IMAGE, SourceFile, check_listed


def load_sample(fs: fsspec.AbstractFileSystem, kind: str, src: SourceFile, labels: Labels,
                image_opts: ImageOptions) -> Sample:
    check_listed(src)
    if labels.by_id is not None and src.id not in labels.by_id:
        raise SampleError(src.path, f"no label for id {src.id!r} in the labels file")
    fields, nbytes_in = read_sample(fs, kind, src, image_opts)
    return Sample(src.id, labels.get(src.id), fields, nbytes_in)


def ordered_map(fn: Callable, items: Iterable, workers: int, window_per_worker: int = 4) -> Iterator:
    """fn(item) for each item, in order, ``workers`` at a time; exceptions are returned, not raised."""

    def call(item):
        try:
            return fn(item)
        except Exception as exc:  # handed to the consumer in order
            return exc

    pending: deque = deque()
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
    """Fixes each field's dtype and shape from the first valid sample; rejects samples that differ."""

    def __init__(self, kind: str, image_opts: ImageOptions, specs: list[FieldSpec] | None = None,
                 first_id: str | None = None):
        """``specs``/``first_id``: fields already fixed elsewhere (a Spark task holds its samples
        to what the driver's first sample fixed); None: the first checked sample fixes them."""
        self.kind = kind
        self.image_opts = image_opts
        self.specs = None if specs is None else list(specs)
        self.first_id = first_id

    def _spec(self, name: str, value) -> FieldSpec:
        encoding = field_encoding(self.kind, self.image_opts) if self.kind == IMAGE else RAW
        if encoding != RAW:
            shape = None
            if self.image_opts.resize is not None:
                channels = 1 if self.image_opts.mode == "L" else len(self.image_opts.mode)
                shape = (*self.image_opts.resize, channels)
            return FieldSpec(name, encoded_dtype(value), shape, encoding)
        return FieldSpec(name, value.dtype.name, tuple(value.shape), RAW)

    def check(self, path: str, sample: Sample) -> None:
        specs = [self._spec(name, value) for name, value in sample.fields.items()]
        if self.specs is None:
            self.specs, self.first_id = specs, sample.id
            return
        names, expected = [s.name for s in specs], [s.name for s in self.specs]
        if names != expected:
            raise SampleError(path, f"arrays {names} differ from {expected} of the first sample {self.first_id!r}")
        for got, want in zip(specs, self.specs):
            if got.dtype != want.dtype:
                raise SampleError(path, f"{got.name!r} has dtype {got.dtype}, but the first sample {self.first_id!r} "
                                        f"has {want.dtype}")
            if got.shape != want.shape:
                hint = "; use --resize HxW to store images of different sizes" if self.kind == IMAGE else ""
                raise SampleError(path, f"{got.name!r} has shape {got.shape}, but the first sample {self.first_id!r} "
                                        f"has {want.shape}{hint}")
