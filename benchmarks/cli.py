"""`storage-bench`: synthetic datasets now; the storage A/B matrix builds on it."""
from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from trainfeed.benchmarks.ab.config import IMAGE_STORAGES, STORES
from trainfeed.benchmarks.cli_tools import parse_shape, tools
from trainfeed.benchmarks.model.catalog import CATALOG
from trainfeed.benchmarks.synth import IMAGE_SIZE, SAMPLE_RANKS, VOLUME_SHAPE, generate_images, generate_volumes
from trainfeed.converters.cli import Channels
from trainfeed.converters.errors import TrainfeedError, UsageError, exit_codes
from trainfeed.converters.progress import MatrixProgress, progress_bar
from trainfeed.converters.redact import redact, redact_json
from trainfeed.converters.storage.fetch import DEFAULT_IO_CONCURRENCY

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False,
                  help="Measure what storage layout does to training: synthetic datasets and benchmarks.")


@app.callback()
def _root() -> None:
    """Subcommands: generate, run, report (here); calibrate, probe, mlperf, prices (cli_tools.py)."""


class Kind(str, Enum):
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


BASELINE_HELP = ("Your current loader, for the small files' row: KEY=VALUE,... of name, concurrency (requests "
                 "in flight), threads (that read and decode; default: concurrency), prefetch (on/off), framework. "
                 "E.g. concurrency=1,prefetch=off,framework=tf for a generator reading one file at a time. The "
                 "report then says what repacking gains over it and what better loading alone would gain.")


MY_INSTANCE_HELP = ("The instance you train on today, by its catalog name (e.g. Standard_NC4as_T4_v3; "
                    "`storage-bench prices` lists them): the report's costs always show it beside the fastest, "
                    "the cheapest and the best per dollar of each node type.")


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
    src: Optional[str] = typer.Argument(None, help="Folder (or fsspec URL) of the small files: the blob layout. "
                                        "Optional with --scenario (which then generates its dataset into OUT/data)."),
    out: Path = typer.Option(Path("bench-out/ab"), "--out", help="Results folder (the local backend's stores go to "
                             "OUT/stores, a local copy of a remote store to OUT/local-copy)."),
    labels: Optional[str] = typer.Option(None, "--labels", help="Labels CSV (id,label); default SRC/labels.csv if "
                                         "present. A local file, inside SRC, or on the storage backend."),
    stores: str = typer.Option(",".join(STORES), "--stores", help=f"Comma-separated: {', '.join(STORES)}."),
    nodes: str = typer.Option("cpu,t4,h100", "--nodes", help="cpu, cuda (a real GPU), emulated t4, v100, a10g, a100, "
                              "h100, or a profile file from `calibrate`."),
    frameworks: str = typer.Option("torch", "--frameworks", help="torch, tf (tf on real nodes only matters for "
                                   "compute)."),
    steps: int = typer.Option(30, "--steps", help="Measured steps per cell on emulated nodes (plus one warm-up)."),
    cpu_steps: int = typer.Option(4, "--cpu-steps", help="Steps per cell on a real CPU node (the full model is slow "
                                  "there)."),
    batch_size: int = typer.Option(32, "--batch-size"),
    width: int = typer.Option(64, "--width", help="Model width: 64 is ResNet-18 (33.2M parameters in 3D)."),
    workers: int = typer.Option(4, "--workers", help="Reader threads, the same for every store."),
    io_concurrency: int = typer.Option(DEFAULT_IO_CONCURRENCY, "--io-concurrency", help="Remote or emulated "
                                       "storage: range requests in flight for each reader, whatever the layout "
                                       "(small files: one GET each; row groups: 8 MB parts)."),
    repeats: int = typer.Option(1, "--repeats"),
    storage_backend: str = typer.Option("local", "--storage-backend", help="Where every store is staged and read "
                                        "from: local (OUT/stores), azurite (a local Azurite, the real Azure Blob API, "
                                        "started for the run), or a URL such as abfs://container/folder (with "
                                        "--storage-option; storage-bench replaces what it stages there)."),
    storage_profile: str = typer.Option("azure-blob", "--storage-profile", help="Latency emulation every read goes "
                                        "through: azure-blob, s3, lan, a profile file written by `storage-bench "
                                        "probe`, or none (on a real cloud, where latency is real)."),
    storage_option: List[str] = typer.Option([], "--storage-option", help="KEY=VALUE for a remote SRC, --labels and "
                                             "a URL --storage-backend."),
    target_samples: int = typer.Option(650_000, "--target-samples", help="Your full dataset's size, for projections."),
    target_epochs: int = typer.Option(5, "--target-epochs"),
    catalog: Path = typer.Option(CATALOG, "--catalog", help="Instance catalog CSV (prices with date and source)."),
    resize: Optional[str] = typer.Option(None, "--resize", help="Image folders: resize every image to HEIGHTxWIDTH "
                                         "(e.g. 64x64): at conversion for the compacted stores, by the reader for "
                                         "the small files. Default: keep the original size."),
    image_storage: str = typer.Option(",".join(IMAGE_STORAGES), "--image-storage", help="Image folders: how the "
                                      "compacted stores hold the images, comma-separated: encoded (JPEG/PNG bytes, "
                                      "decoded as read), decoded (pixels); one store per format and choice, named "
                                      "FORMAT-encoded, FORMAT-decoded."),
    image_mode: str = typer.Option("RGB", "--image-mode", help="Image folders: the mode the compacted stores' images "
                                   "are converted to when decoded or resized, RGB or L (grayscale; keeps 16-bit "
                                   "grayscale PNGs at 16 bits), as `convert --image-mode`."),
    reduce_depth: bool = typer.Option(False, "--reduce-depth", help="Image folders: the conversion takes a 16-bit "
                                      "image that cannot keep its bits at 8 bits per channel instead of refusing it, "
                                      "as `convert --reduce-depth`."),
    promote_depth: bool = typer.Option(False, "--promote-depth", help="Image folders, with --image-mode L: the "
                                       "conversion stores 8-bit greyscale images as 16-bit (exact), so that a folder "
                                       "mixing 8- and 16-bit greyscale images keeps every bit, as "
                                       "`convert --promote-depth`."),
    ragged: bool = typer.Option(False, "--ragged", help="Arrays of different shapes: the compacted stores keep each "
                                "sample in its own shape, as `convert --ragged`; give --fit for how every store's "
                                "batches are read."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Arrays: the compacted stores hold every sample in this "
                                        "dtype (or auto), as `convert --dtype`; the small files are read as they are "
                                        "(give them one dtype, or --fit does not help)."),
    fit: Optional[str] = typer.Option(None, "--fit", help="Samples of different shapes: how every store (the small "
                                      "files too) is batched, pad:SHAPE, crop:SHAPE or resize:SHAPE, as "
                                      "`train --fit`."),
    channels: Optional[Channels] = typer.Option(None, "--channels", help="Arrays: where the channel axis is, first "
                                                "or last, as `convert --channels` / `train --channels`; a shape that "
                                                "looks channels-first is refused until said."),
    baseline_loader: Optional[str] = typer.Option(None, "--baseline-loader", help=BASELINE_HELP),
    my_instance: Optional[str] = typer.Option(None, "--my-instance", help=MY_INSTANCE_HELP),
    scenario: Optional[Path] = typer.Option(None, "--scenario", help="A scenario file (TOML, see scenarios/): the "
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


def _report_line(info: dict) -> str:
    return redact(f"report: {info['report_html']} (and {info['report_md']})")


def _fail_unless_measured(info: dict) -> None:
    """A matrix in which no cell was measured is a failed run (exit 1), its report says why."""
    if info["cells"] == 0:
        raise TrainfeedError(f"{info['report_md']}: no cell was measured: all {info['errors']} failed; "
                             f"first failure: {info['first_error'] or 'none recorded'}")


@app.command(short_help="Rebuild the report from OUT/results.jsonl.",
             help="Rebuild results.csv, costs.csv, report.md and report.html from OUT/results.jsonl.")
def report(
    out: Path = typer.Argument(..., help="A folder written by `storage-bench run`."),
    target_samples: int = typer.Option(650_000, "--target-samples"),
    target_epochs: int = typer.Option(5, "--target-epochs"),
    catalog: Path = typer.Option(CATALOG, "--catalog"),
    baseline_loader: Optional[str] = typer.Option(None, "--baseline-loader", help=BASELINE_HELP),
    my_instance: Optional[str] = typer.Option(None, "--my-instance", help=MY_INSTANCE_HELP),
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
