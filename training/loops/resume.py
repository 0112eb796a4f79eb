"""Where a run stands and how it stops and starts again: the position a checkpoint records,
what a checkpoint must match to be resumed, and preemption (SIGTERM) checked after every step."""
from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass

from trainfeed.converters.interrupt import SignalFlag
from trainfeed.training.config import TrainConfig
from trainfeed.training.loops.plan import Plan
from trainfeed.training.reading.readers import store_identity

#: Marks a checkpoint as trainfeed's (both frameworks): anything else is refused unread.
CHECKPOINT_FORMAT = "trainfeed-checkpoint/1"


@dataclass(frozen=True)
class Position:
    """Where a run stands: the next step is ``step_in_epoch`` of ``epoch``; ``global_step`` steps are done."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0


def checkpoint_signature(cfg: TrainConfig, p: Plan) -> str:
    """What a checkpoint must match to be resumed: the data (by content, not by path) and the
    model, not the pacing."""
    key = {"data": store_identity(p.store), "field": p.store.spec.name, "framework": cfg.framework,
           "width": cfg.width, "num_classes": p.num_classes, "seed": cfg.seed}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


class Preemption(SignalFlag):
    """SIGTERM (a spot node being reclaimed) sets a flag the loop checks after every step."""

    def __init__(self) -> None:
        super().__init__(signal.SIGTERM)


def after_step(cfg: TrainConfig, global_step: int, preemption: "Preemption", save: Callable[[], None]) -> bool:
    """Checkpoint every --checkpoint-every steps, and on SIGTERM; True when the run must stop."""
    if cfg.checkpoint_every and global_step % cfg.checkpoint_every == 0:
        save()
    if preemption.requested:
        save()
        return True
    return False
