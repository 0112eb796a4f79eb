"""`storage-bench`'s measuring tools beside the A/B matrix: calibrate (a node's step time), probe
(an object store), mlperf (MLPerf Storage's yardstick) and prices (the instance catalog). Their
commands join `storage-bench` (benchmarks/cli.py)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer

from trainfeed.benchmarks.ab.config import ReportConfig
from trainfeed.converters.errors import UsageError, exit_codes
from trainfeed.converters.option_docs import cli_option
from trainfeed.converters.redact import redact, redact_json

tools = typer.Typer()


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        typer.echo(f"error: --shape expects sizes joined by x, such as 30x30x10x10, got {text!r}", err=True)
        raise typer.Exit(2)
    return shape


@tools.command(short_help="Measure this machine's step time (a node profile).",
             help="Measure compute-only step time of the model on this machine's device (CPU, or CUDA when "
                  "present) and save it as an accelerator profile that `run --nodes PROFILE` uses instead of the "
                  "FLOPs estimate.")
def calibrate(
    out: Path = typer.Option(..., "--out", help="Profile file to write (JSON)."),
    name: str = typer.Option("local", "--name"),
    shape: str = typer.Option("30x30x10x10", "--shape", help="Sample shape XxYxZxC (or HxWxC)."),
    batch_size: int = typer.Option(32, "--batch-size"),
    width: int = typer.Option(64, "--width"),
    steps: int = typer.Option(5, "--steps"),
    device: str = typer.Option("auto", "--device", help="auto (cuda when present), cpu or cuda."),
    amp: bool = typer.Option(False, "--amp"),
) -> None:
    from trainfeed.benchmarks.model.profiles import Accelerator, calibration_key, save_accelerator
    from trainfeed.training.frameworks import TORCH

    dims = parse_shape(shape)
    device = ("cuda" if _cuda() else "cpu") if device == "auto" else device
    seconds, _ = TORCH.compute_only(tuple(dims), batch_size, width, max(2, steps), device, amp)
    import torch

    label = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    acc = Accelerator(name, 0.0, 0.0, 1.0, f"calibrated on {label}", kind="calibrated",
                      step_seconds={calibration_key(dims, batch_size, width, amp): seconds})
    save_accelerator(acc, out)
    typer.echo(f"{label}: {seconds * 1e3:.1f} ms per step of batch {batch_size} -> {out}")


@tools.command(short_help="Measure an object store (latency, bandwidth, client CPU).",
             help="Measure an object store (or any folder or fsspec URL) the way the latency emulation models "
                  "one: the request-time distribution of small GETs (p50/p90/p99), single-stream bandwidth of large "
                  "range reads, throughput at concurrency 1, 2, 4, ... --max-concurrency, and the client's CPU-seconds "
                  "per GB at 1, 8 and 32 requests in flight (process CPU time; those up to --max-concurrency), read "
                  "through trainfeed's own client as the reader reads. Probe objects are "
                  "written under URL/_trainfeed-probe-<id>/ and deleted afterwards, also on failure or Ctrl-C. "
                  "--out saves a profile (kind \"probed\") that --storage-profile and the emulation accept. "
                  "Progress on stderr, a table (or --json: the profile) on stdout.")
def probe(
    url: str = typer.Argument(..., help="Local folder or fsspec URL: abfs://container/prefix, s3://bucket/prefix, "
                              "emulated:///folder (with --storage-option target=file profile=azure-blob), ..."),
    storage_option: list[str] = typer.Option([], "--storage-option", help="KEY=VALUE for URL's filesystem "
                                             "(e.g. connection_string=..., account_name=...)."),
    out: Path | None = typer.Option(None, "--out", help="Profile file to write (JSON)."),
    name: str = typer.Option("probed", "--name", help="The profile's name."),
    small_size: str = typer.Option("64KB", "--small-size", help="Size of the small GETs (latency)."),
    large_size: str = typer.Option("32MB", "--large-size", help="Size of the large range reads (bandwidth); the "
                                   "concurrency sweep reads ranges of an eighth of it."),
    samples: int = typer.Option(50, "--samples", help="Small GETs timed, one at a time."),
    max_concurrency: int = typer.Option(64, "--max-concurrency", help="Highest concurrency of the sweep (powers of 2) "
                                        "and of the client-CPU measurement."),
    existing: bool = typer.Option(False, "--existing", help="Read objects already under URL instead of writing "
                                  "probe objects (read-only credentials)."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile as JSON."),
) -> None:
    from trainfeed.benchmarks.ab import storagesim  # noqa: F401  registers emulated:// (a probe's target)
    from trainfeed.benchmarks.ab.probe import ProbeConfig, summary
    from trainfeed.benchmarks.ab.probe import probe as run_probe
    from trainfeed.benchmarks.model.profiles import save_object_store
    from trainfeed.converters.formats.options import parse_size
    from trainfeed.converters.storage.config import parse_storage_options

    with exit_codes():
        cfg = ProbeConfig(url, parse_storage_options(storage_option), parse_size(small_size, "--small-size"),
                          parse_size(large_size, "--large-size"), samples, max_concurrency, existing, name)
        if out is not None and not out.parent.is_dir():
            raise UsageError(f"--out {out}: folder {out.parent} does not exist")
        profile = run_probe(cfg, lambda m: typer.echo(redact(m), err=True))
        if out is not None:
            save_object_store(profile, out)
            typer.echo(f"profile written to {out}", err=True)
        typer.echo(redact_json(asdict(profile)) if as_json else redact(summary(profile)))


@tools.command(short_help="MLPerf Storage's 3D U-Net: emulated H100s/A100s this machine feeds from S3.",
             help="MLPerf Storage's yardstick on this machine: --samples generated float32 volumes of --shape "
                  "(default 143 MB each, MLPerf's 3D U-Net case), converted to Parquet on s3rver (an S3 server on "
                  "loopback, started here: needs Node) and read through DataLoader(TorchDataset, batch 7, "
                  "--workers persistent workers): --epochs ingest epochs with no step, then as many with the "
                  "emulated step of an H100 (0.323 s) and of an A100 (0.636 s) after each batch. Says how many "
                  "emulated accelerators of each kind the ingest rate feeds at 90% accelerator utilization, the GB/s "
                  "and vCPUs each takes, and the utilization one of each reached here. JSON lines on stdout (one per "
                  "epoch, then the summary), progress and the summary on stderr.")
def mlperf(
    samples: int = typer.Option(32, "--samples", help="Volumes generated (default 32: about 4.6 GB)."),
    shape: str = typer.Option("128x128x128x17", "--shape", help="One float32 volume (default 143 MB)."),
    workers: int = typer.Option(2, "--workers", help="DataLoader worker processes."),
    epochs: int = typer.Option(2, "--epochs", help="Epochs of each kind (ingest, H100, A100)."),
    io_concurrency: int = typer.Option(16, "--io-concurrency", help="Range requests in flight."),
    latency_ms: int = typer.Option(0, "--latency-ms", help="Latency added to every request (a relay), in ms."),
) -> None:
    from trainfeed.benchmarks.mlperf import BATCH, Workload, summary, summary_text
    from trainfeed.benchmarks.mlperf import run as run_mlperf

    if samples < BATCH or min(epochs, io_concurrency) < 1 or workers < 0 or latency_ms < 0:
        typer.echo(f"error: --samples must be at least {BATCH} (one batch), --epochs and --io-concurrency at least 1, "
                   "--workers and --latency-ms at least 0", err=True)
        raise typer.Exit(2)

    def emit(record: dict[str, Any]) -> None:
        typer.echo(json.dumps(record))
        typer.echo(f"{record['kind']} epoch {record['epoch']}: {record['mb_per_s']} MB/s, "
                   f"{record['cpu_s_per_gb']} CPU-s/GB", err=True)

    with exit_codes():
        records = run_mlperf(Workload(samples, parse_shape(shape), workers, epochs, io_concurrency, latency_ms), emit)
        result = summary(records)
        typer.echo(json.dumps(result))
        typer.echo(summary_text(result), err=True)


@tools.command(short_help="Print (or --refresh) the instance price catalog.",
             help="Print the instance catalog: prices in USD per hour (Linux, on demand and spot) with the date and "
                  "source of each, and the Databricks DBU rates. --refresh fetches current prices from the Azure "
                  "Retail Prices API and the AWS price list (AmazonEC2 offer file) and writes the updated catalog "
                  "to --out; without --out it prints what would change and writes nothing. Progress on stderr.")
def prices(
    catalog: Path = cli_option(ReportConfig, "catalog"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    refresh: bool = typer.Option(False, "--refresh", help="Re-price the Azure and AWS rows from the providers' APIs."),
    region: str = typer.Option("eastus", "--region", help="Azure region (armRegionName) for --refresh."),
    aws_region: str = typer.Option("us-east-1", "--aws-region", help="AWS region for --refresh."),
    out: Path | None = typer.Option(None, "--out", help="Write the refreshed catalog here (never the shipped one)."),
    azure_url: str | None = typer.Option(None, "--azure-url", help="Azure Retail Prices API endpoint "
                                            "(default: https://prices.azure.com/api/retail/prices)."),
    aws_url: str | None = typer.Option(None, "--aws-url", help="AWS price list base URL "
                                          "(default: https://pricing.us-east-1.amazonaws.com)."),
) -> None:
    from trainfeed.benchmarks.model.prices import run as run_prices

    with exit_codes():
        run_prices(catalog=catalog, as_json=as_json, do_refresh=refresh, azure_region=region, aws_region=aws_region,
                   out=out, azure_url=azure_url, aws_url=aws_url, echo=typer.echo,
                   progress=lambda m: typer.echo(m, err=True))
