"""Options of a training run, shared by the PyTorch and TensorFlow loops, and their checks."""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, get_args

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.foreign import ForeignSchema
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.layout import check_channels
from trainfeed.training.reading.fitting import Fit
from trainfeed.training.reading.store import EpochOptions
from trainfeed.training.tensorflow_env import import_tensorflow

Framework = Literal["torch", "tf"]
Device = Literal["cpu", "cuda"]
FRAMEWORKS = get_args(Framework)
DEVICES = get_args(Device)
#: numpy's seeding takes 32-bit seeds (and Keras seeds numpy).
MAX_SEED = 2**32 - 1


#: TrainConfig fields whose `train` flag is not the field's name with dashes.
_FLAGS = {"fmt": "format", "labels_csv": "labels", "field_name": "field", "pool": "reader-pool",
          "storage_options": "storage-option"}


@dataclass
class TrainConfig:
    data: str
    fmt: str | None = None
    framework: Framework = "torch"
    device: Device = "cpu"
    batch_size: int = 32  # per rank
    global_batch_size: int | None = None  # all ranks together; None: batch_size x world size (a resume keeps it)
    lanes: int | None = None  # how an epoch is dealt among ranks (training/reading/order.py); None: the default
    steps_per_epoch: int | None = None  # None: a full pass (the global batches of an epoch)
    epochs: int = 1
    workers: int = 2
    pool: str = "arrow"  # readers.POOLS (checked by readers.open_store): arrow is trainfeed's engine
    amp: bool = False
    seed: int = 0
    lr: float = 1e-3
    width: int = 64  # channels of the first stage; 64 is ResNet-18 (33.2M parameters in 3D)
    num_classes: int | None = None  # None: from the label map, else 2
    out: str = "train-out"
    eval_data: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # steps; 0: only on SIGTERM and at the end
    resume: bool = False
    delta_version: int | None = None
    labels_csv: str | None = None
    classes: tuple[str, ...] | None = None  # a folder of small files: class names in label order (else sorted)
    cast: str | None = None  # a folder of small files: arrays read as this dtype where no value changes, or "auto"
    field_name: str | None = None
    shuffle_buffer: int = 256
    warmup_steps: int = 1
    storage_options: dict = field(default_factory=dict)
    io_concurrency: int = 8  # stores on object storage: range requests in flight
    cache_dir: str | None = None  # ... and where to keep what epoch 1 read
    cache_limit: int = 10 * 10**9
    image_size: tuple[int, int] | None = None  # encoded images: (H, W) to decode to; default: the store's size
    fit: str | None = None  # arrays of different shapes: pad:SHAPE | crop:SHAPE | resize:SHAPE (fitting.py)
    channels: str | None = None  # where a sample's channel axis is: first | last; None: as the store says, else last
    augment: bool = True  # encoded images: random resized crop + horizontal flip while training (not evaluating)
    data_service: str | None = None  # grpc://HOST:PORT of a tf.data service dispatcher: input runs on its workers
    foreign: ForeignSchema | None = None  # --data is a table another tool wrote: its columns (--tensor-column ...)
    progress: bool = True
    cli: bool = False  # set by `train`: messages then name its flags (--num-classes), else these fields (num_classes=)

    def option(self, name: str) -> str:
        """How this run's caller spells option ``name`` (a field of this class), ready for a value:
        ``--num-classes `` on the command line, ``num_classes=`` in Python."""
        return "--" + _FLAGS.get(name, name.replace("_", "-")) + " " if self.cli else f"{name}="

    def open_options(self) -> OpenOptions:
        """What ``data`` is opened with: the one place these fields become an ``OpenOptions``."""
        return OpenOptions(version=self.delta_version, field=self.field_name, labels=self.labels_csv,
                           classes=self.classes, cast=self.cast,
                           storage_options=self.storage_options, io_concurrency=self.io_concurrency,
                           cache_dir=self.cache_dir, cache_limit=self.cache_limit, image_size=self.image_size,
                           fit=self.fit, foreign=self.foreign)

    def epoch_options(self, rank: int = 0, world_size: int = 1) -> EpochOptions:
        """How rank ``rank`` of ``world_size`` reads an epoch: the one place these fields become an
        ``EpochOptions`` (the rest keep its defaults). With ``global_batch_size`` each rank's
        batch is its share of it."""
        batch = self.batch_size if self.global_batch_size is None else self.global_batch_size // max(1, world_size)
        return EpochOptions(batch_size=batch, seed=self.seed, shuffle_buffer=self.shuffle_buffer,
                            workers=self.workers, pool=self.pool, rank=rank, world_size=world_size,
                            global_batch_size=self.global_batch_size, lanes=self.lanes, augment=self.augment)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["storage_options"] = sorted(self.storage_options)  # keys only: values may be secrets
        return d


def check(cfg: TrainConfig) -> None:
    """Usage errors (exit 2) and an unusable device (exit 1), before anything is read."""
    if cfg.framework not in FRAMEWORKS:
        raise UsageError(f"--framework must be torch or tf, not {cfg.framework!r}")
    if cfg.device not in DEVICES:
        raise UsageError(f"--device must be cpu or cuda, not {cfg.device!r}")
    for name in ("batch_size", "epochs", "workers", "width", "io_concurrency"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("global_batch_size", "lanes"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if cfg.steps_per_epoch is not None and cfg.steps_per_epoch < 1:
        raise UsageError("--steps-per-epoch must be at least 1")
    if cfg.resume and not cfg.checkpoint_dir:
        raise UsageError("--resume needs --checkpoint-dir")
    if cfg.checkpoint_every < 0:
        raise UsageError("--checkpoint-every must be 0 or more")
    named = FORMATS.get(cfg.fmt) if cfg.fmt is not None else None
    if cfg.delta_version is not None and cfg.fmt is not None and not (named and named.versioned):
        raise UsageError("--delta-version applies to Delta tables only")
    if cfg.delta_version is not None and cfg.delta_version < 0:
        raise UsageError(f"--delta-version must be 0 or more, not {cfg.delta_version}")
    if not (math.isfinite(cfg.lr) and cfg.lr > 0):
        raise UsageError(f"--lr must be a positive number, not {cfg.lr}")
    if not 0 <= cfg.seed <= MAX_SEED:
        raise UsageError(f"--seed must be between 0 and {MAX_SEED}, not {cfg.seed}")
    if cfg.image_size is not None and not (len(cfg.image_size) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in cfg.image_size)):
        raise UsageError(f"--image-size must be two positive integers (height, width), not {cfg.image_size!r}")
    check_channels(cfg.channels)
    if cfg.fit is not None:
        Fit.parse(cfg.fit)
    if cfg.data_service is not None:
        check_data_service(cfg)
    if cfg.warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be 0 or more, not {cfg.warmup_steps}")
    check_folder("--out", cfg.out)
    if cfg.cache_dir:
        check_folder("--cache-dir", cfg.cache_dir)
    if cfg.checkpoint_dir:
        check_folder("--checkpoint-dir", cfg.checkpoint_dir)
    if cfg.device == "cuda":
        if cfg.framework == "torch":
            import torch

            if not torch.cuda.is_available():
                raise TrainfeedError("--device cuda: no CUDA device is available to PyTorch here "
                                     f"(torch {torch.__version__}); use --device cpu")
        else:
            tf = import_tensorflow()

            if not tf.config.list_physical_devices("GPU"):
                raise TrainfeedError("--device cuda: TensorFlow sees no GPU here (tensorflow-cpu is installed); "
                                     "use --device cpu")


def check_data_service(cfg: TrainConfig) -> None:
    """Both frameworks: the trainer is a tf.data service client, so TensorFlow must import here."""
    from trainfeed.training.reading.service_input import dispatcher_host_port, require_tensorflow

    if cfg.resume:
        raise UsageError("--data-service does not combine with --resume: the service hands samples to its workers "
                         "in no fixed order, so a mid-epoch position cannot be resumed without repeats")
    if distributed_env()[1] > 1:
        raise UsageError("--data-service feeds one training process: each rank would get the whole epoch; "
                         "run without torchrun/TorchDistributor, or without --data-service")
    assert cfg.data_service is not None, "checked only when --data-service is given"
    dispatcher_host_port(cfg.data_service)
    require_tensorflow()


def check_folder(option: str, path: str) -> None:
    """``path`` must be a folder or creatable as one: no file in the way, at it or above it."""
    for candidate in (Path(path), *Path(path).parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "it is a file" if candidate == Path(path) else f"{candidate} is a file"
                raise UsageError(f"{path}: {option} must be a folder; {where}")
            return


def distributed_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) as torchrun / TorchDistributor set them (RANK, WORLD_SIZE,
    LOCAL_RANK; none of them: a single process). Settings that name no rank of a world are refused."""
    env = {name: os.environ.get(name, "").strip() for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    for name, value in env.items():
        if value and not value.lstrip("-").isdigit():
            raise UsageError(f"{name}={value!r} in the environment is not an integer")
    if bool(env["RANK"]) != bool(env["WORLD_SIZE"]):
        given, missing = ("RANK", "WORLD_SIZE") if env["RANK"] else ("WORLD_SIZE", "RANK")
        raise UsageError(f"{given} is set in the environment but {missing} is not: set both (torchrun does), "
                         "or neither for a single process")
    rank, world = int(env["RANK"] or 0), int(env["WORLD_SIZE"] or 1)
    if world < 1 or not 0 <= rank < world:
        raise UsageError(f"RANK={rank} and WORLD_SIZE={world} in the environment: the rank must be 0 to "
                         f"WORLD_SIZE - 1, and WORLD_SIZE at least 1")
    return rank, world, int(env["LOCAL_RANK"] or 0)
