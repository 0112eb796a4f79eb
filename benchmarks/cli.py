"""`storage-bench`: synthetic datasets now; the storage A/B matrix builds on it."""
from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path

import typer

from converters.progress import progress_bar

from .synth import IMAGE_SIZE, VOLUME_SHAPE, generate_images, generate_volumes

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False,
                  help="Measure what storage layout does to training: synthetic datasets and benchmarks.")


@app.callback()
def _root() -> None:
    """Subcommands: generate (more arrive with the A/B matrix)."""


class Kind(str, Enum):
    volumes = "volumes"
    images = "images"


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        typer.echo(f"error: --shape expects sizes joined by x, such as 30x30x10x10, got {text!r}", err=True)
        raise typer.Exit(2)
    return shape


@app.command(help="Generate a synthetic, learnable dataset shaped like the reference cases: numpy volumes "
                  "(one .npy per sample, label = sign of the mean of channel 0 over a corner region, in "
                  "labels.csv or class folders) or JPEG class folders.")
def generate(
    kind: Kind = typer.Argument(..., help="volumes or images"),
    out: Path = typer.Argument(..., help="Folder to create (must not exist)."),
    count: int = typer.Option(1000, "--count", help="Number of samples."),
    shape: str = typer.Option(None, "--shape", help="volumes: XxYxZxC (default 30x30x10x10, float32, 360 KB); "
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
    with progress_bar(label=f"generate {kind.value}") as bar:
        bar.start(count)
        if kind == Kind.volumes:
            info = generate_volumes(out, count, shape=_shape(shape) if shape else VOLUME_SHAPE, seed=seed,
                                    labels=labels, progress=bar.update)
        else:
            size = _shape(shape) if shape else IMAGE_SIZE
            if len(size) != 2:
                typer.echo("error: images --shape is HxW", err=True)
                raise typer.Exit(2)
            info = generate_images(out, count, size=size, classes=classes, seed=seed, progress=bar.update)
    typer.echo(json.dumps(info) if as_json else f"{info['count']} {info['kind']} written to {info['path']}")


def main() -> None:
    app(prog_name="storage-bench")


if __name__ == "__main__":
    sys.exit(main())
