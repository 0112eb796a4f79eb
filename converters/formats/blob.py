"""The small-file layout (a folder of .npy, .npz, JPEG or PNG files, local or any fsspec URL)
read in place, without converting it: the baseline every store is compared with. Read-only:
``convert`` takes this layout as its source. One piece per file. ``BLOB`` is the registry's blob
format."""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.interface import Empty, Format, Where
from trainfeed.converters.formats.options import Columns, OpenOptions, Pieces, pick_field
from trainfeed.converters.layout import DatasetSchema
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions
from trainfeed.converters.sources.dtypes import AUTO, lossless_cast
from trainfeed.converters.sources.labels import labels_in_source, resolve_labels
from trainfeed.converters.sources.listing import IMAGE, SourceFile, list_source, read_bytes
from trainfeed.converters.sources.samples import SchemaGuard, load_sample, scan_dtype
from trainfeed.converters.storage.fetch import CachingFileSystem, open_fetcher
from trainfeed.converters.storage.filesystems import is_local
from trainfeed.converters.storage.location import locate

UNIT = "files"


def list_pieces(path: Where, options: OpenOptions) -> Pieces:
    """Every sample file, sorted by id; the schema from the first file, labels as convert takes
    them: ``options.labels``, else SRC/labels.csv when there is one, else class subfolders."""
    fs, listing = list_source(str(path), options.storage_options)
    labels_csv = options.labels or labels_in_source(str(path), options.storage_options)
    if not is_local(fs):  # reads share the connection budget (and the disk cache, if any)
        fs = CachingFileSystem(open_fetcher(locate(str(path), options.storage_options), options.io_concurrency,
                                            options.cache_dir, options.cache_limit,
                                            {f.path: f.identity for f in listing.files if f.identity}))
    labels = resolve_labels(listing.files, labels_csv=labels_csv, storage_options=options.storage_options,
                            classes=options.classes)
    if labels.missing:
        raise TrainfeedError(f"{path}: {len(labels.missing)} files have no label in {labels_csv}, "
                             f"e.g. {labels.missing[0]!r}")
    cast = options.cast
    if cast == AUTO:  # every file's header first: the one dtype that holds them all
        cast, _ = scan_dtype(fs, listing, str(path), options.io_concurrency)
    guard = SchemaGuard(listing.kind, ImageOptions(), arrays=ArrayOptions(dtype=cast))
    guard.take(listing.files[0].path, load_sample(fs, listing.kind, listing.files[0], labels, ImageOptions()))
    assert guard.specs is not None  # the first file fixed them
    schema = DatasetSchema(fields=guard.specs, labeled=labels.by_id is not None, label_map=labels.label_map,
                           source=str(path), samples=len(listing.files))
    return Pieces(schema, pick_field(schema, options.field, path), list(listing.files), [1] * len(listing.files),
                  [], extra={"fs": fs, "kind": listing.kind, "labels": labels, "cast": cast})


def piece_file(piece: SourceFile) -> str:
    return piece.path


def read_piece(listing: Pieces, piece: SourceFile, handles: dict[Any, Any], empty: Empty = np.empty) -> Columns:
    """One file, its arrays cast as ``OpenOptions.cast`` says. An image is its bytes, not decoded
    here: the reader decodes it once (training/reading/images.py)."""
    fs, kind, labels = listing.extra["fs"], listing.extra["kind"], listing.extra["labels"]
    if kind == IMAGE:
        x, label = np.empty(1, object), labels.get(piece.id)
        x[0] = read_bytes(fs, piece)
    else:
        sample = load_sample(fs, kind, piece, labels, ImageOptions())
        value = np.asarray(sample.fields[listing.spec.name])
        if listing.extra["cast"] is not None:
            value = lossless_cast(piece.path, listing.spec.name, value, listing.extra["cast"])
        x, label = value[None], sample.label
    return Columns([piece.id], np.array([-1 if label is None else label], np.int64), x)


def read_labels(listing: Pieces) -> Iterator[np.ndarray]:
    labels = listing.extra["labels"]
    yield np.array([-1 if labels.get(f.id) is None else labels.get(f.id) for f in listing.pieces], np.int64)


# ------------------------------------------------------------------ the registry's format

class Blob(Format):
    """The small files, read in place (formats/interface.py says what each member is for). Never
    detected: what a path holding no store is read as."""

    name, label, noun = "blob", "small files", "a folder of small files"
    in_place = True
    UNIT = UNIT

    def is_store(self, path: Where) -> bool:
        return False

    def written_by_trainfeed(self, path: Where) -> bool:
        return False

    def list_pieces(self, path: Where, options: OpenOptions) -> Pieces:
        """``path`` as the user gave it (recorded as the schema's source)."""
        return list_pieces(path, options)

    def read_piece(self, listing: Pieces, piece: Any, handles: dict[Any, Any], empty: Empty = np.empty) -> Columns:
        return read_piece(listing, piece, handles, empty)

    def piece_file(self, piece: Any) -> str:
        return piece_file(piece)

    def read_labels(self, listing: Pieces) -> Iterator[np.ndarray]:
        return read_labels(listing)


BLOB = Blob()
