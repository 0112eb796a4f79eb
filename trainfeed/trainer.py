"""``trainfeed.train``: the ``train`` CLI's run (the ResNet-18 on a store, every step accounted for)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainfeed.training.config import TrainConfig


@dataclass(frozen=True)
class TrainResult:
    """The run's headline figures; ``summary`` is all of summary.json."""

    framework: str
    store: str
    format: str
    steps: int
    global_step: int
    samples_per_s: float | None
    stall_fraction: float | None
    train_accuracy: float | None
    eval_accuracy: float | None
    preempted: bool
    summary: dict[str, Any]


def train(config: TrainConfig) -> TrainResult:
    """Check ``config`` (``UsageError`` for options that cannot work) and train; writes
    summary.json, steps.jsonl and utilization.jsonl to ``config.out``."""
    from trainfeed.training.loops.loop import run

    s = run(config)
    return TrainResult(framework=s["framework"], store=s["store"], format=s["format"], steps=s["steps"],
                       global_step=s["global_step"], samples_per_s=s.get("samples_per_s"),
                       stall_fraction=s.get("stall_fraction"), train_accuracy=s.get("train_accuracy"),
                       eval_accuracy=(s.get("eval") or {}).get("accuracy"), preempted=s["preempted"], summary=s)
