"""``trainfeed.convert``: a small-file dataset in, one compacted store out (the ``convert`` CLI's engine)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trainfeed.converters.convert import ConvertConfig
from trainfeed.converters.convert import convert as _convert
from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.options import WriteOptions, parse_size
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions
from trainfeed.converters.sources.labels import parse_classes
from trainfeed.converters.storage.clouds import StorageOptions

WritableFormat = Literal["parquet", "delta", "hdf5"]
Mode = Literal["create", "overwrite", "append"]


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote (the ``convert --json`` summary, typed); format-specific extras in ``details``."""

    format: str
    output: str
    source: str
    mode: str
    samples: int
    rejected: int
    rejects_report: str | None
    files_in: int
    files_out: int
    bytes_in: int
    bytes_out: int
    payload_bytes: int
    seconds: float
    mb_per_s: float | None
    workers: int
    compression: str
    labels: str
    label_map: dict[str, int] | None
    labels_unmatched: int
    ignored_files: int
    depth_changed: int  # images taken at another bit depth (reduce_depth, promote_depth)
    dtypes_found: list[str] | None  # dtype="auto": the files' dtypes, stored as the fields' dtype
    warnings: list[str]  # what the caller should look at (a shape that looks channels-first)
    fields: list[dict[str, Any]]
    store_id: str
    verified: dict[str, Any] | None
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> ConvertResult:
        named = {f.name for f in dataclasses.fields(cls)} - {"details"}
        return cls(**{k: v for k, v in summary.items() if k in named},
                   details={k: v for k, v in summary.items() if k not in named})


def convert(src: str, dst: str, *, format: WritableFormat, labels: str | None = None,
            storage_options: StorageOptions | None = None, mode: Mode = "create",
            compression: str | None = None, compression_level: int | None = None,
            target_file_size: int | str = "128MB", row_group_size: int | str = "32MB",
            hdf5_chunk_size: int | str = "1MB", tensor_column: Literal["binary", "list"] = "binary",
            resize: tuple[int, int] | None = None, image_storage: Literal["encoded", "decoded"] = "encoded",
            image_mode: Literal["RGB", "L"] = "RGB", reduce_depth: bool = False, promote_depth: bool = False,
            ragged: bool = False, dtype: str | None = None, channels: Literal["first", "last"] | None = None,
            folder_labels: bool = True, classes: Sequence[str] | None = None, workers: int = 0,
            on_error: Literal["fail", "skip"] = "fail", verify: bool = False) -> ConvertResult:
    """Convert the small files at ``src`` (a folder or fsspec URL) into a ``format`` store at ``dst``.

    The options are the ``convert`` CLI's (``convert --help``); sizes take bytes or text such
    as ``"64MiB"``. Nothing appears at ``dst`` unless the whole store was written (and, with
    ``verify``, compared bit for bit with its source). Labels: the ``labels`` CSV (id,label),
    else ``src``/labels.csv when it exists, else class subfolder names (``folder_labels=False``:
    none from ``src`` itself, as ``--no-folder-labels``); class names are numbered in sorted order,
    or in the order of ``classes``. Raises ``TrainfeedError``
    (``UsageError`` for options that cannot work)."""
    if image_mode not in ("RGB", "L"):
        raise UsageError(f"image_mode must be RGB or L, not {image_mode!r}")
    from trainfeed.converters.sources.labels import labels_in_source

    default_codec = getattr(FORMATS.get(format), "DEFAULT_COMPRESSION", "none")  # unknown format: check_config says so
    write = WriteOptions(
        target_file_size=parse_size(target_file_size, "target_file_size"),
        row_group_size=parse_size(row_group_size, "row_group_size"),
        compression=compression or default_codec, compression_level=compression_level,
        hdf5_chunk_size=parse_size(hdf5_chunk_size, "hdf5_chunk_size"), mode=mode, tensor_column=tensor_column)
    cfg = ConvertConfig(src=src, dst=dst, fmt=format, write=write,
                        image=ImageOptions(resize=resize, storage=image_storage, mode=image_mode,
                                           reduce_depth=reduce_depth, promote_depth=promote_depth),
                        arrays=ArrayOptions(ragged=ragged, dtype=dtype, channels=channels),
                        labels_csv=labels or (labels_in_source(src, dict(storage_options or {})) if folder_labels
                                              else None),
                        folder_labels=folder_labels, classes=parse_classes(classes),
                        workers=workers or 0,
                        on_error=on_error, verify=verify, storage_options=dict(storage_options or {}))
    try:
        return ConvertResult.from_summary(_convert(cfg))
    except TrainfeedError as exc:
        exc.args = (in_api_words(str(exc)),)  # the same exception (its type and attributes), reworded
        raise


#: The CLI's words for what an API caller writes as a keyword argument, in messages the
#: conversion shares with the `convert` CLI.
_API_WORDS = (("pass --overwrite", 'pass mode="overwrite"'), ("or --mode append", 'or mode="append"'),
              ("--mode append", 'mode="append"'), ("--overwrite", 'mode="overwrite"'),
              ("--no-folder-labels", "folder_labels=False"), ("--labels CSV", "labels=CSV"),
              ("--on-error skip", 'on_error="skip"'), ("--resize HxW", "resize=(H, W)"),
              ("--reduce-depth", "reduce_depth=True"), ("--image-mode L", 'image_mode="L"'),
              ("--image-storage encoded", 'image_storage="encoded"'), ("no --resize", "no resize"),
              ("--promote-depth", "promote_depth=True"), ("--ragged", "ragged=True"), ("--dtype ", "dtype="),
              ("--channels first", 'channels="first"'), ("--channels last", 'channels="last"'))


def in_api_words(message: str) -> str:
    """A conversion message with the fix named as the API spells it."""
    for cli, api in _API_WORDS:
        message = message.replace(cli, api)
    return message
