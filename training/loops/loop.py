"""The one training loop, for every framework: plan the run, restore a checkpoint, step
through the epochs (every step split into data wait and compute), checkpoint, stop cleanly
on SIGTERM, resume mid-epoch without re-reading, evaluate, and write the summary.

What differs between frameworks lives behind ``FrameworkRun`` (training/frameworks.py; PyTorch's
in loop_torch.py, TensorFlow's in loop_tf.py): building the model, one optimizer step,
prediction, and checkpoint files."""
from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import closing
from typing import Any

from trainfeed.converters.progress import progress_bar
from trainfeed.training.config import TrainConfig, check
from trainfeed.training.frameworks import FrameworkRun, framework
from trainfeed.training.loops.output import RunFiles, notice, summarize
from trainfeed.training.loops.plan import Plan, as_model_input, check_labels, eval_epoch, plan
from trainfeed.training.loops.resume import Position, Preemption, after_step, checkpoint_signature
from trainfeed.training.metrics import StepTimer, UtilizationSampler, record
from trainfeed.training.reading.prefetch import Prefetcher
from trainfeed.training.reading.readers import iter_batches
from trainfeed.training.reading.store import Batch


def run(cfg: TrainConfig) -> dict[str, Any]:
    """``train``, the command and the API: check the options (``UsageError``), then train; the
    summary (summary.json)."""
    check(cfg)
    return train(cfg)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train ``cfg``'s model on ``cfg.data`` (options checked by ``config.check``); the summary."""
    p = plan(cfg)
    for note in p.notes if p.rank == 0 else []:
        notice(note)
    fw = framework(cfg.framework).start(cfg, p)
    signature = checkpoint_signature(cfg, p) if cfg.checkpoint_dir else None
    start = _start(cfg, p, fw, signature)

    def checkpoint(position: Position) -> None:
        if signature is not None:
            fw.save(position, signature)

    files = RunFiles(cfg.out, p.rank)
    timer = StepTimer(warmup_steps=cfg.warmup_steps, sink=files.steps)
    global_step, preempted = start.global_step, False
    correct = seen = delivered = 0
    t_start = time.perf_counter()
    with UtilizationSampler(sink=files.util) as util, Preemption() as preemption, \
            progress_bar(enabled=cfg.progress and p.rank == 0, label="train", unit="steps") as bar:
        bar.start(cfg.epochs * p.steps_per_epoch)
        for epoch in range(start.epoch, cfg.epochs):
            first = start.step_in_epoch if epoch == start.epoch else 0
            batches = _batches(cfg, p, epoch, first)
            with closing(Prefetcher(batches, fw.to_inputs)) as prefetch:
                for step_in_epoch in range(first, p.steps_per_epoch):
                    item, wait = prefetch.get()
                    if item is None:
                        break
                    batch, inputs = item
                    check_labels(batch, p.num_classes, cfg.data, cfg.option("num_classes"))
                    t0 = time.perf_counter()
                    loss, hits = fw.step(inputs)
                    compute = time.perf_counter() - t0
                    global_step += 1
                    correct, seen = correct + hits, seen + len(batch.ids)
                    delivered += record(timer, global_step, epoch, wait, compute, len(batch.ids), batch.nbytes,
                                        loss).bytes
                    bar.update(global_step, delivered)
                    here = Position(epoch, step_in_epoch + 1, global_step)
                    if after_step(cfg, global_step, preemption, functools.partial(checkpoint, here)):
                        preempted = True
                        break
            if preempted:
                break
        if not preempted:
            checkpoint(Position(cfg.epochs, 0, global_step))
    extra: dict[str, Any] = {
        "parameters": fw.parameters(), "train_accuracy": round(correct / seen, 4) if seen else None,
        "preempted": preempted, "resumed_from_step": start.global_step if cfg.resume else None,
        "global_step": global_step, "run_seconds": round(time.perf_counter() - t_start, 3)}
    threads = getattr(fw, "threads", None)
    if threads:
        extra["torch_threads"] = threads
    if p.eval_store is not None and not preempted and p.rank == 0:
        extra["eval"] = evaluate(cfg, p, fw)
    summary = summarize(cfg, p, timer, util, extra)
    files.write_summary(summary)
    files.close()
    return summary


def _batches(cfg: TrainConfig, p: Plan, epoch: int, first: int) -> Iterator[Batch]:
    if cfg.data_service:  # read + decode + augment on the tf.data service's workers (no resume: first is 0)
        from trainfeed.training.reading.service_input import iter_batches as service_batches

        return service_batches(p.store, p.epoch, epoch, cfg.data_service)
    return iter_batches(p.store, p.epoch, epoch, start_batch=first)  # a resume reads no earlier piece


def _start(cfg: TrainConfig, p: Plan, fw: FrameworkRun[Any], signature: str | None) -> Position:
    """Where this run begins: the checkpoint's position with --resume, else the first step."""
    if not cfg.resume or signature is None:
        return Position()
    found = fw.restore(signature)
    if found is None:
        notice(f"--resume: no checkpoint in {cfg.checkpoint_dir} yet: starting from the first step")
        return Position()
    if found.step_in_epoch >= p.steps_per_epoch:  # saved after an epoch's last step
        return Position(found.epoch + 1, 0, found.global_step)
    return found


def evaluate(cfg: TrainConfig, p: Plan, fw: FrameworkRun[Any]) -> dict[str, Any]:
    """Accuracy on the held-out store (every sample once, no shuffling)."""
    assert p.eval_store is not None, "evaluated only with --eval-data"
    correct = total = 0
    for batch in iter_batches(p.eval_store, eval_epoch(cfg)):
        correct += int((fw.predict(as_model_input(batch, p.input_shape, p.channels_first)) == batch.y).sum())
        total += len(batch.ids)
    return {"store": cfg.eval_data, "samples": total, "accuracy": round(correct / total, 4) if total else None}
