"""Re-read a written store and compare every sample, bit for bit, with its source file."""
from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import TypeVar

import fsspec
import numpy as np

from trainfeed.converters.errors import VerifyError
from trainfeed.converters.formats.interface import Where
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.sources.decode import (
    IMAGE_FIELD,
    ArrayOptions,
    ImageOptions,
    Sample,
    exact_pixels,
)
from trainfeed.converters.sources.dtypes import cast_fields
from trainfeed.converters.sources.labels import Labels
from trainfeed.converters.sources.listing import IMAGE, Listing, SourceFile, read_bytes
from trainfeed.converters.sources.samples import load_sample, ordered_map

_MAX_REPORTED = 5
T = TypeVar("T")


def same_value(a: np.ndarray | bytes, b: np.ndarray | bytes) -> bool:
    """Exact equality: same dtype, shape and bytes for arrays (NaN payloads included)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return bytes(a) == bytes(b)


def reference_sample(fs: fsspec.AbstractFileSystem, kind: str, src: SourceFile, labels: Labels,
                     image_opts: ImageOptions,
                     arrays: ArrayOptions = ArrayOptions()) -> Sample:
    """The sample the store must hold for ``src``, read again from the source (arrays in the
    ``--dtype`` they were stored in). Images stored decoded and not resized are compared with the
    file's exact pixels, decoded apart from the conversion's own path: a step there that loses
    bits (8-bit clipping of a 16-bit PNG) shows."""
    if kind != IMAGE:
        sample = load_sample(fs, kind, src, labels, image_opts)
        if arrays.dtype is not None:
            sample.fields = cast_fields(src.path, sample.fields, arrays.dtype)
        return sample
    if image_opts.storage != "decoded" or image_opts.resize is not None:
        return load_sample(fs, kind, src, labels, image_opts)
    data = read_bytes(fs, src)
    pixels = exact_pixels(src.path, data, image_opts.mode, image_opts.reduce_depth, image_opts.promote_depth)
    return Sample(src.id, labels.get(src.id), {IMAGE_FIELD: pixels}, len(data))


def _chunks(it: Iterator[T], n: int) -> Iterator[list[T]]:
    while chunk := list(islice(it, n)):
        yield chunk


def verify_store(path: Where, fmt: str, *, fs: fsspec.AbstractFileSystem, listing: Listing, labels: Labels,
                 image_opts: ImageOptions,
                 expected_ids: list[str], exact: bool = True, workers: int = 4,
                 arrays: ArrayOptions = ArrayOptions()) -> dict[str, int]:
    """Raise VerifyError unless every expected id is in the store exactly once with its source's
    label and values. ``exact`` also forbids other rows (False for Delta appends)."""
    by_id = {f.id: f for f in listing.files}
    expected = set(expected_ids)
    seen: set[str] = set()
    problems: list[str] = []
    other_rows = 0
    for chunk in _chunks(FORMATS[fmt].read_samples(path), 64):
        mine = [row for row in chunk if row[0] in expected]
        other_rows += len(chunk) - len(mine)
        sources = ordered_map(lambda row: reference_sample(fs, listing.kind, by_id[row[0]], labels, image_opts,
                                                           arrays), mine, workers)
        for (sid, label, fields), src in zip(mine, sources):
            if sid in seen:
                problems.append(f"{sid}: stored more than once")
                continue
            seen.add(sid)
            if isinstance(src, Exception):
                problems.append(f"{by_id[sid].path}: source no longer readable: {src}")
                continue
            if label != src.label:
                problems.append(f"{sid}: label {label!r} in store, {src.label!r} from source")
            if set(fields) != set(src.fields):
                problems.append(f"{sid}: fields {sorted(fields)} in store, {sorted(src.fields)} from source")
                continue
            for name, value in fields.items():
                if not same_value(value, src.fields[name]):
                    problems.append(f"{sid}: field {name!r} differs from {by_id[sid].path}")
    missing = expected - seen
    if missing:
        problems.append(f"{len(missing)} samples missing from the store, e.g. {sorted(missing)[:3]}")
    if exact and other_rows:
        problems.append(f"{other_rows} rows in the store do not come from this source")
    if problems:
        shown = "\n  ".join(problems[:_MAX_REPORTED])
        more = f"\n  ... and {len(problems) - _MAX_REPORTED} more" if len(problems) > _MAX_REPORTED else ""
        raise VerifyError(f"{getattr(path, 'shown', path)}: verification failed:\n  {shown}{more}")
    return {"samples_checked": len(seen), "other_rows": other_rows}
