"""`train --data STORE`: train the 3D (volumes) or 2D (images) ResNet-18 from any layout and
account for every step. Also `python -m trainfeed.training`."""
from __future__ import annotations

import math
from enum import Enum
from typing import List, Optional

import typer

from trainfeed.converters.cli import Channels
from trainfeed.converters.errors import exit_codes
from trainfeed.converters.formats.foreign import ENCODINGS, foreign_schema
from trainfeed.converters.formats.options import parse_size
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.layout import SUPPORTED_DTYPES
from trainfeed.converters.redact import redact, redact_json
from trainfeed.converters.sources.decode import parse_resize
from trainfeed.converters.sources.labels import parse_classes
from trainfeed.converters.storage.config import parse_storage_options
from trainfeed.training.config import TrainConfig
from trainfeed.training.reading.readers import POOLS

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


class Framework(str, Enum):
    torch = "torch"
    tf = "tf"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


# the registries' names as choices (members made at run time, which mypy cannot follow)
Fmt = Enum("Fmt", {name: name for name in FORMATS}, type=str)  # type: ignore[misc]
Pool = Enum("Pool", {name: name for name in POOLS}, type=str)  # type: ignore[misc]
TensorEncoding = Enum("TensorEncoding", {name: name for name in ENCODINGS}, type=str)  # type: ignore[misc]
Dtype = Enum("Dtype", {name: name for name in SUPPORTED_DTYPES}, type=str)  # type: ignore[misc]


def _sig(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures, fixed notation, thousands separated: 189, 0.194, 12,300."""
    if not x:
        return "0"
    places = digits - 1 - math.floor(math.log10(abs(x)))
    return f"{round(x, places):,.{max(0, places)}f}"


def _duration(seconds: float | None) -> str:
    """A duration in a unit that suits it: "0.1 ms", "254 ms", "12.3 s", "4.5 min", "2.1 h"."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{_sig(seconds * 1e3, 1 if seconds < 1e-3 else 3)} ms"
    if seconds < 120:
        return f"{_sig(seconds)} s"
    return f"{_sig(seconds / 60)} min" if seconds < 7200 else f"{_sig(seconds / 3600)} h"


def _throughput(samples_per_s: float | None, mb_per_s: float | None) -> str:
    """Samples/s and the bytes delivered, in MB/s, or kB/s below 1 MB/s."""
    if not samples_per_s:
        return "-"
    data = "-" if mb_per_s is None else (f"{_sig(mb_per_s)} MB/s" if mb_per_s >= 1 else f"{_sig(mb_per_s * 1e3)} kB/s")
    return f"{_sig(samples_per_s)} samples/s, {data} delivered"


def _num(value: float | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def _human(s: dict) -> str:
    util = s.get("utilization", {})
    threads = s.get("torch_threads")
    lines = [
        f"trained {s['framework']} on {s['device']} from {s['format']} store {s['store']}"
        + (f" (version {s['delta_version']})" if s.get("delta_version") is not None else ""),
        f"  steps        {s['steps']} ({s['steps_measured']} measured after {s['warmup_steps']} warm-up), "
        f"batch {s['batch_size']}",
        f"  throughput   {_throughput(s['samples_per_s'], s['mb_per_s'])}",
        f"  time         data wait {_duration(s['data_wait_s'])} + compute {_duration(s['compute_s'])} "
        f"(stall {100 * (s['stall_fraction'] or 0):.1f}%, AU {100 * (s['au'] or 0):.1f}%)",
        f"  machine      CPU {_num(util.get('cpu_percent_mean'), '.0f')}%, "
        f"RSS max {_num(util.get('rss_mb_max'), ',.0f')} MB",
    ]
    if threads:
        lines.append(f"  threads      torch intra-op {threads['intra_op']} ({threads['how']}: "
                     f"{threads['cores']} cores, reader threads {threads['reader_workers']}; OMP_NUM_THREADS chooses)")
    lines.append(f"  accuracy     train {_percent(s.get('train_accuracy'))}"
                 + (f", eval {_percent(s['eval']['accuracy'])}" if s.get("eval") else ""))
    if s.get("preempted"):
        lines.append("  preempted    by SIGTERM: checkpoint saved; rerun with --resume")
    return "\n".join(lines)


@app.command(help="Train the ResNet-18 (3D for (X, Y, Z, C) volume stores, 2D for (H, W, C) or greyscale (H, W) "
                  "image stores; encoded JPEG/PNG images are decoded while reading) from a Parquet, Delta, HDF5 "
                  "store, the original small files (blob) or, with --tensor-column, a Parquet or Delta table another "
                  "tool wrote, and report data wait vs compute for every step. "
                  "Writes summary.json, steps.jsonl and utilization.jsonl to --out. "
                  "Exit codes: 0 ok (also after SIGTERM: a checkpoint is saved), 1 data/runtime error, 2 usage.")
def main_command(
    data: str = typer.Option(..., "--data", help="A store (Parquet, Delta, HDF5), a folder of small files (blob), "
                             "or with --tensor-column a Parquet or Delta table another tool wrote: a local path "
                             "or a URL (abfs://, az://, abfss://, s3://, gs://, file://)."),
    fmt: Optional[Fmt] = typer.Option(None, "--format", help="Force the format instead of detecting it."),
    framework: Framework = typer.Option(Framework.torch, "--framework"),
    device: Device = typer.Option(Device.cpu, "--device", help="cuda: pinned memory, non-blocking copies, "
                                  "device prefetch, synchronized timing."),
    batch_size: int = typer.Option(32, "--batch-size", help="Samples per step on each rank (process)."),
    global_batch_size: Optional[int] = typer.Option(None, "--global-batch-size", help="Samples per step on all "
                                                    "ranks together, shared evenly (each rank: this / world size). "
                                                    "Default: --batch-size x world size. Resuming on another number "
                                                    "of ranks needs the same global batch: give it here."),
    lanes: Optional[int] = typer.Option(None, "--lanes", help="How an epoch is dealt among ranks: it must divide "
                                        "the global batch; with a world size that divides it, each rank reads only "
                                        "its own lanes' pieces. Default: the largest divisor of the global batch up "
                                        "to 8. A resume keeps it."),
    steps_per_epoch: Optional[int] = typer.Option(None, "--steps-per-epoch", help="Default: one pass over the data."),
    epochs: int = typer.Option(1, "--epochs"),
    workers: int = typer.Option(2, "--workers", help="Reader threads (or, with a Petastorm --reader-pool, "
                                "Petastorm's workers)."),
    pool: Pool = typer.Option(Pool["arrow"], "--reader-pool", help="arrow: trainfeed's own engine (default); "
                              "sharded/process/thread/dummy: Petastorm's, needs trainfeed[petastorm]."),
    amp: bool = typer.Option(False, "--amp", help="Mixed precision: bf16 where supported, else fp16 with loss "
                             "scaling."),
    seed: int = typer.Option(0, "--seed", help="Seeds the model and the order of every epoch (0 to 2^32-1)."),
    lr: float = typer.Option(1e-3, "--lr", help="Adam learning rate (a positive number)."),
    width: int = typer.Option(64, "--width", help="Channels of the first stage: 64 is ResNet-18 (3D: 33.2M "
                              "parameters); smaller is for quick runs."),
    num_classes: Optional[int] = typer.Option(None, "--num-classes", help="Classes the model predicts. Default: the "
                                              "store's label map, else (integer labels) the highest label + 1, at "
                                              "least 2; a label outside them is refused before training."),
    out: str = typer.Option("train-out", "--out", help="Folder for summary.json and the JSON-lines logs "
                            "(created if missing; a file there is a usage error)."),
    eval_data: Optional[str] = typer.Option(None, "--eval-data", help="A held-out store: accuracy reported at the "
                                            "end. Checked before training: same field, sample shape and dtype as "
                                            "--data, labeled, labels within the model's classes."),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint-dir", help="Folder for checkpoints (created "
                                                 "if missing)."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Steps between checkpoints (0: only on "
                                         "SIGTERM and at the end)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the checkpoint in --checkpoint-dir; when "
                                "there is none yet, start from the first step (said on stderr). A checkpoint "
                                "that is not trainfeed's, is damaged, or was written for other data (by content, "
                                "whatever its path) or another model is refused (exit 1); nothing in it is run."),
    delta_version: Optional[int] = typer.Option(None, "--delta-version", help="Train on this Delta table version "
                                                "(Delta tables only; 0 to the latest version)."),
    labels: Optional[str] = typer.Option(None, "--labels", help="blob: labels CSV (id,label), as convert takes it "
                                         "(default: DATA/labels.csv when there is one, else class subfolders)."),
    cast: Optional[str] = typer.Option(None, "--cast", help="blob: read every array as this dtype where no value "
                                       "changes (a file with one that would is an error naming it), for a folder "
                                       "mixing dtypes; auto: the smallest dtype that holds every .npy file's, found "
                                       "in their headers first (as convert --dtype auto)."),
    classes: Optional[str] = typer.Option(None, "--classes", help="blob: class names in label order, joined by "
                                          "commas (as convert --classes), for --data and --eval-data folders."),
    field: Optional[str] = typer.Option(None, "--field", help="Tensor field to train on (default: the first)."),
    shuffle_buffer: int = typer.Option(256, "--shuffle-buffer", help="Samples shuffled together (at least; held "
                                       "in memory, shared among the lanes; at most 1 GB of samples)."),
    warmup_steps: int = typer.Option(1, "--warmup-steps", help="Steps excluded from the summary (0 to the run's "
                                     "total steps)."),
    storage_option: List[str] = typer.Option([], "--storage-option", help="KEY=VALUE for a URL in --data, "
                                             "--eval-data or --labels, in fsspec's names (e.g. connection_string=..., "
                                             "account_name=..., key=..., secret=..., endpoint_url=...); Delta logs are "
                                             "read with the same credentials. Also: call_timeout=SECONDS "
                                             "(default 30)."),
    io_concurrency: int = typer.Option(8, "--io-concurrency", help="Stores on object storage: range requests in "
                                       "flight for the reader (apart from --workers, which decode)."),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help="Stores on object storage: keep what is read "
                                            "in this local folder, so that epochs after the first read local disk."),
    cache_limit: str = typer.Option("10GB", "--cache-limit", help="Most bytes --cache-dir may hold (least recently "
                                    "used ranges are evicted), e.g. 500MB, 20GiB."),
    image_size: Optional[str] = typer.Option(None, "--image-size", help="Stores of encoded images (JPEG/PNG, "
                                             "decoded while training, in the reader's --workers threads) and image "
                                             "folders: decode every image to HEIGHTxWIDTH, e.g. 64x64. Default: the "
                                             "store's size (its --resize), else the first image's; needed when the "
                                             "images differ in size."),
    fit: Optional[str] = typer.Option(None, "--fit", help="Arrays of different shapes (a store converted with "
                                      "--ragged, or a folder mixing shapes) batched as one shape: pad:SHAPE "
                                      "(zeros at each axis's end; a larger sample is refused), crop:SHAPE (the "
                                      "centre, padded where shorter) or resize:SHAPE (linear), e.g. pad:64x64x1. "
                                      "A sample with fewer axes gets leading axes of 1."),
    channels: Optional[Channels] = typer.Option(None, "--channels", help="Where a sample's channel axis is: last "
                                                "(H, W, C), (X, Y, Z, C), the default, or first (C, H, W), moved "
                                                "to the end for the model. Default: what the store records "
                                                "(convert --channels); a shape that looks channels-first with "
                                                "nothing recorded is refused until you say which."),
    augment: bool = typer.Option(True, "--augment/--no-augment", help="Encoded images: random resized crop (25-100% "
                                 "of the area, aspect 3/4 to 4/3) and horizontal flip of every training image, drawn "
                                 "from (--seed, epoch, sample id), so any --workers gives the same batches. Never "
                                 "applied to --eval-data. Stores of decoded pixels are delivered as stored."),
    data_service: Optional[str] = typer.Option(None, "--data-service", help="Image folders (JPEG/PNG files), "
                                               "either --framework: grpc://HOST:PORT of a tf.data service "
                                               "dispatcher; reading, decoding, resizing and augmenting then run on "
                                               "the service's workers (other processes or machines, started with "
                                               "`python -m trainfeed.training.data_service worker`), in TensorFlow "
                                               "ops (pixels differ slightly from the Pillow path). The trainer "
                                               "receives the batches as the service's client, so --framework torch "
                                               "needs TensorFlow installed too (pip install 'trainfeed[tf]', "
                                               "tensorflow-cpu). Every sample once per epoch, in no reproducible "
                                               "order; one training process; no --resume."),
    tensor_column: Optional[str] = typer.Option(None, "--tensor-column", help="--data is a Parquet folder or file "
                                                "or a Delta table another tool (Spark) wrote: the column holding each "
                                                "sample's tensor (.npy bytes, raw bytes or a list of numbers; see "
                                                "--tensor-encoding). Needs --shape."),
    shape: Optional[str] = typer.Option(None, "--shape", help="With --tensor-column: one sample's shape, e.g. "
                                        "30x30x10x10."),
    dtype: Optional[Dtype] = typer.Option(None, "--dtype", help="With --tensor-column: the tensor's dtype "
                                          "(default float32)."),
    label_column: Optional[str] = typer.Option(None, "--label-column", help="With --tensor-column: the integer "
                                               "label column (default: label)."),
    id_column: Optional[str] = typer.Option(None, "--id-column", help="With --tensor-column: a column of sample "
                                            "ids (any type, shown as text). Default: row-N, the row's position in "
                                            "the table (files in name order; Delta: the log's order)."),
    tensor_encoding: Optional[TensorEncoding] = typer.Option(None, "--tensor-encoding", help="With "
                                                             "--tensor-column: npy (each value a whole .npy file), "
                                                             "raw (little-endian bytes of --shape x --dtype), list "
                                                             "(an array of numbers), or auto (default: list for "
                                                             "list columns, else npy when the first value starts "
                                                             "with the .npy magic, else raw)."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json to stdout."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    with exit_codes():
        cfg = TrainConfig(
            data=data, fmt=fmt.value if fmt else None, framework=framework.value, device=device.value,
            batch_size=batch_size, global_batch_size=global_batch_size, lanes=lanes, steps_per_epoch=steps_per_epoch,
            epochs=epochs, workers=workers, pool=pool.value,
            amp=amp, seed=seed, lr=lr, width=width, num_classes=num_classes, out=out, eval_data=eval_data,
            checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, resume=resume,
            delta_version=delta_version, labels_csv=labels, classes=parse_classes(classes), cast=cast, field_name=field,
            shuffle_buffer=shuffle_buffer,
            warmup_steps=warmup_steps, storage_options=parse_storage_options(storage_option), progress=progress,
            io_concurrency=io_concurrency, cache_dir=cache_dir, cache_limit=parse_size(cache_limit, "--cache-limit"),
            image_size=parse_resize(image_size, "--image-size"), fit=fit,
            channels=channels.value if channels else None, augment=augment, data_service=data_service,
            foreign=foreign_schema(tensor_column, shape, dtype.value if dtype else None, label_column, id_column,
                                   tensor_encoding.value if tensor_encoding else None),
            cli=True,
        )
        from trainfeed.training.loops.loop import run  # the loop's imports wait for a run (--help stays quick)

        summary = run(cfg)
    typer.echo(redact_json(summary) if as_json else redact(_human(summary)))


def main() -> None:
    app(prog_name="train")


if __name__ == "__main__":
    main()
