"""The rules of a distributed run that need no cluster: one writer (rank 0) for the run's shared
files, and TorchDistributor settings refused before they hang or are silently changed."""
from __future__ import annotations

import json

import pytest

from trainfeed.converters.errors import UsageError
from trainfeed.training.distributed import Distribution, check_distribution, is_rank_zero, write_from_rank_zero


def test_only_rank_zero_writes_the_shared_file(tmp_path, monkeypatch):
    """RANK and WORLD_SIZE as torchrun (started by TorchDistributor) sets them in each process."""
    path = tmp_path / "shared-out" / "distributed.json"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert not is_rank_zero() and write_from_rank_zero(path, {"by": 1}) is False
    assert not path.parent.exists()
    monkeypatch.setenv("RANK", "0")
    assert is_rank_zero() and write_from_rank_zero(path, {"by": 0}) is True
    monkeypatch.setenv("RANK", "1")
    assert write_from_rank_zero(path, {"by": 1}) is False
    assert json.loads(path.read_text()) == {"by": 0}
    assert sorted(p.name for p in path.parent.iterdir()) == ["distributed.json"]


def test_a_lone_process_is_rank_zero(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert write_from_rank_zero(tmp_path / "run.json", {})


@pytest.mark.parametrize("dist,use_gpu,task_gpus", [
    (Distribution(2, local_mode=True), True, None),  # on the driver: spark.task.* is not used
    (Distribution(2, local_mode=False), False, None),  # CPU slots
    (Distribution(4, local_mode=False, gpus_per_task=1), True, "1"),
    (Distribution(4, local_mode=False, gpus_per_task=1), True, "1.0"),
])
def test_distribution_accepted(dist, use_gpu, task_gpus):
    check_distribution(dist, use_gpu, task_gpus)


@pytest.mark.parametrize("dist,task_gpus,message", [
    (Distribution(0), None, "at least 1"),
    (Distribution(2, local_mode=False, gpus_per_task=2), "2", "must be 1"),
    (Distribution(2, local_mode=False), None, "is None"),
    (Distribution(2, local_mode=False), "2", "is 2"),
])
def test_distribution_refused(dist, task_gpus, message):
    with pytest.raises(UsageError, match=message):
        check_distribution(dist, True, task_gpus)
