"""The PyTorch training loop: every step split into data wait and compute, checkpoints,
SIGTERM-safe preemption, resume, and DistributedDataParallel when launched with a world
size above one (torchrun or pyspark's TorchDistributor)."""
from __future__ import annotations

import os
import pickle
import time
import zipfile
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.progress import progress_bar

from .config import TrainConfig, distributed_env
from .metrics import StepTimer, UtilizationSampler
from .models_torch import build, parameter_count
from .readers import iter_batches
from .run import (CHECKPOINT_FORMAT, Plan, Prefetcher, Preemption, RunFiles, after_step, as_model_input,
                  check_labels, checkpoint_signature, eval_options, notice, plan, record, summarize)

CHECKPOINT = "checkpoint.pt"
#: What a checkpoint holds besides its format marker; all of it loads with ``weights_only``.
CHECKPOINT_KEYS = {"model": dict, "optimizer": dict, "scaler": dict, "epoch": int, "step_in_epoch": int,
                   "global_step": int, "signature": str}


def _amp_context(cfg: TrainConfig, device: torch.device):
    if not cfg.amp:
        return nullcontext()
    dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def _loss(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    if num_classes == 2 and logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits[:, 0].float(), y.float())
    return F.cross_entropy(logits.float(), y)


def _predict(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, 0] > 0).long() if logits.shape[1] == 1 else logits.argmax(1)


def _save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"format": CHECKPOINT_FORMAT, **state}, tmp)
    os.replace(tmp, path)  # a kill mid-save keeps the previous checkpoint


def _load(path: Path, device: torch.device) -> dict:
    """A trainfeed checkpoint, read without running any of its code: only a PyTorch zip file
    is opened, and only tensors and plain values are unpickled from it (``weights_only``)."""
    if not zipfile.is_zipfile(path):
        raise TrainfeedError(f"{path}: not a trainfeed checkpoint (empty, truncated or not a PyTorch file); "
                             "use another --checkpoint-dir")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise TrainfeedError(f"{path}: not a trainfeed checkpoint: it holds objects other than tensors and plain "
                             "values (loading them could run code), refused") from None
    except (RuntimeError, EOFError, KeyError, ValueError, OSError) as exc:
        raise TrainfeedError(f"{path}: not a readable trainfeed checkpoint (damaged?): {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise TrainfeedError(f"{path}: not a trainfeed checkpoint (no {CHECKPOINT_FORMAT!r} marker)")
    wrong = [key for key, kind in CHECKPOINT_KEYS.items()
             if not isinstance(state.get(key), kind) or (kind is int and state[key] < 0)]
    if wrong:
        raise TrainfeedError(f"{path}: damaged trainfeed checkpoint: {', '.join(wrong)} missing or of the wrong type")
    return state


def _restore(path: Path, state: dict, model, optimizer, scaler) -> None:
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise TrainfeedError(f"{path}: checkpoint does not fit this model: {str(exc).splitlines()[0]}") from None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(cfg: TrainConfig) -> dict:
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    p = plan(cfg)
    rank, world, local_rank = distributed_env()
    device = torch.device(f"cuda:{local_rank}" if cfg.device == "cuda" else "cpu")
    if cfg.device == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    outputs = 1 if p.num_classes == 2 else p.num_classes
    model = build(p.input_shape, outputs, cfg.width).to(device)
    params = parameter_count(model)
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo")
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cfg.device == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    scaler = torch.amp.GradScaler("cuda", enabled=cfg.amp and cfg.device == "cuda" and not torch.cuda.is_bf16_supported())

    ckpt_path = Path(cfg.checkpoint_dir) / (CHECKPOINT if rank == 0 else f"checkpoint-rank{rank}.pt") if cfg.checkpoint_dir else None
    signature = checkpoint_signature(cfg, p) if ckpt_path else None
    start_epoch, skip_steps, global_step = 0, 0, 0
    if cfg.resume and ckpt_path.exists():
        state = _load(ckpt_path, device)
        if state["signature"] != signature:
            raise TrainfeedError(f"{ckpt_path}: checkpoint was written for other data or another model; "
                                 "use a fresh --checkpoint-dir")
        _restore(ckpt_path, state, model.module if world > 1 else model, optimizer, scaler)
        start_epoch, skip_steps, global_step = state["epoch"], state["step_in_epoch"], state["global_step"]
        if skip_steps >= p.steps_per_epoch:
            start_epoch, skip_steps = start_epoch + 1, 0
    elif cfg.resume:
        notice(f"--resume: no checkpoint in {cfg.checkpoint_dir} yet ({ckpt_path.name}): starting from the first step")
    if ckpt_path:
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)

    def checkpoint(epoch: int, step_in_epoch: int) -> None:
        if ckpt_path is None:
            return
        _save(ckpt_path, {"model": (model.module if world > 1 else model).state_dict(),
                          "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "epoch": epoch,
                          "step_in_epoch": step_in_epoch, "global_step": global_step, "signature": signature})

    pin = cfg.device == "cuda"

    def to_tensors(batch):
        x, y = torch.from_numpy(as_model_input(batch, p.input_shape)), torch.from_numpy(batch.y)
        if x.dtype == torch.uint8:
            x = x.float().div_(255)
        elif x.dtype != torch.float32:
            x = x.float()
        return (x.pin_memory(), y.pin_memory()) if pin else (x, y)

    files = RunFiles(cfg.out, rank)
    timer = StepTimer(warmup_steps=cfg.warmup_steps, sink=files.steps)
    preempted = False
    correct = seen = delivered = 0
    total_steps = cfg.epochs * p.steps_per_epoch
    t_start = time.perf_counter()
    with UtilizationSampler(sink=files.util) as util, Preemption() as preemption, \
            progress_bar(enabled=cfg.progress and rank == 0, label="train", unit="steps") as bar:
        bar.start(total_steps)
        model.train()
        for epoch in range(start_epoch, cfg.epochs):
            batches = iter_batches(p.store, p.reader, epoch)
            for _ in range(skip_steps):  # resume mid-epoch: same seeded order, skip what was done
                next(batches, None)
            prefetch = Prefetcher(batches, to_tensors)
            try:
                for step_in_epoch in range(skip_steps, p.steps_per_epoch):
                    item, wait = prefetch.get()
                    if item is None:
                        break
                    batch, (x, y) = item
                    check_labels(batch, p.num_classes, cfg.data)
                    t0 = time.perf_counter()
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    optimizer.zero_grad(set_to_none=True)
                    with _amp_context(cfg, device):
                        logits = model(x)
                    loss = _loss(logits, y, p.num_classes)
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                    _sync(device)
                    compute = time.perf_counter() - t0
                    global_step += 1
                    with torch.no_grad():
                        correct += int((_predict(logits.detach()) == y).sum())
                        seen += len(batch.ids)
                    delivered += record(timer, global_step, epoch, wait, compute, len(batch.ids), batch.nbytes,
                                        float(loss.detach())).bytes
                    bar.update(global_step, delivered)
                    if after_step(cfg, global_step, preemption, lambda: checkpoint(epoch, step_in_epoch + 1)):
                        preempted = True
                        break
            finally:
                prefetch.close()
            skip_steps = 0
            if preempted:
                break
        if not preempted:
            checkpoint(cfg.epochs, 0)
    extra = {"parameters": params, "train_accuracy": round(correct / seen, 4) if seen else None,
             "preempted": preempted, "resumed_from_step": None, "global_step": global_step,
             "run_seconds": round(time.perf_counter() - t_start, 3)}
    if cfg.resume:
        extra["resumed_from_step"] = global_step - len(timer.records)
    if p.eval_store is not None and not preempted and rank == 0:
        extra["eval"] = evaluate(cfg, p, model.module if world > 1 else model, device)
    summary = summarize(cfg, p, timer, util, extra)
    files.write_summary(summary)
    files.close()
    return summary


@torch.no_grad()
def evaluate(cfg: TrainConfig, p: Plan, model, device: torch.device) -> dict:
    """Accuracy on the held-out store (every sample once, no shuffling)."""
    model.eval()
    correct = total = 0
    for batch in iter_batches(p.eval_store, eval_options(cfg, p.store.spec.name)):
        x = torch.from_numpy(as_model_input(batch, p.input_shape)).to(device)
        x = x.float().div_(255) if x.dtype == torch.uint8 else x.float()
        pred = _predict(model(x)).cpu().numpy()
        correct += int((pred == batch.y).sum())
        total += len(batch.ids)
    return {"store": cfg.eval_data, "samples": total, "accuracy": round(correct / total, 4) if total else None}
