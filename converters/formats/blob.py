"""The small-file layout (a folder of .npy, .npz, JPEG or PNG files, local or any fsspec URL)
read in place, without converting it: the baseline every store is compared with. Read-only:
``convert`` takes this layout as its source. One piece per file. ``BLOB`` is the registry's blob
format."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
import numpy as np

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.interface import Columns, Empty, Format, OpenFiles, Pieces, Where, pick_field
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.layout import DatasetSchema
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions
from trainfeed.converters.sources.dtypes import AUTO, lossless_cast
from trainfeed.converters.sources.labels import Labels, labels_in_source, resolve_labels
from trainfeed.converters.sources.listing import IMAGE, SourceFile, list_source, read_bytes
from trainfeed.converters.sources.samples import SchemaGuard, load_sample, scan_dtype
from trainfeed.converters.storage.fetch import CachingFileSystem, open_fetcher
from trainfeed.converters.storage.filesystems import is_local
from trainfeed.converters.storage.location import locate

UNIT = "files"


@dataclass(frozen=True, kw_only=True)
class FilePieces(Pieces[SourceFile]):
    """The sample files, one piece each, and what reading one needs: the filesystem they are
    on, their kind (arrays or images), their labels and the dtype arrays are cast to."""

    fs: fsspec.AbstractFileSystem
    kind: str
    labels: Labels
    cast: str | None


def list_pieces(path: Where, options: OpenOptions) -> FilePieces:
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
    return FilePieces(schema=schema, spec=pick_field(schema, options.field, path), pieces=list(listing.files),
                      rows=[1] * len(listing.files), files=[], fs=fs, kind=listing.kind, labels=labels, cast=cast)


def piece_file(piece: SourceFile) -> str:
    return piece.path


def read_piece(listing: FilePieces, piece: SourceFile, handles: OpenFiles, empty: Empty = np.empty) -> Columns:
    """One file, its arrays cast as ``OpenOptions.cast`` says. An image is its bytes, not decoded
    here: the reader decodes it once (training/reading/images.py)."""
    fs, kind, labels = listing.fs, listing.kind, listing.labels
    label: int | None
    if kind == IMAGE:
        x, label = np.empty(1, object), labels.get(piece.id)
        x[0] = read_bytes(fs, piece)
    else:
        sample = load_sample(fs, kind, piece, labels, ImageOptions())
        value = np.asarray(sample.fields[listing.spec.name])
        if listing.cast is not None:
            value = lossless_cast(piece.path, listing.spec.name, value, listing.cast)
        x, label = value[None], sample.label
    return Columns([piece.id], np.array([-1 if label is None else label], np.int64), x)


def read_labels(listing: FilePieces) -> Iterator[np.ndarray]:
    """One column: each file's label, in piece order (-1 where unlabeled)."""
    labels = listing.labels
    yield np.array([-1 if labels.get(f.id) is None else labels.get(f.id) for f in listing.pieces], np.int64)


# ------------------------------------------------------------------ the registry's format

def _no_store(path: Where) -> bool:
    return False


class Blob(Format[SourceFile, FilePieces]):
    """The small files, read in place (formats/interface.py says what each member is for). Never
    detected: what a path holding no store is read as. ``list_pieces`` takes ``path`` as the
    user gave it (recorded as the schema's source)."""

    name, label, noun = "blob", "small files", "a folder of small files"
    in_place = True
    UNIT = UNIT

    is_store = staticmethod(_no_store)
    written_by_trainfeed = staticmethod(_no_store)
    list_pieces = staticmethod(list_pieces)
    read_piece = staticmethod(read_piece)
    piece_file = staticmethod(piece_file)
    read_labels = staticmethod(read_labels)


BLOB = Blob()
