"""Two data-parallel CPU processes through pyspark's TorchDistributor (local mode, gloo)."""
from __future__ import annotations

import json

import pytest
import torch

from trainfeed.training.config import TrainConfig
from trainfeed.training.distributed import train_distributed

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_torch_distributor_two_processes_share_the_work(tmp_path, learnable, spark):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    cfg = TrainConfig(data=str(learnable["stores"]["parquet"]), width=8, batch_size=16, epochs=1, workers=1,
                      out=str(out), checkpoint_dir=str(ckpt), seed=3)
    summary = train_distributed(cfg, num_processes=2)
    assert summary["world_size"] == 2 and summary["rank"] == 0
    other = json.loads((out / "summary-rank1.json").read_text())
    assert other["rank"] == 1 and other["steps"] == summary["steps"] == summary["steps_per_epoch"]
    # each rank ran the same number of steps over its own shard (exactly-once per shard is
    # tested on the readers); together at most one pass over the data
    for name in ("steps.jsonl", "steps-rank1.jsonl"):
        assert len((out / name).read_text().splitlines()) == summary["steps"]
    assert summary["steps"] * 16 * 2 <= 384
    # DDP kept the replicas identical: the checkpoints of both ranks hold the same weights
    w0 = torch.load(ckpt / "checkpoint.pt", weights_only=True)["model"]
    w1 = torch.load(ckpt / "checkpoint-rank1.pt", weights_only=True)["model"]
    assert w0.keys() == w1.keys()
    assert all(torch.equal(w0[k], w1[k]) for k in w0 if not k.endswith(("running_mean", "running_var")))
