"""`convert SRC DST --to parquet|delta|hdf5`: the command line around converters.convert."""
from __future__ import annotations

from enum import Enum
from typing import List, Optional

import typer

from trainfeed.converters.convert import ConvertConfig, convert, default_workers
from trainfeed.converters.errors import UsageError, exit_codes
from trainfeed.converters.formats.options import WriteOptions, parse_size
from trainfeed.converters.formats.registry import FORMATS, WRITABLE
from trainfeed.converters.layout import CHANNELS
from trainfeed.converters.progress import progress_bar
from trainfeed.converters.redact import redact, redact_json
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions, parse_resize
from trainfeed.converters.sources.labels import labels_in_source, parse_classes
from trainfeed.converters.storage.config import parse_storage_options

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


# the registry's writable formats (members made at run time, which mypy cannot follow)
Format = Enum("Format", {name: name for name in WRITABLE}, type=str)  # type: ignore[misc]
_CODECS = ". ".join(f"{name}: {', '.join(FORMATS[name].COMPRESSIONS)}" for name in WRITABLE)
_LEVELS = ". ".join(f"{name}: " + ", ".join(f"{codec} {lo}-{hi}" for codec, (lo, hi) in
                                            FORMATS[name].COMPRESSION_LEVELS.items()) for name in WRITABLE)


class Mode(str, Enum):
    create = "create"
    overwrite = "overwrite"
    append = "append"


class OnError(str, Enum):
    fail = "fail"
    skip = "skip"


class TensorColumn(str, Enum):
    binary = "binary"
    list = "list"


class ImageStorage(str, Enum):
    encoded = "encoded"
    decoded = "decoded"


#: ``--channels`` of convert, train and storage-bench.
Channels = Enum("Channels", {c: c for c in CHANNELS}, type=str)  # type: ignore[misc]  # functional Enum API


def _human_summary(s: dict, resized: bool = False, found: str | None = None) -> str:
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
    to: Format = typer.Option(..., "--to", help="Target format."),
    labels: Optional[str] = typer.Option(None, "--labels", help="CSV with columns id,label; id is the file's path "
                                         "relative to SRC without extension (e.g. pos/vol_0001). Default: "
                                         "SRC/labels.csv when it exists (as `storage-bench run` does; the summary "
                                         "says so), else class subfolder names when every file is in one, else "
                                         "unlabeled."),
    classes: Optional[str] = typer.Option(None, "--classes", help="Class names in label order, joined by commas "
                                          "(e.g. neg,pos): labels that are class names (CSV or subfolders) are "
                                          "numbered so, not in sorted order; a held-out set missing a class then "
                                          "gets the training set's numbers. A name not listed is an error."),
    no_folder_labels: bool = typer.Option(False, "--no-folder-labels", help="Take no labels from SRC itself: "
                                          "neither SRC/labels.csv nor class subfolder names (--labels still "
                                          "applies)."),
    resize: Optional[str] = typer.Option(None, "--resize", help="Resize images once, at conversion, to HEIGHTxWIDTH "
                                         "(e.g. 64x64). Default: keep the original size."),
    image_storage: ImageStorage = typer.Option(ImageStorage.encoded, "--image-storage",
                                               help="encoded: keep JPEG/PNG bytes (small store, decode at read time). "
                                                    "decoded: store pixel arrays, uint8 (uint16 for 16-bit greyscale "
                                                    "PNGs, with --image-mode L) (larger store, no decode cost when "
                                                    "training)."),
    image_mode: str = typer.Option("RGB", "--image-mode", help="PIL mode images are converted to when decoded or "
                                   "resized: RGB or L (grayscale)."),
    reduce_depth: bool = typer.Option(False, "--reduce-depth", help="Take a 16-bit image that cannot keep its "
                                      "bits (a colour PNG decoded or resized, a grayscale one under --image-mode "
                                      "RGB) at 8 bits per channel instead of refusing it: greyscale scaled by the "
                                      "image's own maximum (a 12-bit CT slice keeps 256 grey levels, not 16), "
                                      "colour as Pillow decodes it (each value's high byte); the summary counts "
                                      "the images changed."),
    promote_depth: bool = typer.Option(False, "--promote-depth", help="With --image-mode L: store 8-bit greyscale "
                                       "images as 16-bit (each value x 257, exact: value // 257 gives it back), so "
                                       "a folder mixing 8- and 16-bit greyscale images keeps every bit (encoded: "
                                       "they are re-encoded as 16-bit PNG); the summary counts the images changed."),
    ragged: bool = typer.Option(False, "--ragged", help="Arrays (.npy, .npz): keep each sample in its own shape "
                                "(stored beside it; docs/LAYOUT.md) instead of refusing a sample whose shape "
                                "differs from the first one's. Reading batches them as you choose: --fit in "
                                "train, fit= in the API."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Arrays: store every sample as this numpy dtype "
                                        "(e.g. int32 for int16 beside uint16 samples); a sample with a value the "
                                        "dtype cannot hold exactly is refused, naming its file. auto (.npy): the "
                                        "smallest dtype that holds every file's dtype exactly, found in their "
                                        "headers first (one short read each). Default: the first sample's dtype, "
                                        "and a sample of another is refused with the dtype that holds both."),
    channels: Optional[Channels] = typer.Option(None, "--channels", help="Arrays: where the channel axis is, "
                                                "recorded in the store: last (H, W, C) or (X, Y, Z, C), what "
                                                "trainfeed's models take and the default; or first (C, H, W), "
                                                "PyTorch's order, which `train` moves to the end. Without it, a "
                                                "shape that looks channels-first gets a warning."),
    target_file_size: str = typer.Option("128MB", "--target-file-size", help="Approximate size of each output file "
                                         "(Parquet part, Delta file, HDF5 shard)."),
    row_group_size: str = typer.Option("32MB", "--row-group-size", help="Approximate uncompressed size of a Parquet "
                                       "row group (the unit a Petastorm worker reads)."),
    tensor_column: TensorColumn = typer.Option(TensorColumn.binary, "--tensor-column", help="parquet/delta: how a "
                                               "tensor is stored. binary: its little-endian bytes (fastest to write "
                                               "and read). list: an array of numbers (what Spark and DuckDB show as "
                                               "arrays; about 2-3x slower to read; not for float16)."),
    compression: Optional[str] = typer.Option(None, "--compression", help=f"{_CODECS}. Default none: float tensors "
                                              "and JPEG bytes hardly compress and a codec costs throughput; "
                                              "use zstd for data that does (masks, integer CT, pixels)."),
    compression_level: Optional[int] = typer.Option(None, "--compression-level", help=f"Codec level. {_LEVELS}; "
                                                    "other codecs take no level."),
    hdf5_chunk_size: str = typer.Option("1MB", "--hdf5-chunk-size", help="Approximate HDF5 chunk size; chunks span "
                                        "whole samples along the first axis."),
    mode: Mode = typer.Option(Mode.create, "--mode", help="create: refuse an existing DST. overwrite: replace, "
                              "atomically, a store trainfeed wrote (or an empty folder); anything else at DST is "
                              "refused and left untouched. append: add, in one commit, to a Delta table trainfeed "
                              "wrote (or create it where DST does not exist): the fields and the kind of labels "
                              "must match; a class the table knows keeps its number, a new class gets the next "
                              "free number; ids already in the table are rejected (--on-error decides whether "
                              "that stops the run), and an id another writer added meanwhile fails the run with "
                              "nothing appended."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Same as --mode overwrite: replaces only a store "
                                   "trainfeed wrote, or an empty folder."),
    workers: int = typer.Option(0, "--workers", help="Parallel readers/decoders. 0 = auto: one per CPU core for a "
                                "local source, 16 for a remote one (reads there wait on the network)."),
    on_error: OnError = typer.Option(OnError.fail, "--on-error", help="fail: stop at the first bad file and write "
                                     "nothing. skip: convert the valid files and list the others in "
                                     "DST.rejects.jsonl."),
    verify: bool = typer.Option(False, "--verify", help="Re-read the whole store and compare every sample with its "
                                "source before publishing it; exit 1 on any difference. On object storage the "
                                "store is read back from there: a Parquet or Delta store once committed (a failed "
                                "check puts the previous store back), an HDF5 file under a hidden name first."),
    optimize: bool = typer.Option(False, "--optimize", help="delta: compact small files (OPTIMIZE) after writing."),
    vacuum_hours: Optional[int] = typer.Option(None, "--vacuum-hours", help="delta: delete files unreferenced for "
                                               "this many hours, 0 or more (0 drops time travel to older "
                                               "versions, and removes the parts a killed run left)."),
    storage_option: List[str] = typer.Option([], "--storage-option", help="KEY=VALUE passed to fsspec for SRC, "
                                             "--labels and DST (e.g. account_name=..., connection_string=..., "
                                             "key=..., secret=..., endpoint_url=...); a Delta DST gets the same "
                                             "credentials in delta-rs's names. "
                                             "Repeatable. Credentials also come from the usual environment variables. "
                                             "call_timeout=SECONDS is trainfeed's own: the longest one call to a "
                                             "remote store (folder check, one file's read, the labels file) may "
                                             "take, retries included (default 30; 0: no limit)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object with the results instead of the "
                                 "summary."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
) -> None:
    with exit_codes("interrupted: nothing was published at the destination"):
        options = parse_storage_options(storage_option)
        found = None if labels or no_folder_labels else labels_in_source(src, options)
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
            labels_csv=labels, classes=parse_classes(classes), folder_labels=not no_folder_labels,
            workers=workers or default_workers(src), on_error=on_error.value,
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
