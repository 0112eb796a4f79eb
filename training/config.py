"""Options of a training run, shared by the PyTorch and TensorFlow loops, and their checks."""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.layout import check_channels
from trainfeed.converters.option_docs import flag_of, option
from trainfeed.training.frameworks import FRAMEWORKS, choices, framework
from trainfeed.training.reading.fitting import Fit
from trainfeed.training.reading.store import EpochOptions

Device = Literal["cpu", "cuda"]
DEVICES = get_args(Device)
#: numpy's seeding takes 32-bit seeds (and Keras seeds numpy).
MAX_SEED = 2**32 - 1


@dataclass
class TrainConfig:
    """A training run: how ``data`` is opened (``store``, an ``OpenOptions``), how each epoch is
    read (``epoch``, an ``EpochOptions``: its rank and world size are set per process), and the
    run's own settings. The ``train`` command's flags are made from these fields' declarations."""

    data: str = option(help="A store (Parquet, Delta, HDF5), a folder of small files (blob), or with "
                       "--tensor-column a Parquet or Delta table another tool wrote: a local path or a URL (abfs://, "
                       "az://, abfss://, s3://, gs://, file://).")
    store: OpenOptions = field(default_factory=OpenOptions)
    epoch: EpochOptions = field(default_factory=lambda: EpochOptions(augment=True))
    fmt: str | None = option(None, flag="format", help="Force the format instead of detecting it.")
    framework: str = option("torch", help="The framework that trains the model.")
    device: Device = option("cpu", help="cuda: pinned memory, non-blocking copies, device prefetch, synchronized "
                            "timing.")
    steps_per_epoch: int | None = option(None, help="Steps per epoch. Default: one pass over the data (the global "
                                         "batches of an epoch).")
    epochs: int = option(1, help="Epochs to train.")
    amp: bool = option(False, help="Mixed precision: bf16 where supported, else fp16 with loss scaling.")
    lr: float = option(1e-3, help="Adam learning rate (a positive number).")
    width: int = option(64, help="Channels of the first stage: 64 is ResNet-18 (3D: 33.2M parameters); smaller is "
                        "for quick runs.")
    num_classes: int | None = option(None, help="Classes the model predicts. Default: the store's label map, else "
                                     "(integer labels) the highest label + 1, at least 2; a label outside them is "
                                     "refused before training.")
    out: str = option("train-out", help="Folder for summary.json and the JSON-lines logs (created if missing; a file "
                      "there is a usage error).")
    eval_data: str | None = option(None, help="A held-out store: accuracy reported at the end. Checked before "
                                   "training: same field, sample shape and dtype as the training data, labeled, "
                                   "labels within the model's classes.")
    checkpoint_dir: str | None = option(None, help="Folder for checkpoints (created if missing).")
    checkpoint_every: int = option(0, help="Steps between checkpoints (0: only on SIGTERM and at the end).")
    resume: bool = option(False, help="Continue from the checkpoint in the checkpoint folder; when there is none "
                          "yet, start from the first step (said on stderr). A checkpoint that is not trainfeed's, is "
                          "damaged, or was written for other data (by content, whatever its path) or another model "
                          "is refused (exit 1); nothing in it is run.")
    warmup_steps: int = option(1, help="Steps excluded from the summary (0 to the run's total steps).")
    channels: str | None = option(None, help="Where a sample's channel axis is: last ((H, W, C), (X, Y, Z, C)), the "
                                  "default, or first ((C, H, W)), moved to the end for the model. Default: what the "
                                  "store records (convert --channels); a shape that looks channels-first with nothing "
                                  "recorded is refused until you say which.")
    data_service: str | None = option(None, help="Image folders (JPEG/PNG files), either framework: grpc://HOST:PORT "
                                      "of a tf.data service dispatcher; reading, decoding, resizing and augmenting "
                                      "then run on the service's workers (other processes or machines, started with "
                                      "`python -m trainfeed.training.data_service worker`), in TensorFlow ops "
                                      "(pixels differ slightly from the Pillow path). The trainer receives the "
                                      "batches as the service's client, so PyTorch needs TensorFlow installed too "
                                      "(pip install 'trainfeed[tf]', tensorflow-cpu). Every sample once per epoch, "
                                      "in no reproducible order; one training process; no resume.")
    progress: bool = option(True, flag="progress/--no-progress", help="Show progress on stderr.")
    cli: bool = False  # set by `train`: messages then name its flags (--num-classes), else these fields (num_classes=)

    def option(self, name: str) -> str:
        """How this run's caller spells option ``name`` (a field of this class, of ``OpenOptions``
        or of ``EpochOptions``), ready for a value: ``--num-classes `` on the command line,
        ``num_classes=`` in Python."""
        owner = next(cls for cls in (TrainConfig, OpenOptions, EpochOptions) if name in {f.name for f in fields(cls)})
        return flag_of(owner, name).split("/")[0] + " " if self.cli else f"{name}="

    def epoch_options(self, rank: int = 0, world_size: int = 1) -> EpochOptions:
        """How rank ``rank`` of ``world_size`` reads an epoch: ``epoch`` for that rank. With a
        ``global_batch_size`` each rank's batch is its share of it."""
        e = self.epoch
        batch = e.batch_size if e.global_batch_size is None else e.global_batch_size // max(1, world_size)
        return replace(e, batch_size=batch, rank=rank, world_size=world_size)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["store"]["storage_options"] = sorted(self.store.storage_options)  # keys only: values may be secrets
        return d


def check(cfg: TrainConfig) -> None:
    """Usage errors (exit 2) and an unusable device (exit 1), before anything is read."""
    if cfg.framework not in FRAMEWORKS:
        raise UsageError(f"--framework must be {choices()}, not {cfg.framework!r}")
    if cfg.device not in DEVICES:
        raise UsageError(f"--device must be cpu or cuda, not {cfg.device!r}")
    # the EpochOptions checked its own (batch size, workers, global batch, lanes) when it was made
    for owner, name in ((cfg, "epochs"), (cfg, "width"), (cfg.store, "io_concurrency")):
        if getattr(owner, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if cfg.steps_per_epoch is not None and cfg.steps_per_epoch < 1:
        raise UsageError("--steps-per-epoch must be at least 1")
    if cfg.resume and not cfg.checkpoint_dir:
        raise UsageError("--resume needs --checkpoint-dir")
    if cfg.checkpoint_every < 0:
        raise UsageError("--checkpoint-every must be 0 or more")
    named = FORMATS.get(cfg.fmt) if cfg.fmt is not None else None
    if cfg.store.version is not None and cfg.fmt is not None and not (named and named.versioned):
        raise UsageError("--delta-version applies to Delta tables only")
    if cfg.store.version is not None and cfg.store.version < 0:
        raise UsageError(f"--delta-version must be 0 or more, not {cfg.store.version}")
    if not (math.isfinite(cfg.lr) and cfg.lr > 0):
        raise UsageError(f"--lr must be a positive number, not {cfg.lr}")
    if not 0 <= cfg.epoch.seed <= MAX_SEED:
        raise UsageError(f"--seed must be between 0 and {MAX_SEED}, not {cfg.epoch.seed}")
    if cfg.store.image_size is not None and not (len(cfg.store.image_size) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in cfg.store.image_size)):
        raise UsageError(f"--image-size must be two positive integers (height, width), not {cfg.store.image_size!r}")
    check_channels(cfg.channels)
    if cfg.store.fit is not None:
        Fit.parse(cfg.store.fit)
    if cfg.data_service is not None:
        check_data_service(cfg)
    if cfg.warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be 0 or more, not {cfg.warmup_steps}")
    check_folder("--out", cfg.out)
    if cfg.store.cache_dir:
        check_folder("--cache-dir", cfg.store.cache_dir)
    if cfg.checkpoint_dir:
        check_folder("--checkpoint-dir", cfg.checkpoint_dir)
    if cfg.device == "cuda":
        framework(cfg.framework).check_cuda()


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
