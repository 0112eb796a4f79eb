"""Job entry point for training: one process, or N data-parallel processes through pyspark's
TorchDistributor (a cluster's GPUs or CPU slots; local mode on a single node).

    python -m trainfeed.pipelines.train --data STORE --out DIR [--processes 2] [--device cuda] [train options]
"""
from __future__ import annotations

import argparse
import sys

from trainfeed.converters.errors import TrainfeedError
from trainfeed.training.cli import run as train_one
from trainfeed.training.config import TrainConfig, check

from .entry import run_job


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="trainfeed.pipelines.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--processes", type=int, default=1, help="data-parallel processes (TorchDistributor)")
    ap.add_argument("--local-mode", choices=("true", "false"), default="true",
                    help="true: processes on the driver node; false: on the executors")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--framework", choices=("torch", "tf"), default="torch")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps-per-epoch", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--delta-version", type=int, default=None)
    return ap.parse_args(argv)


def train(args: argparse.Namespace) -> dict:
    cfg = TrainConfig(data=args.data, out=args.out, device=args.device, framework=args.framework,
                      epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, batch_size=args.batch_size,
                      width=args.width, workers=args.workers, checkpoint_dir=args.checkpoint_dir,
                      delta_version=args.delta_version, progress=False)
    if args.processes <= 1:
        return train_one(cfg)
    check(cfg)
    if args.framework != "torch":
        raise TrainfeedError("--processes > 1 is the PyTorch path (TorchDistributor)")
    from trainfeed.training.distributed import train_distributed

    from .spark import get_spark

    get_spark("trainfeed-train")
    return train_distributed(cfg, args.processes, local_mode=args.local_mode == "true")


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script and Databricks wheel task); a failure raises SystemExit."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_job(lambda: headline(train(args)))


def headline(summary: dict) -> dict:
    """What the job prints of summary.json (the whole file is in --out)."""
    return {k: summary.get(k) for k in ("samples_per_s", "stall_fraction", "au", "steps", "world_size")}

if __name__ == "__main__":
    sys.exit(main())
