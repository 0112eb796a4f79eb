"""Data-parallel training through pyspark's TorchDistributor: one process per GPU (or CPU
slot), each reading its own shard of the store, gradients all-reduced by DDP (gloo on CPU,
nccl on GPU). Locally it runs on the driver (``local_mode``); on a cluster, on the executors.

Uses the active Spark session (pipelines/spark.py provides one)."""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from .config import TrainConfig


def _worker(cfg_dict: dict) -> dict:
    """Runs in each process TorchDistributor starts (RANK / WORLD_SIZE set by torchrun)."""
    from trainfeed.training.config import TrainConfig as Config
    from trainfeed.training.loop import train

    return train(Config(**cfg_dict))


def train_distributed(cfg: TrainConfig, num_processes: int, *, local_mode: bool = True) -> dict:
    """Rank 0's summary; every rank writes summary[-rankN].json and steps[-rankN].jsonl to --out."""
    from pyspark.ml.torch.distributor import TorchDistributor

    cfg = replace(cfg, progress=False, framework="torch")
    distributor = TorchDistributor(num_processes=num_processes, local_mode=local_mode,
                                   use_gpu=cfg.device == "cuda")
    distributor.run(_worker, asdict(cfg))
    # TorchDistributor returns one process's output, not reliably rank 0's: read rank 0's file
    return json.loads((Path(cfg.out) / "summary.json").read_text())
