"""The training frameworks ``--framework`` offers, each described once: its name and label,
how it checks that ``--device cuda`` can work, how it builds itself for one run (the training
loop's ``FrameworkRun``), its compute-only step for the benchmark, and the libraries whose
versions a measurement reports.

Every framework is imported only when a run needs it (TensorFlow is heavy and optional), so
reading this registry imports neither. ``register`` adds one (a test's toy framework);
``FRAMEWORKS`` is what the commands offer."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError

if TYPE_CHECKING:
    from trainfeed.training.config import TrainConfig
    from trainfeed.training.loops.plan import Plan
    from trainfeed.training.loops.resume import Position
    from trainfeed.training.reading.store import Batch

#: A batch as one framework's step takes it (``to_inputs`` makes it, ``step`` takes it).
Inputs = TypeVar("Inputs")


class FrameworkRun(Protocol[Inputs]):
    """What the training loop needs from a framework, built for one run: the model and its
    optimizer exist once the object does (seeded by ``cfg.seed``)."""

    def parameters(self) -> dict[str, int]: ...

    def to_inputs(self, batch: Batch) -> Inputs:
        """The batch as the step takes it; runs in the prefetch thread (e.g. pinned tensors)."""

    def step(self, inputs: Inputs) -> tuple[float, int]:
        """One optimizer step, finished on the device when it returns: (loss, correct predictions)."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class indices for samples in the model's input shape (evaluation mode)."""

    def restore(self, signature: str) -> Position | None:
        """Load the checkpoint in ``cfg.checkpoint_dir``, refused unless trainfeed wrote it for
        ``signature``; None when there is none yet."""

    def save(self, position: Position, signature: str) -> None:
        """Write a checkpoint to ``cfg.checkpoint_dir`` (a kill mid-save keeps the previous one)."""


#: The benchmark's compute-only step: (sample shape, batch, width, steps, device, amp) -> (median
#: seconds of a training step on synthetic data already on the device, CPU-seconds per step).
ComputeOnly = Callable[[tuple[int, ...], int, int, int, str, bool], tuple[float, float]]


class Library(NamedTuple):
    """A library whose version a measurement reports, and the distributions it installs as
    (the first one installed gives the version)."""

    name: str
    distributions: tuple[str, ...]


@dataclass(frozen=True)
class Framework:
    """One framework trainfeed trains with."""

    name: str  # what --framework takes
    label: str  # what a person calls it
    start: Callable[[TrainConfig, Plan], FrameworkRun[Any]]  # imports the framework, builds model and optimizer
    check_cuda: Callable[[], None]  # raises TrainfeedError when --device cuda cannot work here
    compute_only: ComputeOnly
    libraries: tuple[Library, ...]
    data_parallel: bool = False  # trains on several processes (TorchDistributor, --processes > 1)


def _start_torch(cfg: TrainConfig, p: Plan) -> FrameworkRun[Any]:
    from trainfeed.training.loops.loop_torch import Torch

    return Torch(cfg, p)


def _check_torch_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise TrainfeedError("--device cuda: no CUDA device is available to PyTorch here "
                             f"(torch {torch.__version__}); use --device cpu")


def _compute_only_torch(shape: tuple[int, ...], batch: int, width: int, steps: int, device: str,
                        amp: bool) -> tuple[float, float]:
    from trainfeed.training.loops.loop_torch import compute_only

    return compute_only(shape, batch, width, steps, device, amp)


def _start_tensorflow(cfg: TrainConfig, p: Plan) -> FrameworkRun[Any]:
    from trainfeed.training.loops.loop_tf import TensorFlow

    return TensorFlow(cfg, p)


def _check_tensorflow_cuda() -> None:
    from trainfeed.training.tensorflow_env import import_tensorflow

    if not import_tensorflow().config.list_physical_devices("GPU"):
        raise TrainfeedError("--device cuda: TensorFlow sees no GPU here (tensorflow-cpu is installed); "
                             "use --device cpu")


def _compute_only_tensorflow(shape: tuple[int, ...], batch: int, width: int, steps: int, device: str,
                             amp: bool) -> tuple[float, float]:
    from trainfeed.training.loops.loop_tf import compute_only

    return compute_only(shape, batch, width, steps, device, amp)


TORCH = Framework("torch", "PyTorch", _start_torch, _check_torch_cuda, _compute_only_torch,
                  (Library("torch", ("torch",)),), data_parallel=True)
TENSORFLOW = Framework("tf", "TensorFlow", _start_tensorflow, _check_tensorflow_cuda, _compute_only_tensorflow,
                       (Library("tensorflow", ("tensorflow-cpu", "tensorflow")),))

_REGISTERED: dict[str, Framework] = {fw.name: fw for fw in (TORCH, TENSORFLOW)}
#: The registered frameworks by name (a read-only view: ``register`` and ``unregister`` change it).
FRAMEWORKS: Mapping[str, Framework] = MappingProxyType(_REGISTERED)


def choices() -> str:
    """The registered names as a message lists them: ``torch or tf``."""
    names = list(FRAMEWORKS)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def framework(name: str) -> Framework:
    """The framework called ``name``; a ``UsageError`` naming the choices when none is."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise UsageError(f"unknown framework {name!r}: choose {choices()}") from None


def register(fw: Framework) -> None:
    """Offer ``fw`` to every command started after this (a name is registered once)."""
    if fw.name in _REGISTERED:
        raise ValueError(f"a framework named {fw.name!r} is registered already")
    _REGISTERED[fw.name] = fw


def unregister(name: str) -> None:
    """Offer the framework called ``name`` no longer."""
    del _REGISTERED[name]
