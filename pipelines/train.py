"""Job entry point for training: one process, or N data-parallel processes through pyspark's
TorchDistributor (local mode: on the driver node; --local-mode false: one per executor GPU of a
multi-node cluster, where --out and --checkpoint-dir must be paths every node sees).

    python -m trainfeed.pipelines.train --data STORE --out DIR [--processes 2] [--local-mode false]
        [--gpus-per-task 1] [--device cuda] [train options]
"""
from __future__ import annotations

import argparse
import sys

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.pipelines.entry import run_job
from trainfeed.training.config import TrainConfig, check
from trainfeed.training.loops.loop import run as train_one


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="trainfeed.pipelines.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--processes", type=int, default=1, help="data-parallel processes (TorchDistributor)")
    ap.add_argument("--local-mode", choices=("true", "false"), default="true",
                    help="true: processes on the driver node; false: on the executors")
    ap.add_argument("--gpus-per-task", type=int, default=1,
                    help="GPUs per Spark task with --local-mode false (the cluster's spark.task.resource.gpu.amount)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--framework", choices=("torch", "tf"), default="torch")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps-per-epoch", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=32, help="samples per step on each process")
    ap.add_argument("--global-batch-size", type=int, default=None,
                    help="samples per step on all processes (default: --batch-size x --processes); keep it to resume "
                         "on another number of processes")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir (a retried job run)")
    ap.add_argument("--delta-version", type=int, default=None)
    return ap.parse_args(argv)


SHARED_ROOTS = ("/Volumes/", "/dbfs/")


def check_shared(*paths: str | None) -> None:
    """With processes on the executors each node writes its own files: a local path would scatter
    them over the workers' disks (and the driver would not find rank 0's summary)."""
    for path in filter(None, paths):
        if not path.startswith(SHARED_ROOTS):
            raise UsageError(f"{path}: --local-mode false needs a path every node sees "
                             "(a Unity Catalog volume, /Volumes/...)")


def train(args: argparse.Namespace) -> dict:
    cfg = TrainConfig(data=args.data, out=args.out, device=args.device, framework=args.framework,
                      epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, batch_size=args.batch_size,
                      global_batch_size=args.global_batch_size,
                      width=args.width, workers=args.workers, checkpoint_dir=args.checkpoint_dir,
                      delta_version=args.delta_version, resume=args.resume, progress=False)
    if args.processes <= 1:
        return train_one(cfg)
    from trainfeed.pipelines.spark import get_spark, on_databricks
    from trainfeed.training.distributed import train_distributed

    local_mode = args.local_mode == "true"
    if not local_mode and on_databricks():
        check_shared(cfg.out, cfg.checkpoint_dir)
    check(cfg)
    if args.framework != "torch":
        raise TrainfeedError("--processes > 1 is the PyTorch path (TorchDistributor)")
    get_spark("trainfeed-train")
    return train_distributed(cfg, args.processes, local_mode=local_mode, gpus_per_task=args.gpus_per_task)


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and Databricks wheel task); a failure raises SystemExit."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_job(lambda: headline(train(args)))


def headline(summary: dict) -> dict:
    """What the job prints of summary.json (the whole file is in --out)."""
    return {k: summary.get(k) for k in ("samples_per_s", "stall_fraction", "au", "steps", "world_size")}

if __name__ == "__main__":
    sys.exit(main())
