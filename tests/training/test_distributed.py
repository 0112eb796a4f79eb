"""Two data-parallel CPU processes through pyspark's TorchDistributor (local mode, gloo)."""
from __future__ import annotations

import json

import pytest
import torch

import trainfeed
from trainfeed.training.config import TrainConfig
from trainfeed.training.distributed import train_distributed

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_torch_distributor_two_processes_share_the_work(tmp_path, learnable, spark):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    cfg = TrainConfig(data=str(learnable["stores"]["parquet"]), width=8, epochs=1, out=str(out),
                      checkpoint_dir=str(ckpt), epoch=trainfeed.EpochOptions(batch_size=16, workers=1, seed=3))
    summary = train_distributed(cfg, num_processes=2)
    assert summary["world_size"] == 2 and summary["rank"] == 0
    other = json.loads((out / "summary-rank1.json").read_text())
    assert other["rank"] == 1 and other["steps"] == summary["steps"] == summary["steps_per_epoch"]
    # each rank ran the same number of steps over its own shard (exactly-once per shard is
    # tested on the readers); together at most one pass over the data
    for name in ("steps.jsonl", "steps-rank1.jsonl"):
        assert len((out / name).read_text().splitlines()) == summary["steps"]
    assert summary["steps"] * 16 * 2 <= 384
    # one checkpoint, from rank 0 (DDP keeps the replicas identical); every rank resumes from it
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint.pt"]
    first = torch.load(ckpt / "checkpoint.pt", weights_only=True)
    assert first["global_step"] == summary["steps"]
    again = train_distributed(TrainConfig(**{**vars(cfg), "epochs": 2, "resume": True,
                                             "out": str(tmp_path / "out2")}), num_processes=2)
    assert again["steps"] == summary["steps"]  # the second epoch only, on both ranks
    assert json.loads((tmp_path / "out2" / "summary-rank1.json").read_text())["steps"] == summary["steps"]
    assert torch.load(ckpt / "checkpoint.pt", weights_only=True)["global_step"] == 2 * summary["steps"]
