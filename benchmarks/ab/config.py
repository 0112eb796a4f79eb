"""What a storage A/B matrix is: the stores, nodes and image storages it can name, its settings
(MatrixConfig), the matrix a scenario file describes (prepare), and how an error fails one
cell (or one store's cells) without stopping the matrix (``stage``)."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from trainfeed.benchmarks.model.profiles import save_object_store
from trainfeed.benchmarks.model.scenario import SCENARIO_COPY, Scenario
from trainfeed.benchmarks.synth import generate_volumes
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.redact import redact
from trainfeed.converters.sources.decode import ArrayOptions
from trainfeed.converters.storage.fetch import DEFAULT_IO_CONCURRENCY

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

    def __init__(self, stage: str, reason: str):
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


@dataclass
class MatrixConfig:
    src: str  # folder of small files (the blob layout)
    out: str
    labels_csv: str | None = None
    stores: tuple[str, ...] = STORES
    nodes: tuple[str, ...] = ("cpu", "t4", "h100")
    frameworks: tuple[str, ...] = ("torch",)
    steps: int = 20
    cpu_steps: int = 4  # real-model steps on a CPU node are slow; fewer of them
    batch_size: int = 32
    repeats: int = 1
    width: int = 64
    workers: int = 4  # reader threads (blob: files read at once, locally)
    io_concurrency: int = DEFAULT_IO_CONCURRENCY  # remote or emulated storage: range requests in flight per reader
    storage_backend: str = "local"  # local (OUT/stores), azurite, or a URL
    storage_profile: str | None = "azure-blob"  # latency emulation around every store; None: as is
    storage_options: dict = field(default_factory=dict)  # SRC's, --labels' and a URL backend's
    amp: bool = False
    # image folders: the size every image is resized to (at conversion, and by the reader for the
    # small files), and how the compacted stores hold the images: one store of each per format
    resize: tuple[int, int] | None = None
    image_storage: tuple[str, ...] = IMAGE_STORAGES
    image_mode: str = "RGB"  # what the conversion decodes images to: RGB or L (convert --image-mode)
    reduce_depth: bool = False  # the conversion takes a 16-bit image it cannot keep at 8 bits (--reduce-depth)
    promote_depth: bool = False  # with image_mode L, the conversion stores 8-bit greyscale as 16-bit (--promote-depth)
    # arrays: how the compacted stores hold them and how every store is read (convert's and train's options)
    arrays: ArrayOptions = field(default_factory=ArrayOptions)  # --ragged, --dtype, --channels of the conversion
    fit: str | None = None  # samples of different shapes: pad/crop/resize:SHAPE, for every store alike (train --fit)


def prepare(scenario: Scenario, out: Path, src: str | None, log, storage_backend: str = "local",
            storage_options: dict | None = None) -> MatrixConfig:
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
