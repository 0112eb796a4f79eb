"""The PyTorch training loop: every step split into data wait and compute, checkpoints,
SIGTERM-safe preemption, resume, and DistributedDataParallel when launched with a world
size above one (torchrun or pyspark's TorchDistributor)."""
from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from converters.progress import progress_bar

from .config import TrainConfig, distributed_env
from .metrics import StepTimer, UtilizationSampler
from .models_torch import build, parameter_count
from .readers import iter_batches, open_store
from .run import Prefetcher, Preemption, RunFiles, after_step, check_labels, plan, reader_options, record, summarize

CHECKPOINT = "checkpoint.pt"


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
    torch.save(state, tmp)
    os.replace(tmp, path)  # a kill mid-save keeps the previous checkpoint


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
    start_epoch, skip_steps, global_step = 0, 0, 0
    if cfg.resume and ckpt_path and ckpt_path.exists():
        state = torch.load(ckpt_path, map_location=device, weights_only=False)
        if state["signature"] != cfg.signature():
            from converters.errors import TrainfeedError

            raise TrainfeedError(f"{ckpt_path}: checkpoint was written for other data or another model; "
                                 "use a fresh --checkpoint-dir")
        (model.module if world > 1 else model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        start_epoch, skip_steps, global_step = state["epoch"], state["step_in_epoch"], state["global_step"]
        if skip_steps >= p.steps_per_epoch:
            start_epoch, skip_steps = start_epoch + 1, 0
    if ckpt_path:
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)

    def checkpoint(epoch: int, step_in_epoch: int) -> None:
        if ckpt_path is None:
            return
        _save(ckpt_path, {"model": (model.module if world > 1 else model).state_dict(),
                          "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "epoch": epoch,
                          "step_in_epoch": step_in_epoch, "global_step": global_step,
                          "signature": cfg.signature()})

    pin = cfg.device == "cuda"

    def to_tensors(batch):
        x, y = torch.from_numpy(batch.x), torch.from_numpy(batch.y)
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
    if cfg.eval_data and not preempted and rank == 0:
        extra["eval"] = evaluate(cfg, model.module if world > 1 else model, device, p.num_classes)
    summary = summarize(cfg, p, timer, util, extra)
    files.write_summary(summary)
    files.close()
    return summary


@torch.no_grad()
def evaluate(cfg: TrainConfig, model, device: torch.device, num_classes: int) -> dict:
    """Accuracy on a held-out store (every sample once, no shuffling)."""
    opts = reader_options(cfg, shuffle=False)
    opts = type(opts)(**{**opts.__dict__, "drop_last": False, "delta_version": None, "labels_csv": None})
    store = open_store(cfg.eval_data, None, opts)
    model.eval()
    correct = total = 0
    for batch in iter_batches(store, opts):
        x = torch.from_numpy(batch.x).to(device)
        x = x.float().div_(255) if x.dtype == torch.uint8 else x.float()
        pred = _predict(model(x)).cpu().numpy()
        correct += int((pred == batch.y).sum())
        total += len(batch.ids)
    return {"store": cfg.eval_data, "samples": total, "accuracy": round(correct / total, 4) if total else None}
