"""`train --data STORE`: train the 3D (volumes) or 2D (images) ResNet-18 from any layout and
account for every step. Also `python -m trainfeed.training`."""
from __future__ import annotations

import math
from enum import Enum, StrEnum
from typing import Any

import typer

from trainfeed.converters.cli import Channels
from trainfeed.converters.errors import UsageError, exit_codes
from trainfeed.converters.formats.foreign import ENCODINGS, ForeignSchema, foreign_schema
from trainfeed.converters.formats.options import OpenOptions, parse_size
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.layout import SUPPORTED_DTYPES
from trainfeed.converters.option_docs import cli_option, in_flag_words
from trainfeed.converters.redact import redact, redact_json
from trainfeed.converters.sources.decode import parse_resize
from trainfeed.converters.sources.labels import parse_classes
from trainfeed.converters.storage.config import parse_storage_options
from trainfeed.training.config import TrainConfig
from trainfeed.training.frameworks import FRAMEWORKS
from trainfeed.training.reading.readers import POOLS
from trainfeed.training.reading.store import EpochOptions

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


# the registries' names as choices (members made at run time, which mypy cannot follow)
Fmt = Enum("Fmt", {name: name for name in FORMATS}, type=str)  # type: ignore[misc]
FrameworkName = Enum("FrameworkName", {name: name for name in FRAMEWORKS}, type=str)  # type: ignore[misc]
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


def _human(s: dict[str, Any]) -> str:
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
    data: str = cli_option(TrainConfig, "data"),
    fmt: Fmt | None = cli_option(TrainConfig, "fmt"),
    framework: FrameworkName = cli_option(TrainConfig, "framework"),
    device: Device = cli_option(TrainConfig, "device"),
    batch_size: int = cli_option(EpochOptions, "batch_size"),
    global_batch_size: int | None = cli_option(EpochOptions, "global_batch_size"),
    lanes: int | None = cli_option(EpochOptions, "lanes"),
    steps_per_epoch: int | None = cli_option(TrainConfig, "steps_per_epoch"),
    epochs: int = cli_option(TrainConfig, "epochs"),
    workers: int = cli_option(EpochOptions, "workers"),
    pool: Pool = cli_option(EpochOptions, "pool"),
    amp: bool = cli_option(TrainConfig, "amp"),
    seed: int = cli_option(EpochOptions, "seed"),
    lr: float = cli_option(TrainConfig, "lr"),
    width: int = cli_option(TrainConfig, "width"),
    num_classes: int | None = cli_option(TrainConfig, "num_classes"),
    out: str = cli_option(TrainConfig, "out"),
    eval_data: str | None = cli_option(TrainConfig, "eval_data"),
    checkpoint_dir: str | None = cli_option(TrainConfig, "checkpoint_dir"),
    checkpoint_every: int = cli_option(TrainConfig, "checkpoint_every"),
    resume: bool = cli_option(TrainConfig, "resume"),
    delta_version: int | None = cli_option(OpenOptions, "version"),
    labels: str | None = cli_option(OpenOptions, "labels"),
    cast: str | None = cli_option(OpenOptions, "cast"),
    classes: str | None = cli_option(OpenOptions, "classes", help_suffix=" Joined by commas (as convert --classes), "
                                     "for --data and --eval-data folders."),
    field: str | None = cli_option(OpenOptions, "field"),
    shuffle_buffer: int = cli_option(EpochOptions, "shuffle_buffer"),
    warmup_steps: int = cli_option(TrainConfig, "warmup_steps"),
    storage_option: list[str] = cli_option(OpenOptions, "storage_options", default=[], help_suffix=(
        " KEY=VALUE, once per setting, for a URL in --data, --eval-data or --labels.")),
    io_concurrency: int = cli_option(OpenOptions, "io_concurrency"),
    cache_dir: str | None = cli_option(OpenOptions, "cache_dir"),
    cache_limit: str = cli_option(OpenOptions, "cache_limit"),
    image_size: str | None = cli_option(OpenOptions, "image_size"),
    fit: str | None = cli_option(OpenOptions, "fit"),
    channels: Channels | None = cli_option(TrainConfig, "channels"),
    augment: bool = cli_option(EpochOptions, "augment", default=True, help_suffix=" Never applied to --eval-data."),
    data_service: str | None = cli_option(TrainConfig, "data_service"),
    tensor_column: str | None = cli_option(ForeignSchema, "tensor_column", default=None),
    shape: str | None = cli_option(ForeignSchema, "shape", default=None),
    dtype: Dtype | None = cli_option(ForeignSchema, "dtype", default=None),
    label_column: str | None = cli_option(ForeignSchema, "label_column", default=None),
    id_column: str | None = cli_option(ForeignSchema, "id_column", default=None),
    tensor_encoding: TensorEncoding | None = cli_option(ForeignSchema, "encoding", default=None),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json to stdout."),
    progress: bool = cli_option(TrainConfig, "progress"),
) -> None:
    with exit_codes():
        cfg = TrainConfig(
            data=data, fmt=fmt.value if fmt else None, framework=framework.value, device=device.value,
            store=OpenOptions(
                version=delta_version, labels=labels, classes=parse_classes(classes), cast=cast, field=field,
                storage_options=parse_storage_options(storage_option), io_concurrency=io_concurrency,
                cache_dir=cache_dir, cache_limit=parse_size(cache_limit, "--cache-limit"),
                image_size=parse_resize(image_size, "--image-size"), fit=fit,
                foreign=foreign_schema(tensor_column, shape, dtype.value if dtype else None, label_column, id_column,
                                       tensor_encoding.value if tensor_encoding else None)),
            epoch=_epoch_options(batch_size=batch_size, global_batch_size=global_batch_size, lanes=lanes,
                                 workers=workers, pool=pool.value, seed=seed, shuffle_buffer=shuffle_buffer,
                                 augment=augment),
            steps_per_epoch=steps_per_epoch, epochs=epochs, amp=amp, lr=lr, width=width, num_classes=num_classes,
            out=out, eval_data=eval_data, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
            resume=resume, warmup_steps=warmup_steps, progress=progress,
            channels=channels.value if channels else None, data_service=data_service, cli=True,
        )
        from trainfeed.training.loops.loop import run  # the loop's imports wait for a run (--help stays quick)

        summary = run(cfg)
    typer.echo(redact_json(summary) if as_json else redact(_human(summary)))


def _epoch_options(**values: Any) -> EpochOptions:
    """The run's EpochOptions; what it refuses is said in the flags' words."""
    try:
        return EpochOptions(**values)
    except UsageError as exc:
        raise UsageError(in_flag_words(str(exc), EpochOptions)) from None


def main() -> None:
    app(prog_name="train")


if __name__ == "__main__":
    main()
