"""`storage-bench`: synthetic datasets now; the storage A/B matrix builds on it."""
from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer

from trainfeed.benchmarks.ab.config import COMPACTED, MatrixConfig, ReportConfig
from trainfeed.benchmarks.cli_tools import parse_shape, tools
from trainfeed.benchmarks.synth import IMAGE_SIZE, SAMPLE_RANKS, VOLUME_SHAPE, generate_images, generate_volumes
from trainfeed.converters.cli import Channels
from trainfeed.converters.errors import TrainfeedError, UsageError, exit_codes
from trainfeed.converters.option_docs import cli_option
from trainfeed.converters.progress import MatrixProgress, progress_bar
from trainfeed.converters.redact import redact, redact_json
from trainfeed.converters.sources.decode import ArrayOptions
from trainfeed.training.config import TrainConfig

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False,
                  help="Measure what storage layout does to training: synthetic datasets and benchmarks.")


@app.callback()
def _root() -> None:
    """Subcommands: generate, run, report (here); calibrate, probe, mlperf, prices (cli_tools.py)."""


class Kind(StrEnum):
    volumes = "volumes"
    images = "images"


@app.command(short_help="Generate a synthetic, learnable dataset (volumes or images).",
             help="Generate a synthetic, learnable dataset shaped like the reference cases: numpy volumes "
                  "(one .npy per sample, label = sign of the mean of channel 0 over a corner region, in "
                  "labels.csv or class folders; --shape HxWxC or HxW: image-shaped arrays) or JPEG class folders.")
def generate(
    kind: Kind = typer.Argument(..., help="volumes or images"),
    out: Path = typer.Argument(..., help="Folder to create (must not exist)."),
    count: int = typer.Option(1000, "--count", help="Number of samples."),
    shape: str = typer.Option(None, "--shape", help="volumes: XxYxZxC (default 30x30x10x10, float32, 360 KB), or "
                                                    "the images train also takes as arrays, HxWxC or HxW; "
                                                    "images: HxW (default 360x480)."),
    seed: int = typer.Option(0, "--seed", help="Random seed; the same seed gives the same files."),
    labels: str = typer.Option("csv", "--labels", help="volumes: csv (OUT/labels.csv) or folders (OUT/neg, OUT/pos)."),
    classes: int = typer.Option(2, "--classes", help="images: number of class folders."),
    as_json: bool = typer.Option(False, "--json", help="Print the dataset description as JSON."),
) -> None:
    if out.exists():
        typer.echo(f"error: {out} already exists", err=True)
        raise typer.Exit(1)
    if count < 1:
        typer.echo("error: --count must be at least 1", err=True)
        raise typer.Exit(2)
    if labels not in ("csv", "folders"):
        typer.echo("error: --labels must be csv or folders", err=True)
        raise typer.Exit(2)
    dims = parse_shape(shape) if shape else (VOLUME_SHAPE if kind == Kind.volumes else IMAGE_SIZE)
    if kind == Kind.volumes and len(dims) not in SAMPLE_RANKS:
        typer.echo(f"error: volumes --shape is XxYxZxC, HxWxC or HxW (the samples train takes), got {shape!r}",
                   err=True)
        raise typer.Exit(2)
    if kind == Kind.images and len(dims) != 2:
        typer.echo("error: images --shape is HxW", err=True)
        raise typer.Exit(2)
    with progress_bar(label=f"generate {kind.value}") as bar:
        bar.start(count)
        if kind == Kind.volumes:
            per_sample = 4 * int(__import__("numpy").prod(dims))
            info = generate_volumes(out, count, shape=dims, seed=seed, labels=labels,
                                    progress=lambda n: bar.update(n, n * per_sample))
        else:
            info = generate_images(out, count, size=(dims[0], dims[1]), classes=classes, seed=seed, progress=bar.update)
    typer.echo(json.dumps(info) if as_json else f"{info['count']} {info['kind']} written to {info['path']}")


def _check_my_instance(name: str | None, catalog: Path) -> None:
    from trainfeed.benchmarks.model.catalog import load_catalog
    from trainfeed.benchmarks.report.report import check_instance

    if name is not None:
        check_instance(name, load_catalog(catalog)[0], catalog)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


@app.command(short_help="Measure the storage A/B matrix and write the report.",
             help="Run the storage A/B matrix on one dataset: --stores x --nodes x --frameworks. Every store "
                  "(the small files too) is staged on one --storage-backend and every cell reads it from there, "
                  "through the --storage-profile latency emulation, with one connection budget (--workers, "
                  "--io-concurrency): the cells differ by layout only (the layout effect). "
                  "The best compacted store is also read from local disk as it is "
                  "(the location effect), unless the cells read local disk as it is already. Each cell is measured "
                  "three ways (compute-only, ingest-only, real run; the reader's CPU time per sample and the "
                  "machine's load recorded), diagnosed, and projected to time and cost per instance of the "
                  "catalog by one model; writes results.jsonl, results.csv, costs.csv (every store on every instance), "
                  "report.md and report.html (the answer first: what to do, time and cost per job, how sure, what "
                  "binds) to --out. "
                  "Progress on stderr: each store as it is staged, each cell (i/N) with its measurement, steps, "
                  "elapsed time and ETAs. Cells are appended as they finish: a failed cell does not lose the "
                  "others, and the report says why each failed cell failed. Exit 1 when no cell could be measured.")
def run(
    src: str | None = typer.Argument(None, help="Folder (or fsspec URL) of the small files: the blob layout. "
                                        "Optional with --scenario (which then generates its dataset into OUT/data)."),
    out: Path = typer.Option(Path("bench-out/ab"), "--out", help="Results folder (the local backend's stores go to "
                             "OUT/stores, a local copy of a remote store to OUT/local-copy)."),
    labels: str | None = cli_option(MatrixConfig, "labels_csv"),
    stores: str = cli_option(MatrixConfig, "stores"),
    nodes: str = cli_option(MatrixConfig, "nodes"),
    frameworks: str = cli_option(MatrixConfig, "frameworks"),
    steps: int = cli_option(MatrixConfig, "steps"),
    cpu_steps: int = cli_option(MatrixConfig, "cpu_steps"),
    batch_size: int = cli_option(MatrixConfig, "batch_size"),
    width: int = cli_option(MatrixConfig, "width"),
    workers: int = cli_option(MatrixConfig, "workers"),
    io_concurrency: int = cli_option(MatrixConfig, "io_concurrency"),
    repeats: int = cli_option(MatrixConfig, "repeats"),
    storage_backend: str = cli_option(MatrixConfig, "storage_backend"),
    storage_profile: str = cli_option(MatrixConfig, "storage_profile"),
    storage_option: list[str] = cli_option(MatrixConfig, "storage_options", default=[], help_suffix=(
        " KEY=VALUE, once per setting.")),
    target_samples: int = cli_option(ReportConfig, "target_samples"),
    target_epochs: int = cli_option(ReportConfig, "target_epochs"),
    catalog: Path = cli_option(ReportConfig, "catalog"),
    resize: str | None = cli_option(MatrixConfig, "resize"),
    image_storage: str = cli_option(MatrixConfig, "image_storage"),
    image_mode: str = cli_option(MatrixConfig, "image_mode"),
    reduce_depth: bool = cli_option(MatrixConfig, "reduce_depth"),
    promote_depth: bool = cli_option(MatrixConfig, "promote_depth"),
    ragged: bool = cli_option(ArrayOptions, "ragged", help_suffix=COMPACTED + " Give --fit for how every store's "
                              "batches are read."),
    dtype: str | None = cli_option(ArrayOptions, "dtype", help_suffix=COMPACTED + " The small files are read as "
                                   "they are (give them one dtype, or --fit does not help)."),
    fit: str | None = cli_option(MatrixConfig, "fit"),
    channels: Channels | None = cli_option(TrainConfig, "channels"),
    baseline_loader: str | None = cli_option(ReportConfig, "baseline_loader"),
    my_instance: str | None = cli_option(ReportConfig, "my_instance"),
    scenario: Path | None = typer.Option(None, "--scenario", help="A scenario file (TOML, see scenarios/): the "
                                            "workload, model, storage, loaders and nodes to project onto, with the "
                                            "published times to compare with; it sets the matrix (stores, nodes, "
                                            "steps, batch, width, latency profile: the matrix options above are "
                                            "ignored but --storage-backend and --storage-option) and writes "
                                            "OUT/reference.json."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    from trainfeed.benchmarks.ab.config import MatrixConfig, prepare
    from trainfeed.benchmarks.ab.matrix import run_matrix
    from trainfeed.benchmarks.model.projection import parse_loader
    from trainfeed.benchmarks.model.scenario import load_scenario
    from trainfeed.benchmarks.report import report as report_mod
    from trainfeed.converters.sources.decode import ArrayOptions, parse_resize
    from trainfeed.converters.storage.config import parse_storage_options

    with exit_codes():
        baseline = parse_loader(baseline_loader) if baseline_loader else None
        _check_my_instance(my_instance, catalog)  # before measuring anything
        log = lambda m: typer.echo(redact(m), err=True)  # noqa: E731
        if scenario is not None:
            sc = load_scenario(scenario)
            cfg = prepare(sc, out, src, log, storage_backend, parse_storage_options(storage_option))
            run_matrix(cfg, log, MatrixProgress(0))
            info = report_mod.build(str(out), catalog=catalog, scenario=sc, my_instance=my_instance)
            typer.echo(redact_json(info, default=str) if as_json else _report_line(info))
            _fail_unless_measured(info)
            return
        if src is None:
            raise UsageError("SRC is required unless --scenario is given")
        labels = labels or (str(Path(src) / "labels.csv")
                            if "://" not in src and (Path(src) / "labels.csv").exists() else None)
        cfg = MatrixConfig(src=src, out=str(out), labels_csv=labels, stores=_csv(stores), nodes=_csv(nodes),
                           frameworks=_csv(frameworks), steps=steps, cpu_steps=cpu_steps, batch_size=batch_size,
                           width=width, workers=workers, io_concurrency=io_concurrency, repeats=repeats,
                           storage_backend=storage_backend,
                           storage_profile=None if storage_profile == "none" else storage_profile,
                           storage_options=parse_storage_options(storage_option), resize=parse_resize(resize),
                           image_storage=_csv(image_storage), image_mode=image_mode.upper(), reduce_depth=reduce_depth,
                           promote_depth=promote_depth, fit=fit,
                           arrays=ArrayOptions(ragged=ragged, dtype=dtype,
                                               channels=channels.value if channels else None))
        run_matrix(cfg, log, MatrixProgress(0))
        info = report_mod.build(str(out), target_samples=target_samples, target_epochs=target_epochs, catalog=catalog,
                                baseline=baseline, my_instance=my_instance)
        typer.echo(redact_json(info, default=str) if as_json else _report_line(info))
        _fail_unless_measured(info)


def _report_line(info: dict[str, Any]) -> str:
    return redact(f"report: {info['report_html']} (and {info['report_md']})")


def _fail_unless_measured(info: dict[str, Any]) -> None:
    """A matrix in which no cell was measured is a failed run (exit 1), its report says why."""
    if info["cells"] == 0:
        raise TrainfeedError(f"{info['report_md']}: no cell was measured: all {info['errors']} failed; "
                             f"first failure: {info['first_error'] or 'none recorded'}")


@app.command(short_help="Rebuild the report from OUT/results.jsonl.",
             help="Rebuild results.csv, costs.csv, report.md and report.html from OUT/results.jsonl.")
def report(
    out: Path = typer.Argument(..., help="A folder written by `storage-bench run`."),
    target_samples: int = cli_option(ReportConfig, "target_samples"),
    target_epochs: int = cli_option(ReportConfig, "target_epochs"),
    catalog: Path = cli_option(ReportConfig, "catalog"),
    baseline_loader: str | None = cli_option(ReportConfig, "baseline_loader"),
    my_instance: str | None = cli_option(ReportConfig, "my_instance"),
) -> None:
    from trainfeed.benchmarks.model.projection import parse_loader
    from trainfeed.benchmarks.report import report as report_mod

    with exit_codes():
        baseline = parse_loader(baseline_loader) if baseline_loader else None
        info = report_mod.build(str(out), target_samples=target_samples, target_epochs=target_epochs, catalog=catalog,
                                baseline=baseline, my_instance=my_instance)
        typer.echo(_report_line(info))
        _fail_unless_measured(info)


app.registered_commands += tools.registered_commands  # calibrate, probe, mlperf, prices


def main() -> None:
    app(prog_name="storage-bench")


if __name__ == "__main__":
    main()
