"""What a storage A/B matrix is: the stores, nodes and image storages it can name, its settings
(MatrixConfig), the matrix a scenario file describes (prepare), and how an error fails one
cell (or one store's cells) without stopping the matrix (``stage``)."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfeed.benchmarks.model.catalog import CATALOG
from trainfeed.benchmarks.model.profiles import save_object_store
from trainfeed.benchmarks.model.scenario import SCENARIO_COPY, Scenario
from trainfeed.benchmarks.synth import generate_volumes
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.option_docs import borrow, help_of, option
from trainfeed.converters.redact import redact
from trainfeed.converters.sources.decode import ArrayOptions, ImageOptions

#: The small-file layout as it is (the baseline), then every format of the registry.
STORES = tuple(dict.fromkeys(("blob", *FORMATS)))
#: How a compacted store of an image folder holds its images (``convert --image-storage``).
IMAGE_STORAGES = ("encoded", "decoded")
REAL_NODES = ("cpu", "cuda")
#: The errors a cell expects to meet (the data, the storage, a library refusing): their message
#: is the reason as it is. Any other error fails the cell too, named by its type.
CELL_ERRORS = (TrainfeedError, RuntimeError, OSError)


class CellFailed(Exception):
    """A cell (or every cell of a store) failed at ``stage``; ``reason``: why, redacted."""

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(reason)
        self.stage, self.reason = stage, reason


def in_our_words(message: str) -> str:
    """A reader's message as `storage-bench run` spells its options (it resizes with --resize)."""
    return message.replace("pass --image-size HxW", "pass --resize HxW")


def why(exc: BaseException) -> str:
    """The reason an error gives, redacted and in storage-bench's words; an error outside
    CELL_ERRORS (a bug, an unforeseen library error) is named by its type."""
    text = in_our_words(redact(exc))
    return text if isinstance(exc, CELL_ERRORS) else f"unexpected {type(exc).__name__}: {text}"


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Any error inside fails the cell at stage ``name`` (a CellFailed), never the matrix: a
    cell's measurement runs libraries and models whose errors no list foresees."""
    try:
        yield
    except CellFailed:
        raise
    except Exception as exc:
        raise CellFailed(name, why(exc)) from exc


#: What storage-bench adds to a conversion option's help.
COMPACTED = " (storage-bench: the compacted stores' conversion.)"


@dataclass
class MatrixConfig:
    src: str  # folder of small files (the blob layout)
    out: str
    labels_csv: str | None = option(None, flag="labels", help="Labels CSV (id,label); default SRC/labels.csv if "
                                    "present. A local file, inside SRC, or on the storage backend.")
    stores: tuple[str, ...] = option(STORES, cli_default=",".join(STORES), help="Comma-separated: "
                                     f"{', '.join(STORES)}.")
    nodes: tuple[str, ...] = option(("cpu", "t4", "h100"), cli_default="cpu,t4,h100", help="Comma-separated: cpu, "
                                    "cuda (a real GPU), emulated t4, v100, a10g, a100, h100, or a profile file from "
                                    "`calibrate`.")
    frameworks: tuple[str, ...] = option(("torch",), cli_default="torch", help="Comma-separated: torch, tf (tf on "
                                         "real nodes only matters for compute).")
    steps: int = option(30, help="Measured steps per cell on emulated nodes (plus one warm-up).")
    cpu_steps: int = option(4, help="Steps per cell on a real CPU node (the full model is slow there).")
    batch_size: int = option(32, help="Samples per step, every cell.")
    repeats: int = option(1, help="Times each cell is measured (the report's spread).")
    width: int = option(64, help="Model width: 64 is ResNet-18 (33.2M parameters in 3D).")
    workers: int = option(4, help="Reader threads, the same for every store (small files: files read at once).")
    io_concurrency: int = borrow(OpenOptions, "io_concurrency", help_suffix=" (storage-bench: each reader's, "
                                 "whatever the layout: small files one GET each, row groups 8 MB parts.)")
    storage_backend: str = option("local", help="Where every store is staged and read from: local (OUT/stores), "
                                  "azurite (a local Azurite, the real Azure Blob API, started for the run), or a URL "
                                  "such as abfs://container/folder (with storage options; storage-bench replaces "
                                  "what it stages there).")
    storage_profile: str | None = option("azure-blob", help="Latency emulation every read goes through: azure-blob, "
                                         "s3, lan, a profile file written by `storage-bench probe`, or none (on a "
                                         "real cloud, where latency is real).")
    storage_options: dict[str, Any] = option(factory=dict, flag="storage-option", help="For a remote SRC, the "
                                             "labels and a URL storage backend, in fsspec's names.")
    amp: bool = False  # mixed precision in every cell's steps (the calibration's)
    # image folders: the size every image is resized to (at conversion, and by the reader for the
    # small files), and how the compacted stores hold the images: one store of each per format
    resize: tuple[int, int] | None = borrow(ImageOptions, "resize", help_suffix=" (storage-bench: at conversion "
                                            "for the compacted stores, by the reader for the small files.)")
    image_storage: tuple[str, ...] = option(IMAGE_STORAGES, flag="image-storage", cli_default=",".join(IMAGE_STORAGES),
                                            help=help_of(ImageOptions, "storage") + " (storage-bench: several, "
                                            "comma-separated: one compacted store per format and choice, named "
                                            "FORMAT-encoded, FORMAT-decoded.)")
    image_mode: str = borrow(ImageOptions, "mode", help_suffix=COMPACTED)
    reduce_depth: bool = borrow(ImageOptions, "reduce_depth", help_suffix=COMPACTED)
    promote_depth: bool = borrow(ImageOptions, "promote_depth", help_suffix=COMPACTED)
    # arrays: how the compacted stores hold them and how every store is read (convert's and train's options)
    arrays: ArrayOptions = field(default_factory=ArrayOptions)  # --ragged, --dtype, --channels of the conversion
    fit: str | None = borrow(OpenOptions, "fit", help_suffix=" (storage-bench: every store, the small files too.)")


@dataclass(frozen=True)
class ReportConfig:
    """What the report projects onto: the full job, the instance catalog, the loader and the
    instance to compare with (storage-bench run and report, the Spark benchmark job's merge)."""

    target_samples: int = option(650_000, help="Your full dataset's size, for projections.")
    target_epochs: int = option(5, help="Epochs of your full training job, for projections.")
    catalog: Path = option(CATALOG, help="Instance catalog CSV (prices with date and source).")
    baseline_loader: str | None = option(None, help="Your current loader, for the small files' row: KEY=VALUE,... "
                                         "of name, concurrency (requests in flight), threads (that read and "
                                         "decode; default: concurrency), prefetch (on/off), framework. E.g. "
                                         "concurrency=1,prefetch=off,framework=tf for a generator reading one file "
                                         "at a time. The report then says what repacking gains over it and what "
                                         "better loading alone would gain.")
    my_instance: str | None = option(None, help="The instance you train on today, by its catalog name (e.g. "
                                     "Standard_NC4as_T4_v3; `storage-bench prices` lists them): the report's costs "
                                     "always show it beside the fastest, the cheapest and the best per dollar of "
                                     "each node type.")


def prepare(scenario: Scenario, out: Path, src: str | None, log: Callable[[str], None], storage_backend: str = "local",
            storage_options: dict[str, Any] | None = None) -> MatrixConfig:
    """The matrix a scenario measures: its stores on its nodes' devices, staged on
    ``storage_backend`` with the scenario's storage latency emulated around every read, on SRC
    or (without one) a dataset of the scenario's shape generated into OUT/data. The scenario
    file is copied into OUT (the report reads it)."""
    out.mkdir(parents=True, exist_ok=True)
    if src is None:
        data = out / "data"
        if not (data / "labels.csv").is_file():
            if data.exists():
                raise TrainfeedError(f"{data}: exists but holds no generated dataset (labels.csv); remove it")
            log(f"scenario: generating {scenario.data_count} samples of "
                f"{'x'.join(map(str, scenario.sample_shape))} into {data}")
            generate_volumes(data, scenario.data_count, shape=scenario.sample_shape, seed=0, labels="csv")
        src = str(data)
    profile = out / "storage-profile.json"
    save_object_store(scenario.storage, profile)
    (out / SCENARIO_COPY).write_text(scenario.path.read_text())
    labels = Path(src) / "labels.csv"
    return MatrixConfig(src=src, out=str(out), labels_csv=str(labels) if labels.is_file() else None,
                        stores=scenario.stores, nodes=tuple(dict.fromkeys(n.measure for n in scenario.nodes)),
                        frameworks=(scenario.framework,), steps=scenario.steps, cpu_steps=scenario.cpu_steps,
                        batch_size=scenario.batch_size, width=scenario.width, storage_profile=str(profile),
                        storage_backend=storage_backend, storage_options=dict(storage_options or {}))
