"""`convert SRC DST --to parquet|delta|hdf5`: the command line around converters.convert."""
from __future__ import annotations

from enum import Enum, StrEnum
from typing import Any

import typer

from trainfeed.converters.convert import ConvertConfig, convert
from trainfeed.converters.errors import UsageError, exit_codes
from trainfeed.converters.formats.options import WriteOptions, parse_size
from trainfeed.converters.formats.registry import FORMATS, WRITABLE
from trainfeed.converters.layout import CHANNELS
from trainfeed.converters.option_docs import cli_option
from trainfeed.converters.progress import progress_bar
from trainfeed.converters.redact import redact, redact_json
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions, parse_resize
from trainfeed.converters.sources.labels import labels_in_source, parse_classes
from trainfeed.converters.storage.config import parse_storage_options

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


# the registry's writable formats (members made at run time, which mypy cannot follow)
WritableFormatName = Enum("WritableFormatName", {name: name for name in WRITABLE}, type=str)  # type: ignore[misc]
_CODECS = ". ".join(f"{name}: {', '.join(FORMATS[name].COMPRESSIONS)}" for name in WRITABLE)
_LEVELS = ". ".join(f"{name}: " + ", ".join(f"{codec} {lo}-{hi}" for codec, (lo, hi) in
                                            FORMATS[name].COMPRESSION_LEVELS.items()) for name in WRITABLE)


class Mode(StrEnum):
    create = "create"
    overwrite = "overwrite"
    append = "append"


class OnError(StrEnum):
    fail = "fail"
    skip = "skip"


class TensorColumn(StrEnum):
    binary = "binary"
    list = "list"


class ImageStorage(StrEnum):
    encoded = "encoded"
    decoded = "decoded"


#: ``--channels`` of convert, train and storage-bench.
Channels = Enum("Channels", {c: c for c in CHANNELS}, type=str)  # type: ignore[misc]  # functional Enum API


def _human_summary(s: dict[str, Any], resized: bool = False, found: str | None = None) -> str:
    """The summary; ``resized``: --resize was given; ``found``: the labels CSV taken from SRC."""
    mb = 1e6
    lines = [
        f"{s['format']} store written: {s['output']}",
        f"  samples   {s['samples']:,} converted, {s['rejected']:,} rejected"
        + (f" (see {s['rejects_report']})" if s["rejects_report"] else ""),
        f"  files     {s['files_in']:,} in -> {s['files_out']:,} out",
        f"  bytes     {s['bytes_in'] / mb:,.1f} MB in -> {s['bytes_out'] / mb:,.1f} MB out ({s['compression']})",
        f"  time      {s['seconds']:.1f} s, {s['mb_per_s'] or 0:,.1f} MB/s with {s['workers']} workers",
        f"  labels    {s['labels']}" + (f", {len(s['label_map'])} classes" if s["label_map"] else "")
        + (f" from {found} (found in SRC; --labels CSV takes another, --no-folder-labels none)" if found else "")
        + (" (no SRC/labels.csv, no class subfolders; `train` needs labels: add them with --labels CSV)"
           if s["labels"] == "none" else ""),
    ]
    ragged = [f["name"] for f in s["fields"] if f["encoding"] == "raw" and f["shape"] is None]
    if ragged:
        lines.append(f"  ragged    {', '.join(ragged)}: each sample kept in its own shape (read with a --fit)")
    if s["dtypes_found"] and len(s["dtypes_found"]) > 1:
        lines.append(f"  dtype     {', '.join(s['dtypes_found'])} stored as {s['fields'][0]['dtype']} "
                     "(--dtype auto: holds each exactly)")
    if s["depth_changed"]:
        lines.append(f"  depth     {s['depth_changed']:,} images stored at another bit depth than their own "
                     "(--reduce-depth, --promote-depth)")
    lines += [f"  warning   {w}" for w in s["warnings"]]
    if s.get("verified"):
        lines.append(f"  verified  {s['verified']['samples_checked']:,} samples identical to their source files"
                     + (" after the same decode and resize" if resized else ""))
    if "version" in s:
        lines.append(f"  delta     table version {s['version']}")
    return "\n".join(lines)


@app.command(help="Repack a folder of small sample files (.npy, .npz, JPEG/PNG; local path or fsspec URL "
                  "such as abfs://container/path) into one compacted Parquet, Delta Lake or HDF5 store, on local "
                  "disk or straight onto object storage (DST a URL). "
                  "The store appears at DST only when complete; nothing is left behind on failure. "
                  "Only a store trainfeed wrote is ever replaced or appended to; SRC and DST must not overlap. "
                  "Local DST: one run at a time (a second run on the same DST fails at once; lock file "
                  ".DST.trainfeed-lock beside it). DST on object storage: data files first, then the commit "
                  "record (Delta log entry, or the _trainfeed.json manifest), so readers see the old store or the "
                  "new one; concurrent runs to one URL are not serialized there (the last commit wins). "
                  "Exit codes: 0 ok, 1 data or runtime error, 2 usage error.")
def main_command(
    src: str = typer.Argument(..., help="Source folder: local path or fsspec URL (abfs://, az://, s3://, gs://)."),
    dst: str = typer.Argument(..., help="Output store: a local path or a URL (abfs://, az://, abfss://, s3://, "
                                        "gs://). For hdf5, a name ending in .h5/.hdf5 gives one file, anything "
                                        "else a folder of shards."),
    to: WritableFormatName = typer.Option(..., "--to", help="Target format."),
    labels: str | None = cli_option(ConvertConfig, "labels_csv"),
    classes: str | None = cli_option(ConvertConfig, "classes", help_suffix=" Joined by commas."),
    folder_labels: bool = cli_option(ConvertConfig, "folder_labels"),
    resize: str | None = cli_option(ImageOptions, "resize"),
    image_storage: ImageStorage = cli_option(ImageOptions, "storage"),
    image_mode: str = cli_option(ImageOptions, "mode"),
    reduce_depth: bool = cli_option(ImageOptions, "reduce_depth"),
    promote_depth: bool = cli_option(ImageOptions, "promote_depth"),
    ragged: bool = cli_option(ArrayOptions, "ragged"),
    dtype: str | None = cli_option(ArrayOptions, "dtype"),
    channels: Channels | None = cli_option(ArrayOptions, "channels"),
    target_file_size: str = cli_option(WriteOptions, "target_file_size"),
    row_group_size: str = cli_option(WriteOptions, "row_group_size"),
    tensor_column: TensorColumn = cli_option(WriteOptions, "tensor_column"),
    compression: str | None = cli_option(WriteOptions, "compression", default=None, help_suffix=f" {_CODECS}."),
    compression_level: int | None = cli_option(WriteOptions, "compression_level", help_suffix=f" {_LEVELS}."),
    hdf5_chunk_size: str = cli_option(WriteOptions, "hdf5_chunk_size"),
    mode: Mode = cli_option(WriteOptions, "mode"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Same as --mode overwrite: replaces only a store "
                                   "trainfeed wrote, or an empty folder."),
    workers: int = cli_option(ConvertConfig, "workers"),
    on_error: OnError = cli_option(ConvertConfig, "on_error"),
    verify: bool = cli_option(ConvertConfig, "verify"),
    optimize: bool = cli_option(ConvertConfig, "optimize"),
    vacuum_hours: int | None = cli_option(ConvertConfig, "vacuum_hours"),
    storage_option: list[str] = cli_option(ConvertConfig, "storage_options", default=[], help_suffix=(
        " KEY=VALUE, once per setting.")),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the results instead of the "
                                 "summary."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
) -> None:
    with exit_codes("interrupted: nothing was published at the destination"):
        options = parse_storage_options(storage_option)
        found = None if labels or not folder_labels else labels_in_source(src, options)
        labels = labels or found
        cfg = ConvertConfig(
            src=src, dst=dst, fmt=to.value,
            write=WriteOptions(
                target_file_size=parse_size(target_file_size, "--target-file-size"),
                row_group_size=parse_size(row_group_size, "--row-group-size"),
                compression=compression or FORMATS[to.value].DEFAULT_COMPRESSION,
                compression_level=compression_level,
                hdf5_chunk_size=parse_size(hdf5_chunk_size, "--hdf5-chunk-size"),
                mode=Mode.overwrite.value if overwrite else mode.value,
                tensor_column=tensor_column.value,
            ),
            image=ImageOptions(resize=parse_resize(resize), storage=image_storage.value, mode=image_mode.upper(),
                               reduce_depth=reduce_depth, promote_depth=promote_depth),
            arrays=ArrayOptions(ragged=ragged, dtype=dtype, channels=channels.value if channels else None),
            labels_csv=labels, classes=parse_classes(classes), folder_labels=folder_labels,
            workers=workers, on_error=on_error.value,
            verify=verify, optimize=optimize, vacuum_hours=vacuum_hours,
            storage_options=options,
        )
        if overwrite and mode == Mode.append:
            raise UsageError("--overwrite and --mode append contradict each other")
        if cfg.image.mode not in ("RGB", "L"):
            raise UsageError(f"--image-mode must be RGB or L, not {image_mode!r}")
        with progress_bar(enabled=progress, label=f"convert -> {to.value}") as bar:
            summary = convert(cfg, progress=bar.update, on_listed=bar.start)
    typer.echo(redact_json(summary) if as_json else redact(_human_summary(summary, resized=bool(resize), found=found)))


def main() -> None:
    app(prog_name="convert")


if __name__ == "__main__":
    main()
