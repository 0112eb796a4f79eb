"""The 3D ResNet trained through ``DataLoader(TorchDataset(store), num_workers=W)``, the way a
PyTorch user feeds a GPU, from one Parquet store on local disk and on an S3 server on the same
machine (s3rver), with and without ``cache_dir`` (``make bench-gpu-feed``).

Generated volumes are converted to Parquet on local disk and, with ``convert SRC s3://...``,
onto a fresh s3rver; each store then trains in a process of its own (the same seeded model,
batch size, workers and epochs). The device's start (CUDA context, kernel selection) runs on
random tensors before epoch 1, so an epoch's time is the data's and the model's. One JSON line
per store and epoch on stdout: samples/s over the epoch and after its first batch (worker
start), MB/s, and the stall: the share of the steps' time the loop waited for a batch.

    python -m trainfeed.benchmarks.micro.gpu_feed_bench --volumes 12288 --workers 8
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

PROG = "python -m trainfeed.benchmarks.micro.gpu_feed_bench"
BUCKET = "bench"


def train_epochs(name: str, url: str, options: dict[str, str], args: argparse.Namespace) -> None:
    """Epochs of one store in this process: a JSON line each."""
    import torch
    from torch.utils.data import DataLoader

    import trainfeed
    from trainfeed.training.loops.plan import model_input_shape
    from trainfeed.training.models.resnet_torch import build

    with tempfile.TemporaryDirectory(prefix="gpu-feed-cache-") as tmp:
        cache = str(Path(tmp) / "cache") if options and args.cache else None
        store = trainfeed.open_store(url, storage_options=options, cache_dir=cache)
        shape = model_input_shape(store.reader)
        dataset = trainfeed.TorchDataset(store, batch_size=args.batch_size, seed=0, drop_last=True)
        loader = DataLoader(dataset, batch_size=None, num_workers=args.workers, multiprocessing_context=args.method,
                            persistent_workers=True, pin_memory=args.device == "cuda", prefetch_factor=4, timeout=600)
        torch.manual_seed(0)
        device = torch.device(args.device)
        torch.backends.cudnn.benchmark = True
        model = build(shape, 1, args.width).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(torch.nn.functional.binary_cross_entropy_with_logits(model(x)[:, 0], y))
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()

        for _ in range(args.warmup_steps):
            step(torch.randn((args.batch_size, *shape), device=device), torch.ones(args.batch_size, device=device))
        for epoch in range(args.epochs):
            dataset.set_epoch(epoch)
            waits: list[float] = []
            steps: list[float] = []
            samples = nbytes = 0
            start = time.perf_counter()
            for x, y in _timed(iter(loader), waits):
                t1 = time.perf_counter()
                nbytes += x.numel() * x.element_size()
                step(x.to(device, non_blocking=True).float().reshape((len(y), *shape)),
                     y.to(device, non_blocking=True).float())
                steps.append(time.perf_counter() - t1)
                samples += len(y)
            seconds = time.perf_counter() - start
            after_first = seconds - waits[0]  # the first batch waits for the workers to start
            print(json.dumps({
                "store": name, "cache": cache is not None, "epoch": epoch + 1, "device": args.device,
                "workers": args.workers, "method": args.method, "batch_size": args.batch_size, "samples": samples,
                "seconds": round(seconds, 3), "samples_per_s": round(samples / seconds, 1),
                "samples_per_s_after_first_batch": round((samples - samples / len(steps)) / after_first, 1),
                "MB_per_s": round(nbytes / seconds / 1e6, 1),
                "stall_pct": round(100 * sum(waits[1:]) / (sum(waits[1:]) + sum(steps[1:])), 1),
                "first_batch_s": round(waits[0], 3), "median_step_ms": round(1000 * statistics.median(steps), 2),
                "median_wait_ms": round(1000 * statistics.median(waits), 2)}), flush=True)


_T = TypeVar("_T")


def _timed(batches: Iterator[_T], waits: list[float]) -> Iterator[_T]:
    """The batches, with the time each one was waited for appended to ``waits``."""
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            return
        waits.append(time.perf_counter() - t0)
        yield batch


def run_all(args: argparse.Namespace) -> None:
    """Generate, convert, serve, then each store's epochs in a process of its own."""
    import trainfeed
    from trainfeed.benchmarks.emulators import s3rver
    from trainfeed.benchmarks.synth import generate_volumes

    with tempfile.TemporaryDirectory(prefix="gpu-feed-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        generate_volumes(root / "src", args.volumes)
        trainfeed.convert(str(root / "src"), str(root / "v.parquet"), format="parquet")
        server = stack.enter_context(s3rver.start(BUCKET))
        url = f"s3://{BUCKET}/v.parquet"
        trainfeed.convert(str(root / "src"), url, format="parquet", storage_options=server.storage_options)
        remote = [a for k, v in server.storage_options.items() for a in ("--storage-option", f"{k}={v}")]
        common = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                  ("workers", "method", "batch_size", "epochs", "width", "device", "warmup_steps")]
        for store, extra in ((f"local={root / 'v.parquet'}", []), (f"s3rver-cache={url}", remote),
                             (f"s3rver={url}", [*remote, "--no-cache"])):
            done = subprocess.run([sys.executable, "-m", "trainfeed.benchmarks.micro.gpu_feed_bench", "--store", store,
                                   *common, *extra], stdout=sys.stdout, timeout=1800)
            if done.returncode:
                raise SystemExit(f"{PROG}: the run of {store.split('=')[0]} failed (exit {done.returncode})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--volumes", type=int, default=12288, help="volumes generated (360 KB each)")
    parser.add_argument("--store", help="NAME=URL: train on this store only (what each process of a run does)")
    parser.add_argument("--storage-option", action="append", default=[], help="KEY=VALUE, for --store")
    parser.add_argument("--no-cache", dest="cache", action="store_false", help="--store on a server: no cache_dir")
    parser.add_argument("--workers", type=int, default=8, help="DataLoader worker processes")
    parser.add_argument("--method", default="fork", choices=["fork", "forkserver", "spawn"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--width", type=int, default=64, help="64: the 33.2M-parameter 3D ResNet-18")
    parser.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    parser.add_argument("--warmup-steps", type=int, default=10, help="steps on random data before epoch 1")
    args = parser.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.store:
        name, url = args.store.split("=", 1)
        train_epochs(name, url, dict(o.split("=", 1) for o in args.storage_option), args)
    else:
        run_all(args)


if __name__ == "__main__":
    main()
