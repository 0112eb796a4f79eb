"""Conversion throughput next to the raw cost of the same bytes, measured in one run.

raw: read every source file and write the same bytes to one file (N threads reading), the
floor any converter pays. convert: the real ``convert`` into each format. Every conversion
is paired with a raw copy measured just before it, and the ratio is taken per pair, so the
machine's noise (page-cache writeback, other tenants) hits both sides alike. The page cache
is warm for every case (the dataset is read once first). Results go to JSON lines.

    python -m trainfeed.benchmarks.micro.convert_bench --out bench-out/convert.jsonl [--gb 1.0]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainfeed.benchmarks.synth import VOLUME_SHAPE, generate_volumes
from trainfeed.converters.convert import ConvertConfig, convert
from trainfeed.converters.formats.options import WriteOptions
from trainfeed.training.metrics import environment

CASES = [
    ("parquet", "snappy"), ("parquet", "none"), ("delta", "snappy"), ("hdf5", "none"),
]


def raw_copy(files: list[Path], dst: Path, workers: int) -> tuple[float, int]:
    """Read every file (``workers`` threads) and append its bytes to ``dst``."""
    t0 = time.perf_counter()
    total = 0
    with open(dst, "wb") as out, ThreadPoolExecutor(workers) as pool:
        for data in pool.map(Path.read_bytes, files):
            out.write(data)
            total += len(data)
    return time.perf_counter() - t0, total


def ensure_dataset(root: Path, gb: float, seed: int = 0) -> Path:
    sample = int(__import__("numpy").prod(VOLUME_SHAPE)) * 4
    count = int(gb * 1e9 / sample) + 1
    src = root / f"volumes-{count}"
    if not (src / "labels.csv").exists():
        shutil.rmtree(src, ignore_errors=True)
        generate_volumes(src, count, seed=seed)
    return src


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/convert.jsonl")
    ap.add_argument("--work", default="bench-out/work", help="where the dataset and outputs go")
    ap.add_argument("--gb", type=float, default=1.0, help="dataset size in GB (10^9 bytes)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = ensure_dataset(work, args.gb)
    files = sorted(src.glob("*.npy"))
    raw_copy(files, work / "warmup.bin", 2)  # warm the page cache for every case alike
    worker_counts = [int(w) for w in args.workers.split(",")]
    env = {**environment(), "work_dir": str(work.resolve())}
    records = []
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "a") as out:
        for rep in range(args.repeats):
            for workers in worker_counts:
                for fmt, comp in CASES:
                    # Each conversion is paired with a raw copy measured just before it; both
                    # start with no dirty pages from earlier cases (os.sync, not timed).
                    os.sync()
                    raw_s, nbytes = raw_copy(files, work / "raw.bin", workers)
                    (work / "raw.bin").unlink()
                    dst = work / f"out-{fmt}-{comp}"
                    shutil.rmtree(dst, ignore_errors=True)
                    os.sync()
                    cfg = ConvertConfig(src=str(src), dst=str(dst), fmt=fmt, labels_csv=str(src / "labels.csv"),
                                        workers=workers, write=WriteOptions(compression=comp))
                    summary = convert(cfg)
                    shutil.rmtree(dst, ignore_errors=True)
                    rec = {"bench": "convert", "case": f"{fmt}-{comp}", "workers": workers, "repeat": rep,
                           "seconds": summary["seconds"], "bytes": summary["bytes_in"],
                           "mb_per_s": summary["bytes_in"] / summary["seconds"] / 1e6,
                           "raw_seconds": raw_s, "raw_mb_per_s": nbytes / raw_s / 1e6,
                           "vs_raw": raw_s / summary["seconds"] * summary["bytes_in"] / nbytes,
                           "files_in": len(files), "files_out": summary["files_out"],
                           "bytes_out": summary["bytes_out"], "env": env}
                    records.append(rec)
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
    (work / "warmup.bin").unlink(missing_ok=True)
    print(summarize(records))


def summarize(records: list[dict[str, Any]]) -> str:
    """Per case and worker count: median MB/s of the conversion and of its paired raw copy,
    and the median (min-max) of the per-pair ratios."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["case"], r["workers"]), []).append(r)
    lines = [f"{'case':<16}{'workers':>8}{'MB/s':>8}{'raw MB/s':>10}{'vs raw (min-max)':>22}"]
    for (case, workers), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ratios = [r["vs_raw"] for r in rs]
        lines.append(f"{case:<16}{workers:>8}{statistics.median(r['mb_per_s'] for r in rs):>8.0f}"
                     f"{statistics.median(r['raw_mb_per_s'] for r in rs):>10.0f}"
                     f"{statistics.median(ratios):>10.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
