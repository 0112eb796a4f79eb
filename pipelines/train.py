"""Job entry point for training: one process, or N data-parallel processes through pyspark's
TorchDistributor (local mode: on the driver node; --local-mode false: one per executor GPU of a
multi-node cluster, where --out and --checkpoint-dir must be paths every node sees).

    python -m trainfeed.pipelines.train --data STORE --out DIR [--processes 2] [--local-mode false]
        [--gpus-per-task 1] [--device cuda] [train options]
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.option_docs import add_option
from trainfeed.pipelines.entry import run_job
from trainfeed.training.config import DEVICES, TrainConfig, check
from trainfeed.training.frameworks import FRAMEWORKS, TORCH, framework
from trainfeed.training.loops.loop import run as train_one
from trainfeed.training.reading.store import EpochOptions


def parse_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The job's arguments: ``train``'s, made from the same declarations (converters/option_docs.py)."""
    ap = argparse.ArgumentParser(prog="trainfeed.pipelines.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_option(ap, TrainConfig, "data", required=True)
    add_option(ap, TrainConfig, "out", required=True)
    ap.add_argument("--processes", type=int, default=1, help="data-parallel processes (TorchDistributor)")
    ap.add_argument("--local-mode", choices=("true", "false"), default="true",
                    help="true: processes on the driver node; false: on the executors")
    ap.add_argument("--gpus-per-task", type=int, default=1,
                    help="GPUs per Spark task with --local-mode false (the cluster's spark.task.resource.gpu.amount)")
    add_option(ap, TrainConfig, "device", choices=DEVICES)
    add_option(ap, TrainConfig, "framework", choices=tuple(FRAMEWORKS))
    for name in ("epochs", "steps_per_epoch", "width", "checkpoint_dir", "resume"):
        add_option(ap, TrainConfig, name)
    for name in ("batch_size", "global_batch_size", "workers"):
        add_option(ap, EpochOptions, name)
    add_option(ap, OpenOptions, "version")
    return ap


SHARED_ROOTS = ("/Volumes/", "/dbfs/")


def check_shared(*paths: str | None) -> None:
    """With processes on the executors each node writes its own files: a local path would scatter
    them over the workers' disks (and the driver would not find rank 0's summary)."""
    for path in filter(None, paths):
        if not path.startswith(SHARED_ROOTS):
            raise UsageError(f"{path}: --local-mode false needs a path every node sees "
                             "(a Unity Catalog volume, /Volumes/...)")


def config_of(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(data=args.data, out=args.out, device=args.device, framework=args.framework,
                      epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, width=args.width,
                      checkpoint_dir=args.checkpoint_dir, resume=args.resume, progress=False,
                      store=OpenOptions(version=args.version),
                      epoch=EpochOptions(batch_size=args.batch_size, global_batch_size=args.global_batch_size,
                                         workers=args.workers, augment=True))


def train(args: argparse.Namespace) -> dict[str, Any]:
    cfg = config_of(args)
    if args.processes <= 1:
        return train_one(cfg)
    from trainfeed.pipelines.spark import get_spark, on_databricks
    from trainfeed.training.distributed import train_distributed

    local_mode = args.local_mode == "true"
    if not local_mode and on_databricks():
        check_shared(cfg.out, cfg.checkpoint_dir)
    check(cfg)
    if not framework(args.framework).data_parallel:
        raise TrainfeedError(f"--processes > 1 is the {TORCH.label} path (TorchDistributor)")
    get_spark("trainfeed-train")
    return train_distributed(cfg, args.processes, local_mode=local_mode, gpus_per_task=args.gpus_per_task)


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and Databricks wheel task); a failure raises SystemExit."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_job(lambda: headline(train(args)))


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """What the job prints of summary.json (the whole file is in --out)."""
    return {k: summary.get(k) for k in ("samples_per_s", "stall_fraction", "au", "steps", "world_size")}

if __name__ == "__main__":
    sys.exit(main())
