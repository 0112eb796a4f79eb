"""One rank of a data-parallel job as the many-ranks tests start it: a real gloo process group
(``init_process_group`` with the rank and world size passed in, as ``torch.multiprocessing``
starts ranks: nothing in the environment), a ``TorchDataset`` read through a ``DataLoader``
with worker processes, and a real ``all_reduce`` at every step, so that ranks out of step hang
or fail instead of passing silently. Each rank writes what it delivered to a JSON file.

    torch.multiprocessing.start_processes(run_rank, args=(world, job), nprocs=world, start_method="fork")

or under torchrun (RANK, WORLD_SIZE and the rendezvous from its environment), a job file as argument:

    torchrun --nproc-per-node 2 tests/training/ranks.py job.json

A job may name a rank that kills itself at a batch (``die``: [rank, batch]), a node lost; every
rank then logs each step as it completes (``log``), and rank 0 saves the position after each
(``checkpoint``), as a training script would.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import sys


def digest(row) -> str:
    return hashlib.sha1(row.tobytes()).hexdigest()[:20]


def run_rank(rank: int, world: int, job: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import trainfeed

    timeout = datetime.timedelta(seconds=job.get("collective_timeout", 120))
    if "port" in job:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank, world_size=world,
                                timeout=timeout)
    else:  # torchrun's rendezvous
        dist.init_process_group("gloo", timeout=timeout)
    try:
        store = job.get("store") or trainfeed.open_store(job["url"], storage_options=job.get("options") or {})
        dataset = trainfeed.TorchDataset(store, global_batch_size=job["global_batch"], seed=job.get("seed", 0),
                                         drop_last=job.get("drop_last", False))
        if job.get("state"):
            dataset.load_state_dict(job["state"])
        else:
            dataset.set_epoch(job.get("epoch", 0))
        workers = job.get("workers", 0)
        loader = DataLoader(dataset, batch_size=None, num_workers=workers, timeout=job.get("timeout", 300) if workers
                            else 0, multiprocessing_context=job.get("method") if workers else None)
        batches, state = [], None
        log = open(job["log"].format(rank=rank), "a") if job.get("log") else None  # noqa: SIM115 - kept for the run
        for k, (x, y) in enumerate(loader, start=dataset.start_batch):
            if job.get("die") == [rank, k]:
                os.kill(os.getpid(), signal.SIGKILL)  # a node lost, mid-epoch
            real = len(y) - dataset.padding(k)
            step = torch.tensor([float(real), 1.0])
            dist.all_reduce(step)  # every rank takes part in every step, or this hangs (and the test fails)
            rows = x[:real].numpy().reshape(real, -1) if real else []
            batches.append({"batch": k, "size": len(y), "rows": [digest(r) for r in rows],
                            "step_total": step.tolist()})
            if log is not None:
                log.write(json.dumps(batches[-1]) + "\n")
                log.flush()
            if job.get("checkpoint") and rank == 0:
                with open(job["checkpoint"] + ".tmp", "w") as f:
                    json.dump(dataset.state_dict(k + 1), f)
                os.replace(job["checkpoint"] + ".tmp", job["checkpoint"])
            if job.get("stop_after") == k + 1:
                state = dataset.state_dict(k + 1)
                break
        dist.barrier()
        with open(job["out"].format(rank=rank), "w") as f:
            json.dump({"rank": rank, "world": world, "pid": os.getpid(), "len": len(dataset),
                       "batch_size": dataset.batch_size, "batches": batches, "state": state}, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), json.load(f))
