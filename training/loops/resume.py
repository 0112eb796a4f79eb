"""Where a run stands and how it stops and starts again: the position a checkpoint records,
what a checkpoint must match to be resumed, and preemption (SIGTERM) checked after every step."""
from __future__ import annotations

import json
import signal
from collections.abc import Callable
from dataclasses import dataclass

from trainfeed.converters.errors import TrainfeedError
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
    """What a checkpoint must match to be resumed, as JSON: the data (by content, not by path),
    the model, and what the order of an epoch depends on (a position names a global batch of
    that order), not the pacing nor the number of ranks, workers or threads."""
    key = {"data": store_identity(p.store), "field": p.store.spec.name, "framework": cfg.framework,
           "width": cfg.width, "num_classes": p.num_classes, "seed": cfg.epoch.seed,
           "global_batch_size": p.epoch.global_batch, "lanes": p.epoch.lane_count,
           "shuffle_buffer": p.epoch.shuffle_buffer}
    return json.dumps(key, sort_keys=True)


#: How ``check_signature`` names what differs, with the option that sets it.
_DIFFERENCES = {"data": "other data (another store, or another version of it)", "field": "another --field",
                "framework": "another --framework", "width": "another --width", "num_classes": "other classes",
                "seed": "another --seed", "global_batch_size": "another global batch size",
                "lanes": "other --lanes", "shuffle_buffer": "another --shuffle-buffer"}


def check_signature(where: object, stored: str, signature: str) -> None:
    """Refuse a checkpoint written for ``stored`` when this run is ``signature``, naming what differs."""
    if stored == signature:
        return
    try:
        theirs, ours = json.loads(stored), json.loads(signature)
    except ValueError:
        theirs, ours = {}, {}
    if not isinstance(theirs, dict) or not theirs:
        raise TrainfeedError(f"{where}: checkpoint was written for other data or another model; use a fresh "
                             "--checkpoint-dir")
    differ = [f"{_DIFFERENCES.get(k, k)} ({theirs.get(k)!r} in the checkpoint, {ours.get(k)!r} now)"
              for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k) and k != "data"]
    if theirs.get("data") != ours.get("data"):
        differ.insert(0, _DIFFERENCES["data"])
    raise TrainfeedError(f"{where}: checkpoint cannot be resumed by this run: written for " + "; ".join(differ)
                         + "; run with the checkpoint's settings, or use a fresh --checkpoint-dir")


class Preemption(SignalFlag):
    """SIGTERM (a spot node being reclaimed) sets a flag the loop checks after every step."""

    def __init__(self) -> None:
        super().__init__(signal.SIGTERM)


def after_step(cfg: TrainConfig, global_step: int, preemption: Preemption, save: Callable[[], None]) -> bool:
    """Checkpoint every --checkpoint-every steps, and on SIGTERM; True when the run must stop."""
    if cfg.checkpoint_every and global_step % cfg.checkpoint_every == 0:
        save()
    if preemption.requested:
        save()
        return True
    return False
