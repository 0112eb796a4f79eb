"""PyTorch for the training loop (loop.py): the model and its optimizer, one step (AMP,
pinned memory and non-blocking copies on CUDA), prediction, safe checkpoints, and
DistributedDataParallel when launched with a world size above one (torchrun or pyspark's
TorchDistributor)."""
from __future__ import annotations

import os
import pickle
import time
import zipfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from trainfeed.converters.errors import TrainfeedError
from trainfeed.training.config import TrainConfig, distributed_env
from trainfeed.training.loops.plan import Plan, as_model_input
from trainfeed.training.loops.resume import CHECKPOINT_FORMAT, Position, check_signature
from trainfeed.training.models.resnet_torch import build, parameter_count
from trainfeed.training.reading.store import Batch

CHECKPOINT = "checkpoint.pt"
#: What a checkpoint holds besides its format marker; all of it loads with ``weights_only``.
CHECKPOINT_KEYS = {"model": dict, "optimizer": dict, "scaler": dict, "epoch": int, "step_in_epoch": int,
                   "global_step": int, "signature": str}


def _amp_context(cfg: TrainConfig, device: torch.device) -> AbstractContextManager[object]:
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


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"format": CHECKPOINT_FORMAT, **state}, tmp)
    os.replace(tmp, path)  # a kill mid-save keeps the previous checkpoint


def _load(path: Path, device: torch.device) -> dict[str, Any]:
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


def _restore(path: Path, state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             scaler: torch.amp.GradScaler) -> None:
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
    except (RuntimeError, KeyError, ValueError, TypeError) as exc:
        raise TrainfeedError(f"{path}: checkpoint does not fit this model: {str(exc).splitlines()[0]}") from None


#: What a failed collective's error says (gloo, NCCL): a peer is gone.
_PEER_GONE = ("gloo", "NCCL", "Connection reset by peer", "Connection closed by peer", "Broken pipe")


def collective_failed(exc: RuntimeError) -> bool:
    """Whether ``exc`` is a collective failing because another rank stopped."""
    dist_error = getattr(torch.distributed, "DistError", ())
    return isinstance(exc, dist_error) or any(marker in str(exc) for marker in _PEER_GONE)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _as_float(x: torch.Tensor) -> torch.Tensor:
    return x.float().div_(255) if x.dtype == torch.uint8 else x.float()


def intra_op_threads(workers: int) -> dict[str, int | str]:
    """PyTorch's intra-op threads: the cores this process may use less the reader's ``workers``
    threads, at least 1 (torch's default, one per core, fights the reader threads for the same
    cores: 15x slower on a busy 2-core machine), unless OMP_NUM_THREADS chooses. Sets them;
    returns what was chosen and why (the summary's ``torch_threads``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    chosen = os.environ.get("OMP_NUM_THREADS", "").strip()
    if chosen.isdigit() and int(chosen) > 0:
        threads, how = int(chosen), "OMP_NUM_THREADS"
    else:
        threads, how = max(1, cores - workers), "cores left by the reader threads"
    torch.set_num_threads(threads)
    return {"intra_op": threads, "cores": cores, "reader_workers": workers, "how": how}


class Torch:
    """The loop's ``Framework`` for PyTorch (see loop.Framework)."""

    def __init__(self, cfg: TrainConfig, p: Plan) -> None:
        self.threads = intra_op_threads(cfg.epoch.workers)
        torch.manual_seed(cfg.epoch.seed)
        np.random.seed(cfg.epoch.seed)
        self.cfg, self.p = cfg, p
        local_rank = distributed_env()[2]
        self.device = torch.device(f"cuda:{local_rank}" if cfg.device == "cuda" else "cpu")
        if cfg.device == "cuda":
            torch.cuda.set_device(self.device)
            torch.backends.cudnn.benchmark = True
        self.net = build(p.input_shape, 1 if p.num_classes == 2 else p.num_classes, cfg.width).to(self.device)
        self.model: torch.nn.Module = self.net
        if p.world > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo")
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.net, device_ids=[local_rank] if cfg.device == "cuda" else None)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.scaler = torch.amp.GradScaler(
            "cuda", enabled=cfg.amp and cfg.device == "cuda" and not torch.cuda.is_bf16_supported())
        # one checkpoint, written by rank 0 (DDP keeps the replicas' weights and optimizer state
        # identical), read by every rank on --resume: a shared --checkpoint-dir holds one file
        self.checkpoint = Path(cfg.checkpoint_dir) / CHECKPOINT if cfg.checkpoint_dir else None
        self.writes_checkpoint = p.rank == 0
        self.model.train()

    def parameters(self) -> dict[str, int]:
        return parameter_count(self.net)

    def to_inputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        x = _as_float(torch.from_numpy(as_model_input(batch, self.p.input_shape, self.p.channels_first)))
        y = torch.from_numpy(batch.y)
        return (x.pin_memory(), y.pin_memory()) if self.cfg.device == "cuda" else (x, y)

    def step(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, int]:
        try:
            return self._step(inputs)
        except RuntimeError as exc:
            if self.p.world > 1 and collective_failed(exc):
                raise TrainfeedError(
                    f"rank {self.p.rank} of {self.p.world}: a collective with the other ranks failed, another rank of "
                    f"this run stopped ({str(exc).splitlines()[0][:200]}); restart from the last checkpoint with "
                    f"--resume, on this or another number of processes, keeping --global-batch-size "
                    f"{self.p.epoch.global_batch}") from exc
            raise

    def _step(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, int]:
        x, y = (t.to(self.device, non_blocking=True) for t in inputs)
        self.optimizer.zero_grad(set_to_none=True)
        with _amp_context(self.cfg, self.device):
            logits = self.model(x)
        loss = _loss(logits, y, self.p.num_classes)
        torch.autograd.backward(self.scaler.scale(loss))  # Tensor.backward, typed
        self.scaler.step(self.optimizer)
        self.scaler.update()
        _sync(self.device)
        with torch.no_grad():
            return float(loss.detach()), int((_predict(logits.detach()) == y).sum())

    @torch.no_grad()
    def predict(self, x: np.ndarray) -> np.ndarray:
        self.net.eval()
        return _predict(self.net(_as_float(torch.from_numpy(x).to(self.device)))).cpu().numpy()

    def restore(self, signature: str) -> Position | None:
        assert self.checkpoint is not None, "the loop restores only with a --checkpoint-dir"
        if not self.checkpoint.exists():
            return None
        state = _load(self.checkpoint, self.device)
        check_signature(self.checkpoint, state["signature"], signature)
        _restore(self.checkpoint, state, self.net, self.optimizer, self.scaler)
        return Position(state["epoch"], state["step_in_epoch"], state["global_step"])

    def save(self, position: Position, signature: str) -> None:
        if not self.writes_checkpoint:
            return
        assert self.checkpoint is not None, "the loop saves only with a --checkpoint-dir"
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        _save(self.checkpoint, {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                                "scaler": self.scaler.state_dict(), "epoch": position.epoch,
                                "step_in_epoch": position.step_in_epoch, "global_step": position.global_step,
                                "signature": signature})


def compute_only(shape: tuple[int, ...], batch: int, width: int, steps: int, device: str = "cpu",
                 amp: bool = False) -> tuple[float, float]:
    """The benchmark's compute-only step: median seconds of a real training step on synthetic
    data already on the device, and the process CPU-seconds per step (after the first)."""
    dev = torch.device(device)
    model = build(tuple(shape), 1, width).to(dev)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, *shape, device=dev)
    y = torch.randint(0, 2, (batch,), device=dev).float()
    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        torch.autograd.backward(F.binary_cross_entropy_with_logits(out[:, 0].float(), y))
        opt.step()
        _sync(dev)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return float(np.median(times[1:])), float(np.mean(cpu[1:]))
