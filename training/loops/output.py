"""What a run writes: the files in ``--out`` (steps, utilization, summary.json), the summary
itself, and notices on stderr; all redacted."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from trainfeed.converters.redact import redact, redact_obj
from trainfeed.training.config import TrainConfig
from trainfeed.training.loops.plan import Plan
from trainfeed.training.metrics import JsonLines, StepTimer, UtilizationSampler, environment


def notice(message: str) -> None:
    """A line on stderr for the user (redacted, like everything trainfeed prints)."""
    print(redact(f"train: {message}"), file=sys.stderr, flush=True)


class RunFiles:
    """``--out``: steps.jsonl, utilization.jsonl, summary.json (rank 0; other ranks suffix -rankN)."""

    def __init__(self, out: str, rank: int = 0) -> None:
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        suffix = "" if rank == 0 else f"-rank{rank}"
        self.steps = JsonLines(self.dir / f"steps{suffix}.jsonl")
        self.util = JsonLines(self.dir / f"utilization{suffix}.jsonl")
        self.summary_path = self.dir / f"summary{suffix}.json"

    def write_summary(self, summary: dict[str, Any]) -> None:
        tmp = self.summary_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=1))
        tmp.replace(self.summary_path)

    def close(self) -> None:
        self.steps.close()
        self.util.close()


def summarize(cfg: TrainConfig, p: Plan, timer: StepTimer, util: UtilizationSampler,
              extra: dict[str, Any]) -> dict[str, Any]:
    """summary.json: redacted, as it is written to a file and printed (--json)."""
    sample_shape = p.store.sample_spec.shape
    assert sample_shape is not None, "plan() accepts only stores of a fixed sample shape"
    summary: dict[str, Any] = redact_obj({
        "framework": cfg.framework, "device": cfg.device, "store": p.store.path, "format": p.store.fmt,
        "delta_version": p.store.version, "field": p.store.spec.name,
        "sample_shape": list(sample_shape),
        "batch_size": p.epoch.rank_batch, "global_batch_size": p.epoch.global_batch, "lanes": p.epoch.lane_count,
        "steps_per_epoch": p.steps_per_epoch, "epochs": cfg.epochs,
        "rank": p.rank, "world_size": p.world, "num_classes": p.num_classes,
        **timer.summary(), "utilization": util.summary(), "environment": environment(),
        "config": cfg.to_dict(), **extra,
    })
    return summary
