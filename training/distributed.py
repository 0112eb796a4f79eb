"""Data-parallel training through pyspark's TorchDistributor: one process per GPU (or CPU
slot), each reading its own shard of the store, gradients all-reduced by DDP (gloo on CPU,
nccl on GPU). ``local_mode=True`` runs the processes on the driver (capped at the driver's
GPUs); ``local_mode=False`` runs them on the executors of a multi-node cluster, one process
per Spark task.

Every rank writes to the same ``--out``: on a cluster it must be a path every node sees (a
Unity Catalog volume). Per-rank files carry a ``-rankN`` suffix; files of the whole run (the
checkpoint, ``distributed.json``) are written by rank 0 only.

Uses the active Spark session (pipelines/spark.py provides one)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from trainfeed.converters.errors import UsageError
from trainfeed.training.config import TrainConfig, distributed_env
from trainfeed.training.frameworks import TORCH

TASK_GPUS = "spark.task.resource.gpu.amount"
RUN_FILE = "distributed.json"


@dataclass(frozen=True)
class Distribution:
    """TorchDistributor's settings. ``gpus_per_task`` is the cluster's ``spark.task.resource.gpu.amount``
    (fixed when the cluster starts; TorchDistributor reads it, it takes no such argument)."""

    num_processes: int
    local_mode: bool = True
    gpus_per_task: int = 1


def check_distribution(dist: Distribution, use_gpu: bool, task_gpus: str | None) -> None:
    """Refuse settings TorchDistributor would hang on or silently change; ``task_gpus`` is the
    session's ``spark.task.resource.gpu.amount`` (None: unset)."""
    if dist.num_processes < 1 or dist.gpus_per_task < 1:
        raise UsageError("--processes and --gpus-per-task must be at least 1")
    if dist.local_mode or not use_gpu:
        return
    if dist.gpus_per_task != 1:
        # TorchDistributor starts ceil(processes / gpus) tasks but torchrun waits for `processes`
        # nodes (SPARK-41916), and each process drives one GPU (cuda:LOCAL_RANK)
        raise UsageError("--gpus-per-task must be 1 with --local-mode false: one training process per GPU; "
                         "use more workers (and --processes) for more GPUs")
    if task_gpus is None or int(float(task_gpus)) != dist.gpus_per_task:
        raise UsageError(f"--gpus-per-task {dist.gpus_per_task} but the cluster's {TASK_GPUS} is {task_gpus}: "
                         "set it in the job cluster's spark_conf (the bundle's gpus_per_task variable)")


def is_rank_zero() -> bool:
    """Whether this process writes the run's shared files (torchrun's RANK; a lone process is rank 0)."""
    return distributed_env()[0] == 0


def write_from_rank_zero(path: Path, payload: dict[str, Any]) -> bool:
    """Write ``payload`` as JSON to ``path`` on rank 0 only: all ranks share ``--out``, so one
    writer per file. Whether this process wrote it."""
    if not is_rank_zero():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)
    return True


def _worker(cfg: TrainConfig, dist_dict: dict[str, Any]) -> dict[str, Any]:
    """Runs in each process TorchDistributor starts (RANK / WORLD_SIZE set by torchrun)."""
    from trainfeed.training.distributed import write_from_rank_zero as write
    from trainfeed.training.loops.loop import train

    summary = train(cfg)
    write(Path(cfg.out) / RUN_FILE, {**dist_dict, "world_size": summary.get("world_size")})
    return summary


def train_distributed(cfg: TrainConfig, num_processes: int, *, local_mode: bool = True,
                      gpus_per_task: int = 1) -> dict[str, Any]:
    """Rank 0's summary; every rank writes summary[-rankN].json and steps[-rankN].jsonl to --out,
    rank 0 alone writes distributed.json (the settings below and the world size)."""
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    cfg = replace(cfg, progress=False, framework=TORCH.name)  # TorchDistributor runs PyTorch
    dist = Distribution(num_processes, local_mode, gpus_per_task)
    use_gpu = cfg.device == "cuda"
    spark = SparkSession.getActiveSession()
    check_distribution(dist, use_gpu, spark.sparkContext.getConf().get(TASK_GPUS) if spark else None)
    distributor = TorchDistributor(num_processes=num_processes, local_mode=local_mode, use_gpu=use_gpu)
    distributor.run(_worker, cfg, asdict(dist))  # the config pickled whole: its options are frozen dataclasses
    # TorchDistributor returns one process's output, not reliably rank 0's: read rank 0's file
    summary: dict[str, Any] = json.loads((Path(cfg.out) / "summary.json").read_text())
    return summary
